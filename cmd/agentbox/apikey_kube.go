package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/kubeapi"
)

// kubeKeyFlags are `apikey create --kubernetes`: a key of serve
// --kubernetes, kept as a Secret holding only its hash.
type kubeKeyFlags struct {
	enabled    bool
	kubeconfig string
	namespace  string
}

func addKubeKeyFlags(f *pflag.FlagSet, k *kubeKeyFlags) {
	f.BoolVar(&k.enabled, "kubernetes", false, "create the key for agentbox serve --kubernetes: a Secret (type agentbox.dev/api-key, label agentbox.dev/team=TEAM) holding the key's SHA-256 in --kube-keys-namespace, instead of a key of the server's data directory")
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "with --kubernetes: the cluster (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&k.namespace, "kube-keys-namespace", "agentbox-system", "with --kubernetes: namespace of the API key Secrets (serve --kube-keys-namespace)")
}

// createKubeKey makes a key and its Secret and prints the key once.
func createKubeKey(ctx context.Context, out io.Writer, k kubeKeyFlags, team, name string) error {
	rc, err := kube.RESTConfig(k.kubeconfig)
	if err != nil {
		return err
	}
	scheme, err := kube.Scheme()
	if err != nil {
		return err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	plain := "e2b_" + hex.EncodeToString(raw)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "agentbox-key-" + strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(team)) + "-",
			Namespace:    k.namespace,
			Labels:       map[string]string{kube.LabelTeam: team},
			Annotations:  map[string]string{"agentbox.dev/key-mask": plain[:8] + "…" + plain[len(plain)-4:], "agentbox.dev/key-name": name},
		},
		Type: kubeapi.SecretType,
		Data: map[string][]byte{kubeapi.KeyHashField: []byte(kubeapi.HashKey(plain))},
	}
	if err := c.Create(ctx, sec); err != nil {
		return fmt.Errorf("create the API key Secret in namespace %s (--kube-keys-namespace): %w", k.namespace, err)
	}
	fmt.Fprintln(out, plain)
	return nil
}
