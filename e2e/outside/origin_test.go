package outside

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// sideWebPage is a web page served by one team's sandbox, open in a browser
// where another team is logged into the dashboard.
const sideWebPage = "web-page"

// TestOriginAttacks: a page team B's sandbox serves on a port never shares
// an origin with the API or the dashboard, so in the very tab where team A
// is logged into the dashboard it reaches neither A's key (same-tab
// storage), nor the dashboard (a service worker scoped to /, same-origin
// fetches), nor the dashboard's cookies (a cookie for the parent domain).
// The old path form on the API's origin serves no sandbox content, and the
// headers a sandbox answers with claim nothing past its port's host. The
// browser is Debian's chromium driven by playwright-core (web/origin.mjs).
func TestOriginAttacks(t *testing.T) {
	s := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	_, listenPort, _ := strings.Cut(s.Addr, ":")
	dash := "http://localhost:" + listenPort // the dashboard's origin in the browser
	web := filepath.Join(s.Root, "e2e", "outside", "web")

	// Team B's sandbox serves the attacker's page on port 8000.
	client := agentbox.New(agentbox.WithAPIURL(s.URL), agentbox.WithSandboxURL(s.URL), agentbox.WithAPIKey(s.OtherKey))
	sb, err := client.Create(ctx, agentbox.CreateOptions{Template: "base", Timeout: 15 * time.Minute})
	if err != nil {
		t.Fatalf("team B creates a sandbox: %v", err)
	}
	t.Cleanup(func() { _ = sb.Kill(context.Background()) })
	for _, f := range []string{"index.html", "sw.js", "serve.py"} {
		b, err := os.ReadFile(filepath.Join(web, "page", f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Files.Write(ctx, "/tmp/page/"+f, b); err != nil {
			t.Fatalf("write %s into team B's sandbox: %v", f, err)
		}
	}
	if _, err := sb.Commands.Run(ctx, "nohup python3 /tmp/page/serve.py >/tmp/page/log 2>&1 &"); err != nil {
		t.Fatal(err)
	}
	portHost := "8000-" + sb.ID + ".localhost:" + listenPort
	own := "http://" + portHost + "/"
	pathForm := "/sandboxes/" + sb.ID + "/ports/8000/"
	get := func(host, path string, header http.Header) (*http.Response, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
		if err != nil {
			return nil, "", err
		}
		req.Host = host
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultTransport.RoundTrip(req) // redirects are answers here
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp, string(b), err
	}
	// Wait for the page on its own host.
	for {
		resp, body, err := get(portHost, "/", nil)
		if err == nil && resp.StatusCode == http.StatusOK && strings.Contains(body, "team B's page") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("team B's page never answered on %s: %v %v %.200s", own, resp, err, body)
		case <-time.After(200 * time.Millisecond):
		}
	}

	runAttacks(t, []attack{
		{side: sideWebPage, name: "the path form on the API's origin serves sandbox content", run: func(t *testing.T) error {
			resp, body, err := get(s.Addr, pathForm, nil)
			if err != nil {
				return err
			}
			if strings.Contains(body, "team B's page") || resp.StatusCode/100 == 2 {
				return crossed("%s answered %d with the sandbox's page", pathForm, resp.StatusCode)
			}
			if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || loc != own {
				return fmt.Errorf("%s answered %d Location %q, want a redirect to %s", pathForm, resp.StatusCode, loc, own)
			}
			return nil
		}},
		{side: sideWebPage, name: "a port's headers claim a wider scope (Service-Worker-Allowed, cookie Domain)", run: func(t *testing.T) error {
			resp, _, err := get(portHost, "/sw.js", nil)
			if err != nil {
				return err
			}
			if v := resp.Header.Get("Service-Worker-Allowed"); v != "" {
				return crossed("Service-Worker-Allowed %q passed through", v)
			}
			for _, c := range resp.Header.Values("Set-Cookie") {
				if strings.Contains(strings.ToLower(c), "domain=") {
					return crossed("Set-Cookie %q passed through", c)
				}
			}
			if len(resp.Header.Values("Set-Cookie")) == 0 {
				return fmt.Errorf("the page's host-only cookie was dropped too: the check would not see a Domain")
			}
			return nil
		}},
		{side: sideWebPage, name: "sandbox content by headers on the API's origin is a live page", run: func(t *testing.T) error {
			resp, body, err := get(s.Addr, "/", http.Header{"E2b-Sandbox-Id": {sb.ID}, "E2b-Sandbox-Port": {"8000"}})
			if err != nil {
				return err
			}
			if !strings.Contains(body, "team B's page") {
				return fmt.Errorf("header route: %d %.100s", resp.StatusCode, body)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox") {
				return crossed("served on the API's origin with CSP %q (not sandboxed)", csp)
			}
			if c := resp.Header.Values("Set-Cookie"); len(c) > 0 {
				return crossed("sets cookies on the API's host: %q", c)
			}
			return nil
		}},
	})

	// The browser.
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (scripts/install-deps.sh installs Debian's): %v", err)
	}
	harness.NPMInstall(t, web)
	pages := []struct{ form, url string }{
		{"on the port's own origin", own},
		{"by the old path form on the dashboard's origin", dash + pathForm},
	}
	var in []map[string]string
	for _, p := range pages {
		in = append(in, map[string]string{"name": p.form, "url": p.url})
	}
	attacksJSON, _ := json.Marshal(in)
	cmd := exec.CommandContext(ctx, "node", "origin.mjs")
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium, "DASH="+dash, "KEY="+s.APIKey, "ATTACKS="+string(attacksJSON))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node origin.mjs: %v\n%s", err, out)
	}
	var results []browserResult
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		if j, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
			if err := json.Unmarshal([]byte(j), &results); err != nil {
				t.Fatalf("node origin.mjs printed %q: %v", j, err)
			}
		}
	}
	if len(results) != len(pages) {
		t.Fatalf("node origin.mjs gave %d results for %d pages:\n%s", len(results), len(pages), out)
	}
	var attacks []attack
	for _, r := range results {
		if b, err := json.Marshal(r); err == nil {
			t.Logf("%s: %.2000s", r.Name, strings.Join(strings.Fields(string(b)), " "))
		}
		ready := func() error {
			switch {
			case r.Error != "":
				return fmt.Errorf("browser: %s", r.Error)
			case !strings.Contains(r.KeyStored, s.APIKey):
				return fmt.Errorf("team A's login kept no key in the tab: the attack would have nothing to find")
			case !r.After.StillLoggedIn:
				return fmt.Errorf("the tab lost team A's session: not the same tab's storage")
			}
			return nil
		}
		attacks = append(attacks,
			attack{side: sideWebPage, name: "team B's page " + r.Name + " reads team A's dashboard key from same-tab storage", run: func(t *testing.T) error {
				if err := ready(); err != nil {
					return err
				}
				if strings.HasPrefix(r.Report.Origin, dash) {
					return crossed("the page ran on the dashboard's origin %s", r.Report.Origin)
				}
				for _, v := range []string{string(r.Report.Session), string(r.Report.Local)} {
					if strings.Contains(v, s.APIKey) {
						return crossed("read the key from storage: %.80s", v)
					}
				}
				return nil
			}},
			attack{side: sideWebPage, name: "team B's page " + r.Name + " puts a service worker over the dashboard", run: func(t *testing.T) error {
				if err := ready(); err != nil {
					return err
				}
				switch {
				case strings.Contains(r.After.Loot, s.APIKey):
					return crossed("its service worker caught team A's key from the dashboard's requests")
				case r.After.Controlled || len(r.After.Registrations) > 0:
					return crossed("a service worker controls the dashboard: %q", r.After.Registrations)
				}
				return nil
			}},
			attack{side: sideWebPage, name: "team B's page " + r.Name + " fetches the dashboard and the API with the browser's credentials", run: func(t *testing.T) error {
				if err := ready(); err != nil {
					return err
				}
				for name, f := range map[string]fetchResult{"/dashboard/": r.Report.Dashboard, "/v2/sandboxes": r.Report.API, dash + "/dashboard/": r.Report.CrossDashboard, dash + "/v2/sandboxes": r.Report.CrossAPI} {
					if f.Error != "" {
						continue // the browser refused it (a cross-origin read)
					}
					if strings.Contains(f.Body, "agentbox dashboard") || strings.Contains(f.Type, "application/json") {
						return crossed("read %s: %d %s %.80s", name, f.Status, f.Type, f.Body)
					}
				}
				return nil
			}},
			attack{side: sideWebPage, name: "team B's page " + r.Name + " sets a cookie for the dashboard's host", run: func(t *testing.T) error {
				if err := ready(); err != nil {
					return err
				}
				for _, c := range r.DashCookies {
					if strings.HasPrefix(c, "planted=") {
						return crossed("the sandbox's Set-Cookie reached the dashboard's host: %s", c)
					}
				}
				return nil
			}},
		)
	}
	runAttacks(t, attacks)
}

// browserResult is what web/origin.mjs reports for one page.
type browserResult struct {
	Name      string `json:"name"`
	Error     string `json:"error"`
	KeyStored string `json:"keyStored"`
	Status    int    `json:"status"`
	FinalURL  string `json:"finalURL"`
	Report    struct {
		Origin         string          `json:"origin"`
		Session        json.RawMessage `json:"session"`
		Local          json.RawMessage `json:"local"`
		SW             json.RawMessage `json:"sw"`
		Cookie         string          `json:"cookie"`
		Dashboard      fetchResult     `json:"dashboard"`
		API            fetchResult     `json:"api"`
		CrossDashboard fetchResult     `json:"crossDashboard"`
		CrossAPI       fetchResult     `json:"crossApi"`
	} `json:"report"`
	After struct {
		Controlled    bool     `json:"controlled"`
		Registrations []string `json:"registrations"`
		Loot          string   `json:"loot"`
		StillLoggedIn bool     `json:"stillLoggedIn"`
	} `json:"after"`
	DashCookies []string `json:"dashCookies"`
}

type fetchResult struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}
