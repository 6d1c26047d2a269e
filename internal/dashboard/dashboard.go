// Package dashboard serves agentbox's web dashboard: the page and its
// bundled script and styles, built from web/dashboard by `make dashboard`
// and embedded in the binary. The page talks to the REST API with the
// caller's API key; it holds no data of its own.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed dist
var dist embed.FS

// Prefix is where the dashboard is served.
const Prefix = "/dashboard/"

// CSP is the dashboard's Content-Security-Policy: scripts and connections
// only from the server itself, never inline; no framing. Inline styles are
// allowed because the terminal emulator sizes its cells with a <style>
// element; every tenant-controlled string is rendered as text, never as
// markup, so styles cannot be injected through data.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// SecurityHeaders sets the headers every dashboard response carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Frame-Options", "DENY")
	// No window of another origin (a sandbox's page the dashboard links
	// to, or one that opened the dashboard) keeps a handle on this one.
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// Handler serves the embedded files under Prefix.
func Handler() http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embedded tree always has dist
	}
	files := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SecurityHeaders(w.Header())
		files.ServeHTTP(w, r)
	})
}
