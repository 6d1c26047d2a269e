package kube

import (
	"encoding/json"

	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// AnnotationMetadata on a Sandbox (or the claim that cold-starts it) holds
// its E2B metadata, a JSON object of strings, as the cluster's E2B API
// writes it from a create's metadata.
const AnnotationMetadata = "agentbox.dev/metadata"

// sandboxMetadata is the metadata of the sandbox made for sb: its E2B
// metadata (so the agent's lifecycle events and webhook deliveries carry
// what the caller set, as a single server's do) and the bookkeeping keys,
// which win over a caller's key of the same name. A malformed annotation
// adds nothing: the API that writes it checks it.
func sandboxMetadata(sb *agentsv1.Sandbox) map[string]string {
	md := map[string]string{}
	if raw := sb.Annotations[AnnotationMetadata]; raw != "" {
		var user map[string]string
		if json.Unmarshal([]byte(raw), &user) == nil {
			for k, v := range user {
				md[k] = v
			}
		}
	}
	md[MetaUID], md[MetaNamespace], md[MetaName] = string(sb.UID), sb.Namespace, sb.Name
	return md
}

// Bookkeeping reports whether a metadata key is one agentbox puts on the
// sandboxes it makes for Kubernetes objects, not the caller's.
func Bookkeeping(key string) bool {
	switch key {
	case MetaUID, MetaNamespace, MetaName, MetaRestoredFrom:
		return true
	}
	return false
}
