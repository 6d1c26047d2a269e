package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
)

// filesystemService implements filesystem.Filesystem. Every file operation
// runs with the calling user's filesystem credentials (asUser).
type filesystemService struct {
	s *Server
}

// resolve selects the caller and resolves p against its home.
func (fsvc *filesystemService) resolve(h http.Header, p string) (*User, string, error) {
	u, err := fsvc.s.rpcUser(h)
	if err != nil {
		return nil, "", err
	}
	abs, err := ResolvePath(p, u.Home)
	if err != nil {
		return nil, "", connectError(err)
	}
	return u, abs, nil
}

// fsError turns an os error about path into a Connect error naming the path.
func fsError(op, path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: path '%s' does not exist", op, path))
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: permission denied for '%s'", op, path))
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s: path '%s' already exists", op, path))
	case errors.Is(err, syscall.ENOTDIR):
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: a parent of '%s' is not a directory", op, path))
	}
	return connectError(fmt.Errorf("%s %s: %w", op, path, err))
}

func (fsvc *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	var e *filesystem.EntryInfo
	err = asUser(u, func() (err error) {
		e, err = fsvc.s.entryInfo(path)
		return err
	})
	if err != nil {
		return nil, fsError("stat", path, err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (fsvc *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	var e *filesystem.EntryInfo
	err = asUser(u, func() error {
		if fi, err := os.Stat(path); err == nil {
			if fi.IsDir() {
				return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory '%s' already exists", path))
			}
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' already exists and is not a directory", path))
		}
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
		var err error
		e, err = fsvc.s.entryInfo(path)
		return err
	})
	if err != nil {
		return nil, fsError("make directory", path, err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (fsvc *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	u, src, err := fsvc.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := ResolvePath(req.Msg.GetDestination(), u.Home)
	if err != nil {
		return nil, connectError(err)
	}
	var e *filesystem.EntryInfo
	err = asUser(u, func() error {
		if _, err := os.Lstat(src); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
		var err error
		e, err = fsvc.s.entryInfo(dst)
		return err
	})
	if err != nil {
		return nil, fsError("move", src, err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (fsvc *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	var entries []*filesystem.EntryInfo
	err = asUser(u, func() error {
		// A symlinked directory is listed through its target.
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return err
		}
		fi, err := os.Stat(real)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path '%s' is not a directory", path))
		}
		return fsvc.s.walk(ctx, path, real, depth, &entries)
	})
	if err != nil {
		return nil, fsError("list directory", path, err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// walk appends the entries under dir (shown as shown) down to depth levels;
// symlinks are reported, not followed.
func (s *Server) walk(ctx context.Context, shown, dir string, depth int, out *[]*filesystem.EntryInfo) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		p := filepath.Join(shown, de.Name())
		e := s.entryFromInfo(filepath.Join(dir, de.Name()), fi)
		e.Path = p
		*out = append(*out, e)
		if de.IsDir() && depth > 1 {
			// Unreadable subdirectories are listed but not entered.
			_ = s.walk(ctx, p, filepath.Join(dir, de.Name()), depth-1, out)
		}
	}
	return nil
}

func (fsvc *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	// An empty path resolves to the user's home: never remove it by omission.
	if strings.TrimSpace(req.Msg.GetPath()) == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path: empty; name the file or directory to remove"))
	}
	u, path, err := fsvc.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove '/'"))
	}
	if err := asUser(u, func() error { return os.RemoveAll(path) }); err != nil {
		return nil, fsError("remove", path, err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
