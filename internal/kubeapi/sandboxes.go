package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// AnnotationTemplate is the templateID a create asked for; AnnotationIsolation
// the tier (isolation, or the agentbox.isolation metadata key).
const (
	AnnotationTemplate  = "agentbox.dev/template"
	AnnotationIsolation = "agentbox.dev/isolation"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func notFound(id string) error { return sandbox.NotFound(id) }

// maxTimeout refuses a lifetime over the configured maximum, in the local
// manager's words.
func (s *Server) maxTimeout(d time.Duration) error {
	if d > s.cfg.MaxTimeout {
		return invalid("timeout: %s is over the maximum of %s; pass at most %d seconds", d, s.cfg.MaxTimeout, int(s.cfg.MaxTimeout.Seconds()))
	}
	return nil
}

// lookup finds the caller's sandbox id. Another team's sandbox, and an id
// carried by more than one Sandbox (a tenant copying another's id), answer
// exactly like an unknown id.
func (s *Server) lookup(ctx context.Context, who caller, id string) (*agentsv1.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, notFound(id)
	}
	sb, ok, err := s.byID(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok || !slices.Contains(who.namespaces, sb.Namespace) || !ownedBy(sb, who.team) || !sb.DeletionTimestamp.IsZero() {
		return nil, notFound(id)
	}
	return sb, nil
}

// byID finds the one Sandbox labelled with id, in every namespace.
func (s *Server) byID(ctx context.Context, id string) (*agentsv1.Sandbox, bool, error) {
	var list agentsv1.SandboxList
	if err := s.c.List(ctx, &list, client.MatchingLabels{kube.LabelSandboxID: id}); err != nil {
		return nil, false, fmt.Errorf("list Sandboxes: %w", err)
	}
	if len(list.Items) != 1 || list.Items[0].Status.SandboxID != id {
		if len(list.Items) > 1 {
			s.log.Warn("several Sandboxes carry one sandbox id; refusing them all", "sandbox", id, "count", len(list.Items))
		}
		return nil, false, nil
	}
	return &list.Items[0], true, nil
}

// claimOf returns the claim that controls sb, or nil.
func (s *Server) claimOf(ctx context.Context, sb *agentsv1.Sandbox) *extv1.SandboxClaim {
	ref := metav1.GetControllerOf(sb)
	if ref == nil || ref.Kind != "SandboxClaim" {
		return nil
	}
	var c extv1.SandboxClaim
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: sb.Namespace, Name: ref.Name}, &c); err != nil || c.UID != ref.UID {
		return nil
	}
	return &c
}

// sandboxOf is the record the API reports of sb.
func (s *Server) sandboxOf(ctx context.Context, sb *agentsv1.Sandbox) *sandbox.Sandbox {
	// Node agents start a Sandbox object's sandbox secured; the rest is
	// what they report in its status, else what the objects ask for.
	v := &sandbox.Sandbox{ID: sb.Status.SandboxID, State: sandbox.StateRunning, StartedAt: sb.CreationTimestamp.UTC(), Metadata: map[string]string{},
		Secure: true}
	ann := sb.Annotations
	var end *metav1.Time = sb.Spec.ShutdownTime
	if c := s.claimOf(ctx, sb); c != nil {
		ann = c.Annotations
		if c.Spec.Lifecycle != nil {
			end = c.Spec.Lifecycle.ShutdownTime
		}
	}
	v.TemplateID = ann[AnnotationTemplate]
	if raw := ann[AnnotationMetadata]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &v.Metadata)
	}
	v.Isolation = ann[AnnotationIsolation]
	if raw := ann[kube.AnnotationNetwork]; raw != "" {
		var n sandbox.NetworkSpec
		if json.Unmarshal([]byte(raw), &n) == nil {
			v.Network = &n
		}
	}
	if cs := sb.Spec.PodTemplate.Spec.Containers; len(cs) > 0 {
		if v.TemplateID == "" {
			v.TemplateID = cs[0].Image
		}
		lim := cs[0].Resources.Limits
		if q, ok := lim[corev1.ResourceCPU]; ok {
			v.CPUCount = int((q.MilliValue() + 999) / 1000)
		}
		mib := func(q resource.Quantity) int { return int((q.Value() + (1<<20 - 1)) >> 20) }
		if q, ok := lim[corev1.ResourceMemory]; ok {
			v.MemoryMB = mib(q)
		}
		if q, ok := lim[corev1.ResourceEphemeralStorage]; ok {
			v.DiskMB = mib(q)
		}
	}
	if end != nil {
		v.EndAt = end.UTC()
	} else {
		v.EndAt = time.Now().Add(s.cfg.MaxTimeout).UTC()
	}
	if r := sb.Status.Sandbox; r != nil {
		// What the node agent running it reports.
		v.TemplateID, v.Alias, v.Isolation = r.TemplateID, r.Alias, r.Isolation
		v.CPUCount, v.MemoryMB, v.DiskMB, v.PIDs, v.TmpMB = r.CPUCount, r.MemoryMB, r.DiskSizeMB, r.PIDs, r.TmpSizeMB
		v.AllowInternet = r.AllowInternetAccess
	}
	if meta.IsStatusConditionTrue(sb.Status.Conditions, agentsv1.ConditionSuspended) {
		// As the local manager keeps it: the lifetime left is on hold.
		v.State, v.TimeLeft = sandbox.StatePaused, max(time.Until(v.EndAt), 0)
	}
	return v
}

// ---- create ----

// Create makes a Sandbox (or a SandboxClaim of a warm pool serving the
// template, or a Sandbox restored from one of the team's snapshots) in the
// team's first namespace and waits until its node agent runs it.
func (s *Server) Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error) {
	who, err := s.teamNamespaces(ctx, req.TeamID)
	if err != nil {
		return nil, err
	}
	if err := s.maxTimeout(req.Timeout); err != nil {
		return nil, err
	}
	tpl := req.Template
	if err := notCarried(req); err != nil {
		return nil, err
	}
	if len(who.home) == 0 && len(who.held) > 0 {
		held := slices.Sorted(maps.Keys(who.held))
		return nil, fmt.Errorf("namespace %s is labelled %s=%s but still holds Sandboxes or SandboxSnapshots of team %s: it passes to team %s once they are deleted (or label another namespace for team %s): %w",
			held[0], kube.LabelTeam, who.team, who.held[held[0]], who.team, who.team, errdefs.ErrConflict)
	}
	if len(who.home) == 0 {
		return nil, fmt.Errorf("team %s has no namespace: label one with %s=%s (kubectl label namespace NS %s=%s): %w",
			who.team, kube.LabelTeam, who.team, kube.LabelTeam, who.team, errdefs.ErrConflict)
	}
	ns := who.home[0]
	id := sandbox.NewID()
	end := metav1.NewTime(time.Now().Add(req.Timeout).Truncate(time.Second))
	ann := map[string]string{kube.AnnotationSandboxID: id, AnnotationTemplate: tpl,
		kube.AnnotationAllowInternet: strconv.FormatBool(req.AllowInternet)}
	if len(req.Metadata) > 0 {
		raw, err := json.Marshal(req.Metadata)
		if err != nil {
			return nil, invalid("metadata: %v", err)
		}
		ann[AnnotationMetadata] = string(raw)
	}
	if req.Network != nil {
		raw, err := json.Marshal(req.Network)
		if err != nil {
			return nil, invalid("network: %v", err)
		}
		ann[kube.AnnotationNetwork] = string(raw)
	}
	iso := req.Isolation
	if iso == "" {
		iso = req.Metadata[sandbox.MetadataIsolation]
	}
	if iso != "" {
		ann[AnnotationIsolation] = iso
	}
	om := metav1.ObjectMeta{Name: id, Namespace: ns, Annotations: ann, Labels: map[string]string{LabelOrigin: "e2b-api"}}
	snap, err := s.snapshotOf(ctx, who, tpl)
	if err != nil {
		return nil, err
	}
	if snap != nil {
		if req.Limits.CPUCount != 0 || req.Limits.MemoryMB != 0 || req.Limits.DiskMB != 0 || iso != "" {
			return nil, invalid("cpuCount, memoryMB, diskSizeMB, isolation: snapshot %s holds a memory image, which keeps the limits and tier it was taken with; leave them out", tpl)
		}
		obj := fromSnapshot(snap, om, req.EnvVars, end)
		if err := s.c.Create(ctx, obj); err != nil {
			return nil, fmt.Errorf("create Sandbox %s/%s: %w", obj.Namespace, id, kubeErr(err))
		}
		return s.awaitSandbox(ctx, obj, id)
	}
	pool, err := s.poolFor(ctx, ns, tpl)
	if err != nil {
		return nil, err
	}
	// A pool's members run with the template's tier, limits and network:
	// a create that asks for others starts cold instead, so it gets them.
	if l := req.Limits; iso != "" || l.CPUCount > 0 || l.MemoryMB > 0 || l.DiskMB > 0 || req.Network != nil {
		pool = ""
	}
	if pool != "" {
		claim := &extv1.SandboxClaim{ObjectMeta: om}
		claim.Spec.WarmPoolRef.Name = pool
		claim.Spec.Lifecycle = &extv1.ClaimLifecycle{ShutdownTime: &end, ShutdownPolicy: extv1.ClaimShutdownDelete}
		for _, k := range sortedKeys(req.EnvVars) {
			claim.Spec.Env = append(claim.Spec.Env, extv1.EnvVar{Name: k, Value: req.EnvVars[k]})
		}
		if err := s.c.Create(ctx, claim); err != nil {
			return nil, fmt.Errorf("create SandboxClaim %s/%s: %w", ns, id, kubeErr(err))
		}
		return s.awaitClaim(ctx, claim)
	}
	obj := &agentsv1.Sandbox{ObjectMeta: om}
	var tmpl extv1.SandboxTemplate
	switch err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tpl}, &tmpl); {
	case err == nil:
		obj.Spec.Blueprint = *tmpl.Spec.Blueprint.DeepCopy()
		obj.Annotations[agentsv1.AnnotationTemplateRef] = tmpl.Name
	case apierrors.IsNotFound(err):
		obj.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "sandbox", Image: tpl}}
	default:
		return nil, fmt.Errorf("read SandboxTemplate %s/%s: %w", ns, tpl, err)
	}
	if len(obj.Spec.PodTemplate.Spec.Containers) == 0 {
		return nil, invalid("templateID %q: SandboxTemplate %s/%s has no container", tpl, ns, tpl)
	}
	c := &obj.Spec.PodTemplate.Spec.Containers[0]
	for _, k := range sortedKeys(req.EnvVars) {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == k })
		if i >= 0 {
			c.Env[i] = corev1.EnvVar{Name: k, Value: req.EnvVars[k]}
		} else {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: req.EnvVars[k]})
		}
	}
	if l := req.Limits; l.CPUCount > 0 || l.MemoryMB > 0 || l.DiskMB > 0 {
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		if l.CPUCount > 0 {
			c.Resources.Limits[corev1.ResourceCPU] = *resource.NewQuantity(int64(l.CPUCount), resource.DecimalSI)
		}
		if l.MemoryMB > 0 {
			c.Resources.Limits[corev1.ResourceMemory] = *resource.NewQuantity(int64(l.MemoryMB)<<20, resource.BinarySI)
		}
		if l.DiskMB > 0 {
			c.Resources.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(l.DiskMB)<<20, resource.BinarySI)
		}
	}
	if iso != "" {
		// The runtime class is the tier's driver name (runc, runsc,
		// microvm), which the node agents map back to the tier.
		rc := sandbox.RuntimeTier(iso)
		obj.Spec.PodTemplate.Spec.RuntimeClassName = &rc
	}
	obj.Spec.ShutdownTime = &end
	del := agentsv1.ShutdownPolicyDelete
	obj.Spec.ShutdownPolicy = &del
	if err := s.c.Create(ctx, obj); err != nil {
		return nil, fmt.Errorf("create Sandbox %s/%s: %w", ns, id, kubeErr(err))
	}
	return s.awaitSandbox(ctx, obj, id)
}

// notCarried refuses what a create asks that the cluster's objects cannot
// carry to a node agent, rather than dropping it.
func notCarried(req sandbox.CreateRequest) error {
	var fields []string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"autoPause", req.Lifecycle.AutoPause}, {"autoResume", req.Lifecycle.AutoResume}, {"idleTimeout", req.Lifecycle.IdleTimeout > 0},
		{"volumeMounts", len(req.VolumeMounts) > 0},
		{"pids", req.Limits.PIDs != 0}, {"tmpSizeMB", req.Limits.TmpMB != 0}, {"maxCommandSeconds", req.MaxCommand != 0},
	} {
		if f.set {
			fields = append(fields, f.name)
		}
	}
	if len(fields) == 0 {
		return nil
	}
	return invalid("%s: not served by `agentbox serve --kubernetes`; create the sandbox on a node agent's own API, or leave %s out",
		strings.Join(fields, ", "), map[bool]string{true: "it", false: "them"}[len(fields) == 1])
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// kubeErr maps an API server refusal to the API's errors.
func kubeErr(err error) error {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		return fmt.Errorf("%v: %w", err, errdefs.ErrConflict)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)
	}
	return err
}

// poolFor names the warm pool serving template tpl in ns ("" = none).
func (s *Server) poolFor(ctx context.Context, ns, tpl string) (string, error) {
	var pools extv1.SandboxWarmPoolList
	if err := s.c.List(ctx, &pools, client.InNamespace(ns)); err != nil {
		return "", fmt.Errorf("list SandboxWarmPools: %w", err)
	}
	var names []string
	for _, p := range pools.Items {
		if p.Spec.TemplateRef.Name == tpl && p.DeletionTimestamp.IsZero() {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "", nil
	}
	return names[0], nil
}

// failReasons are Ready=False reasons that end a wait: the sandbox will not
// start without someone changing something.
var failReasons = map[string]error{
	agentsv1.ReasonInvalidSpec:     errdefs.ErrInvalidArgument,
	extv1.ReasonTemplateNotFound:   errdefs.ErrInvalidArgument,
	extv1.ReasonWarmPoolNotFound:   errdefs.ErrInvalidArgument,
	extv1.ReasonInvalidClaim:       errdefs.ErrInvalidArgument,
	kube.ReasonUnschedulable:       errdefs.ErrUnavailable,
	kube.ReasonNodeLost:            errdefs.ErrUnavailable,
	kube.ReasonTeamRebinding:       errdefs.ErrConflict,
	agentsv1.ReasonReconcilerError: errdefs.ErrUnavailable,
	agentsv1.ReasonSandboxGone:     errdefs.ErrNotFound,
	agentsv1.ReasonExpired:         errdefs.ErrNotFound,
	// A create from a snapshot.
	kube.ReasonSnapshotNotFound:    errdefs.ErrInvalidArgument,
	kube.ReasonSnapshotNotReady:    errdefs.ErrInvalidArgument,
	kube.ReasonSnapshotUnavailable: errdefs.ErrUnavailable,
	kube.ReasonImageIntegrity:      errdefs.ErrUnavailable,
	kube.ReasonImageRestoreFailed:  errdefs.ErrUnavailable,
}

// failed says why conds mean the sandbox will not become ready.
func failed(conds []metav1.Condition) error {
	if c := meta.FindStatusCondition(conds, agentsv1.ConditionFinished); c != nil && c.Status == metav1.ConditionTrue {
		return fmt.Errorf("%s: %s: %w", c.Reason, c.Message, errdefs.ErrNotFound)
	}
	c := meta.FindStatusCondition(conds, agentsv1.ConditionReady)
	if c == nil || c.Status == metav1.ConditionTrue {
		return nil
	}
	if kind, ok := failReasons[c.Reason]; ok {
		return fmt.Errorf("%s: %s: %w", c.Reason, c.Message, kind)
	}
	return nil
}

// poll runs f on the informer cache until it is done or the wait runs out.
func (s *Server) poll(ctx context.Context, what string, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CreateWait)
	defer cancel()
	for {
		done, err := f()
		if done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not done after %s: %w", what, s.cfg.CreateWait, errdefs.ErrUnavailable)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// awaitSandbox waits until the Sandbox runs under id; on failure it deletes
// it.
func (s *Server) awaitSandbox(ctx context.Context, obj *agentsv1.Sandbox, id string) (*sandbox.Sandbox, error) {
	var got *agentsv1.Sandbox
	err := s.poll(ctx, "start sandbox "+id, func() (bool, error) {
		var sb agentsv1.Sandbox
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), &sb); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if err := failed(sb.Status.Conditions); err != nil {
			return false, fmt.Errorf("sandbox %s did not start: %w", id, err)
		}
		got = &sb
		return meta.IsStatusConditionTrue(sb.Status.Conditions, agentsv1.ConditionReady) && sb.Labels[kube.LabelSandboxID] == id, nil
	})
	if err != nil {
		s.cleanup(obj)
		return nil, err
	}
	return s.sandboxOf(ctx, got), nil
}

// awaitClaim waits until the claim holds a ready sandbox; on failure it
// deletes the claim.
func (s *Server) awaitClaim(ctx context.Context, claim *extv1.SandboxClaim) (*sandbox.Sandbox, error) {
	var id string
	err := s.poll(ctx, "claim a sandbox for "+claim.Name, func() (bool, error) {
		var c extv1.SandboxClaim
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(claim), &c); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if err := failed(c.Status.Conditions); err != nil {
			return false, fmt.Errorf("SandboxClaim %s/%s did not get a sandbox: %w", c.Namespace, c.Name, err)
		}
		id = c.Status.SandboxStatus.SandboxID
		return meta.IsStatusConditionTrue(c.Status.Conditions, agentsv1.ConditionReady) && id != "", nil
	})
	var sb *agentsv1.Sandbox
	if err == nil {
		// The Sandbox carries the id label once its agent wrote it.
		err = s.poll(ctx, "label sandbox "+id, func() (bool, error) {
			got, ok, err := s.byID(ctx, id)
			sb = got
			return ok, err
		})
	}
	if err != nil {
		s.cleanup(claim)
		return nil, err
	}
	return s.sandboxOf(ctx, sb), nil
}

// cleanup deletes what a failed create made.
func (s *Server) cleanup(obj client.Object) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		s.log.Warn("delete what a failed create made", "name", obj.GetName(), "namespace", obj.GetNamespace(), "err", err)
	}
}

// ---- read ----

// List is the team's sandboxes (those an agent runs, carrying the id of
// one Sandbox alone), newest first.
func (s *Server) List(ctx context.Context, team string) ([]*sandbox.Sandbox, error) {
	who, err := s.teamNamespaces(ctx, team)
	if err != nil {
		return nil, err
	}
	var out []*sandbox.Sandbox
	for _, ns := range who.namespaces {
		var list agentsv1.SandboxList
		if err := s.c.List(ctx, &list, client.InNamespace(ns), client.HasLabels{kube.LabelSandboxID}); err != nil {
			return nil, fmt.Errorf("list Sandboxes: %w", err)
		}
		for i := range list.Items {
			sb := &list.Items[i]
			id := sb.Labels[kube.LabelSandboxID]
			if !sb.DeletionTimestamp.IsZero() || sb.Status.SandboxID != id || !ownedBy(sb, who.team) || failed(sb.Status.Conditions) != nil {
				continue
			}
			if _, ok, _ := s.byID(ctx, id); !ok {
				continue
			}
			out = append(out, s.sandboxOf(ctx, sb))
		}
	}
	// Newest first, ties by id, as the local manager lists.
	slices.SortFunc(out, func(a, b *sandbox.Sandbox) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Get is the team's sandbox id.
func (s *Server) Get(ctx context.Context, team, id string) (*sandbox.Sandbox, error) {
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return nil, err
	}
	return s.sandboxOf(ctx, sb), nil
}

// find is the team's Sandbox object of id.
func (s *Server) find(ctx context.Context, team, id string) (*agentsv1.Sandbox, error) {
	who, err := s.teamNamespaces(ctx, team)
	if err != nil {
		return nil, err
	}
	return s.lookup(ctx, who, id)
}

// ---- change ----

// Kill deletes the Sandbox (or the claim holding it).
func (s *Server) Kill(ctx context.Context, team, id string) error {
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return err
	}
	var obj client.Object = sb
	if c := s.claimOf(ctx, sb); c != nil {
		obj = c // the claim releases its sandbox
	}
	if err := s.c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete %s: %w", obj.GetName(), kubeErr(err))
	}
	s.awaitGone(ctx, sb, &agentsv1.Sandbox{})
	return nil
}

// awaitGone returns once this replica's cache sees obj gone or going (a
// finalizer may hold it a while), so a list right after does not show it.
func (s *Server) awaitGone(ctx context.Context, obj, into client.Object) {
	_ = s.poll(ctx, "delete", func() (bool, error) {
		err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), into)
		return apierrors.IsNotFound(err) || (err == nil && !into.GetDeletionTimestamp().IsZero()), nil
	})
}

// setEnd moves the sandbox's end (on its claim when a claim holds it).
func (s *Server) setEnd(ctx context.Context, sb *agentsv1.Sandbox, end time.Time, onlyLater bool) error {
	t := metav1.NewTime(end.Truncate(time.Second))
	if c := s.claimOf(ctx, sb); c != nil {
		if onlyLater && c.Spec.Lifecycle != nil && c.Spec.Lifecycle.ShutdownTime != nil && !c.Spec.Lifecycle.ShutdownTime.Time.Before(t.Time) {
			return nil
		}
		base := c.DeepCopy()
		if c.Spec.Lifecycle == nil {
			c.Spec.Lifecycle = &extv1.ClaimLifecycle{ShutdownPolicy: extv1.ClaimShutdownDelete}
		}
		c.Spec.Lifecycle.ShutdownTime = &t
		if err := s.c.Patch(ctx, c, client.MergeFrom(base)); err != nil {
			return kubeErr(err)
		}
		return s.seen(ctx, c, &extv1.SandboxClaim{})
	}
	if onlyLater && sb.Spec.ShutdownTime != nil && !sb.Spec.ShutdownTime.Time.Before(t.Time) {
		return nil
	}
	base := sb.DeepCopy()
	sb.Spec.ShutdownTime = &t
	if sb.Spec.ShutdownPolicy == nil {
		del := agentsv1.ShutdownPolicyDelete
		sb.Spec.ShutdownPolicy = &del
	}
	if err := s.c.Patch(ctx, sb, client.MergeFrom(base)); err != nil {
		return kubeErr(err)
	}
	return s.seen(ctx, sb, &agentsv1.Sandbox{})
}

// seen waits until this replica's cache holds obj's write (its generation),
// so the caller's next read sees it.
func (s *Server) seen(ctx context.Context, obj client.Object, into client.Object) error {
	return s.poll(ctx, "see the write of "+obj.GetName(), func() (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(obj), into); err != nil {
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}
		return into.GetGeneration() >= obj.GetGeneration(), nil
	})
}

// SetTimeout sets the sandbox's end to d from now.
func (s *Server) SetTimeout(ctx context.Context, team, id string, d time.Duration) error {
	if err := s.maxTimeout(d); err != nil {
		return err
	}
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return err
	}
	return s.setEnd(ctx, sb, time.Now().Add(d), false)
}

// Extend moves the sandbox's end to at least d from now.
func (s *Server) Extend(ctx context.Context, team, id string, d time.Duration) (*sandbox.Sandbox, error) {
	if err := s.maxTimeout(d); err != nil {
		return nil, err
	}
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return nil, err
	}
	if paused(sb) {
		return nil, fmt.Errorf("sandbox %q is %s: %w", id, sandbox.StatePaused, errdefs.ErrConflict)
	}
	if err := s.setEnd(ctx, sb, time.Now().Add(d), true); err != nil {
		return nil, err
	}
	return s.Get(ctx, team, id)
}

// setMode writes operatingMode and waits for the sandbox to get there.
func (s *Server) setMode(ctx context.Context, sb *agentsv1.Sandbox, mode agentsv1.OperatingMode) (*agentsv1.Sandbox, error) {
	base := sb.DeepCopy()
	sb.Spec.OperatingMode = mode
	if err := s.c.Patch(ctx, sb, client.MergeFrom(base)); err != nil {
		return nil, kubeErr(err)
	}
	gen := sb.Generation
	var got *agentsv1.Sandbox
	err := s.poll(ctx, string(mode)+" sandbox "+sb.Status.SandboxID, func() (bool, error) {
		var cur agentsv1.Sandbox
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(sb), &cur); err != nil {
			if apierrors.IsNotFound(err) {
				return false, notFound(sb.Status.SandboxID)
			}
			return false, err
		}
		got = &cur
		if cur.Status.ObservedGeneration < gen {
			return false, nil
		}
		if mode == agentsv1.OperatingModeSuspended {
			if c := meta.FindStatusCondition(cur.Status.Conditions, agentsv1.ConditionSuspended); c != nil && c.Status == metav1.ConditionFalse && c.Reason == agentsv1.ReasonReconcilerError {
				return false, fmt.Errorf("pause: %s: %w", c.Message, errdefs.ErrUnavailable)
			}
			return meta.IsStatusConditionTrue(cur.Status.Conditions, agentsv1.ConditionSuspended), nil
		}
		if err := failed(cur.Status.Conditions); err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(cur.Status.Conditions, agentsv1.ConditionReady), nil
	})
	return got, err
}

func paused(sb *agentsv1.Sandbox) bool {
	return sb.Spec.OperatingMode == agentsv1.OperatingModeSuspended ||
		meta.IsStatusConditionTrue(sb.Status.Conditions, agentsv1.ConditionSuspended)
}

// Pause suspends the sandbox with its memory kept.
func (s *Server) Pause(ctx context.Context, team, id string, memory bool) error {
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return err
	}
	if !memory {
		return errFilesOnly
	}
	if paused(sb) {
		return fmt.Errorf("sandbox %q is already paused: %w", id, errdefs.ErrConflict)
	}
	_, err = s.setMode(ctx, sb, agentsv1.OperatingModeSuspended)
	return err
}

// errFilesOnly refuses E2B's memory: false, which the node agents' objects
// cannot ask for.
var errFilesOnly = invalid("memory: false (a filesystem-only pause, resume or snapshot) is not served by `agentbox serve --kubernetes`; leave memory out")

// Resume runs a suspended sandbox again for d; a running one is left as
// it is (resumed false).
func (s *Server) Resume(ctx context.Context, team, id string, d time.Duration, memory bool) (*sandbox.Sandbox, bool, error) {
	if err := s.maxTimeout(d); err != nil {
		return nil, false, err
	}
	sb, err := s.find(ctx, team, id)
	if err != nil {
		return nil, false, err
	}
	if !paused(sb) {
		return s.sandboxOf(ctx, sb), false, nil
	}
	if !memory {
		return nil, false, errFilesOnly
	}
	if err := s.setEnd(ctx, sb, time.Now().Add(d), false); err != nil {
		return nil, false, err
	}
	if sb, err = s.find(ctx, team, id); err != nil {
		return nil, false, err
	}
	got, err := s.setMode(ctx, sb, agentsv1.OperatingModeRunning)
	if err != nil {
		return nil, false, err
	}
	return s.sandboxOf(ctx, got), true, nil
}

// CheckNetwork validates a network policy as a local server does. The
// policy travels to the node agent on the Sandbox object
// (kube.AnnotationNetwork), which its team can read: credentials (header
// rules, an egress proxy's password) are refused rather than written there.
func (s *Server) CheckNetwork(ctx context.Context, team string, allowInternet bool, n *sandbox.NetworkSpec) error {
	if n != nil {
		for d, rules := range n.Rules {
			for i, r := range rules {
				if r.Transform != nil && len(r.Transform.Headers) > 0 {
					return invalid("network.rules[%q][%d].transform.headers: credential injection is not served by `agentbox serve --kubernetes` (the rule would sit in the Sandbox object); create the sandbox on a node agent's own API", d, i)
				}
			}
		}
		if p := n.EgressProxy; p != nil && p.Password != "" {
			return invalid("network.egressProxy.password: not served by `agentbox serve --kubernetes` (it would sit in the Sandbox object); create the sandbox on a node agent's own API")
		}
	}
	return sandbox.CheckNetworkSpec(ctx, allowInternet, n)
}

// Tokens derives the sandbox's tokens from the agents' shared secret.
func (s *Server) Tokens(_ context.Context, id string) (envd, traffic string) {
	return sandbox.AccessToken(s.cfg.TokenSecret, id), sandbox.TrafficToken(s.cfg.TokenSecret, id)
}
