package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/hostkey"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
)

// TestJSVolumes runs e2e/js/volumes.mjs: E2B's volume API, volumeMounts on
// both tiers and the volume content API through the official e2b SDK.
func TestJSVolumes(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	jsDir := filepath.Join(s.Root, "e2e", "js")
	harness.NPMInstall(t, jsDir)
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "volumes.mjs")
	cmd.Dir = jsDir
	cmd.Env = s.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test volumes.mjs failed: %v\n%s", err, out)
	}
	t.Logf("node --test volumes.mjs:\n%s", lastLines(string(out), 12))
}

// volume is a volume made for a test, with its content token.
type testVolume struct {
	ID, Name, Token string
}

func createVolume(t *testing.T, s *server, key, name string, sizeMB int) testVolume {
	t.Helper()
	st, b, err := s.Do(context.Background(), key, http.MethodPost, "/volumes", map[string]any{"name": name, "sizeMB": sizeMB})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create volume %s: %d %s %v", name, st, b, err)
	}
	var v struct{ VolumeID, Name, Token string }
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _ = s.Do(context.Background(), key, http.MethodDelete, "/volumes/"+v.VolumeID, nil) })
	return testVolume{ID: v.VolumeID, Name: v.Name, Token: v.Token}
}

// content calls the volume content API with token.
func content(t *testing.T, s *server, method, volID, route, query, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+"/volumecontent/"+volID+"/"+route+"?"+query, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func mustRun(t *testing.T, c *wire.Client, sb *wire.Sandbox, user, cmd string) string {
	t.Helper()
	r, err := c.Run(context.Background(), sb, user, cmd)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s %s", cmd, r.ExitCode, r.Stdout, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// volumeMountsOf lists the host mounts of sandbox id's volumes (under its
// bundle).
func volumeMountsOf(t *testing.T, s *server, id string) []string {
	t.Helper()
	key, err := bundle.HostKey(filepath.Join(s.DataDir, "sandboxes"), id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := harness.MountsUnder(filepath.Join(s.DataDir, "sandboxes", key, "volumes"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestVolumeContainment: a sandbox's root attacks the volume mount and,
// through the files it leaves in the volume, the server's content API; the
// mounts go with the sandbox; a volume survives server restarts (SIGKILL
// and a clean stop, after which the server mounts it again on the
// filesystem the running sandbox holds, so both keep seeing one another's
// writes).
func TestVolumeContainment(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := s.client()
	vol := createVolume(t, s, s.APIKey, "containment", 64)
	for _, tier := range []string{"container", "gvisor"} {
		t.Run(tier, func(t *testing.T) {
			sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600, Metadata: map[string]string{"agentbox.isolation": tier},
				VolumeMounts: []wire.VolumeMount{{Name: vol.Name, Path: "/workspace"}}})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			killed := false
			defer func() {
				if !killed {
					_ = c.Kill(context.Background(), sb.SandboxID)
				}
			}()
			if m := volumeMountsOf(t, s, sb.SandboxID); len(m) != 1 {
				t.Fatalf("host mounts of the sandbox's volume: %v", m)
			}
			// Symlinks out of the volume, left for the server to follow.
			mustRun(t, c, sb, "root", `cd /workspace && rm -rf esc-`+tier+` && mkdir esc-`+tier+` && cd esc-`+tier+` &&
				ln -s /etc/shadow abs && ln -s ../../../../../../../../etc/shadow rel && ln -s / rootdir && ln -s .. up && mkfifo fifo`)
			for _, p := range []string{"abs", "rel", "rootdir/etc/shadow", "up/../etc/shadow", "up/up/etc/shadow"} {
				st, b := content(t, s, "GET", vol.ID, "file", "path=/esc-"+tier+"/"+p, vol.Token, nil)
				if st == 200 || bytes.Contains(b, []byte("root:")) {
					t.Errorf("content API read %s through a sandbox's symlink: %d %.80s", p, st, b)
				}
			}
			if st, b := content(t, s, "GET", vol.ID, "dir", "path=/esc-"+tier+"/rootdir", vol.Token, nil); st != 400 {
				t.Errorf("content API listed / through a symlink: %d %.120s", st, b)
			}
			if st, b := content(t, s, "PUT", vol.ID, "file", "path=/esc-"+tier+"/rootdir/tmp/agentbox-pwned&force=true", vol.Token, []byte("x")); st/100 == 2 {
				t.Errorf("content API wrote through a symlink: %d %s", st, b)
			}
			if _, err := os.Stat("/tmp/agentbox-pwned"); err == nil {
				t.Error("a file appeared in the host's /tmp")
			}
			done := make(chan int, 1)
			go func() {
				st, _ := content(t, s, "GET", vol.ID, "file", "path=/esc-"+tier+"/fifo", vol.Token, nil)
				done <- st
			}()
			select {
			case st := <-done:
				// gVisor keeps a FIFO in its own kernel: the host has none.
				if st != 400 && (tier != "gvisor" || st != 404) {
					t.Errorf("reading a FIFO: %d", st)
				}
			case <-time.After(10 * time.Second):
				t.Error("reading a FIFO the sandbox made hangs the content API")
			}
			// Mount tricks as root inside: none may change the mount.
			for _, attack := range []string{
				"umount /workspace", "umount -l /workspace", "mount -o remount,suid /workspace", "mount --bind /workspace /mnt",
				"mount -t ext4 /dev/loop0 /mnt", "mknod /workspace/dev-" + tier + " b 7 0",
			} {
				if r, err := c.Run(ctx, sb, "root", attack); err == nil && r.ExitCode == 0 {
					t.Errorf("%s succeeded in the sandbox", attack)
				}
			}
			if got := mustRun(t, c, sb, "root", "grep -c ' /workspace ' /proc/self/mountinfo; grep ' /workspace ' /proc/self/mountinfo | grep -o nosuid"); got != "1\nnosuid" {
				t.Errorf("the volume mount after the attacks: %q", got)
			}
			// A set-uid root binary in the volume gives nothing (nosuid).
			mustRun(t, c, sb, "root", "cp /usr/bin/id /workspace/suid-"+tier+" && chmod 4755 /workspace/suid-"+tier)
			if got := mustRun(t, c, sb, "user", "/workspace/suid-"+tier+" -u"); got != "1000" {
				t.Errorf("set-uid binary in the volume ran as uid %s", got)
			}
			if err := c.Kill(ctx, sb.SandboxID); err != nil {
				t.Fatal(err)
			}
			killed = true
			if m := volumeMountsOf(t, s, sb.SandboxID); len(m) != 0 {
				t.Errorf("mounts left after the kill: %v", m)
			}
		})
	}
	// The host's shadow file was never exposed; the volume holds the
	// sandboxes' files.
	if st, b := content(t, s, "GET", vol.ID, "dir", "path=/", vol.Token, nil); st != 200 || !bytes.Contains(b, []byte("esc-gvisor")) {
		t.Fatalf("volume listing: %d %s", st, b)
	}

	t.Run("restart", func(t *testing.T) {
		sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 900, VolumeMounts: []wire.VolumeMount{{Name: vol.Name, Path: "/workspace"}}})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		defer func() { _ = s.client().Kill(context.Background(), sb.SandboxID) }()
		mustRun(t, c, sb, "user", "echo one > /workspace/restart.txt")
		s.Kill9(t)
		s.Launch(t)
		c = s.client()
		mustRun(t, c, sb, "user", "echo two >> /workspace/restart.txt")
		if st, b := content(t, s, "GET", vol.ID, "file", "path=/restart.txt", vol.Token, nil); st != 200 || string(b) != "one\ntwo\n" {
			t.Fatalf("after SIGKILL and start: %d %q", st, b)
		}
		// A clean stop detaches the server's own mount of the volume; the
		// sandbox keeps the filesystem, and the next start mounts that
		// same filesystem again (not a second one over the same image).
		s.Restart(t)
		c = s.client()
		mustRun(t, c, sb, "user", "echo three >> /workspace/restart.txt")
		if st, b := content(t, s, "GET", vol.ID, "file", "path=/restart.txt", vol.Token, nil); st != 200 || string(b) != "one\ntwo\nthree\n" {
			t.Fatalf("after a clean restart: %d %q", st, b)
		}
		if st, _ := content(t, s, "PUT", vol.ID, "file", "path=/from-api.txt", vol.Token, []byte("api")); st != 201 {
			t.Fatalf("write after the restart: %d", st)
		}
		if got := mustRun(t, c, sb, "user", "cat /workspace/from-api.txt"); got != "api" {
			t.Fatalf("the sandbox reads %q of what the API wrote after the restart", got)
		}
		if loops := loopsOf(t, s, vol.ID); len(loops) != 1 {
			t.Fatalf("the volume's image is on %d loop devices: %v", len(loops), loops)
		}
		if err := c.Kill(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
		if m := volumeMountsOf(t, s, sb.SandboxID); len(m) != 0 {
			t.Errorf("mounts left after the kill: %v", m)
		}
	})
}

// loopsOf lists the loop devices backed by volume id's image.
func loopsOf(t *testing.T, s *server, id string) []string {
	t.Helper()
	k, err := hostkey.Read(filepath.Join(s.DataDir, "volumes", ".key-secret"))
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(s.DataDir, "volumes", k.Key(id), "disk.img")
	m, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, p := range m {
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == img {
			out = append(out, p)
		}
	}
	return out
}
