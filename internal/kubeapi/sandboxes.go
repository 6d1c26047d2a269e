package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	extv1 "github.com/agentbox/agentbox/internal/kube/apis/extensions/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// AnnotationTemplate is the templateID a create asked for.
const AnnotationTemplate = "agentbox.dev/template"

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

func notFound(id string) error {
	return fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
}

// seconds checks a timeout field against the maximum.
func (s *Server) seconds(field string, v *int64, def int64) (time.Duration, error) {
	n := def
	if v != nil {
		n = *v
	}
	if n < 0 {
		return 0, invalid("%s: must be 0 or more seconds", field)
	}
	d := time.Duration(n) * time.Second
	if d > s.cfg.MaxTimeout {
		return 0, invalid("%s: %s is over the maximum of %s; pass at most %d seconds", field, d, s.cfg.MaxTimeout, int64(s.cfg.MaxTimeout.Seconds()))
	}
	return d, nil
}

// lookup finds the caller's sandbox id. Another team's sandbox, and an id
// carried by more than one Sandbox (a tenant copying another's id), answer
// exactly like an unknown id.
func (s *Server) lookup(ctx context.Context, id string) (*agentsv1.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, notFound(id)
	}
	sb, ok, err := s.byID(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok || !slices.Contains(callerOf(ctx).namespaces, sb.Namespace) || !ownedBy(sb, callerOf(ctx).team) || !sb.DeletionTimestamp.IsZero() {
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

// view is a sandbox as the API reports it.
type view struct {
	id, template, state string
	started, end        time.Time
	metadata            map[string]string
	cpu, mem, disk      int
}

func (s *Server) viewOf(ctx context.Context, sb *agentsv1.Sandbox) view {
	v := view{id: sb.Status.SandboxID, state: "running", started: sb.CreationTimestamp.UTC(), metadata: map[string]string{}}
	if meta.IsStatusConditionTrue(sb.Status.Conditions, agentsv1.ConditionSuspended) {
		v.state = "paused"
	}
	ann := sb.Annotations
	var end *metav1.Time = sb.Spec.ShutdownTime
	if c := s.claimOf(ctx, sb); c != nil {
		ann = c.Annotations
		if c.Spec.Lifecycle != nil {
			end = c.Spec.Lifecycle.ShutdownTime
		}
	}
	v.template = ann[AnnotationTemplate]
	if raw := ann[AnnotationMetadata]; raw != "" {
		_ = json.Unmarshal([]byte(raw), &v.metadata)
	}
	if cs := sb.Spec.PodTemplate.Spec.Containers; len(cs) > 0 {
		if v.template == "" {
			v.template = cs[0].Image
		}
		lim := cs[0].Resources.Limits
		if q, ok := lim[corev1.ResourceCPU]; ok {
			v.cpu = int((q.MilliValue() + 999) / 1000)
		}
		mib := func(q resource.Quantity) int { return int((q.Value() + (1<<20 - 1)) >> 20) }
		if q, ok := lim[corev1.ResourceMemory]; ok {
			v.mem = mib(q)
		}
		if q, ok := lim[corev1.ResourceEphemeralStorage]; ok {
			v.disk = mib(q)
		}
	}
	if end != nil {
		v.end = end.UTC()
	} else {
		v.end = time.Now().Add(s.cfg.MaxTimeout).UTC()
	}
	return v
}

func (s *Server) sandboxResponse(v view) rest.Sandbox {
	return rest.Sandbox{SandboxID: v.id, TemplateID: v.template, ClientID: sandbox.ClientID, EnvdVersion: sandbox.EnvdVersion,
		EnvdAccessToken: sandbox.AccessToken(s.cfg.TokenSecret, v.id)}
}

func listed(v view) rest.ListedSandbox {
	return rest.ListedSandbox{SandboxID: v.id, TemplateID: v.template, ClientID: sandbox.ClientID, StartedAt: v.started, EndAt: v.end,
		State: v.state, CPUCount: v.cpu, MemoryMB: v.mem, DiskSizeMB: v.disk, EnvdVersion: sandbox.EnvdVersion, Metadata: v.metadata}
}

// ---- create ----

func (s *Server) create(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body rest.NewSandbox
		if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
			httperr.Write(w, err)
			return
		}
		def := int64(15)
		if v2 {
			def = 300
		}
		d, err := s.seconds("timeout", body.Timeout, def)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		v, err := s.createSandbox(r.Context(), body, d)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		httperr.WriteJSON(w, http.StatusCreated, s.sandboxResponse(v))
	}
}

func (s *Server) createSandbox(ctx context.Context, body rest.NewSandbox, d time.Duration) (view, error) {
	who := callerOf(ctx)
	tpl := body.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	if len(tpl) > 253 || strings.ContainsAny(tpl, " \t\r\n") {
		return view{}, invalid("templateID %q: name a SandboxTemplate of your namespace or an agentbox template", tpl)
	}
	switch {
	case body.AutoPause != nil && *body.AutoPause, body.AutoResume != nil && body.AutoResume.Enabled, len(body.VolumeMounts) > 0,
		body.Network != nil, body.AllowInternetAccess != nil && !*body.AllowInternetAccess, body.IdleTimeout != nil && *body.IdleTimeout > 0:
		return view{}, invalid("autoPause, autoResume, volumeMounts, network, allow_internet_access and idleTimeout are not served by `agentbox serve --kubernetes`; create the sandbox on a node agent's own API, or leave them out")
	}
	if len(who.home) == 0 && len(who.held) > 0 {
		held := slices.Sorted(maps.Keys(who.held))
		return view{}, fmt.Errorf("namespace %s is labelled %s=%s but still holds Sandboxes or SandboxSnapshots of team %s: it passes to team %s once they are deleted (or label another namespace for team %s): %w",
			held[0], kube.LabelTeam, who.team, who.held[held[0]], who.team, who.team, errdefs.ErrConflict)
	}
	if len(who.home) == 0 {
		return view{}, fmt.Errorf("team %s has no namespace: label one with %s=%s (kubectl label namespace NS %s=%s): %w",
			who.team, kube.LabelTeam, who.team, kube.LabelTeam, who.team, errdefs.ErrConflict)
	}
	ns := who.home[0]
	id := sandbox.NewID()
	end := metav1.NewTime(time.Now().Add(d).Truncate(time.Second))
	ann := map[string]string{kube.AnnotationSandboxID: id, AnnotationTemplate: tpl}
	if len(body.Metadata) > 0 {
		raw, err := json.Marshal(body.Metadata)
		if err != nil {
			return view{}, invalid("metadata: %v", err)
		}
		ann[AnnotationMetadata] = string(raw)
	}
	om := metav1.ObjectMeta{Name: id, Namespace: ns, Annotations: ann, Labels: map[string]string{LabelOrigin: "e2b-api"}}
	snap, err := s.snapshotOf(ctx, tpl)
	if err != nil {
		return view{}, err
	}
	if snap != nil {
		if body.CPUCount != nil || body.MemoryMB != nil || body.DiskSizeMB != nil || body.Isolation != nil {
			return view{}, invalid("cpuCount, memoryMB, diskSizeMB, isolation: snapshot %s holds a memory image, which keeps the limits and tier it was taken with; leave them out", tpl)
		}
		obj := fromSnapshot(snap, om, body, end)
		if err := s.c.Create(ctx, obj); err != nil {
			return view{}, fmt.Errorf("create Sandbox %s/%s: %w", obj.Namespace, id, kubeErr(err))
		}
		return s.awaitSandbox(ctx, obj, id)
	}
	pool, err := s.poolFor(ctx, ns, tpl)
	if err != nil {
		return view{}, err
	}
	if pool != "" {
		claim := &extv1.SandboxClaim{ObjectMeta: om}
		claim.Spec.WarmPoolRef.Name = pool
		claim.Spec.Lifecycle = &extv1.ClaimLifecycle{ShutdownTime: &end, ShutdownPolicy: extv1.ClaimShutdownDelete}
		for _, k := range sortedKeys(body.EnvVars) {
			claim.Spec.Env = append(claim.Spec.Env, extv1.EnvVar{Name: k, Value: body.EnvVars[k]})
		}
		if err := s.c.Create(ctx, claim); err != nil {
			return view{}, fmt.Errorf("create SandboxClaim %s/%s: %w", ns, id, kubeErr(err))
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
		return view{}, fmt.Errorf("read SandboxTemplate %s/%s: %w", ns, tpl, err)
	}
	if len(obj.Spec.PodTemplate.Spec.Containers) == 0 {
		return view{}, invalid("templateID %q: SandboxTemplate %s/%s has no container", tpl, ns, tpl)
	}
	c := &obj.Spec.PodTemplate.Spec.Containers[0]
	for _, k := range sortedKeys(body.EnvVars) {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == k })
		if i >= 0 {
			c.Env[i] = corev1.EnvVar{Name: k, Value: body.EnvVars[k]}
		} else {
			c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: body.EnvVars[k]})
		}
	}
	if body.CPUCount != nil || body.MemoryMB != nil || body.DiskSizeMB != nil {
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		if n := body.CPUCount; n != nil && *n > 0 {
			c.Resources.Limits[corev1.ResourceCPU] = *resource.NewQuantity(int64(*n), resource.DecimalSI)
		}
		if n := body.MemoryMB; n != nil && *n > 0 {
			c.Resources.Limits[corev1.ResourceMemory] = *resource.NewQuantity(int64(*n)<<20, resource.BinarySI)
		}
		if n := body.DiskSizeMB; n != nil && *n > 0 {
			c.Resources.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(int64(*n)<<20, resource.BinarySI)
		}
	}
	if body.Isolation != nil && *body.Isolation != "" {
		rc := *body.Isolation
		obj.Spec.PodTemplate.Spec.RuntimeClassName = &rc
	}
	obj.Spec.ShutdownTime = &end
	del := agentsv1.ShutdownPolicyDelete
	obj.Spec.ShutdownPolicy = &del
	if err := s.c.Create(ctx, obj); err != nil {
		return view{}, fmt.Errorf("create Sandbox %s/%s: %w", ns, id, kubeErr(err))
	}
	return s.awaitSandbox(ctx, obj, id)
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
func (s *Server) awaitSandbox(ctx context.Context, obj *agentsv1.Sandbox, id string) (view, error) {
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
		return view{}, err
	}
	return s.viewOf(ctx, got), nil
}

// awaitClaim waits until the claim holds a ready sandbox; on failure it
// deletes the claim.
func (s *Server) awaitClaim(ctx context.Context, claim *extv1.SandboxClaim) (view, error) {
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
		return view{}, err
	}
	return s.viewOf(ctx, sb), nil
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

type listQuery struct {
	metadata map[string]string
	states   []string
}

func parseList(q url.Values) (listQuery, error) {
	f, err := apireq.ParseListFilters(q)
	return listQuery{metadata: f.Metadata, states: f.States}, err
}

func (lq listQuery) match(v view) bool {
	for k, want := range lq.metadata {
		if got, ok := v.metadata[k]; !ok || got != want {
			return false
		}
	}
	return len(lq.states) == 0 || slices.Contains(lq.states, v.state)
}

func (s *Server) list(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		lq, err := parseList(r.URL.Query())
		if err != nil {
			httperr.Write(w, err)
			return
		}
		var pq pageQuery
		if v2 {
			if pq, err = s.parsePage(r.URL.Query(), callerOf(r.Context()).team); err != nil { // listpage.go
				httperr.Write(w, err)
				return
			}
		} else {
			lq.states = nil
		}
		var views []view
		for _, ns := range callerOf(r.Context()).namespaces {
			var list agentsv1.SandboxList
			if err := s.c.List(r.Context(), &list, client.InNamespace(ns), client.HasLabels{kube.LabelSandboxID}); err != nil {
				httperr.Write(w, fmt.Errorf("list Sandboxes: %w", err))
				return
			}
			for i := range list.Items {
				sb := &list.Items[i]
				id := sb.Labels[kube.LabelSandboxID]
				if !sb.DeletionTimestamp.IsZero() || sb.Status.SandboxID != id || !ownedBy(sb, callerOf(r.Context()).team) || failed(sb.Status.Conditions) != nil {
					continue
				}
				if _, ok, _ := s.byID(r.Context(), id); !ok {
					continue
				}
				if v := s.viewOf(r.Context(), sb); lq.match(v) {
					views = append(views, v)
				}
			}
		}
		sortViews(views, pq.asc)
		if v2 {
			views = s.page(w, callerOf(r.Context()).team, views, pq, lq.states)
		}
		out := []rest.ListedSandbox{}
		for _, v := range views {
			out = append(out, listed(v))
		}
		httperr.WriteJSON(w, http.StatusOK, out)
	}
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	v := s.viewOf(r.Context(), sb)
	httperr.WriteJSON(w, http.StatusOK, rest.SandboxDetail{
		SandboxID: v.id, TemplateID: v.template, ClientID: sandbox.ClientID, StartedAt: v.started, EndAt: v.end, State: v.state,
		CPUCount: v.cpu, MemoryMB: v.mem, DiskSizeMB: v.disk, EnvdVersion: sandbox.EnvdVersion, Metadata: v.metadata,
		EnvdAccessToken: sandbox.AccessToken(s.cfg.TokenSecret, v.id), AllowInternetAccess: true,
		Lifecycle: rest.SandboxLifecycle{OnTimeout: "kill"},
	})
}

// ---- change ----

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	sb, err := s.lookup(ctx, r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	var obj client.Object = sb
	if c := s.claimOf(ctx, sb); c != nil {
		obj = c // the claim releases its sandbox
	}
	if err := s.c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		httperr.Write(w, fmt.Errorf("delete %s: %w", obj.GetName(), kubeErr(err)))
		return
	}
	// Answer once this replica's cache sees it go, so a list right after
	// does not show it.
	_ = s.poll(ctx, "delete", func() (bool, error) {
		var got agentsv1.Sandbox
		err := s.c.Get(ctx, client.ObjectKeyFromObject(sb), &got)
		return apierrors.IsNotFound(err) || (err == nil && !got.DeletionTimestamp.IsZero()), nil
	})
	w.WriteHeader(http.StatusNoContent)
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

func (s *Server) timeout(w http.ResponseWriter, r *http.Request) {
	var body rest.TimeoutRequest
	if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	if body.Timeout == nil {
		httperr.Write(w, invalid("timeout: required, in seconds"))
		return
	}
	d, err := s.seconds("timeout", body.Timeout, 0)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := s.setEnd(r.Context(), sb, time.Now().Add(d), false); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var body rest.RefreshRequest
	if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	d, err := s.seconds("duration", body.Duration, 15)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	d = max(d, 15*time.Second)
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if err := s.setEnd(r.Context(), sb, time.Now().Add(d), true); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
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

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if paused(sb) {
		httperr.Write(w, fmt.Errorf("sandbox %q is already paused: %w", sb.Status.SandboxID, errdefs.ErrConflict))
		return
	}
	if _, err := s.setMode(r.Context(), sb, agentsv1.OperatingModeSuspended); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wake resumes a paused sandbox for d, or extends a running one to at
// least d; resumed says which.
func (s *Server) wake(ctx context.Context, id string, d time.Duration, mustBePaused bool) (v view, resumed bool, err error) {
	sb, err := s.lookup(ctx, id)
	if err != nil {
		return view{}, false, err
	}
	if !paused(sb) {
		if mustBePaused {
			return view{}, false, fmt.Errorf("sandbox %q is already running: %w", id, errdefs.ErrConflict)
		}
		if err := s.setEnd(ctx, sb, time.Now().Add(d), true); err != nil {
			return view{}, false, err
		}
		return s.viewOf(ctx, sb), false, nil
	}
	if err := s.setEnd(ctx, sb, time.Now().Add(d), false); err != nil {
		return view{}, false, err
	}
	sb, err = s.lookup(ctx, id)
	if err != nil {
		return view{}, false, err
	}
	got, err := s.setMode(ctx, sb, agentsv1.OperatingModeRunning)
	if err != nil {
		return view{}, false, err
	}
	return s.viewOf(ctx, got), true, nil
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	var body rest.ResumedSandbox
	if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	d, err := s.seconds("timeout", body.Timeout, 15)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	v, _, err := s.wake(r.Context(), r.PathValue("id"), d, true)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, s.sandboxResponse(v))
}

func (s *Server) connect(v2 bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body rest.ConnectSandbox
		if err := apireq.DecodeJSON(w, r, 1<<20, true, &body); err != nil {
			httperr.Write(w, err)
			return
		}
		if !v2 && body.Timeout == nil {
			httperr.Write(w, invalid("timeout: required, in seconds"))
			return
		}
		d, err := s.seconds("timeout", body.Timeout, 300)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		v, resumed, err := s.wake(r.Context(), r.PathValue("id"), d, false)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		code := http.StatusOK
		if resumed {
			code = http.StatusCreated
		}
		httperr.WriteJSON(w, code, s.sandboxResponse(v))
	}
}
