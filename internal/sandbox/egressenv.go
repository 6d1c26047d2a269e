package sandbox

import (
	"context"
	"maps"

	"github.com/agentbox/agentbox/internal/envdclient"
)

// caEnv points the runtimes that ignore the system trust store at the
// bundle that holds the sandbox's egress CA: Node ships its own roots
// (NODE_EXTRA_CA_CERTS adds a file to them), Python's requests reads
// certifi's copy unless REQUESTS_CA_BUNDLE says otherwise, and
// SSL_CERT_FILE makes OpenSSL-based clients (Python's ssl and urllib,
// Ruby, PHP) agree even where a template moved its default bundle.
func caEnv() map[string]string {
	return map[string]string{
		"NODE_EXTRA_CA_CERTS": caPath,
		"SSL_CERT_FILE":       caBundle,
		"REQUESTS_CA_BUNDLE":  caBundle,
	}
}

// envdEnv is the environment envd gives every process of sb: its own
// variables, plus caEnv when header rules make the egress proxy terminate
// TLS (installEgressCA has then written the files it names). The sandbox's
// own values win, so a user can still point a tool elsewhere.
func (m *Manager) envdEnv(sb *Sandbox) map[string]string {
	if _, ok := m.net.(egressCA); !ok || sb.Network == nil || len(sb.Network.Rules) == 0 {
		return sb.EnvVars
	}
	env := caEnv()
	maps.Copy(env, sb.EnvVars)
	return env
}

// pushEnvdEnv hands envd sb's environment again, after a live network
// update added or removed header rules: processes started from then on get
// the CA variables (running ones keep theirs, but the CA is also in the
// system bundle they read).
func (m *Manager) pushEnvdEnv(ctx context.Context, sb *Sandbox) error {
	if sb.State != StateRunning {
		return nil // a paused envd cannot answer; its env is what it was
	}
	// A running envd holds sb's token, which authorises the call; the
	// absent token and user fields keep what it has.
	return m.envdOf(sb).Init(ctx, envdclient.Init{EnvVars: m.envdEnv(sb)}, m.envdToken(sb))
}

// envdToken is the token sb's running envd holds ("" if not secure).
func (m *Manager) envdToken(sb *Sandbox) string {
	if !sb.Secure {
		return ""
	}
	return m.Token(sb.ID)
}
