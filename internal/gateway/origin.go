package gateway

import (
	"cmp"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// A sandbox's port is served on an origin of its own, the host
// <port>-<id>.<domain>, never on the origin of the API or the dashboard: a
// page a sandbox serves must not read what the dashboard keeps (its key in
// sessionStorage), control it with a service worker, or call the API with
// the browser's ambient credentials. This file holds the whole policy:
// which Host is a port's own, how a client reaches a port, what a sandbox's
// response headers may claim, and the headers of the API's own answers.

// DefaultDomain is the domain of port hosts when the server has none.
// Browsers resolve every *.localhost name to loopback, so
// <port>-<id>.localhost:<listen port> is an origin of its own with no DNS
// set-up.
const DefaultDomain = "localhost"

// Options are the gateway's ingress settings.
type Options struct {
	// Domain, when set, is the only domain whose <port>-<id>.<domain> hosts
	// are routed to sandboxes, and the domain of the port URLs the server
	// hands out. Empty: any <port>-<id>.* host is routed, and port URLs
	// use DefaultDomain.
	Domain string
	// TLSPort is the port of the TLS listener serving Domain's wildcard
	// certificate (0: none). With a Domain, port URLs then use https on it,
	// so sandbox apps run in a secure context.
	TLSPort int
}

// SetOptions configures ingress; call before serving.
func (g *Gateway) SetOptions(o Options) {
	o.Domain = strings.Trim(strings.ToLower(o.Domain), ".")
	g.opts = o
}

// PortOrigin is how a client that sent r reaches port hosts: the scheme,
// and the domain with the listener's port when it is not the scheme's
// default (E2B's "domain" form, e.g. "localhost:3000").
func (g *Gateway) PortOrigin(r *http.Request) (scheme, domain string) {
	if g.opts.Domain != "" && g.opts.TLSPort != 0 {
		domain = g.opts.Domain
		if g.opts.TLSPort != 443 {
			domain += ":" + strconv.Itoa(g.opts.TLSPort)
		}
		return "https", domain
	}
	scheme = "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		// Believed without a trust check: the URL only goes back to the
		// client that sent it.
		scheme = p
	}
	domain = cmp.Or(g.opts.Domain, DefaultDomain)
	if _, port, err := net.SplitHostPort(r.Host); err == nil && port != "" && !(scheme == "http" && port == "80") && !(scheme == "https" && port == "443") {
		domain += ":" + port
	}
	return scheme, domain
}

// PortURL is the URL of port of sandbox id on the port's own origin, as a
// client that sent r reaches it.
func (g *Gateway) PortURL(r *http.Request, id string, port int) string {
	scheme, domain := g.PortOrigin(r)
	return scheme + "://" + strconv.Itoa(port) + "-" + id + "." + domain + "/"
}

// onOwnOrigin reports whether r came to port of sandbox id on the port's
// own host; anything else (the E2b-Sandbox-* headers or a signed URL on the
// API's host) shares the API's origin.
func (g *Gateway) onOwnOrigin(r *http.Request, id string, port int) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(host)
	label, rest, ok := strings.Cut(host, ".")
	if !ok || label != strconv.Itoa(port)+"-"+id {
		return false
	}
	return g.opts.Domain == "" || rest == g.opts.Domain
}

// sandboxCSP makes sandbox content that is not on its port's own origin
// inert: an opaque origin with no script, so it can neither read the
// origin's storage nor register a service worker there.
const sandboxCSP = "sandbox; default-src 'none'; frame-ancestors 'none'"

// scopeResponse narrows what a sandbox's response headers can claim to
// the port's own host. No header may reach past it: a service worker's
// scope wider than its script's path (Service-Worker-Allowed), cookies for
// a parent domain (the Domain attribute; a host-only cookie stays on the
// port host), or wiping the data of the whole site (Clear-Site-Data). A
// response on a shared origin (own false) sets no cookie at all and is
// made inert.
func scopeResponse(h http.Header, own bool) {
	h.Del("Service-Worker-Allowed")
	h.Del("Clear-Site-Data")
	if !own {
		h.Del("Set-Cookie")
		h.Set("Content-Security-Policy", sandboxCSP)
		h.Del("Content-Security-Policy-Report-Only")
		h.Set("X-Content-Type-Options", "nosniff")
		return
	}
	cookies := h.Values("Set-Cookie")
	if len(cookies) == 0 {
		return
	}
	scoped := make([]string, 0, len(cookies))
	for _, c := range cookies {
		scoped = append(scoped, hostOnlyCookie(c))
	}
	h["Set-Cookie"] = scoped
}

// hostOnlyCookie drops the Domain attributes of a Set-Cookie value and
// keeps the rest as the sandbox wrote it.
func hostOnlyCookie(c string) string {
	parts := strings.Split(c, ";")
	out := parts[:1]
	for _, a := range parts[1:] {
		name, _, _ := strings.Cut(a, "=")
		if strings.EqualFold(strings.TrimSpace(name), "domain") {
			continue
		}
		out = append(out, a)
	}
	return strings.Join(out, ";")
}

// apiCSP is the policy of the API's answers (JSON, never a page; the
// dashboard sets its own): nothing loads, nothing runs, nothing frames.
const apiCSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; sandbox"

// APIHeaders sets the protective headers of the API's own answers; a
// handler that serves a page (the dashboard) replaces the ones it needs.
func APIHeaders(h http.Header) {
	h.Set("Content-Security-Policy", apiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Referrer-Policy", "no-referrer")
}
