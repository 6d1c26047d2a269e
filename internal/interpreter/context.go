package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Languages the interpreter runs, in the order error messages list them:
// the ones E2B's code interpreter runs, by the names it gives them.
var Languages = []string{"python", "javascript", "typescript", "r", "java", "bash"}

// normalizeLanguage maps the names clients use to a language, "" if unknown.
func normalizeLanguage(l string) string {
	switch strings.ToLower(strings.TrimSpace(l)) {
	case "", "python", "python3", "py":
		return "python"
	case "javascript", "js", "node", "nodejs":
		return "javascript"
	case "typescript", "ts":
		return "typescript"
	case "r":
		return "r"
	case "java", "jshell":
		return "java"
	case "bash", "sh", "shell":
		return "bash"
	}
	return ""
}

// codeContext is one stateful kernel session as clients see it: an id, a
// language and a working directory. Its kernel can die (then the context is
// dead until restarted) and be restarted (same id, fresh state).
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	start func(ctx context.Context) (kernel, error)
	env   map[string]string // the kernels' starting environment, for env var clean-up

	run sync.Mutex // one execution at a time

	mu       sync.Mutex
	ready    chan struct{} // closed once the current (re)start attempt ended
	k        kernel
	gen      int    // bumped by every restart and removal
	dead     string // why the kernel is gone, if it is
	removed  bool
	starting bool
}

func newCodeContext(language, cwd string, start func(context.Context) (kernel, error)) *codeContext {
	return &codeContext{ID: newID(), Language: language, Cwd: cwd, start: start, env: envMap(os.Environ()), ready: make(chan struct{})}
}

// boot starts the kernel; it returns when the attempt ended.
func (c *codeContext) boot(ctx context.Context) error {
	c.mu.Lock()
	gen := c.gen
	c.starting = true
	ready := c.ready
	c.mu.Unlock()
	k, err := c.start(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starting = false
	defer close(ready)
	if c.gen != gen || c.removed {
		// Restarted or removed while starting: this kernel is not wanted.
		if k != nil {
			go k.Close()
		}
		return nil
	}
	if err != nil {
		c.dead = "its kernel failed to start: " + err.Error()
		return err
	}
	c.k, c.dead = k, ""
	go c.watch(k)
	return nil
}

// watch marks the context dead when its kernel dies on its own.
func (c *codeContext) watch(k kernel) {
	<-k.Exited()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.k == k {
		c.k = nil
		c.dead = "its " + c.Language + " kernel died (" + k.ExitReason() + ")"
	}
}

// restart replaces the kernel with a fresh one; an execution in progress
// ends with a ContextRestarting error.
func (c *codeContext) restart(ctx context.Context) error {
	c.mu.Lock()
	if c.removed {
		c.mu.Unlock()
		return errContextGone
	}
	old := c.k
	c.k = nil
	c.gen++
	c.dead = ""
	c.ready = make(chan struct{})
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	// Wait for an execution that was running on the old kernel to finish
	// reporting, so it cannot run on the new one.
	c.run.Lock()
	defer c.run.Unlock()
	return c.boot(ctx)
}

var errContextGone = errors.New("context was removed")

// close removes the context for good.
func (c *codeContext) close() {
	c.mu.Lock()
	c.removed = true
	c.gen++
	old := c.k
	c.k = nil
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// waitReady waits for a kernel start in progress.
func (c *codeContext) waitReady(ctx context.Context) error {
	c.mu.Lock()
	ready := c.ready
	c.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *codeContext) restartHint() string {
	return fmt.Sprintf("restart it with POST /contexts/%s/restart (SDK: restartCodeContext(%q)) or run the code in another context", c.ID, c.ID)
}

// execute runs one request on the context. Errors of the code and of the
// kernel are reported to sink; the returned error is only for requests that
// never reached a kernel.
func (c *codeContext) execute(ctx context.Context, code string, env map[string]string, sink Sink) {
	var k kernel
	var gen int
	var dead string
	var removed bool
	for {
		if err := c.waitReady(ctx); err != nil {
			return
		}
		c.run.Lock()
		c.mu.Lock()
		k, gen, dead, removed = c.k, c.gen, c.dead, c.removed
		restarting := k == nil && dead == "" && !removed && !isClosed(c.ready)
		c.mu.Unlock()
		if !restarting {
			break
		}
		// The execution before this one restarted the kernel (its code
		// ignored an interrupt): wait for the new kernel, not fail.
		c.run.Unlock()
	}
	defer c.run.Unlock()
	switch {
	case removed:
		sink.Error("ContextNotFound", fmt.Sprintf("context %s was removed while the code waited to run", c.ID), "")
		return
	case k == nil:
		if dead == "" {
			dead = "its kernel is not running"
		}
		sink.Error("ContextDead", fmt.Sprintf("context %s (%s) is dead: %s; %s", c.ID, c.Language, dead, c.restartHint()), "")
		return
	}
	if len(env) > 0 {
		if err := k.Execute(context.WithoutCancel(ctx), envSetCode(c.Language, env), true, discard{}); err != nil {
			c.report(k, gen, err, sink)
			return
		}
		defer func() {
			// Clean up even when the client went away; skip a dead kernel.
			select {
			case <-k.Exited():
			default:
				_ = k.Execute(context.WithoutCancel(ctx), envResetCode(c.Language, env, c.env), true, discard{})
			}
		}()
	}
	if err := k.Execute(ctx, code, false, sink); err != nil {
		c.report(k, gen, err, sink)
	}
}

// report turns a kernel failure during an execution into an error event.
func (c *codeContext) report(k kernel, gen int, err error, sink Sink) {
	c.mu.Lock()
	restarted := c.gen != gen
	c.mu.Unlock()
	switch {
	case restarted:
		sink.Error("ContextRestarting", fmt.Sprintf("context %s was restarted while this code ran; its state is gone", c.ID), "")
	case errors.Is(err, errKernelDied):
		<-k.Exited()
		sink.Error("KernelDied", fmt.Sprintf("the %s kernel of context %s died while running this code (%s); its state is lost: %s",
			c.Language, c.ID, k.ExitReason(), c.restartHint()), "")
	case errors.Is(err, errInterruptIgnored):
		// The code ignored the interrupt: only a fresh kernel frees the
		// context for the next execution.
		sink.Error("KernelRestarted", fmt.Sprintf("the code did not stop within %s of being interrupted, so context %s was restarted; its state is gone",
			interruptGrace, c.ID), "")
		c.mu.Lock()
		if c.k == k {
			c.k = nil
			c.gen++
			c.ready = make(chan struct{})
		}
		c.mu.Unlock()
		k.Close()
		go func() { _ = c.boot(context.Background()) }()
	default:
		sink.Error("InterpreterError", err.Error(), "")
	}
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validEnv checks per-execution env var names (values may be anything).
func validEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !envName.MatchString(k) {
			return fmt.Errorf("env_vars: invalid variable name %q", k)
		}
	}
	return nil
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// envSetCode is code that sets env in the kernel's process environment.
// Values travel as JSON, never spliced into source text.
func envSetCode(language string, env map[string]string) string {
	payload := jsonString(jsonString(env)) // a string literal valid in Python and JavaScript
	switch language {
	case "python":
		return "__import__('os').environ.update(__import__('json').loads(" + payload + "))"
	case "javascript", "typescript":
		return "Object.assign(process.env, JSON.parse(" + payload + "))"
	case "r":
		return "do.call(Sys.setenv, as.list(jsonlite::fromJSON(" + payload + ")))"
	case "java":
		// A JVM cannot change its environment: like E2B, the variables
		// become system properties (System.getProperty).
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(env)) {
			fmt.Fprintf(&b, "System.setProperty(%s, %s);\n", jsonString(k), jsonString(env[k]))
		}
		return b.String()
	case "bash":
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(env)) {
			fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(env[k]))
		}
		return b.String()
	}
	return ""
}

// envResetCode restores the variables env touched to their values in base
// (the kernel's starting environment), or removes them.
func envResetCode(language string, env, base map[string]string) string {
	restore := map[string]string{}
	var unset []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if v, ok := base[k]; ok {
			restore[k] = v
		} else {
			unset = append(unset, k)
		}
	}
	if unset == nil {
		unset = []string{}
	}
	switch language {
	case "python":
		return "__import__('os').environ.update(__import__('json').loads(" + jsonString(jsonString(restore)) + "))\n" +
			"[__import__('os').environ.pop(k, None) for k in __import__('json').loads(" + jsonString(jsonString(unset)) + ")]"
	case "javascript", "typescript":
		return "Object.assign(process.env, JSON.parse(" + jsonString(jsonString(restore)) + ")); " +
			"for (const k of JSON.parse(" + jsonString(jsonString(unset)) + ")) delete process.env[k]"
	case "r":
		return "local({r <- jsonlite::fromJSON(" + jsonString(jsonString(restore)) + "); if (length(r)) do.call(Sys.setenv, as.list(r)); " +
			"u <- jsonlite::fromJSON(" + jsonString(jsonString(unset)) + "); if (length(u)) Sys.unsetenv(u)})"
	case "java":
		// Back to the kernel's start: the sandbox's env vars are system
		// properties there (startJava), the rest are cleared.
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(restore)) {
			fmt.Fprintf(&b, "System.setProperty(%s, %s);\n", jsonString(k), jsonString(restore[k]))
		}
		for _, k := range unset {
			fmt.Fprintf(&b, "System.clearProperty(%s);\n", jsonString(k))
		}
		return b.String()
	case "bash":
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(restore)) {
			fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(restore[k]))
		}
		for _, k := range unset {
			fmt.Fprintf(&b, "unset %s\n", k)
		}
		return b.String()
	}
	return ""
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
