package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// The node agent's Lease: one per agent, named for its node, renewed every
// third of its duration; its annotation carries what placement needs.
const (
	LeasePrefix          = "agentbox-node-"
	LabelNodeAgent       = "agentbox.dev/node-agent"
	LabelNode            = "agentbox.dev/node"
	AnnotationNodeStatus = "agentbox.dev/node-status"
	// ReasonNodeLost is the Ready reason of a Sandbox whose node agent
	// stopped renewing its Lease.
	ReasonNodeLost = "NodeLost"
	// ReasonUnschedulable is the Ready reason of an unbound Sandbox no
	// live node agent can run.
	ReasonUnschedulable = "Unschedulable"
)

// Host is what a node agent reports about the server it runs on.
type Host interface {
	// Tiers maps each registered isolation tier to nil when it can run
	// here, else to why not.
	Tiers() map[string]error
	// Templates lists the names (aliases) of the templates built here.
	Templates(ctx context.Context) []string
}

// NodeStatus is the JSON of a node agent Lease's agentbox.dev/node-status
// annotation.
type NodeStatus struct {
	Node string `json:"node"`
	// CPU and MemoryMB are what the agent may allocate to sandboxes.
	CPU      int `json:"cpu"`
	MemoryMB int `json:"memoryMB"`
	// FreeCPU and FreeMemoryMB are CPU and MemoryMB less the limits of the
	// sandboxes running on the server (also those made through the E2B API).
	FreeCPU      int `json:"freeCPU"`
	FreeMemoryMB int `json:"freeMemoryMB"`
	Sandboxes    int `json:"sandboxes"`
	// Tiers can run here; UnavailableTiers says why the others cannot.
	Tiers            []string          `json:"tiers"`
	UnavailableTiers map[string]string `json:"unavailableTiers,omitempty"`
	Templates        []string          `json:"templates"`
	// Address is host:port of the agent's gateway as the API tier
	// (serve --kubernetes) reaches it (--kube-advertise-address).
	Address string `json:"address,omitempty"`
}

// node is a node agent as placement sees it.
type node struct {
	NodeStatus
	live bool
	// renewed is the Lease's last renewal, for the NodeLost message.
	renewed time.Time
}

// status measures this agent now.
func (b reconcilerBase) status(ctx context.Context) NodeStatus {
	st := NodeStatus{Node: b.cfg.Node, CPU: b.cfg.CPU, MemoryMB: b.cfg.MemoryMB, UnavailableTiers: map[string]string{}, Address: b.cfg.Address}
	usedCPU, usedMem := 0, 0
	for _, sb := range b.sbs.Running() {
		usedCPU += sb.CPUCount
		usedMem += sb.MemoryMB
		st.Sandboxes++
	}
	st.FreeCPU, st.FreeMemoryMB = max(st.CPU-usedCPU, 0), max(st.MemoryMB-usedMem, 0)
	for name, err := range b.host.Tiers() {
		if err != nil {
			st.UnavailableTiers[name] = err.Error()
			continue
		}
		st.Tiers = append(st.Tiers, name)
	}
	slices.Sort(st.Tiers)
	st.Templates = b.host.Templates(ctx)
	slices.Sort(st.Templates)
	return st
}

// heartbeat renews this agent's Lease with its status, then marks the
// Sandboxes of agents whose Lease expired NodeLost.
type heartbeat struct{ reconcilerBase }

// NeedLeaderElection is false: every node agent reports itself.
func (h *heartbeat) NeedLeaderElection() bool { return false }

// Start renews the Lease until ctx ends.
func (h *heartbeat) Start(ctx context.Context) error {
	every := h.cfg.LeaseDuration / 3
	for {
		if err := h.renew(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("renew node agent lease", "err", err)
		}
		if err := h.markLost(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("mark sandboxes of lost nodes", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

func (b reconcilerBase) renew(ctx context.Context) error {
	raw, err := json.Marshal(b.status(ctx))
	if err != nil {
		return err
	}
	name := LeasePrefix + b.cfg.Node
	var l coordv1.Lease
	err = b.api.Get(ctx, client.ObjectKey{Namespace: b.cfg.LeaseNamespace, Name: name}, &l)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get lease %s/%s: %w", b.cfg.LeaseNamespace, name, err)
	}
	missing := err != nil
	l.Namespace, l.Name = b.cfg.LeaseNamespace, name
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Labels[LabelNodeAgent] = "true"
	l.Labels[LabelNode] = b.cfg.Node
	l.Annotations[AnnotationNodeStatus] = string(raw)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(max(b.cfg.LeaseDuration/time.Second, 1))
	l.Spec.HolderIdentity = &b.cfg.Node
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &now
	if missing {
		l.Spec.AcquireTime = &now
		err = b.c.Create(ctx, &l)
	} else {
		err = b.c.Update(ctx, &l)
	}
	if err != nil {
		return fmt.Errorf("write lease %s/%s: %w", b.cfg.LeaseNamespace, name, err)
	}
	return nil
}

// nodes reads every node agent's Lease from the API server: a node is
// declared lost on what it says, never on a cache that may lag.
func (b reconcilerBase) nodes(ctx context.Context) ([]node, error) {
	return b.nodesFrom(ctx, b.api)
}

// nodesFrom reads every node agent's Lease from rd.
func (b reconcilerBase) nodesFrom(ctx context.Context, rd client.Reader) ([]node, error) {
	var leases coordv1.LeaseList
	if err := rd.List(ctx, &leases, client.InNamespace(b.cfg.LeaseNamespace), client.MatchingLabels{LabelNodeAgent: "true"}); err != nil {
		return nil, fmt.Errorf("list node agent leases in %s: %w", b.cfg.LeaseNamespace, err)
	}
	now := time.Now()
	var out []node
	for _, l := range leases.Items {
		var n node
		if err := json.Unmarshal([]byte(l.Annotations[AnnotationNodeStatus]), &n.NodeStatus); err != nil || n.Node == "" {
			continue
		}
		if r, d := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds; r != nil && d != nil {
			n.renewed = r.Time
			n.live = now.Before(r.Add(time.Duration(*d) * time.Second))
		}
		out = append(out, n)
	}
	return out, nil
}

// markLost sets Ready=False NodeLost on the Sandboxes bound to nodes whose
// agent let its Lease expire. They stay bound: the agent reconciles them
// when it returns.
func (h *heartbeat) markLost(ctx context.Context) error {
	nodes, err := h.nodes(ctx)
	if err != nil {
		return err
	}
	lost := map[string]node{}
	for _, n := range nodes {
		if !n.live && n.Node != h.cfg.Node {
			lost[n.Node] = n
		}
	}
	if len(lost) == 0 {
		return nil
	}
	for _, ns := range h.teams.namespaces() {
		var list agentsv1.SandboxList
		if err := h.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for i := range list.Items {
			obj := &list.Items[i]
			n, ok := lost[obj.Status.NodeName]
			if !ok || meta.IsStatusConditionTrue(obj.Status.Conditions, agentsv1.ConditionFinished) {
				continue
			}
			if moved, err := h.moveStored(ctx, obj, n); err != nil || moved {
				if err != nil {
					return err
				}
				continue
			}
			if c := meta.FindStatusCondition(obj.Status.Conditions, agentsv1.ConditionReady); c != nil && c.Reason == ReasonNodeLost {
				continue
			}
			msg := fmt.Sprintf("node %s is lost: its agent has not renewed Lease %s/%s%s since %s; the Sandbox stays bound and its agent reconciles it when it returns",
				n.Node, h.cfg.LeaseNamespace, LeasePrefix, n.Node, n.renewed.UTC().Format(time.RFC3339))
			setCond(&obj.Status.Conditions, obj.Generation, agentsv1.ConditionReady, false, ReasonNodeLost, msg)
			err := h.runMove(ctx, OpNodeLost, []moveStep{{NodeLostMark, func(ctx context.Context) error {
				if err := h.c.Status().Update(ctx, obj); err != nil {
					return err
				}
				h.event(obj, true, ReasonNodeLost, "MarkLost", "%s", msg)
				return nil
			}}})
			if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return err // a conflict or a deleted object: the next pass looks again
			}
		}
	}
	return nil
}

// want is what a Sandbox asks of a node.
type want struct {
	tier     string // "" = the template's; any agent can run it
	template string
	cpu, mem int
}

// Sandboxes that set no limits count as this much for placement.
const (
	defaultPlaceCPU = 1
	defaultPlaceMem = 512
)

func wantOf(obj *agentsv1.Sandbox) (want, error) {
	tier, err := runtimeClassTier(obj.Spec.PodTemplate.Spec.RuntimeClassName)
	if err != nil {
		return want{}, err
	}
	w := want{tier: tier, cpu: defaultPlaceCPU, mem: defaultPlaceMem}
	if cs := obj.Spec.PodTemplate.Spec.Containers; len(cs) > 0 {
		w.template = templateName(cs[0].Image)
		if l, err := limits(cs[0].Resources); err == nil {
			if l.CPUCount > 0 {
				w.cpu = l.CPUCount
			}
			if l.MemoryMB > 0 {
				w.mem = l.MemoryMB
			}
		}
	}
	return w, nil
}

// place picks the node for w among the live agents: one that can run its
// tier, then one with room for it, then one that has its template, then the
// most free memory, then the most free CPU, then the name. ok is false (and
// why says why) when no live agent can run the tier.
func place(nodes []node, w want) (best string, why string, ok bool) {
	var cands []node
	var refusals []string
	for _, n := range nodes {
		if !n.live {
			continue
		}
		if w.tier != "" && !slices.Contains(n.Tiers, w.tier) {
			reason := n.UnavailableTiers[w.tier]
			if reason == "" {
				reason = "not registered"
			}
			refusals = append(refusals, n.Node+": "+reason)
			continue
		}
		cands = append(cands, n)
	}
	if len(cands) == 0 {
		sort.Strings(refusals)
		if len(refusals) == 0 {
			return "", "no live node agent (no unexpired agentbox-node-* Lease)", false
		}
		return "", fmt.Sprintf("no live node agent can run isolation tier %s: %s", w.tier, strings.Join(refusals, "; ")), false
	}
	fits := func(n node) bool { return n.FreeCPU >= w.cpu && n.FreeMemoryMB >= w.mem }
	has := func(n node) bool { return slices.Contains(n.Templates, w.template) }
	better := func(a, b node) bool {
		if fa, fb := fits(a), fits(b); fa != fb {
			return fa
		}
		if ha, hb := has(a), has(b); ha != hb {
			return ha
		}
		if a.FreeMemoryMB != b.FreeMemoryMB {
			return a.FreeMemoryMB > b.FreeMemoryMB
		}
		if a.FreeCPU != b.FreeCPU {
			return a.FreeCPU > b.FreeCPU
		}
		return a.Node < b.Node
	}
	pick := cands[0]
	for _, n := range cands[1:] {
		if better(n, pick) {
			pick = n
		}
	}
	return pick.Node, "", true
}

// withBindings lowers each node's free capacity by what the Sandboxes
// bound to it ask for, when that is more than its Lease reported: a
// binding counts at once, before its agent's next renewal.
func withBindings(nodes []node, bound map[string][2]int) []node {
	out := slices.Clone(nodes)
	for i := range out {
		u := bound[out[i].Node]
		out[i].FreeCPU = min(out[i].FreeCPU, max(out[i].CPU-u[0], 0))
		out[i].FreeMemoryMB = min(out[i].FreeMemoryMB, max(out[i].MemoryMB-u[1], 0))
	}
	return out
}

// placement decides where an unbound Sandbox goes.
func (b reconcilerBase) placement(ctx context.Context, obj *agentsv1.Sandbox) (best, why string, ok bool, err error) {
	w, err := wantOf(obj)
	if err != nil {
		return "", "", false, err
	}
	// From the cache: a bind per Sandbox would otherwise list the Leases
	// from the API server on every agent; a lagging view only ranks the
	// nodes by a renewal-old status, as the Lease itself does.
	nodes, err := b.nodesFrom(ctx, b.c)
	if err != nil {
		return "", "", false, err
	}
	bound := map[string][2]int{}
	for _, ns := range b.teams.namespaces() {
		var list agentsv1.SandboxList
		// Read-only: no copy of every Sandbox for each binding.
		if err := b.c.List(ctx, &list, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
			return "", "", false, err
		}
		for i := range list.Items {
			o := &list.Items[i]
			if o.Status.NodeName == "" || meta.IsStatusConditionTrue(o.Status.Conditions, agentsv1.ConditionFinished) {
				continue
			}
			ow, err := wantOf(o)
			if err != nil {
				continue
			}
			u := bound[o.Status.NodeName]
			bound[o.Status.NodeName] = [2]int{u[0] + ow.cpu, u[1] + ow.mem}
		}
	}
	if only := b.snapshotNode(ctx, obj); only != "" {
		// A snapshot outside the object store starts only on its node.
		nodes = slices.DeleteFunc(nodes, func(n node) bool { return n.Node != only })
		if !slices.ContainsFunc(nodes, func(n node) bool { return n.live }) {
			return "", fmt.Sprintf("its SandboxSnapshot %s is kept on node %s only (no --kube-object-store) and that node's agent is not live", obj.Annotations[AnnotationSnapshot], only), false, nil
		}
	}
	best, why, ok = place(withBindings(nodes, bound), w)
	return best, why, ok, nil
}
