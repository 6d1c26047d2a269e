package templates

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// builtinTemplate builds a builtin with the CLI into the shared template
// cache (a no-op once it is there; cold over a cached base: browser ~35 s,
// desktop ~2.5 min, mostly the apt download)
// and hard-links the result, with its layers, into the server's template
// dir. It returns the template ID.
func (e *env) builtinTemplate(t *testing.T, name string) string {
	t.Helper()
	src := os.Getenv("AGENTBOX_TEMPLATE_DIR")
	if src == "" {
		src = "/var/cache/agentbox/templates"
	}
	out, err := exec.Command(e.bin, "template", "build", "--template-dir", src, name).CombinedOutput()
	if err != nil {
		t.Fatalf("template build %s: %v\n%s", name, err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	t.Logf("template build %s: %s", name, last)
	// The last line names the template: "built NAME:TAG (ID) in ..." or
	// "template NAME (ID) is cached ...". Older builds of the name may sit
	// beside it.
	m := regexp.MustCompile(`\((t[0-9a-f]+)\)`).FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("no template ID in the build output: %s", last)
	}
	b, err := os.ReadFile(filepath.Join(src, m[1], "template.json"))
	var meta struct{ Layers []string }
	if err != nil || json.Unmarshal(b, &meta) != nil {
		t.Fatalf("template %s: %v", m[1], err)
	}
	if len(meta.Layers) < 2 {
		t.Fatalf("%s is not layered over base: layers %v", name, meta.Layers)
	}
	os.MkdirAll(filepath.Join(e.tplDir, "layers"), 0o755)
	for _, l := range meta.Layers {
		from, to := filepath.Join(src, "layers", l), filepath.Join(e.tplDir, "layers", l)
		if len(l) != 64 {
			// A template's own rootfs: the base, linked by setup.
			if _, err := os.Stat(filepath.Join(e.tplDir, l)); err != nil {
				t.Fatalf("%s sits on template %s, which is not the linked base", name, l)
			}
			continue
		}
		if _, err := os.Stat(to); err == nil {
			continue
		}
		linkStoreDir(t, from, to)
	}
	linkStoreDir(t, filepath.Join(src, m[1]), filepath.Join(e.tplDir, m[1]))
	return m[1]
}

// port does a GET on a sandbox port through the gateway, routed by headers.
func (e *env) port(t *testing.T, id string, port, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.addr+path, nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *env) exec(t *testing.T, id string, args ...string) string {
	t.Helper()
	cmd := exec.Command(e.bin, append([]string{"exec", id, "--"}, args...)...)
	cmd.Env = append(os.Environ(), "AGENTBOX_API_URL=http://"+e.addr, "AGENTBOX_API_KEY="+e.key,
		"E2B_API_URL=http://"+e.addr, "E2B_SANDBOX_URL=http://"+e.addr, "E2B_API_KEY="+e.key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("exec %v: %v\n%s%s", args, err, out, stderr.Bytes())
	}
	return string(out)
}

func (e *env) create(t *testing.T, tpl string) string {
	t.Helper()
	var sb struct{ SandboxID string }
	start := time.Now()
	if code := e.api(t, "POST", "/sandboxes", map[string]any{"templateID": tpl, "timeout": 600}, &sb); code != 201 {
		t.Fatalf("create %s: %d", tpl, code)
	}
	t.Logf("create %s (ready check passed): %v", tpl, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { e.api(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil) })
	return sb.SandboxID
}

func TestBuiltinBrowser(t *testing.T) {
	e := setup(t)
	e.builtinTemplate(t, "browser")
	id := e.create(t, "browser")
	// The sandbox's lower layers include base's own rootfs: one copy of
	// the base files serves base, browser, desktop and interpreter alike.
	if lower, _ := overlayOf(t, e.dataDir, id); !strings.Contains(lower, filepath.Join(e.tplDir, baseID(t, e.tplDir), "rootfs")) {
		t.Errorf("browser sandbox does not sit on base's rootfs: lowerdir %s", lower)
	}
	code, body := e.port(t, id, "9222", "/json/version")
	var ver map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &ver) != nil {
		t.Fatalf("/json/version through the gateway: %d %s", code, body)
	}
	if !strings.Contains(ver["Browser"], "Chrome/") || !strings.HasPrefix(ver["webSocketDebuggerUrl"], "ws://") {
		t.Errorf("/json/version: %s", body)
	}
	if got := e.websocketFirstFrame(t, id, "9222", strings.TrimPrefix(ver["webSocketDebuggerUrl"], "ws://"+e.addr)); got != "" {
		t.Errorf("DevTools websocket sent %q before any command", got)
	}
	// Host routing: Chromium refuses such Host headers itself; the
	// template's proxy hands it "localhost" and puts the host back into the
	// websocket URL.
	host := "9222-" + id + ".agentbox.test"
	req, _ := http.NewRequest("GET", "http://"+e.addr+"/json/version", nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var hver map[string]string
	if resp.StatusCode != 200 || json.Unmarshal(hb, &hver) != nil || !strings.HasPrefix(hver["webSocketDebuggerUrl"], "ws://"+host+"/devtools/browser/") {
		t.Errorf("host-routed /json/version: %d %s", resp.StatusCode, hb)
	}
	// A page target can be listed: the browser is usable, not just listening.
	if code, body := e.port(t, id, "9222", "/json/list"); code != 200 || !strings.Contains(body, `"type": "page"`) {
		t.Errorf("/json/list: %d %s", code, body)
	}
}

func TestBuiltinDesktop(t *testing.T) {
	e := setup(t)
	e.builtinTemplate(t, "desktop")
	id := e.create(t, "desktop")
	// What @e2b/desktop runs in the sandbox, under the names it uses
	// (e2e/desktop drives the SDK itself).
	for _, c := range []string{"Xvfb", "xdpyinfo", "startxfce4", "xfwm4", "xfdesktop", "xdotool", "scrot", "xrandr",
		"x11vnc", "netstat", "xdg-open", "gtk-launch", "pgrep", "/opt/noVNC/utils/novnc_proxy"} {
		if out := e.exec(t, id, "sh", "-c", "command -v "+c+" || echo missing"); strings.Contains(out, "missing") {
			t.Errorf("%s is not in the desktop template", c)
		}
	}
	if !strings.Contains(e.exec(t, id, "cat", "/opt/noVNC/vnc.html"), "noVNC") {
		t.Error("/opt/noVNC/vnc.html is not noVNC's page")
	}
	// No display runs at start (the SDK starts its own on :0); started
	// the way README shows, it takes input and screenshots as the default
	// user, with the template's DISPLAY. (-noreset: with no client staying
	// connected, such as a window manager, Xvfb would reset, and centre
	// the pointer, whenever the last xdotool disconnects.)
	e.exec(t, id, "sh", "-c", "Xvfb :0 -screen 0 1280x800x24 -nolisten tcp -noreset >/dev/null 2>&1 & "+
		"for i in $(seq 100); do xdpyinfo >/dev/null 2>&1 && exit 0; sleep 0.1; done; exit 1")
	if g := strings.TrimSpace(e.exec(t, id, "xdotool", "getdisplaygeometry")); g != "1280 800" {
		t.Errorf("xdotool getdisplaygeometry = %q, want 1280 800", g)
	}
	if loc := e.exec(t, id, "sh", "-c", "xdotool mousemove --sync 321 123 && xdotool getmouselocation"); !strings.Contains(loc, "x:321 y:123") {
		t.Errorf("xdotool getmouselocation after mousemove: %q", loc)
	}
	shot := e.exec(t, id, "sh", "-c", "scrot --pointer /tmp/shot.png && base64 -w0 /tmp/shot.png")
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(shot))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil || cfg.Width != 1280 || cfg.Height != 800 {
		t.Errorf("screenshot: %d bytes, %v, %dx%d", len(b), err, cfg.Width, cfg.Height)
	}
}

// websocketFirstFrame opens a websocket to a sandbox port through the
// gateway (no client library: the handshake is a few lines) and returns the
// payload of the first frame the server sends, or "" if it sends none
// within a second.
func (e *env) websocketFirstFrame(t *testing.T, id, port, path string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nE2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: %s\r\n"+
		"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: binary\r\n\r\n", path, e.addr, id, port)
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("websocket %s on port %s: %v %v", path, port, err, resp)
	}
	c.SetDeadline(time.Now().Add(time.Second))
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return ""
	}
	n := int(hdr[1] & 0x7f) // server frames are unmasked; the greeting is short
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatalf("websocket frame: %v", err)
	}
	return string(payload)
}

// baseID is the ID of the base template setup linked into dir.
func baseID(t *testing.T, dir string) string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, ent := range entries {
		b, err := os.ReadFile(filepath.Join(dir, ent.Name(), "template.json"))
		var meta struct{ Aliases []string }
		if err == nil && json.Unmarshal(b, &meta) == nil && len(meta.Aliases) > 0 && meta.Aliases[0] == "base" {
			return ent.Name()
		}
	}
	t.Fatal("no base template")
	return ""
}
