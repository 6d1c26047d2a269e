package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/api/gen/filesystem"
)

// maxPolledEvents bounds the events a polling watcher keeps between calls.
const maxPolledEvents = 10000

// dirWatch watches one directory (optionally recursively) as one user and
// turns inotify events into FilesystemEvents named relative to the root.
type dirWatch struct {
	s            *Server
	user         *User
	root         string
	recursive    bool
	includeEntry bool
	w            *fsnotify.Watcher
}

// networkFS names network filesystems (by statfs f_type) whose changes
// inotify does not observe reliably; "" for others.
func networkFS(fsType int64) string {
	switch fsType {
	case 0x6969:
		return "nfs"
	case 0xff534d42:
		return "cifs"
	case 0xfe534d42:
		return "smb2"
	case 0x517b:
		return "smb"
	case 0x65735546:
		return "fuse"
	}
	return ""
}

func (s *Server) newDirWatch(u *User, root string, recursive, includeEntry, allowNetwork bool) (*dirWatch, error) {
	dw := &dirWatch{s: s, user: u, root: root, recursive: recursive, includeEntry: includeEntry}
	err := asUser(u, func() error {
		fi, err := os.Stat(root)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", root))
		}
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err == nil {
			if name := networkFS(int64(st.Type)); name != "" && !allowNetwork {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("path '%s' is on a %s network mount; set allowNetworkMounts to watch it", root, name))
			}
		}
		if dw.w, err = fsnotify.NewWatcher(); err != nil {
			return err
		}
		// inotify_add_watch runs in this goroutine, so it is checked as the user.
		return dw.addTree(root)
	})
	if err != nil {
		if dw.w != nil {
			dw.w.Close()
		}
		return nil, fsError("watch", root, err)
	}
	return dw, nil
}

// addTree watches dir and, when recursive, every directory below it.
func (dw *dirWatch) addTree(dir string) error {
	if err := dw.w.Add(dir); err != nil {
		return err
	}
	if !dw.recursive {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if d.IsDir() {
			_ = dw.w.Add(p)
		}
		return nil
	})
}

func (dw *dirWatch) close() { dw.w.Close() }

// convert maps one inotify event to FilesystemEvents, one per op bit in
// E2B envd's order (create, rename, chmod, write, remove), and starts
// watching new directories when recursive.
func (dw *dirWatch) convert(ev fsnotify.Event) []*filesystem.FilesystemEvent {
	rel, err := filepath.Rel(dw.root, ev.Name)
	if err != nil {
		return nil
	}
	if dw.recursive && ev.Has(fsnotify.Create) {
		_ = asUser(dw.user, func() error {
			if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
				_ = dw.addTree(ev.Name)
			}
			return nil
		})
	}
	var entry *filesystem.EntryInfo
	if dw.includeEntry && !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
		_ = asUser(dw.user, func() error {
			entry, _ = dw.s.entryInfo(ev.Name)
			return nil
		})
	}
	var out []*filesystem.FilesystemEvent
	for _, m := range []struct {
		op fsnotify.Op
		t  filesystem.EventType
	}{
		{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
		{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
	} {
		if ev.Has(m.op) {
			out = append(out, &filesystem.FilesystemEvent{Name: rel, Type: m.t, Entry: entry})
		}
	}
	return out
}

func (fsvc *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	dw, err := fsvc.s.newDirWatch(u, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	defer dw.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	ka := keepaliveInterval(req.Header())
	timer := time.NewTimer(ka)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil // the watch's timeout is its normal end
			}
			return ctx.Err()
		case ev, ok := <-dw.w.Events:
			if !ok {
				return nil
			}
			for _, fe := range dw.convert(ev) {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
			timer.Reset(ka)
		case err, ok := <-dw.w.Errors:
			if !ok {
				return nil
			}
			return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", path, err))
		case <-timer.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			timer.Reset(ka)
		}
	}
}

// watcherTable holds the polling watchers of CreateWatcher.
type watcherTable struct {
	mu sync.Mutex
	m  map[string]*polledWatch
}

type polledWatch struct {
	dw     *dirWatch
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error
}

func newWatcherTable() *watcherTable { return &watcherTable{m: map[string]*polledWatch{}} }

func (t *watcherTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, pw := range t.m {
		pw.dw.close()
		delete(t.m, id)
	}
}

func (fsvc *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	dw, err := fsvc.s.newDirWatch(u, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	pw := &polledWatch{dw: dw}
	t := fsvc.s.watchers
	t.mu.Lock()
	t.m[id] = pw
	t.mu.Unlock()
	go func() {
		for {
			select {
			case ev, ok := <-dw.w.Events:
				if !ok {
					return
				}
				evs := dw.convert(ev)
				pw.mu.Lock()
				if len(pw.events)+len(evs) <= maxPolledEvents {
					pw.events = append(pw.events, evs...)
				}
				pw.mu.Unlock()
			case err, ok := <-dw.w.Errors:
				if !ok {
					return
				}
				pw.mu.Lock()
				pw.err = err
				pw.mu.Unlock()
			}
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (fsvc *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	t := fsvc.s.watchers
	t.mu.Lock()
	pw, ok := t.m[req.Msg.GetWatcherId()]
	t.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.err != nil {
		return nil, connect.NewError(connect.CodeInternal, pw.err)
	}
	evs := pw.events
	pw.events = nil
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (fsvc *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t := fsvc.s.watchers
	t.mu.Lock()
	pw, ok := t.m[req.Msg.GetWatcherId()]
	delete(t.m, req.Msg.GetWatcherId())
	t.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher '%s' not found", req.Msg.GetWatcherId()))
	}
	pw.dw.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

// announceNewFile gives a file an upload has just created to its creator
// once more, as E2B's envd does when it chowns each upload to the user. The
// ownership does not change; the point is the attribute event it raises, so
// a watcher sees create, chmod, write for a new file as E2B's SDKs expect.
// A file someone else created in between is left alone.
func announceNewFile(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat new upload %s: %w", f.Name(), err)
	}
	if err := unix.Fchown(int(f.Fd()), int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("own new upload %s: %w", f.Name(), err)
	}
	return nil
}
