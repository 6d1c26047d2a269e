package outside

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// TestVolumeAttacks attacks team A's volume: another team through every
// volume route, with its own volume's token, A's API key and forged
// tokens on the content API; a host user through the volume's host files;
// and code that escaped team B's sandbox, as its host root, through A's
// sandbox's mount of the volume and the server's own.
func TestVolumeAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	secret := "volsecret-" + rand.Text()
	name := "outside-" + strings.ToLower(rand.Text()[:8])
	mkVolume := func(key, name string) (id, token string) {
		st, b, err := s.Do(ctx, key, http.MethodPost, "/volumes", map[string]any{"name": name, "sizeMB": 64})
		if err != nil || st != http.StatusCreated {
			t.Fatalf("create volume %s: %d %s %v", name, st, b, err)
		}
		id, token = jsonField(t, b, "volumeID"), jsonField(t, b, "token")
		t.Cleanup(func() { _, _, _ = s.Do(context.Background(), key, http.MethodDelete, "/volumes/"+id, nil) })
		return id, token
	}
	volA, tokA := mkVolume(s.APIKey, name)
	volB, tokB := mkVolume(s.OtherKey, "theirs-"+name)
	// content calls the content API with an Authorization header value.
	content := func(method, vol, route, query, auth string, body []byte) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, s.URL+"/volumecontent/"+vol+"/"+route+"?"+query, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	if st, b, err := content("PUT", volA, "file", "path=/secret.txt&mode=420", "Bearer "+tokA, []byte(secret)); err != nil || st != 201 {
		t.Fatalf("team A writes its volume: %d %s %v", st, b, err)
	}
	// intact checks, as team A, that the volume and its file survived.
	intact := func() error {
		st, b, err := content("GET", volA, "file", "path=/secret.txt", "Bearer "+tokA, nil)
		if err != nil {
			return err
		}
		if st != 200 || string(b) != secret {
			return crossed("team A's file after the attack: %d %.80s", st, b)
		}
		return nil
	}

	// Team A's sandbox mounts the volume; team B's sandbox mounts its own.
	c := wire.New(s.URL, s.APIKey)
	sbA, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"e2e": "volume-a"},
		VolumeMounts: []wire.VolumeMount{{Name: name, Path: "/workspace"}}})
	if err != nil {
		t.Fatalf("team A's sandbox: %v", err)
	}
	t.Cleanup(func() { _ = c.Kill(context.Background(), sbA.SandboxID) })
	cb := wire.New(s.URL, s.OtherKey)
	sbB, err := cb.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"e2e": "volume-b"},
		VolumeMounts: []wire.VolumeMount{{Name: "theirs-" + name, Path: "/workspace"}}})
	if err != nil {
		t.Fatalf("team B's sandbox: %v", err)
	}
	t.Cleanup(func() { _ = cb.Kill(context.Background(), sbB.SandboxID) })

	const unknown = "00000000-0000-4000-8000-000000000000"
	// sameAsMissing answers the route for A's volume and for an unknown one
	// as team B, and wants the same 4xx for both.
	sameAsMissing := func(method, path string, body any) error {
		st, b, err := s.Do(ctx, s.OtherKey, method, fmt.Sprintf(path, volA), body)
		if err != nil {
			return err
		}
		ust, ub, err := s.Do(ctx, s.OtherKey, method, fmt.Sprintf(path, unknown), body)
		if err != nil {
			return err
		}
		if st/100 == 2 || st != ust || !bytes.Equal(bytes.ReplaceAll(b, []byte(volA), []byte(unknown)), ub) {
			return crossed("answered %d %.100s; an unknown volume answers %d %.100s", st, b, ust, ub)
		}
		return intact()
	}
	futureExp := strconv.FormatInt(time.Now().Add(1000*time.Hour).Unix(), 10)
	parts := strings.Split(tokA, ".") // vol1.<expiry>.<mac>
	tokenRows := []struct{ name, auth string }{
		{"team B's volume's token", "Bearer " + tokB},
		{"team A's API key as the token", "Bearer " + s.APIKey},
		{"team B's API key as the token", "Bearer " + s.OtherKey},
		{"a forged token", "Bearer vol1." + futureExp + "." + strings.Repeat("ab", 32)},
		{"team A's token with a later expiry", "Bearer " + parts[0] + "." + futureExp + "." + parts[2]},
		{"no token, API key header", ""},
	}
	var attacks []attack
	attacks = append(attacks,
		attack{side: sideTenant, name: "other team GET /volumes/{id}", run: func(t *testing.T) error { return sameAsMissing("GET", "/volumes/%s", nil) }},
		attack{side: sideTenant, name: "other team DELETE /volumes/{id}", run: func(t *testing.T) error { return sameAsMissing("DELETE", "/volumes/%s", nil) }},
		attack{side: sideTenant, name: "other team lists team A's volume", run: func(t *testing.T) error {
			st, b, err := s.Do(ctx, s.OtherKey, http.MethodGet, "/volumes", nil)
			if err != nil || st != 200 {
				return fmt.Errorf("list: %d %s %v", st, b, err)
			}
			if bytes.Contains(b, []byte(volA)) || bytes.Contains(b, []byte(`"`+name+`"`)) {
				return crossed("team B's list shows team A's volume: %.160s", b)
			}
			return nil
		}},
		attack{side: sideTenant, name: "other team mounts team A's volume by name", run: func(t *testing.T) error {
			sb, err := cb.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 60, VolumeMounts: []wire.VolumeMount{{Name: name, Path: "/w"}}})
			if err == nil {
				_ = cb.Kill(context.Background(), sb.SandboxID)
				return crossed("team B's sandbox %s mounted team A's volume", sb.SandboxID)
			}
			_, errMissing := cb.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 60, VolumeMounts: []wire.VolumeMount{{Name: "missing-" + name, Path: "/w"}}})
			if !wire.IsStatus(err, 400) || !wire.IsStatus(errMissing, 400) || !strings.Contains(err.Error(), "not found") {
				return fmt.Errorf("unexpected answers: %v / %v", err, errMissing)
			}
			return intact()
		}},
		attack{side: sideTenant, name: "other team takes team A's volume name", run: func(t *testing.T) error {
			id, tok := mkVolume(s.OtherKey, name)
			if id == volA {
				return crossed("team B got team A's volume id")
			}
			if st, b, _ := content("GET", id, "file", "path=/secret.txt", "Bearer "+tok, nil); st == 200 || bytes.Contains(b, []byte(secret)) {
				return crossed("team B's volume of the same name holds team A's file: %d", st)
			}
			return intact()
		}},
		attack{side: sideTenant, name: "content API path with ../ leaves the volume", run: func(t *testing.T) error {
			for _, q := range []string{"path=/../../../../../../etc/passwd", "path=..%2f..%2f..%2fetc%2fpasswd", "path=/./../../etc/shadow"} {
				st, b, err := content("GET", volA, "file", q, "Bearer "+tokA, nil)
				if err != nil {
					return err
				}
				if st == 200 || bytes.Contains(b, []byte("root:")) {
					return crossed("%s: %d %.80s", q, st, b)
				}
			}
			return nil
		}},
	)
	for i, tr := range tokenRows {
		// Each row from a loopback address of its own: wrong tokens count
		// against their client (20 in a row, then 429), and these rows
		// test the token check, not that limit.
		hc := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+i))}}).DialContext}}
		attacks = append(attacks, attack{side: sideTenant, name: "volume content API with " + tr.name, run: func(t *testing.T) error {
			for _, r := range []struct{ method, route, query string }{
				{"GET", "file", "path=/secret.txt"}, {"PUT", "file", "path=/secret.txt&force=true"}, {"GET", "dir", "path=/"},
				{"GET", "path", "path=/secret.txt"}, {"PATCH", "path", "path=/secret.txt"}, {"DELETE", "path", "path=/secret.txt"},
				{"POST", "dir", "path=/pwned"},
			} {
				body := []byte("pwned")
				if r.method == "PATCH" {
					body = []byte(`{"mode":511}`)
				}
				req, _ := http.NewRequestWithContext(ctx, r.method, s.URL+"/volumecontent/"+volA+"/"+r.route+"?"+r.query, bytes.NewReader(body))
				if tr.auth != "" {
					req.Header.Set("Authorization", tr.auth)
				} else {
					req.Header.Set("X-API-Key", s.APIKey)
				}
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 {
					return crossed("%s %s: %d %.100s", r.method, r.route, resp.StatusCode, b)
				}
			}
			return intact()
		}})
	}

	// The host side.
	k, err := hostkey.Read(filepath.Join(s.DataDir, "volumes", ".key-secret"))
	if err != nil {
		t.Fatal(err)
	}
	volDir := filepath.Join(s.DataDir, "volumes", k.Key(volA))
	stateDir := filepath.Join(s.DataDir, "sandboxes")
	bundleOf := func(id string) string {
		key, err := bundle.HostKey(stateDir, id)
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(stateDir, key)
	}
	bundleA, bundleB := bundleOf(sbA.SandboxID), bundleOf(sbB.SandboxID)
	rootB := mappedRoot(t, bundleB)
	targets := map[string]string{
		"the volume's image":                     filepath.Join(volDir, "disk.img"),
		"the server's mount of the volume":       filepath.Join(volDir, "mnt", "secret.txt"),
		"team A's sandbox's mount of the volume": filepath.Join(bundleA, "volumes", "0", "secret.txt"),
	}
	for what, p := range targets {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("target %s (%s) missing; the attacks would prove nothing: %v", what, p, err)
		}
		attacks = append(attacks,
			attack{side: sideHostUser, name: "nobody reads " + what, run: func(t *testing.T) error {
				out, err := harness.AsNobody(ctx, "head", "-c", "64", p).CombinedOutput()
				if err == nil {
					return crossed("read %s: %s", p, oneLine(string(out)))
				}
				if !refused(string(out)) {
					return fmt.Errorf("head: %v: %s", err, out)
				}
				return nil
			}},
			attack{side: sideNeighbour, name: "team B's sandbox's host root reads " + what, run: func(t *testing.T) error {
				cmd := exec.CommandContext(ctx, "setpriv", "--reuid="+strconv.Itoa(rootB), "--regid="+strconv.Itoa(rootB), "--clear-groups", "--", "head", "-c", "64", p)
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				switch {
				case err == nil:
					return crossed("read %s: %s", p, oneLine(string(out)))
				case errors.As(err, &ee) && refused(string(out)):
					return nil
				default:
					return fmt.Errorf("head: %v: %s", err, out)
				}
			}},
		)
	}
	attacks = append(attacks, attack{side: sideHostUser, name: "nobody finds a volume id or name on the host", run: func(t *testing.T) error {
		script := "cat /proc/self/mountinfo /sys/block/loop*/loop/backing_file 2>/dev/null; ls -R " + s.DataDir + " 2>/dev/null; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; true"
		out, err := harness.NobodyShell(ctx, script).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, v := range []string{volA, volB, name} {
			if i := strings.Index(string(out), v); i >= 0 {
				return crossed("found %s: %s", v, oneLine(string(out[max(0, i-60):min(len(out), i+60)])))
			}
		}
		return nil
	}})
	// From inside team A's sandbox, as root.
	inA := func(cmd string) error {
		r, err := c.Run(ctx, sbA, "root", cmd)
		if err != nil {
			return err
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("%s: exit %d: %s", cmd, r.ExitCode, r.Stderr)
		}
		return nil
	}
	if err := inA(`cd /workspace && ln -s /etc/shadow abs && ln -s ../../../../../../../etc/shadow rel && ln -s / root && ln -s .. up`); err != nil {
		t.Fatal(err)
	}
	attacks = append(attacks,
		attack{side: sideSandboxVolume, name: "content API reads the host through the sandbox's symlinks", run: func(t *testing.T) error {
			for _, p := range []string{"abs", "rel", "root/etc/shadow", "up/etc/shadow", "up/up/up/etc/passwd"} {
				st, b, err := content("GET", volA, "file", "path=/"+p, "Bearer "+tokA, nil)
				if err != nil {
					return err
				}
				if st == 200 || bytes.Contains(b, []byte("root:")) {
					return crossed("%s: %d %.80s", p, st, b)
				}
			}
			if st, b, _ := content("GET", volA, "dir", "path=/root&depth=2", "Bearer "+tokA, nil); st == 200 {
				return crossed("listed the host's / through a symlink: %.120s", b)
			}
			return nil
		}},
		attack{side: sideSandboxVolume, name: "content API writes the host through the sandbox's symlinks", run: func(t *testing.T) error {
			marker := "/tmp/agentbox-volume-" + rand.Text()[:8]
			before, err := os.Stat("/etc/shadow")
			if err != nil {
				return err
			}
			for _, q := range []string{"path=/root" + marker, "path=/up/up/up" + marker, "path=/root/tmp&force=true"} {
				_, _, _ = content("PUT", volA, "file", q, "Bearer "+tokA, []byte("pwned"))
				_, _, _ = content("POST", volA, "dir", q+"-dir&force=true", "Bearer "+tokA, nil)
			}
			_, _, _ = content("PATCH", volA, "path", "path=/abs", "Bearer "+tokA, []byte(`{"mode":511}`))
			_, _, _ = content("DELETE", volA, "path", "path=/root/etc/hostname", "Bearer "+tokA, nil)
			for _, p := range []string{marker, marker + "-dir"} {
				if _, err := os.Lstat(p); err == nil {
					return crossed("made %s on the host", p)
				}
			}
			if fi, err := os.Stat("/etc/shadow"); err != nil || fi.Mode() != before.Mode() {
				return crossed("/etc/shadow's mode went from %v to %v (%v)", before.Mode(), fi.Mode(), err)
			}
			if _, err := os.Stat("/etc/hostname"); err != nil {
				return crossed("/etc/hostname is gone: %v", err)
			}
			return nil
		}},
		attack{side: sideSandboxVolume, name: "sandbox root unmounts or remounts its volume", run: func(t *testing.T) error {
			for _, cmd := range []string{"umount /workspace", "umount -l /workspace", "mount -o remount,suid /workspace", "mount --bind / /workspace",
				"mount --bind /workspace /mnt", "mknod /workspace/loop b 7 0"} {
				if err := inA(cmd); err == nil {
					return crossed("%s succeeded", cmd)
				}
			}
			return nil
		}},
		attack{side: sideSandboxVolume, name: "set-uid root binary in the volume", run: func(t *testing.T) error {
			if err := inA("cp /usr/bin/id /workspace/suid && chmod 4755 /workspace/suid"); err != nil {
				return err
			}
			r, err := c.Run(ctx, sbA, "user", "/workspace/suid -u")
			if err != nil {
				return err
			}
			if strings.TrimSpace(r.Stdout) == "0" {
				return crossed("ran as root")
			}
			return nil
		}},
	)
	runAttacks(t, attacks)
	// The volume mount did what it is for throughout.
	if r, err := c.Run(ctx, sbA, "user", "cat /workspace/secret.txt"); err != nil || r.Stdout != secret {
		t.Fatalf("team A's sandbox reads its volume: %+v %v", r, err)
	}
	var info struct {
		VolumeMounts []wire.VolumeMount `json:"volumeMounts"`
	}
	if st, b, err := s.Do(ctx, s.APIKey, "GET", "/sandboxes/"+sbA.SandboxID, nil); err != nil || st != 200 || json.Unmarshal(b, &info) != nil || len(info.VolumeMounts) != 1 {
		t.Fatalf("team A's sandbox describes its mount: %d %s %v", st, b, err)
	}
}
