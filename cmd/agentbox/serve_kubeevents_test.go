package main

import (
	"strings"
	"testing"
)

func TestCheckWebhooksNamespace(t *testing.T) {
	for _, tc := range []struct {
		keys, hooks, wantErr string
	}{
		{"agentbox-system", "agentbox-webhooks", ""},
		{"agentbox-system", "agentbox-system", "must hold nothing else"},
		{"agentbox-system", "", "--kube-webhooks-namespace: name"},
	} {
		err := checkWebhooksNamespace(kubeAPIFlags{KeysNamespace: tc.keys, WebhooksNS: tc.hooks})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s/%s: %v", tc.keys, tc.hooks, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s/%s: %v, want %q", tc.keys, tc.hooks, err, tc.wantErr)
		}
	}
}
