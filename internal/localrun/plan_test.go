package localrun

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tree makes the files (ending in "/" for directories) under root.
func tree(t *testing.T, root string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCarve(t *testing.T) {
	root := t.TempDir()
	tree(t, root, "a/b/secret/key", "a/b/sibling", "a/b/dir/", "a/c/", "d", "e/f/")
	j := func(ps ...string) []string {
		var out []string
		for _, p := range ps {
			out = append(out, filepath.Join(root, p))
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		deny       []string
		read, list []string
	}{
		{"nothing denied", nil, j(""), nil},
		{"one deep path", j("a/b/secret"), j("a/b/dir", "a/b/sibling", "a/c", "d", "e"), j("", "a", "a/b")},
		{"two branches", j("a/b/secret", "e/f"), j("a/b/dir", "a/b/sibling", "a/c", "d"), j("", "a", "a/b", "e")},
		{"a file", j("d"), j("a", "e"), j("")},
		{"nested denials", j("a/b", "a/b/secret"), j("a/c", "d", "e"), j("", "a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read, list, err := carve(filepath.Clean(root), tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			if tc.read == nil {
				tc.read = []string{root}
			}
			slices.Sort(read)
			slices.Sort(tc.read)
			slices.Sort(list)
			slices.Sort(tc.list)
			if !slices.Equal(read, tc.read) || !slices.Equal(list, tc.list) {
				t.Errorf("carve:\n read %v\n want %v\n list %v\n want %v", read, tc.read, list, tc.list)
			}
			for _, d := range tc.deny {
				for _, r := range read {
					if d == r || under(d, r) {
						t.Errorf("denied %s is readable through %s", d, r)
					}
				}
			}
		})
	}
}

func TestBuildPlan(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	proj := filepath.Join(home, "proj")
	tmp := filepath.Join(base, "tmp")
	tree(t, home, ".ssh/id_rsa", ".aws/credentials", ".bashrc", "proj/.env", "proj/.env.local", "proj/main.go",
		"proj/secrets/k", "cache/")
	tree(t, base, "tmp/")
	env := Env{Home: home, Dir: proj, TmpDir: tmp}

	for _, tc := range []struct {
		name       string
		c          Config
		masks      []string // denied paths inside writable ones
		denied     []string // every denied path
		readable   []string // covered by a read or write rule
		unreadable []string
	}{
		{name: "defaults", c: Config{},
			masks:      []string{proj + "/.env", proj + "/.env.local"},
			denied:     []string{home + "/.ssh", home + "/.aws", proj + "/.env", proj + "/.env.local"},
			readable:   []string{home + "/.bashrc", proj + "/main.go", "/usr"},
			unreadable: []string{home + "/.ssh/id_rsa", home + "/.aws/credentials"}},
		{name: "--read re-allows a default", c: Config{Read: []string{"~/.ssh"}},
			masks:    []string{proj + "/.env", proj + "/.env.local"},
			denied:   []string{home + "/.aws", proj + "/.env", proj + "/.env.local"},
			readable: []string{home + "/.ssh/id_rsa"}},
		{name: "--deny-read in the project", c: Config{DenyRead: []string{"./secrets"}, NoDefaultDeny: true},
			masks: []string{proj + "/secrets"}, denied: []string{proj + "/secrets"},
			readable: []string{home + "/.ssh/id_rsa"}},
		{name: "--write over a credential store masks it", c: Config{Write: []string{"~"}},
			masks:  []string{home + "/.aws", home + "/.ssh", proj + "/.env", proj + "/.env.local"},
			denied: []string{home + "/.ssh", home + "/.aws", proj + "/.env", proj + "/.env.local"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := BuildPlan(tc.c, env)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Masks, tc.masks) {
				t.Errorf("masks %v, want %v", p.Masks, tc.masks)
			}
			var denied []string
			for _, d := range p.Denied {
				denied = append(denied, d.Path)
			}
			slices.Sort(denied)
			slices.Sort(tc.denied)
			if !slices.Equal(denied, tc.denied) {
				t.Errorf("denied %v, want %v", denied, tc.denied)
			}
			covered := func(path string) bool { return underAny(path, p.Read) || underAny(path, p.Write) }
			for _, r := range tc.readable {
				if !covered(r) {
					t.Errorf("%s is not readable", r)
				}
			}
			for _, r := range tc.unreadable {
				if covered(r) {
					t.Errorf("%s is readable", r)
				}
			}
			if !slices.Contains(p.Write, proj) || !slices.Contains(p.Write, tmp) {
				t.Errorf("write %v lacks the project or the temporary directory", p.Write)
			}
		})
	}
}

func TestRefusal(t *testing.T) {
	p := Plan{Write: []string{"/w"}, Denied: []Denial{{Path: "/h/.ssh", Rule: "~/.ssh"}}}
	for _, tc := range []struct {
		path  string
		write bool
		want  string // "" for allowed
	}{
		{"/h/.ssh/id_rsa", false, "read of /h/.ssh/id_rsa denied: it is under /h/.ssh, denied by the rule \"~/.ssh\""},
		{"/h/.ssh", false, "allow it with --read /h/.ssh"},
		{"/h/.bashrc", false, ""},
		{"/w/f", true, ""},
		{"/h/x", true, "write to /h/x denied: not under a --write path"},
		{"/h/x", true, "allow it with --write /"}, // /h does not exist (TestWriteHint)
		{"/h/.ssh/k", true, "access to /h/.ssh/k denied"},
	} {
		got := p.Refusal(tc.path, tc.write)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("Refusal(%s, write=%v) = %q, want %q", tc.path, tc.write, got, tc.want)
		}
	}
}

func TestBuildPlanMasksSockets(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home, rt := filepath.Join(base, "home"), filepath.Join(base, "run")
	tree(t, home, "agent.sock", ".gnupg/S.gpg-agent", "proj/")
	tree(t, rt, "bus", "systemd/private", "pulse/native")
	tree(t, base, "tmp/")
	env := Env{Home: home, Dir: filepath.Join(home, "proj"), TmpDir: filepath.Join(base, "tmp"), RuntimeDir: rt, AuthSock: filepath.Join(home, "agent.sock")}
	for _, tc := range []struct {
		name  string
		c     Config
		masks []string
	}{
		{"defaults", Config{}, []string{home + "/.gnupg", home + "/agent.sock", rt + "/bus", rt + "/systemd"}},
		{"--read re-allows the agent", Config{Read: []string{home + "/agent.sock"}}, []string{home + "/.gnupg", rt + "/bus", rt + "/systemd"}},
		{"--no-default-deny", Config{NoDefaultDeny: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := BuildPlan(tc.c, env)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Masks, tc.masks) {
				t.Errorf("masks %v, want %v", p.Masks, tc.masks)
			}
		})
	}
}

func TestBuildPlanReadOnlyAndRefusedDirs(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	proj := filepath.Join(home, "proj")
	tree(t, home, "proj/.git/hooks/", "proj/.git/config", "proj/.git/HEAD")
	p, err := BuildPlan(Config{}, Env{Home: home, Dir: proj, TmpDir: base})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{proj + "/.git/hooks", proj + "/.git/config"}; !slices.Equal(p.ReadOnly, want) {
		t.Errorf("read-only %v, want %v", p.ReadOnly, want)
	}
	if why := p.Refusal(proj+"/.git/hooks/pre-commit", true); !strings.Contains(why, "kept read-only") {
		t.Errorf("a hook write is explained as %q", why)
	}
	if why := p.Refusal(proj+"/.git/HEAD", true); why != "" {
		t.Errorf("a write of .git/HEAD is refused: %q", why)
	}
	for _, dir := range []string{"/", home} {
		if _, err := BuildPlan(Config{}, Env{Home: home, Dir: dir}); err == nil || !strings.Contains(err.Error(), "project directory") {
			t.Errorf("working directory %s: %v, want a refusal", dir, err)
		}
	}
}

func TestWriteHint(t *testing.T) {
	home, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tree(t, home, ".cache/go-build/18/", ".config/go/telemetry/", ".bashrc", "notes/")
	p := Plan{Home: home}
	for path, want := range map[string]string{
		home + "/.cache/go-build/18/abc": home + "/.cache/go-build",
		home + "/.config/go/telemetry/x": home + "/.config/go",
		home + "/.bashrc":                home + "/.bashrc",
		home + "/new-file":               home, // --write takes existing paths
		home + "/notes/todo.txt":         home + "/notes",
		home + "/.cache/new-tool/a/b":    home + "/.cache",
		"/var/lib/agentbox-none/x/y":     "/var/lib",
	} {
		if got := p.WriteHint(path); got != want {
			t.Errorf("WriteHint(%s) = %s, want %s", path, got, want)
		}
	}
}
