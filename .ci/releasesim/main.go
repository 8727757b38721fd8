// Command releasesim simulates a release of this repository's public
// modules, so that CI sees, before anything is tagged, what a user meets
// after `go get`: it builds a local module proxy from the working tree
// (golang.org/x/mod/zip makes each zip, as the public proxy makes one from
// a tag), then installs the modules from that proxy into scratch modules
// that have no replace directive and no go.work, builds and runs programs
// in them, and checks their module graphs.
//
// It is a module of its own, outside the workspace (go.work), so that its
// requirement on golang.org/x/mod reaches neither the library's go.mod nor
// the workspace's build list. .ci/run calls it from this directory, with
// GOWORK=off:
//
//	go run . proxy DIR     # DIR/proxy: the public modules; DIR/release.json: what it served
//	go run . env DIR       # shell exports that resolve the modules from DIR/proxy
//	go run . tidy DIR [FOLDER...]     # each module's go.mod and go.sum are tidy against DIR/proxy
//	go run . tidy -w DIR [FOLDER...]  # make them so (go mod tidy alone cannot resolve unreleased siblings)
//	go run . users DIR     # scratch modules install, build and run them; their graphs are checked
//
// RELEASING.md, at the repository root, describes the scheme.
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	args := os.Args[1:]
	if len(args) < 2 {
		usage()
	}
	cmd, write := args[0], false
	if cmd == "tidy" && args[1] == "-w" {
		write, args = true, args[1:]
	}
	if len(args) < 2 || (cmd != "tidy" && len(args) != 2) {
		usage()
	}
	dir, err := filepath.Abs(args[1])
	if err != nil {
		fail(err)
	}
	switch cmd {
	case "proxy":
		err = proxyCmd(dir)
	case "env":
		err = envCmd(dir)
	case "tidy":
		err = tidyCmd(dir, write, args[2:])
	case "users":
		err = usersCmd(dir)
	default:
		usage()
	}
	if err != nil {
		fail(err)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: releasesim proxy|env|users DIR, or releasesim tidy [-w] DIR [MODULE-FOLDER...] (run in .ci/releasesim; the repository root is ../..)")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "releasesim:", err)
	os.Exit(1)
}
