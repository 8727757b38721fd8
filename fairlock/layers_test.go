package fairlock

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers lists the package's files from the bottom up: a file's code may
// use what the files before it declare, never what a file after it does
// (docs/design.md, "Where things are").
var layers = []string{
	"observer.go",
	"options.go",
	"keytext.go",
	"errors.go",
	"entry.go",
	"feedbuf.go",
	"deadlock.go",
	"debugstate.go",
	"table.go",
	"shard.go",
	"guard.go",
	"lock.go",
	"debug.go",
	"calls.go",
	"lifecycle.go",
	"locker.go",
	"semaphore.go",
	"lockmany.go",
	"follow.go",
}

// TestLayers type-checks the package's own files and fails on every use
// of a package-level declaration, method or field that runs from a file
// to a file after it in layers: a lower file calling up into a higher
// one (a shard into its table, an entry into its shard). Every file must
// be listed, so a new one is placed on purpose.
func TestLayers(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		if !slices.Contains(layers, n) {
			t.Errorf("%s is not in layers: place it among the files it uses", n)
		}
		src, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, n, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: make(map[*ast.Ident]types.Object)}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("github.com/fairlock/fairlock/fairlock", fset, files, info)
	if err != nil {
		t.Fatalf("type-checking the package's files: %v", err)
	}
	level := func(pos token.Pos) int { return slices.Index(layers, filepath.Base(fset.Position(pos).Filename)) }
	seen := make(map[string]bool)
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && obj.Parent() != pkg.Scope() {
			continue // a local variable or parameter
		}
		if obj.Parent() != nil && obj.Parent() != pkg.Scope() && obj.Parent() != types.Universe {
			continue // declared inside a function
		}
		from, to := level(id.Pos()), level(obj.Pos())
		if from >= to {
			continue
		}
		msg := fileOf(fset, id.Pos()) + " uses " + obj.Name() + " of " + fileOf(fset, obj.Pos()) + ", a file above it"
		if !seen[msg] {
			seen[msg] = true
			t.Errorf("%s (%s)", msg, fset.Position(id.Pos()))
		}
	}
}

func fileOf(fset *token.FileSet, pos token.Pos) string {
	return filepath.Base(fset.Position(pos).Filename)
}
