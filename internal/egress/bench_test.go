package egress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentbox/agentbox/internal/network"
)

// BenchmarkEgress compares a sandbox's HTTP requests to the (fake)
// internet through the egress proxy with the same requests from a sandbox
// on a server without it (nftables forwarding and masquerade only). Each
// request opens a new connection, so the figure includes the proxy's
// accept, original-destination lookup, Host/SNI read, policy decision and
// upstream dial. p50-µs is the median request time.
func BenchmarkEgress(b *testing.B) {
	proxied := newEnv(b, network.Policy{AllowInternet: true})
	ctx := context.Background()
	cfg := network.Config{Bridge: "abegr1", Subnet: netip.MustParsePrefix("10.97.1.0/24"), NetNSDir: b.TempDir(), Table: "agentbox_bench_direct"}
	nw, err := network.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	if err := nw.Setup(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		deleteTables(cfg.Table)
		if l, err := netlink.LinkByName(cfg.Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	ep, err := nw.Attach(ctx, "direct", network.Policy{AllowInternet: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = nw.Detach(ctx, "direct") })
	direct := &env{fake: proxied.fake, ep: ep}

	for _, tc := range []struct {
		name string
		e    *env
		url  string
	}{
		{"direct/http", direct, "http://198.18.2.10/"},
		{"proxied/http", proxied, "http://198.18.2.10/"},
		{"direct/https", direct, "https://198.18.2.10/"},
		{"proxied/https-passthrough", proxied, "https://198.18.2.10/"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := tc.e.client(tc.e.fake.CAPool)
			var ds []time.Duration
			for b.Loop() {
				start := time.Now()
				resp, err := c.Get(tc.url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
		})
	}
}
