package agentbox

import (
	"net/url"
	"strconv"
	"strings"
)

// PortURL is the URL of a port of the sandbox on the port's own web origin,
// <scheme>://<port>-<id>.<domain>/ (the E2B SDKs' getHost, with a scheme):
// what a browser opens to reach a server the sandbox runs. Each port is an
// origin of its own, never the API's or the dashboard's. The domain is
// WithDomain's; without one, "localhost" with the data plane's port, which
// browsers resolve to loopback with no DNS set-up. The scheme is the data
// plane's.
func (s *Sandbox) PortURL(port int) string {
	scheme, domain := "http", s.client.domain
	if u, err := url.Parse(s.client.sandboxURL); err == nil && u.Host != "" {
		scheme = u.Scheme
		if domain == "" {
			domain = "localhost"
			if p := u.Port(); p != "" {
				domain += ":" + p
			}
		}
	}
	if domain == "" {
		domain = "localhost"
	}
	return scheme + "://" + strconv.Itoa(port) + "-" + s.ID + "." + strings.Trim(domain, ".") + "/"
}
