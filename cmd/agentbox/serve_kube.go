package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store"
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
}

func addKubeFlags(f *pflag.FlagSet, k *kubeFlags) {
	f.BoolVar(&k.Controller, "kube-controller", false, "reconcile the agent-sandbox kinds (agents.x-k8s.io Sandbox; extensions.agents.x-k8s.io SandboxTemplate, SandboxWarmPool, SandboxClaim) of a Kubernetes cluster into sandboxes of this server (docs/kubernetes.md)")
	f.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster for --kube-controller (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&k.Node, "kube-node", "", "node this server is the agent of (required with --kube-controller): it binds unbound Sandboxes to this name in status.nodeName and runs only the Sandboxes bound to it")
	f.StringSliceVar(&k.Teams, "kube-team", nil, "bind a namespace to the team that owns its sandboxes, as NAMESPACE=TEAM (team name or id; repeatable); the controller acts only in bound namespaces")
	f.BoolVar(&k.LeaderElect, "kube-leader-elect", false, "with several node agents, only the leader (a Lease in --kube-leader-elect-namespace) reconciles warm pools and claims; every agent runs its own node's Sandboxes (required when several servers share a cluster)")
	f.StringVar(&k.LeaderElectNS, "kube-leader-elect-namespace", "", "namespace of the leader election Lease (default: the in-cluster namespace)")
	f.StringVar(&k.MetricsListen, "kube-metrics-listen", "", "serve the controller's Prometheus metrics (reconciles, queue depth, errors) at /metrics on this address (keep it private)")
}

// startKube starts the controller when --kube-controller is set; it runs
// until ctx ends. Each bound namespace's team must exist.
func startKube(ctx context.Context, k kubeFlags, mgr *sandbox.Manager, st *store.Store, c serveConfig, log *slog.Logger) error {
	if !k.Controller {
		if k.Kubeconfig != "" || k.Node != "" || len(k.Teams) > 0 {
			return errors.New("--kubeconfig, --kube-node and --kube-team need --kube-controller")
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
	ctl, err := kube.New(kube.Config{
		Kubeconfig: k.Kubeconfig, Node: k.Node, Teams: teams, MaxTimeout: c.MaxTimeout,
		LeaderElection: k.LeaderElect, LeaderElectionNamespace: k.LeaderElectNS, MetricsAddr: k.MetricsListen,
	}, mgr, log.With("component", "kube"))
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
