package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/diskspace"
)

// TestFullDataDisk fills the server's data disk (a small filesystem of its
// own) to under its reserve: creates, snapshots, pauses, volume creates and
// volume writes are refused with 507 naming the disk and what to free; a
// running sandbox keeps answering and can be killed; once space is freed,
// creates work again.
func TestFullDataDisk(t *testing.T) {
	const reserveMB = 64
	s := harness.Start(t, harness.Name("faults-disk"), harness.DataDiskMB(512), harness.Args("--disk-reserve-mb", "64"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)
	sb := create(ctx, t, s, "container")
	st, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/volumes", map[string]any{"name": "full-disk", "sizeMB": 64})
	if err != nil || st != http.StatusCreated {
		t.Fatalf("create volume: %d %s %v", st, b, err)
	}
	var vol struct{ VolumeID, Token string }
	if err := json.Unmarshal(b, &vol); err != nil {
		t.Fatal(err)
	}

	// Fill the disk to half the reserve: under it, yet with room for the
	// server's own records.
	free, err := diskspace.Free(s.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(s.DataDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(free)-reserveMB/2<<20); err != nil {
		t.Fatalf("fill the data disk: %v", err)
	}
	f.Close()

	volWrite := func() (int, []byte) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, s.URL+"/volumecontent/"+vol.VolumeID+"/file?path=/a.txt", bytes.NewReader([]byte("hello")))
		req.Header.Set("Authorization", "Bearer "+vol.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, op := range []struct {
		name string
		do   func() (int, []byte)
	}{
		{"create", func() (int, []byte) {
			st, b, _ := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes", map[string]any{"templateID": "base", "timeout": 60})
			return st, b
		}},
		{"snapshot", func() (int, []byte) {
			st, b, _ := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{})
			return st, b
		}},
		{"pause", func() (int, []byte) {
			st, b, _ := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil)
			return st, b
		}},
		{"volume create", func() (int, []byte) {
			st, b, _ := s.Do(ctx, s.APIKey, http.MethodPost, "/volumes", map[string]any{"name": "another", "sizeMB": 64})
			return st, b
		}},
		{"volume write", volWrite},
	} {
		st, b := op.do()
		if st != http.StatusInsufficientStorage || !strings.Contains(string(b), "data disk") || !strings.Contains(string(b), "free space") {
			t.Errorf("%s on a full disk: %d %s, want 507 naming the data disk and what to free", op.name, st, b)
		} else {
			t.Logf("%s: %s", op.name, b)
		}
	}

	// What runs keeps running, and the owner can still delete things.
	if r, err := c.Run(ctx, sb, "", "echo still here"); err != nil || !strings.Contains(r.Stdout, "still here") {
		t.Fatalf("a running sandbox on a full disk: %+v %v", r, err)
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("kill on a full disk: %v", err)
	}
	if st, b, err := s.Do(ctx, s.APIKey, http.MethodDelete, "/volumes/"+vol.VolumeID, nil); err != nil || st/100 != 2 {
		t.Fatalf("delete a volume on a full disk: %d %s %v", st, b, err)
	}

	// Space freed: work is admitted again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	again := create(ctx, t, s, "container")
	if r, err := c.Run(ctx, again, "", "echo back"); err != nil || !strings.Contains(r.Stdout, "back") {
		t.Fatalf("a sandbox made after space was freed: %+v %v", r, err)
	}
	if _, err := os.Stat(filepath.Join(s.DataDir, diskspace.ReserveFile)); err != nil {
		t.Errorf("the reserve file is not held again once there is room: %v", err)
	}
	if err := c.Kill(ctx, again.SandboxID); err != nil {
		t.Fatal(err)
	}
}
