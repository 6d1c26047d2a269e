package localrun

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/agentbox/agentbox/internal/network"
)

func TestProxy(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "upstream "+r.URL.Path)
	}))
	defer up.Close()
	upURL, _ := url.Parse(up.URL)

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []string
	p := &Proxy{Allow: network.Policy{AllowDomains: []string{"127.0.0.1", "*.allowed.test"}},
		Refuse: func(l string) { mu.Lock(); refused = append(refused, l); mu.Unlock() }, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Serve(ctx, ln)
	defer ln.Close()

	proxyURL, _ := url.Parse("http://" + ln.Addr().String())
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	for _, tc := range []struct {
		name, url string
		code      int
		body      string
	}{
		{"allowed IP literal", up.URL + "/a", 200, "upstream /a"},
		{"refused name", "http://example.test:" + upURL.Port() + "/", 403, "not in the --allow-net list; allow it with --allow-net example.test"},
		{"wildcard does not match the apex", "http://allowed.test/", 403, "--allow-net allowed.test"},
		{"allowed name that does not resolve", "http://nowhere.allowed.test/", 403, "nowhere.allowed.test does not resolve"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := client.Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.code, b)
			}
			if !strings.Contains(string(b), tc.body) {
				t.Fatalf("body %q lacks %q", b, tc.body)
			}
		})
	}

	// CONNECT tunnels to an allowed host and is refused for another.
	for _, tc := range []struct {
		target string
		status string
	}{{upURL.Host, "200"}, {"example.test:443", "403"}} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", tc.target, tc.target)
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || !strings.Contains(line, " "+tc.status+" ") {
			t.Errorf("CONNECT %s: %q %v, want %s", tc.target, line, err, tc.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) == 0 || !strings.HasPrefix(refused[0], "connection to example.test refused by the proxy") {
		t.Errorf("refusals said on stderr: %q", refused)
	}
}
