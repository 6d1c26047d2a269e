package localrun

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/agentbox/agentbox/internal/network"
)

// Proxy is the command's only way out: an HTTP proxy (CONNECT for TLS,
// absolute URLs for plain HTTP) that lets through the domains of an
// allowlist, refuses the rest with a 403 that says how to allow them, and
// logs every decision. It runs in agentbox, outside the command's network
// namespace, and dials from the host's.
type Proxy struct {
	Allow  network.Policy // AllowDomains decides
	Refuse func(line string)
	Log    *slog.Logger
	Dialer net.Dialer
}

// Serve accepts proxy connections on ln until it is closed.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() {
			defer c.Close()
			p.handle(ctx, c)
		})
	}
}

// decide returns "" when host may be reached, else the refusal.
func (p *Proxy) decide(host string) string {
	if rule, ok := p.Allow.AllowsDomain(host); ok {
		p.Log.Info("egress allowed", "kind", "net", "host", host, "rule", rule)
		return ""
	}
	why := fmt.Sprintf("connection to %s refused by the proxy: not in the --allow-net list; allow it with --allow-net %s", host, host)
	p.Log.Warn("refused", "kind", "net", "host", host, "explanation", why)
	if p.Refuse != nil {
		p.Refuse(why)
	}
	return why
}

func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	// A tunnel held open by a process left behind must not keep agentbox
	// from exiting.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	host, port := req.URL.Hostname(), req.URL.Port()
	if req.Method == http.MethodConnect {
		host, port, err = net.SplitHostPort(req.Host)
		if err != nil {
			refuse(c, http.StatusBadRequest, "CONNECT needs host:port")
			return
		}
	}
	if host == "" {
		refuse(c, http.StatusBadRequest, "agentbox proxy: send absolute URLs (http://host/path) or CONNECT host:port")
		return
	}
	if why := p.decide(strings.ToLower(host)); why != "" {
		refuse(c, http.StatusForbidden, "agentbox: "+why)
		return
	}
	if port == "" {
		port = "80"
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addr, why := p.resolve(dctx, host)
	if why != "" {
		p.Log.Warn("refused", "kind", "net", "host", host, "explanation", why)
		if p.Refuse != nil {
			p.Refuse(why)
		}
		refuse(c, http.StatusForbidden, "agentbox: "+why)
		return
	}
	up, err := p.Dialer.DialContext(dctx, "tcp", net.JoinHostPort(addr.String(), port))
	cancel()
	if err != nil {
		refuse(c, http.StatusBadGateway, fmt.Sprintf("agentbox proxy: %s:%s: %v", host, port, err))
		return
	}
	defer up.Close()
	stopUp := context.AfterFunc(ctx, func() { up.Close() })
	defer stopUp()
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
	} else {
		// One request per upstream connection: the next one may name
		// another host, which must be decided again.
		req.RequestURI = ""
		req.Header.Del("Proxy-Connection")
		req.Close = true
		if err := req.Write(up); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() {
		io.Copy(up, br) // the client's remaining bytes, buffered ones first
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
}

// resolve picks the address to dial for host, refusing a name that
// resolves to the host's own loopback or to link-local (cloud metadata)
// addresses: an allowed name must not lead to services the network
// namespace keeps away. An IP literal allowed as such is dialled as is.
func (p *Proxy) resolve(ctx context.Context, host string) (netip.Addr, string) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, ""
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Sprintf("%s does not resolve: %v", host, err)
	}
	for _, a := range addrs {
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() {
			return netip.Addr{}, fmt.Sprintf("connection to %s refused by the proxy: it resolves to %s, a loopback or link-local address; allow that address itself with --allow-net %s", host, a, a)
		}
	}
	return addrs[0].Unmap(), ""
}

func refuse(c net.Conn, code int, msg string) {
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		code, http.StatusText(code), len(msg)+1, msg)
}
