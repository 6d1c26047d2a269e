package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/agentbox/agentbox/internal/crashpoint"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Sandboxes is what the controller needs of the server's sandbox manager
// (*sandbox.Manager): the same calls the E2B API makes.
type Sandboxes interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, teamID, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, teamID string) []*sandbox.Sandbox
	// Running lists the server's running sandboxes of every team.
	Running() []*sandbox.Sandbox
	Kill(ctx context.Context, teamID, id string) error
	Pause(ctx context.Context, teamID, id string) error
	Resume(ctx context.Context, teamID, id string, timeout time.Duration, auto bool) (*sandbox.Sandbox, bool, error)
	SetTimeout(ctx context.Context, teamID, id string, d time.Duration) error
}

// Config configures the controller.
type Config struct {
	// Kubeconfig is the kubeconfig file; "" = in-cluster config, then
	// $KUBECONFIG and ~/.kube/config.
	Kubeconfig string
	// Node is the name this server reports as the node of its sandboxes;
	// "" runs the controller alone: it reconciles pools and claims and binds
	// unbound Sandboxes to the best live node agent, but runs no sandbox and
	// writes no Lease of its own.
	Node string
	// Teams binds namespaces to agentbox team ids: the controller acts only
	// in these namespaces, and a namespace's sandboxes belong to its team.
	Teams map[string]string
	// LabelTeams, when set, binds the namespaces labelled LabelTeam=NAME
	// to team NAME while the controller runs (bindings.go), returning the
	// id of NAME on this server (created if new); the cache then watches
	// every namespace. Teams wins for a namespace in both.
	LabelTeams func(ctx context.Context, name string) (id string, err error)
	// ValidTeamName checks a label's team name (nil: any).
	ValidTeamName func(name string) bool
	// MaxTimeout is the server's longest sandbox timeout: the controller
	// keeps its sandboxes alive by extending them before it runs out.
	MaxTimeout time.Duration
	// LeaderElection makes only one of several controllers act at a time.
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseNamespace holds the node agents' Leases (agentbox-node-NODE).
	LeaseNamespace string
	// LeaseDuration is how long a Lease lasts unrenewed: it is renewed
	// every third of it, and other agents mark the node's Sandboxes
	// NodeLost once it runs out.
	LeaseDuration time.Duration
	// CPU and MemoryMB are what this agent may allocate to sandboxes.
	CPU      int
	MemoryMB int
	// Images stores suspended Sandboxes' images in an object store so any
	// agent can resume them (nil: they stay on their node).
	Images *Images
	// Snapshots takes, uploads and restores SandboxSnapshots on this node
	// (the manager's sandbox.Snapshotter); nil: this agent takes none.
	Snapshots Snapshotter
	// Address is where the API tier reaches this agent's gateway
	// (host:port), reported on the Lease.
	Address string
	// MetricsAddr serves controller-runtime's Prometheus metrics ("" or
	// "0" = off).
	MetricsAddr string
	// QPS and Burst bound the client's request rate to the API server
	// (0 = DefaultQPS, DefaultBurst).
	QPS   float32
	Burst int
	// Workers is how many objects of each kind reconcile at once (0 =
	// DefaultWorkers).
	Workers int
	// Crash kills the agent right after a named step of a move (move.go)
	// or of a SandboxSnapshot's store or restore (snapshotsteps.go); the
	// hidden serve flag --test-crash-after. The zero Switch never does.
	Crash crashpoint.Switch
}

// Client-side rate limits and workers when Config leaves them 0. A claim
// and the member that replaces it cost the controller about eight requests,
// so 200 requests/s held a continuous burst of 75 claims/s to 25/s and
// queued the rest for minutes; the API server's own flow control, not the
// client, is what should bound a burst. Each worker waits on about three
// requests in a row per claim, so 64 keep pace with a loaded API server.
const (
	DefaultQPS     = 2000
	DefaultBurst   = 4000
	DefaultWorkers = 64
)

// Controller runs the reconcilers of the four kinds.
type Controller struct {
	mgr  ctrl.Manager
	base reconcilerBase
	// again builds a fresh manager to stand for leader once more.
	again func() (*Controller, error)
}

// Scheme returns a scheme with the core kinds and the agent-sandbox kinds.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, agentsv1.AddToScheme, extv1.AddToScheme, abv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}

// RESTConfig loads the kubeconfig (see Config.Kubeconfig).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes config (in-cluster, $KUBECONFIG or ~/.kube/config); pass --kubeconfig: %w", err)
	}
	return cfg, nil
}

// New builds the controller against the cluster in cfg.Kubeconfig.
func New(cfg Config, sbs Sandboxes, host Host, logger *slog.Logger) (*Controller, error) {
	c, err := build(cfg, sbs, host, logger, false)
	if err != nil {
		return nil, err
	}
	c.again = func() (*Controller, error) { return build(cfg, sbs, host, logger, true) }
	return c, nil
}

// build makes the manager and its reconcilers; again is a rebuild after a
// lost leader election (controller names are then in use already).
func build(cfg Config, sbs Sandboxes, host Host, logger *slog.Logger, again bool) (*Controller, error) {
	if len(cfg.Teams) == 0 && cfg.LabelTeams == nil {
		return nil, errors.New("--kube-team: bind at least one namespace to a team (NAMESPACE=TEAM), or let the agent list namespaces to bind those labelled agentbox.dev/team; the controller acts only in bound namespaces")
	}
	if cfg.LeaseNamespace == "" {
		return nil, errors.New("--kube-lease-namespace: name the namespace of the node agents' Leases")
	}
	if cfg.LeaseDuration < time.Second {
		return nil, fmt.Errorf("--kube-lease-duration %v: want at least 1s", cfg.LeaseDuration)
	}
	if cfg.Node != "" && (cfg.CPU <= 0 || cfg.MemoryMB <= 0) {
		return nil, fmt.Errorf("--kube-node-cpu %d, --kube-node-memory-mb %d: want positive capacity", cfg.CPU, cfg.MemoryMB)
	}
	if cfg.MaxTimeout <= 0 {
		return nil, errors.New("kube: MaxTimeout must be positive")
	}
	if cfg.QPS < 0 || cfg.Burst < 0 || cfg.Workers < 0 {
		return nil, fmt.Errorf("--kube-qps %v, --kube-burst %d, --kube-workers %d: want 0 (the default) or more", cfg.QPS, cfg.Burst, cfg.Workers)
	}
	rc, err := RESTConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst, cfg.Workers = cmp.Or(cfg.QPS, DefaultQPS), cmp.Or(cfg.Burst, DefaultBurst), cmp.Or(cfg.Workers, DefaultWorkers)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	log.SetLogger(logr.FromSlogHandler(logger.Handler()))
	// Without label bindings only the bound namespaces are watched; with
	// them any namespace may be bound at any time, so all are.
	var nsCache map[string]cache.Config
	if cfg.LabelTeams == nil {
		nsCache = map[string]cache.Config{}
		for ns := range cfg.Teams {
			nsCache[ns] = cache.Config{}
		}
	}
	metricsAddr := cfg.MetricsAddr
	if metricsAddr == "" {
		metricsAddr = "0"
	}
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   cache.Options{DefaultNamespaces: nsCache, ByObject: leaseCache(cfg.LeaseNamespace)},
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  "0",
		LeaderElection:          cfg.LeaderElection,
		LeaderElectionID:        "agentbox-controller." + agentsv1.Group,
		LeaderElectionNamespace: cfg.LeaderElectionNamespace,
		Controller:              config.Controller{SkipNameValidation: new(again)},
	})
	if err != nil {
		return nil, fmt.Errorf("kube: controller manager: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &agentsv1.Sandbox{}, claimOwnerIndex, claimOwnerOf); err != nil {
		return nil, fmt.Errorf("kube: index Sandboxes by claim: %w", err)
	}
	rec := mgr.GetEventRecorder("agentbox")
	base := reconcilerBase{c: mgr.GetClient(), api: mgr.GetAPIReader(), rec: rec, sbs: sbs, host: host, cfg: cfg, log: logger, teams: newBindings(cfg)}
	opts := controller.Options{MaxConcurrentReconciles: cfg.Workers}
	// Every node agent runs the sandboxes bound to its node; pools and
	// claims are the leader's alone (with --kube-leader-elect).
	everyNode := opts
	everyNode.NeedLeaderElection = new(false)
	// A namespace bound live re-queues its objects through these.
	wake := []chan event.GenericEvent{make(chan event.GenericEvent, 256), make(chan event.GenericEvent, 256), make(chan event.GenericEvent, 256)}
	if err := ctrl.NewControllerManagedBy(mgr).For(&agentsv1.Sandbox{}).Named("sandbox").WithOptions(everyNode).
		WatchesRawSource(source.Channel(wake[0], &handler.EnqueueRequestForObject{})).
		Complete(&sandboxReconciler{base}); err != nil {
		return nil, fmt.Errorf("kube: sandbox controller: %w", err)
	}
	if cfg.Node != "" {
		// Snapshots are taken, stored and deleted by the agent of their
		// Sandbox's node.
		if err := ctrl.NewControllerManagedBy(mgr).For(&abv1.SandboxSnapshot{}).Named("sandboxsnapshot").WithOptions(everyNode).
			Complete(&snapshotReconciler{base}); err != nil {
			return nil, fmt.Errorf("kube: snapshot controller: %w", err)
		}
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&extv1.SandboxWarmPool{}).Named("sandboxwarmpool").WithOptions(opts).
		Owns(&agentsv1.Sandbox{}).
		Watches(&extv1.SandboxTemplate{}, handler.EnqueueRequestsFromMapFunc(poolsOfTemplate(mgr.GetClient()))).
		WatchesRawSource(source.Channel(wake[1], &handler.EnqueueRequestForObject{})).
		Complete(&poolReconciler{reconcilerBase: base, created: &creations{}, paced: &statusPace{}}); err != nil {
		return nil, fmt.Errorf("kube: warm pool controller: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&extv1.SandboxClaim{}).Named("sandboxclaim").WithOptions(opts).
		Owns(&agentsv1.Sandbox{}).
		WatchesRawSource(source.Channel(wake[2], &handler.EnqueueRequestForObject{})).
		Complete(&claimReconciler{reconcilerBase: base, taken: &taken{}, before: &preexisting{}}); err != nil {
		return nil, fmt.Errorf("kube: claim controller: %w", err)
	}
	if cfg.LabelTeams != nil {
		// Every agent binds for itself; a Sandbox's team label change
		// (its first run) or a SandboxSnapshot's team (once taken), and
		// either's deletion, re-checks its namespace's binding.
		nsOf := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: o.GetNamespace()}}}
		})
		if err := ctrl.NewControllerManagedBy(mgr).For(&corev1.Namespace{}).Named("namespace").WithOptions(everyNode).
			Watches(&agentsv1.Sandbox{}, nsOf).
			Watches(&abv1.SandboxSnapshot{}, nsOf).
			Complete(&nsReconciler{reconcilerBase: base, wake: wake}); err != nil {
			return nil, fmt.Errorf("kube: namespace controller: %w", err)
		}
	}
	if cfg.Node != "" {
		if err := mgr.Add(&heartbeat{base}); err != nil {
			return nil, fmt.Errorf("kube: node agent lease: %w", err)
		}
		if cfg.Snapshots != nil {
			if err := mgr.Add(&snapshotSweep{base}); err != nil {
				return nil, fmt.Errorf("kube: snapshot copy sweep: %w", err)
			}
		}
	}
	return &Controller{mgr: mgr, base: base}, nil
}

// Run reconciles until ctx ends. A manager that loses the leader election
// (an API server too loaded to renew its Lease in time) stops everything,
// this node's own Sandboxes too: a fresh one stands again.
func (c *Controller) Run(ctx context.Context) error {
	// The Lease exists before this agent binds anything: placement only
	// picks agents that have one.
	if c.base.cfg.Node != "" {
		if err := c.base.renew(ctx); err != nil {
			return fmt.Errorf("kube controller: %w", err)
		}
	}
	for {
		err := c.mgr.Start(ctx)
		if err == nil || ctx.Err() != nil || !c.base.cfg.LeaderElection || c.again == nil {
			if err != nil {
				return fmt.Errorf("kube controller: %w", err)
			}
			return nil
		}
		c.base.log.Warn("kube controller stopped; standing for leader again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		next, berr := c.again()
		if berr != nil {
			return errors.Join(err, berr)
		}
		c.mgr, c.base = next.mgr, next.base
	}
}

// poolsOfTemplate maps a template to the pools in its namespace that use
// it, so a template edit re-checks their members' hashes.
func poolsOfTemplate(c client.Client) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		var pools extv1.SandboxWarmPoolList
		if err := c.List(ctx, &pools, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, p := range pools.Items {
			if p.Spec.TemplateRef.Name == o.GetName() {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
			}
		}
		return out
	}
}
