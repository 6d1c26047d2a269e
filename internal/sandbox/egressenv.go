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

// env is the environment envd gives every process of sb: its own
// variables, plus caEnv when header rules make the egress proxy terminate
// TLS (installCA has then written the files it names). The sandbox's
// own values win, so a user can still point a tool elsewhere.
func (e *envdLink) env(sb *Sandbox) map[string]string {
	if _, ok := e.net.(egressCA); !ok || sb.Network == nil || len(sb.Network.Rules) == 0 {
		return sb.EnvVars
	}
	env := caEnv()
	maps.Copy(env, sb.EnvVars)
	return env
}

// push hands envd sb's environment again, after a live network
// update added or removed header rules: processes started from then on get
// the CA variables (running ones keep theirs, but the CA is also in the
// system bundle they read).
func (e *envdLink) push(ctx context.Context, sb *Sandbox) error {
	if sb.State != StateRunning {
		return nil // a paused envd cannot answer; its env is what it was
	}
	// A running envd holds sb's token, which authorises the call; the
	// absent token and user fields keep what it has.
	return e.of(sb).Init(ctx, envdclient.Init{EnvVars: e.env(sb)}, e.held(sb))
}

// held is the token sb's running envd holds ("" if not secure).
func (e *envdLink) held(sb *Sandbox) string {
	if !sb.Secure {
		return ""
	}
	return e.token(sb.ID)
}
