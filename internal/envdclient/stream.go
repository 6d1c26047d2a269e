package envdclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
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

func (c *Client) fileRequest(ctx context.Context, method, path, user string, body io.Reader) (*http.Response, error) {
	u := c.base + "/files?" + url.Values{"path": {path}, "username": {user}}.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("envd %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}
