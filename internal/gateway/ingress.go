package gateway

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// TrafficTokenHeader carries the traffic access token of a sandbox created
// with allowPublicTraffic false (E2B's header name).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// pathRoute matches /sandboxes/<id>/ports/<port>[/rest].
var pathRoute = regexp.MustCompile(`^/sandboxes/([a-z0-9]{1,64})/ports/([0-9]{1,5})(/.*)?$`)

// routeByPath serves /sandboxes/{id}/ports/{port}/... : the same routing as
// the headers and Host forms, for clients that can set neither (a browser
// on a plain host name). The sandbox sees the path without the prefix and
// the prefix in X-Forwarded-Prefix.
func (g *Gateway) routeByPath(w http.ResponseWriter, r *http.Request) bool {
	m := pathRoute.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return false
	}
	port, _ := strconv.Atoi(m[2])
	if port < 1 || port > 65535 {
		badRequest(w, "Invalid sandbox port")
		return true
	}
	prefix := "/sandboxes/" + m[1] + "/ports/" + m[2]
	if m[3] == "" {
		// Relative links in the app only resolve under a trailing slash.
		u := *r.URL
		u.Path = prefix + "/"
		u.RawPath = ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
		return true
	}
	r2 := r.Clone(r.Context())
	r2.URL = &url.URL{Path: m[3], RawQuery: r.URL.RawQuery}
	if raw := r.URL.RawPath; raw != "" {
		r2.URL.RawPath = strings.TrimPrefix(raw, prefix)
	}
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header.Set("X-Forwarded-Prefix", prefix)
	g.serve(w, r2, m[1], port)
	return true
}

// hostRouted reports whether the request was routed by its Host (not by
// the E2b-Sandbox-* headers) and, with a domain configured, whether that
// Host is under it. Hosts outside the domain go to the API.
func (g *Gateway) hostRoutedOutside(r *http.Request) bool {
	if g.opts.Domain == "" || r.Header.Get("E2b-Sandbox-Id") != "" || r.Header.Get("E2b-Sandbox-Port") != "" {
		return false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return !strings.HasSuffix(strings.ToLower(host), "."+g.opts.Domain)
}

// Options are the gateway's ingress settings.
type Options struct {
	// Domain, when set, is the only domain whose <port>-<id>.<domain> hosts
	// are routed to sandboxes.
	Domain string
}

// SetOptions configures ingress; call before serving.
func (g *Gateway) SetOptions(o Options) {
	o.Domain = strings.Trim(strings.ToLower(o.Domain), ".")
	g.opts = o
}

// admit enforces a sandbox's ingress settings on a request for port and
// fills in how to reach the port. It answers the request itself and
// returns false when the request may not pass.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int, t *target) bool {
	n := sb.Network
	if !n.PublicTraffic() && port != sandbox.EnvdPort {
		got := r.Header.Get(TrafficTokenHeader)
		if got == "" {
			forbidden(w, sb.ID, fmt.Errorf("this sandbox's ports need its traffic access token in the %s header", TrafficTokenHeader))
			return false
		}
		// A wrong token is a guess (authlimit.Guard decides the answer);
		// a right one is always let through.
		if !g.guesses.Guard(w, r, "traffic access token", func() error {
			if subtle.ConstantTimeCompare([]byte(got), []byte(g.res.TrafficToken(sb.ID))) != 1 {
				return fmt.Errorf("this sandbox's ports need its traffic access token in the %s header; the one sent is wrong: %w", TrafficTokenHeader, errdefs.ErrUnauthenticated)
			}
			return nil
		}, func(w http.ResponseWriter, err error) { forbidden(w, sb.ID, err) }) {
			return false
		}
		// The sandbox's app never sees its token.
		r.Header.Del(TrafficTokenHeader)
	}
	if n != nil {
		t.tls = slices.Contains(n.HTTPSPorts, port)
		if n.MaskRequestHost != "" {
			t.host = strings.ReplaceAll(n.MaskRequestHost, "${PORT}", strconv.Itoa(port))
		}
	}
	return true
}

// forbidden answers a request without the sandbox's traffic token with 403,
// as E2B does.
func forbidden(w http.ResponseWriter, id string, err error) {
	httperr.WriteJSON(w, http.StatusForbidden, map[string]any{"sandboxId": id, "code": http.StatusForbidden, "message": httperr.Message(err)})
}
