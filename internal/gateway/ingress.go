package gateway

import (
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
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

// pathRoute matches the retired path form /sandboxes/<id>/ports/<port>[/rest]
// on the API's origin.
var pathRoute = regexp.MustCompile(`^/sandboxes/([a-z0-9]{1,64})/ports/([0-9]{1,5})(/.*)?$`)

// redirectPathForm answers the path form with a redirect to the port's own
// origin: served there, a sandbox's page would share the API's and the
// dashboard's origin. It serves no sandbox content.
func (g *Gateway) redirectPathForm(w http.ResponseWriter, r *http.Request) bool {
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
	to := g.PortURL(r, m[1], port) + strings.TrimPrefix(strings.TrimPrefix(r.URL.EscapedPath(), prefix), "/")
	if r.URL.RawQuery != "" {
		to += "?" + r.URL.RawQuery
	}
	APIHeaders(w.Header())
	w.Header().Set("Location", to)
	httperr.WriteJSON(w, http.StatusPermanentRedirect, map[string]any{"code": http.StatusPermanentRedirect, "url": to,
		"message": "sandbox ports are served on their own origin, never on the API's: " + to})
	return true
}

// hostRoutedOutside reports whether the request was routed by a Host (not
// by the E2b-Sandbox-* headers) that is not <port>-<id>.<domain> of the
// configured domain. Such hosts go to the API.
func (g *Gateway) hostRoutedOutside(r *http.Request) bool {
	if g.opts.Domain == "" || r.Header.Get("E2b-Sandbox-Id") != "" || r.Header.Get("E2b-Sandbox-Port") != "" {
		return false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	_, rest, _ := strings.Cut(strings.ToLower(host), ".")
	return rest != g.opts.Domain
}

// checkTraffic enforces a sandbox's traffic access token on a request for
// one of its ports. It answers the request itself and returns false when
// the request may not pass.
func (g *Gateway) checkTraffic(w http.ResponseWriter, r *http.Request, sb *sandbox.Sandbox, port int) bool {
	if !sb.Network.PublicTraffic() && port != sandbox.EnvdPort {
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
	return true
}

// admit sets what the sandbox's network settings say about reaching port
// on the target.
func (g *Gateway) admit(sb *sandbox.Sandbox, port int, t *target) {
	if n := sb.Network; n != nil {
		t.tls = slices.Contains(n.HTTPSPorts, port)
		if n.MaskRequestHost != "" {
			t.host = strings.ReplaceAll(n.MaskRequestHost, "${PORT}", strconv.Itoa(port))
		}
	}
}

// forbidden answers a request without the sandbox's traffic token with 403,
// as E2B does.
func forbidden(w http.ResponseWriter, id string, err error) {
	httperr.WriteJSON(w, http.StatusForbidden, map[string]any{"sandboxId": id, "code": http.StatusForbidden, "message": httperr.Message(err)})
}
