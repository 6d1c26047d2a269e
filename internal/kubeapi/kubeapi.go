// Package kubeapi is agentbox's stateless API tier on Kubernetes (serve
// --kubernetes): the backend of the E2B API layer (internal/api) that runs
// a whole cluster's sandboxes from the agent-sandbox objects alone, and the
// data plane that forwards sandbox traffic to node agents. A create becomes
// a Sandbox or SandboxClaim that a node agent (serve --kube-controller)
// runs. It keeps no state of its own: API keys are Secrets, teams are
// labelled namespaces, and several replicas may serve at once.
package kubeapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/agentbox/agentbox/internal/api"
	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/kube"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
	"github.com/agentbox/agentbox/internal/store"
)

// API key Secrets: type SecretType in the keys namespace, label
// kube.LabelTeam naming the team, data KeyHashField = hex SHA-256 of the
// key (never the key).
const (
	SecretType   = "agentbox.dev/api-key"
	KeyHashField = "sha256"
	// AnnotationMetadata holds a sandbox's E2B metadata (JSON) on the
	// Sandbox or SandboxClaim the API tier made; the node agent gives it
	// to the sandbox.
	AnnotationMetadata = kube.AnnotationMetadata
	// LabelOrigin marks the objects the API tier made.
	LabelOrigin = "agentbox.dev/origin"
)

// hashIndex indexes API key Secrets by their sha256 field; snapshotTeamIndex
// SandboxSnapshots by the team that took them (kube.SnapshotTeam).
const (
	hashIndex         = "agentbox.keyHash"
	snapshotTeamIndex = "agentbox.snapshotTeam"
)

// Config configures the API tier.
type Config struct {
	Kubeconfig string
	// KeysNamespace holds the API key Secrets.
	KeysNamespace string
	// LeaseNamespace holds the node agents' Leases (their addresses).
	LeaseNamespace string
	// TokenSecret is the node agents' --token-secret-file: envd access and
	// traffic tokens are derived from it.
	TokenSecret []byte
	// MaxTimeout is the longest sandbox timeout accepted.
	MaxTimeout time.Duration
	// CreateWait bounds how long a create (or resume) waits for Ready.
	CreateWait time.Duration
	// Guesses counts failed credential checks; nil = a default limiter.
	Guesses *authlimit.Limiter
}

// Server serves the E2B API of a cluster.
type Server struct {
	cfg     Config
	c       client.Client // reads from the informer cache, writes to the API server
	live    client.Reader // past the cache: /ready
	cache   cache.Cache
	log     *slog.Logger
	guesses *authlimit.Limiter
	events  api.EventRoutes // events.go
}

// New connects to the cluster; call Start before serving.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if len(cfg.TokenSecret) == 0 {
		return nil, errors.New("--token-secret-file: serve --kubernetes needs the node agents' token secret to hand out envd access tokens; give it the same file as the agents")
	}
	if cfg.KeysNamespace == "" {
		return nil, errors.New("--kube-keys-namespace: name the namespace of the API key Secrets")
	}
	if cfg.LeaseNamespace == "" {
		return nil, errors.New("--kube-lease-namespace: name the namespace of the node agents' Leases")
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 24 * time.Hour
	}
	if cfg.CreateWait <= 0 {
		cfg.CreateWait = 3 * time.Minute
	}
	crlog.SetLogger(logr.FromSlogHandler(log.Handler()))
	rc, err := kube.RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme, err := kube.Scheme()
	if err != nil {
		return nil, err
	}
	ca, err := cache.New(rc, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}:    {Namespaces: map[string]cache.Config{cfg.KeysNamespace: {}}},
			&coordv1.Lease{}:    {Namespaces: map[string]cache.Config{cfg.LeaseNamespace: {}}},
			&corev1.Namespace{}: {},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes cache: %w", err)
	}
	if err := ca.IndexField(context.Background(), &corev1.Secret{}, hashIndex, func(o client.Object) []string {
		s, ok := o.(*corev1.Secret)
		if !ok || s.Type != SecretType {
			return nil
		}
		if h := string(s.Data[KeyHashField]); h != "" {
			return []string{strings.ToLower(strings.TrimSpace(h))}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("index API key Secrets: %w", err)
	}
	if err := ca.IndexField(context.Background(), &abv1.SandboxSnapshot{}, snapshotTeamIndex, func(o client.Object) []string {
		if s, ok := o.(*abv1.SandboxSnapshot); ok && kube.SnapshotTeam(s) != "" {
			return []string{kube.SnapshotTeam(s)}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("index SandboxSnapshots: %w", err)
	}
	c, err := client.New(rc, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	live, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	g := cfg.Guesses
	if g == nil {
		g = authlimit.New(authlimit.Options{})
	}
	return &Server{cfg: cfg, c: c, live: live, cache: ca, log: log, guesses: g}, nil
}

// Start runs the informers until ctx ends and returns once they are synced.
func (s *Server) Start(ctx context.Context) error {
	// The informers of the kinds served start before the first request.
	for _, o := range []client.Object{&corev1.Secret{}, &coordv1.Lease{}, &corev1.Namespace{},
		&agentsv1.Sandbox{}, &extv1.SandboxClaim{}, &extv1.SandboxTemplate{}, &extv1.SandboxWarmPool{}, &abv1.SandboxSnapshot{}} {
		if _, err := s.cache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("watch %T: %w", o, err)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.cache.Start(ctx) }()
	if !s.cache.WaitForCacheSync(ctx) {
		select {
		case err := <-errc:
			return fmt.Errorf("kubernetes cache: %w", err)
		default:
			return errors.New("kubernetes cache did not sync")
		}
	}
	return nil
}

// caller is a team and where its objects are.
type caller struct {
	team string
	// namespaces are the team's namespaces, sorted (teamNamespaces).
	namespaces []string
	// home are the namespaces new sandboxes may start in, sorted; creates
	// go to the first. held names the namespaces labelled for the team
	// that another team still holds, and that team.
	home []string
	held map[string]string
}

var (
	_ api.Backend = (*Server)(nil)
	_ api.Keys    = (*Server)(nil)
)

// Authenticate finds the team of an API key Secret holding key's hash.
func (s *Server) Authenticate(ctx context.Context, key string) (store.APIKey, error) {
	team, err := s.teamOfKey(ctx, key)
	if err != nil {
		return store.APIKey{}, err
	}
	return store.APIKey{TeamID: team, TeamName: team}, nil
}

// HashKey is what an API key Secret stores of the key.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func (s *Server) teamOfKey(ctx context.Context, key string) (string, error) {
	if len(key) > 256 {
		return "", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
	}
	var list corev1.SecretList
	if err := s.c.List(ctx, &list, client.InNamespace(s.cfg.KeysNamespace), client.MatchingFields{hashIndex: HashKey(key)}); err != nil {
		return "", fmt.Errorf("look up API key: %w", err)
	}
	for _, sec := range list.Items {
		if sec.Type == SecretType && sec.Labels[kube.LabelTeam] != "" && sec.DeletionTimestamp.IsZero() {
			return sec.Labels[kube.LabelTeam], nil
		}
	}
	return "", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated)
}

// teamNamespaces finds team's namespaces by the node agents' binding rule
// (kube.BoundTeam): a namespace labelled for team is the team's unless it
// holds another team's Sandboxes or SandboxSnapshots, and a namespace that
// holds team's SandboxSnapshots stays the team's whatever its label says
// now. So a re-label never hands one team's snapshots to another, and the
// old team can still list and delete them (new sandboxes start only in
// namespaces labelled for the team and held by no other).
func (s *Server) teamNamespaces(ctx context.Context, team string) (caller, error) {
	who := caller{team: team}
	var list corev1.NamespaceList
	if err := s.c.List(ctx, &list, client.MatchingLabels{kube.LabelTeam: team}); err != nil {
		return who, fmt.Errorf("list the namespaces of team %s: %w", team, err)
	}
	for i := range list.Items {
		n := &list.Items[i]
		if !n.DeletionTimestamp.IsZero() {
			continue
		}
		bound, err := kube.BoundTeam(ctx, s.c, n)
		if err != nil {
			return who, err
		}
		if bound != team {
			if who.held == nil {
				who.held = map[string]string{}
			}
			who.held[n.Name] = bound
			continue
		}
		who.home = append(who.home, n.Name)
	}
	var snaps abv1.SandboxSnapshotList
	if err := s.c.List(ctx, &snaps, client.MatchingFields{snapshotTeamIndex: team}, client.UnsafeDisableDeepCopy); err != nil {
		return who, fmt.Errorf("list the SandboxSnapshots of team %s: %w", team, err)
	}
	who.namespaces = slices.Clone(who.home)
	for _, sn := range snaps.Items {
		if slices.Contains(who.namespaces, sn.Namespace) || who.held[sn.Namespace] != "" {
			continue
		}
		var n corev1.Namespace
		if err := s.c.Get(ctx, client.ObjectKey{Name: sn.Namespace}, &n); err != nil || !n.DeletionTimestamp.IsZero() {
			continue // a namespace going away serves nothing
		}
		if bound, err := kube.BoundTeam(ctx, s.c, &n); err != nil {
			return who, err
		} else if bound == team {
			who.namespaces = append(who.namespaces, sn.Namespace)
		}
	}
	slices.Sort(who.home)
	slices.Sort(who.namespaces)
	return who, nil
}

// notServed is what the API adds to a route this tier does not serve.
const notServed = "`agentbox serve --kubernetes` serves sandbox lifecycle, snapshots and the data plane: build templates, and use volumes, logs and metrics, on a node agent's own API (agentbox serve) or with kubectl"

// Handler serves the E2B API (internal/api's routes on this backend) and
// the data plane.
func (s *Server) Handler() http.Handler {
	a := api.NewE2B(s.log, s, s, notServed)
	a.SetAuthLimiter(s.guesses)
	if s.events != nil {
		a.SetEvents(s.events)
	}
	return s.dataPlane(a.Handler())
}

// Readiness answers once the Kubernetes API server does.
func (s *Server) Readiness(ctx context.Context) (any, bool) {
	var list corev1.NamespaceList
	if err := s.live.List(ctx, &list, client.Limit(1)); err != nil {
		return map[string]any{"code": http.StatusServiceUnavailable, "message": "the Kubernetes API server does not answer: " + err.Error()}, false
	}
	return map[string]any{"ready": true}, true
}
