// Package mcpserver serves agentbox as a Model Context Protocol server: tools
// to create sandboxes, run commands and code, move files, expose ports,
// pause, resume, list and kill sandboxes. Every tool calls the server's own
// REST API and, through the gateway, the sandbox's envd with the caller's API
// key (the Go SDK in sdk/go), so MCP shares the API's checks, limits, audit
// and team scoping instead of repeating them. The same tools serve stdio
// (`agentbox mcp`) and streamable HTTP (`/mcp` of `agentbox serve`).
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Config says how tools reach the API.
type Config struct {
	// Client acts for the caller: its key decides what the tools may see.
	Client *agentbox.Client
	// PublicURL is the base URL the caller reaches the server at: the
	// scheme and port of the URLs expose_port returns, unless PortOrigin
	// says otherwise.
	PublicURL string
	// Domain is the server's --domain (default "localhost", which browsers
	// resolve to loopback): expose_port returns the port's own origin
	// <port>-<id>.<domain>, as the E2B SDKs' getHost does.
	Domain string
	// PortOrigin, when set, is the server's own word on where ports are
	// reached: the scheme and the domain with its port (serve's gateway).
	PortOrigin func() (scheme, domain string)
	// Version is reported to clients in the server's implementation info.
	Version string
	// Log gets the MCP SDK's warnings and errors; nil: none.
	Log *slog.Logger
	// Schemas caches the tools' JSON schemas across servers made per request.
	Schemas *mcp.SchemaCache
	// Request, over HTTP, is the context of the request the server was
	// made for: tool calls end with it. nil: they end with the session.
	Request context.Context
}

// MessageLimit bounds each data-plane message the tools' client reads
// (agentbox.WithMessageLimit): envd, in the sandbox, chooses their size.
const MessageLimit = 8 << 20

// New returns an MCP server with agentbox's tools.
func New(cfg Config) *mcp.Server {
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Log != nil {
		cfg.Log = quietLog(cfg.Log)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "agentbox", Title: "agentbox sandboxes", Version: cfg.Version},
		&mcp.ServerOptions{
			Logger:      cfg.Log,
			SchemaCache: cfg.Schemas,
			Instructions: "Sandboxes are isolated Linux containers. create_sandbox returns a sandboxId; " +
				"pass it to run_command, run_code, read_file, write_file, list_files, expose_port, " +
				"pause_sandbox, resume_sandbox and kill_sandbox. Kill sandboxes you no longer need.",
		})
	t := &tools{cfg: cfg}
	t.register(s)
	return s
}

// KeyFromHeader is the API key of an HTTP request: X-API-Key, else an
// Authorization Bearer token, as the REST API reads it.
func KeyFromHeader(h http.Header) string {
	if k := h.Get("X-API-Key"); k != "" {
		return k
	}
	if k, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer "); ok {
		return k
	}
	return ""
}

// HTTPConfig configures the streamable HTTP endpoint.
type HTTPConfig struct {
	// SelfURL is where this server's API and gateway answer on loopback.
	SelfURL string
	Domain  string
	// PortOrigin is where a client that sent r reaches sandbox ports (the
	// gateway's PortOrigin); nil derives it from the request and Domain.
	PortOrigin func(r *http.Request) (scheme, domain string)
	Version    string
	Log        *slog.Logger
}

// Handler serves MCP over streamable HTTP. It must sit behind the API's
// key check. It is stateless and builds a server per request, bound to the
// key that request carries: no session outlives its request, so a session
// id can never lend one caller's key to another.
func Handler(c HTTPConfig) http.Handler {
	schemas := mcp.NewSchemaCache()
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		key := KeyFromHeader(r.Header)
		if key == "" {
			return nil // the API's key check refuses such requests first
		}
		var origin func() (string, string)
		if c.PortOrigin != nil {
			origin = func() (string, string) { return c.PortOrigin(r) }
		}
		return New(Config{
			Client: agentbox.New(agentbox.WithAPIURL(c.SelfURL), agentbox.WithSandboxURL(c.SelfURL), agentbox.WithAPIKey(key),
				agentbox.WithMessageLimit(MessageLimit)),
			PublicURL:  publicURL(r),
			Domain:     c.Domain,
			PortOrigin: origin,
			Version:    c.Version,
			Log:        c.Log,
			Schemas:    schemas,
			Request:    r.Context(),
		})
	}, &mcp.StreamableHTTPOptions{
		Stateless: true,
		Logger:    quietLog(c.Log),
		// The SDK's DNS-rebinding guard refuses loopback peers whose Host is
		// not loopback, which breaks a reverse proxy on this host. Rebinding
		// lends a web page the network position, not the API key every
		// request here must carry, so the guard adds nothing.
		DisableLocalhostProtection: true,
	})
}

// publicURL is the base URL the client reached the server at. The
// forwarding headers of a reverse proxy are believed without a trust check:
// the URL only goes back to the client that sent them.
func publicURL(r *http.Request) string {
	scheme, host := "http", r.Host
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "https" || p == "http" {
		scheme = p
	}
	if h := r.Header.Get("X-Forwarded-Host"); h != "" {
		host = h
	}
	return scheme + "://" + host
}

// LoopbackURL is an http URL reaching a listener at addr from this host: an
// unspecified address (":3000", "0.0.0.0", "[::]") becomes loopback.
func LoopbackURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

func quietLog(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	return slog.New(quiet{l.Handler()})
}

// quiet passes on warnings and errors only: the MCP SDK logs every session
// at info, which over stateless HTTP is every request.
type quiet struct{ slog.Handler }

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && q.Handler.Enabled(ctx, l)
}

func (q quiet) WithAttrs(a []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(a)} }
func (q quiet) WithGroup(name string) slog.Handler   { return quiet{q.Handler.WithGroup(name)} }

// portURL is the URL of port of sandbox id on the port's own origin: from
// PortOrigin when the server gave one, else the scheme and port of
// PublicURL with Domain (default "localhost"; a domain with a port keeps it).
func (c Config) portURL(id string, port int) (string, error) {
	scheme, domain := "", c.Domain
	if c.PortOrigin != nil {
		scheme, domain = c.PortOrigin()
	} else {
		u, err := url.Parse(c.PublicURL)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("the server's URL %q is not an absolute URL", c.PublicURL)
		}
		scheme = u.Scheme
		if domain == "" {
			domain = "localhost"
		}
		if p := u.Port(); p != "" && !strings.Contains(domain, ":") {
			domain += ":" + p
		}
	}
	return scheme + "://" + strconv.Itoa(port) + "-" + id + "." + domain + "/", nil
}
