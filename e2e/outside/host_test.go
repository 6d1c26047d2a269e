package outside

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// TestHostUserFiles: with a sandbox running and a snapshot taken, nobody
// (an unprivileged host user) walks the data dir and the template store
// (listing what it can), tries every server file by its well-known name,
// and searches the world-readable places of the host (/proc/*/cmdline,
// environ and cgroup, /tmp, /run, /var/tmp, /dev/shm, /sys/fs/cgroup names)
// for the API key, the sandbox id and its envd token.
func TestHostUserFiles(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create a sandbox: %d %s %v", st, b, err)
	}
	id, token := jsonField(t, b, "sandboxID"), jsonField(t, b, "envdAccessToken")
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), s.APIKey, http.MethodDelete, "/sandboxes/"+id, nil) })
	if token == "" {
		t.Fatalf("create answered no envdAccessToken: %s", b)
	}
	// A snapshot puts layers and a memory image in the snapshot store.
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+id+"/snapshots", map[string]any{}); err != nil || st/100 != 2 {
		t.Logf("snapshot (the snapshot store stays empty): %d %s %v", st, b, err)
	}
	// nobody runs script as nobody with env (and stdin, if any).
	nobody := func(script, stdin string, env ...string) (string, error) {
		cmd := harness.NobodyShell(ctx, script)
		cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		return string(out), err
	}
	roots := []string{s.DataDir, s.TemplateDir}

	runAttacks(t, []attack{
		{side: sideHostUser, name: "nobody walks the data dir and template store", run: func(t *testing.T) error {
			// find descends wherever nobody may list; print what it may
			// read or write. The envd binary is public.
			out, _ := nobody(`find "$D" "$T" -xdev \( -readable -o -writable \) -print 2>/dev/null`, "", "D="+s.DataDir, "T="+s.TemplateDir)
			var got []string
			for line := range strings.Lines(out) {
				p := strings.TrimSpace(line)
				if p == "" || isPublic(s.DataDir, p) {
					continue
				}
				got = append(got, p)
			}
			if len(got) > 0 {
				return crossed("%d paths readable or writable: %s", len(got), strings.Join(first(got, 5), ", "))
			}
			return nil
		}},
		{side: sideHostUser, name: "nobody opens every server file by its name", run: func(t *testing.T) error {
			// Everything down to two levels below each root, by name
			// (a 0711 directory hides names, not files whose names are
			// well known): the database and its WAL and -shm, apikey,
			// template metadata, layers, snapshots. Sandbox bundles are
			// named by unguessable ids and walked above.
			var paths []string
			for _, root := range roots {
				paths = append(paths, namedPaths(t, root, s.DataDir)...)
			}
			if len(paths) < 5 {
				return fmt.Errorf("only %d server files found under %v: the attack would prove nothing", len(paths), roots)
			}
			out, err := nobody(`while IFS= read -r p; do
	if [ -d "$p" ]; then [ -r "$p" ] && echo "list $p"; elif [ -r "$p" ] && head -c1 "$p" >/dev/null 2>&1; then echo "read $p"; fi
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
				return crossed("of %d server files: %s", len(paths), strings.Join(first(got, 5), ", "))
			}
			return nil
		}},
		{side: sideHostUser, name: "nobody searches /proc, /tmp, /run, /var/tmp, /dev/shm and cgroup names for the key, a sandbox id or token", run: func(t *testing.T) error {
			// The secrets go to nobody in a file of its own (not in its
			// environment or command lines, where the search would find
			// itself), in a directory the search skips; the sandbox id is
			// its second line, read into an unexported variable.
			pat := patternFile(t, s.APIKey, id, token)
			out, err := nobody(`ID=$(sed -n 2p "$PAT")
for p in /proc/[0-9]*; do
	for f in cmdline environ cgroup; do
		grep -qsaF -f "$PAT" "$p/$f" 2>/dev/null && echo "$p/$f ($(tr '\0' ' ' < $p/cmdline 2>/dev/null | cut -c1-60))"
	done
done
find /tmp /run /var/tmp /dev/shm -xdev -path "$(dirname "$PAT")" -prune -o -type f -readable -size -4M -print0 2>/dev/null | xargs -0 -r grep -lsaF -f "$PAT" 2>/dev/null
find /tmp /run /var/tmp /dev/shm -xdev -name "*$ID*" 2>/dev/null | sed 's/$/ (named after the sandbox)/'
find /sys/fs/cgroup -name "*$ID*" 2>/dev/null | sed 's/$/ (named after the sandbox)/'
true`, "", "PAT="+pat)
			if err != nil {
				return fmt.Errorf("nobody's search: %v: %s", err, out)
			}
			if out = strings.TrimSpace(out); out != "" {
				lines := strings.Split(out, "\n")
				t.Logf("found by nobody:\n%s", out)
				return crossed("%d places: %s", len(lines), strings.Join(first(lines, 4), "; "))
			}
			return nil
		}},
	})
}

// isPublic reports whether p may be readable by everyone: the pinned envd
// binary (bind-mounted into every sandbox; no secret).
func isPublic(dataDir, p string) bool {
	return filepath.Dir(p) == filepath.Join(dataDir, "envd") && !strings.HasPrefix(filepath.Base(p), ".")
}

// namedPaths lists root and everything up to two levels below it, except
// sandbox bundles and what is mounted below root.
func namedPaths(t *testing.T, root, dataDir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished meanwhile
		}
		rel, _ := filepath.Rel(root, p)
		depth := strings.Count(rel, string(filepath.Separator)) + 1
		if rel == "." {
			depth = 0
		}
		if p == filepath.Join(dataDir, "sandboxes") || isMountPoint(p) && p != root {
			out = append(out, p)
			return fs.SkipDir
		}
		out = append(out, p)
		if d.IsDir() && depth >= 2 {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func isMountPoint(p string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == p {
			return true
		}
	}
	return false
}

// patternFile writes the secrets, one a line, to a file only nobody may
// read, in a directory of its own under /tmp.
func patternFile(t *testing.T, secrets ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "outside-secrets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "patterns")
	if err := os.WriteFile(p, []byte(strings.Join(secrets, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const nobodyUID, nogroupGID = 65534, 65534
	for _, f := range []string{dir, p} {
		if err := os.Chown(f, nobodyUID, nogroupGID); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("… %d more", len(s)-n))
	}
	return s
}
