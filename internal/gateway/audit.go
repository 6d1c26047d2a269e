package gateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	fspb "github.com/agentbox/agentbox/api/gen/filesystem"
	procpb "github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/internal/audit"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// The gateway writes the process and file events of the audit log: it sees
// every control request on its way to envd and every answer on its way
// back, outside the sandbox, so nothing inside the sandbox can forge or
// suppress these records. Only the small request messages are buffered;
// process output streams through untouched while its frames are read.

// maxAuditedBody caps how much of a request is buffered to decode it; a
// bigger one (a huge argv) is forwarded unread and audited as such.
const maxAuditedBody = 4 << 20

// auditTap is the gateway's audit state.
type auditTap struct {
	log *audit.Log
}

// SetAudit makes the gateway record process and file events in l.
func (g *Gateway) SetAudit(l *audit.Log) {
	if l != nil {
		g.tap = &auditTap{log: l}
	}
}

// audited reports which audited call r is, if any.
func audited(r *http.Request) string {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/process.Process/Start":
		return "start"
	case r.Method == http.MethodPost && (r.URL.Path == "/filesystem.Filesystem/Move" || r.URL.Path == "/filesystem.Filesystem/Remove" || r.URL.Path == "/filesystem.Filesystem/MakeDir"):
		return "fs"
	case (r.Method == http.MethodPost || r.Method == http.MethodPut) && r.URL.Path == "/files":
		return "upload"
	}
	return ""
}

// proxyAudited forwards r through the proxy, recording it if audited.
func (g *Gateway) proxyAudited(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int) {
	kind := ""
	if g.tap != nil && port == sandbox.EnvdPort {
		kind = audited(r)
	}
	if kind == "" {
		g.proxy.ServeHTTP(w, r)
		return
	}
	base := audit.Event{SandboxID: sb.ID, TeamID: sb.TeamID, APIKeyID: sb.APIKeyID, Fields: map[string]any{"user": requestUser(r, sb)}}
	if kind == "upload" {
		g.proxyUpload(w, r, base)
		return
	}
	body, complete := readCapped(r)
	switch kind {
	case "start":
		g.proxyStart(w, r, base, body, complete)
	case "fs":
		g.proxyFS(w, r, base, body, complete)
	}
}

// readCapped buffers up to maxAuditedBody of the body and puts an
// equivalent body back on r. complete is false when the body was bigger.
func readCapped(r *http.Request) ([]byte, bool) {
	if r.Body == nil {
		return nil, true
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxAuditedBody+1))
	if err != nil || len(buf) > maxAuditedBody {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
		return buf, false
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.ContentLength = int64(len(buf))
	return buf, true
}

// requestUser is the OS user a request runs as: Basic auth, then the
// username query, then the sandbox's default.
func requestUser(r *http.Request, sb *sandbox.Sandbox) string {
	if a := r.Header.Get("Authorization"); a != "" {
		if raw, ok := strings.CutPrefix(a, "Basic "); ok {
			if dec, err := base64.StdEncoding.DecodeString(raw); err == nil {
				if u, _, _ := strings.Cut(string(dec), ":"); u != "" {
					return u
				}
			}
		}
	}
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return sb.DefaultUser
}

func isJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Content-Type"), "json")
}

// unmarshal decodes a Connect message in the request's codec.
func unmarshal(r *http.Request, data []byte, m proto.Message) error {
	if r.Header.Get("Content-Encoding") == "gzip" {
		plain, err := inflate(data)
		if err != nil {
			return err
		}
		data = plain
	}
	if isJSON(r) {
		return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, m)
	}
	return proto.Unmarshal(data, m)
}

// inflate undoes the gzip Connect clients and servers may apply to a
// message (frame flag 0x01, or Content-Encoding on unary calls).
func inflate(msg []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(msg))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return io.ReadAll(io.LimitReader(zr, maxAuditedBody))
}

// envelope splits the first Connect streaming frame off data; a
// compressed frame comes back inflated.
func envelope(data []byte) (flags byte, msg, rest []byte, ok bool) {
	if len(data) < 5 {
		return 0, nil, data, false
	}
	n := binary.BigEndian.Uint32(data[1:5])
	if uint64(len(data)-5) < uint64(n) {
		return 0, nil, data, false
	}
	flags, msg, rest = data[0], data[5:5+n], data[5+n:]
	if flags&0x01 != 0 {
		if plain, err := inflate(msg); err == nil {
			msg = plain
		}
	}
	return flags, msg, rest, true
}

func (g *Gateway) proxyStart(w http.ResponseWriter, r *http.Request, base audit.Event, body []byte, complete bool) {
	ev := base
	ev.Kind, ev.Action = audit.KindProcess, "start"
	var req procpb.StartRequest
	if _, msg, _, ok := envelope(body); complete && ok && unmarshal(r, msg, &req) == nil {
		p := req.GetProcess()
		ev.Fields["cmd"] = p.GetCmd()
		ev.Fields["args"] = p.GetArgs()
		if p.Cwd != nil {
			ev.Fields["cwd"] = p.GetCwd()
		}
		if len(p.GetEnvs()) > 0 {
			// Names only: values are often secrets.
			names := make([]string, 0, len(p.GetEnvs()))
			for k := range p.GetEnvs() {
				names = append(names, k)
			}
			slices.Sort(names)
			ev.Fields["envNames"] = names
		}
		if req.Tag != nil {
			ev.Fields["tag"] = req.GetTag()
		}
		if req.Pty != nil {
			ev.Fields["pty"] = true
		}
	} else {
		ev.Fields["requestBytes"] = len(body)
		ev.Fields["unparsed"] = true
	}
	t := &startTap{ResponseWriter: w, g: g, ctx: r.Context(), ev: ev, json: isJSON(r), started: time.Now()}
	g.proxy.ServeHTTP(t, r)
	t.finish()
}

// startTap reads the Connect frames of a Start response as they pass.
type startTap struct {
	http.ResponseWriter
	g       *Gateway
	ctx     context.Context
	ev      audit.Event
	json    bool
	started time.Time
	status  int

	mu        sync.Mutex
	buf       []byte
	records   []audit.Event // read from the frames being written, recorded once they are sent
	sawStart  bool
	sawEnd    bool
	streamErr string
}

func (t *startTap) WriteHeader(code int) {
	t.status = code
	t.ResponseWriter.WriteHeader(code)
}

func (t *startTap) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (t *startTap) Flush() {
	// Through the controller: a writer beneath may flush only by Unwrap.
	_ = http.NewResponseController(t.ResponseWriter).Flush()
}

func (t *startTap) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.sawEnd && len(t.buf)+len(p) <= 16<<20 {
		t.buf = append(t.buf, p...)
		t.frames()
	}
	n, err := t.ResponseWriter.Write(p)
	if len(t.records) > 0 {
		// The start and the end reach the client first: a database write
		// is no reason for the client to wait. The process has started or
		// ended either way; the record follows at once, in order.
		_ = http.NewResponseController(t.ResponseWriter).Flush()
		for _, ev := range t.records {
			t.g.tap.log.Record(t.ctx, ev)
		}
		t.records = t.records[:0]
	}
	return n, err
}

// frames consumes complete frames from buf. Output frames are dropped
// unread; only start, end and the end-of-stream error matter here.
func (t *startTap) frames() {
	for {
		flags, msg, rest, ok := envelope(t.buf)
		if !ok {
			return
		}
		t.buf = rest
		if flags&0x02 != 0 { // end of stream, with an error if the call failed
			var eos struct {
				Error *struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(msg, &eos) == nil && eos.Error != nil {
				t.streamErr = strings.TrimSpace(eos.Error.Code + ": " + eos.Error.Message)
			}
			continue
		}
		var resp procpb.StartResponse
		var err error
		if t.json {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(msg, &resp)
		} else {
			err = proto.Unmarshal(msg, &resp)
		}
		if err != nil {
			continue
		}
		e := resp.GetEvent()
		switch {
		case e.GetStart() != nil && !t.sawStart:
			t.sawStart = true
			t.ev.Fields["pid"] = e.GetStart().GetPid()
			ev := t.ev
			ev.Decision = audit.Allowed
			t.records = append(t.records, ev)
		case e.GetEnd() != nil && !t.sawEnd:
			t.sawEnd = true
			end := e.GetEnd()
			ev := t.ev
			ev.Action, ev.Decision = "exit", audit.Info
			ev.Fields = cloneFields(t.ev.Fields)
			ev.Fields["exitCode"] = end.GetExitCode()
			ev.Fields["status"] = end.GetStatus()
			ev.Fields["durationMs"] = time.Since(t.started).Milliseconds()
			if end.GetError() != "" {
				ev.Fields["error"] = end.GetError()
			}
			if strings.Contains(end.GetStatus(), "killed") {
				ev.Reason = "the process was killed by a signal; if the sandbox hit its memory limit an \"oom\" limit event follows"
			}
			t.records = append(t.records, ev)
			t.buf = nil
		}
	}
}

// finish records a start that never happened (refused by envd).
func (t *startTap) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sawStart {
		return
	}
	ev := t.ev
	ev.Decision = audit.Denied
	switch {
	case t.streamErr != "":
		ev.Reason = t.streamErr
	case t.status >= 400:
		ev.Reason = "envd answered HTTP " + http.StatusText(t.status)
	default:
		ev.Reason = "the request ended before the process started"
	}
	t.g.tap.log.Record(context.WithoutCancel(t.ctx), ev)
}

func cloneFields(m map[string]any) map[string]any {
	out := make(map[string]any, len(m)+4)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// bodyTap keeps the status and the first bytes of a unary response.
type bodyTap struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (t *bodyTap) WriteHeader(code int) {
	t.status = code
	t.ResponseWriter.WriteHeader(code)
}

func (t *bodyTap) Write(p []byte) (int, error) {
	if t.status == 0 {
		t.status = http.StatusOK
	}
	if room := 64<<10 - t.buf.Len(); room > 0 {
		t.buf.Write(p[:min(room, len(p))])
	}
	return t.ResponseWriter.Write(p)
}

func (t *bodyTap) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func (t *bodyTap) Flush() {
	// Through the controller: a writer beneath may flush only by Unwrap.
	_ = http.NewResponseController(t.ResponseWriter).Flush()
}

// errorMessage extracts the message of a Connect or E2B JSON error body.
func errorMessage(status int, body []byte) string {
	var e struct {
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil && e.Message != "" {
		return e.Message
	}
	return "HTTP " + http.StatusText(status)
}

func (g *Gateway) proxyFS(w http.ResponseWriter, r *http.Request, base audit.Event, body []byte, complete bool) {
	ev := base
	ev.Kind = audit.KindFile
	method := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	var ok bool
	switch method {
	case "Move":
		ev.Action = "move"
		var m fspb.MoveRequest
		if ok = complete && unmarshal(r, body, &m) == nil; ok {
			ev.Fields["from"], ev.Fields["to"] = m.GetSource(), m.GetDestination()
		}
	case "Remove":
		ev.Action = "remove"
		var m fspb.RemoveRequest
		if ok = complete && unmarshal(r, body, &m) == nil; ok {
			ev.Fields["path"] = m.GetPath()
		}
	case "MakeDir":
		ev.Action = "mkdir"
		var m fspb.MakeDirRequest
		if ok = complete && unmarshal(r, body, &m) == nil; ok {
			ev.Fields["path"] = m.GetPath()
		}
	}
	if !ok {
		ev.Fields["unparsed"] = true
	}
	t := &bodyTap{ResponseWriter: w}
	g.proxy.ServeHTTP(t, r)
	g.recordResult(r.Context(), ev, t)
}

func (g *Gateway) recordResult(ctx context.Context, ev audit.Event, t *bodyTap) {
	if t.status/100 == 2 {
		ev.Decision = audit.Allowed
	} else {
		ev.Decision = audit.Denied
		ev.Reason = errorMessage(t.status, t.buf.Bytes())
		if strings.Contains(strings.ToLower(ev.Reason), "no space left") {
			ev.Reason += " (the sandbox's writable disk is full: delete files or create the sandbox with a larger diskSizeMB)"
		}
		ev.Fields["status"] = t.status
	}
	g.tap.log.Record(context.WithoutCancel(ctx), ev)
}

// proxyUpload forwards a /files write unbuffered and records the paths
// envd reports as written (its answer lists them), or the refusal.
func (g *Gateway) proxyUpload(w http.ResponseWriter, r *http.Request, base audit.Event) {
	ev := base
	ev.Kind, ev.Action = audit.KindFile, "write"
	if p := r.URL.Query().Get("path"); p != "" {
		ev.Fields["path"] = p
	}
	t := &bodyTap{ResponseWriter: w}
	g.proxy.ServeHTTP(t, r)
	if t.status/100 == 2 {
		var entries []struct {
			Path string `json:"path"`
		}
		if json.Unmarshal(t.buf.Bytes(), &entries) == nil && len(entries) > 0 {
			for _, e := range entries {
				one := ev
				one.Fields = cloneFields(ev.Fields)
				one.Fields["path"] = e.Path
				one.Decision = audit.Allowed
				g.tap.log.Record(context.WithoutCancel(r.Context()), one)
			}
			return
		}
	}
	g.recordResult(r.Context(), ev, t)
}
