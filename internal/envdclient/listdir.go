package envdclient

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
)

// Entry is one directory entry.
type Entry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Dir  bool   `json:"dir"`
	Size int64  `json:"size"`
}

// ListDir lists the directory at path (one level) as user.
func (c *Client) ListDir(ctx context.Context, path, user string) ([]Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: 1})
	c.authorize(req.Header(), user)
	resp, err := filesystemconnect.NewFilesystemClient(c.hc, c.base).ListDir(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	out := make([]Entry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, Entry{Name: e.GetName(), Path: e.GetPath(), Dir: e.GetType() == filesystem.FileType_FILE_TYPE_DIRECTORY, Size: e.GetSize()})
	}
	return out, nil
}
