package kube

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/agentbox/agentbox/internal/errdefs"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// The id an API replica chose becomes the sandbox's; a malformed one is
// refused naming the annotation.
func TestCreateRequestChosenID(t *testing.T) {
	for _, tc := range []struct {
		annotation string
		want       string
		bad        bool
	}{
		{"", "", false},
		{"iabc123def456ghi789jk", "iabc123def456ghi789jk", false},
		{"I-Upper", "", true},
		{"../x", "", true},
		{strings.Repeat("a", 65), "", true},
	} {
		sb := sandboxOf(corev1.Container{Image: "base"}, func(s *agentsv1.Sandbox) {
			if tc.annotation != "" {
				s.Annotations = map[string]string{AnnotationSandboxID: tc.annotation}
			}
		})
		req, err := createRequest(sb, "team", time.Minute)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), AnnotationSandboxID) {
				t.Errorf("annotation %q: err %v, want an invalid-argument error naming %s", tc.annotation, err, AnnotationSandboxID)
			}
			continue
		}
		if err != nil || req.ID != tc.want {
			t.Errorf("annotation %q: id %q, err %v; want %q", tc.annotation, req.ID, err, tc.want)
		}
		if !req.Secure {
			t.Errorf("annotation %q: sandbox not secured: the API tier hands out access tokens", tc.annotation)
		}
	}
}
