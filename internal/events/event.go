// Package events owns sandbox lifecycle events as E2B defines them: the
// events API (GET /events/sandboxes[/{sandboxID}]) and team webhooks
// (/events/webhooks) signed with E2B's e2b-signature.
//
// Events have one source: the audit log. Every lifecycle change the manager
// makes, and every policy violation (refused syscalls, denied egress, OOM,
// pids and disk limits), is already written there; the Service reads the
// audit rows after its cursor and turns them into events, storing the
// events, the deliveries they owe and the new cursor in one transaction.
// A server killed at any point therefore neither loses nor repeats an
// event, and delivers after its next start what it owed (at least once).
//
// Every outbound delivery goes through the server's destination policy
// (internal/destpolicy): no loopback, private, link-local or metadata
// address, nor the host's own, unless the operator opened it.
package events

import (
	"crypto/sha256"
	"encoding/base64"
	"slices"
	"time"
)

// Event types: E2B's lifecycle types and agentbox's policy extension.
const (
	TypeCreated      = "sandbox.lifecycle.created"
	TypeUpdated      = "sandbox.lifecycle.updated"
	TypeKilled       = "sandbox.lifecycle.killed"
	TypePaused       = "sandbox.lifecycle.paused"
	TypeResumed      = "sandbox.lifecycle.resumed"
	TypeCheckpointed = "sandbox.lifecycle.checkpointed"
	// TypePolicyViolation (agentbox): a sandbox kept hitting one of its
	// walls; one event per sandbox, rule and window, with the count.
	TypePolicyViolation = "sandbox.policy.violation"
)

// Types lists every event type, in the order documentation shows them.
var Types = []string{TypeCreated, TypeUpdated, TypeKilled, TypePaused, TypeResumed, TypeCheckpointed, TypePolicyViolation}

// ValidType reports whether t is an event type.
func ValidType(t string) bool { return slices.Contains(Types, t) }

// Version is the structure version of events (E2B's current one).
const Version = "v2"

// Event is one sandbox event with E2B's JSON names: what GET
// /events/sandboxes returns and what a webhook receives as its body.
type Event struct {
	Version            string         `json:"version"`
	ID                 string         `json:"id"`
	Type               string         `json:"type"`
	EventData          map[string]any `json:"eventData"`
	SandboxBuildID     string         `json:"sandboxBuildId"`
	SandboxExecutionID string         `json:"sandboxExecutionId"`
	SandboxID          string         `json:"sandboxId"`
	SandboxTeamID      string         `json:"sandboxTeamId"`
	SandboxTemplateID  string         `json:"sandboxTemplateId"`
	Timestamp          time.Time      `json:"timestamp"`
}

// Webhook request headers (E2B's names).
const (
	HeaderWebhookID        = "e2b-webhook-id"
	HeaderDeliveryID       = "e2b-delivery-id"
	HeaderSignatureVersion = "e2b-signature-version"
	HeaderSignature        = "e2b-signature"
	SignatureVersion       = "v1"
)

// Sign is the e2b-signature of body under secret, as E2B computes it and
// its documentation verifies it: SHA-256 over the secret followed by the
// raw body, base64 URL-safe alphabet, padding removed.
func Sign(secret string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(secret))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
