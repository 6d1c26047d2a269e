package interpreter

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	zmq "github.com/go-zeromq/zmq4"
)

// Jupyter messaging protocol 5.3 over ZeroMQ: just what a client of one
// kernel needs (shell, control and iopub; no stdin, no heartbeat: kernel
// death is seen from the process, which is more reliable than zmq4, whose
// Send to a dead peer succeeds silently).

const protocolVersion = "5.3"

// delimiter separates ZeroMQ routing frames from the signed message.
var delimiter = []byte("<IDS|MSG>")

// connectionInfo is the kernel's connection file.
type connectionInfo struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
}

func (c connectionInfo) endpoint(port int) string {
	return c.Transport + "://" + net.JoinHostPort(c.IP, strconv.Itoa(port))
}

type msgHeader struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is a decoded Jupyter message. Parent keeps only the field the
// client routes by.
type message struct {
	Header  msgHeader
	Parent  struct{ MsgID string }
	Content json.RawMessage
}

// jupyterClient speaks to one running kernel. Replies and iopub messages are
// routed by parent msg_id to the handler registered for that request.
type jupyterClient struct {
	key     []byte
	session string

	shell, control, iopub zmq.Socket
	sendMu                sync.Mutex // zmq4 sockets are not safe for concurrent sends

	mu       sync.Mutex
	handlers map[string]func(channel string, m *message)

	closed chan struct{}
	wg     sync.WaitGroup
}

// dialJupyter connects to the kernel described by ci. The kernel has bound
// its ports already (it wrote the connection file after binding), so the
// dial retries are only a guard.
func dialJupyter(ctx context.Context, ci connectionInfo) (*jupyterClient, error) {
	c := &jupyterClient{
		key:      []byte(ci.Key),
		session:  newID(),
		handlers: map[string]func(string, *message){},
		closed:   make(chan struct{}),
	}
	// The sockets live as long as the client, not as long as ctx.
	sctx := context.WithoutCancel(ctx)
	opts := []zmq.Option{zmq.WithDialerRetry(20 * time.Millisecond), zmq.WithDialerMaxRetries(250)}
	c.shell = zmq.NewDealer(sctx, opts...)
	c.control = zmq.NewDealer(sctx, opts...)
	c.iopub = zmq.NewSub(sctx, opts...)
	if err := c.iopub.SetOption(zmq.OptionSubscribe, ""); err != nil {
		c.closeSockets()
		return nil, fmt.Errorf("subscribe iopub: %w", err)
	}
	for _, d := range []struct {
		s    zmq.Socket
		port int
		name string
	}{{c.iopub, ci.IOPubPort, "iopub"}, {c.shell, ci.ShellPort, "shell"}, {c.control, ci.ControlPort, "control"}} {
		if err := d.s.Dial(ci.endpoint(d.port)); err != nil {
			c.closeSockets()
			return nil, fmt.Errorf("dial kernel %s port %d: %w", d.name, d.port, err)
		}
	}
	for name, s := range map[string]zmq.Socket{"shell": c.shell, "control": c.control, "iopub": c.iopub} {
		c.wg.Add(1)
		go c.readLoop(name, s)
	}
	return c, nil
}

func (c *jupyterClient) closeSockets() {
	for _, s := range []zmq.Socket{c.shell, c.control, c.iopub} {
		if s != nil {
			_ = s.Close()
		}
	}
}

// Close closes the sockets and waits for the readers to end.
func (c *jupyterClient) Close() {
	select {
	case <-c.closed:
		return
	default:
	}
	close(c.closed)
	c.closeSockets()
	c.wg.Wait()
}

func (c *jupyterClient) readLoop(channel string, s zmq.Socket) {
	defer c.wg.Done()
	for {
		raw, err := s.Recv()
		if err != nil {
			return // closed socket or dead kernel; the process watcher reports it
		}
		m, err := c.decode(raw.Frames)
		if err != nil {
			continue // unsigned or foreign messages are dropped
		}
		c.mu.Lock()
		h := c.handlers[m.Parent.MsgID]
		c.mu.Unlock()
		if h != nil {
			h(channel, m)
		}
	}
}

// request sends a message on the shell or control channel and routes every
// message whose parent it is to h until the returned cancel func is called.
// h runs on the reader goroutines: it must not block for long.
func (c *jupyterClient) request(channel, msgType string, content any, h func(channel string, m *message)) (msgID string, cancel func(), err error) {
	msgID = newID()
	c.mu.Lock()
	c.handlers[msgID] = h
	c.mu.Unlock()
	cancel = func() {
		c.mu.Lock()
		delete(c.handlers, msgID)
		c.mu.Unlock()
	}
	frames, err := c.encode(msgID, msgType, content)
	if err != nil {
		cancel()
		return "", nil, err
	}
	s := c.shell
	if channel == "control" {
		s = c.control
	}
	c.sendMu.Lock()
	err = s.SendMulti(zmq.NewMsgFrom(frames...))
	c.sendMu.Unlock()
	if err != nil {
		cancel()
		return "", nil, fmt.Errorf("send %s: %w", msgType, err)
	}
	return msgID, cancel, nil
}

func (c *jupyterClient) encode(msgID, msgType string, content any) ([][]byte, error) {
	header, err := json.Marshal(msgHeader{
		MsgID: msgID, Session: c.session, Username: "agentbox",
		Date: time.Now().UTC().Format(time.RFC3339Nano), MsgType: msgType, Version: protocolVersion,
	})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(content)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", msgType, err)
	}
	parts := [][]byte{header, []byte("{}"), []byte("{}"), body}
	return append([][]byte{delimiter, c.sign(parts)}, parts...), nil
}

func (c *jupyterClient) sign(parts [][]byte) []byte {
	if len(c.key) == 0 {
		return nil
	}
	mac := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		mac.Write(p)
	}
	return []byte(hex.EncodeToString(mac.Sum(nil)))
}

var errBadMessage = errors.New("malformed or unsigned jupyter message")

func (c *jupyterClient) decode(frames [][]byte) (*message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames) < i+6 {
		return nil, errBadMessage
	}
	sig, parts := frames[i+1], frames[i+2:i+6]
	if len(c.key) > 0 && !hmac.Equal(sig, c.sign(parts)) {
		return nil, errBadMessage
	}
	m := &message{Content: parts[3]}
	if err := json.Unmarshal(parts[0], &m.Header); err != nil {
		return nil, errBadMessage
	}
	var parent struct {
		MsgID string `json:"msg_id"`
	}
	if err := json.Unmarshal(parts[1], &parent); err != nil {
		return nil, errBadMessage
	}
	m.Parent.MsgID = parent.MsgID
	return m, nil
}

// newID returns a random UUID-shaped id.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
