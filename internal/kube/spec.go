// Package kube is agentbox's Kubernetes controller: it reconciles the
// agent-sandbox kinds (Sandbox, SandboxTemplate, SandboxWarmPool,
// SandboxClaim) by creating, pausing and killing sandboxes through the
// server's own sandbox manager, so every Kubernetes sandbox runs the same
// create pipeline, hardening and quotas as one made through the E2B API.
package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/runtime"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// Metadata keys agentbox puts on the sandboxes it makes for Kubernetes
// objects: they find a sandbox again after a status write was lost.
const (
	MetaUID       = "k8s.uid"
	MetaNamespace = "k8s.namespace"
	MetaName      = "k8s.name"
)

// AnnotationAllowInternet ("true" or "false") on a Sandbox says whether
// its sandbox may reach the internet. The cluster's E2B API sets it from
// the create's allow_internet_access; without it a Sandbox's sandbox has no
// internet access.
const AnnotationAllowInternet = "agentbox.dev/allow-internet"

// AnnotationNetwork on a Sandbox holds its sandbox's network policy (the
// E2B create's network, JSON); the node agent checks it like a create on
// its own API.
const AnnotationNetwork = "agentbox.dev/network"

// runtimeClassTier maps a pod's runtimeClassName to an isolation tier
// (runtime's tier table: a tier's client name or its driver's). Empty
// means the template's tier.
func runtimeClassTier(rc *string) (string, error) {
	if rc == nil || *rc == "" {
		return "", nil
	}
	iso, err := runtime.IsolationOfClass(*rc)
	if err != nil {
		return "", fmt.Errorf("spec.podTemplate.spec.%w", err)
	}
	return iso, nil
}

// createRequest turns a Sandbox's blueprint into the manager's create
// request for team. Only the first container runs; the fields of the pod
// spec agentbox cannot honour are refused rather than ignored.
func createRequest(sb *agentsv1.Sandbox, teamID string, timeout time.Duration) (sandbox.CreateRequest, error) {
	bad := func(field, why string) (sandbox.CreateRequest, error) {
		return sandbox.CreateRequest{}, fmt.Errorf("%s: %s: %w", field, why, errdefs.ErrInvalidArgument)
	}
	spec := sb.Spec.PodTemplate.Spec
	if len(spec.Containers) == 0 {
		return bad("spec.podTemplate.spec.containers", "needs one container whose image names the agentbox template")
	}
	if len(spec.Containers) > 1 || len(spec.InitContainers) > 0 {
		return bad("spec.podTemplate.spec.containers", "agentbox runs one container per sandbox; remove the others")
	}
	if len(sb.Spec.VolumeClaimTemplates) > 0 {
		return bad("spec.volumeClaimTemplates", "not supported by agentbox yet; use E2B volumes")
	}
	c := spec.Containers[0]
	if c.Image == "" {
		return bad("spec.podTemplate.spec.containers[0].image", "required: it names the agentbox template")
	}
	if len(c.Command) > 0 || len(c.Args) > 0 {
		return bad("spec.podTemplate.spec.containers[0].command", "the template's start command runs; set it in the template")
	}
	tier, err := runtimeClassTier(spec.RuntimeClassName)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	if c.WorkingDir != "" && (!path.IsAbs(c.WorkingDir) || path.Clean(c.WorkingDir) != c.WorkingDir) {
		return bad("spec.podTemplate.spec.containers[0].workingDir", fmt.Sprintf("%q must be a clean absolute path", c.WorkingDir))
	}
	env := map[string]string{}
	for i, e := range c.Env {
		if e.ValueFrom != nil {
			return bad(fmt.Sprintf("spec.podTemplate.spec.containers[0].env[%d].valueFrom", i), "not supported; give a value")
		}
		env[e.Name] = e.Value
	}
	if len(c.EnvFrom) > 0 {
		return bad("spec.podTemplate.spec.containers[0].envFrom", "not supported; list env values")
	}
	lim, err := limits(c.Resources)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	id, err := chosenID(sb)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	var network *sandbox.NetworkSpec
	if raw := sb.Annotations[AnnotationNetwork]; raw != "" {
		network = &sandbox.NetworkSpec{}
		if err := json.Unmarshal([]byte(raw), network); err != nil {
			return bad("metadata.annotations["+AnnotationNetwork+"]", fmt.Sprintf("not a network policy (%v)", err))
		}
	}
	return sandbox.CreateRequest{
		ID: id,
		// Secure: envd wants the access token, which the server's API and
		// an API replica sharing --token-secret-file hand out.
		Secure:    true,
		TeamID:    teamID,
		Template:  templateName(c.Image),
		Timeout:   timeout,
		EnvVars:   env,
		Isolation: tier,
		Limits:    lim,
		// Deny by default: only an explicit "true" opens the internet.
		AllowInternet: sb.Annotations[AnnotationAllowInternet] == "true",
		Network:       network,
		Workdir:       c.WorkingDir,
		Metadata:      sandboxMetadata(sb), // metadata.go
	}, nil
}

// templateName is the agentbox template an image names: the image
// reference without registry host or tag ("docker.io/library/base:latest"
// and "base" both name "base"), so agent-sandbox manifests keep their image
// lines when the template of that name exists.
func templateName(image string) string {
	name := image
	if i := strings.LastIndex(name, "@"); i >= 0 {
		name = name[:i]
	}
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	return name
}

// limits reads a container's resources: limits win over requests, CPU is
// rounded up to whole CPUs and memory to MiB.
func limits(r corev1.ResourceRequirements) (sandbox.Limits, error) {
	var l sandbox.Limits
	pick := func(n corev1.ResourceName) (q resource.Quantity, ok bool) {
		if q, ok = r.Limits[n]; ok {
			return q, true
		}
		q, ok = r.Requests[n]
		return q, ok
	}
	mib := func(q resource.Quantity) int { return int((q.Value() + (1<<20 - 1)) >> 20) }
	if q, ok := pick(corev1.ResourceCPU); ok {
		l.CPUCount = int((q.MilliValue() + 999) / 1000)
	}
	if q, ok := pick(corev1.ResourceMemory); ok {
		l.MemoryMB = mib(q)
	}
	if q, ok := pick(corev1.ResourceEphemeralStorage); ok {
		l.DiskMB = mib(q)
	}
	if l.CPUCount < 0 || l.MemoryMB < 0 || l.DiskMB < 0 {
		return l, fmt.Errorf("spec.podTemplate.spec.containers[0].resources: must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	return l, nil
}

// blueprintHash is a stable hash of a blueprint: a warm pool's members made
// from another hash are stale.
func blueprintHash(b agentsv1.Blueprint) (string, error) {
	raw, err := json.Marshal(b)
	if err != nil {
		return "", fmt.Errorf("hash blueprint: %w", err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8]), nil
}
