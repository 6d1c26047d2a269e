// Package acmecert obtains certificates for sandbox port hosts
// (<port>-<sandboxID>.<domain>) from an ACME certificate authority, one per
// host on its first TLS handshake, by the TLS-ALPN-01 challenge on the
// server's TLS listener. It is the alternative to an operator's wildcard
// certificate where the server is reachable from the CA on port 443.
//
// A handshake names any host it likes, so issuance is bounded: only hosts of
// sandboxes on record get a certificate, a sandbox at most PerSandbox of
// them, and the server at most PerHour new ones an hour. Without the bounds
// anyone who can reach the listener could spend the operator's CA rate limit
// (a few dozen certificates a week per domain at public CAs) and lock every
// tenant out of new certificates.
package acmecert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"

	"github.com/agentbox/agentbox/internal/porthost"
)

// ErrRefused wraps every host-policy refusal.
var ErrRefused = errors.New("no certificate for this host")

// Config says where certificates come from and how many may be made.
type Config struct {
	// Directory is the ACME directory URL of the certificate authority.
	Directory string
	// Email is the account's contact (optional).
	Email string
	// CacheDir keeps the account key and the certificates (made 0700).
	CacheDir string
	// RootCAs verifies the directory's own TLS certificate (nil: the host's roots).
	RootCAs *x509.CertPool
	// Domain is the domain of port hosts.
	Domain string
	// Known reports whether a sandbox is on record (in any state).
	Known func(id string) bool
	// PerSandbox bounds the hosts (ports) one sandbox gets certificates for.
	PerSandbox int
	// PerHour bounds the certificates requested an hour, all sandboxes together.
	PerHour int
}

// Manager hands out certificates during TLS handshakes.
type Manager struct {
	cfg Config
	ac  *autocert.Manager
	log *slog.Logger
	now func() time.Time

	mu     sync.Mutex
	hosts  map[string]map[string]bool // sandbox id → hosts given a certificate
	recent []time.Time                // requests in the last hour
}

// New checks cfg and makes the cache directory.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	switch {
	case cfg.Directory == "":
		return nil, errors.New("acme: the directory URL is empty")
	case cfg.Domain == "":
		return nil, errors.New("acme: certificates are for port hosts <port>-<sandboxID>.<domain>: set --domain")
	case cfg.Known == nil:
		return nil, errors.New("acme: no sandbox lookup")
	case cfg.PerSandbox < 1:
		return nil, fmt.Errorf("acme: certificates per sandbox is %d; give at least 1", cfg.PerSandbox)
	case cfg.PerHour < 1:
		return nil, fmt.Errorf("acme: certificates per hour is %d; give at least 1", cfg.PerHour)
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("acme cache: %w", err)
	}
	if err := os.Chmod(cfg.CacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("acme cache: %w", err)
	}
	m := &Manager{cfg: cfg, log: log, now: time.Now, hosts: map[string]map[string]bool{}}
	hc := &http.Client{Timeout: time.Minute}
	if cfg.RootCAs != nil {
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs}}
	}
	m.ac = &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		Cache:      autocert.DirCache(cfg.CacheDir),
		HostPolicy: m.policy,
		Email:      cfg.Email,
		Client:     &acme.Client{DirectoryURL: cfg.Directory, HTTPClient: hc},
	}
	return m, nil
}

// TLSConfig serves port hosts' certificates and answers the CA's
// TLS-ALPN-01 challenges.
func (m *Manager) TLSConfig() *tls.Config {
	c := m.ac.TLSConfig()
	c.NextProtos = []string{"http/1.1", acme.ALPNProto}
	return c
}

// sandboxOf returns the sandbox id of a port host under the domain.
func (m *Manager) sandboxOf(host string) (string, bool) {
	// One name per port of a sandbox: 080-<id> gets no certificate of
	// its own beside 80-<id>.
	ph, ok, err := porthost.Parse(strings.TrimSuffix(host, "."))
	if !ok || err != nil || !ph.Canonical || ph.Domain != m.cfg.Domain {
		return "", false
	}
	return ph.ID, true
}

// policy is autocert's host policy: it runs on every handshake before the
// cache is read, so it counts a host only the first time it is asked for.
func (m *Manager) policy(_ context.Context, host string) error {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	id, ok := m.sandboxOf(host)
	if !ok {
		return fmt.Errorf("%w: %q is not <port>-<sandboxID>.%s", ErrRefused, host, m.cfg.Domain)
	}
	if !m.cfg.Known(id) {
		return fmt.Errorf("%w: no sandbox %s", ErrRefused, id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hosts[id][host] || m.cached(host) {
		m.remember(id, host)
		return nil
	}
	if n := len(m.hosts[id]); n >= m.cfg.PerSandbox {
		return fmt.Errorf("%w: sandbox %s already has certificates for %d port hosts (--acme-certs-per-sandbox)", ErrRefused, id, n)
	}
	now := m.now()
	keep := m.recent[:0]
	for _, t := range m.recent {
		if now.Sub(t) < time.Hour {
			keep = append(keep, t)
		}
	}
	m.recent = keep
	if len(m.recent) >= m.cfg.PerHour {
		return fmt.Errorf("%w: %d certificates were requested in the last hour (--acme-certs-per-hour)", ErrRefused, len(m.recent))
	}
	m.recent = append(m.recent, now)
	m.remember(id, host)
	m.log.Info("acme certificate requested", "host", host, "sandbox", id)
	return nil
}

func (m *Manager) remember(id, host string) {
	if m.hosts[id] == nil {
		m.hosts[id] = map[string]bool{}
	}
	m.hosts[id][host] = true
}

// cached reports whether the cache holds a certificate for host already
// (from before a restart).
func (m *Manager) cached(host string) bool {
	for _, name := range []string{host, host + "+rsa"} {
		if _, err := os.Stat(filepath.Join(m.cfg.CacheDir, name)); err == nil {
			return true
		}
	}
	return false
}

// Prune removes the certificates of sandboxes no longer on record, so the
// cache holds what live sandboxes use and nothing more.
func (m *Manager) Prune() {
	ents, err := os.ReadDir(m.cfg.CacheDir)
	if err != nil {
		m.log.Warn("acme cache", "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range ents {
		host := strings.TrimSuffix(strings.TrimSuffix(e.Name(), "+rsa"), "+token")
		id, ok := m.sandboxOf(host)
		if !ok || m.cfg.Known(id) {
			continue // the account key, or a live sandbox's certificate
		}
		if err := os.Remove(filepath.Join(m.cfg.CacheDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("acme cache", "err", err)
		}
	}
	for id := range m.hosts {
		if !m.cfg.Known(id) {
			delete(m.hosts, id)
		}
	}
}

// Run prunes the cache every interval until ctx ends.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Prune()
		}
	}
}
