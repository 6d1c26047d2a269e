package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// qmp is a connection to a QEMU's monitor (QMP, JSON lines).
type qmp struct {
	c net.Conn
	r *bufio.Reader
}

// dialQMP connects to sandbox id's QEMU monitor and leaves capability
// negotiation done.
func (d *Driver) dialQMP(ctx context.Context, id string) (*qmp, error) {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", filepath.Join(d.dir(id), qmpSock))
	if err != nil {
		return nil, fmt.Errorf("qemu monitor: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	if t, ok := ctx.Deadline(); ok {
		deadline = t
	}
	_ = c.SetDeadline(deadline)
	q := &qmp{c: c, r: bufio.NewReader(c)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		c.Close()
		return nil, fmt.Errorf("qemu monitor greeting: %w", err)
	}
	if _, err := q.run("qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) Close() error { return q.c.Close() }

// run executes a command and returns its result; asynchronous events that
// arrive meanwhile are skipped.
func (q *qmp) run(cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qemu %s: %w", cmd, err)
	}
	return q.read(cmd)
}

// read returns the answer to command cmd.
func (q *qmp) read(cmd string) (json.RawMessage, error) {
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("qemu %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qemu %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		default:
			return resp.Return, nil
		}
	}
}

// qmpStatus returns QEMU's run state ("running", "paused", ...).
func (d *Driver) qmpStatus(ctx context.Context, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q, err := d.dialQMP(ctx, id)
	if err != nil {
		return "", err
	}
	defer q.Close()
	r, err := q.run("query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(r, &st)
	return st.Status, err
}
