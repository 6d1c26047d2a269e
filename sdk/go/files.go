package agentbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
)

// Files reads and changes a sandbox's filesystem. Relative paths resolve
// against the user's home directory.
type Files struct {
	dp   *dataPlane
	user string
}

// AsUser returns a Files that acts as the given OS user (owner of new
// files, permission checks); "" is the template's default user.
func (f *Files) AsUser(user string) *Files { return &Files{dp: f.dp, user: user} }

// FileType is "file", "dir" or "symlink".
type FileType string

const (
	FileTypeFile    FileType = "file"
	FileTypeDir     FileType = "dir"
	FileTypeSymlink FileType = "symlink"
)

// EntryInfo describes a filesystem entry.
type EntryInfo struct {
	Name          string
	Type          FileType // for a symlink, the type of its target
	Path          string   // absolute
	Size          int64
	Mode          fs.FileMode // permission bits
	Permissions   string      // ls-style, e.g. "-rw-r--r--"
	Owner         string
	Group         string
	ModifiedTime  time.Time
	SymlinkTarget string // set for symlinks
	Metadata      map[string]string
}

// WriteInfo is where a write landed.
type WriteInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// EventType is the kind of a filesystem change.
type EventType string

const (
	EventCreate EventType = "create"
	EventWrite  EventType = "write"
	EventRemove EventType = "remove"
	EventRename EventType = "rename"
	EventChmod  EventType = "chmod"
)

// Event is one change under a watched directory.
type Event struct {
	Name string // relative to the watched directory
	Type EventType
}

func entryFromProto(e *filesystem.EntryInfo) EntryInfo {
	if e == nil {
		return EntryInfo{}
	}
	info := EntryInfo{
		Name:          e.GetName(),
		Path:          e.GetPath(),
		Size:          e.GetSize(),
		Mode:          fs.FileMode(e.GetMode()),
		Permissions:   e.GetPermissions(),
		Owner:         e.GetOwner(),
		Group:         e.GetGroup(),
		SymlinkTarget: e.GetSymlinkTarget(),
		Metadata:      e.GetMetadata(),
	}
	if e.GetModifiedTime() != nil {
		info.ModifiedTime = e.GetModifiedTime().AsTime()
	}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		info.Type = FileTypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		info.Type = FileTypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		info.Type = FileTypeSymlink
	}
	return info
}

func (f *Files) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if f.user != "" {
		q.Set("username", f.user)
	}
	return f.dp.baseURL + "/files?" + q.Encode()
}

// ReadStream opens path for reading; the caller closes the reader.
func (f *Files) ReadStream(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.filesURL(path), nil)
	if err != nil {
		return nil, err
	}
	setUser(req.Header, f.user)
	// Raw bytes: compressing on the fly costs more than it saves on the
	// links a gateway usually sits on, and breaks ranged reads.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := f.dp.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("read %s: %w", path, decodeAPIError(resp))
	}
	return resp.Body, nil
}

// Read returns the content of path.
func (f *Files) Read(ctx context.Context, path string) ([]byte, error) {
	rc, err := f.ReadStream(ctx, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// Write creates or replaces path with data, creating parent directories.
func (f *Files) Write(ctx context.Context, path string, data []byte) (*WriteInfo, error) {
	return f.write(ctx, path, bytes.NewReader(data), int64(len(data)))
}

// WriteStream creates or replaces path with everything read from r,
// streaming it (chunked, never buffered whole).
func (f *Files) WriteStream(ctx context.Context, path string, r io.Reader) (*WriteInfo, error) {
	return f.write(ctx, path, r, -1)
}

func (f *Files) write(ctx context.Context, path string, r io.Reader, size int64) (*WriteInfo, error) {
	// Hide the concrete type so net/http does not guess a length; -1 means
	// unknown and the body goes out chunked.
	body := io.NopCloser(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.filesURL(path), body)
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	setUser(req.Header, f.user)
	resp, err := f.dp.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("write %s: %w", path, decodeAPIError(resp))
	}
	var infos []WriteInfo
	if err := json.NewDecoder(resp.Body).Decode(&infos); err != nil || len(infos) == 0 {
		// The write happened; only the description is missing.
		return &WriteInfo{Path: path, Type: "file"}, nil
	}
	return &infos[0], nil
}

func (f *Files) rpc(req interface{ Header() http.Header }) {
	setUser(req.Header(), f.user)
}

// List returns the entries of a directory down to depth levels (min 1).
func (f *Files) List(ctx context.Context, path string, depth int) ([]EntryInfo, error) {
	if depth < 1 {
		depth = 1
	}
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(depth)})
	f.rpc(req)
	resp, err := f.dp.fs.ListDir(ctx, req)
	if err != nil {
		return nil, rpcError("list "+path, err)
	}
	out := make([]EntryInfo, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, entryFromProto(e))
	}
	return out, nil
}

// Stat describes path; ErrNotFound if it does not exist.
func (f *Files) Stat(ctx context.Context, path string) (*EntryInfo, error) {
	req := connect.NewRequest(&filesystem.StatRequest{Path: path})
	f.rpc(req)
	resp, err := f.dp.fs.Stat(ctx, req)
	if err != nil {
		return nil, rpcError("stat "+path, err)
	}
	e := entryFromProto(resp.Msg.GetEntry())
	return &e, nil
}

// Exists reports whether path exists.
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.Stat(ctx, path)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// MakeDir creates a directory and its parents. It reports false when the
// directory already existed.
func (f *Files) MakeDir(ctx context.Context, path string) (bool, error) {
	req := connect.NewRequest(&filesystem.MakeDirRequest{Path: path})
	f.rpc(req)
	_, err := f.dp.fs.MakeDir(ctx, req)
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		return false, nil
	}
	if err != nil {
		return false, rpcError("mkdir "+path, err)
	}
	return true, nil
}

// Rename moves oldPath to newPath, creating newPath's parents.
func (f *Files) Rename(ctx context.Context, oldPath, newPath string) (*EntryInfo, error) {
	req := connect.NewRequest(&filesystem.MoveRequest{Source: oldPath, Destination: newPath})
	f.rpc(req)
	resp, err := f.dp.fs.Move(ctx, req)
	if err != nil {
		return nil, rpcError("rename "+oldPath, err)
	}
	e := entryFromProto(resp.Msg.GetEntry())
	return &e, nil
}

// Remove deletes path recursively; a missing path is not an error.
func (f *Files) Remove(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystem.RemoveRequest{Path: path})
	f.rpc(req)
	_, err := f.dp.fs.Remove(ctx, req)
	return rpcError("remove "+path, err)
}

// WatchHandle is a running directory watch.
type WatchHandle struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
}

// Stop ends the watch and waits for the event callback to return.
func (w *WatchHandle) Stop() {
	w.cancel()
	<-w.done
}

// Done is closed when the watch has ended.
func (w *WatchHandle) Done() <-chan struct{} { return w.done }

// Err is why the watch ended; nil while it runs or after Stop.
func (w *WatchHandle) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Watch calls onEvent (from one goroutine, in order) for every change under
// the directory path until ctx ends or Stop is called. It returns once the
// watch is established; ErrNotFound if path does not exist.
func (f *Files) Watch(ctx context.Context, path string, recursive bool, onEvent func(Event)) (*WatchHandle, error) {
	sctx, cancel := context.WithCancel(ctx)
	req := connect.NewRequest(&filesystem.WatchDirRequest{Path: path, Recursive: recursive})
	req.Header().Set("Keepalive-Ping-Interval", keepaliveSeconds)
	f.rpc(req)
	stream, err := f.dp.fs.WatchDir(sctx, req)
	if err != nil {
		cancel()
		return nil, rpcError("watch "+path, err)
	}
	// Events are only guaranteed after the start event.
	for {
		if !stream.Receive() {
			err := stream.Err()
			stream.Close()
			cancel()
			if err == nil {
				err = errors.New("watch ended before it started")
			}
			return nil, rpcError("watch "+path, err)
		}
		if stream.Msg().GetStart() != nil {
			break
		}
	}
	w := &WatchHandle{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetFilesystem()
			if ev == nil {
				continue
			}
			onEvent(Event{Name: ev.GetName(), Type: eventType(ev.GetType())})
		}
		if err := stream.Err(); err != nil && sctx.Err() == nil {
			w.mu.Lock()
			w.err = rpcError("watch "+path, err)
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func eventType(t filesystem.EventType) EventType {
	switch t {
	case filesystem.EventType_EVENT_TYPE_CREATE:
		return EventCreate
	case filesystem.EventType_EVENT_TYPE_WRITE:
		return EventWrite
	case filesystem.EventType_EVENT_TYPE_REMOVE:
		return EventRemove
	case filesystem.EventType_EVENT_TYPE_RENAME:
		return EventRename
	case filesystem.EventType_EVENT_TYPE_CHMOD:
		return EventChmod
	}
	return EventType(t.String())
}
