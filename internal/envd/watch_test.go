package envd

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
)

// eventSource yields a watch's filesystem events, one batch at a time.
type eventSource func(t *testing.T) []*filesystem.FilesystemEvent

func streamSource(t *testing.T, c filesystemconnect.FilesystemClient, dir string, recursive bool) eventSource {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: recursive}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first message %v: %v", s.Msg(), s.Err())
	}
	return func(t *testing.T) []*filesystem.FilesystemEvent {
		for s.Receive() {
			if ev := s.Msg().GetFilesystem(); ev != nil {
				return []*filesystem.FilesystemEvent{ev}
			}
		}
		t.Fatalf("watch stream ended: %v", s.Err())
		return nil
	}
}

func polledSource(t *testing.T, c filesystemconnect.FilesystemClient, dir string, recursive bool) eventSource {
	ctx := ctxT(t)
	cw, err := c.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, Recursive: recursive}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	t.Cleanup(func() {
		_, _ = c.RemoveWatcher(context.Background(), connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id}))
	})
	return func(t *testing.T) []*filesystem.FilesystemEvent {
		for {
			r, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Msg.Events) > 0 {
				return r.Msg.Events
			}
			time.Sleep(20 * time.Millisecond) // a poll interval, not an assertion
		}
	}
}

// eventsUntil collects events until one for the sentinel name arrives, and
// returns those before it as "TYPE name".
func eventsUntil(t *testing.T, next eventSource, sentinel string) []string {
	t.Helper()
	var out []string
	for {
		for _, ev := range next(t) {
			if filepath.Base(ev.Name) == sentinel {
				return out
			}
			out = append(out, strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_")+" "+ev.Name)
		}
	}
}

// TestWatchEventsMatchE2B checks the events, names and order E2B's envd
// gives for each kind of change, through both watch forms, recursive or not.
func TestWatchEventsMatchE2B(t *testing.T) {
	e := newTestEnv(t, "")
	c := e.fsClient(nil)
	upload := func(t *testing.T, p, content string) {
		t.Helper()
		resp := e.do("POST", "/files?path="+url.QueryEscape(p), strings.NewReader(content), map[string]string{"Content-Type": "application/octet-stream"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("upload %s: %d", p, resp.StatusCode)
		}
	}
	cases := []struct {
		name    string
		prepare func(t *testing.T, dir string) // before the watch starts
		act     func(t *testing.T, dir string)
		want    []string // names relative to the watched dir's "sub"
		// coalesce: the truncate and the write may reach the watcher as one
		// event or two (inotify merges them only while unread), so repeats
		// are folded before comparing.
		coalesce bool
	}{
		{"upload new file", nil, func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "content") },
			[]string{"CREATE f.txt", "CHMOD f.txt", "WRITE f.txt"}, false},
		{"upload over a file", func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "old") },
			func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "new") },
			[]string{"WRITE f.txt"}, true},
		{"write in the sandbox", func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "old") },
			func(t *testing.T, dir string) {
				f, err := os.OpenFile(filepath.Join(dir, "f.txt"), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteString("more"); err != nil {
					t.Fatal(err)
				}
			},
			[]string{"WRITE f.txt"}, false},
		{"rename", func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "x") },
			func(t *testing.T, dir string) {
				if err := os.Rename(filepath.Join(dir, "f.txt"), filepath.Join(dir, "g.txt")); err != nil {
					t.Fatal(err)
				}
			},
			[]string{"RENAME f.txt", "CREATE g.txt"}, false},
		{"remove", func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "x") },
			func(t *testing.T, dir string) {
				if err := os.Remove(filepath.Join(dir, "f.txt")); err != nil {
					t.Fatal(err)
				}
			},
			[]string{"REMOVE f.txt"}, false},
		{"chmod", func(t *testing.T, dir string) { upload(t, filepath.Join(dir, "f.txt"), "x") },
			func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "f.txt"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			[]string{"CHMOD f.txt"}, false},
	}
	forms := []struct {
		name string
		open func(t *testing.T, c filesystemconnect.FilesystemClient, dir string, recursive bool) eventSource
	}{{"stream", streamSource}, {"polled", polledSource}}
	n := 0
	for _, form := range forms {
		for _, recursive := range []bool{false, true} {
			for _, tc := range cases {
				t.Run(fmt.Sprintf("%s/recursive=%v/%s", form.name, recursive, tc.name), func(t *testing.T) {
					n++
					root := filepath.Join(e.home, fmt.Sprintf("w%d", n))
					// Recursive watches see the change one level down, as E2B's nested test does.
					dir, prefix := root, ""
					if recursive {
						dir, prefix = filepath.Join(root, "sub"), "sub/"
					}
					upload(t, filepath.Join(dir, ".keep"), "")
					if tc.prepare != nil {
						tc.prepare(t, dir)
					}
					next := form.open(t, c, root, recursive)
					tc.act(t, dir)
					upload(t, filepath.Join(dir, "zz-end"), "")
					got := eventsUntil(t, next, "zz-end")
					if tc.coalesce {
						got = slices.Compact(got)
					}
					var want []string
					for _, w := range tc.want {
						typ, name, _ := strings.Cut(w, " ")
						want = append(want, typ+" "+prefix+name)
					}
					if !slices.Equal(got, want) {
						t.Fatalf("events %q, want %q", got, want)
					}
				})
			}
		}
	}
}
