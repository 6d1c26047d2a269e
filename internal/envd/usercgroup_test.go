package envd

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestFindUserCgroup(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		want  userCgroup
	}{
		{"none", []string{"pids/tasks", "memory/tasks"}, userCgroup{}},
		{"v1", []string{"pids/user/tasks", "memory/user/tasks", "cpu/user/tasks", "blkio/user/tasks"}, userCgroup{tasks: []string{"pids/user/tasks", "memory/user/tasks", "cpu/user/tasks"}}},
		{"v1 pids only", []string{"pids/user/tasks"}, userCgroup{tasks: []string{"pids/user/tasks"}}},
		{"v2", []string{"cgroup.controllers", "user/cgroup.procs"}, userCgroup{v2: "user"}},
		{"v2 without one", []string{"cgroup.controllers", "cgroup.procs"}, userCgroup{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range c.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got := findUserCgroup(root)
			want := c.want
			if want.v2 != "" {
				want.v2 = filepath.Join(root, want.v2)
			}
			for i := range want.tasks {
				want.tasks[i] = filepath.Join(root, want.tasks[i])
			}
			if got.v2 != want.v2 || !slices.Equal(got.tasks, want.tasks) {
				t.Errorf("findUserCgroup = %+v; want %+v", got, want)
			}
		})
	}
}

func TestCredArg(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // credArg of the parse; "" for an error
	}{
		{"1000:1000:", "1000:1000:"},
		{"1000:1000", "1000:1000:"},
		{"1000:100:27,100", "1000:100:27,100"},
		{"x:1", ""},
		{"1000", ""},
		{"1:2:a", ""},
	} {
		got, err := parseCred(c.in)
		if c.want == "" {
			if err == nil {
				t.Errorf("parseCred(%q) = %+v; want an error", c.in, got)
			}
			continue
		}
		if err != nil || credArg(got) != c.want {
			t.Errorf("parseCred(%q) = %+v, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func TestUserCgroupFull(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v2       bool
		cur, max string
		want     bool
	}{
		{"v1 room left", false, "100", "3584", false},
		{"v1 at the limit", false, "3584", "3584", true},
		{"v1 within the margin", false, "3570", "3584", true},
		{"v1 no limit", false, "100", "max", false},
		{"v2 at the limit", true, "512", "512", true},
		{"v2 room left", true, "12", "512", false},
		{"no user cgroup", false, "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "pids", "user")
			if tc.v2 {
				if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				dir = filepath.Join(root, "user")
			}
			if tc.max != "" {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				for name, v := range map[string]string{"pids.current": tc.cur, "pids.max": tc.max} {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := userCgroupFull(root); got != tc.want {
				t.Errorf("userCgroupFull = %v, want %v", got, tc.want)
			}
		})
	}
}
