// Package sandbox is the sandbox manager: it owns the lifecycle state machine
// (creating → running → killing → gone), persists every transition, enforces
// timeouts with a reaper, samples metrics, and reconciles what the runtime and
// network actually hold with the database after a restart or crash.
package sandbox

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"time"

	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/template"
)

// State is a sandbox's lifecycle state as stored and reported.
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateKilling  State = "killing"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// EnvdVersion is the envd protocol version reported to SDKs; they gate
// features on it (see research/e2b-protocol.md §2.9).
const EnvdVersion = "0.6.13"

// ClientID is the deprecated-but-required clientID field of E2B responses.
const ClientID = "6532622b"

// Sandbox is one sandbox as the manager knows it.
type Sandbox struct {
	ID            string            `json:"id"`
	TeamID        string            `json:"teamID"`
	APIKeyID      string            `json:"apiKeyID"`
	TemplateID    string            `json:"templateID"`
	Alias         string            `json:"alias,omitempty"`
	State         State             `json:"state"`
	IP            netip.Addr        `json:"ip"`
	Secure        bool              `json:"secure"`
	AllowInternet bool              `json:"allowInternet"`
	Network       *NetworkSpec      `json:"network,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	EnvVars       map[string]string `json:"envVars,omitempty"`
	CPUCount      int               `json:"cpuCount"`
	MemoryMB      int               `json:"memoryMB"`
	DiskMB        int               `json:"diskMB"`
	PIDs          int               `json:"pids,omitempty"`
	TmpMB         int               `json:"tmpMB,omitempty"`
	Isolation     string            `json:"isolation,omitempty"` // container or gvisor
	// VolumeMounts are the team volumes mounted in the sandbox.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	// MaxCommandSeconds caps each command's run time; envd enforces it.
	MaxCommandSeconds int64 `json:"maxCommandSeconds,omitempty"`
	// BuildID marks the hidden sandbox a template build's RUN steps run in
	// (RunSteps): no API call, list or gateway route sees it.
	BuildID        string    `json:"buildID,omitempty"`
	Health         string    `json:"health,omitempty"`       // "" (healthy) or "error"
	HealthReason   string    `json:"healthReason,omitempty"` // why, when Health is "error"
	DefaultUser    string    `json:"defaultUser"`
	DefaultWorkdir string    `json:"defaultWorkdir"`
	StartedAt      time.Time `json:"startedAt"`
	EndAt          time.Time `json:"endAt"`
	// BootID names the sandbox's current boot: new at every fresh boot
	// (create, a resume from files), kept by a memory restore, as a VM's
	// kernel keeps it. The gateway drops connections of an older boot.
	BootID string `json:"bootID,omitempty"`
	Lifecycle
}

// Network is what the manager needs from the network package.
type Network interface {
	Attach(ctx context.Context, id string, p network.Policy) (network.Endpoint, error)
	Detach(ctx context.Context, id string) error
	SetPolicy(ctx context.Context, id string, p network.Policy) error
	List(ctx context.Context) ([]string, error)
	Lookup(id string) (network.Endpoint, bool)
	DNS() []string
}

// Templates resolves template references in a team's view: its own
// templates, then builtins and public ones; team "" (operator config such as
// warm pools) sees builtins and public templates only.
type Templates interface {
	Get(ctx context.Context, team, ref string) (*template.Template, error)
}

// CreateRequest is a validated create call.
type CreateRequest struct {
	TeamID        string
	APIKeyID      string
	Template      string
	Timeout       time.Duration
	Metadata      map[string]string
	EnvVars       map[string]string
	Secure        bool
	AllowInternet bool
	Network       *NetworkSpec
	Isolation     string        // "" = template's, then container
	Limits        Limits        // zero fields = template's defaults
	MaxCommand    time.Duration // 0 = the server's command lifetime cap
	Lifecycle     LifecycleRequest
	VolumeMounts  []VolumeMount // by name; validated paths
	Workdir       string        // "" = the template's; absolute (a pod's workingDir)
	// ID, when set, is the sandbox's id, chosen by the caller (a Kubernetes
	// API replica) with NewID; "" = a new one.
	ID string
}

// newID returns "i" + 20 chars of [a-z0-9], the E2B id shape (no '-': host
// routing splits "<port>-<id>" on it).
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	out := make([]byte, 21)
	out[0] = 'i'
	for i, c := range b {
		// 256 % 36 bias is irrelevant for ids.
		out[i+1] = alphabet[int(c)%len(alphabet)]
	}
	return string(out)
}

// NewID returns a new sandbox id, as the server makes them.
func NewID() string { return newID() }

// ValidID reports whether s has the shape of a sandbox id.
func ValidID(s string) bool {
	if len(s) < 2 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// AccessToken derives a sandbox's envd access token from the server secret:
// stable for the sandbox's whole life (also across restarts and resumes),
// different for every sandbox, never stored.
func AccessToken(secret []byte, id string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("envd-access:" + id))
	return hex.EncodeToString(m.Sum(nil))[:40]
}
