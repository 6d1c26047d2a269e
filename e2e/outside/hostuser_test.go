package outside

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestHostUserAttacks: an unprivileged user of the server host (nobody,
// no groups) tries to read the server's state: the database holds every
// team's key hashes and sandbox tokens, the apikey file a working key.
func TestHostUserAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// asNobody runs argv as nobody: nil when refused with EACCES/EPERM,
	// crossed when it succeeded, an error when it failed otherwise.
	asNobody := func(what string, argv ...string) error {
		out, err := harness.AsNobody(ctx, argv[0], argv[1:]...).CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return crossed("%s: %s", what, firstLine(string(out)))
		case errors.As(err, &ee) && refused(string(out)):
			return nil
		default:
			return fmt.Errorf("%s: %v: %s", what, err, out)
		}
	}
	// exists makes sure a refusal means something: the target is there.
	exists := func(p string) error {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("target missing, the attack would prove nothing: %w", err)
		}
		return nil
	}
	file := func(name string) attack {
		p := filepath.Join(s.DataDir, name)
		return attack{side: sideHostUser, name: "nobody reads <data-dir>/" + name, run: func(t *testing.T) error {
			if err := exists(p); err != nil {
				return err
			}
			return asNobody("read "+p, "head", "-c", "64", p)
		}}
	}
	runAttacks(t, []attack{
		{side: sideHostUser, name: "nobody lists the data dir", run: func(t *testing.T) error {
			if err := exists(s.DataDir); err != nil {
				return err
			}
			return asNobody("list "+s.DataDir, "ls", "-A", s.DataDir)
		}},
		file("apikey"),
		file("agentbox.db"),
		{side: sideHostUser, name: "nobody runs `agentbox apikey create` on the data dir", run: func(t *testing.T) error {
			return asNobody("mint a key", s.Bin, "apikey", "create", "--data-dir", s.DataDir, "--team", "nobody")
		}},
	})
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// refused reports whether a command's output says the kernel refused it.
func refused(out string) bool {
	out = strings.ToLower(out)
	return strings.Contains(out, "permission denied") || strings.Contains(out, "operation not permitted") ||
		strings.Contains(out, "readonly database") // SQLite opened the file but may not write it
}

// TestHostUserObjects: with one object of every kind the server writes on
// disk (a running sandbox, a paused one, a snapshot, a sandbox restored
// from it, a fork, a volume with a file, a built template, an unused
// upload), nobody (an unprivileged host user) tries to read or list any
// path under the data dir and the template store, and looks for each
// object's id where every host user can read: /proc/*/mountinfo (overlay
// options, bind sources), /proc/*/cmdline (runc, runsc, criu, qemu
// arguments), cgroup names and the names under /run, /tmp and /dev/shm.
func TestHostUserObjects(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	do := func(what, method, path string, body any, want int) []byte {
		t.Helper()
		st, b, err := s.Do(ctx, s.APIKey, method, path, body)
		if err != nil || st != want {
			t.Fatalf("%s: %d %s %v", what, st, b, err)
		}
		return b
	}
	sandbox := func(what string, body map[string]any) string {
		t.Helper()
		id := jsonField(t, do(what, http.MethodPost, "/v2/sandboxes", body, http.StatusCreated), "sandboxID")
		t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
		return id
	}
	volName := "hostuser-" + strings.ToLower(rand.Text()[:8])
	vb := do("create a volume", http.MethodPost, "/volumes", map[string]any{"name": volName, "sizeMB": 64}, http.StatusCreated)
	volID, volTok := jsonField(t, vb, "volumeID"), jsonField(t, vb, "token")
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/volumes/"+volID, nil) })
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s.URL+"/volumecontent/"+volID+"/file?path=/note.txt&mode=420", strings.NewReader("volume file"))
	req.Header.Set("Authorization", "Bearer "+volTok)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("write a file in the volume: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	running := sandbox("create a sandbox", map[string]any{"templateID": "base", "timeout": 900,
		"volumeMounts": []map[string]any{{"name": volName, "path": "/w"}}})
	paused := sandbox("create a sandbox to pause", map[string]any{"templateID": "base", "timeout": 900})
	do("pause it", http.MethodPost, "/sandboxes/"+paused+"/pause", nil, http.StatusNoContent)
	snapID, _, _ := strings.Cut(jsonField(t, do("snapshot the running one", http.MethodPost, "/sandboxes/"+running+"/snapshots", map[string]any{}, http.StatusCreated), "snapshotID"), ":")
	restored := sandbox("restore the snapshot", map[string]any{"templateID": snapID, "timeout": 900})
	var forks []struct {
		Sandbox *struct{ SandboxID string }
	}
	if err := json.Unmarshal(do("fork the running one", http.MethodPost, "/sandboxes/"+running+"/fork", map[string]any{}, http.StatusCreated), &forks); err != nil || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork: %v %+v", err, forks)
	}
	fork := forks[0].Sandbox.SandboxID
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+fork, nil) })

	tb, err := requestBuild(ctx, t, s, s.APIKey, "hostuser-"+strings.ToLower(rand.Text()[:6])+":v1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/templates/"+tb.templateID, nil)
	})
	if res, err := tb.run("base", []map[string]any{{"type": "RUN", "args": []string{"echo built > \"$HOME/built\""}}}); err != nil || res != "ready" {
		t.Fatalf("build a template: %s %v", res, err)
	}
	// An upload no build used (yet): it stays in the upload store.
	upHash := strings.Repeat("b8", 32)
	if st, b, err := tb.upload(upHash, tarOf(tar.Header{Name: "up.txt", Typeflag: tar.TypeReg, Mode: 0o644}), false); err != nil || st != http.StatusOK {
		t.Fatalf("upload: %d %s %v", st, b, err)
	}

	// Every snapshot on disk, the fork's hidden one included, by its record.
	snaps := []string{snapID}
	metas, _ := filepath.Glob(filepath.Join(s.DataDir, "snapshots", "*", "snapshot.json"))
	for _, m := range metas {
		var rec struct{ ID string }
		if b, err := os.ReadFile(m); err == nil && json.Unmarshal(b, &rec) == nil && rec.ID != snapID {
			snaps = append(snaps, rec.ID)
		}
	}
	if len(snaps) < 2 {
		t.Fatalf("the fork left no snapshot on disk (found %v): the rows would prove less", snaps)
	}

	// Every path under the roots (mount points, not what is mounted there).
	var paths []string
	for _, root := range []string{s.DataDir, s.TemplateDir} {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			paths = append(paths, p)
			if d.IsDir() && p != root && isMountPoint(p) {
				return fs.SkipDir
			}
			return nil
		})
	}
	nobody := func(script, stdin string, env ...string) (string, error) {
		cmd := harness.NobodyShell(ctx, script)
		cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		return string(out), err
	}
	// seen lists where nobody finds id.
	seen := func(id string) (string, error) {
		pat := patternFile(t, id)
		return nobody(`for p in /proc/[0-9]*; do
	for f in mountinfo cmdline cgroup; do
		grep -qsaF -f "$PAT" "$p/$f" 2>/dev/null && echo "$p/$f ($(tr '\0' ' ' < $p/cmdline 2>/dev/null | cut -c1-60))"
	done
done
ID=$(cat "$PAT")
find /run /tmp /dev/shm /sys/fs/cgroup "$D" "$T" -name "*$ID*" 2>/dev/null | sed 's/$/ (a name)/'
true`, "", "PAT="+pat, "D="+s.DataDir, "T="+s.TemplateDir)
	}
	hidden := func(kind string, ids ...string) attack {
		return attack{side: sideHostUser, name: "nobody finds the id of " + kind + " in mountinfo, cmdlines, cgroup or file names", run: func(t *testing.T) error {
			for _, id := range ids {
				if id == "" {
					return fmt.Errorf("no id for %s", kind)
				}
				found, err := seen(id)
				if err != nil {
					return fmt.Errorf("nobody's search: %v: %s", err, found)
				}
				if found = strings.TrimSpace(found); found != "" {
					lines := strings.Split(found, "\n")
					return crossed("%s %s: %s", kind, id, strings.Join(first(lines, 3), "; "))
				}
			}
			return nil
		}}
	}
	runAttacks(t, []attack{
		{side: sideHostUser, name: "nobody reads or lists a path of any object under the data dir and template store", run: func(t *testing.T) error {
			if len(paths) < 50 {
				return fmt.Errorf("only %d paths under the roots: the attack would prove nothing", len(paths))
			}
			out, err := nobody(`while IFS= read -r p; do
	if [ -d "$p" ]; then [ -r "$p" ] && echo "list $p"; elif [ -r "$p" ]; then echo "read $p"; fi
	[ -w "$p" ] && echo "write $p"
done
true`, strings.Join(paths, "\n")+"\n")
			if err != nil {
				return fmt.Errorf("nobody's walk: %v: %s", err, out)
			}
			var got []string
			for line := range strings.Lines(out) {
				if l := strings.TrimSpace(line); l != "" && !isPublic(s.DataDir, l[strings.IndexByte(l, ' ')+1:]) {
					got = append(got, l)
				}
			}
			if len(got) > 0 {
				t.Logf("open to nobody:\n%s", strings.Join(first(got, 40), "\n"))
				return crossed("%d of %d paths: %s", len(got), len(paths), strings.Join(first(got, 4), ", "))
			}
			return nil
		}},
		{side: sideHostUser, name: "nobody lists the server's mounts named in its mountinfo (rootfs, idmapped layers, volumes)", run: func(t *testing.T) error {
			// The server's mount points (it mounts in the host's mount
			// namespace, which nobody reads too).
			b, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				return err
			}
			var points []string
			for line := range strings.Lines(string(b)) {
				f := strings.Fields(line)
				if len(f) > 4 && (strings.HasPrefix(f[4], s.DataDir) || strings.HasPrefix(f[4], s.TemplateDir) || strings.HasPrefix(f[4], "/run/"+s.Instance+"/")) {
					points = append(points, f[4])
				}
			}
			if len(points) < 4 {
				return fmt.Errorf("only %d server mounts: the attack would prove nothing", len(points))
			}
			// Directories: a netns pin (a file) only names a namespace
			// nobody cannot enter.
			out, err := nobody(`while IFS= read -r p; do [ -d "$p" ] && ls -A "$p" >/dev/null 2>&1 && echo "$p"; done; true`, strings.Join(points, "\n")+"\n")
			if err != nil {
				return fmt.Errorf("nobody: %v: %s", err, out)
			}
			var got []string
			for line := range strings.Lines(out) {
				if l := strings.TrimSpace(line); l != "" && !isPublic(s.DataDir, l) {
					got = append(got, l)
				}
			}
			if len(got) > 0 {
				return crossed("%d of %d mounts listable: %s", len(got), len(points), strings.Join(first(got, 4), ", "))
			}
			return nil
		}},
		hidden("snapshots (the restored one's and the fork's)", snaps...),
		hidden("the running sandbox", running),
		hidden("the paused sandbox", paused),
		hidden("the restored sandbox", restored),
		hidden("the fork", fork),
		hidden("the volume", volID),
		hidden("the built template and its build", tb.templateID, tb.buildID),
	})
	// Closed to others, the paused sandbox's bundle still resumes.
	do("resume the paused sandbox", http.MethodPost, "/sandboxes/"+paused+"/resume", map[string]any{"timeout": 300}, http.StatusCreated)
}
