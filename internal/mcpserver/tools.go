package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentbox/agentbox/api/gen/rest"
	agentbox "github.com/agentbox/agentbox/sdk/go"
)

// Limits of what a tool keeps of a sandbox's answers: a tool result sits
// whole in the model's context, and the code in the sandbox decides how
// much it sends, so the server's memory must not follow it.
const (
	maxFileBytes   = 4 << 20  // read_file refuses bigger files with the reason
	maxOutputBytes = 1 << 20  // run_command keeps this much of stdout and of stderr
	maxCodeBytes   = 32 << 20 // run_code reads at most this much of the interpreter's answer
)

// tools holds the handlers; each acts through cfg.Client only.
type tools struct{ cfg Config }

func (t *tools) register(s *mcp.Server) {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Description: "Start a sandbox from a template and return its id. " +
		"Network: allowInternetAccess false denies all outbound traffic; denyOut lists CIDRs (0.0.0.0/0 for all) and allowOut " +
		"addresses, CIDRs or domains (*.example.com) reachable despite denyOut."}, bind(t.cfg.Request, t.createSandbox))
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Description: "List your team's sandboxes, running and paused.", Annotations: ro}, bind(t.cfg.Request, t.listSandboxes))
	mcp.AddTool(s, &mcp.Tool{Name: "kill_sandbox", Description: "Stop and delete a sandbox (also when paused)."}, bind(t.cfg.Request, t.killSandbox))
	mcp.AddTool(s, &mcp.Tool{Name: "pause_sandbox", Description: "Pause a running sandbox, keeping memory, processes and files until resume_sandbox."}, bind(t.cfg.Request, t.pauseSandbox))
	mcp.AddTool(s, &mcp.Tool{Name: "resume_sandbox", Description: "Resume a paused sandbox (a running one has its life extended)."}, bind(t.cfg.Request, t.resumeSandbox))
	mcp.AddTool(s, &mcp.Tool{Name: "run_command", Description: "Run a shell command (bash -l -c) in a sandbox and wait for it; " +
		"returns its exit code, stdout and stderr. A non-zero exit is a result, not a tool error."}, bind(t.cfg.Request, t.runCommand))
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run code in the sandbox's stateful code interpreter (Python, JavaScript, " +
		"TypeScript, bash); the sandbox must come from an interpreter template such as code-interpreter-v1."}, bind(t.cfg.Request, t.runCode))
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a file of a sandbox: UTF-8 text as is, anything else base64.", Annotations: ro}, bind(t.cfg.Request, t.readFile))
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Create or replace a file in a sandbox, creating parent directories. " +
		"A request carries at most 4 MiB: write bigger files in parts (e.g. base64 chunks appended with run_command)."}, bind(t.cfg.Request, t.writeFile))
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: "List a directory of a sandbox.", Annotations: ro}, bind(t.cfg.Request, t.listFiles))
	mcp.AddTool(s, &mcp.Tool{Name: "expose_port", Description: "Return the public URL of a port a sandbox listens on, " +
		"on its own origin <port>-<id>.<domain> (the host as the E2B SDKs' getHost gives it)."}, bind(t.cfg.Request, t.exposePort))
}

// bind runs h under a context that also ends with req, the HTTP request
// that carries the call: a client that goes away stops its tool call and
// the calls it makes, instead of leaving them to run for no one. nil: the
// session's context only (stdio).
func bind[In, Out any](req context.Context, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	if req == nil {
		return h
	}
	return func(ctx context.Context, r *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(req, cancel)()
		return h(ctx, r, in)
	}
}

// errInvalid marks a refused argument; the message says which and why.
var errInvalid = errors.New("invalid argument")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errInvalid)
}

func needID(id string) error {
	if id == "" {
		return invalid("sandboxId is required (create_sandbox or list_sandboxes gives one)")
	}
	return nil
}

// seconds turns a tool's whole-second timeout into a duration; 0 = default.
func seconds(name string, s int) (time.Duration, error) {
	if s < 0 {
		return 0, invalid("%s %d: want 0 (the default) or more seconds", name, s)
	}
	return time.Duration(s) * time.Second, nil
}

// sandbox attaches to id for a data-plane call. Connect resumes a paused
// sandbox and never shortens its life, like every SDK's connect.
func (t *tools) sandbox(ctx context.Context, id string) (*agentbox.Sandbox, error) {
	if err := needID(id); err != nil {
		return nil, err
	}
	return t.cfg.Client.Connect(ctx, id, 0)
}

type createIn struct {
	Template            string            `json:"template,omitempty" jsonschema:"template id or alias; default base"`
	TimeoutSeconds      int               `json:"timeoutSeconds,omitempty" jsonschema:"seconds until the sandbox is killed; default 300"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty" jsonschema:"false denies all outbound traffic not in allowOut; default true"`
	AllowOut            []string          `json:"allowOut,omitempty" jsonschema:"addresses, CIDRs or domains (*.example.com) reachable despite denyOut"`
	DenyOut             []string          `json:"denyOut,omitempty" jsonschema:"IPv4 addresses or CIDRs denied; 0.0.0.0/0 denies everything not in allowOut"`
	Envs                map[string]string `json:"envs,omitempty" jsonschema:"environment of every process in the sandbox"`
	Metadata            map[string]string `json:"metadata,omitempty" jsonschema:"pairs echoed by list_sandboxes"`
}

type sandboxOut struct {
	SandboxID  string `json:"sandboxId"`
	TemplateID string `json:"templateId,omitempty"`
	State      string `json:"state,omitempty"`
}

func (t *tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, sandboxOut, error) {
	d, err := seconds("timeoutSeconds", in.TimeoutSeconds)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	opts := agentbox.CreateOptions{Template: in.Template, Timeout: d, EnvVars: in.Envs, Metadata: in.Metadata,
		AllowInternetAccess: in.AllowInternetAccess}
	if len(in.AllowOut) > 0 || len(in.DenyOut) > 0 {
		opts.Network = &rest.SandboxNetworkConfig{AllowOut: in.AllowOut, DenyOut: in.DenyOut}
	}
	sbx, err := t.cfg.Client.Create(ctx, opts)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	return nil, sandboxOut{SandboxID: sbx.ID, TemplateID: sbx.TemplateID, State: "running"}, nil
}

type listIn struct {
	State string `json:"state,omitempty" jsonschema:"running or paused; default both"`
}

type listedSandbox struct {
	SandboxID  string            `json:"sandboxId"`
	TemplateID string            `json:"templateId"`
	Alias      string            `json:"alias,omitempty"`
	State      string            `json:"state"`
	StartedAt  string            `json:"startedAt"`
	EndAt      string            `json:"endAt"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

type listOut struct {
	Sandboxes []listedSandbox `json:"sandboxes"`
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, listOut, error) {
	var opts agentbox.ListOptions
	switch in.State {
	case "":
	case "running", "paused":
		opts.State = []string{in.State}
	default:
		return nil, listOut{}, invalid("state %q: want running, paused or nothing for both", in.State)
	}
	list, err := t.cfg.Client.List(ctx, opts)
	if err != nil {
		return nil, listOut{}, err
	}
	out := listOut{Sandboxes: []listedSandbox{}}
	for _, s := range list {
		out.Sandboxes = append(out.Sandboxes, listedSandbox{SandboxID: s.SandboxID, TemplateID: s.TemplateID, Alias: s.Alias,
			State: s.State, StartedAt: s.StartedAt.UTC().Format(time.RFC3339), EndAt: s.EndAt.UTC().Format(time.RFC3339), Metadata: s.Metadata})
	}
	return nil, out, nil
}

type idIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
}

func (t *tools) killSandbox(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, sandboxOut, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, sandboxOut{}, err
	}
	if err := t.cfg.Client.Kill(ctx, in.SandboxID); err != nil {
		return nil, sandboxOut{}, err
	}
	return nil, sandboxOut{SandboxID: in.SandboxID, State: "killed"}, nil
}

func (t *tools) pauseSandbox(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, sandboxOut, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, sandboxOut{}, err
	}
	if err := t.cfg.Client.Pause(ctx, in.SandboxID); err != nil {
		return nil, sandboxOut{}, err
	}
	return nil, sandboxOut{SandboxID: in.SandboxID, State: "paused"}, nil
}

type resumeIn struct {
	SandboxID      string `json:"sandboxId" jsonschema:"the sandbox's id"`
	TimeoutSeconds int    `json:"timeoutSeconds,omitempty" jsonschema:"keep it alive at least this long from now; default 300"`
}

func (t *tools) resumeSandbox(ctx context.Context, _ *mcp.CallToolRequest, in resumeIn) (*mcp.CallToolResult, sandboxOut, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, sandboxOut{}, err
	}
	d, err := seconds("timeoutSeconds", in.TimeoutSeconds)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	sbx, err := t.cfg.Client.Connect(ctx, in.SandboxID, d)
	if err != nil {
		return nil, sandboxOut{}, err
	}
	return nil, sandboxOut{SandboxID: sbx.ID, TemplateID: sbx.TemplateID, State: "running"}, nil
}

type commandIn struct {
	SandboxID      string            `json:"sandboxId" jsonschema:"the sandbox's id"`
	Cmd            string            `json:"cmd" jsonschema:"the command line, run with bash -l -c"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory; default the user's home"`
	Envs           map[string]string `json:"envs,omitempty" jsonschema:"extra environment variables"`
	User           string            `json:"user,omitempty" jsonschema:"user to run as, e.g. root; default the template's user"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty" jsonschema:"kill the command after this many seconds; default 60"`
}

type commandOut struct {
	ExitCode int    `json:"exitCode" jsonschema:"-1 when killed by a signal"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Error    string `json:"error,omitempty" jsonschema:"why the command could not run or was stopped"`
	// Truncated says output past the limit was dropped.
	Truncated bool `json:"truncated,omitempty" jsonschema:"stdout or stderr passed 1 MiB and was cut; redirect big output to a file and read parts of it"`
}

// defaultCommandTimeout stops a forgotten command (a server, a prompt
// waiting for input) from holding the tool call open forever.
const defaultCommandTimeout = 60 * time.Second

func (t *tools) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in commandIn) (*mcp.CallToolResult, commandOut, error) {
	if in.Cmd == "" {
		return nil, commandOut{}, invalid("cmd is required")
	}
	d, err := seconds("timeoutSeconds", in.TimeoutSeconds)
	if err != nil {
		return nil, commandOut{}, err
	}
	if d == 0 {
		d = defaultCommandTimeout
	}
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, commandOut{}, err
	}
	opts := []agentbox.CommandOption{agentbox.WithTimeout(d), agentbox.WithOutputLimit(maxOutputBytes)}
	if in.Cwd != "" {
		opts = append(opts, agentbox.WithCwd(in.Cwd))
	}
	if in.User != "" {
		opts = append(opts, agentbox.WithUser(in.User))
	}
	if len(in.Envs) > 0 {
		opts = append(opts, agentbox.WithEnvs(in.Envs))
	}
	res, err := sbx.Commands.Run(ctx, in.Cmd, opts...)
	var exit *agentbox.CommandExitError
	switch {
	case errors.As(err, &exit):
		res = &exit.CommandResult
	case errors.Is(err, agentbox.ErrTimeout):
		return nil, commandOut{}, fmt.Errorf("command did not finish within %s and was killed; give a longer timeoutSeconds or run it in the background (cmd &): %w", d, err)
	case err != nil:
		return nil, commandOut{}, err
	}
	return nil, commandOut{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Error: res.Error, Truncated: res.Truncated}, nil
}

type codeIn struct {
	SandboxID      string            `json:"sandboxId" jsonschema:"the sandbox's id"`
	Code           string            `json:"code" jsonschema:"the code to run"`
	Language       string            `json:"language,omitempty" jsonschema:"python (default), javascript, typescript or bash; not with contextId"`
	ContextID      string            `json:"contextId,omitempty" jsonschema:"a code context id, to share state with earlier runs in it"`
	Envs           map[string]string `json:"envs,omitempty" jsonschema:"environment variables for this run"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty" jsonschema:"interrupt the code after this many seconds; default none"`
}

type codeResult struct {
	IsMainResult bool     `json:"isMainResult" jsonschema:"the value of the last expression"`
	Formats      []string `json:"formats" jsonschema:"formats present, e.g. text, png, chart"`
	Text         string   `json:"text,omitempty"`
	HTML         string   `json:"html,omitempty"`
	Markdown     string   `json:"markdown,omitempty"`
	SVG          string   `json:"svg,omitempty"`
	PNG          string   `json:"png,omitempty" jsonschema:"base64"`
	JPEG         string   `json:"jpeg,omitempty" jsonschema:"base64"`
	LaTeX        string   `json:"latex,omitempty"`
	JSON         any      `json:"json,omitempty"`
	Data         any      `json:"data,omitempty" jsonschema:"a DataFrame as {column: [values]}"`
	Chart        any      `json:"chart,omitempty"`
}

type codeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type codeOut struct {
	Results []codeResult `json:"results"`
	Stdout  string       `json:"stdout"`
	Stderr  string       `json:"stderr"`
	Error   *codeError   `json:"error,omitempty" jsonschema:"what the code raised, if anything"`
	// Truncated says output past the limit was dropped.
	Truncated bool `json:"truncated,omitempty" jsonschema:"stdout or stderr passed 1 MiB and was cut; write big output to a file and read parts of it"`
}

// joinCapped joins chunks in one pass, keeping at most limit bytes (cut at
// a UTF-8 boundary): the sandbox chooses how many chunks it sends and how
// big, and repeated concatenation would cost time quadratic in them.
func joinCapped(chunks []string, limit int) (string, bool) {
	var b strings.Builder
	for _, c := range chunks {
		room := limit - b.Len()
		if len(c) > room {
			cut := room
			for cut > 0 && !utf8.RuneStart(c[cut]) {
				cut--
			}
			b.WriteString(c[:cut])
			return b.String(), true
		}
		b.WriteString(c)
	}
	return b.String(), false
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in codeIn) (*mcp.CallToolResult, codeOut, error) {
	if in.Code == "" {
		return nil, codeOut{}, invalid("code is required")
	}
	if in.Language != "" && in.ContextID != "" {
		return nil, codeOut{}, invalid("give language or contextId, not both: a context has its language")
	}
	d, err := seconds("timeoutSeconds", in.TimeoutSeconds)
	if err != nil {
		return nil, codeOut{}, err
	}
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, codeOut{}, err
	}
	ex, err := sbx.RunCode(ctx, in.Code, agentbox.RunCodeOptions{Language: in.Language, ContextID: in.ContextID, EnvVars: in.Envs, Timeout: d,
		MaxResponseBytes: maxCodeBytes})
	if errors.Is(err, agentbox.ErrUnavailable) {
		return nil, codeOut{}, fmt.Errorf("sandbox %s (template %s) runs no code interpreter; create the sandbox from an interpreter template such as code-interpreter-v1: %w",
			sbx.ID, sbx.TemplateID, err)
	}
	if err != nil {
		return nil, codeOut{}, err
	}
	out := codeOut{Results: []codeResult{}}
	for _, r := range ex.Results {
		out.Results = append(out.Results, codeResult{IsMainResult: r.IsMainResult, Formats: r.Formats(), Text: r.Text, HTML: r.HTML,
			Markdown: r.Markdown, SVG: r.SVG, PNG: r.PNG, JPEG: r.JPEG, LaTeX: r.LaTeX,
			JSON: raw(r.JSON), Data: raw(r.Data), Chart: raw(r.Chart)})
	}
	var cutOut, cutErr bool
	out.Stdout, cutOut = joinCapped(ex.Logs.Stdout, maxOutputBytes)
	out.Stderr, cutErr = joinCapped(ex.Logs.Stderr, maxOutputBytes)
	out.Truncated = cutOut || cutErr
	if ex.Error != nil {
		out.Error = &codeError{Name: ex.Error.Name, Value: ex.Error.Value, Traceback: ex.Error.Traceback}
	}
	return nil, out, nil
}

// raw decodes a JSON value for a result; nil when absent or unreadable.
func raw(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return v
}

type readIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path, or relative to the user's home"`
	User      string `json:"user,omitempty" jsonschema:"user to read as; default the template's user"`
}

type readOut struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf8 or base64"`
	Size     int    `json:"size" jsonschema:"bytes"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in readIn) (*mcp.CallToolResult, readOut, error) {
	if in.Path == "" {
		return nil, readOut{}, invalid("path is required")
	}
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, readOut{}, err
	}
	rc, err := sbx.Files.AsUser(in.User).ReadStream(ctx, in.Path)
	if err != nil {
		return nil, readOut{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxFileBytes+1))
	if err != nil {
		return nil, readOut{}, fmt.Errorf("read %s: %w", in.Path, err)
	}
	if len(b) > maxFileBytes {
		return nil, readOut{}, fmt.Errorf("%s is larger than %d MiB, too big for a tool result; read a part with run_command (e.g. head -c)", in.Path, maxFileBytes>>20)
	}
	out := readOut{Path: in.Path, Content: string(b), Encoding: "utf8", Size: len(b)}
	if !utf8.Valid(b) {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	return nil, out, nil
}

type writeIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path, or relative to the user's home"`
	Content   string `json:"content" jsonschema:"the new content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf8 (default) or base64"`
	User      string `json:"user,omitempty" jsonschema:"user to write as; default the template's user"`
}

type writeOut struct {
	Path string `json:"path" jsonschema:"absolute path written"`
	Size int    `json:"size" jsonschema:"bytes written"`
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, writeOut, error) {
	if in.Path == "" {
		return nil, writeOut{}, invalid("path is required")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, writeOut{}, invalid("content is not base64: %v", err)
		}
	default:
		return nil, writeOut{}, invalid("encoding %q: want utf8 or base64", in.Encoding)
	}
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, writeOut{}, err
	}
	info, err := sbx.Files.AsUser(in.User).Write(ctx, in.Path, data)
	if err != nil {
		return nil, writeOut{}, err
	}
	return nil, writeOut{Path: info.Path, Size: len(data)}, nil
}

type listFilesIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"directory, absolute or relative to the user's home"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend; default 1"`
	User      string `json:"user,omitempty" jsonschema:"user to list as; default the template's user"`
}

type fileEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type" jsonschema:"file, dir or symlink"`
	Size int64  `json:"size"`
}

type listFilesOut struct {
	Entries []fileEntry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listFilesIn) (*mcp.CallToolResult, listFilesOut, error) {
	if in.Path == "" {
		return nil, listFilesOut{}, invalid("path is required")
	}
	if in.Depth < 0 {
		return nil, listFilesOut{}, invalid("depth %d: want 1 or more", in.Depth)
	}
	depth := max(in.Depth, 1)
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, listFilesOut{}, err
	}
	entries, err := sbx.Files.AsUser(in.User).List(ctx, in.Path, depth)
	if err != nil {
		return nil, listFilesOut{}, err
	}
	out := listFilesOut{Entries: []fileEntry{}}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileEntry{Name: e.Name, Path: e.Path, Type: string(e.Type), Size: e.Size})
	}
	return nil, out, nil
}

type portIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Port      int    `json:"port" jsonschema:"the port the sandbox listens on"`
}

type portOut struct {
	URL  string `json:"url" jsonschema:"the port's own origin, http(s)://<port>-<id>.<domain>/, through the server's gateway"`
	Host string `json:"host" jsonschema:"<port>-<id>.<domain> (with the listener's port when not the scheme's default)"`
	// TrafficAccessToken is needed (header e2b-traffic-access-token) when
	// the sandbox was created with public traffic off.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty" jsonschema:"send as header e2b-traffic-access-token; set when the sandbox's ports are not public"`
}

func (t *tools) exposePort(ctx context.Context, _ *mcp.CallToolRequest, in portIn) (*mcp.CallToolResult, portOut, error) {
	if in.Port < 1 || in.Port > 65535 {
		return nil, portOut{}, invalid("port %d: want 1 to 65535", in.Port)
	}
	if in.Port == agentbox.EnvdPort {
		return nil, portOut{}, invalid("port %d is envd's, reached through the data plane, not exposed", in.Port)
	}
	// Connect checks the sandbox is the caller's and running, and gives its
	// traffic token.
	sbx, err := t.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, portOut{}, err
	}
	u, err := t.cfg.portURL(sbx.ID, in.Port)
	if err != nil {
		return nil, portOut{}, err
	}
	host, _ := url.Parse(u)
	return nil, portOut{URL: u, Host: host.Host, TrafficAccessToken: sbx.TrafficAccessToken}, nil
}
