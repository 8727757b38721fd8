package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// A mod is one module of the tree: a go.mod file and the folder it heads.
type mod struct {
	Dir    string `json:"dir"`    // relative to the root, slash-separated; "" for the root
	Path   string `json:"path"`   // its module path
	Public bool   `json:"public"` // published: tagged and served to users
	// Sum is the go.sum line of the zip the proxy serves; it changes with
	// every commit until the tag, so no go.sum of the tree records it.
	Sum  string `json:"sum,omitempty"`
	file *modfile.File
}

// A release is what the proxy serves: every public module at one version.
type release struct {
	Root    string `json:"root"`    // the repository root
	Version string `json:"version"` // the version every public module is served at
	Modules []mod  `json:"modules"` // every module of the tree, public or not
}

// unpublished names the folders whose modules are never published: any
// module with one of them among its folder's elements is unpublished.
// "internal" for the reason Go gives that name (nothing outside this
// repository may import it: test modules, test helpers of our own);
// "examples" and "benchmarks" hold runnable programs, which no user
// imports. Every other module is public: tagged, and served to users.
var unpublished = []string{"internal", "examples", "benchmarks"}

// public reports whether the module in folder dir (relative to the root)
// is published.
func public(dir string) bool {
	for _, e := range strings.Split(dir, "/") {
		if slices.Contains(unpublished, e) {
			return false
		}
	}
	return true
}

// repoRoot returns the repository root: releasesim runs in .ci/releasesim.
func repoRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("no go.mod two folders up (run releasesim in .ci/releasesim): %w", err)
	}
	return root, nil
}

// discover finds the modules of the tree: every go.mod outside .git,
// testdata, vendor and folders whose names start with "." or "_" (which
// the go command ignores too; this program's own module is in .ci).
func discover(root string) ([]*mod, error) {
	var mods []*mod
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s: no module line", p)
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			rel = ""
		}
		mods = append(mods, &mod{Dir: rel, Path: f.Module.Mod.Path, Public: public(rel), file: f})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(mods, func(a, b *mod) int { return strings.Compare(a.Dir, b.Dir) })
	if len(mods) == 0 || mods[0].Dir != "" {
		return nil, fmt.Errorf("%s: no go.mod at the root", root)
	}
	return mods, nil
}

// where names a module's go.mod for messages.
func where(m *mod) string { return path.Join(m.Dir, "go.mod") }

// check returns what keeps the tree from being released as it is, and
// the version its modules require of each other. The rules (RELEASING.md):
// no replace directive in any go.mod; each module of this repository that
// another requires is a module of the tree; a public module requires no
// unpublished one; every such requirement names the same version, the one
// to be tagged, and it is a release version, not the v0.0.0 placeholder.
func check(mods []*mod) (problems []string, version string) {
	rootPath := mods[0].Path
	byPath := make(map[string]*mod)
	for _, m := range mods {
		byPath[m.Path] = m
		if want := path.Join(rootPath, m.Dir); m.Path != want {
			problems = append(problems, fmt.Sprintf("%s: module %s; a nested module's path must be its folder under the root's (%s), or the go command cannot find it in the repository", where(m), m.Path, want))
		}
	}
	versions := make(map[string][]string)
	for _, m := range mods {
		for _, r := range m.file.Replace {
			problems = append(problems, fmt.Sprintf("%s: replace %s => %s: a user's build ignores replace directives in dependencies (the workspace, go.work, joins the modules in development)", where(m), r.Old.Path, r.New.Path))
		}
		for _, r := range m.file.Require {
			p, v := r.Mod.Path, r.Mod.Version
			if p != rootPath && !strings.HasPrefix(p, rootPath+"/") {
				continue
			}
			dep := byPath[p]
			switch {
			case dep == nil:
				problems = append(problems, fmt.Sprintf("%s: requires %s, which is no module of this tree", where(m), p))
			case m.Public && !dep.Public:
				problems = append(problems, fmt.Sprintf("%s: the public module %s requires the unpublished %s", where(m), m.Path, p))
			}
			if v == "v0.0.0" {
				problems = append(problems, fmt.Sprintf("%s: requires %s v0.0.0, a placeholder that is never tagged: a user cannot download it", where(m), p))
				continue
			}
			if !semver.IsValid(v) || semver.Canonical(v) != v || strings.Contains(v, "+") || module.IsPseudoVersion(v) {
				problems = append(problems, fmt.Sprintf("%s: requires %s %s, which is not a release version", where(m), p, v))
				continue
			}
			versions[v] = append(versions[v], m.Dir+" → "+p)
		}
	}
	switch len(versions) {
	case 0:
		problems = append(problems, "no module requires a sibling at a release version: there is no version to simulate")
	case 1:
		for v := range versions {
			version = v
		}
	default:
		var vs []string
		for v, who := range versions {
			vs = append(vs, fmt.Sprintf("%s (%s)", v, strings.Join(who, ", ")))
		}
		slices.Sort(vs)
		problems = append(problems, "the modules require their siblings at different versions; all are tagged together at one: "+strings.Join(vs, "; "))
	}
	return problems, version
}

// checkWork returns what keeps the workspace (go.work) from building the
// tree as one: each module must be a workspace module, and each public
// module's release version must be replaced by its folder. A workspace
// module is a root of minimal version selection, not a replacement for
// the other versions of its path, so without these replace lines the go
// command fetches the go.mod of the version a sibling requires, which no
// proxy has before the tag.
func checkWork(root string, mods []*mod, version string) []string {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return []string{"go.work: " + err.Error()}
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return []string{err.Error()}
	}
	clean := func(p string) string { return path.Clean(filepath.ToSlash(p)) }
	used := make(map[string]bool)
	for _, u := range wf.Use {
		used[clean(u.Path)] = true
	}
	replaced := make(map[module.Version]string)
	for _, r := range wf.Replace {
		replaced[r.Old] = clean(r.New.Path)
	}
	var problems []string
	for _, m := range mods {
		dir := clean("./" + m.Dir)
		if !used[dir] {
			problems = append(problems, fmt.Sprintf("go.work: no line \"use ./%s\" (module %s)", m.Dir, m.Path))
		}
		if !m.Public || version == "" {
			continue
		}
		if got, ok := replaced[module.Version{Path: m.Path, Version: version}]; !ok || got != dir {
			problems = append(problems, fmt.Sprintf("go.work: no line \"replace %s %s => ./%s\" (the workspace would fetch that version's go.mod, which no proxy has before the tag)", m.Path, version, m.Dir))
		}
	}
	return problems
}

// proxyCmd builds dir/proxy, a GOPROXY folder serving every public module
// of the tree at the version the modules require of each other, and
// writes dir/release.json. It serves the modules even when the tree
// breaks a rule of check (so that the users' step shows what a user would
// see), but then reports the problems and fails.
func proxyCmd(dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	mods, err := discover(root)
	if err != nil {
		return err
	}
	problems, version := check(mods)
	problems = append(problems, checkWork(root, mods, version)...)
	if version == "" {
		// The version to serve at when the tree names none: so that the
		// users' step can still show the failure a user would meet.
		version = "v0.1.0"
		problems = append(problems, "serving the public modules at "+version+" anyway")
	}
	out := filepath.Join(dir, "proxy")
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	// The module cache of the simulation (simEnv) keeps a module by path
	// and version: drop what an earlier run took from an earlier proxy,
	// or it would be used instead of what this one serves.
	if err := purge(filepath.Join(dir, "modcache"), mods[0].Path); err != nil {
		return err
	}
	rel := release{Root: root, Version: version}
	fmt.Printf("simulated release %s of %s (proxy %s):\n", version, root, out)
	for _, m := range mods {
		if !m.Public {
			fmt.Printf("  %-50s unpublished (%s)\n", m.Path, where(m))
			rel.Modules = append(rel.Modules, *m)
			continue
		}
		sum, err := serve(root, out, m, version)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Path, err)
		}
		m.Sum = sum
		fmt.Printf("  %s\n", sum)
		rel.Modules = append(rel.Modules, *m)
	}
	data, err := json.MarshalIndent(rel, "", "\t")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "release.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	if len(problems) > 0 {
		return errors.New("the tree cannot be released as it is:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// purge removes from the module cache at cache every module of this
// repository (rootPath and the paths under it): downloads and extracted
// folders. The go command makes extracted folders read-only, so it makes
// them writable first.
func purge(cache, rootPath string) error {
	esc, err := module.EscapePath(rootPath)
	if err != nil {
		return err
	}
	esc = filepath.FromSlash(esc)
	targets, err := filepath.Glob(filepath.Join(cache, esc+"@*"))
	if err != nil {
		return err
	}
	targets = append(targets, filepath.Join(cache, esc), filepath.Join(cache, "cache", "download", esc))
	for _, t := range targets {
		err := filepath.WalkDir(t, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				return os.Chmod(p, 0o755)
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.RemoveAll(t); err != nil {
			return err
		}
	}
	return nil
}

// serve writes m at version into the proxy folder out: the zip, the
// go.mod, the .info and the list, in the layout of GOPROXY's protocol
// (go help goproxy). It returns the zip's go.sum line.
func serve(root, out string, m *mod, version string) (string, error) {
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return "", err
	}
	escVer, err := module.EscapeVersion(version)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	files, err := moduleFiles(root, m.Dir)
	if err != nil {
		return "", err
	}
	zipPath := filepath.Join(vdir, escVer+".zip")
	zf, err := os.Create(zipPath)
	if err != nil {
		return "", err
	}
	if err := modzip.Create(zf, module.Version{Path: m.Path, Version: version}, files); err != nil {
		zf.Close()
		return "", err
	}
	if err := zf.Close(); err != nil {
		return "", err
	}
	gomod, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod"))
	if err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		escVer + ".mod":  gomod,
		escVer + ".info": info,
		"list":           []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	h1, err := dirhash.HashZip(zipPath, dirhash.Hash1)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s %s", m.Path, version, h1), nil
}

// moduleFiles lists the files of the module in folder dir: those git
// would commit (tracked and untracked files, less the ignored and the
// deleted), as the public proxy takes a tag's files from git. Files of
// nested modules are listed too; modzip.Create leaves them out. Outside a
// git checkout it takes every file in the folder. Like the go command, it
// adds the repository's LICENSE to a nested module that has none.
func moduleFiles(root, dir string) ([]modzip.File, error) {
	abs := filepath.Join(root, filepath.FromSlash(dir))
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
	cmd.Dir = abs
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		if _, serr := os.Stat(filepath.Join(root, ".git")); serr == nil {
			return nil, fmt.Errorf("git ls-files: %v: %s", err, stderr.Bytes())
		}
		return dirFiles(abs)
	}
	var files []modzip.File
	seen := make(map[string]bool)
	for _, name := range strings.Split(string(outb), "\x00") {
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		fp := filepath.Join(abs, filepath.FromSlash(name))
		info, err := os.Lstat(fp)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree: not in the next commit
		}
		if err != nil {
			return nil, err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		files = append(files, file{name, fp, info})
	}
	if dir != "" && !seen["LICENSE"] {
		lp := filepath.Join(root, "LICENSE")
		if info, err := os.Lstat(lp); err == nil && info.Mode().IsRegular() {
			files = append(files, file{"LICENSE", lp, info})
		}
	}
	return files, nil
}

// dirFiles lists every regular file under abs, outside VCS folders.
func dirFiles(abs string) ([]modzip.File, error) {
	var files []modzip.File
	err := filepath.WalkDir(abs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".hg", ".svn", ".bzr":
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(abs, p)
		if err != nil {
			return err
		}
		files = append(files, file{filepath.ToSlash(rel), p, info})
		return nil
	})
	return files, err
}

// file is a modzip.File on disk.
type file struct {
	name string // slash-separated, relative to the module's folder
	path string
	info fs.FileInfo
}

func (f file) Path() string                 { return f.name }
func (f file) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.path) }

// readRelease reads dir/release.json, written by proxyCmd.
func readRelease(dir string) (*release, error) {
	data, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if err != nil {
		return nil, fmt.Errorf("%w (run releasesim proxy first)", err)
	}
	var rel release
	if err := json.Unmarshal(data, &rel); err != nil {
		return nil, err
	}
	return &rel, nil
}
