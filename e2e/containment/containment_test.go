// Package containment is the containment suite: every attack in attacks()
// runs inside a sandbox on each isolation tier and must be contained; after
// each, the host and a neighbour sandbox are checked untouched. It prints
// the table attack × tier × result.
package containment

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentbox/agentbox/e2e/harness"
	"github.com/agentbox/agentbox/internal/runtime/bundle"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Tiers the suite runs on.
var tiers = []string{"container", "gvisor"}

// limits of attacker sandboxes: small, so abuse hits them quickly.
var attackerLimits = map[string]any{"memoryMB": 512, "pids": 256, "diskSizeMB": 512, "tmpSizeMB": 64, "cpuCount": 1}

// env is what attacks and checks know about the world around a sandbox.
type env struct {
	srv       *server
	client    *agentbox.Client
	tier      string
	probe     string // random token in file names the host must never see
	canary    string // host file the sandbox must not read
	canaryTok string
	attacker  *agentbox.Sandbox
	attackerI sandboxInfo
	nb        *agentbox.Sandbox // neighbour
	nbIP      string
	nbMarker  string // content of a file in the neighbour
	vars      map[string]string
	usedDisk  uint64 // bytes the server's data dir held before the attack
	ipForward string // host net.ipv4.ip_forward before
}

type sandboxInfo struct {
	ID       string `json:"sandboxID"`
	MemoryMB int    `json:"memoryMB"`
	PIDs     int    `json:"pids"`
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestContainment(t *testing.T) {
	harness.RequireRoot(t)
	if testing.Short() {
		t.Skip("containment suite is long")
	}
	srv := startServer(t)
	client := agentbox.New(agentbox.WithAPIURL(srv.url), agentbox.WithSandboxURL(srv.url), agentbox.WithAPIKey(srv.key))

	// CONTAINMENT_ONLY (a regexp of attack names) runs a focused subset.
	var only *regexp.Regexp
	if v := os.Getenv("CONTAINMENT_ONLY"); v != "" {
		only = regexp.MustCompile(v)
	}
	type row struct{ attack, tier, result, detail string }
	var rows []row
	failed := 0
	for _, tier := range tiers {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		e, err := newEnv(ctx, t, srv, client, tier)
		if err != nil {
			cancel()
			t.Fatalf("%s: setup: %v", tier, err)
		}
		for _, a := range attacks() {
			if only != nil && !only.MatchString(a.name) {
				continue
			}
			res, detail := e.run(ctx, t, a)
			switch {
			case res == "GAP" && os.Getenv("CONTAINMENT_STRICT") != "1":
				t.Logf("KNOWN GAP: %s on %s: %s", a.name, tier, detail)
			case res != "contained":
				failed++
				t.Errorf("%s on %s: %s: %s", a.name, tier, res, detail)
			}
			rows = append(rows, row{a.name, tier, res, detail})
		}
		e.close(ctx)
		cancel()
	}
	printTable(t, rows, func(r row) []string { return []string{r.attack, r.tier, r.result, r.detail} })
	t.Logf("%d attacks × %d tiers, %d not contained", len(attacks()), len(tiers), failed)
	if n := len(attacks()); n < 60 && only == nil {
		t.Errorf("only %d attacks; the suite must have at least 60", n)
	}
}

func printTable[T any](t *testing.T, rows []T, cols func(T) []string) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK\tTIER\tRESULT\tDETAIL")
	for _, r := range rows {
		c := cols(r)
		d := c[3]
		if len(d) > 90 {
			d = d[:90] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c[0], c[1], c[2], strings.ReplaceAll(d, "\n", " | "))
	}
	tw.Flush()
	// Printed, not logged: the table is the suite's report.
	fmt.Println(buf.String())
	if p := os.Getenv("CONTAINMENT_TABLE"); p != "" {
		_ = os.WriteFile(p, buf.Bytes(), 0o644)
	}
}

func (e *env) create(ctx context.Context, lim map[string]any) (*agentbox.Sandbox, sandboxInfo, error) {
	body := map[string]any{"templateID": "base", "timeout": 1800, "isolation": e.tier, "metadata": map[string]string{"containment": e.probe}}
	for k, v := range lim {
		body[k] = v
	}
	var created sandboxInfo
	if _, err := e.srv.api(ctx, http.MethodPost, "/v2/sandboxes", body, &created); err != nil {
		return nil, created, err
	}
	sb, err := e.client.Connect(ctx, created.ID, 0)
	if err != nil {
		return nil, created, err
	}
	var info sandboxInfo
	if _, err := e.srv.api(ctx, http.MethodGet, "/sandboxes/"+created.ID, nil, &info); err != nil {
		return nil, created, err
	}
	if _, err := sb.Files.AsUser("root").Write(ctx, "/opt/ct/sc.py", []byte(scHelper)); err != nil {
		return nil, info, fmt.Errorf("write helper: %w", err)
	}
	return sb, info, nil
}

func newEnv(ctx context.Context, t *testing.T, srv *server, client *agentbox.Client, tier string) (*env, error) {
	e := &env{srv: srv, client: client, tier: tier, probe: randHex(6), canaryTok: randHex(12)}
	e.canary = filepath.Join(os.TempDir(), "ab-canary-"+e.probe)
	if err := os.WriteFile(e.canary, []byte(e.canaryTok), 0o600); err != nil {
		return nil, err
	}
	var err error
	if e.nb, _, err = e.create(ctx, nil); err != nil {
		return nil, fmt.Errorf("neighbour: %w", err)
	}
	e.nbMarker = randHex(8)
	if _, err := e.nb.Files.Write(ctx, "/home/user/marker", []byte(e.nbMarker)); err != nil {
		return nil, err
	}
	out, err := e.nb.Commands.Run(ctx, "hostname -I")
	if err != nil {
		return nil, err
	}
	e.nbIP = strings.Fields(out.Stdout)[0]
	if e.attacker, e.attackerI, err = e.create(ctx, attackerLimits); err != nil {
		return nil, fmt.Errorf("attacker: %w", err)
	}
	gw, err := e.attacker.Commands.Run(ctx, "ip route | awk '/default/ {print $3}'")
	if err != nil {
		return nil, err
	}
	shadow, _ := os.ReadFile("/etc/shadow")
	sum := sha256.Sum256(shadow)
	host, _ := os.Hostname()
	u, _ := url.Parse(srv.url)
	e.vars = map[string]string{
		"HOST_GW": strings.TrimSpace(gw.Stdout), "API_PORT": u.Port(), "NB_IP": e.nbIP, "NB_ID": e.nb.ID,
		"DATA_DIR": srv.dataDir, "CANARY": e.canary, "CANARY_TOKEN": e.canaryTok, "HOST_SHADOW_SHA": hex.EncodeToString(sum[:]),
		"HOST_HOSTNAME": host, "HOST_PORTS": strings.Join(hostListeners(), " "), "HOST_ADDRS": strings.Join(hostAddrs(), " "), "PROBE": e.probe,
		"INSTANCE": srv.instance,
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	e.ipForward = strings.TrimSpace(string(fwd))
	t.Logf("%s: attacker %s, neighbour %s (%s), host ports %s", tier, e.attacker.ID, e.nb.ID, e.nbIP, e.vars["HOST_PORTS"])
	return e, nil
}

func (e *env) close(ctx context.Context) {
	os.Remove(e.canary)
	for _, sb := range []*agentbox.Sandbox{e.attacker, e.nb} {
		if sb != nil {
			_ = e.client.Kill(ctx, sb.ID)
		}
	}
}

// run executes one attack and reports "contained" or why not.
func (e *env) run(ctx context.Context, t *testing.T, a attack) (string, string) {
	actx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	target, info := e.attacker, e.attackerI
	e.usedDisk = dirUsage(e.srv.dataDir)
	if a.fresh {
		sb, inf, err := e.create(actx, attackerLimits)
		if err != nil {
			return "error", "create: " + err.Error()
		}
		defer e.client.Kill(context.WithoutCancel(ctx), sb.ID)
		target, info = sb, inf
	}
	// The host's addresses and listeners as they are now: other software
	// (other tests, other servers) adds and removes them while the suite
	// runs, and an address that has left the host since is no longer the
	// host's (a connection to it is internet egress, which the policy may
	// allow). hostaddrs_test.go attacks addresses that come and go.
	e.vars["HOST_ADDRS"], e.vars["HOST_PORTS"] = strings.Join(hostAddrs(), " "), strings.Join(hostListeners(), " ")
	saved := e.attacker
	e.attacker = target
	defer func() { e.attacker = saved }()
	detail := ""
	if a.script != "" {
		user := a.user
		if user == "" {
			user = "root"
		}
		res, err := target.Commands.Run(actx, a.script, agentbox.WithUser(user), agentbox.WithEnvs(e.vars), agentbox.WithTimeout(80*time.Second))
		var exit *agentbox.CommandExitError
		switch {
		case errors.As(err, &exit) && a.sentry && e.tier == "gvisor":
			detail = "served inside gVisor's kernel, not the host's: " + strings.TrimSpace(exit.Stdout+" "+exit.Stderr)
		case errors.As(err, &exit):
			return e.escaped(a, strings.TrimSpace(exit.Stdout+" "+exit.Stderr+" "+exit.CommandResult.Error))
		case err != nil && a.fresh:
			// A killed sandbox (e.g. gVisor stopped on OOM) contained it too;
			// the host checks below decide.
			detail = "sandbox stopped: " + err.Error()
		case err != nil:
			return "error", err.Error()
		default:
			detail = strings.TrimSpace(res.Stdout + " " + res.Stderr)
		}
	}
	if a.audited != "" && e.tier == "container" {
		line, err := e.auditedRefusal(actx, target.ID, a.audited)
		if err != nil {
			return "error", err.Error()
		}
		detail += "; audit: " + line
	}
	if a.api != nil {
		if err := a.api(actx, e); err != nil {
			return e.escaped(a, err.Error())
		}
	}
	if a.host != nil {
		if err := a.host(e); err != nil {
			return e.escaped(a, "host check: "+err.Error())
		}
	}
	e.attackerI = info
	if err := e.checkWorld(actx, a.fresh); err != nil {
		return e.escaped(a, "after the attack: "+err.Error())
	}
	if detail == "" {
		detail = "refused"
	}
	return "contained", detail
}

// auditedRefusal waits for the sandbox's audit log to name the refused
// syscall (events are aggregated per second, so this takes about one).
func (e *env) auditedRefusal(ctx context.Context, id, syscall string) (string, error) {
	want := "syscall " + syscall + " refused by the sandbox's seccomp policy"
	var seen []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var out struct {
			Logs []struct {
				Line string `json:"line"`
			} `json:"logs"`
		}
		if _, err := e.srv.api(ctx, http.MethodGet, "/sandboxes/"+id+"/logs?kind=syscall", nil, &out); err != nil {
			return "", fmt.Errorf("audit log: %w", err)
		}
		seen = seen[:0]
		for _, l := range out.Logs {
			if strings.Contains(l.Line, want) {
				return l.Line, nil
			}
			seen = append(seen, l.Line)
		}
	}
	return "", fmt.Errorf("the audit log does not name the refused %s; syscall events: %q", syscall, seen)
}

// escaped reports an attack that got through: ESCAPED, or GAP when it is
// a known, documented gap of this tier.
func (e *env) escaped(a attack, detail string) (string, string) {
	if why, ok := a.gap[e.tier]; ok {
		return "GAP", why + "; observed: " + detail
	}
	return "ESCAPED", detail
}

// checkWorld verifies the host and the neighbour are untouched.
func (e *env) checkWorld(ctx context.Context, fresh bool) error {
	b, err := os.ReadFile(e.canary)
	if err != nil || string(b) != e.canaryTok {
		return fmt.Errorf("host canary changed or gone: %v", err)
	}
	for _, g := range []string{"/ab-probe-*", "/tmp/ab-probe-*", "/tmp/ab-slip-*", "/tmp/ab-tarslip-*", "/ab-tarslip-*"} {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			return fmt.Errorf("files appeared on the host: %v", m)
		}
	}
	start := time.Now()
	out, err := e.nb.Commands.Run(ctx, "cat /home/user/marker; echo; hostname")
	if err != nil {
		return fmt.Errorf("neighbour does not answer: %w", err)
	}
	if !strings.HasPrefix(out.Stdout, e.nbMarker) {
		return fmt.Errorf("neighbour's file changed: %q", out.Stdout)
	}
	if d := time.Since(start); d > 30*time.Second {
		return fmt.Errorf("neighbour's echo took %s", d)
	}
	if resp, err := http.Get(e.srv.url + "/health"); err != nil {
		return fmt.Errorf("server does not answer: %w", err)
	} else {
		resp.Body.Close()
	}
	return nil
}

// checkLimits reads the attacker's cgroup limits on the host.
func (e *env) checkLimits() error {
	if e.srv.instance == "" {
		return nil
	}
	// Cgroup directories are named by the sandbox's host key.
	id, err := bundle.HostKey(filepath.Join(e.srv.dataDir, "sandboxes"), e.attacker.ID)
	if err != nil {
		return fmt.Errorf("host key of %s: %w", e.attacker.ID, err)
	}
	for _, c := range []struct{ file, want string }{
		{"/sys/fs/cgroup/memory/" + e.srv.instance + "/" + id + "/memory.limit_in_bytes", strconv.Itoa(e.attackerI.MemoryMB << 20)},
		{"/sys/fs/cgroup/pids/" + e.srv.instance + "/" + id + "/pids.max", strconv.Itoa(e.attackerI.PIDs)},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			continue // cgroup v2 hosts: the v1 files do not exist
		}
		if got := strings.TrimSpace(string(b)); got != c.want {
			return fmt.Errorf("%s is %s, want %s", c.file, got, c.want)
		}
	}
	return nil
}

// dirUsage is the space allocated to files under dir on dir's own file
// system: what this server's sandboxes hold on the host, unlike the file
// system's free space, which other work on the host moves too.
func dirUsage(dir string) uint64 {
	var root unix.Stat_t
	if unix.Stat(dir, &root) != nil {
		return 0
	}
	var total uint64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // removed while walking
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir // a mount: counted by its own backing file
			}
			return nil
		}
		total += uint64(st.Blocks) * 512
		return nil
	})
	return total
}

// checkDisk fails if the server's data dir grew by more than the
// attacker's disk limit allows.
func (e *env) checkDisk() error {
	now := dirUsage(e.srv.dataDir)
	if now > e.usedDisk && now-e.usedDisk > 600<<20 {
		return fmt.Errorf("the server's data dir grew by %d MiB", (now-e.usedDisk)>>20)
	}
	return nil
}

func inotifyInit() (int, error) { return unix.InotifyInit1(unix.IN_CLOEXEC) }

// hostListeners lists TCP ports listening on the host (from /proc/net/tcp).
func hostListeners() []string {
	seen := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 4 || fl[3] != "0A" {
				continue
			}
			_, port, ok := strings.Cut(fl[1], ":")
			if !ok {
				continue
			}
			if n, err := strconv.ParseUint(port, 16, 16); err == nil {
				seen[strconv.FormatUint(n, 10)] = true
			}
		}
		fh.Close()
	}
	var out []string
	for p := range seen {
		out = append(out, p)
	}
	sort.Strings(out)
	if len(out) > 40 {
		out = out[:40]
	}
	return out
}

// hostAddrs lists the host's IPv4 addresses outside loopback.
func hostAddrs() []string {
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
			out = append(out, ip.IP.String())
		}
	}
	return out
}

// ---- API-level attacks ----

// otherToken calls the neighbour's envd through the gateway with the
// attacker's access token.
func otherToken(ctx context.Context, e *env) error {
	var info struct {
		Token string `json:"envdAccessToken"`
	}
	if _, err := e.srv.api(ctx, http.MethodGet, "/sandboxes/"+e.attacker.ID, nil, &info); err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.url+"/files?path=/home/user/marker&username=user", nil)
	req.Header.Set("E2b-Sandbox-Id", e.nb.ID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", info.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return fmt.Errorf("read the neighbour's file with the attacker's token: %d", resp.StatusCode)
	}
	return nil
}

// filesDotDot reads paths that climb out with .. through the files API.
func filesDotDot(ctx context.Context, e *env) error {
	host, _ := os.Hostname()
	for _, p := range []string{"/../../../../etc/hostname", "../../../../../etc/hostname", "/home/user/../../../../../../etc/hostname"} {
		b, err := e.attacker.Files.AsUser("root").Read(ctx, p)
		if err == nil && strings.TrimSpace(string(b)) == host {
			return fmt.Errorf("%s read the host's hostname", p)
		}
	}
	if b, err := e.attacker.Files.AsUser("root").Read(ctx, "/../.."+e.canary); err == nil && strings.Contains(string(b), e.canaryTok) {
		return errors.New("read the host canary through ..")
	}
	return nil
}

// filesSymlink makes symlinks to / and /proc/1/root and reads and writes
// through them with the files API.
func filesSymlink(ctx context.Context, e *env) error {
	if _, err := e.attacker.Commands.Run(ctx, "ln -sfn /proc/1/root /opt/ct/p1 && ln -sfn / /opt/ct/slash", agentbox.WithUser("root")); err != nil {
		return err
	}
	host, _ := os.Hostname()
	for _, p := range []string{"/opt/ct/p1/etc/hostname", "/opt/ct/slash/etc/hostname"} {
		b, err := e.attacker.Files.AsUser("root").Read(ctx, p)
		if err == nil && strings.TrimSpace(string(b)) == host {
			return fmt.Errorf("%s read the host's hostname", p)
		}
	}
	if b, err := e.attacker.Files.AsUser("root").Read(ctx, "/opt/ct/slash"+e.canary); err == nil && strings.Contains(string(b), e.canaryTok) {
		return errors.New("read the host canary through a symlink")
	}
	_, _ = e.attacker.Files.AsUser("root").Write(ctx, "/opt/ct/p1/tmp/ab-probe-"+e.probe, []byte("x"))
	return nil
}

// uploadSlip uploads a multipart file whose name climbs out with ../.
func uploadSlip(ctx context.Context, e *env) error {
	var info struct {
		Token string `json:"envdAccessToken"`
	}
	if _, err := e.srv.api(ctx, http.MethodGet, "/sandboxes/"+e.attacker.ID, nil, &info); err != nil {
		return err
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, name := range []string{"../../../../../../tmp/ab-slip-" + e.probe, "/../../tmp/ab-slip-" + e.probe} {
		w, _ := mw.CreateFormFile("file", name)
		w.Write([]byte("slip"))
	}
	mw.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.url+"/files?username=root", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("E2b-Sandbox-Id", e.attacker.ID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", info.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil // the host check decides
}

// hugeArgv starts a process with a 16 MiB command line; it must fail
// cleanly and leave the sandbox and the server working.
func hugeArgv(ctx context.Context, e *env) error {
	// Refused (E2BIG) or not, what matters is that envd, the gateway and
	// the server survive it: checkWorld runs next.
	_, _ = e.attacker.Commands.Run(ctx, "echo "+strings.Repeat("A", 16<<20), agentbox.WithTimeout(30*time.Second))
	return nil
}
