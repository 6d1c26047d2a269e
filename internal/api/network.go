package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/apireq"
	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// networkRoutes serves the network settings of running sandboxes, team
// secrets for header rules, and TCP tunnels for `agentbox port-forward`.
func (s *Server) networkRoutes(auth func(pattern string, h http.HandlerFunc)) {
	auth("PUT /sandboxes/{id}/network", s.updateNetwork)
	auth("GET /sandboxes/{id}/tunnel/{port}", s.tunnel)
	auth("POST /secrets", s.putSecret)
	auth("GET /secrets", s.listSecrets)
	auth("DELETE /secrets/{name}", s.deleteSecret)
}

// applyNetwork validates the create request's network fields and copies
// them into req. Errors name the offending entry.
func (s *Server) applyNetwork(ctx context.Context, req *sandbox.CreateRequest, body *rest.SandboxNetworkConfig) error {
	n := networkSpec(body)
	if n == nil {
		return nil
	}
	for _, d := range n.DenyOut {
		if d == "0.0.0.0/0" || d == "ALL_TRAFFIC" {
			req.AllowInternet = false
		}
	}
	if !n.PublicTraffic() && !req.Secure {
		return invalid("network.allowPublicTraffic: You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag.")
	}
	if err := s.be.CheckNetwork(ctx, req.TeamID, req.AllowInternet, n); err != nil {
		return err
	}
	req.Network = n
	return nil
}

// networkInfo is the network field of GET /sandboxes/{id}: the settings
// without the egress proxy's password and with header values masked (they
// may hold resolved credentials written by the client).
func networkInfo(n *sandbox.NetworkSpec) *rest.SandboxNetworkConfig {
	c := networkConfig(n)
	if c == nil {
		return nil
	}
	if c.EgressProxy != nil {
		c.EgressProxy.Password = ""
	}
	for _, rules := range c.Rules {
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for k, v := range r.Transform.Headers {
				r.Transform.Headers[k] = maskHeader(v)
			}
		}
	}
	return c
}

// maskHeader keeps secret references readable and hides literal values.
func maskHeader(v string) string {
	if strings.Contains(v, "${secrets.") {
		return v
	}
	if len(v) <= 4 {
		return "****"
	}
	return v[:4] + "****"
}

func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body rest.SandboxNetworkUpdate
	if err := apireq.DecodeJSON(w, r, s.MaxBody, true, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	// Omitted fields are cleared (E2B): the body is the whole new policy.
	allow := body.AllowInternetAccess == nil || *body.AllowInternetAccess
	for _, d := range body.DenyOut {
		if d == "0.0.0.0/0" || d == "ALL_TRAFFIC" {
			allow = false
		}
	}
	n := &sandbox.NetworkSpec{AllowOut: body.AllowOut, DenyOut: body.DenyOut, EgressProxy: egressProxy(body.EgressProxy), Rules: networkRules(body.Rules)}
	if err := s.mgr.UpdateNetwork(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r), allow, n); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Tunneler opens `agentbox port-forward` tunnels into sandboxes. The
// gateway is one: a tunnel gets the data plane's admission and audit.
type Tunneler interface {
	Tunnel(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int, apiKeyID string)
}

// SetTunneler sets what serves tunnels; without one they are refused.
// Call before serving.
func (s *Server) SetTunneler(t Tunneler) { s.tunneler = t }

// tunnel upgrades the request to a raw TCP stream to a port inside the
// sandbox, for `agentbox port-forward`. The API key authorises it, like
// every other call on the team's sandboxes; the gateway does the rest.
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		httperr.Write(w, invalid("port: %q is not 1-65535", apireq.Truncate(r.PathValue("port"))))
		return
	}
	if !httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "agentbox-tcp") {
		httperr.Write(w, invalid("send Connection: Upgrade and Upgrade: agentbox-tcp to open a tunnel"))
		return
	}
	sb, err := s.mgr.Get(r.Context(), keyOf(r.Context()).TeamID, sandboxID(r))
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if s.tunneler == nil {
		httperr.Write(w, fmt.Errorf("tunnels are not served here (no data-plane gateway): %w", errdefs.ErrUnavailable))
		return
	}
	s.tunneler.Tunnel(w, r, sb, port, keyOf(r.Context()).ID)
}

const maxSecretValue = 32 << 10

func (s *Server) putSecret(w http.ResponseWriter, r *http.Request) {
	var body rest.SecretRequest
	if err := apireq.DecodeJSON(w, r, s.MaxBody, false, &body); err != nil {
		httperr.Write(w, err)
		return
	}
	switch {
	case !sandbox.ValidSecretName(body.Name):
		httperr.Write(w, invalid("name: required; letters, digits and _, not starting with a digit, at most 128 bytes (reference it as ${secrets.NAME})"))
		return
	case body.Value == "":
		httperr.Write(w, invalid("value: required and not empty"))
		return
	case len(body.Value) > maxSecretValue:
		httperr.Write(w, invalid("value: %d bytes is over the limit of %d", len(body.Value), maxSecretValue))
		return
	case !httpguts.ValidHeaderFieldValue(body.Value):
		httperr.Write(w, invalid("value: must be usable in an HTTP header (no CR, LF or NUL)"))
		return
	case len(body.Description) > 1024 || !printable(body.Description):
		httperr.Write(w, invalid("description: at most 1024 printable characters"))
		return
	}
	info, err := s.store.PutTeamSecret(r.Context(), keyOf(r.Context()).TeamID, body.Name, body.Description, body.Value)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusCreated, secretInfo(info))
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	list, err := s.store.ListTeamSecrets(r.Context(), keyOf(r.Context()).TeamID)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	out := make([]rest.SecretInfo, 0, len(list))
	for _, i := range list {
		out = append(out, secretInfo(i))
	}
	httperr.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.store.DeleteTeamSecret(r.Context(), keyOf(r.Context()).TeamID, r.PathValue("name")); err != nil {
		httperr.Write(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
