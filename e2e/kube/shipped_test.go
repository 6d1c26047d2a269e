package kube

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/e2e/harness"
)

// applyShippedRBAC creates what deploy/k8s's namespace, RBAC and API tier
// manifests hold (ServiceAccounts, roles, bindings, the webhooks
// namespace), keeping what exists, so a test's node agents and replicas
// can run with the manifests' own ServiceAccounts
// (serviceAccountKubeconfig) rather than as cluster admins.
func applyShippedRBAC(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	deploy := filepath.Join(harness.RepoRoot(t), "deploy", "k8s")
	for _, f := range []string{"namespace.yaml", "rbac.yaml", "agentbox-api.yaml"} {
		b, err := os.ReadFile(filepath.Join(deploy, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range decode(t, string(b)) {
			if err := c.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: create %s %s/%s: %v", f, u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
		}
	}
}
