package fairlock_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestREADMESnippetBuilds takes the first ```go block of README.md, writes
// it as the only file of a scratch module that requires this checkout
// (through a replace), builds it with the go command and runs it: the
// program a reader copies compiles as shown, with the import path shown.
// It takes about a second once the build cache is warm.
func TestREADMESnippetBuilds(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command in PATH: %v", err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := firstGoBlock(readme)
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go \S+$`).Find(gomod)
	if goLine == nil {
		t.Fatal("go.mod has no go line")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{
		"main.go": src,
		"go.mod": []byte("module example.com/readme\n\n" + string(goLine) + "\n\n" +
			"require github.com/fairlock/fairlock v0.0.0\n\n" +
			"replace github.com/fairlock/fairlock => " + root + "\n"),
	}
	if sum, err := os.ReadFile("go.sum"); err == nil {
		files["go.sum"] = sum // the checkout's sums cover what it requires
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "readme")
	build := exec.Command(goCmd, "build", "-o", bin, ".")
	build.Dir = dir
	// -mod=mod lets the build add the checkout's requirements to the
	// scratch go.mod; GOWORK=off keeps any workspace out of it.
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the README's Go block does not build: %v\n%s\n--- the block:\n%s", err, out, src)
	}
	run := exec.Command(bin)
	run.Dir = dir
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("the README's program failed: %v\n%s", err, out)
	}
}

// firstGoBlock returns the body of the first fenced ```go block in md.
func firstGoBlock(md []byte) ([]byte, error) {
	_, rest, ok := bytes.Cut(md, []byte("\n```go\n"))
	if !ok {
		return nil, errors.New("README.md has no ```go block")
	}
	body, _, ok := bytes.Cut(rest, []byte("\n```\n"))
	if !ok {
		return nil, errors.New("README.md's first ```go block is not closed")
	}
	return append(body, '\n'), nil
}
