package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// simEnv returns the environment in which the go command resolves this
// repository's modules from dir/proxy, as a user's resolves them from
// their tags:
//
//   - GOWORK=off: no workspace, each module's own go.mod decides.
//   - GOPROXY: dir/proxy first; then the module cache's download folder
//     (the go command's own proxy layout: third-party modules already
//     downloaded are not fetched again); then the proxy set before.
//   - GONOSUMDB: our modules are not looked up in the checksum database
//     (the simulated zips were never published); every other module is.
//   - GOMODCACHE: a module cache of its own under dir, so that no zip of
//     the simulation lands in the user's cache, where a later build could
//     mistake it for the tag (modules are cached by path and version, and
//     the simulated zip changes with every commit).
//   - GOFLAGS -mod=mod: go.mod and go.sum may be updated, as by go get;
//     -modcacherw: the cache under dir can be removed with rm -rf.
func simEnv(dir string, rel *release) ([][2]string, error) {
	goenv := func(name string) (string, error) {
		out, err := exec.Command("go", "env", name).Output()
		return strings.TrimSpace(string(out)), err
	}
	cache, err := goenv("GOMODCACHE")
	if err != nil {
		return nil, err
	}
	goproxy, err := goenv("GOPROXY")
	if err != nil {
		return nil, err
	}
	goflags, err := goenv("GOFLAGS")
	if err != nil {
		return nil, err
	}
	nosumdb, err := goenv("GONOSUMDB")
	if err != nil {
		return nil, err
	}
	simCache := filepath.Join(dir, "modcache")
	proxies := []string{"file://" + filepath.ToSlash(filepath.Join(dir, "proxy"))}
	if cache != simCache {
		proxies = append(proxies, "file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download")))
	}
	if goproxy != "" && goproxy != "off" {
		proxies = append(proxies, goproxy)
	}
	flags := strings.Fields(goflags)
	for _, f := range []string{"-mod=mod", "-modcacherw"} {
		if !slices.Contains(flags, f) {
			flags = append(flags, f)
		}
	}
	rootPath := rel.Modules[0].Path
	if nosumdb == "" {
		nosumdb = rootPath
	} else if !slices.Contains(strings.Split(nosumdb, ","), rootPath) {
		nosumdb += "," + rootPath
	}
	return [][2]string{
		{"GOWORK", "off"},
		{"GOPROXY", strings.Join(proxies, ",")},
		{"GONOSUMDB", nosumdb},
		{"GOMODCACHE", simCache},
		{"GOFLAGS", strings.Join(flags, " ")},
	}, nil
}

// envCmd prints simEnv as shell exports, for .ci/run's per-module steps.
func envCmd(dir string) error {
	rel, err := readRelease(dir)
	if err != nil {
		return err
	}
	env, err := simEnv(dir, rel)
	if err != nil {
		return err
	}
	for _, kv := range env {
		fmt.Printf("export %s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
	}
	return nil
}

// A user is a scratch module that installs public modules from the proxy
// the way a user installs them from their tags: go mod init, then go get
// of each at the release version; no replace directive, no go.work.
type user struct {
	name  string   // the scratch module's name, and its sources' folder under testdata/users (if there)
	about string   // what it shows, for the log
	get   []string // the folders of the modules it gets ("" for the root)
	build []string // the packages it builds and lists the dependencies of
	run   bool     // go run . must succeed
	test  bool     // go test ./... must pass
	// noMods: go list -m all lists no module matching one of these.
	noMods []string
	// noReqs: no module of ours requires (go mod graph) a module matching
	// one of these. Third-party modules may: golang.org/x/text requires
	// golang.org/x/tools for its generators, and gRPC requires the
	// OpenTelemetry SDK for its own, so both are in the graph of every
	// gRPC user; what this repository adds is what it can answer for.
	noReqs []string
	// noDeps: go list -deps of build lists no package matching one of these.
	noDeps []string
}

var (
	// toolMods are modules of tools: CI runs staticcheck by version, and
	// .ci/releasesim, which uses golang.org/x/mod, is a module of its own.
	toolMods = []string{`honnef\.co/go/tools`, `golang\.org/x/tools`, `golang\.org/x/mod`}
	// otelSDK is the OpenTelemetry SDK and its exporters: the
	// application's choice; otelmetrics needs only the metric API.
	otelSDK = []string{`go\.opentelemetry\.io/otel/sdk(/.*)?`, `go\.opentelemetry\.io/otel/exporters/.*`}
	// etcdServer is the etcd server and the storage and consensus
	// modules it brings: etcdtest's, never an etcdlock user's.
	etcdServer = []string{`go\.etcd\.io/etcd/server/v3`, `go\.etcd\.io/bbolt`, `go\.etcd\.io/raft/v3`}
)

// testHelper reports whether m is a test helper: a public module whose
// folder's name ends in "test" (etcdtest, redistest, like net/http's
// httptest), which a user requires from tests only and which may bring a
// server with it.
func testHelper(m mod) bool { return m.Public && strings.HasSuffix(path.Base(m.Dir), "test") }

// users returns the scratch modules to try: one per public module that
// gets it alone and builds all its packages, then those with programs
// and tests of their own under testdata/users.
func users(rel *release) []user {
	// No user's graph holds an unpublished module of ours.
	var unpub []string
	for _, m := range rel.Modules {
		if !m.Public {
			unpub = append(unpub, regexp.QuoteMeta(m.Path))
		}
	}
	library := slices.Concat(toolMods, otelSDK, etcdServer)
	var us []user
	for _, m := range rel.Modules {
		if !m.Public {
			continue
		}
		u := user{
			name:  "get-" + strings.NewReplacer("/", "-").Replace(cmpOr(m.Dir, "root")),
			about: "gets " + m.Path + " alone and builds its packages",
			get:   []string{m.Dir},
			build: []string{m.Path + "/..."},
		}
		if testHelper(m) {
			u.noMods, u.noReqs = unpub, toolMods
		} else {
			u.noMods, u.noReqs = slices.Concat(etcdServer, toolMods[:1], unpub), library
		}
		us = append(us, u)
	}
	return append(us,
		user{
			name:   "core",
			about:  "imports package fairlock alone: no tools, no OpenTelemetry SDK, no etcd in its graph; links no net/http, no OpenTelemetry",
			get:    []string{""},
			build:  []string{"."},
			run:    true,
			noMods: slices.Concat(library, unpub),
			noDeps: []string{`net/http`, `go\.opentelemetry\.io/.*`},
		},
		user{
			name:   "app",
			about:  "uses fairlock with otelmetrics, and etcdlock: no etcd server in its graph, none linked; nothing of ours requires tools or the OpenTelemetry SDK",
			get:    []string{"", "etcdlock"},
			build:  []string{"."},
			run:    true,
			noMods: slices.Concat(etcdServer, toolMods[:1], unpub),
			noReqs: library,
			noDeps: []string{`go\.etcd\.io/etcd/server/.*`, `go\.opentelemetry\.io/otel/sdk(/.*)?`},
		},
		user{
			name:   "etcdtest",
			about:  "tests etcdlock on etcdtest's embedded server",
			get:    []string{"etcdlock", "etcdlock/etcdtest"},
			build:  []string{"./..."},
			test:   true,
			noMods: unpub,
			noReqs: toolMods,
		},
	)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// usersCmd tries every user against dir/proxy (built by proxyCmd) and
// fails if any of them fails.
func usersCmd(dir string) error {
	rel, err := readRelease(dir)
	if err != nil {
		return err
	}
	env, err := simEnv(dir, rel)
	if err != nil {
		return err
	}
	byDir := make(map[string]mod)
	for _, m := range rel.Modules {
		byDir[m.Dir] = m
	}
	var failed []string
	for _, u := range users(rel) {
		fmt.Printf("-- user %s: %s\n", u.name, u.about)
		if err := try(dir, rel, env, byDir, u); err != nil {
			fmt.Printf("FAIL %s: %v\n", u.name, err)
			failed = append(failed, u.name)
			continue
		}
		fmt.Printf("ok   %s\n", u.name)
	}
	if len(failed) > 0 {
		return fmt.Errorf("users that failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// try makes u's scratch module under dir/users and runs its steps.
func try(dir string, rel *release, env [][2]string, byDir map[string]mod, u user) error {
	wd := filepath.Join(dir, "users", u.name)
	if err := os.RemoveAll(wd); err != nil {
		return err
	}
	if err := os.MkdirAll(wd, 0o755); err != nil {
		return err
	}
	src := filepath.Join("testdata", "users", u.name)
	sources, err := os.ReadDir(src)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range sources {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(wd, e.Name()), data, 0o644); err != nil {
			return err
		}
	}
	goCmd := func(args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = wd
		cmd.Env = os.Environ()
		for _, kv := range env {
			cmd.Env = append(cmd.Env, kv[0]+"="+kv[1])
		}
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &out
		fmt.Printf("   $ go %s\n", strings.Join(args, " "))
		err := cmd.Run()
		if err != nil {
			return out.String(), fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, indent(out.String()))
		}
		return out.String(), nil
	}
	if _, err := goCmd("mod", "init", "example.com/"+u.name); err != nil {
		return err
	}
	get := []string{"get"}
	for _, d := range u.get {
		m, ok := byDir[d]
		if !ok || !m.Public {
			return fmt.Errorf("the release has no public module in folder %q", cmpOr(d, "."))
		}
		get = append(get, m.Path+"@"+rel.Version)
	}
	if _, err := goCmd(get...); err != nil {
		return err
	}
	if len(sources) > 0 {
		if _, err := goCmd("mod", "tidy"); err != nil {
			return err
		}
	}
	if _, err := goCmd(append([]string{"build"}, u.build...)...); err != nil {
		return err
	}
	if u.run {
		out, err := goCmd("run", ".")
		if err != nil {
			return err
		}
		fmt.Print(indent(out))
	}
	if u.test {
		out, err := goCmd("test", "-count=1", "./...")
		if err != nil {
			return err
		}
		fmt.Print(indent(out))
	}
	mods, err := goCmd("list", "-m", "all")
	if err != nil {
		return err
	}
	fmt.Printf("      %d modules in go list -m all\n", len(strings.Fields(mods))/2)
	var problems []string
	for _, line := range strings.Split(strings.TrimSpace(mods), "\n") {
		p := strings.Fields(line)[0]
		if re := matchAny(u.noMods, p); re != "" {
			problems = append(problems, fmt.Sprintf("go list -m all lists %s (matches %s)", line, re))
		}
	}
	rootPath := rel.Modules[0].Path
	ours := func(p string) bool { return p == rootPath || strings.HasPrefix(p, rootPath+"/") }
	if len(u.noReqs) > 0 {
		graph, err := goCmd("mod", "graph")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(strings.TrimSpace(graph), "\n") {
			from, to, _ := strings.Cut(line, " ")
			fromPath, _, _ := strings.Cut(from, "@")
			toPath, _, _ := strings.Cut(to, "@")
			if !ours(fromPath) {
				continue
			}
			if re := matchAny(u.noReqs, toPath); re != "" {
				problems = append(problems, fmt.Sprintf("go mod graph: %s requires %s (matches %s)", from, to, re))
			}
		}
	}
	deps, err := goCmd(append([]string{"list", "-deps", "-f", "{{.ImportPath}}\t{{with .Module}}{{.Path}}{{end}}\t{{join .Imports \" \"}}"}, u.build...)...)
	if err != nil {
		return err
	}
	problems = append(problems, checkDeps(deps, u.noDeps, ours)...)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n  "))
	}
	return nil
}

// checkDeps checks go list -deps output (import path, module, imports)
// for packages that match one of no, and for a package of ours (ours
// reports whether a module is) that imports an internal package of
// another module: Go allows it when the paths nest, but two modules are
// versioned apart, so one release of the importer paired with another of
// the imported module can stop compiling.
func checkDeps(deps string, no []string, ours func(string) bool) []string {
	var problems []string
	modOf := make(map[string]string)
	type pkg struct{ path, mod, imports string }
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(deps), "\n") {
		f := strings.SplitN(line, "\t", 3)
		for len(f) < 3 {
			f = append(f, "")
		}
		modOf[f[0]] = f[1]
		pkgs = append(pkgs, pkg{f[0], f[1], f[2]})
		if re := matchAny(no, f[0]); re != "" {
			problems = append(problems, fmt.Sprintf("go list -deps lists %s (matches %s)", f[0], re))
		}
	}
	for _, p := range pkgs {
		for _, imp := range strings.Fields(p.imports) {
			if ours(p.mod) && (strings.Contains(imp, "/internal/") || strings.HasSuffix(imp, "/internal")) && modOf[imp] != "" && modOf[imp] != p.mod {
				problems = append(problems, fmt.Sprintf("%s (module %s) imports %s, an internal package of module %s", p.path, p.mod, imp, modOf[imp]))
			}
		}
	}
	return problems
}

// matchAny returns the first of res that matches all of s, or "".
func matchAny(res []string, s string) string {
	for _, re := range res {
		if regexp.MustCompile(`^(` + re + `)$`).MatchString(s) {
			return re
		}
	}
	return ""
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "      " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n      ") + "\n"
}
