// Package interpreter is the stateful code interpreter that runs inside
// sandboxes of interpreter templates: an HTTP server on port 49999 speaking
// the E2B code-interpreter protocol (POST /execute streaming NDJSON,
// /contexts, /health) in front of real kernels: Debian's ipykernel for
// Python and IRkernel for R (Jupyter protocol over ZeroMQ), a Node kernel
// for JavaScript and TypeScript, a kernel on the JDK's jshell for Java, and
// a persistent bash.
package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultPort is where the interpreter listens inside the sandbox.
const DefaultPort = 49999

// Options configure a Server. Zero fields take the defaults in brackets.
type Options struct {
	Logger *slog.Logger
	// StateDir receives the kernels' support files and connection files
	// [/.agentbox/interpreter].
	StateDir string
	// Cwd is the working directory of contexts that name none [the
	// process's working directory].
	Cwd string
	// Python, Node, R, Java and Bash are the language runtimes
	// [/usr/bin/python3, node, R, java, bash]. Python must have ipykernel,
	// R IRkernel, and Java be a JDK (jshell's compiler).
	Python, Node, R, Java, Bash string
	// KernelLog receives what kernel processes print outside cells (never
	// user output) [stderr].
	KernelLog io.Writer
	// MaxOutputBytes caps the stdout+stderr of one execution; the rest is
	// dropped after a truncation marker [16 MiB].
	MaxOutputBytes int64
	// DefaultLanguages get a context each at Start [python, javascript].
	DefaultLanguages []string
	// EnvdURL is the sandbox's envd (e.g. http://127.0.0.1:49983). When
	// set, every route but GET /health requires the X-Access-Token envd
	// accepts, so in a secure sandbox only holders of its token run code or
	// touch contexts. Empty: no check.
	EnvdURL string
}

// Server is the interpreter: its contexts and their kernels.
type Server struct {
	opts  Options
	log   *slog.Logger
	files layout

	mu       sync.Mutex
	contexts []*codeContext          // creation order, which GET /contexts keeps
	defaults map[string]*codeContext // language → default context
}

// New prepares a server; Start boots the default contexts.
func New(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StateDir == "" {
		opts.StateDir = "/.agentbox/interpreter"
	}
	if opts.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("interpreter cwd: %w", err)
		}
		opts.Cwd = wd
	}
	if opts.Python == "" {
		// Debian's python3, which has ipykernel, not whatever is first on PATH.
		opts.Python = "/usr/bin/python3"
	}
	if opts.Node == "" {
		opts.Node = "node"
	}
	if opts.R == "" {
		opts.R = "R"
	}
	if opts.Java == "" {
		opts.Java = "java"
	}
	if opts.Bash == "" {
		opts.Bash = "bash"
	}
	if opts.KernelLog == nil {
		opts.KernelLog = os.Stderr
	}
	if opts.MaxOutputBytes == 0 {
		opts.MaxOutputBytes = 16 << 20
	}
	if opts.DefaultLanguages == nil {
		opts.DefaultLanguages = []string{"python", "javascript"}
	}
	files, err := writeAssets(opts.StateDir)
	if err != nil {
		return nil, err
	}
	return &Server{opts: opts, log: opts.Logger, files: files, defaults: map[string]*codeContext{}}, nil
}

// Start creates the default contexts; their kernels boot in the
// background, and the first execution on one waits for it.
func (s *Server) Start(ctx context.Context) {
	for _, l := range s.opts.DefaultLanguages {
		s.defaultContext(ctx, normalizeLanguage(l))
	}
}

// Close kills every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	all := slices.Clone(s.contexts)
	s.contexts = nil
	s.defaults = map[string]*codeContext{}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Go(c.close)
	}
	wg.Wait()
}

func (s *Server) starter(language, cwd string) func(context.Context) (kernel, error) {
	return func(ctx context.Context) (kernel, error) {
		// A kernel that is not up by then never will be (a cold Python
		// start is about a second).
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		t0 := time.Now()
		var k kernel
		var err error
		switch language {
		case "python":
			k, err = startPython(ctx, pythonConfig{Python: s.opts.Python, IPythonDir: s.files.IPythonDir,
				RuntimeDir: s.files.RuntimeDir, Cwd: cwd, Log: s.opts.KernelLog})
		case "javascript", "typescript":
			k, err = startNode(ctx, nodeConfig{Node: s.opts.Node, Script: s.files.NodeKernel, Cwd: cwd,
				TypeScript: language == "typescript", Log: s.opts.KernelLog})
		case "r":
			k, err = startR(ctx, rConfig{R: s.opts.R, RuntimeDir: s.files.RuntimeDir, Cwd: cwd, Log: s.opts.KernelLog})
		case "java":
			k, err = startJava(ctx, javaConfig{Java: s.opts.Java, Source: s.files.JavaKernel,
				ClassDir: s.files.JavaClasses, Cwd: cwd, Log: s.opts.KernelLog})
		case "bash":
			k, err = startBash(ctx, bashConfig{Bash: s.opts.Bash, Cwd: cwd, RuntimeDir: s.files.RuntimeDir})
		default:
			err = fmt.Errorf("unsupported language %q", language)
		}
		if err != nil {
			s.log.Error("kernel start failed", "language", language, "err", err)
			return nil, err
		}
		s.log.Info("kernel started", "language", language, "pid", k.PID(), "took", time.Since(t0).Round(time.Millisecond))
		return k, nil
	}
}

// newContext registers a context and boots its kernel in the background.
func (s *Server) newContext(language, cwd string) *codeContext {
	c := newCodeContext(language, cwd, s.starter(language, cwd))
	s.mu.Lock()
	s.contexts = append(s.contexts, c)
	s.mu.Unlock()
	go func() { _ = c.boot(context.Background()) }()
	return c
}

func (s *Server) defaultContext(_ context.Context, language string) *codeContext {
	s.mu.Lock()
	c := s.defaults[language]
	s.mu.Unlock()
	if c != nil {
		return c
	}
	c = newCodeContext(language, s.opts.Cwd, s.starter(language, s.opts.Cwd))
	s.mu.Lock()
	if existing := s.defaults[language]; existing != nil {
		s.mu.Unlock()
		return existing
	}
	s.defaults[language] = c
	s.contexts = append(s.contexts, c)
	s.mu.Unlock()
	go func() { _ = c.boot(context.Background()) }()
	return c
}

func (s *Server) lookup(id string) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.contexts {
		if c.ID == id {
			return c
		}
	}
	return nil
}

func (s *Server) remove(c *codeContext) {
	s.mu.Lock()
	s.contexts = slices.DeleteFunc(s.contexts, func(x *codeContext) bool { return x == c })
	for l, d := range s.defaults {
		if d == c {
			delete(s.defaults, l)
		}
	}
	s.mu.Unlock()
	c.close()
}

// Handler serves the E2B code-interpreter protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "OK") })
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("POST /contexts", s.handleCreateContext)
	mux.HandleFunc("GET /contexts", s.handleListContexts)
	mux.HandleFunc("POST /contexts/{id}/restart", s.handleRestartContext)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleRemoveContext)
	return requireToken(s.opts.EnvdURL, mux)
}

// ListenAndServe serves on addr until ctx ends, then kills the kernels.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("interpreter listening", "addr", ln.Addr().String())
	s.Start(ctx)
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			err = srv.Close()
		}
	}
	s.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
	// Timeout (seconds) is an agentbox extension: the code is interrupted
	// when it runs longer. E2B clients time out on their side, which ends
	// the request and interrupts the code just the same.
	Timeout float64 `json:"timeout"`
}

const maxCodeBytes = 16 << 20

func unsupportedLanguage(l string) string {
	return fmt.Sprintf("unsupported language %q: available languages are %s", l, strings.Join(Languages, ", "))
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCodeBytes)).Decode(&req); err != nil {
		http.Error(w, "invalid request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Code == nil {
		http.Error(w, "invalid request body: code is required", http.StatusBadRequest)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		http.Error(w, "Only one of context_id or language can be provided", http.StatusBadRequest)
		return
	}
	if err := validEnv(req.EnvVars); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Timeout < 0 {
		http.Error(w, "timeout must not be negative", http.StatusBadRequest)
		return
	}
	var c *codeContext
	if req.ContextID != "" {
		if c = s.lookup(req.ContextID); c == nil {
			http.Error(w, fmt.Sprintf("Context %s not found", req.ContextID), http.StatusNotFound)
			return
		}
	} else {
		lang := normalizeLanguage(req.Language)
		if lang == "" {
			http.Error(w, unsupportedLanguage(req.Language), http.StatusBadRequest)
			return
		}
		c = s.defaultContext(r.Context(), lang)
	}

	ctx := r.Context()
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.Timeout*float64(time.Second)))
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out := newStreamSink(w, s.opts.MaxOutputBytes, cancel)
	stopKeepalive := out.keepalive(5 * time.Second)
	c.execute(ctx, *req.Code, req.EnvVars, out)
	stopKeepalive()
	if req.Timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) && !out.sawError() {
		out.Error("TimeoutError", fmt.Sprintf("execution exceeded its timeout of %gs and was interrupted", req.Timeout), "")
	}
	out.emit(map[string]any{"type": "end_of_execution"})
}

type contextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) {
	var req contextRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		http.Error(w, "invalid request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	lang := normalizeLanguage(req.Language)
	if lang == "" {
		http.Error(w, unsupportedLanguage(req.Language), http.StatusBadRequest)
		return
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = s.opts.Cwd
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		http.Error(w, fmt.Sprintf("cwd %q is not a directory in the sandbox", cwd), http.StatusBadRequest)
		return
	}
	c := s.newContext(lang, cwd)
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	if err := c.waitReady(ctx); err != nil {
		s.remove(c)
		http.Error(w, "context did not start: "+err.Error(), http.StatusInternalServerError)
		return
	}
	c.mu.Lock()
	dead := c.dead
	c.mu.Unlock()
	if dead != "" {
		s.remove(c)
		http.Error(w, "context did not start: "+dead, http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := slices.Clone(s.contexts)
	s.mu.Unlock()
	if list == nil {
		list = []*codeContext{}
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleRestartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.lookup(id)
	if c == nil {
		http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	if err := c.restart(ctx); err != nil {
		http.Error(w, fmt.Sprintf("restart context %s: %v", id, err), http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

func (s *Server) handleRemoveContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.lookup(id)
	if c == nil {
		http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
		return
	}
	s.remove(c)
	writeJSON(w, http.StatusOK, nil)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
