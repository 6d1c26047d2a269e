package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/acmecert"
	"github.com/agentbox/agentbox/internal/egress"
	"github.com/agentbox/agentbox/internal/network"
	"github.com/agentbox/agentbox/internal/store"
)

// netFlags are the serve settings for sandbox egress and ingress.
type netFlags struct {
	Egress        bool
	EgressCA      string
	EgressDNS     []string
	OperatorAllow []string
	Domain        string
	TLSCert       string
	TLSKey        string
	TLSListen     string
	ACME          acmeFlags
}

// acmeFlags obtain port hosts' certificates from an ACME CA instead of
// --tls-cert.
type acmeFlags struct {
	Directory  string
	Email      string
	CAFile     string
	PerSandbox int
	PerHour    int
}

func addNetFlags(f *pflag.FlagSet, n *netFlags) {
	f.BoolVar(&n.Egress, "egress", true, "send every sandbox's TCP and DNS through the host-side egress proxy and resolver (domain rules, header injection, upstream proxies, egress audit); without it only IP rules apply")
	f.StringVar(&n.EgressCA, "egress-ca-file", "", "PEM file of extra CAs the egress proxy trusts when it terminates TLS for header rules (the host's roots are always trusted)")
	f.StringSliceVar(&n.EgressDNS, "egress-dns", nil, "upstream nameservers of the sandboxes' resolver (default: the host's /etc/resolv.conf)")
	f.StringSliceVar(&n.OperatorAllow, "operator-allow", nil, "private CIDR ranges sandboxes may reach when their policy allows (e.g. a LAN package mirror); link-local stays closed")
	f.StringVar(&n.Domain, "domain", "", "domain of sandbox port hosts <port>-<sandboxID>.<domain>, each port a web origin of its own (needs wildcard DNS to this server); when set, only hosts under it are routed to sandboxes by Host. Default: any such host is routed, and the dashboard and MCP link ports as <port>-<sandboxID>.localhost:<listen port>")
	f.StringVar(&n.TLSCert, "tls-cert", "", "PEM certificate (e.g. a wildcard *.<domain>) for the TLS listener; with --domain, port URLs use https on it")
	f.StringVar(&n.TLSKey, "tls-key", "", "PEM key of --tls-cert")
	f.StringVar(&n.TLSListen, "tls-listen", ":443", "address of the TLS listener, used when --tls-cert or --acme-directory is given")
	f.StringVar(&n.ACME.Directory, "acme-directory", "", "ACME directory URL (e.g. https://acme-v02.api.letsencrypt.org/directory): with --domain and instead of --tls-cert, each port host <port>-<sandboxID>.<domain> gets its own certificate on its first HTTPS request, by the TLS-ALPN-01 challenge (the CA must reach --tls-listen on port 443 of the host's public name); only hosts of sandboxes on record, within the two bounds below")
	f.StringVar(&n.ACME.Email, "acme-email", "", "contact address of the ACME account")
	f.StringVar(&n.ACME.CAFile, "acme-ca-file", "", "PEM file of the CA that signs the ACME directory's own HTTPS certificate, for a private ACME server (default: the host's roots)")
	f.IntVar(&n.ACME.PerSandbox, "acme-certs-per-sandbox", 8, "port hosts one sandbox gets ACME certificates for")
	f.IntVar(&n.ACME.PerHour, "acme-certs-per-hour", 30, "ACME certificates requested an hour, all sandboxes together (keep it under the CA's rate limit)")
}

func (n netFlags) operatorAllow() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range n.OperatorAllow {
		p, err := network.ParsePrefix(fmt.Sprintf("--operator-allow[%d]", i), s)
		if err != nil {
			return nil, err
		}
		if p.Bits() == 0 {
			return nil, fmt.Errorf("--operator-allow: %s would open everything; list the private ranges to open", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// startEgress starts the egress proxy and resolver and routes sandbox
// traffic to them. It returns nil with --egress=false.
func startEgress(ctx context.Context, n netFlags, nw *network.Manager, st *store.Store, subnet netip.Prefix, opAllow []netip.Prefix, limits egress.Limits, log *slog.Logger) (*egress.Server, error) {
	if !n.Egress {
		return nil, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if n.EgressCA != "" {
		pem, err := os.ReadFile(n.EgressCA)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--egress-ca-file %s: no PEM certificate in it", n.EgressCA)
		}
	}
	dns := n.EgressDNS
	if len(dns) == 0 {
		dns = network.HostDNS("/etc/resolv.conf")
	}
	for _, d := range dns {
		if _, err := netip.ParseAddr(d); err != nil {
			return nil, fmt.Errorf("--egress-dns: %q is not an IP address", d)
		}
	}
	secret, err := st.Secret(ctx, "egress-ca")
	if err != nil {
		return nil, err
	}
	eg := egress.New(egress.Config{Gateway: nw.Gateway(), Subnet: subnet, OperatorAllow: opAllow, Nameservers: dns, RootCAs: roots, CASecret: secret, Limits: limits}, log)
	ports, err := eg.Start(ctx)
	if err != nil {
		return nil, err
	}
	nw.SetEgress(eg, ports)
	return eg, nil
}

// tlsServer serves handler over TLS when --tls-cert or --acme-directory is
// set. known reports whether a sandbox is on record, for ACME's host policy;
// the returned ACME manager (nil without ACME) prunes its cache in Run.
func (n netFlags) tlsServer(ctx context.Context, handler http.Handler, dataDir string, known func(string) bool, log *slog.Logger) (*http.Server, net.Listener, *acmecert.Manager, error) {
	var cfg *tls.Config
	var am *acmecert.Manager
	switch {
	case n.ACME.Directory != "" && (n.TLSCert != "" || n.TLSKey != ""):
		return nil, nil, nil, errors.New("--acme-directory and --tls-cert: give one (a wildcard certificate, or certificates from the ACME CA)")
	case n.ACME.Directory != "":
		var roots *x509.CertPool
		if n.ACME.CAFile != "" {
			pem, err := os.ReadFile(n.ACME.CAFile)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("--acme-ca-file: %w", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, nil, nil, fmt.Errorf("--acme-ca-file %s: no PEM certificate in it", n.ACME.CAFile)
			}
		}
		var err error
		am, err = acmecert.New(acmecert.Config{
			Directory: n.ACME.Directory, Email: n.ACME.Email, CacheDir: filepath.Join(dataDir, "acme"), RootCAs: roots,
			Domain: strings.Trim(strings.ToLower(n.Domain), "."), Known: known, PerSandbox: n.ACME.PerSandbox, PerHour: n.ACME.PerHour,
		}, log.With("component", "acme"))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--acme-directory: %w", err)
		}
		cfg = am.TLSConfig()
	case n.TLSCert != "" || n.TLSKey != "":
		cert, err := tls.LoadX509KeyPair(n.TLSCert, n.TLSKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	default:
		return nil, nil, nil, nil
	}
	ln, err := listen(ctx, n.TLSListen)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-listen: %w", err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 640 * time.Second,
		// A refused host is an operator's matter, not an error per handshake.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	return srv, tls.NewListener(ln, cfg), am, nil
}
