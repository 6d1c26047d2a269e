package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	abv1 "github.com/agentbox/agentbox/internal/kube/apis/agentbox/v1alpha1"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// Namespaces bound to teams. --kube-team bindings (Config.Teams) are fixed.
// With Config.LabelTeams, a namespace labelled agentbox.dev/team=NAME is
// bound to team NAME while the agent runs: labelled, re-labelled or
// unlabelled, the namespace reconciler below applies the change at once.
//
// The rule for a change: the Sandboxes and SandboxSnapshots of a namespace
// stay with the team that owns them. Every Sandbox an agent runs is
// labelled with its team's name (LabelTeam), every SandboxSnapshot an agent
// takes records it (status.team), and while a namespace holds Sandboxes or
// SandboxSnapshots of a team other than the one its label names (or holds
// any after the label is removed), it stays bound to the team that owns
// them: that team's sandboxes keep running and its snapshots stay its own,
// both can be deleted, and no new Sandbox there is started (its Ready
// condition says TeamRebinding). The namespace gets a Warning event
// TeamRebindRefused saying so, and the new binding takes effect once the
// old team's objects are deleted. So a re-label never hands one team's
// sandboxes or snapshots (or their quota) to another. serve --kubernetes
// reads bindings by the same rule (Holders).
const (
	ReasonTeamRebinding     = "TeamRebinding"
	ReasonTeamRebindRefused = "TeamRebindRefused"
	ReasonTeamBound         = "TeamBound"
	ReasonTeamUnbound       = "TeamUnbound"
	// holdRecheck: a refused re-binding is looked at again this often
	// (besides on every namespace event).
	holdRecheck = 10 * time.Second
)

// nsBinding is a namespace's team: its id on this server and its name.
type nsBinding struct {
	id, name string
	// pending is the label's team ("" = unlabelled) the namespace waits
	// to be bound to while it holds this team's Sandboxes.
	pending  string
	refusing bool
}

// bindings are the namespaces this agent acts in. Safe for concurrent use.
type bindings struct {
	mu       sync.RWMutex
	fixed    map[string]nsBinding
	labelled map[string]nsBinding
}

func newBindings(cfg Config) *bindings {
	b := &bindings{fixed: map[string]nsBinding{}, labelled: map[string]nsBinding{}}
	for ns, id := range cfg.Teams {
		// No name: only label-bound namespaces' Sandboxes carry their
		// team's (a --kube-team namespace is never re-bound).
		b.fixed[ns] = nsBinding{id: id}
	}
	return b
}

// team returns the binding of ns.
func (b *bindings) team(ns string) (nsBinding, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if t, ok := b.fixed[ns]; ok {
		return t, true
	}
	t, ok := b.labelled[ns]
	return t, ok
}

// namespaces lists the bound namespaces, sorted.
func (b *bindings) namespaces() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := slices.Collect(maps.Keys(b.fixed))
	for ns := range b.labelled {
		if _, ok := b.fixed[ns]; !ok {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

func (b *bindings) set(ns string, t nsBinding, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.labelled[ns] = t
	} else {
		delete(b.labelled, ns)
	}
}

// nsReconciler binds labelled namespaces live (every agent, leader or not).
type nsReconciler struct {
	reconcilerBase
	// wake re-queues a namespace's objects once it is bound.
	wake []chan event.GenericEvent
}

// NeedLeaderElection is false: every agent keeps its own bindings.
func (r *nsReconciler) NeedLeaderElection() bool { return false }

func (r *nsReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	name := req.Name
	if _, fixed := r.teams.fixed[name]; fixed {
		return ctrl.Result{}, nil // --kube-team wins over a label
	}
	var ns corev1.Namespace
	want := ""
	switch err := r.c.Get(ctx, client.ObjectKey{Name: name}, &ns); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return ctrl.Result{}, err
	case ns.DeletionTimestamp.IsZero():
		want = ns.Labels[LabelTeam]
	}
	if want != "" && r.cfg.ValidTeamName != nil && !r.cfg.ValidTeamName(want) {
		r.event(&ns, true, "InvalidTeamLabel", "Bind", "label %s=%q is not a team name (1-64 letters, digits, '-', '_' or '.'); the namespace is not bound to it: fix the label", LabelTeam, want)
		want = ""
	}
	holders, err := r.holders(ctx, name, want)
	if err != nil {
		return ctrl.Result{}, err
	}
	cur, bound := r.teams.team(name)
	if len(holders) > 0 {
		// Stays with (or goes back to) the team whose Sandboxes it holds.
		holder := holders[0]
		id := cur.id
		if !bound || cur.name != holder {
			if id, err = r.cfg.LabelTeams(ctx, holder); err != nil {
				return ctrl.Result{}, fmt.Errorf("namespace %s: team %s: %w", name, holder, err)
			}
		}
		next := nsBinding{id: id, name: holder, pending: want, refusing: true}
		r.teams.set(name, next, true)
		if (!bound || !cur.refusing || cur.pending != want || cur.name != holder) && ns.Name != "" {
			asked := fmt.Sprintf("labelled %s=%q", LabelTeam, want)
			if want == "" {
				asked = "no longer labelled " + LabelTeam
			}
			what, err := r.heldKinds(ctx, name, holder)
			if err != nil {
				return ctrl.Result{}, err
			}
			r.event(&ns, true, ReasonTeamRebindRefused, "Bind",
				"namespace %s is %s but holds %s of team %s: it stays bound to team %s, which keeps them, and no new Sandbox is started here until they are deleted (or the label names %s again)",
				name, asked, what, holder, holder, holder)
			r.wakeNamespace(ctx, name)
		}
		return ctrl.Result{RequeueAfter: holdRecheck}, nil
	}
	if want == "" {
		if bound {
			r.teams.set(name, nsBinding{}, false)
			if ns.Name != "" { // not deleted
				r.event(&ns, false, ReasonTeamUnbound, "Bind", "namespace %s is no longer labelled %s: unbound from team %s", name, LabelTeam, cur.name)
			}
		}
		return ctrl.Result{}, nil
	}
	if bound && cur.name == want && !cur.refusing {
		return ctrl.Result{}, nil
	}
	id, err := r.cfg.LabelTeams(ctx, want)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("namespace %s: team %s: %w", name, want, err)
	}
	r.teams.set(name, nsBinding{id: id, name: want}, true)
	r.event(&ns, false, ReasonTeamBound, "Bind", "namespace %s bound to team %s (label %s)", name, want, LabelTeam)
	r.wakeNamespace(ctx, name)
	return ctrl.Result{}, nil
}

// holders lists (sorted) the teams other than want that own Sandboxes or
// SandboxSnapshots in ns (Holders).
func (r *nsReconciler) holders(ctx context.Context, ns, want string) ([]string, error) {
	return Holders(ctx, r.c, ns, want)
}

// Holders lists (sorted) the teams other than want that own objects in
// ns: Sandboxes an agent ran, by the team label agents put on them, and
// SandboxSnapshots an agent took, by their status.team. While it holds
// any, ns stays bound to their team whatever its label says: the node
// agents bind it so, and serve --kubernetes serves it so. Only objects an
// agent ran or took count (their status, which only agents write, has an
// id): a team label the object's writer set on one that never ran moves no
// binding.
func Holders(ctx context.Context, c client.Reader, ns, want string) ([]string, error) {
	seen := map[string]bool{}
	var sbs agentsv1.SandboxList
	if err := c.List(ctx, &sbs, client.InNamespace(ns), client.HasLabels{LabelTeam}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list Sandboxes of namespace %s: %w", ns, err)
	}
	for _, o := range sbs.Items {
		if t := o.Labels[LabelTeam]; t != want && o.Status.SandboxID != "" {
			seen[t] = true
		}
	}
	var snaps abv1.SandboxSnapshotList
	if err := c.List(ctx, &snaps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list SandboxSnapshots of namespace %s: %w", ns, err)
	}
	for _, o := range snaps.Items {
		if t := SnapshotTeam(&o); t != "" && t != want {
			seen[t] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

// BoundTeam is the team a label-bound namespace is bound to by the rule
// above ("" = none): the first (sorted) team other than its label's that
// holds objects in it, else its label's.
func BoundTeam(ctx context.Context, c client.Reader, ns *corev1.Namespace) (string, error) {
	want := ""
	if ns.DeletionTimestamp.IsZero() {
		want = ns.Labels[LabelTeam]
	}
	holders, err := Holders(ctx, c, ns.Name, want)
	if err != nil {
		return "", err
	}
	if len(holders) > 0 {
		return holders[0], nil
	}
	return want, nil
}

// SnapshotTeam is the team a SandboxSnapshot belongs to ("" = its
// namespace's: one no agent took yet, or taken in a --kube-team
// namespace).
func SnapshotTeam(s *abv1.SandboxSnapshot) string {
	if s.Status.SnapshotID == "" {
		return ""
	}
	return s.Status.Team
}

// heldKinds names what team holds in ns: "Sandboxes", "SandboxSnapshots"
// or both.
func (r *nsReconciler) heldKinds(ctx context.Context, ns, team string) (string, error) {
	var snaps abv1.SandboxSnapshotList
	if err := r.c.List(ctx, &snaps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("list SandboxSnapshots of namespace %s: %w", ns, err)
	}
	var sbs agentsv1.SandboxList
	if err := r.c.List(ctx, &sbs, client.InNamespace(ns), client.MatchingLabels{LabelTeam: team}, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("list Sandboxes of namespace %s: %w", ns, err)
	}
	hasSnap := slices.ContainsFunc(snaps.Items, func(s abv1.SandboxSnapshot) bool { return SnapshotTeam(&s) == team })
	hasSbx := slices.ContainsFunc(sbs.Items, func(s agentsv1.Sandbox) bool { return s.Status.SandboxID != "" })
	switch {
	case hasSnap && hasSbx:
		return "Sandboxes and SandboxSnapshots", nil
	case hasSnap:
		return "SandboxSnapshots", nil
	}
	return "Sandboxes", nil
}

// wakeNamespace re-queues every Sandbox, warm pool and claim of ns, which
// were skipped while it was unbound (or must now see the refusal).
func (r *nsReconciler) wakeNamespace(ctx context.Context, ns string) {
	lists := []client.ObjectList{&agentsv1.SandboxList{}, &extv1.SandboxWarmPoolList{}, &extv1.SandboxClaimList{}}
	for i, l := range lists {
		if i >= len(r.wake) {
			break
		}
		if err := r.c.List(ctx, l, client.InNamespace(ns)); err != nil {
			r.log.Warn("re-queue the objects of a bound namespace", "namespace", ns, "err", err)
			continue
		}
		var objs []client.Object
		switch l := l.(type) {
		case *agentsv1.SandboxList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *extv1.SandboxWarmPoolList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *extv1.SandboxClaimList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		for _, o := range objs {
			select {
			case r.wake[i] <- event.GenericEvent{Object: o}:
			case <-ctx.Done():
				return
			}
		}
	}
}
