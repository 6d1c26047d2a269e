package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// TestGoSDK drives the same flows as the JS suite through agentbox's Go SDK.
func TestGoSDK(t *testing.T) {
	s := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.APIKey))

	sbx, err := c.Create(ctx, agentbox.CreateOptions{
		Template: "base",
		Timeout:  10 * time.Minute,
		Metadata: map[string]string{"e2e": "gosdk"},
		EnvVars:  map[string]string{"SBX_ENV": "from-create"},
	})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer func() { _ = sbx.Kill(context.Background()) }()

	t.Run("info and list", func(t *testing.T) {
		info, err := sbx.GetInfo(ctx)
		if err != nil || info.SandboxID != sbx.ID || info.State != "running" || info.Metadata["e2e"] != "gosdk" {
			t.Fatalf("GetInfo = %+v, %v", info, err)
		}
		list, err := c.List(ctx, agentbox.ListOptions{Metadata: map[string]string{"e2e": "gosdk"}})
		if err != nil || len(list) != 1 || list[0].SandboxID != sbx.ID {
			t.Fatalf("List = %+v, %v", list, err)
		}
	})

	t.Run("commands", func(t *testing.T) {
		tests := []struct {
			cmd        string
			opts       []agentbox.CommandOption
			wantStdout string
			wantExit   int
		}{
			{cmd: "echo out; echo err >&2", wantStdout: "out\n"},
			{cmd: "echo partial; exit 7", wantStdout: "partial\n", wantExit: 7},
			{cmd: "echo $FOO", opts: []agentbox.CommandOption{agentbox.WithEnvs(map[string]string{"FOO": "bar"})}, wantStdout: "bar\n"},
			{cmd: "echo $SBX_ENV", wantStdout: "from-create\n"},
			{cmd: "pwd", opts: []agentbox.CommandOption{agentbox.WithCwd("/tmp")}, wantStdout: "/tmp\n"},
			{cmd: "whoami", wantStdout: "user\n"},
			{cmd: "whoami", opts: []agentbox.CommandOption{agentbox.WithUser("root")}, wantStdout: "root\n"},
		}
		for _, tt := range tests {
			res, err := sbx.Commands.Run(ctx, tt.cmd, tt.opts...)
			var exitErr *agentbox.CommandExitError
			switch {
			case tt.wantExit == 0 && err != nil:
				t.Errorf("%q: %v", tt.cmd, err)
				continue
			case tt.wantExit != 0 && !errors.As(err, &exitErr):
				t.Errorf("%q: err = %v, want *CommandExitError", tt.cmd, err)
				continue
			case tt.wantExit != 0:
				res = &exitErr.CommandResult
			}
			if res.Stdout != tt.wantStdout || res.ExitCode != tt.wantExit {
				t.Errorf("%q: stdout %q exit %d, want %q exit %d", tt.cmd, res.Stdout, res.ExitCode, tt.wantStdout, tt.wantExit)
			}
		}
	})

	t.Run("background, kill, stdin", func(t *testing.T) {
		h, err := sbx.Commands.Start(ctx, "sleep 600")
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Kill(ctx); err != nil {
			t.Fatalf("kill: %v", err)
		}
		if _, err := h.Wait(ctx); err == nil {
			t.Fatal("killed command reported success")
		}
		h, err = sbx.Commands.Start(ctx, "read line; echo got:$line", agentbox.WithStdin())
		if err != nil {
			t.Fatal(err)
		}
		if err := h.SendStdin(ctx, []byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		res, err := h.Wait(ctx)
		if err != nil || res.Stdout != "got:hello\n" {
			t.Fatalf("stdin: %+v, %v", res, err)
		}
	})

	t.Run("pty", func(t *testing.T) {
		var mu sync.Mutex
		var out bytes.Buffer
		p, err := sbx.PTY.Create(ctx, agentbox.PTYOptions{Cols: 80, Rows: 24, OnData: func(b []byte) {
			mu.Lock()
			out.Write(b)
			mu.Unlock()
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Resize(ctx, 123, 45); err != nil {
			t.Fatal(err)
		}
		if err := p.SendInput(ctx, []byte("stty size; exit 0\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !strings.Contains(out.String(), "45 123") {
			t.Fatalf("pty output %q lacks the resized size", out.String())
		}
	})

	t.Run("files", func(t *testing.T) {
		blob := make([]byte, 2<<20+3)
		_, _ = rand.Read(blob)
		if _, err := sbx.Files.Write(ctx, "d/blob.bin", blob); err != nil {
			t.Fatal(err)
		}
		back, err := sbx.Files.Read(ctx, "d/blob.bin")
		if err != nil || !bytes.Equal(back, blob) {
			t.Fatalf("binary round trip: %d bytes, %v", len(back), err)
		}
		if ok, err := sbx.Files.MakeDir(ctx, "d/sub"); err != nil || !ok {
			t.Fatalf("MakeDir = %v, %v", ok, err)
		}
		ents, err := sbx.Files.List(ctx, "d", 1)
		if err != nil || len(ents) != 2 {
			t.Fatalf("List = %+v, %v", ents, err)
		}
		if _, err := sbx.Files.Rename(ctx, "d/blob.bin", "d/moved.bin"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := sbx.Files.Exists(ctx, "d/blob.bin"); ok {
			t.Error("renamed file still exists under its old name")
		}
		if err := sbx.Files.Remove(ctx, "d/moved.bin"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := sbx.Files.Exists(ctx, "d/moved.bin"); ok {
			t.Error("removed file exists")
		}
		if _, err := sbx.Files.Read(ctx, "d/moved.bin"); !errors.Is(err, agentbox.ErrNotFound) {
			t.Errorf("read removed file: %v, want ErrNotFound", err)
		}
	})

	t.Run("watch", func(t *testing.T) {
		if _, err := sbx.Files.MakeDir(ctx, "w"); err != nil {
			t.Fatal(err)
		}
		got := make(chan agentbox.Event, 16)
		w, err := sbx.Files.Watch(ctx, "w", false, func(e agentbox.Event) {
			select {
			case got <- e:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if _, err := sbx.Files.Write(ctx, "w/x.txt", []byte("x")); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case e := <-got:
				if e.Name == "x.txt" {
					return
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no event for w/x.txt")
			}
		}
	})

	t.Run("timeout and kill", func(t *testing.T) {
		if err := sbx.SetTimeout(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		info, err := sbx.GetInfo(ctx)
		if err != nil || time.Until(info.EndAt) > 2*time.Minute+5*time.Second {
			t.Fatalf("endAt after SetTimeout(2m): %+v, %v", info, err)
		}
		if err := sbx.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		if running, _ := sbx.IsRunning(ctx); running {
			t.Error("IsRunning after Kill")
		}
		if _, err := c.GetInfo(ctx, sbx.ID); !errors.Is(err, agentbox.ErrNotFound) {
			t.Errorf("GetInfo after kill: %v, want ErrNotFound", err)
		}
	})
}
