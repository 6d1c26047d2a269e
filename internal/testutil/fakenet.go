package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// FakeNet is a stand-in for the internet on a machine without one: a
// network namespace with its own public-looking addresses, routed from the
// host, serving HTTP on :80 and HTTPS on :443 (certificates from a test CA)
// on every address, UDP and TCP echo on :7, and DNS on :53 of the first
// address for the names it was given.
type FakeNet struct {
	NSPath string
	HostIP netip.Addr   // the host's end of the link
	IPs    []netip.Addr // the fake hosts' addresses
	DNS    netip.Addr   // nameserver address (IPs[0])
	Names  map[string]netip.Addr
	CAPEM  []byte
	CAPool *x509.CertPool

	mu      sync.Mutex
	seen    []Seen
	queries []string
}

// Seen is one request a fake server received.
type Seen struct {
	Scheme, Method, Host, Path string
	Header                     http.Header
	Remote                     string
	Local                      string // the fake server's address that got it
}

// Echo is the JSON body the fake HTTP(S) servers answer with.
type Echo struct {
	Scheme  string              `json:"scheme"`
	Method  string              `json:"method"`
	Host    string              `json:"host"`
	Path    string              `json:"path"`
	Headers map[string][]string `json:"headers"`
	Remote  string              `json:"remote"`
	Local   string              `json:"local"`
}

// NewFakeNet builds the fake internet in prefix (a /24 outside every
// private range, e.g. 198.18.1.0/24) named name (at most 8 bytes: it seeds
// interface names). The host gets .1, the fake hosts .10 to .10+n-1. names
// maps DNS names to addresses (any address, also outside prefix).
func NewFakeNet(t testing.TB, name string, prefix netip.Prefix, n int, names map[string]netip.Addr) *FakeNet {
	t.Helper()
	RequireRoot(t)
	f := &FakeNet{Names: names}
	f.HostIP = prefix.Addr().Next()
	ip := prefix.Addr()
	for range 10 {
		ip = ip.Next()
	}
	for range n {
		f.IPs = append(f.IPs, ip)
		ip = ip.Next()
	}
	f.DNS = f.IPs[0]

	dir := t.TempDir()
	f.NSPath = filepath.Join(dir, "ns")
	hostIf, nsIf := "fh"+name, "fn"+name
	if l, err := netlink.LinkByName(hostIf); err == nil {
		_ = netlink.LinkDel(l)
	}
	if err := bindNewNetNS(f.NSPath); err != nil {
		t.Fatalf("fake net netns: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(hostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
		_ = unix.Unmount(f.NSPath, unix.MNT_DETACH)
	})
	ns, err := netns.GetFromPath(f.NSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: nsIf, PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatalf("fake net veth: %v", err)
	}
	hl, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(hl, &netlink.Addr{IPNet: &net.IPNet{IP: f.HostIP.AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		t.Fatal(err)
	}
	// Names may point outside prefix: route those addresses here too.
	for _, a := range names {
		if !prefix.Contains(a) {
			_ = netlink.RouteReplace(&netlink.Route{LinkIndex: hl.Attrs().Index, Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		}
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := h.LinkByName(nsIf)
	if err != nil {
		t.Fatal(err)
	}
	addrs := append([]netip.Addr(nil), f.IPs...)
	for _, a := range names {
		if !prefix.Contains(a) {
			addrs = append(addrs, a)
		}
	}
	for _, a := range addrs {
		bits := prefix.Bits()
		if !prefix.Contains(a) {
			bits = 32
		}
		if err := h.AddrAdd(nl, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}}); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("fake net address %s: %v", a, err)
		}
	}
	lo, _ := h.LinkByName("lo")
	_ = h.LinkSetUp(lo)
	if err := h.LinkSetUp(nl); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: nl.Attrs().Index, Gw: f.HostIP.AsSlice()}); err != nil {
		t.Fatalf("fake net default route: %v", err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}

	caCert, caKey := newTestCA(t)
	f.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	f.CAPool = x509.NewCertPool()
	f.CAPool.AddCert(caCert)
	var dnsNames []string
	for n := range names {
		dnsNames = append(dnsNames, n)
	}
	leaf := issue(t, caCert, caKey, dnsNames, addrs)

	for _, a := range addrs {
		f.serve(t, a, leaf)
	}
	f.serveDNS(t)
	return f
}

func (f *FakeNet) record(s Seen) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, s)
}

// Requests returns the requests the fake servers have received.
func (f *FakeNet) Requests() []Seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Seen(nil), f.seen...)
}

// Queries returns the names the fake nameserver was asked for.
func (f *FakeNet) Queries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.queries...)
}

// Listen opens a listener inside the fake net.
func (f *FakeNet) Listen(t testing.TB, network, addr string) any {
	t.Helper()
	v, err := InNetNS(f.NSPath, func() (any, error) {
		if strings.HasPrefix(network, "udp") {
			return net.ListenPacket(network, addr)
		}
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		return lc.Listen(t.Context(), network, addr)
	})
	if err != nil {
		t.Fatalf("listen %s %s in fake net: %v", network, addr, err)
	}
	return v
}

func (f *FakeNet) serve(t testing.TB, a netip.Addr, leaf tls.Certificate) {
	handler := func(scheme string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			local := ""
			if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
				local = la.String()
			}
			f.record(Seen{Scheme: scheme, Method: r.Method, Host: r.Host, Path: r.URL.Path, Header: r.Header.Clone(), Remote: r.RemoteAddr, Local: local})
			switch r.URL.Path {
			case "/big":
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = io.CopyN(w, zeroReader{}, 8<<20)
				return
			case "/redirect":
				http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
				return
			}
			// Credentials come back hashed: a test can check them without
			// the echo carrying a secret into the sandbox.
			hdr := r.Header.Clone()
			if v := hdr.Get("Authorization"); v != "" {
				hdr.Set("Authorization", HashSecret(v))
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(Echo{Scheme: scheme, Method: r.Method, Host: r.Host, Path: r.URL.Path, Headers: hdr, Remote: r.RemoteAddr, Local: local})
		})
	}
	httpLn := f.Listen(t, "tcp4", netip.AddrPortFrom(a, 80).String()).(net.Listener)
	tlsLn := f.Listen(t, "tcp4", netip.AddrPortFrom(a, 443).String()).(net.Listener)
	echoLn := f.Listen(t, "tcp4", netip.AddrPortFrom(a, 7).String()).(net.Listener)
	udp := f.Listen(t, "udp4", netip.AddrPortFrom(a, 7).String()).(net.PacketConn)
	hs := &http.Server{Handler: handler("http")}
	ts := &http.Server{Handler: handler("https"), TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}}
	go hs.Serve(httpLn)
	go ts.ServeTLS(tlsLn, "", "")
	go func() {
		for {
			c, err := echoLn.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = udp.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { hs.Close(); ts.Close(); echoLn.Close(); udp.Close() })
}

func (f *FakeNet) serveDNS(t testing.TB) {
	pc := f.Listen(t, "udp4", netip.AddrPortFrom(f.DNS, 53).String()).(net.PacketConn)
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := f.answer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
}

func (f *FakeNet) answer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(qs[0].Name.String()), ".")
	f.mu.Lock()
	f.queries = append(f.queries, name)
	f.mu.Unlock()
	a, ok := f.Names[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !ok {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(qs[0])
	if ok && qs[0].Type == dnsmessage.TypeA {
		_ = b.StartAnswers()
		_ = b.AResource(dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a.As4()})
	}
	out, _ := b.Finish()
	return out
}

// HashSecret is how the fake servers echo an Authorization header.
func HashSecret(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// InNetNS runs fn on a locked OS thread inside the network namespace at
// path. Sockets fn opens stay in that namespace. The thread is never
// unlocked, so Go discards it afterwards.
func InNetNS[T any](path string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	out := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			out <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			out <- result{err: err}
			return
		}
		v, err := fn()
		out <- result{v, err}
	}()
	r := <-out
	return r.v, r.err
}

func bindNewNetNS(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	f.Close()
	_, err = InNetNS("/proc/self/ns/net", func() (struct{}, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
	})
	return err
}

func newTestCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentbox fake internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func issue(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names []string, ips []netip.Addr) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fake internet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: names, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, a := range ips {
		tpl.IPAddresses = append(tpl.IPAddresses, a.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// SOCKS5 runs a minimal SOCKS5 proxy (RFC 1928, CONNECT only, optional
// RFC 1929 user/password) at addr inside the fake net. The returned func
// reports how many connections it carried.
func (f *FakeNet) SOCKS5(t testing.TB, addr, user, pass string) func() int {
	ln := f.Listen(t, "tcp4", addr).(net.Listener)
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := socksHandshake(c, user, pass)
				if err != nil {
					return
				}
				defer up.Close()
				mu.Lock()
				n++
				mu.Unlock()
				go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func socksHandshake(c net.Conn, user, pass string) (net.Conn, error) {
	buf := make([]byte, 262)
	if _, err := io.ReadFull(c, buf[:2]); err != nil || buf[0] != 5 {
		return nil, fmt.Errorf("not socks5")
	}
	methods := buf[2 : 2+int(buf[1])]
	if _, err := io.ReadFull(c, methods); err != nil {
		return nil, err
	}
	want := byte(0)
	if user != "" {
		want = 2
	}
	if !strings.ContainsRune(string(methods), rune(want)) {
		c.Write([]byte{5, 0xff})
		return nil, fmt.Errorf("no acceptable method")
	}
	c.Write([]byte{5, want})
	if want == 2 {
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return nil, err
		}
		u := make([]byte, buf[1])
		io.ReadFull(c, u)
		io.ReadFull(c, buf[:1])
		p := make([]byte, buf[0])
		io.ReadFull(c, p)
		if string(u) != user || string(p) != pass {
			c.Write([]byte{1, 1})
			return nil, fmt.Errorf("bad credentials")
		}
		c.Write([]byte{1, 0})
	}
	if _, err := io.ReadFull(c, buf[:4]); err != nil || buf[1] != 1 {
		return nil, fmt.Errorf("only CONNECT")
	}
	var host string
	switch buf[3] {
	case 1:
		io.ReadFull(c, buf[:4])
		host = net.IP(buf[:4]).String()
	case 3:
		io.ReadFull(c, buf[:1])
		h := make([]byte, buf[0])
		io.ReadFull(c, h)
		host = string(h)
	default:
		return nil, fmt.Errorf("address type %d", buf[3])
	}
	io.ReadFull(c, buf[:2])
	port := int(buf[0])<<8 | int(buf[1])
	up, err := net.DialTimeout("tcp4", net.JoinHostPort(host, fmt.Sprint(port)), 5*time.Second)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return nil, err
	}
	c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	return up, nil
}
