// Command layers checks that the files of a Go package are layered: no
// file uses a declaration, method or field of a file that uses it back,
// directly or through others. In a layered package a reader can take the
// files from the bottom up, each one readable with only those below it in
// mind; a cycle of files is a cycle of concerns (a shard that calls its
// table, a component that reaches back into its owner).
//
// A use is resolved by the type checker (golang.org/x/tools/go/packages),
// so a name that two files declare for different things is told apart;
// test files are not read. For each cycle it prints the files and, for
// each step of the cycle, the names one file uses of the next.
//
// It is a module of its own, outside the workspace (go.work), so that its
// requirement on golang.org/x/tools reaches no published go.mod. .ci/run
// calls it from this directory with GOWORK=off, naming the repository's
// go.work and the packages to check:
//
//	go run . -work ../../go.work ../../fairlock ../../etcdlock ../../redislock
//
// It exits 1 if a package's files form a cycle, 2 if a package does not
// load. The core package also has TestLayers (fairlock/layers_test.go),
// which holds its files to one written order.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

func main() {
	work := flag.String("work", "", "the go.work to load the packages with (default: none, GOWORK=off)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: layers [-work FILE] DIR...")
		os.Exit(2)
	}
	failed := false
	for _, dir := range flag.Args() {
		g, err := load(dir, *work)
		if err != nil {
			fmt.Fprintf(os.Stderr, "layers: %s: %v\n", dir, err)
			os.Exit(2)
		}
		cycles := g.cycles()
		if len(cycles) == 0 {
			fmt.Printf("%s: %d files, layered; from the bottom up: %s\n", g.pkg, len(g.files), strings.Join(g.order(), " "))
			continue
		}
		failed = true
		for _, c := range cycles {
			fmt.Printf("%s: files in a cycle: %s\n", g.pkg, strings.Join(c, " "))
			for _, a := range c {
				for _, b := range c {
					if names := g.uses[a][b]; len(names) > 0 {
						fmt.Printf("\t%s uses %s of %s\n", a, strings.Join(names, ", "), b)
					}
				}
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

// graph is a package's files and, for each ordered pair of them, the
// names the first uses of the second.
type graph struct {
	pkg   string
	files []string                       // base names, sorted
	uses  map[string]map[string][]string // user file → declaring file → names, sorted
}

// load type-checks the package in dir (test files left out) and returns
// its file graph. work is the go.work to load it with, or "" for none.
func load(dir, work string) (*graph, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	gowork := "off"
	if work != "" {
		if gowork, err = filepath.Abs(work); err != nil {
			return nil, err
		}
	}
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:  abs,
		Env:  append(os.Environ(), "GOWORK="+gowork, "GOFLAGS="),
	}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		return nil, err
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("%d packages, want 1", len(pkgs))
	}
	p := pkgs[0]
	if len(p.Errors) > 0 {
		return nil, p.Errors[0]
	}
	g := &graph{pkg: p.PkgPath, uses: make(map[string]map[string][]string)}
	seen := make(map[[3]string]bool)
	for _, f := range p.Syntax {
		user := filepath.Base(p.Fset.Position(f.Pos()).Filename)
		g.files = append(g.files, user)
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			obj := p.TypesInfo.Uses[id]
			if obj == nil || obj.Pkg() != p.Types || !obj.Pos().IsValid() || local(obj, p.Types) {
				return true
			}
			decl := filepath.Base(p.Fset.Position(obj.Pos()).Filename)
			if decl == user || seen[[3]string{user, decl, obj.Name()}] {
				return true
			}
			seen[[3]string{user, decl, obj.Name()}] = true
			if g.uses[user] == nil {
				g.uses[user] = make(map[string][]string)
			}
			g.uses[user][decl] = append(g.uses[user][decl], obj.Name())
			return true
		})
	}
	sort.Strings(g.files)
	for _, m := range g.uses {
		for _, names := range m {
			sort.Strings(names)
		}
	}
	return g, nil
}

// local reports whether obj is declared inside a function (a variable,
// a parameter, a type parameter, a local type): not a file's own
// declaration. Fields and methods are, wherever their type is declared.
func local(obj types.Object, pkg *types.Package) bool {
	if v, ok := obj.(*types.Var); ok && v.IsField() {
		return false
	}
	if f, ok := obj.(*types.Func); ok && f.Signature().Recv() != nil {
		return false
	}
	return obj.Parent() != pkg.Scope()
}

// cycles returns the strongly connected components of more than one file
// (Tarjan's algorithm), each sorted, in a stable order.
func (g *graph) cycles() [][]string {
	index := make(map[string]int)
	low := make(map[string]int)
	on := make(map[string]bool)
	var stack []string
	var out [][]string
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		on[v] = true
		for _, w := range g.next(v) {
			if _, ok := index[w]; !ok {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var c []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			c = append(c, w)
			if w == v {
				break
			}
		}
		if len(c) > 1 {
			sort.Strings(c)
			out = append(out, c)
		}
	}
	for _, f := range g.files {
		if _, ok := index[f]; !ok {
			visit(f)
		}
	}
	slices.SortFunc(out, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	return out
}

// next returns the files that v uses, sorted.
func (g *graph) next(v string) []string {
	var out []string
	for w := range g.uses[v] {
		out = append(out, w)
	}
	sort.Strings(out)
	return out
}

// order returns the files of an acyclic graph from the bottom up: each
// after every file it uses (ties by name).
func (g *graph) order() []string {
	var out []string
	done := make(map[string]bool)
	var visit func(v string)
	visit = func(v string) {
		if done[v] {
			return
		}
		done[v] = true
		for _, w := range g.next(v) {
			visit(w)
		}
		out = append(out, v)
	}
	for _, f := range g.files {
		visit(f)
	}
	return out
}
