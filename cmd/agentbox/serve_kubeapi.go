package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/agentbox/agentbox/internal/authlimit"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/kubeapi"
	"github.com/agentbox/agentbox/internal/store"
)

// kubeAPIFlags are the settings of `serve --kubernetes` (the stateless E2B
// API tier of a cluster) and what node agents share with it.
type kubeAPIFlags struct {
	Enabled          bool
	TokenSecretFile  string
	AdvertiseAddress string
	KeysNamespace    string
	WebhooksNS       string
}

func addKubeAPIFlags(f *pflag.FlagSet, k *kubeAPIFlags) {
	f.BoolVar(&k.Enabled, "kubernetes", false, "serve the E2B API and data plane of a whole Kubernetes cluster from its agent-sandbox objects, keeping no state (no store, no sandboxes here, runs unprivileged; several replicas may run): creates become Sandboxes or SandboxClaims run by the node agents (serve --kube-controller), sandbox traffic goes to the agent of the sandbox's node (docs/kubernetes.md)")
	f.StringVar(&k.TokenSecretFile, "token-secret-file", "", "file holding the HMAC secret (at least 32 bytes, mode 0600 or 0400) of sandbox envd access and traffic tokens; give node agents and --kubernetes replicas the same file so the API tier hands out tokens the agents accept (default: a secret of this server's own store)")
	f.StringVar(&k.AdvertiseAddress, "kube-advertise-address", "", "host:port where serve --kubernetes replicas reach this node agent's gateway, reported on its Lease (default: $POD_IP, else the --listen host, with the --listen port)")
	f.StringVar(&k.KeysNamespace, "kube-keys-namespace", "agentbox-system", "with --kubernetes: namespace of the API key Secrets (type agentbox.dev/api-key, label agentbox.dev/team=TEAM, data sha256 = hex SHA-256 of the key)")
	f.StringVar(&k.WebhooksNS, "kube-webhooks-namespace", "agentbox-webhooks", "namespace of the webhooks teams register on the cluster tier (Secrets of type agentbox.dev/webhook), and nothing else: serve --kubernetes writes them there, node agents (--kube-controller) read them to deliver the events they make; must differ from --kube-keys-namespace, since node agents may read every Secret in it")
}

// checkWebhooksNamespace refuses a webhooks namespace the API keys share:
// node agents read every Secret of the webhooks namespace.
func checkWebhooksNamespace(k kubeAPIFlags) error {
	if k.WebhooksNS == "" {
		return errors.New("--kube-webhooks-namespace: name the namespace of the cluster's webhook Secrets (default agentbox-webhooks)")
	}
	if k.WebhooksNS == k.KeysNamespace {
		return fmt.Errorf("--kube-webhooks-namespace %s is --kube-keys-namespace too: node agents read every Secret of the webhooks namespace, so it must hold nothing else; give it a namespace of its own (default agentbox-webhooks)", k.WebhooksNS)
	}
	return nil
}

// readTokenSecret reads --token-secret-file: private to the server and long
// enough to be a key.
func readTokenSecret(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--token-secret-file: %w", err)
	}
	perm := fi.Mode().Perm()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Gid) == os.Getegid() && os.Getegid() != 0 {
		// A Kubernetes Secret volume with fsGroup: group-readable by this
		// process's own group only.
		perm &^= 0o040
	}
	if perm&0o077 != 0 {
		return nil, fmt.Errorf("--token-secret-file %s: mode %04o lets other users read the token secret; chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--token-secret-file: %w", err)
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("--token-secret-file %s: %d bytes is too short a secret; write at least 32 random bytes (e.g. head -c 48 /dev/urandom | base64 > %s)", path, len(b), path)
	}
	return b, nil
}

// advertiseAddress is where API replicas reach this agent: the flag, else
// $POD_IP or the listen host, with the listen port.
func advertiseAddress(flag, listen string) (string, error) {
	if flag != "" {
		if _, _, err := net.SplitHostPort(flag); err != nil {
			return "", fmt.Errorf("--kube-advertise-address %q: want host:port: %w", flag, err)
		}
		return flag, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := os.Getenv("POD_IP"); ip != "" {
		host = ip
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return "", errors.New("--kube-advertise-address: --listen has no host API replicas can reach; set --kube-advertise-address host:port (or POD_IP)")
	}
	return net.JoinHostPort(host, port), nil
}

// serveKubeAPI runs `serve --kubernetes`: the E2B API and data plane of a
// cluster, unprivileged and without a store.
func serveKubeAPI(ctx context.Context, c serveConfig, log *slog.Logger) error {
	if c.Kube.Controller {
		return errors.New("--kubernetes and --kube-controller: run the API tier and the node agents as separate servers")
	}
	secret, err := readTokenSecret(c.KubeAPI.TokenSecretFile)
	if err != nil {
		return err
	}
	proxies, err := parseTrustedProxies(c.TrustedProxies)
	if err != nil {
		return err
	}
	srv, err := kubeapi.New(kubeapi.Config{
		Kubeconfig: c.Kube.Kubeconfig, KeysNamespace: c.KubeAPI.KeysNamespace, LeaseNamespace: c.Kube.LeaseNS,
		TokenSecret: secret, MaxTimeout: c.MaxTimeout, Guesses: authlimit.New(authlimit.Options{TrustedProxies: proxies}),
	}, log.With("component", "kubeapi"))
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	if err := startKubeAPIEvents(ctx, c, srv, secret, log); err != nil { // serve_kubeevents.go
		return err
	}
	ln, err := listen(ctx, c.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("agentbox kubernetes API serving", "listen", ln.Addr().String(), "keys-namespace", c.KubeAPI.KeysNamespace, "lease-namespace", c.Kube.LeaseNS)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// labelBinding returns how the controller binds each namespace labelled
// agentbox.dev/team=NAME (and not bound by --kube-team) to the team NAME
// of this server, created if new, so node agents need no per-team flags:
// live, as namespaces are labelled and re-labelled (internal/kube
// bindings.go). nil when the agent may not list namespaces.
func labelBinding(ctx context.Context, kubeconfig string, st *store.Store, log *slog.Logger) (func(context.Context, string) (string, error), error) {
	err := kube.CanWatchNamespaces(ctx, kubeconfig)
	if apierrors.IsForbidden(err) {
		// An agent whose RBAC predates team labels keeps its --kube-team
		// bindings.
		log.Warn("cannot list namespaces: only --kube-team namespaces are bound (grant list and watch on namespaces to bind agentbox.dev/team labelled ones)", "err", err)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, name string) (string, error) {
		if !store.ValidTeamName(name) {
			return "", fmt.Errorf("label %s=%q is not a team name (1-64 letters, digits, '-', '_' or '.'): %w", kube.LabelTeam, name, errdefs.ErrInvalidArgument)
		}
		t, err := st.EnsureTeam(ctx, name)
		if err != nil {
			return "", err
		}
		return t.ID, nil
	}, nil
}
