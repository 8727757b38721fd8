package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/mod/modfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPublic(t *testing.T) {
	for dir, want := range map[string]bool{
		"":                                true,
		"etcdlock":                        true,
		"etcdlock/etcdtest":               true,
		"redislock/redistest":             true,
		"benchmarks":                      false,
		"examples/otel":                   false,
		"etcdlock/examples":               false,
		"internal/otelsdktest":            false,
		"etcdlock/internal/etcdlocktests": false,
	} {
		if got := public(dir); got != want {
			t.Errorf("public(%q) = %v, want %v", dir, got, want)
		}
	}
}

// tree parses go.mod files, given by folder, into the modules discover
// would return.
func tree(t *testing.T, gomods map[string]string) []*mod {
	t.Helper()
	var mods []*mod
	for dir, text := range gomods {
		f, err := modfile.Parse(dir+"/go.mod", []byte(text), nil)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, &mod{Dir: dir, Path: f.Module.Mod.Path, Public: public(dir), file: f})
	}
	slices.SortFunc(mods, func(a, b *mod) int { return strings.Compare(a.Dir, b.Dir) })
	return mods
}

const rootMod = "module github.com/fairlock/fairlock\n\ngo 1.24.0\n"

func TestCheckReleasable(t *testing.T) {
	problems, version := check(tree(t, map[string]string{
		"":         rootMod,
		"etcdlock": "module github.com/fairlock/fairlock/etcdlock\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock v0.1.0\n",
		"benchmarks": "module github.com/fairlock/fairlock/benchmarks\n\ngo 1.26.0\n\n" +
			"require (\n\tgithub.com/fairlock/fairlock v0.1.0\n\tgithub.com/fairlock/fairlock/etcdlock v0.1.0\n)\n",
	}))
	if len(problems) > 0 || version != "v0.1.0" {
		t.Errorf("check = %q, %q; want no problems, v0.1.0", problems, version)
	}
}

// The layout before issue 34: a replace line, and the v0.0.0 placeholder.
func TestCheckOldLayout(t *testing.T) {
	problems, version := check(tree(t, map[string]string{
		"":         rootMod,
		"etcdlock": "module github.com/fairlock/fairlock/etcdlock\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock v0.0.0\n\nreplace github.com/fairlock/fairlock => ../\n",
	}))
	if version != "" {
		t.Errorf("version %q, want none", version)
	}
	for _, want := range []string{"etcdlock/go.mod: replace github.com/fairlock/fairlock => ../", "requires github.com/fairlock/fairlock v0.0.0, a placeholder", "no version to simulate"} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("no problem says %q; problems:\n%s", want, strings.Join(problems, "\n"))
		}
	}
}

func TestCheckRules(t *testing.T) {
	problems, _ := check(tree(t, map[string]string{
		"":                     rootMod,
		"etcdlock":             "module github.com/fairlock/fairlock/etcdlock\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/fairlock/fairlock v0.1.0\n\tgithub.com/fairlock/fairlock/internal/otelsdktest v0.1.0\n)\n",
		"redislock":            "module github.com/fairlock/fairlock/redislock\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock v0.2.0\n",
		"internal/otelsdktest": "module github.com/fairlock/fairlock/internal/otelsdktest\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock/gone v0.1.0\n",
		"moved":                "module github.com/fairlock/fairlock/elsewhere\n\ngo 1.26.0\n",
	}))
	for _, want := range []string{
		"the public module github.com/fairlock/fairlock/etcdlock requires the unpublished github.com/fairlock/fairlock/internal/otelsdktest",
		"different versions",
		"requires github.com/fairlock/fairlock/gone, which is no module of this tree",
		"moved/go.mod: module github.com/fairlock/fairlock/elsewhere",
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("no problem says %q; problems:\n%s", want, strings.Join(problems, "\n"))
		}
	}
}

func TestDropOurs(t *testing.T) {
	sum := "github.com/fairlock/fairlock v0.1.0 h1:a=\n" +
		"github.com/fairlock/fairlock v0.1.0/go.mod h1:b=\n" +
		"github.com/fairlock/fairlock/etcdlock v0.1.0/go.mod h1:c=\n" +
		"github.com/fairlock/fairlockx v1.0.0 h1:d=\n" +
		"go.uber.org/goleak v1.3.0 h1:e=\n"
	want := "github.com/fairlock/fairlockx v1.0.0 h1:d=\ngo.uber.org/goleak v1.3.0 h1:e=\n"
	if got := string(dropOurs([]byte(sum), "github.com/fairlock/fairlock")); got != want {
		t.Errorf("dropOurs:\n%s\nwant:\n%s", got, want)
	}
}

func TestCheckDeps(t *testing.T) {
	ours := func(p string) bool { return strings.HasPrefix(p, "github.com/fairlock/fairlock") }
	deps := strings.Join([]string{
		"example.com/app\texample.com/app\tgithub.com/fairlock/fairlock/etcdlock net/http",
		"github.com/fairlock/fairlock/etcdlock\tgithub.com/fairlock/fairlock/etcdlock\tgithub.com/fairlock/fairlock/internal/ctxerr github.com/fairlock/fairlock/etcdlock/internal/x",
		"github.com/fairlock/fairlock/etcdlock/internal/x\tgithub.com/fairlock/fairlock/etcdlock\t",
		"github.com/fairlock/fairlock/internal/ctxerr\tgithub.com/fairlock/fairlock\t",
		"go.opentelemetry.io/otel/sdk/trace\tgo.opentelemetry.io/otel/sdk\tgo.opentelemetry.io/otel/internal/global",
		"go.opentelemetry.io/otel/internal/global\tgo.opentelemetry.io/otel\t",
		"net/http\t\t",
	}, "\n")
	got := checkDeps(deps, []string{`net/http`}, ours)
	want := []string{
		"go list -deps lists net/http (matches net/http)",
		"github.com/fairlock/fairlock/etcdlock (module github.com/fairlock/fairlock/etcdlock) imports github.com/fairlock/fairlock/internal/ctxerr, an internal package of module github.com/fairlock/fairlock",
	}
	if !slices.Equal(got, want) {
		t.Errorf("checkDeps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCheckWork(t *testing.T) {
	mods := tree(t, map[string]string{
		"":              rootMod,
		"etcdlock":      "module github.com/fairlock/fairlock/etcdlock\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock v0.1.0\n",
		"examples/otel": "module github.com/fairlock/fairlock/examples/otel\n\ngo 1.26.0\n\nrequire github.com/fairlock/fairlock v0.1.0\n",
	})
	root := t.TempDir()
	write := func(work string) {
		if err := os.WriteFile(filepath.Join(root, "go.work"), []byte(work), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go 1.26.0\n\nuse (\n\t.\n\t./etcdlock\n\t./examples/otel\n)\n\nreplace (\n" +
		"\tgithub.com/fairlock/fairlock v0.1.0 => ./\n\tgithub.com/fairlock/fairlock/etcdlock v0.1.0 => ./etcdlock\n)\n")
	if problems := checkWork(root, mods, "v0.1.0"); len(problems) > 0 {
		t.Errorf("checkWork of a complete go.work: %q", problems)
	}
	write("go 1.26.0\n\nuse (\n\t.\n\t./etcdlock\n)\n\nreplace github.com/fairlock/fairlock v0.1.0 => ./\n")
	want := []string{
		`go.work: no line "replace github.com/fairlock/fairlock/etcdlock v0.1.0 => ./etcdlock" (the workspace would fetch that version's go.mod, which no proxy has before the tag)`,
		`go.work: no line "use ./examples/otel" (module github.com/fairlock/fairlock/examples/otel)`,
	}
	if got := checkWork(root, mods, "v0.1.0"); !slices.Equal(got, want) {
		t.Errorf("checkWork:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
