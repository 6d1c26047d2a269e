package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/e2e/wire"
	"github.com/agentbox/agentbox/internal/testutil"
)

type usageReply struct {
	TeamID string    `json:"teamID"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Totals struct {
		CPUSeconds       float64 `json:"cpuSeconds"`
		MemoryGiBSeconds float64 `json:"memoryGiBSeconds"`
		DiskGiBHours     float64 `json:"diskGiBHours"`
		SnapshotGiBHours float64 `json:"snapshotGiBHours"`
		EgressBytes      int64   `json:"egressBytes"`
	} `json:"totals"`
	Sandboxes []sandboxUsage `json:"sandboxes"`
}

type sandboxUsage struct {
	SandboxID        string  `json:"sandboxID"`
	TemplateID       string  `json:"templateID"`
	CPUSeconds       float64 `json:"cpuSeconds"`
	MemoryGiBSeconds float64 `json:"memoryGiBSeconds"`
	DiskGiBHours     float64 `json:"diskGiBHours"`
	EgressBytes      int64   `json:"egressBytes"`
}

// TestUsageMetering runs a server of its own with a fake internet: a
// sandbox burning CPU accrues vCPU-seconds that grow with more work, a
// download through the egress proxy shows as egress bytes, a snapshot
// accrues snapshot GiB-hours, a gVisor sandbox is metered too, a paused
// sandbox accrues no CPU or memory, the totals survive the sandbox's
// removal and a server restart, and the server's /metrics shows the
// per-sandbox, egress and lifecycle series after that activity.
func TestUsageMetering(t *testing.T) {
	harness.RequireRoot(t)
	fake := testutil.NewFakeNet(t, "emeter", netip.MustParsePrefix("198.18.216.0/24"), 1, map[string]netip.Addr{
		"download.test": netip.MustParseAddr("198.18.216.10"),
	})
	caFile := filepath.Join(t.TempDir(), "fake-ca.pem")
	if err := os.WriteFile(caFile, fake.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	s := harness.Start(t, harness.Name("usage"), harness.Args("--egress-dns", fake.DNS.String(), "--egress-ca-file", caFile, "--metrics-listen", metricsAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := wire.New(s.URL, s.APIKey)

	get := func(path string) usageReply {
		t.Helper()
		code, b, err := s.Do(ctx, s.APIKey, http.MethodGet, path, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET %s: %d %s %v", path, code, b, err)
		}
		var u usageReply
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatalf("GET %s: %s: %v", path, b, err)
		}
		return u
	}
	of := func(u usageReply, id string) sandboxUsage {
		for _, s := range u.Sandboxes {
			if s.SandboxID == id {
				return s
			}
		}
		return sandboxUsage{}
	}
	// waitFor polls GET /usage (the meter samples every few seconds).
	waitFor := func(what string, ok func(usageReply) bool) usageReply {
		t.Helper()
		var u usageReply
		for range 60 {
			if u = get("/usage"); ok(u) {
				return u
			}
			time.Sleep(time.Second)
		}
		t.Fatalf("usage never showed %s: %+v", what, u)
		return u
	}
	run := func(sb *wire.Sandbox, cmd string) string {
		t.Helper()
		r, err := c.Run(ctx, sb, "", cmd)
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%s: %v %+v", cmd, err, r)
		}
		return r.Stdout
	}

	sb, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 600})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := sb.SandboxID
	run(sb, "timeout 4 sh -c 'while :; do :; done'; true")
	first := waitFor("CPU of the busy sandbox", func(u usageReply) bool { return of(u, id).CPUSeconds > 0.5 })
	got := of(first, id)
	if got.TemplateID == "" || got.MemoryGiBSeconds <= 0 || first.Totals.CPUSeconds < got.CPUSeconds {
		t.Errorf("after burning CPU: %+v, totals %+v; want a template, memory and totals covering the sandbox", got, first.Totals)
	}
	run(sb, "timeout 4 sh -c 'while :; do :; done'; true")
	waitFor("the CPU grow with more work", func(u usageReply) bool { return of(u, id).CPUSeconds > got.CPUSeconds+0.5 })

	if out := run(sb, "curl -sS -m 30 -o /dev/null -w '%{size_download}' http://download.test/big"); strings.TrimSpace(out) != fmt.Sprint(8<<20) {
		t.Fatalf("download through the proxy: %q bytes", out)
	}
	waitFor("the download's egress bytes", func(u usageReply) bool { return of(u, id).EgressBytes >= 8<<20 })

	// A snapshot accrues snapshot GiB-hours while it is kept.
	code, b, err := s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+id+"/snapshots", map[string]any{})
	if err != nil || code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s %v", code, b, err)
	}
	waitFor("snapshot GiB-hours", func(u usageReply) bool { return u.Totals.SnapshotGiBHours > 0 })

	code, b, err = s.Do(ctx, s.APIKey, http.MethodPost, "/sandboxes/"+id+"/pause", nil)
	if err != nil || code != http.StatusNoContent {
		t.Fatalf("pause: %d %s %v", code, b, err)
	}
	paused := of(get("/usage"), id)
	time.Sleep(15 * time.Second) // three sampling ticks
	later := of(get("/usage"), id)
	if later.CPUSeconds != paused.CPUSeconds || later.MemoryGiBSeconds != paused.MemoryGiBSeconds {
		t.Errorf("a paused sandbox accrued CPU or memory: %+v then %+v", paused, later)
	}
	if later.DiskGiBHours < paused.DiskGiBHours {
		t.Errorf("disk usage went down while paused: %+v then %+v", paused, later)
	}

	// Removal and a restart keep what was metered.
	if err := c.Kill(ctx, id); err != nil {
		t.Fatalf("kill: %v", err)
	}
	s.Restart(t)
	after := of(get("/usage"), id)
	if after.CPUSeconds < later.CPUSeconds || after.EgressBytes < 8<<20 {
		t.Errorf("after kill and restart: %+v, want at least %+v", after, later)
	}
	team := get("/usage").TeamID
	if u := get("/teams/" + team + "/usage"); of(u, id).CPUSeconds != after.CPUSeconds {
		t.Errorf("GET /teams/%s/usage differs from GET /usage: %+v", team, of(u, id))
	}
	// The CLI prints the same figures.
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, s.Bin, args...)
		cmd.Env = s.Env(s.APIKey)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := cli("usage"); err != nil || !strings.Contains(out, id) || !strings.Contains(out, "TOTAL") {
		t.Errorf("agentbox usage: %v\n%s", err, out)
	}
	out, err := cli("usage", "--json")
	var viaCLI usageReply
	if err == nil {
		err = json.Unmarshal([]byte(out), &viaCLI)
	}
	if err != nil || of(viaCLI, id).CPUSeconds != after.CPUSeconds {
		t.Errorf("agentbox usage --json: %v\n%s", err, out)
	}
	if out, err := cli("usage", "--from", "yesterday"); err == nil || !strings.Contains(out, "--from") {
		t.Errorf("agentbox usage --from yesterday: %v %s; want an error naming --from", err, out)
	}

	// A window before the sandbox existed holds none of it.
	old := time.Now().Add(-72 * time.Hour).UTC().Format(time.RFC3339)
	if u := get("/usage?from=" + old + "&to=" + old); len(u.Sandboxes) != 0 || u.Totals.CPUSeconds != 0 {
		t.Errorf("usage of a past window: %+v", u)
	}

	// The gVisor tier is metered from its cgroup too.
	gv, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 120, Metadata: map[string]string{"agentbox.isolation": "gvisor"}})
	if err != nil {
		t.Fatalf("create on gvisor: %v", err)
	}
	run(gv, "timeout 3 sh -c 'while :; do :; done'; true")
	waitFor("CPU of a busy gVisor sandbox", func(u usageReply) bool {
		return of(u, gv.SandboxID).CPUSeconds > 0.5 && of(u, gv.SandboxID).MemoryGiBSeconds > 0
	})
	if err := c.Kill(ctx, gv.SandboxID); err != nil {
		t.Errorf("kill the gvisor sandbox: %v", err)
	}

	// The operator's scrape after all that (a fresh sandbox for the
	// per-sandbox series: the first one is gone).
	sb2, err := c.Create(ctx, wire.CreateRequest{TemplateID: "base", Timeout: 120})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	run(sb2, "curl -sS -m 30 -o /dev/null http://download.test/big")
	defer c.Kill(context.Background(), sb2.SandboxID)
	var body string
	for range 30 {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(raw)
		if strings.Contains(body, `agentbox_sandbox_cpu_seconds_total{sandbox="`+sb2.SandboxID+`",team="`+team+`"}`) {
			break
		}
		time.Sleep(time.Second)
	}
	for _, want := range []string{
		`agentbox_sandbox_cpu_seconds_total{sandbox="` + sb2.SandboxID + `",team="` + team + `"}`,
		`agentbox_sandbox_memory_bytes{sandbox="` + sb2.SandboxID + `",team="` + team + `"}`,
		`agentbox_sandbox_network_bytes_total{direction="in",sandbox="` + sb2.SandboxID + `",team="` + team + `"} 8.`,
		`agentbox_sandbox_series_omitted 0`,
		`agentbox_egress_decisions_total{decision="allow",reason="default"}`,
		`agentbox_egress_bytes_total{direction="in"} 8.`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(body, "agentbox_"))
		}
	}
}
