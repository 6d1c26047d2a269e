package interpreter

import (
	"bytes"
	"context"
	"encoding/base64"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/internal/envd"
)

func TestProtocolErrors(t *testing.T) {
	_, hs := newTestServer(t)
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		want   string
	}{
		{"unknown language", "POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, "available languages are python, javascript, typescript, r, java, bash"},
		{"context and language", "POST", "/execute", map[string]any{"code": "1", "language": "python", "context_id": "x"}, 400, "Only one of context_id or language"},
		{"unknown context", "POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, 404, "Context nope not found"},
		{"no code", "POST", "/execute", map[string]any{"language": "python"}, 400, "code is required"},
		{"bad json", "POST", "/execute", "{", 400, "invalid request body"},
		{"bad env name", "POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]string{"A=B": "x"}}, 400, "invalid variable name"},
		{"create unknown language", "POST", "/contexts", map[string]any{"language": "fortran"}, 400, "available languages"},
		{"create missing cwd", "POST", "/contexts", map[string]any{"language": "bash", "cwd": "/does/not/exist"}, 400, "not a directory"},
		{"restart unknown", "POST", "/contexts/nope/restart", nil, 404, "Context nope not found"},
		{"remove unknown", "DELETE", "/contexts/nope", nil, 404, "Context nope not found"},
		{"health", "GET", "/health", nil, 200, `"OK"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := call(t, hs, tt.method, tt.path, tt.body, nil)
			if code != tt.status || !strings.Contains(msg, tt.want) {
				t.Errorf("got %d %q, want %d containing %q", code, msg, tt.status, tt.want)
			}
		})
	}
}

func TestPython(t *testing.T) {
	requirePython(t)
	_, hs := newTestServer(t, "python")
	py := func(code string) *execution { return run(t, hs, map[string]any{"code": code}) }

	t.Run("state and streams", func(t *testing.T) {
		py("x = 20")
		e := py("import sys\nprint('out'); sys.stderr.write('err\\n'); sys.stderr.flush()\nx += 1; x * 2")
		if e.stdout() != "out\n" || e.stderr() != "err\n" || e.mainText() != "42" || !e.Ended {
			t.Fatalf("got stdout %q stderr %q text %q ended %v", e.stdout(), e.stderr(), e.mainText(), e.Ended)
		}
		if e.Count < 2 || e.Lines[0]["type"] != "number_of_executions" {
			t.Errorf("execution count %d, first line %v", e.Count, e.Lines[0])
		}
		if got := py("'quoted'").mainText(); got != "quoted" {
			t.Errorf("string result %q, want quotes stripped", got)
		}
	})
	t.Run("streaming order", func(t *testing.T) {
		e := py("import sys, time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\nprint('e', file=sys.stderr)")
		if got := e.stdout(); got != "0\n1\n2\n" {
			t.Errorf("stdout %q", got)
		}
		if len(e.Stdout) < 3 {
			t.Errorf("stdout arrived in %d chunks, want one per flushed line", len(e.Stdout))
		}
	})
	t.Run("exception", func(t *testing.T) {
		e := py("def f():\n    return 1/0\nf()")
		if len(e.Errors) != 1 {
			t.Fatalf("errors %v", e.Errors)
		}
		er := e.Errors[0]
		tb, _ := er["traceback"].(string)
		if er["name"] != "ZeroDivisionError" || er["value"] != "division by zero" || !strings.Contains(tb, "in f") || strings.Contains(tb, "\x1b[") {
			t.Errorf("error %v", er)
		}
	})
	t.Run("no aborts after errors", func(t *testing.T) {
		for i := range 20 {
			py("1/0")
			if e := py("40 + 2"); e.mainText() != "42" {
				t.Fatalf("run %d after an error: %q %v", i, e.mainText(), e.Errors)
			}
		}
	})
	t.Run("matplotlib png and chart", func(t *testing.T) {
		e := py(`import matplotlib.pyplot as plt
plt.figure()
plt.bar(['A', 'B', 'C'], [1, 2, 3], label='Sales')
plt.title('T'); plt.xlabel('Who'); plt.ylabel('Amount (USD)')
plt.show()`)
		if len(e.Results) != 1 {
			t.Fatalf("results %d, errors %v", len(e.Results), e.Errors)
		}
		r := e.Results[0]
		raw, err := base64.StdEncoding.DecodeString(r["png"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(raw)); err != nil {
			t.Fatalf("png: %v", err)
		}
		chart := r["chart"].(map[string]any)
		if chart["type"] != "bar" || chart["title"] != "T" || chart["y_unit"] != "USD" || chart["x_unit"] != nil {
			t.Errorf("chart %v", chart)
		}
		els := chart["elements"].([]any)
		if len(els) != 3 || els[2].(map[string]any)["label"] != "C" || els[2].(map[string]any)["value"] != 3.0 || els[0].(map[string]any)["group"] != "Sales" {
			t.Errorf("bars %v", els)
		}
	})
	t.Run("chart kinds", func(t *testing.T) {
		for code, want := range map[string]string{
			"plt.figure(); plt.plot([1, 2, 3], [4, 5, 6], label='l'); plt.show()":            "line",
			"plt.figure(); plt.scatter([1, 2], [3, 4]); plt.show()":                          "scatter",
			"plt.figure(); plt.pie([1, 2, 3], labels=['a', 'b', 'c']); plt.show()":           "pie",
			"fig, ax = plt.subplots(1, 2); ax[0].plot([1]); ax[1].bar([1], [2]); plt.show()": "superchart",
		} {
			e := py("import matplotlib.pyplot as plt\n" + code)
			if len(e.Results) == 0 {
				t.Errorf("%s: no result (errors %v)", want, e.Errors)
				continue
			}
			chart, _ := e.Results[0]["chart"].(map[string]any)
			if chart["type"] != want {
				t.Errorf("%s: chart %v", want, chart)
			}
		}
		e := py("import matplotlib.pyplot as plt, datetime\nplt.figure(); plt.plot([datetime.date(2023, 9, 1), datetime.date(2023, 9, 2)], [1, 2]); plt.xlabel('Time (s)'); plt.show()")
		chart := e.Results[0]["chart"].(map[string]any)
		line := chart["elements"].([]any)[0].(map[string]any)
		pts := line["points"].([]any)
		// Dates as E2B reports them (isoformat of the plotted values), an
		// unlabelled line named like E2B names it.
		if chart["x_scale"] != "datetime" || chart["x_unit"] != "s" || pts[0].([]any)[0] != "2023-09-01" || line["label"] != "Line 0" {
			t.Errorf("datetime line chart %v", chart)
		}
	})
	t.Run("chart numbers are floats, rounded like E2B's", func(t *testing.T) {
		// Integers plotted come back as 1.0, not 1: E2B's Python SDK users
		// get floats, and so must ours. Pie angles are rounded, so a third
		// of a circle is 120.0, not 119.99999999999999.
		e := py("import matplotlib.pyplot as plt\nplt.figure(); plt.scatter([1, 2], [3, 4]); plt.show()")
		if raw := strings.Join(e.Raw, "\n"); !strings.Contains(raw, `"points":[[1.0,3.0],[2.0,4.0]]`) {
			t.Errorf("scatter points not floats: %s", raw)
		}
		e = py("plt.figure(); plt.pie([1, 1, 1], labels=['a', 'b', 'c']); plt.show()")
		if raw := strings.Join(e.Raw, "\n"); !strings.Contains(raw, `"angle":120.0,`) {
			t.Errorf("pie angles not rounded floats: %s", raw)
		}
	})
	t.Run("box and whisker", func(t *testing.T) {
		for _, vert := range []string{"True", "False"} {
			e := py("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n" +
				"ax.boxplot([[85, 90, 78, 92, 88, 30], [95, 89, 76, 91, 84, 87]], labels=['A', 'B'], patch_artist=True, vert=" + vert + ")\n" +
				"ax.set_title('Scores'); plt.show()")
			if len(e.Results) == 0 {
				t.Fatalf("vert=%s: no result (errors %v)", vert, e.Errors)
			}
			chart := e.Results[0]["chart"].(map[string]any)
			if chart["type"] != "box_and_whisker" || chart["title"] != "Scores" {
				t.Fatalf("vert=%s: chart %v", vert, chart)
			}
			got := chart["elements"].([]any)[0].(map[string]any)
			want := map[string]any{"label": "A", "min": 78.0, "first_quartile": 79.75, "median": 86.5, "third_quartile": 89.5, "max": 92.0, "outliers": []any{30.0}}
			for k, v := range want {
				if !reflect.DeepEqual(got[k], v) {
					t.Errorf("vert=%s: %s = %v, want %v (element %v)", vert, k, got[k], v, got)
				}
			}
		}
	})
	t.Run("dicts and lists come as JSON", func(t *testing.T) {
		for code, want := range map[string]any{
			"{'a': 1, 2: [1.5, None]}":                            map[string]any{"a": 1.0, "2": []any{1.5, nil}},
			"import numpy as np\n[np.int64(3), np.array([1, 2])]": []any{3.0, []any{1.0, 2.0}},
		} {
			e := py(code)
			if len(e.Results) != 1 || !reflect.DeepEqual(e.Results[0]["json"], want) || e.Results[0]["text"] == nil {
				t.Errorf("%s: results %v errors %v, want json %v", code, e.Results, e.Errors, want)
			}
		}
		// No JSON form (a set inside): only text, no error.
		if e := py("[{1, 2}]"); len(e.Results) != 1 || e.Results[0]["json"] != nil || e.mainText() != "[{1, 2}]" {
			t.Errorf("unserializable: results %v errors %v", e.Results, e.Errors)
		}
	})
	t.Run("PIL save displays the image", func(t *testing.T) {
		dir := t.TempDir()
		e := py("from PIL import Image\nimg = Image.new('RGB', (4, 3), 'red')\nimg.save(" + strconv.Quote(dir+"/a.png") + ")\nimg.save(open(" + strconv.Quote(dir+"/b.png") + ", 'wb'), 'PNG')")
		// A file name shows the image (not as the main result); a file
		// object does not, as in E2B.
		if len(e.Results) != 1 || e.Results[0]["is_main_result"] == true || len(e.Errors) != 0 {
			t.Fatalf("results %v errors %v", e.Results, e.Errors)
		}
		raw, err := base64.StdEncoding.DecodeString(e.Results[0]["png"].(string))
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil || img.Bounds().Dx() != 4 {
			t.Fatalf("png %v: %v", img, err)
		}
		if _, err := os.Stat(dir + "/a.png"); err != nil {
			t.Errorf("the image was not saved: %v", err)
		}
		// show() displays through PIL's IPython viewer, never a desktop one.
		if e := py("img.show()"); len(e.Results) != 1 || e.Results[0]["png"] == nil || len(e.Errors) != 0 {
			t.Errorf("show: results %v errors %v", e.Results, e.Errors)
		}
	})
	t.Run("dataframe", func(t *testing.T) {
		e := py("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
		r := e.Results[0]
		if !strings.Contains(r["html"].(string), "<table") || r["text"] == "" {
			t.Errorf("dataframe result %v", r)
		}
		data := r["data"].(map[string]any)
		if len(data["a"].([]any)) != 2 {
			t.Errorf("data %v", data)
		}
	})
	t.Run("env vars per execution", func(t *testing.T) {
		e := run(t, hs, map[string]any{"code": "import os; print(os.environ['AB_TEST'], end='')", "env_vars": map[string]string{"AB_TEST": "it's \"quoted\"\n"}})
		if e.stdout() != "it's \"quoted\"\n" {
			t.Errorf("env var inside: %q (errors %v)", e.stdout(), e.Errors)
		}
		if got := py("import os; os.environ.get('AB_TEST', 'unset')").mainText(); got != "unset" {
			t.Errorf("env var after: %q", got)
		}
	})
	t.Run("timeout interrupts, state kept", func(t *testing.T) {
		py("kept = 7")
		start := time.Now()
		e := run(t, hs, map[string]any{"code": "import time\nwhile True: time.sleep(0.01)", "timeout": 1})
		if e.errName() != "KeyboardInterrupt" || time.Since(start) > 10*time.Second {
			t.Errorf("errors %v after %s", e.Errors, time.Since(start))
		}
		// At once: ipykernel must not abort the cell after an error.
		if e := py("kept"); e.mainText() != "7" {
			t.Errorf("after interrupt: %q %v", e.mainText(), e.Errors)
		}
	})
	t.Run("client disconnect interrupts", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		defer cancel()
		runCtx(ctx, t, hs, map[string]any{"code": "import time; time.sleep(300)"})
		e := py("1 + 1")
		if e.mainText() != "2" {
			t.Errorf("after disconnect: %q %v", e.mainText(), e.Errors)
		}
	})
	t.Run("flood is truncated", func(t *testing.T) {
		e := py("import sys\nfor _ in range(40):\n    sys.stdout.write('x' * 100000 + '\\n')\nprint('done')")
		total := len(e.stdout())
		if total > 1<<20 || !strings.Contains(e.stderr(), "output truncated") || !e.Ended {
			t.Errorf("stdout %d bytes, stderr %q", total, e.stderr())
		}
	})
}

func TestPythonContexts(t *testing.T) {
	requirePython(t)
	_, hs := newTestServer(t, "python")
	cwd := t.TempDir()
	id := createContext(t, hs, "python", cwd)
	in := func(code string) *execution { return run(t, hs, map[string]any{"code": code, "context_id": id}) }

	if got := in("import os; os.getcwd()").mainText(); got != cwd {
		t.Errorf("cwd %q, want %q", got, cwd)
	}
	in("y = 5")
	if got := run(t, hs, map[string]any{"code": "'y' in dir()"}).mainText(); got != "False" {
		t.Errorf("contexts share state: %q", got)
	}
	var list []struct{ ID, Language, Cwd string }
	call(t, hs, "GET", "/contexts", nil, &list)
	if len(list) != 2 || list[len(list)-1].ID != id || list[0].Language != "python" {
		t.Errorf("list %+v", list)
	}

	// Killed from inside: the running execution and the next one say so.
	e := in("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
	if e.errName() != "KernelDied" || !strings.Contains(e.Errors[0]["value"].(string), "/contexts/"+id+"/restart") {
		t.Errorf("kill: %v", e.Errors)
	}
	e = in("1")
	if e.errName() != "ContextDead" || !strings.Contains(e.Errors[0]["value"].(string), id) {
		t.Errorf("dead: %v", e.Errors)
	}
	if code, msg := call(t, hs, "POST", "/contexts/"+id+"/restart", nil, nil); code != 200 {
		t.Fatalf("restart: %d %s", code, msg)
	}
	e = in("y")
	if e.errName() != "NameError" {
		t.Errorf("state after restart: %v %q", e.Errors, e.mainText())
	}
	if got := in("2 * 21").mainText(); got != "42" {
		t.Errorf("after restart %q", got)
	}
	if code, _ := call(t, hs, "DELETE", "/contexts/"+id, nil, nil); code != 200 {
		t.Fatal("remove failed")
	}
	if code, _ := call(t, hs, "POST", "/contexts/"+id+"/restart", nil, nil); code != http.StatusNotFound {
		t.Error("removed context still restartable")
	}
}

func TestJavaScript(t *testing.T) {
	requireNode(t)
	_, hs := newTestServer(t, "javascript")
	js := func(code string) *execution { return run(t, hs, map[string]any{"code": code, "language": "js"}) }
	ts := func(code string) *execution { return run(t, hs, map[string]any{"code": code, "language": "ts"}) }

	tests := []struct {
		name, code     string
		text, out, err string
		typescript     bool
	}{
		{name: "let persists 1", code: "let a = 40"},
		{name: "let persists 2", code: "a + 2", text: "42"},
		{name: "console", code: "console.log('hi'); console.error('oops')", out: "hi\n"},
		{name: "string result", code: "'abc'", text: "abc"},
		{name: "top-level await", code: "const v = await Promise.resolve(6); v * 7", text: "42"},
		{name: "await binding persists", code: "v", text: "6"},
		{name: "esm import", code: "import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", out: "function\n"},
		{name: "import persists", code: "typeof readFileSync", text: "function"},
		{name: "default import", code: "import path from 'node:path'\npath.join('a', 'b')", text: "a/b"},
		{name: "throw", code: "function boom() { throw new TypeError('bad') }\nboom()", err: "TypeError"},
		{name: "syntax error", code: "let = ;", err: "SyntaxError"},
		{name: "async rejection", code: "await Promise.reject(new RangeError('nope'))", err: "RangeError"},
		{name: "ts types", code: "const n: number = 41; interface P { x: number }\nconst p: P = { x: n + 1 }; p.x", text: "42", typescript: true},
		{name: "ts import", code: "import * as os from 'os'\nconst t: string = typeof os.cpus; t", text: "function", typescript: true},
		{name: "ts syntax error", code: "const x: = 1", err: "SyntaxError", typescript: true},
		{name: "display", code: "display({'text/html': '<b>x</b>'}); 1", text: "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := js
			if tt.typescript {
				run = ts
			}
			e := run(tt.code)
			if e.mainText() != tt.text || e.errName() != tt.err || (tt.out != "" && e.stdout() != tt.out) {
				t.Errorf("text %q stdout %q stderr %q errors %v", e.mainText(), e.stdout(), e.stderr(), e.Errors)
			}
		})
	}
	t.Run("stderr", func(t *testing.T) {
		if e := js("console.error('oops')"); e.stderr() != "oops\n" {
			t.Errorf("stderr %q", e.stderr())
		}
	})
	t.Run("interrupt busy loop", func(t *testing.T) {
		js("let keep = 'yes'")
		e := run(t, hs, map[string]any{"code": "while (true) {}", "language": "js", "timeout": 1})
		if e.errName() != "Interrupted" {
			t.Errorf("errors %v", e.Errors)
		}
		if got := js("keep").mainText(); got != "yes" {
			t.Errorf("after interrupt %q", got)
		}
	})
	t.Run("interrupt await", func(t *testing.T) {
		e := run(t, hs, map[string]any{"code": "await new Promise(() => {})", "language": "js", "timeout": 1})
		if e.errName() != "Interrupted" {
			t.Errorf("errors %v", e.Errors)
		}
		if got := js("keep").mainText(); got != "yes" {
			t.Errorf("after interrupt %q", got)
		}
	})
	t.Run("env vars", func(t *testing.T) {
		e := run(t, hs, map[string]any{"code": "process.env.AB_X", "language": "js", "env_vars": map[string]string{"AB_X": "1"}})
		if e.mainText() != "1" {
			t.Errorf("inside %q %v", e.mainText(), e.Errors)
		}
		if got := js("process.env.AB_X || 'unset'").mainText(); got != "unset" {
			t.Errorf("after %q", got)
		}
	})
	t.Run("exit", func(t *testing.T) {
		e := js("process.exit(3)")
		if e.errName() != "KernelDied" || !strings.Contains(e.Errors[0]["value"].(string), "exit status 3") {
			t.Errorf("errors %v", e.Errors)
		}
	})
}

func TestBash(t *testing.T) {
	_, hs := newTestServer(t)
	sh := func(code string) *execution { return run(t, hs, map[string]any{"code": code, "language": "bash"}) }
	sh("x=21; cd /tmp")
	if e := sh("echo $((x * 2)); pwd; echo err >&2"); e.stdout() != "42\n/tmp\n" || e.stderr() != "err\n" {
		t.Errorf("stdout %q stderr %q", e.stdout(), e.stderr())
	}
	if e := sh("echo -n 'no newline ü'"); e.stdout() != "no newline ü" {
		t.Errorf("stdout %q", e.stdout())
	}
	if e := sh("false"); e.errName() != "ExitError" || e.Errors[0]["value"] != "exit status 1" {
		t.Errorf("false: %v", e.Errors)
	}
	if e := sh("echo 'hi!'; cat"); e.stdout() != "hi!\n" {
		t.Errorf("history expansion or stdin: %q", e.stdout())
	}
	e := run(t, hs, map[string]any{"code": "sleep 100", "language": "bash", "timeout": 1})
	if e.errName() != "ExitError" {
		t.Errorf("interrupt: %v", e.Errors)
	}
	e = run(t, hs, map[string]any{"code": "while true; do :; done", "language": "bash", "timeout": 1})
	if e.errName() != "ExitError" || sh("echo $x").stdout() != "21\n" {
		t.Errorf("interrupt builtin loop: %v", e.Errors)
	}
	e = run(t, hs, map[string]any{"code": "echo \"$AB_V\"", "language": "bash", "env_vars": map[string]string{"AB_V": "a 'b' $c"}})
	if e.stdout() != "a 'b' $c\n" || sh("echo ${AB_V:-unset}").stdout() != "unset\n" {
		t.Errorf("env vars: %q", e.stdout())
	}
	big := sh("head -c 3000000 /dev/zero | tr '\\0' y")
	if n := len(big.stdout()); n != 1<<20 || !strings.Contains(big.stderr(), "truncated") {
		t.Errorf("flood: %d bytes", n)
	}
	if e := sh("exit 3"); e.errName() != "KernelDied" {
		t.Errorf("exit: %v", e.Errors)
	}
}

func TestPrepareJS(t *testing.T) {
	tests := []struct {
		name, code string
		ts         bool
		want       []string // substrings of the output
		err        string
	}{
		{name: "plain js untouched", code: "{a: 1}", want: []string{"{a: 1}"}},
		{name: "named import", code: "import { a, b as c } from 'm'", want: []string{`var __abImport0 = await import("m"); var { a, b: c } = __abImport0;`}},
		{name: "default and namespace", code: "import d, * as ns from \"m\"", want: []string{`var d = __abImport0.default, ns = __abImport0;`}},
		{name: "bare import", code: "import 'side'", want: []string{`await import("side");`}},
		{name: "export const", code: "export const x = 1", want: []string{"const x = 1"}},
		{name: "ts strips types", code: "let n: number = 1\nn", ts: true, want: []string{"let n = 1;"}},
		{name: "ts keeps unused import", code: "import fs from 'fs'", ts: true, want: []string{`var fs = __abImport0.default;`}},
		{name: "ts error", code: "let x: = 1", ts: true, err: "Unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := prepareJS(tt.code, tt.ts)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("output %q lacks %q", got, w)
				}
			}
		})
	}
}

func TestEnvCode(t *testing.T) {
	env := map[string]string{"A": "x'y\"z\\", "B": "2"}
	base := map[string]string{"B": "orig"}
	for _, lang := range []string{"python", "javascript", "r", "java", "bash"} {
		set, reset := envSetCode(lang, env), envResetCode(lang, env, base)
		if set == "" || reset == "" || strings.Contains(set, "x'y\"z\\\"") {
			t.Errorf("%s: set %q reset %q", lang, set, reset)
		}
	}
	if got := envResetCode("bash", env, base); got != "export B='orig'\nunset A\n" {
		t.Errorf("bash reset %q", got)
	}
}

// TestRAndJava runs the R (IRkernel) and Java (jshell) kernels through the
// server: state across cells, the value of the last expression, errors in
// E2B's shape, printed output, per-execution env vars and interrupts.
func TestRAndJava(t *testing.T) {
	type check struct {
		code    string
		result  string // the last result's text, "" for none
		stdout  string
		errName string
		errIn   string   // in the error value
		chunks  []string // the stdout chunks as sent, when they matter
	}
	tests := []struct {
		language string
		require  func(*testing.T)
		checks   []check
		env      string // code printing AB_TEST ("env vars per execution")
		loop     string // code that runs until interrupted
		// the error of an interrupted cell
		interrupted string
	}{
		{"r", requireR, []check{
			// IRkernel shows values as display data: like E2B, they are
			// results but not the main result.
			{code: "x <- 1+1; x", result: "[1] 2"},
			{code: "x * 21", result: "[1] 42"},
			{code: "cat('hi\\n'); invisible(1)", stdout: "hi\n", chunks: []string{"hi\n"}},
			{code: "stop('boom')", errName: "ERROR", errIn: "boom"},
			{code: "x", result: "[1] 2"},
		}, "cat(Sys.getenv('AB_TEST'))", "repeat {}", "ExecutionAborted"},
		{"java", requireJava, []check{
			{code: "int x = 41; x + 1", result: "42"},
			{code: "x * 2", result: "82"},
			{code: "String s = \"a\"; s + \"b\"", result: "ab"},
			{code: "System.out.println(\"hi\");", stdout: "hi\n"},
			// E2B's Java kernel sends a println's text and its newline as
			// two chunks; E2B's suite checks the first is the bare text.
			{code: "System.out.println(\"Hello, World!\")", stdout: "Hello, World!\n", chunks: []string{"Hello, World!", "\n"}},
			{code: "for (int i = 0; i < 3; i++) System.out.print(i);", stdout: "012", chunks: []string{"0", "1", "2"}},
			// stdin carries the kernel's requests: code reading it sees EOF.
			{code: "System.in.read()", result: "-1"},
			{code: "1 / 0", errName: "EvalException", errIn: "/ by zero"},
			{code: "int z = (1 +", errName: "IncompleteSourceException", errIn: "Incomplete input"},
			{code: "int y = ;", errName: "CompilationException", errIn: "illegal start of expression"},
			{code: "undefinedThing + 1", errName: "CompilationException", errIn: "cannot find symbol"},
			{code: "x", result: "41"},
		}, "System.out.print(System.getProperty(\"AB_TEST\"));", "while (true) { }", "EvaluationInterruptedException"},
	}
	for _, tt := range tests {
		t.Run(tt.language, func(t *testing.T) {
			tt.require(t)
			_, hs := newTestServer(t)
			for _, c := range tt.checks {
				e := run(t, hs, map[string]any{"code": c.code, "language": tt.language})
				if e.lastText() != c.result || e.stdout() != c.stdout || e.errName() != c.errName || !e.Ended {
					t.Errorf("%q: result %q stdout %q errors %v (all results %v); want result %q stdout %q error %q", c.code, e.lastText(), e.stdout(), e.Errors, e.Results, c.result, c.stdout, c.errName)
					continue
				}
				if c.chunks != nil && !slices.Equal(e.Stdout, c.chunks) {
					t.Errorf("%q: stdout chunks %q, want %q", c.code, e.Stdout, c.chunks)
				}
				if c.errName != "" {
					if v, _ := e.Errors[0]["value"].(string); !strings.Contains(v, c.errIn) {
						t.Errorf("%q: error value %q, want it to contain %q", c.code, v, c.errIn)
					}
					if tb, _ := e.Errors[0]["traceback"].(string); tb == "" {
						t.Errorf("%q: error without traceback", c.code)
					}
				}
			}
			e := run(t, hs, map[string]any{"code": tt.env, "language": tt.language, "env_vars": map[string]string{"AB_TEST": "v \"1\""}})
			if e.stdout() != "v \"1\"" {
				t.Errorf("env var: stdout %q errors %v", e.stdout(), e.Errors)
			}
			e = run(t, hs, map[string]any{"code": tt.loop, "language": tt.language, "timeout": 2})
			if e.errName() != tt.interrupted {
				t.Errorf("interrupted loop: errors %v, want %s", e.Errors, tt.interrupted)
			}
			// The interrupt stopped the code, not the kernel: state is kept.
			if e := run(t, hs, map[string]any{"code": "x", "language": tt.language}); e.lastText() != tt.checks[len(tt.checks)-1].result {
				t.Errorf("after the interrupt: result %q errors %v", e.lastText(), e.Errors)
			}
		})
	}
}

// TestTokenRules attacks each route of the interpreter without the
// sandbox's token, with a wrong one and with two, in front of a real envd
// that holds the token: a wrong token is refused everywhere, code runs only
// with the right one, and only GET /health and the context routes (E2B's
// SDKs send no token there) are served without one. A new token from a
// later /init (a fork) must replace the old one at once.
func TestTokenRules(t *testing.T) {
	e := envd.NewServer(envd.Options{Logger: slog.New(slog.DiscardHandler), LocalInit: true})
	envdHS := httptest.NewServer(e.Handler())
	defer envdHS.Close()
	initEnvd := func(token, auth string) {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", envdHS.URL+"/init", strings.NewReader(`{"accessToken":"`+token+`"}`))
		if auth != "" {
			req.Header.Set("X-Access-Token", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("init: %v %v", err, resp)
		}
		resp.Body.Close()
	}
	initEnvd("good", "")
	s, hs := newTestServer(t)
	s.opts.EnvdURL = envdHS.URL
	hs.Config.Handler = s.Handler()
	call := func(method, path, body string, tokens ...string) int {
		req, _ := http.NewRequestWithContext(t.Context(), method, hs.URL+path, strings.NewReader(body))
		for _, tok := range tokens {
			req.Header.Add("X-Access-Token", tok)
		}
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK && path == "/execute" {
			readExecution(t, resp.Body)
		}
		return resp.StatusCode
	}
	routes := []struct{ method, path, body string }{
		{"POST", "/execute", `{"code":"true","language":"bash"}`},
		{"POST", "/contexts", `{"language":"bash"}`},
		{"GET", "/contexts", ""},
		{"POST", "/contexts/nope/restart", ""},
		{"DELETE", "/contexts/nope", ""},
		{"GET", "/nope", ""},
	}
	for _, rt := range routes {
		for _, bad := range [][]string{nil, {""}, {"bad"}, {"bad", "good"}, {"good", "good"}} {
			got := call(rt.method, rt.path, rt.body, bad...)
			if bad == nil && strings.HasPrefix(rt.path, "/contexts") {
				// E2B's context routes take no token (its SDKs send none).
				if got == http.StatusUnauthorized {
					t.Errorf("%s %s without a token: 401, want it served", rt.method, rt.path)
				}
				continue
			}
			if got != http.StatusUnauthorized {
				t.Errorf("%s %s with tokens %q: %d, want 401", rt.method, rt.path, bad, got)
			}
		}
		if got := call(rt.method, rt.path, rt.body, "good"); got == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", rt.method, rt.path)
		}
	}
	if got := call("GET", "/health", ""); got != http.StatusOK {
		t.Errorf("GET /health without a token: %d, want 200", got)
	}
	// A fork's envd gets its own token; the source's stops working.
	initEnvd("forked", "good")
	if got := call("GET", "/contexts", "", "good"); got != http.StatusUnauthorized {
		t.Errorf("old token after a new /init: %d, want 401", got)
	}
	if got := call("GET", "/contexts", "", "forked"); got != http.StatusOK {
		t.Errorf("new token: %d, want 200", got)
	}
}

// TestPythonFloodIsChunked checks that a print flood reaches the server in
// bounded messages (the start-up script's output bounding), so the server
// never holds one huge message.
func TestPythonFloodIsChunked(t *testing.T) {
	requirePython(t)
	s, hs := newTestServer(t, "python")
	s.opts.MaxOutputBytes = 64 << 20
	e := run(t, hs, map[string]any{"code": "import sys\nfor _ in range(20):\n    sys.stdout.write('x' * (1 << 20))"})
	biggest := 0
	for _, c := range e.Stdout {
		biggest = max(biggest, len(c))
	}
	if got := len(e.stdout()); got != 20<<20 || biggest > 2<<20 {
		t.Errorf("stdout %d bytes in %d chunks, biggest %d", got, len(e.Stdout), biggest)
	}
}

// TestCompileJavaKernel: the Java kernel is compiled once per version of its
// source and then reused, so a context does not pay for the compilation at
// every start.
func TestCompileJavaKernel(t *testing.T) {
	requireJava(t)
	files, err := writeAssets(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := javaConfig{Java: "java", Source: files.JavaKernel, ClassDir: files.JavaClasses}
	dir, err := compileJavaKernel(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir + "/JavaKernel.class")
	if err != nil {
		t.Fatal(err)
	}
	again, err := compileJavaKernel(t.Context(), cfg)
	if err != nil || again != dir {
		t.Fatalf("second compile: %q %v, want %q", again, err, dir)
	}
	if st2, _ := os.Stat(dir + "/JavaKernel.class"); !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("the kernel was compiled again")
	}
	// A new version of the source gets its own classes.
	if err := os.WriteFile(files.JavaKernel, append(javaKernelJava, "\n// v2\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if v2, err := compileJavaKernel(t.Context(), cfg); err != nil || v2 == dir {
		t.Errorf("changed source: %q %v, want a new dir", v2, err)
	}
}
