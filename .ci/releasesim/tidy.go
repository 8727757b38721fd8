package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// tidyCmd checks (or, with write, makes) every module's go.mod and go.sum
// as `go mod tidy` leaves them when this repository's modules come from
// dir/proxy, with one difference: go.sum keeps no line for this
// repository's own modules. Those lines would hash the simulated zips,
// which change with every commit until the tag; a user's go.sum gets the
// real ones from the checksum database, and a module's own go.sum is
// never read by its users. Go reads and writes a copy of each go.mod and
// go.sum (-modfile), so checking changes nothing in the tree. folders
// (relative to the root, "." for it) limit it to those modules.
func tidyCmd(dir string, write bool, folders []string) error {
	rel, err := readRelease(dir)
	if err != nil {
		return err
	}
	env, err := simEnv(dir, rel)
	if err != nil {
		return err
	}
	rootPath := rel.Modules[0].Path
	var untidy []string
	for _, m := range rel.Modules {
		mdir := filepath.Join(rel.Root, filepath.FromSlash(m.Dir))
		name := cmpOr(m.Dir, ".")
		if len(folders) > 0 && !slices.Contains(folders, name) {
			continue
		}
		haveMod, err := os.ReadFile(filepath.Join(mdir, "go.mod"))
		if err != nil {
			return err
		}
		haveSum, err := os.ReadFile(filepath.Join(mdir, "go.sum"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		tmp, err := os.MkdirTemp(dir, "tidy-")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, "go.mod"), haveMod, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, "go.sum"), haveSum, 0o644); err != nil {
			return err
		}
		cmd := exec.Command("go", "mod", "tidy")
		cmd.Dir = mdir
		cmd.Env = withModfile(env, filepath.Join(tmp, "go.mod"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: go mod tidy: %v\n%s", name, err, out)
		}
		gotMod, err := os.ReadFile(filepath.Join(tmp, "go.mod"))
		if err != nil {
			return err
		}
		gotSum, err := os.ReadFile(filepath.Join(tmp, "go.sum"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		gotSum = dropOurs(gotSum, rootPath)
		if write {
			for _, f := range []struct {
				name       string
				have, want []byte
			}{{"go.mod", haveMod, gotMod}, {"go.sum", haveSum, gotSum}} {
				if bytes.Equal(f.have, f.want) {
					continue
				}
				if err := os.WriteFile(filepath.Join(mdir, f.name), f.want, 0o644); err != nil {
					return err
				}
				fmt.Printf("wrote %s/%s\n", name, f.name)
			}
			continue
		}
		ok := true
		for _, f := range []struct {
			name       string
			have, want []byte
		}{{"go.mod", haveMod, gotMod}, {"go.sum", haveSum, gotSum}} {
			if !bytes.Equal(f.have, f.want) {
				ok = false
				fmt.Printf("%s/%s is not tidy:\n%s", name, f.name, diff(tmp, f.name, f.have, f.want))
			}
		}
		if !ok {
			untidy = append(untidy, name)
		} else {
			fmt.Printf("%s: tidy\n", name)
		}
	}
	if len(untidy) > 0 {
		return fmt.Errorf("not tidy: %s (bash .ci/tidy FOLDER... makes them so; RELEASING.md)", strings.Join(untidy, ", "))
	}
	return nil
}

// withModfile returns the environment env adds to this process's, with
// -modfile=modfile added to GOFLAGS: the go command then reads and writes
// modfile, and the go.sum beside it, instead of the module's own.
func withModfile(env [][2]string, modfile string) []string {
	out := os.Environ()
	for _, kv := range env {
		v := kv[1]
		if kv[0] == "GOFLAGS" {
			v += " -modfile=" + modfile
		}
		out = append(out, kv[0]+"="+v)
	}
	return out
}

// dropOurs returns sum without the lines of this repository's modules
// (rootPath and the modules under it).
func dropOurs(sum []byte, rootPath string) []byte {
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(sum), "\n") {
		if p, _, _ := strings.Cut(line, " "); p == rootPath || strings.HasPrefix(p, rootPath+"/") {
			continue
		}
		b.WriteString(line)
	}
	return b.Bytes()
}

// diff returns a unified diff of have and want, named name, from diff -u.
func diff(tmp, name string, have, want []byte) string {
	a, b := filepath.Join(tmp, "have"), filepath.Join(tmp, "want")
	if os.WriteFile(a, have, 0o644) != nil || os.WriteFile(b, want, 0o644) != nil {
		return "(cannot write the diff's files)\n"
	}
	out, _ := exec.Command("diff", "-u", "--label", "committed "+name, "--label", "tidy "+name, a, b).CombinedOutput()
	return string(out)
}
