package fake

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/process"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/envdclient"
)

// envdState is what one sandbox's envd holds in memory (and what a memory
// checkpoint keeps of it).
type envdState struct {
	Initialized bool
	Token       string
	Env         map[string]string
	User        string
	Workdir     string
	MaxCommand  int64
	StartCmd    string
	Inits       int
	Files       map[string][]byte
}

// Run is one command the fake envd ran.
type Run struct {
	Sandbox string
	Cmd     string
	User    string
	Workdir string
	Env     map[string]string
}

// Envd answers as the envd of every running fake container: /health,
// /init, /files and the process service's Start. A command "exit N" exits
// with N; "simulate oom|pids|disk-full" makes the container hit that limit
// (Runtime.Hit) and exits 137 (oom) or 1; any other prints "ok" and exits 0.
type Envd struct {
	h   *Host
	srv *httptest.Server

	mu   sync.Mutex
	up   map[string]*envdState
	runs []Run
}

type idKey struct{}

func newEnvd(h *Host) *Envd {
	e := &Envd{h: h, up: map[string]*envdState{}}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{e: e}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /init", e.init)
	mux.HandleFunc("/files", e.files)
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.Host)
		ip, err := netip.ParseAddr(host)
		id, ok := "", false
		if err == nil {
			id, ok = h.Network.idOf(ip)
		}
		if !ok || e.state(id) == nil {
			// Nothing listens there: as a refused connection would.
			http.Error(w, "no envd at "+r.Host, http.StatusBadGateway)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), idKey{}, id)))
	}))
	return e
}

// Client is the http.Client the manager must use: every connection goes to
// the fake envd, which tells sandboxes apart by the address asked for.
func (e *Envd) Client() *http.Client {
	addr := e.srv.Listener.Addr().String()
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
}

// boot starts envd for id: fresh (mem nil) or restored from a memory image.
func (e *Envd) boot(id string, mem *envdState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := &envdState{Files: map[string][]byte{}}
	if mem != nil {
		c := *mem
		c.Env, c.Files = maps.Clone(mem.Env), maps.Clone(mem.Files)
		st = &c
	}
	e.up[id] = st
}

func (e *Envd) stop(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.up, id)
}

// state returns a copy of id's envd state, nil when it is not running.
func (e *Envd) state(id string) *envdState {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.up[id]
	if !ok {
		return nil
	}
	c := *st
	c.Env, c.Files = maps.Clone(st.Env), maps.Clone(st.Files)
	return &c
}

// Token is the access token id's envd checks ("" none); ok false when its
// envd is not running.
func (e *Envd) Token(id string) (token string, ok bool) {
	st := e.state(id)
	if st == nil {
		return "", false
	}
	return st.Token, true
}

// Env returns the environment id's envd gives processes.
func (e *Envd) Env(id string) map[string]string {
	if st := e.state(id); st != nil {
		return st.Env
	}
	return nil
}

// MaxCommand returns the command cap id's envd enforces, in seconds.
func (e *Envd) MaxCommand(id string) int64 {
	if st := e.state(id); st != nil {
		return st.MaxCommand
	}
	return 0
}

// Inits counts the /init calls id's envd accepted.
func (e *Envd) Inits(id string) int {
	if st := e.state(id); st != nil {
		return st.Inits
	}
	return 0
}

// File returns a file written through /files.
func (e *Envd) File(id, path string) ([]byte, bool) {
	st := e.state(id)
	if st == nil {
		return nil, false
	}
	b, ok := st.Files[path]
	return b, ok
}

// Runs returns the commands run so far.
func (e *Envd) Runs() []Run {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.runs)
}

// authorised checks the access token of a call to id's envd.
func (e *Envd) authorised(id string, h http.Header) bool {
	st := e.state(id)
	return st != nil && (st.Token == "" || h.Get("X-Access-Token") == st.Token)
}

func (e *Envd) init(w http.ResponseWriter, r *http.Request) {
	id := r.Context().Value(idKey{}).(string)
	if err := e.h.call("envd.init", id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var body envdclient.Init
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.up[id]
	// As envd: the first /init sets the token, later ones must prove it.
	if st.Initialized && st.Token != "" && r.Header.Get("X-Access-Token") != st.Token {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	st.Initialized = true
	st.Inits++
	if body.EnvVars != nil {
		st.Env = maps.Clone(body.EnvVars)
	}
	if body.AccessToken != nil {
		st.Token = *body.AccessToken
	}
	if body.DefaultUser != "" {
		st.User = body.DefaultUser
	}
	if body.DefaultWorkdir != "" {
		st.Workdir = body.DefaultWorkdir
	}
	if body.MaxCommandSeconds > 0 {
		st.MaxCommand = body.MaxCommandSeconds
	}
	if body.StartCmd != "" {
		st.StartCmd = body.StartCmd
	}
	w.WriteHeader(http.StatusNoContent)
}

func (e *Envd) files(w http.ResponseWriter, r *http.Request) {
	id := r.Context().Value(idKey{}).(string)
	if !e.authorised(id, r.Header) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	path := r.URL.Query().Get("path")
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.up[id]
	switch r.Method {
	case http.MethodGet:
		b, ok := st.Files[path]
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		_, _ = w.Write(b)
	case http.MethodPost:
		b, _ := io.ReadAll(r.Body)
		st.Files[path] = b
		w.WriteHeader(http.StatusOK)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

type processService struct {
	processconnect.UnimplementedProcessHandler
	e *Envd
}

var (
	exitCmd     = regexp.MustCompile(`^exit (\d+)$`)
	simulateCmd = regexp.MustCompile(`^simulate (oom|pids|disk-full)$`)
)

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	id := ctx.Value(idKey{}).(string)
	if !p.e.authorised(id, req.Header()) {
		return connect.NewError(connect.CodeUnauthenticated, nil)
	}
	cfg := req.Msg.GetProcess()
	cmd := strings.Join(cfg.GetArgs(), " ")
	if a := cfg.GetArgs(); len(a) == 2 && a[0] == "-c" {
		cmd = a[1]
	}
	user := ""
	if v, ok := strings.CutPrefix(req.Header().Get("Authorization"), "Basic "); ok {
		if b, err := base64.StdEncoding.DecodeString(v); err == nil {
			user, _, _ = strings.Cut(string(b), ":")
		}
	}
	p.e.mu.Lock()
	p.e.runs = append(p.e.runs, Run{Sandbox: id, Cmd: cmd, User: user, Workdir: cfg.GetCwd(), Env: maps.Clone(cfg.GetEnvs())})
	p.e.mu.Unlock()
	code := 0
	if m := exitCmd.FindStringSubmatch(cmd); m != nil {
		code, _ = strconv.Atoi(m[1])
	} else if m := simulateCmd.FindStringSubmatch(cmd); m != nil {
		p.e.h.Runtime.Hit(id, m[1])
		code = 1
		if m[1] == "oom" {
			code = 137
		}
	} else if err := stream.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Data{
		Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte("ok\n")}},
	}}}); err != nil {
		return err
	}
	return stream.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{
		End: &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true},
	}}})
}
