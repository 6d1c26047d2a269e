package kube

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

func TestTemplateName(t *testing.T) {
	for _, tc := range []struct{ image, want string }{
		{"base", "base"},
		{"base:latest", "base"},
		{"docker.io/library/python:3.12", "python"},
		{"registry:5000/team/code-interpreter", "code-interpreter"},
		{"ghcr.io/x/desktop@sha256:abc", "desktop"},
	} {
		if got := templateName(tc.image); got != tc.want {
			t.Errorf("templateName(%q) = %q, want %q", tc.image, got, tc.want)
		}
	}
}

func sandboxOf(c corev1.Container, mod func(*agentsv1.Sandbox)) *agentsv1.Sandbox {
	s := &agentsv1.Sandbox{}
	s.Name, s.Namespace, s.UID = "sb", "agents", "uid-1"
	s.Spec.PodTemplate.Spec.Containers = []corev1.Container{c}
	if mod != nil {
		mod(s)
	}
	return s
}

func TestCreateRequest(t *testing.T) {
	gv := "gvisor"
	bogus := "kata"
	full := corev1.Container{
		Name: "a", Image: "docker.io/library/base:1", WorkingDir: "/work",
		Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("512Mi")},
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")},
		},
	}
	got, err := createRequest(sandboxOf(full, func(s *agentsv1.Sandbox) { s.Spec.PodTemplate.Spec.RuntimeClassName = &gv }), "team-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got.TeamID != "team-1" || got.Template != "base" || got.Isolation != sandbox.IsolationGVisor || got.Workdir != "/work" ||
		got.EnvVars["A"] != "1" || got.Limits != (sandbox.Limits{CPUCount: 2, MemoryMB: 512, DiskMB: 1024}) ||
		got.Metadata[MetaUID] != "uid-1" || got.Timeout != time.Hour {
		t.Errorf("createRequest = %+v", got)
	}
	if got.AllowInternet {
		t.Errorf("a Sandbox without %s got internet access", AnnotationAllowInternet)
	}
	for ann, want := range map[string]bool{"true": true, "false": false, "yes": false} {
		got, err := createRequest(sandboxOf(full, func(s *agentsv1.Sandbox) {
			s.Annotations = map[string]string{AnnotationAllowInternet: ann}
		}), "team-1", time.Hour)
		if err != nil || got.AllowInternet != want {
			t.Errorf("%s=%q: AllowInternet %v (%v), want %v", AnnotationAllowInternet, ann, got.AllowInternet, err, want)
		}
	}
	withNet, err := createRequest(sandboxOf(full, func(s *agentsv1.Sandbox) {
		s.Annotations = map[string]string{AnnotationNetwork: `{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1"]}`}
	}), "team-1", time.Hour)
	if err != nil || withNet.Network == nil || len(withNet.Network.AllowOut) != 1 || withNet.Network.AllowOut[0] != "1.1.1.1" {
		t.Errorf("%s: %+v, %v", AnnotationNetwork, withNet.Network, err)
	}
	if _, err := createRequest(sandboxOf(full, func(s *agentsv1.Sandbox) {
		s.Annotations = map[string]string{AnnotationNetwork: `{"denyOut":`}
	}), "team-1", time.Hour); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), AnnotationNetwork) {
		t.Errorf("a broken %s: %v, want an invalid-argument error naming it", AnnotationNetwork, err)
	}
	mv := "microvm"
	if got, err := createRequest(sandboxOf(full, func(s *agentsv1.Sandbox) { s.Spec.PodTemplate.Spec.RuntimeClassName = &mv }), "team-1", time.Hour); err != nil || got.Isolation != sandbox.IsolationMicroVM {
		t.Errorf("runtimeClassName microvm: %q, %v", got.Isolation, err)
	}

	for _, tc := range []struct {
		name  string
		c     corev1.Container
		mod   func(*agentsv1.Sandbox)
		field string
	}{
		{"no image", corev1.Container{Name: "a"}, nil, "containers[0].image"},
		{"command", corev1.Container{Name: "a", Image: "base", Command: []string{"sh"}}, nil, "containers[0].command"},
		{"relative workdir", corev1.Container{Name: "a", Image: "base", WorkingDir: "work"}, nil, "workingDir"},
		{"unclean workdir", corev1.Container{Name: "a", Image: "base", WorkingDir: "/a/../etc"}, nil, "workingDir"},
		{"valueFrom", corev1.Container{Name: "a", Image: "base", Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{}}}}, nil, "env[0].valueFrom"},
		{"unknown runtime class", corev1.Container{Name: "a", Image: "base"}, func(s *agentsv1.Sandbox) { s.Spec.PodTemplate.Spec.RuntimeClassName = &bogus }, "runtimeClassName"},
		{"two containers", corev1.Container{Name: "a", Image: "base"}, func(s *agentsv1.Sandbox) {
			s.Spec.PodTemplate.Spec.Containers = append(s.Spec.PodTemplate.Spec.Containers, corev1.Container{Name: "b", Image: "x"})
		}, "containers"},
		{"volume claims", corev1.Container{Name: "a", Image: "base"}, func(s *agentsv1.Sandbox) {
			s.Spec.VolumeClaimTemplates = []agentsv1.PersistentVolumeClaimTemplate{{}}
		}, "spec.volumeClaimTemplates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := createRequest(sandboxOf(tc.c, tc.mod), "team-1", time.Hour)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("err = %v, want an invalid-argument error naming %s", err, tc.field)
			}
		})
	}
}

func TestBlueprintHash(t *testing.T) {
	a := agentsv1.Blueprint{}
	a.PodTemplate.Spec.Containers = []corev1.Container{{Name: "a", Image: "base"}}
	b := *a.DeepCopy()
	ha, err := blueprintHash(a)
	if err != nil {
		t.Fatal(err)
	}
	if hb, _ := blueprintHash(b); hb != ha {
		t.Errorf("equal blueprints hash differently: %s %s", ha, hb)
	}
	b.PodTemplate.Spec.Containers[0].Image = "python"
	if hb, _ := blueprintHash(b); hb == ha {
		t.Errorf("a changed image keeps the hash %s", ha)
	}
	if len(ha) > 63 {
		t.Errorf("hash %q is too long for a label value", ha)
	}
}
