package envd

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
)

func TestFilesystemRPCs(t *testing.T) {
	e := newTestEnv(t, testToken)
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			c := e.fsClient(clientHeaders("", testToken), codec.opts...)
			ctx := ctxT(t)
			dir := "d-" + codec.name

			// MakeDir: relative to home, owned by the caller; twice ⇒ already_exists.
			md, err := c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir + "/sub"}))
			if err != nil {
				t.Fatal(err)
			}
			if md.Msg.Entry.Path != filepath.Join(e.home, dir, "sub") || md.Msg.Entry.Owner != "tester" || md.Msg.Entry.Type != filesystem.FileType_FILE_TYPE_DIRECTORY {
				t.Fatalf("makedir entry %v", md.Msg.Entry)
			}
			if _, err := c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir + "/sub"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
				t.Fatalf("makedir twice: %v", err)
			}
			f := filepath.Join(e.home, dir, "a.txt")
			writeFile(t, f, "data")
			if err := os.Chown(f, testUID, testUID); err != nil {
				t.Fatal(err)
			}
			if _, err := c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: f})); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("makedir over file: %v", err)
			}

			// Stat: a file, a symlink to it, metadata, not_found.
			if err := os.Symlink("a.txt", filepath.Join(e.home, dir, "link")); err != nil {
				t.Fatal(err)
			}
			st, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "~/" + dir + "/a.txt"}))
			if err != nil {
				t.Fatal(err)
			}
			if en := st.Msg.Entry; en.Name != "a.txt" || en.Size != 4 || en.Mode != 0o644 || en.Permissions != "-rw-r--r--" || en.Owner != "tester" || en.Group != "tester" || en.Type != filesystem.FileType_FILE_TYPE_FILE {
				t.Fatalf("stat %v", en)
			}
			st, err = c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: dir + "/link"}))
			if err != nil {
				t.Fatal(err)
			}
			if en := st.Msg.Entry; en.Type != filesystem.FileType_FILE_TYPE_FILE || en.GetSymlinkTarget() != f {
				t.Fatalf("stat link %v", en)
			}
			if _, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: dir + "/nope"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("stat missing: %v", err)
			}

			// ListDir depth 1 and 2; file ⇒ invalid_argument.
			ls, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: dir}))
			if err != nil || len(ls.Msg.Entries) != 3 {
				t.Fatalf("list depth 1: %v %v", ls, err)
			}
			writeFile(t, filepath.Join(e.home, dir, "sub", "deep"), "x")
			ls, err = c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: dir, Depth: 2}))
			if err != nil || len(ls.Msg.Entries) != 4 {
				t.Fatalf("list depth 2: %v %v", ls, err)
			}
			if _, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: f})); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Fatalf("list file: %v", err)
			}
			if _, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/nope/x"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("list missing: %v", err)
			}

			// Move into a new directory; missing source ⇒ not_found.
			mv, err := c.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: dir + "/a.txt", Destination: dir + "/new/b.txt"}))
			if err != nil || mv.Msg.Entry.Path != filepath.Join(e.home, dir, "new", "b.txt") {
				t.Fatalf("move: %v %v", mv, err)
			}
			if _, err := c.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: dir + "/a.txt", Destination: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("move missing: %v", err)
			}

			// Remove, and removing again is fine.
			for range 2 {
				if _, err := c.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: dir})); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(filepath.Join(e.home, dir)); !os.IsNotExist(err) {
				t.Fatalf("not removed: %v", err)
			}
		})
	}
}

func TestFilesystemPermissions(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.fsClient(nil) // default user "tester"
	ctx := ctxT(t)
	secret := filepath.Join(e.root, "secret")
	if err := os.MkdirAll(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(secret, "f"), "x")
	cases := []struct {
		name string
		call func() error
		code connect.Code
	}{
		{"stat inside root-only dir", func() error {
			_, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: secret + "/f"}))
			return err
		}, connect.CodePermissionDenied},
		{"list root's home", func() error {
			_, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: e.rootHome}))
			return err
		}, connect.CodePermissionDenied},
		{"mkdir in /etc", func() error {
			_, err := c.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/etc/envd-test-should-not-exist"}))
			return err
		}, connect.CodePermissionDenied},
		{"remove root's file", func() error {
			_, err := c.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: secret}))
			return err
		}, connect.CodePermissionDenied},
		{"NUL in path", func() error {
			_, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "a\x00b"}))
			return err
		}, connect.CodeInvalidArgument},
		{"traversal from home into root's home", func() error {
			_, err := c.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "../../roothome"}))
			return err
		}, connect.CodePermissionDenied},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); connect.CodeOf(err) != tt.code {
				t.Fatalf("err %v, want %v", err, tt.code)
			}
		})
	}
	if _, err := os.Stat(secret + "/f"); err != nil {
		t.Fatal("secret removed")
	}
	// Root, selected explicitly, may do what tester may not.
	rc := e.fsClient(clientHeaders("root", ""))
	if _, err := rc.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: secret + "/f"})); err != nil {
		t.Fatal(err)
	}
}

func TestWatchDir(t *testing.T) {
	e := newTestEnv(t, "")
	for _, codec := range codecs {
		t.Run(codec.name, func(t *testing.T) {
			c := e.fsClient(map[string]string{"Keepalive-Ping-Interval": "1"}, codec.opts...)
			dir := filepath.Join(e.home, "w-"+codec.name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := c.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}))
			if err != nil {
				t.Fatal(err)
			}
			if !s.Receive() || s.Msg().GetStart() == nil {
				t.Fatalf("first event %v %v", s.Msg(), s.Err())
			}
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			want := []string{"sub", "sub/a.txt"}
			got := map[string]*filesystem.FilesystemEvent{}
			wroteNested := false
			sawKeepalive := false
			for s.Receive() {
				if s.Msg().GetKeepalive() != nil {
					sawKeepalive = true
				}
				ev := s.Msg().GetFilesystem()
				if ev == nil {
					continue
				}
				if ev.Type == filesystem.EventType_EVENT_TYPE_CREATE {
					got[ev.Name] = ev
				}
				if ev.Name == "sub" && !wroteNested {
					// The new directory is watched too (recursive).
					time.Sleep(100 * time.Millisecond)
					writeFile(t, filepath.Join(dir, "sub", "a.txt"), "x")
					wroteNested = true
				}
				if got["sub"] != nil && got["sub/a.txt"] != nil {
					break
				}
			}
			for _, w := range want {
				if got[w] == nil {
					t.Fatalf("no create event for %s (err %v)", w, s.Err())
				}
			}
			if got["sub/a.txt"].Entry == nil || got["sub/a.txt"].Entry.Path != filepath.Join(dir, "sub", "a.txt") {
				t.Fatalf("entry not included: %v", got["sub/a.txt"])
			}
			// Quiet stream ⇒ keepalive.
			for !sawKeepalive && s.Receive() {
				sawKeepalive = s.Msg().GetKeepalive() != nil
			}
			if !sawKeepalive {
				t.Fatalf("no keepalive: %v", s.Err())
			}
			cancel()
		})
	}
	c := e.fsClient(nil)
	s, err := c.WatchDir(ctxT(t), connect.NewRequest(&filesystem.WatchDirRequest{Path: "/nope"}))
	if err == nil {
		for s.Receive() {
		}
		err = s.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("watch missing: %v", err)
	}
}

func TestPolledWatcher(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.fsClient(nil, connect.WithProtoJSON())
	ctx := ctxT(t)
	cw, err := c.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "~"}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	writeFile(t, filepath.Join(e.home, "p.txt"), "x")
	var names []string
	for i := 0; i < 50 && len(names) == 0; i++ {
		ev, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Msg.Events {
			names = append(names, e.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(names) == 0 || names[0] != "p.txt" {
		t.Fatalf("events %v", names)
	}
	if _, err := c.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("removed watcher: %v", err)
	}
}
