package envdclient

// Init is the body of envd's POST /init, the one definition that envd's
// handler decodes and the manager sends. Unknown fields are ignored by envd
// (E2B's SDK-side fields such as "timestamp" pass through harmlessly).
type Init struct {
	// EnvVars replaces the environment of every process started afterwards;
	// nil (JSON null or absent) keeps the current one, an empty map clears it.
	EnvVars map[string]string `json:"envVars"`
	// AccessToken, when present, becomes the token every later call must
	// carry ("" turns the check off); absent keeps the current token.
	AccessToken *string `json:"accessToken,omitempty"`
	// DefaultUser and DefaultWorkdir apply to calls that name none; "" keeps
	// the current value.
	DefaultUser    string `json:"defaultUser,omitempty"`
	DefaultWorkdir string `json:"defaultWorkdir,omitempty"`
	// StartCmd is the template's start command, started once in the
	// background (agentbox extension); "" starts nothing.
	StartCmd string `json:"startCmd,omitempty"`
	// MaxCommandSeconds caps the lifetime of every process started
	// afterwards (agentbox extension); 0 keeps the current cap.
	MaxCommandSeconds int64 `json:"maxCommandSeconds,omitempty"`
	// Timestamp is the sender's clock (RFC 3339), as E2B sends it; envd
	// does not use it.
	Timestamp string `json:"timestamp,omitempty"`
}
