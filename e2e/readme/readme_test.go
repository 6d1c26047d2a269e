// Package readme_test runs the README's own flows, in the README's order,
// against a real `agentbox serve`: the JS SDK example and the CLI lines of
// "Quick start", the template build and the example of "Code interpreter",
// the MCP lines of "AI agents over MCP" and the login of "Dashboard". The
// commands are read from README.md at test time (fenced blocks and inline
// code under those headings), so the README and the test cannot drift: an
// edit that breaks a command breaks this test. First it pastes the examples
// the server prints when it is ready, which is what `make up` shows.
//
// The README is written for the server `make up` starts; the test runs it
// against the harness's server instead, with these substitutions and no
// others:
//
//   - http://127.0.0.1:3000 becomes the server's URL, and /var/lib/agentbox
//     its data dir (also exported as AGENTBOX_DATA_DIR, the CLI's default
//     data dir), so `$(sudo cat /var/lib/agentbox/apikey)` reads its key;
//   - bin/agentbox (and a bare `agentbox` in the MCP lines) is the binary
//     the harness built from this tree;
//   - `sudo ` is dropped: the test runs as root, and sudo would reset the
//     environment that names the data dir;
//   - `npm install PKG` checks that PKG is installed instead of fetching the
//     newest: the SDKs come pinned from e2e/js (e2b) and e2e/interpreter
//     (@e2b/code-interpreter), linked as ./node_modules of the working dir;
//   - `<id>` in the CLI lines is the ID `create` printed, and ./local.txt is
//     a file the test writes first (the user's own file);
//   - the MCP client lines (`claude mcp add ...`) are not run (no Claude
//     here): the URL, header and environment they give are used as a client
//     would, over HTTP and over stdio.
//
// The server serves from the shared template cache (/var/cache/agentbox/
// templates, or $AGENTBOX_TEMPLATE_DIR) as e2e/interpreter does, so the
// README's `template build code-interpreter-v1` finds that package's build
// instead of building it a second time.
package readme_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

func TestREADME(t *testing.T) {
	s := harness.Start(t)
	root := s.Root
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := parseMarkdown(string(md))
	r := &runner{s: s}

	quick := doc.section(t, "Quick start")
	if len(quick.blocks) < 2 {
		t.Fatalf("README Quick start: want the JS SDK block and the CLI block, found %d fenced blocks", len(quick.blocks))
	}
	jsBlock, cliBlock := quick.blocks[0], quick.blocks[1]
	// The user's shell after the JS block: its exports hold for the rest.
	var exports []string
	for _, l := range strings.Split(r.adapt(jsBlock), "\n") {
		if strings.HasPrefix(l, "export ") {
			exports = append(exports, l)
		}
	}
	if len(exports) == 0 {
		t.Fatal("README Quick start: the JS block exports no variables")
	}
	prelude := strings.Join(exports, "\n") + "\n"

	// What `make up` prints at start (scripts/up.sh execs serve), pasted
	// as it is: the harness's server printed it into its log.
	t.Run("Banner", func(t *testing.T) {
		logText, err := os.ReadFile(s.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		export := bannerLine(t, string(logText), "  export E2B_API_URL=")
		node := bannerLine(t, string(logText), "  node -e ")
		cli := strings.TrimPrefix(bannerLine(t, string(logText), "Or the CLI:  "), "Or the CLI:")
		if !strings.Contains(export, "E2B_API_KEY="+s.APIKey) || !strings.Contains(export, "E2B_API_URL="+s.URL+" ") {
			t.Errorf("banner export line %q: want the server's URL %s and key", export, s.URL)
		}
		dir := nodeDir(t, filepath.Join(root, "e2e", "js"))
		out := r.bash(t, dir, 10*time.Minute, export+"\n"+node)
		host, _ := os.Hostname()
		if got := strings.TrimSpace(out); !strings.HasPrefix(got, "hello from ") || got == "hello from "+host {
			t.Errorf("banner's SDK example printed %q, want hello from the sandbox's hostname", out)
		}
		if out := r.bash(t, t.TempDir(), 5*time.Minute, export+"\n"+cli); !strings.Contains(out, "1") {
			t.Errorf("banner's CLI example printed %q, want 1", out)
		}
	})

	t.Run("JSSDK", func(t *testing.T) {
		dir := nodeDir(t, filepath.Join(root, "e2e", "js"))
		out := r.bash(t, dir, 10*time.Minute, r.adapt(jsBlock))
		for _, want := range []string{"Linux", "hi"} {
			if !strings.Contains(out, want) {
				t.Errorf("JS example printed %q, want %q in it", out, want)
			}
		}
	})

	t.Run("CLI", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "local.txt"), []byte("from the host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		id := ""
		for _, line := range codeLines(cliBlock) {
			if strings.Contains(line, "<id>") {
				if id == "" {
					t.Fatalf("README CLI line %q uses <id> before a create printed one", line)
				}
				line = strings.ReplaceAll(line, "<id>", id)
			}
			out := r.bash(t, dir, 5*time.Minute, prelude+r.adapt(line))
			switch {
			case regexp.MustCompile(`\bcreate\b`).MatchString(line):
				id = strings.TrimSpace(out)
				if id == "" || strings.ContainsAny(id, " \n") {
					t.Fatalf("create printed %q, want one sandbox ID", out)
				}
			case strings.Contains(line, " exec "):
				if !strings.Contains(out, "42") {
					t.Errorf("%s printed %q, want 42", line, out)
				}
			case strings.HasSuffix(strings.TrimSpace(line), " ls"):
				if !strings.Contains(out, id) {
					t.Errorf("ls printed %q, want %s in it", out, id)
				}
			}
		}
		if id == "" {
			t.Fatal("README CLI block has no create line")
		}
	})

	ci := doc.section(t, "Code interpreter")
	t.Run("TemplateBuild", func(t *testing.T) {
		build := ci.inlineWith(t, "template build code-interpreter-v1")
		out := r.bash(t, t.TempDir(), 40*time.Minute, r.adapt(build))
		t.Logf("%s: %s", build, lastLine(out))
		// The build must land in the store the server reads, not in the
		// CLI's own idea of one (<data-dir>/templates, which serve was not
		// told to use).
		if _, err := os.Stat(filepath.Join(s.DataDir, "templates")); err == nil && s.TemplateDir != filepath.Join(s.DataDir, "templates") {
			t.Errorf("%s built into %s/templates; the server serves %s", build, s.DataDir, s.TemplateDir)
		}
	})
	t.Run("CodeInterpreter", func(t *testing.T) {
		if len(ci.blocks) == 0 {
			t.Fatal("README Code interpreter: no fenced block")
		}
		dir := nodeDir(t, filepath.Join(root, "e2e", "interpreter"))
		out := r.bash(t, dir, 10*time.Minute, prelude+r.adapt(ci.blocks[0]))
		if !regexp.MustCompile(`(?m)^6$`).MatchString(out) {
			t.Errorf("code interpreter example printed %q, want a line 6 (df.x.sum())", out)
		}
	})

	mcp := doc.section(t, "AI agents over MCP")
	t.Run("MCPHTTP", func(t *testing.T) {
		line := mcp.inlineWith(t, "--transport http")
		m := regexp.MustCompile(`(http://\S+/mcp) --header "([^:]+): \$E2B_API_KEY"`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("README MCP line %q: want a URL and a --header NAME: $E2B_API_KEY", line)
		}
		url, header := r.adapt(m[1]), m[2]
		st, body := mcpInitialize(t, url, header, s.APIKey)
		if st != http.StatusOK || !strings.Contains(body, "protocolVersion") {
			t.Errorf("MCP initialize at %s with %s: %d %s", url, header, st, body)
		}
		if st, body := mcpInitialize(t, url, "", ""); st != http.StatusUnauthorized {
			t.Errorf("MCP initialize without a key: %d %s, want 401", st, body)
		}
	})
	t.Run("MCPStdio", func(t *testing.T) {
		line := mcp.inlineWith(t, "-- agentbox mcp")
		env := r.env()
		for _, m := range regexp.MustCompile(`-e (\w+)=(\S+)`).FindAllStringSubmatch(line, -1) {
			env = append(env, m[1]+"="+strings.ReplaceAll(r.adapt(m[2]), "$E2B_API_KEY", s.APIKey))
		}
		mcpStdio(t, s.Bin, env)
	})

	dash := doc.section(t, "Dashboard")
	t.Run("Dashboard", func(t *testing.T) {
		m := regexp.MustCompile(`<(http://127\.0\.0\.1:3000/dashboard/)>`).FindStringSubmatch(dash.text)
		if m == nil {
			t.Fatal("README Dashboard: no <http://127.0.0.1:3000/dashboard/> link")
		}
		url := r.adapt(m[1])
		st, ctype, body := get(t, url, "")
		if st != http.StatusOK || !strings.HasPrefix(ctype, "text/html") {
			t.Errorf("GET %s: %d %s %.200s", url, st, ctype, body)
		}
		// The page's own API call at login: the key goes in a header.
		api := strings.TrimSuffix(url, "/") + "/api/config"
		if st, _, body := get(t, api, s.APIKey); st != http.StatusOK {
			t.Errorf("GET %s with the key: %d %s", api, st, body)
		}
		if st, _, body := get(t, api, ""); st != http.StatusUnauthorized {
			t.Errorf("GET %s without a key: %d %s, want 401", api, st, body)
		}
	})
}

type runner struct{ s *harness.Server }

var (
	npmInstall = regexp.MustCompile(`(?m)^npm install (\S+)\s*$`)
	sudoWord   = regexp.MustCompile(`\bsudo `)
	bareCLI    = regexp.MustCompile(`(^|[\s"(])(?:bin/)?agentbox\b`)
)

// adapt applies the substitutions of the package comment.
func (r *runner) adapt(code string) string {
	code = strings.ReplaceAll(code, "http://127.0.0.1:3000", r.s.URL)
	code = strings.ReplaceAll(code, "/var/lib/agentbox", r.s.DataDir)
	code = sudoWord.ReplaceAllString(code, "")
	code = npmInstall.ReplaceAllString(code, `test -d node_modules/$1 || { echo "$1 is not installed" >&2; exit 1; }`)
	code = bareCLI.ReplaceAllString(code, "${1}"+r.s.Bin)
	return code
}

// env is the environment of every command: the test's, without variables
// that would point the SDKs or the CLI elsewhere, plus the data dir.
func (r *runner) env() []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "E2B_") || strings.HasPrefix(kv, "AGENTBOX_")
	})
	return append(env, "AGENTBOX_DATA_DIR="+r.s.DataDir)
}

// bash runs script as the README's reader would paste it into a shell, and
// returns its stdout; it fails t on a non-zero exit.
func (r *runner) bash(t *testing.T, dir string, timeout time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = r.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("README command failed: %v\n--- script ---\n%s\n--- stdout ---\n%s\n--- stderr ---\n%s", err, script, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// nodeDir is a working dir whose node_modules is pkgDir's, installed.
func nodeDir(t *testing.T, pkgDir string) string {
	t.Helper()
	harness.NPMInstall(t, pkgDir)
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(pkgDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// codeLines are a block's command lines (no blanks, no comment lines).
func codeLines(block string) []string {
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

func mcpInitialize(t *testing.T, url, header, key string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readme-test","version":"1"}}}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if header != "" {
		req.Header.Set(header, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

// mcpStdio starts `agentbox mcp` as an MCP client would, initializes, and
// lists its tools.
func mcpStdio(t *testing.T, bin string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "mcp")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	for _, msg := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readme-test","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}`,
	} {
		if _, err := io.WriteString(stdin, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var resp struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &resp) != nil || resp.ID != 2 {
			continue
		}
		var res struct {
			IsError bool `json:"isError"`
		}
		if resp.Result == nil || json.Unmarshal(resp.Result, &res) != nil || res.IsError {
			t.Fatalf("agentbox mcp: list_sandboxes answered %s (error %s); stderr:\n%s", sc.Bytes(), resp.Error, stderr.String())
		}
		return
	}
	t.Fatalf("agentbox mcp ended without answering list_sandboxes: %v; stderr:\n%s", sc.Err(), stderr.String())
}

func get(t *testing.T, url, key string) (status int, contentType, body string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// bannerLine is the banner's line starting with prefix.
func bannerLine(t *testing.T, log, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	t.Fatalf("server log has no banner line starting %q", prefix)
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndex(s, "\n")+1:]
}

// markdown is README.md cut at its headings.
type markdown struct{ sections []section }

type section struct {
	heading string
	text    string   // the section's lines, headings below it excluded
	blocks  []string // its fenced code blocks, in order
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

func parseMarkdown(md string) markdown {
	var doc markdown
	cur := -1 // index of the current section
	var block []string
	inBlock := false
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			if inBlock && cur >= 0 {
				doc.sections[cur].blocks = append(doc.sections[cur].blocks, strings.Join(block, "\n"))
			}
			inBlock, block = !inBlock, nil
			continue
		case inBlock:
			block = append(block, line)
			continue
		case strings.HasPrefix(line, "#"):
			doc.sections = append(doc.sections, section{heading: strings.TrimSpace(strings.TrimLeft(line, "#"))})
			cur = len(doc.sections) - 1
			continue
		}
		if cur >= 0 {
			doc.sections[cur].text += line + "\n"
		}
	}
	return doc
}

// section is the section under the heading named name.
func (d markdown) section(t *testing.T, name string) section {
	t.Helper()
	for _, s := range d.sections {
		if s.heading == name {
			return s
		}
	}
	t.Fatalf("README has no heading %q", name)
	return section{}
}

// inlineWith is the section's first inline code span containing sub.
func (s section) inlineWith(t *testing.T, sub string) string {
	t.Helper()
	for _, m := range inlineCode.FindAllStringSubmatch(s.text, -1) {
		if strings.Contains(m[1], sub) {
			return m[1]
		}
	}
	t.Fatalf("README %q: no inline code with %q", s.heading, sub)
	return ""
}
