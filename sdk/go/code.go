package agentbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// CodeInterpreterPort is where the code interpreter of interpreter
// templates (e.g. "code-interpreter-v1") listens inside the sandbox.
const CodeInterpreterPort = 49999

// RunCodeOptions configure one RunCode call. Zero fields mean: the default
// Python context, no extra env vars, no timeout beyond ctx.
type RunCodeOptions struct {
	// Language picks the language's default context: "python" (default),
	// "javascript"/"js", "typescript"/"ts", "r", "java" or "bash". Not with ContextID.
	Language string
	// ContextID runs the code in a context made by CreateCodeContext.
	ContextID string
	// EnvVars are set for this execution only.
	EnvVars map[string]string
	// Timeout interrupts the code after this long (the context survives);
	// RunCode then returns the execution with its interrupt error.
	Timeout time.Duration
	// MaxResponseBytes stops reading the interpreter's answer past this many
	// bytes: RunCode then returns what it got with an error naming the limit
	// (the interpreter truncates floods itself; this bounds the caller's
	// memory against one that does not). Zero: no limit.
	MaxResponseBytes int64
	// Callbacks see output as it streams, before RunCode returns.
	OnStdout func(OutputMessage)
	OnStderr func(OutputMessage)
	OnResult func(Result)
	OnError  func(ExecutionError)
}

// OutputMessage is one chunk of stdout or stderr.
type OutputMessage struct {
	Line      string
	Timestamp time.Time
	Error     bool // stderr
}

// Result is something the code displayed, or (IsMainResult) the value of
// its last expression, in every format the kernel produced.
type Result struct {
	IsMainResult bool            `json:"is_main_result"`
	Text         string          `json:"text,omitempty"`
	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"` // base64
	JPEG         string          `json:"jpeg,omitempty"`
	PDF          string          `json:"pdf,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JavaScript   string          `json:"javascript,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	// Data is a pandas DataFrame as {column: [values]}.
	Data json.RawMessage `json:"data,omitempty"`
	// Chart is the data of a matplotlib chart (type, title, elements...).
	Chart json.RawMessage `json:"chart,omitempty"`
	// Extra holds the other MIME types.
	Extra map[string]json.RawMessage `json:"extra,omitempty"`
}

// Formats lists the formats the result has, e.g. ["text", "png", "chart"].
func (r Result) Formats() []string {
	var out []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"text", r.Text != ""}, {"html", r.HTML != ""}, {"markdown", r.Markdown != ""}, {"svg", r.SVG != ""},
		{"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"pdf", r.PDF != ""}, {"latex", r.LaTeX != ""},
		{"javascript", r.JavaScript != ""}, {"json", len(r.JSON) > 0}, {"data", len(r.Data) > 0}, {"chart", len(r.Chart) > 0},
	} {
		if f.ok {
			out = append(out, f.name)
		}
	}
	for k := range r.Extra {
		out = append(out, k)
	}
	return out
}

// ExecutionError is an error the code raised (or the interpreter reported,
// e.g. KernelDied, ContextDead).
type ExecutionError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

func (e *ExecutionError) Error() string { return e.Name + ": " + e.Value }

// Logs are the execution's stdout and stderr chunks in arrival order.
type Logs struct {
	Stdout []string
	Stderr []string
}

// Execution is the outcome of RunCode.
type Execution struct {
	Results        []Result
	Logs           Logs
	Error          *ExecutionError // the first error, if any
	ExecutionCount int
}

// Text is the main result's text (the value of the last expression).
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeContext is a stateful kernel session: variables survive between
// executions in the same context.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CodeContextOptions describe a new context; zero fields mean python and
// the interpreter's working directory (/home/user).
type CodeContextOptions struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}

// codeClient is an HTTP client routed to the sandbox's code interpreter.
func (s *Sandbox) codeClient() *http.Client {
	base := s.client.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: &sandboxTransport{base: base, id: s.ID, port: CodeInterpreterPort, token: s.EnvdAccessToken}}
}

// RunCode runs code in a context of the sandbox's code interpreter (the
// sandbox must come from an interpreter template) and returns when it
// finished. Errors raised by the code are in Execution.Error; the returned
// error is for requests that failed. Cancelling ctx interrupts the code.
func (s *Sandbox) RunCode(ctx context.Context, code string, opts RunCodeOptions) (*Execution, error) {
	if opts.Language != "" && opts.ContextID != "" {
		return nil, fmt.Errorf("run code: give Language or ContextID, not both: %w", ErrInvalid)
	}
	body := map[string]any{"code": code}
	if opts.Language != "" {
		body["language"] = opts.Language
	}
	if opts.ContextID != "" {
		body["context_id"] = opts.ContextID
	}
	if len(opts.EnvVars) > 0 {
		body["env_vars"] = opts.EnvVars
	}
	if opts.Timeout > 0 {
		body["timeout"] = opts.Timeout.Seconds()
		// Leave the server time to interrupt and report.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout+30*time.Second)
		defer cancel()
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.client.sandboxURL+"/execute", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.codeClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("run code in sandbox %s: %w", s.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("run code in sandbox %s: %w", s.ID, decodeAPIError(resp))
	}
	var stream io.Reader = resp.Body
	if opts.MaxResponseBytes > 0 {
		stream = &cappedReader{r: resp.Body, left: opts.MaxResponseBytes}
	}
	exec, err := readExecution(stream, opts)
	if errors.Is(err, ErrResponseTooLarge) {
		return exec, fmt.Errorf("run code in sandbox %s: the interpreter's answer passed %d bytes: %w", s.ID, opts.MaxResponseBytes, err)
	}
	if err != nil {
		return exec, fmt.Errorf("run code in sandbox %s: %w", s.ID, err)
	}
	return exec, nil
}

// ErrResponseTooLarge is returned by RunCode when the interpreter's answer
// passes RunCodeOptions.MaxResponseBytes.
var ErrResponseTooLarge = errors.New("response too large")

// cappedReader fails with ErrResponseTooLarge past its budget.
type cappedReader struct {
	r    io.Reader
	left int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, ErrResponseTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// readExecution parses the NDJSON stream of /execute.
func readExecution(r io.Reader, opts RunCodeOptions) (*Execution, error) {
	exec := &Execution{}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return exec, err // a partial line is no message
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var m struct {
				Type           string    `json:"type"`
				Text           string    `json:"text"`
				Timestamp      time.Time `json:"timestamp"`
				ExecutionCount int       `json:"execution_count"`
				Name           string    `json:"name"`
				Value          string    `json:"value"`
				Traceback      string    `json:"traceback"`
			}
			if jerr := json.Unmarshal(line, &m); jerr != nil {
				return exec, fmt.Errorf("bad stream line %.80q: %w", line, jerr)
			}
			switch m.Type {
			case "number_of_executions":
				exec.ExecutionCount = m.ExecutionCount
			case "stdout", "stderr":
				msg := OutputMessage{Line: m.Text, Timestamp: m.Timestamp, Error: m.Type == "stderr"}
				if msg.Error {
					exec.Logs.Stderr = append(exec.Logs.Stderr, m.Text)
					if opts.OnStderr != nil {
						opts.OnStderr(msg)
					}
				} else {
					exec.Logs.Stdout = append(exec.Logs.Stdout, m.Text)
					if opts.OnStdout != nil {
						opts.OnStdout(msg)
					}
				}
			case "result":
				var res Result
				if jerr := json.Unmarshal(line, &res); jerr != nil {
					return exec, fmt.Errorf("bad result: %w", jerr)
				}
				exec.Results = append(exec.Results, res)
				if opts.OnResult != nil {
					opts.OnResult(res)
				}
			case "error":
				e := ExecutionError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}
				if exec.Error == nil {
					exec.Error = &e
				}
				if opts.OnError != nil {
					opts.OnError(e)
				}
			case "end_of_execution":
				return exec, nil
			}
		}
		if err == io.EOF {
			return exec, fmt.Errorf("stream ended before end_of_execution: %w", io.ErrUnexpectedEOF)
		}
	}
}

// CreateCodeContext starts a new context (a fresh kernel).
func (s *Sandbox) CreateCodeContext(ctx context.Context, opts CodeContextOptions) (*CodeContext, error) {
	var out CodeContext
	if err := s.codeCall(ctx, http.MethodPost, "/contexts", opts, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListCodeContexts lists the contexts, the default ones included.
func (s *Sandbox) ListCodeContexts(ctx context.Context) ([]CodeContext, error) {
	var out []CodeContext
	if err := s.codeCall(ctx, http.MethodGet, "/contexts", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RestartCodeContext replaces the context's kernel with a fresh one (same
// id, state gone); it revives a context whose kernel died.
func (s *Sandbox) RestartCodeContext(ctx context.Context, id string) error {
	return s.codeCall(ctx, http.MethodPost, "/contexts/"+id+"/restart", nil, nil)
}

// RemoveCodeContext stops the context's kernel and forgets the context.
func (s *Sandbox) RemoveCodeContext(ctx context.Context, id string) error {
	return s.codeCall(ctx, http.MethodDelete, "/contexts/"+id, nil, nil)
}

func (s *Sandbox) codeCall(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.client.sandboxURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.codeClient().Do(req)
	if err != nil {
		return fmt.Errorf("code interpreter %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("code interpreter %s %s: %w", method, strings.TrimPrefix(path, "/"), decodeAPIError(resp))
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("code interpreter %s %s: decode: %w", method, path, err)
	}
	return nil
}
