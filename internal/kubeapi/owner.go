package kubeapi

import (
	"github.com/agentbox/agentbox/internal/kube"
	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// ownedBy reports whether sb is team's: in a namespace labelled for team
// (checked by the caller) and, once an agent ran it, labelled with team's
// name. A namespace re-labelled to another team still holds the old team's
// Sandboxes until they are deleted (internal/kube bindings.go): they stay
// the old team's, never the new one's.
func ownedBy(sb *agentsv1.Sandbox, team string) bool {
	owner, ok := sb.Labels[kube.LabelTeam]
	return !ok || owner == team
}

// snapshotOwnedBy reports whether snap is team's: in one of team's
// namespaces (checked by the caller) and, once an agent took it, taken by
// team (status.team). Every snapshot route (list, delete, restore, the
// replacement of a named one) finds snapshots through teamSnapshots, which
// asks this.
func snapshotOwnedBy(snap *abv1.SandboxSnapshot, team string) bool {
	owner := kube.SnapshotTeam(snap)
	return owner == "" || owner == team
}
