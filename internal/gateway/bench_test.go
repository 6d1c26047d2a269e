package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/sandbox"
)

// BenchmarkGateway compares requests to a server through the gateway (header
// routing) with the same requests sent to it directly: the added latency of
// a small request (p50-µs) and the throughput of an 8 MiB download (MB/s).
// Both use keep-alive connections, as the SDKs do.
func BenchmarkGateway(b *testing.B) {
	const size = 8 << 20
	payload := strings.Repeat("x", size)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			io.WriteString(w, payload)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	addr := netip.MustParseAddrPort(u.Host)
	res := fakeResolver{sbs: map[string]*sandbox.Sandbox{"ibench": {ID: "ibench", IP: addr.Addr(), State: sandbox.StateRunning}}}
	gw := httptest.NewServer(New(res, slog.New(slog.DiscardHandler)).Handler(http.NotFoundHandler()))
	defer gw.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	get := func(b *testing.B, base, path string, viaGateway bool) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if viaGateway {
			req.Header.Set("E2b-Sandbox-Id", "ibench")
			req.Header.Set("E2b-Sandbox-Port", u.Port())
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.Status)
		}
	}
	for _, tc := range []struct {
		name string
		base string
		gw   bool
	}{{"direct", upstream.URL, false}, {"gateway", gw.URL, true}} {
		b.Run(tc.name+"/latency", func(b *testing.B) {
			var ds []time.Duration
			for b.Loop() {
				start := time.Now()
				get(b, tc.base, "/", tc.gw)
				ds = append(ds, time.Since(start))
			}
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Nanoseconds())/1e3, "p50-µs")
		})
		b.Run(tc.name+"/throughput", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				get(b, tc.base, "/big", tc.gw)
			}
		})
	}
}
