package envdclient

import (
	"context"
	"io"
	"net/http"
)

// OpenFile streams the file at path in the sandbox, read as user; size is
// its length (-1 when envd did not say). ctx bounds the whole read.
func (c *Client) OpenFile(ctx context.Context, path, user string) (rc io.ReadCloser, size int64, err error) {
	resp, err := c.fileRequest(ctx, http.MethodGet, path, user, nil)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFileFrom streams r to path in the sandbox as user, creating parent
// directories. ctx bounds the whole write.
func (c *Client) WriteFileFrom(ctx context.Context, path, user string, r io.Reader) error {
	resp, err := c.fileRequest(ctx, http.MethodPost, path, user, r)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
