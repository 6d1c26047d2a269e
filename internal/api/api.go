// Package api serves agentbox's control plane: the E2B REST API (same paths,
// JSON names and status codes as E2B's, so the official SDKs work unchanged),
// with API-key authentication and per-team isolation.
//
// It is the one E2B API layer of both server modes: the sandbox routes
// (create, list, info, kill, timeout, connect, pause, resume, snapshots)
// read and check requests, map errors and shape answers here, and call a
// Backend: LocalBackend (this host's manager) for `agentbox serve`, the
// Kubernetes tier (internal/kubeapi) for `agentbox serve --kubernetes`. The
// routes only a local server has (templates, builds, volumes, logs, the
// dashboard, MCP) are served by New's server alone.
package api

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
	"github.com/agentbox/agentbox/internal/volume"
)

// Templates is what the API needs from the template store: lookups in the
// view of the calling team (its own templates, builtins, public ones).
type Templates interface {
	Get(ctx context.Context, team, ref string) (*template.Template, error)
	List(ctx context.Context, team string) ([]*template.Template, error)
}

// Server is the REST control plane.
type Server struct {
	log         *slog.Logger
	store       *store.Store
	mgr         *sandbox.Manager // nil on a cluster's API tier (NewE2B)
	be          Backend          // runs the sandboxes of the E2B routes
	keys        Keys             // API key owners
	local       bool             // New: the local-only routes are served too
	notServed   string           // NewE2B: what an unknown route's answer adds
	templates   Templates
	builds      *template.Builds // template build jobs (SetBuilds)
	uploads     uploadGrants     // upload links of the build API
	tunneler    Tunneler         // port-forward tunnels; nil refuses them
	guesses     *authlimit.Limiter
	idem        idempotency     // creates by Idempotency-Key
	promMetrics http.Handler    // GET /metrics (SetMetrics); nil: off
	mcp         http.Handler    // MCP over streamable HTTP (SetMCP); nil: no /mcp
	mcpCalls    teamCalls       // MCP requests under way per team (mcplimit.go)
	vols        *volume.Service // team volumes (SetVolumes); nil answers 503
	events      EventRoutes     // lifecycle events and webhooks (events.go); nil answers 503
	// portOrigin says where a client reaches sandbox ports (SetPortOrigin).
	portOrigin func(r *http.Request) (scheme, domain string)
	// dataPlane serves the dashboard's sandbox calls (SetDataPlane).
	dataPlane http.Handler
	// MaxBody caps JSON request bodies.
	MaxBody int64
}

// New returns a control-plane server.
func New(log *slog.Logger, st *store.Store, mgr *sandbox.Manager, tpl Templates) *Server {
	s := &Server{log: log, store: st, mgr: mgr, templates: tpl, local: true, MaxBody: 1 << 20, guesses: authlimit.New(authlimit.Options{})}
	if st != nil {
		s.keys = st
	}
	if mgr != nil {
		s.be = LocalBackend{M: mgr}
	}
	return s
}

// NewE2B returns a server of the E2B sandbox routes alone, on be, with
// keys looked up in keys (a cluster's API tier). notServed ends the
// answer to a route it does not serve: what to use instead.
func NewE2B(log *slog.Logger, be Backend, keys Keys, notServed string) *Server {
	return &Server{log: log, be: be, keys: keys, notServed: notServed, MaxBody: 1 << 20, guesses: authlimit.New(authlimit.Options{})}
}

// SetMetrics serves h at GET /metrics. Call before serving.
func (s *Server) SetMetrics(h http.Handler) { s.promMetrics = h }

// SetMCP serves h at /mcp behind the API key check, so MCP callers are
// authenticated, rate limited and scoped to their team like REST callers.
// Call before serving.
func (s *Server) SetMCP(h http.Handler) { s.mcp = h }

// SetPortOrigin tells the dashboard where a client that sent r reaches
// sandbox ports: scheme and domain of the hosts <port>-<id>.<domain> (the
// gateway's PortOrigin). Call before serving.
func (s *Server) SetPortOrigin(f func(r *http.Request) (scheme, domain string)) { s.portOrigin = f }

// SetAuthLimiter replaces the limiter of failed API key checks, e.g. with
// one shared with the gateway or configured with trusted proxies. Call
// before serving.
func (s *Server) SetAuthLimiter(l *authlimit.Limiter) { s.guesses = l }

type ctxKey struct{}

func keyOf(ctx context.Context) store.APIKey {
	k, _ := ctx.Value(ctxKey{}).(store.APIKey)
	return k
}

// Handler returns the API's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("Health check successful"))
	})
	// Readiness for load balancers and Kubernetes probes: 503 until the
	// store, the network and the default isolation tier all answer.
	mux.HandleFunc("GET /ready", s.ready)
	auth := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, s.authenticate(h)) }
	s.sandboxRoutes(auth)
	if !s.local {
		auth("DELETE /templates/{id}", s.deleteSnapshotOnly)
		if s.events != nil { // a cluster's events, when its backend serves them
			s.eventsRoutes(auth)
		}
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			httperr.Write(w, fmt.Errorf("no route %s %s (%s): %w", r.Method, r.URL.Path, s.notServed, errdefs.ErrNotFound))
		})
		return mux
	}
	// Prometheus metrics, behind the operator's token (not an API key:
	// they describe every team).
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.promMetrics == nil {
			httperr.Write(w, fmt.Errorf("metrics are off on this address: start the server with --metrics-token (then send Authorization: Bearer <token>) or --metrics-listen: %w", errdefs.ErrNotFound))
			return
		}
		s.promMetrics.ServeHTTP(w, r)
	})
	auth("GET /sandboxes/{id}/metrics", s.metrics)
	s.networkRoutes(auth)
	s.logsRoutes(auth)
	s.lifecycleRoutes(auth)
	s.eventsRoutes(auth)
	s.usageRoutes(auth) // usage.go
	auth("GET /templates", s.listTemplates)
	auth("GET /templates/{id}", s.getTemplate)
	auth("GET /templates/aliases/{alias}", s.templateAlias)
	s.templateBuildRoutes(mux, auth)
	if s.mcp != nil {
		mux.Handle("/mcp", s.authenticate(s.mcpCalls.limit(s.mcp)))
	}
	s.volumeRoutes(mux, auth)
	s.dashboardRoutes(mux, auth)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httperr.Write(w, fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
	})
	return mux
}

// sandboxRoutes is the route table of the E2B sandbox API both server
// modes serve, on s.be.
func (s *Server) sandboxRoutes(auth func(string, http.HandlerFunc)) {
	auth("POST /sandboxes", s.create(false))
	auth("POST /v2/sandboxes", s.create(true))
	auth("GET /sandboxes", s.listV1)
	auth("GET /v2/sandboxes", s.listV2)
	auth("GET /sandboxes/{id}", s.info)
	auth("DELETE /sandboxes/{id}", s.kill)
	auth("POST /sandboxes/{id}/timeout", s.timeout)
	auth("POST /sandboxes/{id}/refreshes", s.refresh)
	auth("POST /sandboxes/{id}/connect", s.connect(false))
	auth("POST /v2/sandboxes/{id}/connect", s.connect(true))
	auth("POST /sandboxes/{id}/resume", s.resume)
	auth("POST /sandboxes/{id}/pause", s.pause)
	auth("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	auth("GET /snapshots", s.listSnapshots)
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := apireq.Key(r)
		if key == "" {
			httperr.Write(w, fmt.Errorf("missing API key: send it in the X-API-Key header (see <data-dir>/apikey or `agentbox apikey create`, with --kubernetes on a cluster): %w", errdefs.ErrUnauthenticated))
			return
		}
		var k store.APIKey
		if !s.checkSecret(w, r, "API key", key, func() (err error) {
			k, err = s.keys.Authenticate(r.Context(), key)
			return err
		}) {
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, k)))
	})
}

// checkSecret looks up secret, a credential the client sent (what names
// it), with lookup, and writes the answer of a failure. The guess limiter
// decides that answer (authlimit.Guard): a valid secret is always served,
// only wrong ones are counted, and only they get 429 once the client's
// address has spent its failures.
func (s *Server) checkSecret(w http.ResponseWriter, r *http.Request, what, secret string, lookup func() error) bool {
	return s.guesses.Guard(w, r, what, func() error {
		if len(secret) > 256 {
			// Longer than any secret the server issues: not worth a look-up.
			return fmt.Errorf("invalid %s: %w", what, errdefs.ErrUnauthenticated)
		}
		return lookup()
	}, httperr.Write)
}

// ---- responses (api/gen/rest, E2B wire names) ----

func (s *Server) sandboxResponse(ctx context.Context, sb *sandbox.Sandbox) rest.Sandbox {
	out := rest.Sandbox{SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: sandbox.ClientID, EnvdVersion: sandbox.EnvdVersion}
	envd, traffic := s.be.Tokens(ctx, sb.ID)
	if sb.Secure {
		out.EnvdAccessToken = envd
	}
	if !sb.Network.PublicTraffic() {
		out.TrafficAccessToken = &traffic
	}
	return out
}

func listed(sb *sandbox.Sandbox) rest.ListedSandbox {
	return rest.ListedSandbox{
		SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: sandbox.ClientID,
		StartedAt: sb.StartedAt.UTC(), EndAt: endAt(sb), State: stateOf(sb),
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, EnvdVersion: sandbox.EnvdVersion, Metadata: metadataOf(sb),
		Isolation: sb.Isolation, PIDs: sb.PIDs, TmpSizeMB: sb.TmpMB, Health: sb.Health, HealthReason: sb.HealthReason,
		VolumeMounts: mountsOf(sb),
	}
}

// detail is GET /sandboxes/{id}: the listed fields and the settings;
// envdAccessToken is the sandbox's token when it is secured.
func detail(sb *sandbox.Sandbox, envdAccessToken string) rest.SandboxDetail {
	d := rest.SandboxDetail{
		SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: sandbox.ClientID,
		StartedAt: sb.StartedAt.UTC(), EndAt: endAt(sb), State: stateOf(sb),
		CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, EnvdVersion: sandbox.EnvdVersion, Metadata: metadataOf(sb),
		Isolation: sb.Isolation, PIDs: sb.PIDs, TmpSizeMB: sb.TmpMB, Health: sb.Health, HealthReason: sb.HealthReason,
		VolumeMounts:    mountsOf(sb),
		EnvdAccessToken: envdAccessToken, AllowInternetAccess: sb.AllowInternet,
		Lifecycle: rest.SandboxLifecycle{OnTimeout: "kill", AutoResume: sb.AutoResume}, Network: networkInfo(sb.Network),
	}
	if sb.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	return d
}

// metadataOf is never nil: E2B sends {} for a sandbox without metadata.
func metadataOf(sb *sandbox.Sandbox) map[string]string {
	if sb.Metadata == nil {
		return map[string]string{}
	}
	return sb.Metadata
}

// ---- validation ----

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const (
	maxMetadata   = 64
	maxMetaKey    = 256
	maxMetaValue  = 2048
	maxEnvVars    = 256
	maxEnvValue   = 32 << 10
	maxTemplateID = 256
)

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func validateStrings(field string, m map[string]string, maxN, maxKey, maxVal int, keyOK func(string) bool, keyHint string) error {
	if len(m) > maxN {
		return invalid("%s: %d entries is over the limit of %d", field, len(m), maxN)
	}
	for k, v := range m {
		if k == "" || len(k) > maxKey || !keyOK(k) {
			return invalid("%s: key %q is not allowed (%s, at most %d bytes)", field, apireq.Truncate(k), keyHint, maxKey)
		}
		if len(v) > maxVal {
			return invalid("%s.%s: value of %d bytes is over the limit of %d", field, k, len(v), maxVal)
		}
		if strings.ContainsRune(v, 0) {
			return invalid("%s.%s: value contains a NUL byte", field, k)
		}
	}
	return nil
}

func printable(s string) bool {
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// timeoutOf converts a seconds field to a duration with the E2B default.
func timeoutOf(v *int64, def time.Duration) (time.Duration, error) {
	if v == nil {
		return def, nil
	}
	if *v < 0 {
		// 0 is E2B's too: the sandbox's time is up at once (it is
		// killed, or paused with autoPause).
		return 0, invalid("timeout: must be 0 or more seconds, got %d", *v)
	}
	if *v > 1<<31-1 {
		return 0, invalid("timeout: %d seconds does not fit in int32", *v)
	}
	return time.Duration(*v) * time.Second, nil
}

func (s *Server) create(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body rest.NewSandbox
		if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &body); err != nil {
			httperr.Write(w, err)
			return
		}
		req, err := s.createRequest(r.Context(), body, v2)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		s.createOnce(w, r, body, func() (any, error) {
			sb, err := s.be.Create(detach(r.Context(), r), req)
			if err != nil {
				s.log.Warn("create sandbox", "template", req.Template, "err", err)
				return nil, err
			}
			return s.sandboxResponse(r.Context(), sb), nil
		})
	}
}

func (s *Server) createRequest(ctx context.Context, b rest.NewSandbox, v2 bool) (sandbox.CreateRequest, error) {
	key := keyOf(ctx)
	req := sandbox.CreateRequest{TeamID: key.TeamID, APIKeyID: key.ID, Metadata: b.Metadata, EnvVars: b.EnvVars, AllowInternet: true}
	if strings.TrimSpace(b.TemplateID) == "" {
		return req, invalid("templateID: required; e.g. \"base\"")
	}
	if len(b.TemplateID) > maxTemplateID || !printable(b.TemplateID) {
		return req, invalid("templateID: must be a printable template id or alias of at most %d bytes", maxTemplateID)
	}
	req.Template = b.TemplateID
	// E2B defaults: 15 s on the deprecated v1 endpoint, 300 s on v2.
	def := 15 * time.Second
	if v2 {
		def = 300 * time.Second
	}
	var err error
	if req.Timeout, err = timeoutOf(b.Timeout, def); err != nil {
		return req, err
	}
	if err := validateStrings("metadata", b.Metadata, maxMetadata, maxMetaKey, maxMetaValue, printable, "printable characters"); err != nil {
		return req, err
	}
	if err := validateStrings("envVars", b.EnvVars, maxEnvVars, 256, maxEnvValue, envName.MatchString, "letters, digits and _, not starting with a digit"); err != nil {
		return req, err
	}
	// v2 is always secure; v1 is secure only when asked (the SDKs always ask).
	req.Secure = v2 || (b.Secure != nil && *b.Secure)
	if b.AllowInternetAccess != nil {
		req.AllowInternet = *b.AllowInternetAccess
	}
	if err := applyLifecycle(&req, b); err != nil {
		return req, err
	}
	if err := s.applyNetwork(ctx, &req, b.Network); err != nil {
		return req, err
	}
	// mcp is accepted as E2B accepts it: the SDK then starts the template's
	// MCP gateway itself (and, on a template without one, fails clearly
	// and kills the sandbox).
	if req.VolumeMounts, err = volumeMounts(b.VolumeMounts); err != nil {
		return req, err
	}
	if err := applyIsolation(&req, b); err != nil {
		return req, err
	}
	return req, nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	sb, err := s.be.Get(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	token := ""
	if sb.Secure {
		token, _ = s.be.Tokens(r.Context(), sb.ID)
	}
	httperr.WriteJSON(w, http.StatusOK, detail(sb, token))
}

// sandboxID accepts the legacy "<sandboxID>-<clientID>" form too.
func sandboxID(r *http.Request) string {
	id := r.PathValue("id")
	if i := strings.IndexByte(id, '-'); i > 0 {
		id = id[:i]
	}
	return id
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if err := s.be.Kill(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r)); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) timeout(w http.ResponseWriter, r *http.Request) {
	var body rest.TimeoutRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	if body.Timeout == nil {
		httperr.Write(w, invalid("timeout: required (seconds from now)"))
		return
	}
	d, err := timeoutOf(body.Timeout, 0)
	if err == nil {
		err = s.be.SetTimeout(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), d)
	}
	if err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var body rest.RefreshRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	d, err := timeoutOf(body.Duration, 15*time.Second)
	if err == nil {
		_, err = s.be.Extend(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), max(d, 15*time.Second))
	}
	if err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) connect(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body rest.ConnectSandbox
		if err := apireq.DecodeJSON(w, r, s.MaxBody, v2, &body); err != nil {
			httperr.Write(w, err)
			return
		}
		if !v2 && body.Timeout == nil {
			httperr.Write(w, invalid("timeout: required (seconds)"))
			return
		}
		d, err := timeoutOf(body.Timeout, 300*time.Second)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		// A paused sandbox is resumed (201); a running one gets its
		// lifetime extended (200).
		team := keyOf(r.Context()).TeamID
		sb, resumed, err := s.resumeWith(r, body.Memory, d)
		if err == nil && !resumed {
			sb, err = s.be.Extend(r.Context(), team, sandboxID(r), d)
		}
		if err != nil {
			httperr.Write(w, err)
			return
		}
		status := http.StatusOK
		if resumed {
			status = http.StatusCreated
		}
		httperr.WriteJSON(w, status, s.sandboxResponse(r.Context(), sb))
	}
}

func unixParam(q url.Values, name string) (time.Time, error) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, invalid("%s: must be unix seconds, got %q", name, apireq.Truncate(v))
	}
	return time.Unix(n, 0), nil
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	start, err := unixParam(r.URL.Query(), "start")
	if err != nil {
		httperr.Write(w, err)
		return
	}
	end, err := unixParam(r.URL.Query(), "end")
	if err != nil {
		httperr.Write(w, err)
		return
	}
	pts, err := s.mgr.Sampler().Metrics(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), start, end)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := make([]rest.SandboxMetric, 0, len(pts))
	for _, p := range pts {
		out = append(out, rest.SandboxMetric{Timestamp: p.Timestamp.UTC(), TimestampUnix: p.Timestamp.Unix(), CPUCount: p.CPUCount,
			CPUUsedPct: p.CPUUsedPct, MemUsed: p.MemUsed, MemTotal: p.MemTotal, MemCache: p.MemCache, DiskUsed: p.DiskUsed, DiskTotal: p.DiskTotal})
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

// ---- listing ----

type listQuery struct {
	metadata map[string]string
	states   []string
	template string    // templateID or alias
	since    time.Time // startedAfter (inclusive)
	until    time.Time // startedBefore (exclusive)
	limit    int
	after    *cursor
	asc      bool
}

type cursor struct {
	startedAt int64
	id        string
}

func encodeCursor(sb *sandbox.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.StartedAt.UnixNano(), 10) + "__" + sb.ID))
}

func parseListQuery(q url.Values, paginated bool) (listQuery, error) {
	lq := listQuery{limit: 100}
	f, err := apireq.ParseListFilters(q)
	if err != nil {
		return lq, err
	}
	lq.metadata, lq.states = f.Metadata, f.States
	lq.template = q.Get("template")
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"startedAfter", &lq.since}, {"startedBefore", &lq.until}} {
		if v := q.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return lq, invalid("%s: must be an RFC 3339 timestamp such as 2026-01-02T15:04:05Z, got %q", f.name, apireq.Truncate(v))
			}
			*f.dst = t
		}
	}
	if !paginated {
		return lq, nil
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return lq, invalid("limit: must be an integer from 1 to 100, got %q", apireq.Truncate(v))
		}
		lq.limit = n
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, invalid("order: must be asc or desc")
	}
	if tok := q.Get("nextToken"); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		ts, id, ok := strings.Cut(string(raw), "__")
		n, perr := strconv.ParseInt(ts, 10, 64)
		if err != nil || !ok || perr != nil {
			return lq, invalid("nextToken: not a token this server issued; pass the X-Next-Token header of the previous page")
		}
		lq.after = &cursor{startedAt: n, id: id}
	}
	return lq, nil
}

func (lq listQuery) match(sb *sandbox.Sandbox) bool {
	for k, v := range lq.metadata {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	switch {
	case lq.template != "" && sb.TemplateID != lq.template && sb.Alias != lq.template:
		return false
	case !lq.since.IsZero() && sb.StartedAt.Before(lq.since):
		return false
	case !lq.until.IsZero() && !sb.StartedAt.Before(lq.until):
		return false
	}
	return len(lq.states) == 0 || slices.Contains(lq.states, stateOf(sb))
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query(), false)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	all, err := s.be.List(r.Context(), keyOf(r.Context()).TeamID)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := []rest.ListedSandbox{}
	for _, sb := range all {
		if lq.match(sb) {
			out = append(out, listed(sb))
		}
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query(), true)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	all, err := s.be.List(r.Context(), keyOf(r.Context()).TeamID) // newest first
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if lq.asc {
		slices.Reverse(all)
	}
	var matched []*sandbox.Sandbox
	running := 0
	for _, sb := range all {
		if !lq.match(sb) {
			continue
		}
		running++
		if c := lq.after; c != nil {
			ts := sb.StartedAt.UnixNano()
			// Skip up to and including the cursor in the current order.
			before := ts > c.startedAt || (ts == c.startedAt && sb.ID <= c.id)
			if lq.asc {
				before = ts < c.startedAt || (ts == c.startedAt && sb.ID >= c.id)
			}
			if before {
				continue
			}
		}
		matched = append(matched, sb)
	}
	out := []rest.ListedSandbox{}
	for i, sb := range matched {
		if i == lq.limit {
			w.Header().Set("X-Next-Token", encodeCursor(matched[i-1]))
			break
		}
		out = append(out, listed(sb))
	}
	if len(lq.states) == 0 || slices.Contains(lq.states, "running") {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.be == nil {
		httperr.WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": "no sandbox manager"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	body, ready := s.be.Readiness(ctx)
	code := http.StatusOK
	if !ready {
		code = http.StatusServiceUnavailable
	}
	httperr.WriteJSON(w, code, body)
}
