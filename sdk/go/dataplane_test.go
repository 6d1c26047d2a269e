package agentbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem"
	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/api/gen/rest"
)

// scriptedEnvd plays back fixed process events and keeps /files in memory.
// It checks the data-plane headers; the real envd is tested end to end.
type scriptedEnvd struct {
	processconnect.UnimplementedProcessHandler
	filesystemconnect.UnimplementedFilesystemHandler

	t       *testing.T
	mu      sync.Mutex
	files   map[string][]byte
	started *process.StartRequest
	user    string
	timeout string
	killed  uint32
}

func (e *scriptedEnvd) Start(ctx context.Context, req *connect.Request[process.StartRequest], s *connect.ServerStream[process.StartResponse]) error {
	e.mu.Lock()
	e.started = req.Msg
	e.user = req.Header().Get("Authorization")
	e.timeout = req.Header().Get("Connect-Timeout-Ms")
	e.mu.Unlock()
	events := []*process.ProcessEvent{
		{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte("out1 ")}}}},
		{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte("oops")}}}},
		{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte("out2")}}}},
		{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}},
	}
	for _, ev := range events {
		if err := s.Send(&process.StartResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}

func (e *scriptedEnvd) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	if req.Msg.GetProcess().GetPid() != 42 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	e.mu.Lock()
	e.killed = req.Msg.GetProcess().GetPid()
	e.mu.Unlock()
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (e *scriptedEnvd) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	e.mu.Lock()
	b, ok := e.files[req.Msg.GetPath()]
	e.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("file not found"))
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: &filesystem.EntryInfo{
		Name: req.Msg.GetPath(), Type: filesystem.FileType_FILE_TYPE_FILE, Size: int64(len(b)), Mode: 0o644,
	}}), nil
}

func (e *scriptedEnvd) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	if req.Msg.GetPath() == "exists" {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory exists"))
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{}), nil
}

func (e *scriptedEnvd) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], s *connect.ServerStream[filesystem.WatchDirResponse]) error {
	if err := s.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	for _, name := range []string{"a.txt", "b.txt"} {
		ev := &filesystem.FilesystemEvent{Name: name, Type: filesystem.EventType_EVENT_TYPE_CREATE}
		if err := s.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

func (e *scriptedEnvd) serveFiles(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	e.mu.Lock()
	defer e.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		b, ok := e.files[path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"code": 404, "message": "path '" + path + "' does not exist"})
			return
		}
		_, _ = w.Write(b)
	case http.MethodPost:
		if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
			e.t.Errorf("upload content type %q", ct)
		}
		b, _ := io.ReadAll(r.Body)
		e.files[path] = b
		_ = json.NewEncoder(w).Encode([]map[string]string{{"path": "/home/user/" + path, "name": path, "type": "file"}})
	}
}

func newScriptedSandbox(t *testing.T) (*Sandbox, *scriptedEnvd) {
	t.Helper()
	envd := &scriptedEnvd{t: t, files: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(envd))
	mux.Handle(filesystemconnect.NewFilesystemHandler(envd))
	mux.HandleFunc("/files", envd.serveFiles)
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	gateway := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The gateway routes by these headers; a sandbox it does not know is a 502.
		if r.Header.Get("E2b-Sandbox-Id") != "iabc" || r.Header.Get("E2b-Sandbox-Port") != "49983" {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(`{"code":502,"message":"The sandbox was not found"}`))
			return
		}
		if r.URL.Path != "/health" && r.Header.Get("X-Access-Token") != "tok" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"code":401,"message":"unauthorized access"}`))
			return
		}
		mux.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(gateway)
	t.Cleanup(srv.Close)
	c := New(WithAPIURL("http://127.0.0.1:1"), WithSandboxURL(srv.URL))
	return c.newSandbox(rest.Sandbox{SandboxID: "iabc", EnvdAccessToken: "tok"}), envd
}

func TestCommandsRun(t *testing.T) {
	sbx, envd := newScriptedSandbox(t)
	ctx := context.Background()
	var streamed strings.Builder
	res, err := sbx.Commands.Run(ctx, "echo hi", WithUser("root"), WithCwd("/tmp"),
		WithEnvs(map[string]string{"A": "1"}), WithOnStdout(func(b []byte) { streamed.Write(b) }))
	var exitErr *CommandExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode != 3 {
		t.Fatalf("err = %v, want exit code 3", err)
	}
	if res == nil || res.Stdout != "out1 out2" || res.Stderr != "oops" || res.ExitCode != 3 {
		t.Errorf("result = %+v", res)
	}
	if !strings.Contains(err.Error(), "oops") {
		t.Errorf("error %q lacks stderr", err)
	}
	if streamed.String() != "out1 out2" {
		t.Errorf("OnStdout saw %q", streamed.String())
	}
	p := envd.started.GetProcess()
	if p.GetCmd() != "/bin/bash" || strings.Join(p.GetArgs(), " ") != "-l -c echo hi" || p.GetCwd() != "/tmp" ||
		p.GetEnvs()["A"] != "1" || envd.started.GetStdin() {
		t.Errorf("start request = %v", envd.started)
	}
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:")); envd.user != want {
		t.Errorf("Authorization = %q, want %q", envd.user, want)
	}
	if envd.timeout != "" {
		t.Errorf("Connect-Timeout-Ms = %q without a timeout", envd.timeout)
	}
}

// TestCommandsOutputLimit: past the limit output is dropped from the
// result (and flagged), not from the callbacks.
func TestCommandsOutputLimit(t *testing.T) {
	sbx, _ := newScriptedSandbox(t)
	var streamed strings.Builder
	res, err := sbx.Commands.Run(t.Context(), "echo hi", WithOutputLimit(6), WithOnStdout(func(b []byte) { streamed.Write(b) }))
	var exitErr *CommandExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("err = %v, want the exit error", err)
	}
	if res.Stdout != "out1 o" || res.Stderr != "oops" || !res.Truncated || streamed.String() != "out1 out2" {
		t.Errorf("result = %+v, streamed %q", res, streamed.String())
	}
	res, _ = sbx.Commands.Run(t.Context(), "echo hi", WithOutputLimit(9))
	if res.Stdout != "out1 out2" || res.Truncated {
		t.Errorf("within the limit: %+v", res)
	}
}

// TestMessageLimit: a data-plane message past WithMessageLimit fails the
// call instead of being read.
func TestMessageLimit(t *testing.T) {
	sbx, _ := newScriptedSandbox(t)
	c := New(WithAPIURL("http://127.0.0.1:1"), WithSandboxURL(sbx.client.sandboxURL), WithMessageLimit(16))
	sbx = c.newSandbox(rest.Sandbox{SandboxID: sbx.ID, EnvdAccessToken: sbx.EnvdAccessToken})
	if _, err := sbx.Commands.Run(t.Context(), "echo hi"); err == nil || !strings.Contains(err.Error(), "larger than configured max 16") {
		t.Fatalf("err = %v, want the message refused for its size", err)
	}
}

func TestCommandsStartKill(t *testing.T) {
	sbx, envd := newScriptedSandbox(t)
	ctx := context.Background()
	h, err := sbx.Commands.Start(ctx, "sleep 1", WithStdin(), WithTimeout(60_000_000_000))
	if err != nil {
		t.Fatal(err)
	}
	if h.Pid != 42 {
		t.Errorf("pid = %d", h.Pid)
	}
	if err := h.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if envd.killed != 42 {
		t.Errorf("kill not delivered")
	}
	if err := sbx.Commands.Kill(ctx, 7); !errors.Is(err, ErrNotFound) {
		t.Errorf("kill unknown pid = %v, want ErrNotFound", err)
	}
	if _, err := h.Wait(ctx); err == nil {
		t.Error("exit 3 reported as success")
	}
	if !envd.started.GetStdin() || envd.timeout == "" {
		t.Errorf("stdin %v, Connect-Timeout-Ms %q", envd.started.GetStdin(), envd.timeout)
	}
}

func TestFiles(t *testing.T) {
	sbx, _ := newScriptedSandbox(t)
	ctx := context.Background()
	info, err := sbx.Files.Write(ctx, "x.txt", []byte("data"))
	if err != nil || info.Path != "/home/user/x.txt" {
		t.Fatalf("write = %+v, %v", info, err)
	}
	if _, err := sbx.Files.WriteStream(ctx, "big.bin", io.LimitReader(neverEnding('z'), 1<<20)); err != nil {
		t.Fatal(err)
	}
	b, err := sbx.Files.Read(ctx, "x.txt")
	if err != nil || string(b) != "data" {
		t.Errorf("read = %q, %v", b, err)
	}
	big, err := sbx.Files.Read(ctx, "big.bin")
	if err != nil || len(big) != 1<<20 {
		t.Errorf("streamed write read back %d bytes, %v", len(big), err)
	}
	_, err = sbx.Files.Read(ctx, "nope")
	var apiErr *APIError
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &apiErr) || !strings.Contains(apiErr.Message, "does not exist") {
		t.Errorf("read missing = %v", err)
	}
	if ok, err := sbx.Files.Exists(ctx, "x.txt"); !ok || err != nil {
		t.Errorf("exists = %v, %v", ok, err)
	}
	if ok, err := sbx.Files.Exists(ctx, "nope"); ok || err != nil {
		t.Errorf("exists missing = %v, %v", ok, err)
	}
	st, err := sbx.Files.Stat(ctx, "x.txt")
	if err != nil || st.Type != FileTypeFile || st.Size != 4 || st.Mode != 0o644 {
		t.Errorf("stat = %+v, %v", st, err)
	}
	if created, err := sbx.Files.MakeDir(ctx, "exists"); created || err != nil {
		t.Errorf("mkdir existing = %v, %v", created, err)
	}
	if created, err := sbx.Files.MakeDir(ctx, "new"); !created || err != nil {
		t.Errorf("mkdir new = %v, %v", created, err)
	}

	events := make(chan Event, 4)
	w, err := sbx.Files.Watch(ctx, "/home/user", false, func(e Event) { events <- e })
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a.txt", "b.txt"} {
		if e := <-events; e.Name != want || e.Type != EventCreate {
			t.Errorf("event = %+v, want create %s", e, want)
		}
	}
	w.Stop()
	if w.Err() != nil {
		t.Errorf("watch error after Stop: %v", w.Err())
	}
}

func TestIsRunningAndToken(t *testing.T) {
	sbx, _ := newScriptedSandbox(t)
	ctx := context.Background()
	if ok, err := sbx.IsRunning(ctx); !ok || err != nil {
		t.Errorf("running sandbox: %v, %v", ok, err)
	}
	gone := sbx.client.newSandbox(rest.Sandbox{SandboxID: "igone", EnvdAccessToken: "tok"})
	gone.dp.baseURL = sbx.dp.baseURL
	if ok, err := gone.IsRunning(ctx); ok || err != nil {
		t.Errorf("unknown sandbox: %v, %v", ok, err)
	}
	wrong := sbx.client.newSandbox(rest.Sandbox{SandboxID: "iabc", EnvdAccessToken: "bad"})
	if _, err := wrong.Files.Read(ctx, "x.txt"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("wrong token = %v, want ErrUnauthorized", err)
	}
	if _, err := wrong.Commands.Run(ctx, "true"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("wrong token rpc = %v, want ErrUnauthorized", err)
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
