// Package envd is the daemon that runs inside every sandbox: it starts and
// drives processes (process.Process), inspects and watches files
// (filesystem.Filesystem), moves file contents over HTTP /files, and answers
// /init, /health, /envs and /metrics, all wire-compatible with E2B's envd.
package envd

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/filesystem/filesystemconnect"
	"github.com/agentbox/agentbox/api/gen/process/processconnect"
	"github.com/agentbox/agentbox/internal/envdclient"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Version is the envd protocol version reported to clients; SDKs gate
// features on it (e.g. >= 0.6.4 for network-mount watches).
const Version = "0.6.13"

// DefaultPort is where envd listens inside the sandbox.
const DefaultPort = 49983

// maxUnaryBytes bounds unary RPC messages.
const maxUnaryBytes = 16 << 20

// Options configure a Server.
type Options struct {
	// Logger receives request and process logs; nil means slog.Default().
	Logger *slog.Logger
	// PasswdFile and GroupFile are the account databases; empty means /etc/passwd and /etc/group.
	PasswdFile, GroupFile string
	// StartLogDir receives start.log, the template start command's output;
	// empty means /.agentbox/log.
	StartLogDir string
	// LocalInit accepts POST /init from this machine's own addresses.
	// Inside a sandbox those are the sandbox's code, so envd refuses them
	// by default: only the agentbox server, which reaches envd over the
	// sandbox's network link, configures it. For tests.
	LocalInit bool
	// Reaper is the envd binary that runs each command under "envd reap"
	// (reaper_linux.go) [this executable]; "-" runs commands directly,
	// without whole-tree kills.
	Reaper string
	// Children records the processes the server starts, so that the
	// orphan reaper of envd as init (Children.ReapOrphans) leaves their
	// exit statuses to them; nil: a record of the server's own.
	Children *Children
}

// Server holds envd's state: the /init configuration and the running
// processes and watchers. Handler returns its HTTP surface.
type Server struct {
	log   *slog.Logger
	users userDB

	mu             sync.RWMutex
	initialized    bool
	token          string
	envVars        map[string]string
	defaultUser    string
	defaultWorkdir string
	maxCommand     time.Duration // cap on every process's lifetime; 0 = none

	procs    *processTable
	watchers *watcherTable
	metrics  *metricsSampler

	startOnce   sync.Once // the template start command runs once per sandbox
	startLogDir string
	localInit   bool
	reaper      string // envd binary for "envd reap"; "" = none
	spares      *spares
	children    *Children // every process the server starts goes through it
}

// NewServer returns a Server with no /init configuration: no token, user root.
func NewServer(opts Options) *Server {
	s := &Server{
		log:         opts.Logger,
		users:       defaultUserDB(),
		envVars:     map[string]string{},
		defaultUser: "root",
		procs:       newProcessTable(),
		watchers:    newWatcherTable(),
		metrics:     newMetricsSampler(),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if opts.PasswdFile != "" {
		s.users.passwd = opts.PasswdFile
	}
	if opts.GroupFile != "" {
		s.users.group = opts.GroupFile
	}
	s.startLogDir = opts.StartLogDir
	s.localInit = opts.LocalInit
	switch s.reaper = opts.Reaper; s.reaper {
	case "-":
		s.reaper = ""
	case "":
		if exe, err := os.Executable(); err == nil {
			s.reaper = exe
		}
	}
	if s.startLogDir == "" {
		s.startLogDir = StartLogDir
	}
	s.children = opts.Children
	if s.children == nil {
		s.children = NewChildren()
	}
	s.spares = &spares{exe: s.reaper, children: s.children}
	return s
}

// Close stops watchers and the spare reaper. Processes keep running: they
// belong to the sandbox.
func (s *Server) Close() {
	s.watchers.closeAll()
	s.spares.close()
}

// Handler returns envd's routes behind the access-token middleware.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxUnaryBytes)}
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /init", s.handleInit)
	mux.HandleFunc("GET /envs", s.handleEnvs)
	// The code interpreter asks here whether a request's token is this
	// sandbox's (the middleware has judged it by then).
	mux.HandleFunc("GET /auth", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("GET /files", s.handleDownload)
	mux.HandleFunc("POST /files", s.handleUpload)
	return s.authMiddleware(mux)
}

func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	// One definition with the manager that sends it.
	var req envdclient.Init
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid init body: %v", err))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The first /init sets the token; later ones must prove they know it.
	if s.initialized && s.token != "" && !tokenEqual(r.Header.Get("X-Access-Token"), s.token) {
		writeUnauthorized(w, "")
		return
	}
	s.initialized = true
	s.spares.forget()
	if req.EnvVars != nil {
		s.envVars = maps.Clone(req.EnvVars)
	}
	if req.AccessToken != nil {
		s.token = *req.AccessToken
	}
	if req.DefaultUser != "" {
		s.defaultUser = req.DefaultUser
	}
	if req.DefaultWorkdir != "" {
		s.defaultWorkdir = req.DefaultWorkdir
	}
	if req.MaxCommandSeconds > 0 {
		s.maxCommand = time.Duration(req.MaxCommandSeconds) * time.Second
	}
	s.log.Info("init", "envVars", len(s.envVars), "secure", s.token != "", "defaultUser", s.defaultUser, "defaultWorkdir", s.defaultWorkdir)
	if req.StartCmd != "" {
		// After the env vars are set (the command gets them); it starts
		// in the background, so creation does not wait for it.
		go s.startTemplateCommand(req.StartCmd, s.defaultWorkdir)
	}
	w.Header().Set("X-Envd-Version", Version)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleEnvs(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.env())
}

// env returns a copy of the /init environment.
func (s *Server) env() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return maps.Clone(s.envVars)
}

func (s *Server) currentToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.token
}

func (s *Server) defaults() (user, workdir string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultUser, s.defaultWorkdir
}

// authMiddleware enforces the access token on everything but /health, /init
// (which checks it itself) and /files (which also accepts signatures), and
// keeps /init for the server: from inside the sandbox (loopback or one of
// the sandbox's own addresses) it is refused, so sandbox code cannot lift
// its command lifetime cap, set the token of a sandbox created without
// one, or change the environment of later commands.
func (s *Server) authMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/init" && !s.localInit && fromThisHost(r.RemoteAddr) {
			writeJSONError(w, http.StatusForbidden, "POST /init configures envd for the agentbox server only; it is refused from inside the sandbox")
			return
		}
		exempt := (r.Method == http.MethodGet && r.URL.Path == "/health") ||
			(r.Method == http.MethodPost && r.URL.Path == "/init") ||
			((r.Method == http.MethodGet || r.Method == http.MethodPost) && r.URL.Path == "/files")
		if !exempt {
			if tok := s.currentToken(); tok != "" && !tokenEqual(r.Header.Get("X-Access-Token"), tok) {
				writeUnauthorized(w, "")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// fromThisHost reports whether a peer address is loopback or one of this
// network namespace's own addresses, i.e. a process on this side of the
// sandbox's link. Unknown answers count as local (refused).
func fromThisHost(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return true
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func tokenEqual(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

const unauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

func writeUnauthorized(w http.ResponseWriter, msg string) {
	if msg == "" {
		msg = unauthorizedMessage
	}
	writeJSONError(w, http.StatusUnauthorized, msg)
}

// userFromRequest selects the OS user: Basic auth "user:" first, then the
// given fallback (the username query on /files), then the /init default.
func (s *Server) userFromHeader(h http.Header, fallback string) (*User, error) {
	name := fallback
	if a := h.Get("Authorization"); a != "" {
		u, _, ok := (&http.Request{Header: http.Header{"Authorization": {a}}}).BasicAuth()
		if !ok {
			return nil, fmt.Errorf("malformed Authorization header: %w", errdefs.ErrUnauthenticated)
		}
		if u != "" {
			name = u
		}
	}
	if name == "" {
		name, _ = s.defaults()
	}
	u, err := s.users.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", name, errdefs.ErrUnauthenticated)
	}
	return u, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONError writes E2B's HTTP error shape {"code":N,"message":"..."}.
func writeJSONError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"code": code, "message": msg})
}

// connectError maps errdefs sentinels and os errors to Connect codes.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, os.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrConflict), errors.Is(err, os.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, os.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrResourceExhausted), isNoSpace(err):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, errdefs.ErrTooLarge):
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, errors.New(strings.TrimSpace(err.Error())))
}
