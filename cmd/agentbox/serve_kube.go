package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/crashpoint"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
	"github.com/agentbox/agentbox/internal/template"
)

// kubeFlags are the serve settings of the Kubernetes controller.
type kubeFlags struct {
	Controller    bool
	Kubeconfig    string
	Node          string
	Teams         []string
	LeaderElect   bool
	LeaderElectNS string
	MetricsListen string
	LeaseNS       string
	LeaseDuration time.Duration
	NodeCPU       int
	NodeMemoryMB  int
	ObjectStore   objectStoreFlags // serve_objstore.go
	QPS           float32
	Burst         int
	Workers       int
}

func addKubeFlags(f *pflag.FlagSet, k *kubeFlags) {
	f.BoolVar(&k.Controller, "kube-controller", false, "reconcile the agent-sandbox kinds (agents.x-k8s.io Sandbox; extensions.agents.x-k8s.io SandboxTemplate, SandboxWarmPool, SandboxClaim) of a Kubernetes cluster into sandboxes of this server (docs/kubernetes.md)")
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster for --kube-controller (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&k.Node, "kube-node", "", "node this server is the agent of: it binds unbound Sandboxes to this name in status.nodeName and runs only the Sandboxes bound to it; without it the controller runs alone (pools, claims, and binding Sandboxes to the best live node agent) and runs no sandbox")
	f.StringSliceVar(&k.Teams, "kube-team", nil, "bind a namespace to the team that owns its sandboxes, as NAMESPACE=TEAM (team name or id; repeatable); the controller acts only in bound namespaces")
	f.BoolVar(&k.LeaderElect, "kube-leader-elect", false, "with several node agents, only the leader (a Lease in --kube-leader-elect-namespace) reconciles warm pools and claims; every agent runs its own node's Sandboxes (required when several servers share a cluster)")
	f.StringVar(&k.LeaderElectNS, "kube-leader-elect-namespace", "", "namespace of the leader election Lease (default: the in-cluster namespace)")
	f.StringVar(&k.LeaseNS, "kube-lease-namespace", "agentbox-system", "namespace of the node agents' Leases (agentbox-node-NODE, with the agent's capacity, tiers and templates in annotation agentbox.dev/node-status); placement and node failure detection read them")
	f.DurationVar(&k.LeaseDuration, "kube-lease-duration", 15*time.Second, "how long a node agent's Lease lasts unrenewed: it is renewed every third of it, and once it runs out other agents mark the node's Sandboxes Ready=False reason NodeLost")
	f.IntVar(&k.NodeCPU, "kube-node-cpu", 0, "CPUs this node agent may allocate to sandboxes (0 = the host's CPU count)")
	f.IntVar(&k.NodeMemoryMB, "kube-node-memory-mb", 0, "memory in MiB this node agent may allocate to sandboxes (0 = the host's MemTotal)")
	addObjectStoreFlags(f, &k.ObjectStore)
	f.Float32Var(&k.QPS, "kube-qps", kube.DefaultQPS, "requests per second the controller may send the Kubernetes API server (sustained)")
	f.IntVar(&k.Burst, "kube-burst", kube.DefaultBurst, "requests the controller may send the Kubernetes API server at once above --kube-qps")
	f.IntVar(&k.Workers, "kube-workers", kube.DefaultWorkers, "objects of each kind (Sandbox, SandboxWarmPool, SandboxClaim) reconciled at once")
	f.StringVar(&k.MetricsListen, "kube-metrics-listen", "", "serve the controller's Prometheus metrics (reconciles, queue depth, errors) at /metrics on this address (keep it private)")
}

// startKube starts the controller when --kube-controller is set; it runs
// until ctx ends. Each bound namespace's team must exist.
func startKube(ctx context.Context, k kubeFlags, mgr *sandbox.Manager, tiers *runtime.Tiers, templates *template.Store, st *store.Store, c serveConfig, log *slog.Logger) error {
	if !k.Controller {
		if k.Kubeconfig != "" || k.Node != "" || len(k.Teams) > 0 || k.ObjectStore.URL != "" {
			return errors.New("--kubeconfig, --kube-node, --kube-team and --kube-object-store need --kube-controller")
		}
		return nil
	}
	teams := map[string]string{}
	for _, v := range k.Teams {
		ns, ref, ok := strings.Cut(v, "=")
		if !ok || ns == "" || ref == "" {
			return fmt.Errorf("--kube-team %q: want NAMESPACE=TEAM, e.g. agents=default", v)
		}
		if _, dup := teams[ns]; dup {
			return fmt.Errorf("--kube-team: namespace %q is bound twice; bind each namespace to one team", ns)
		}
		t, err := st.FindTeam(ctx, ref)
		if err != nil {
			return fmt.Errorf("--kube-team %q: %w (create it with `agentbox team create`)", v, err)
		}
		teams[ns] = t.ID
	}
	labelTeams, err := labelBinding(ctx, k.Kubeconfig, st, log) // serve_kubeapi.go
	if err != nil {
		return err
	}
	if k.NodeCPU == 0 && k.Node != "" {
		k.NodeCPU = goruntime.NumCPU()
	}
	if k.NodeMemoryMB == 0 && k.Node != "" {
		mb, err := hostMemoryMB()
		if err != nil {
			return fmt.Errorf("--kube-node-memory-mb: %w; set it", err)
		}
		k.NodeMemoryMB = mb
	}
	images, err := openImages(ctx, k.ObjectStore, mgr, c)
	if err != nil {
		return err
	}
	var addr string
	if k.Node != "" { // a controller alone writes no Lease
		addr, err = advertiseAddress(c.KubeAPI.AdvertiseAddress, c.Listen) // serve_kubeapi.go
		if err != nil && c.KubeAPI.AdvertiseAddress != "" {
			return err
		} else if err != nil {
			// Only serve --kubernetes needs it; the agent works without.
			log.Warn("no address for the node agent Lease: serve --kubernetes cannot reach this agent", "err", err)
		}
	}
	ctl, err := kube.New(kube.Config{
		Address:    addr,
		Kubeconfig: k.Kubeconfig, Node: k.Node, Teams: teams, MaxTimeout: c.MaxTimeout,
		LabelTeams: labelTeams, ValidTeamName: store.ValidTeamName,
		LeaderElection: k.LeaderElect, LeaderElectionNamespace: k.LeaderElectNS, MetricsAddr: k.MetricsListen,
		LeaseNamespace: k.LeaseNS, LeaseDuration: k.LeaseDuration, CPU: k.NodeCPU, MemoryMB: k.NodeMemoryMB,
		Images: images, Snapshots: mgr.Snapshots(),
		QPS: k.QPS, Burst: k.Burst, Workers: k.Workers,
		Crash: crashpoint.New(cmp.Or(c.Lifecycle.CrashAfter, c.Lifecycle.FaultStep), log),
	}, mgr, kubeHost{tiers: tiers, templates: templates, teams: teams, log: log}, log.With("component", "kube"))
	if err != nil {
		return err
	}
	go func() {
		if err := ctl.Run(ctx); err != nil {
			log.Error("kubernetes controller stopped", "err", err)
		}
	}()
	log.Info("kubernetes controller started", "node", k.Node, "namespaces", len(teams))
	return nil
}

// kubeHost reports this server's tiers and templates to its node agent
// Lease.
type kubeHost struct {
	tiers     *runtime.Tiers
	templates *template.Store
	teams     map[string]string
	log       *slog.Logger
}

// Tiers reports the tiers by the names clients and runtimeClassName use
// (container, gvisor, microvm), not the drivers' (runc, runsc, microvm).
func (h kubeHost) Tiers() map[string]error {
	out := map[string]error{}
	for _, ti := range runtime.TierInfos() {
		out[ti.Isolation] = h.tiers.TierAvailable(ti.Runtime)
	}
	return out
}

// Templates lists the aliases of the templates the bound teams may use
// (not other teams' private ones).
func (h kubeHost) Templates(ctx context.Context) []string {
	seen := map[string]bool{}
	var out []string
	for _, team := range h.teams {
		tpls, err := h.templates.List(ctx, team)
		if err != nil {
			h.log.Warn("list templates for the node agent lease", "err", err)
			continue
		}
		for _, t := range tpls {
			for _, a := range t.Aliases {
				if !seen[a] {
					seen[a] = true
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// hostMemoryMB reads MemTotal from /proc/meminfo.
func hostMemoryMB() (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read host memory: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				return 0, fmt.Errorf("parse /proc/meminfo MemTotal %q: %w", rest, err)
			}
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no MemTotal in /proc/meminfo")
}
