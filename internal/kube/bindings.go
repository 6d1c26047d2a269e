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

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
)

// Namespaces bound to teams. --kube-team bindings (Config.Teams) are fixed.
// With Config.LabelTeams, a namespace labelled agentbox.dev/team=NAME is
// bound to team NAME while the agent runs: labelled, re-labelled or
// unlabelled, the namespace reconciler below applies the change at once.
//
// The rule for a change: the Sandboxes of a namespace stay with the team
// that owns them. Every Sandbox an agent runs is labelled with its team's
// name (LabelTeam), and while a namespace holds Sandboxes of a team other
// than the one its label names (or holds any after the label is removed),
// it stays bound to the team that owns them: that team's sandboxes keep
// running and can be deleted, and no new Sandbox there is started (its
// Ready condition says TeamRebinding). The namespace gets a Warning event
// TeamRebindRefused saying so, and the new binding takes effect once the
// old team's Sandboxes are deleted. So a re-label never hands one team's
// sandboxes (or their quota) to another.
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
			r.event(&ns, true, ReasonTeamRebindRefused, "Bind",
				"namespace %s is %s but holds Sandboxes of team %s: it stays bound to team %s, which keeps them, and no new Sandbox is started here until they are deleted (or the label names %s again)",
				name, asked, holder, holder, holder)
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

// holders lists (sorted) the teams other than want that own Sandboxes in
// ns, by the team label agents put on the Sandboxes they run. Only
// Sandboxes an agent ran count (their status, which only agents write,
// has a sandbox id): a team label the object's writer set on one that
// never ran moves no binding.
func (r *nsReconciler) holders(ctx context.Context, ns, want string) ([]string, error) {
	var list agentsv1.SandboxList
	if err := r.c.List(ctx, &list, client.InNamespace(ns), client.HasLabels{LabelTeam}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list Sandboxes of namespace %s: %w", ns, err)
	}
	seen := map[string]bool{}
	for _, o := range list.Items {
		if t := o.Labels[LabelTeam]; t != want && o.Status.SandboxID != "" {
			seen[t] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
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
