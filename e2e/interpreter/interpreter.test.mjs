// End-to-end tests of the code interpreter with the official
// @e2b/code-interpreter SDK (2.8.0) against a real agentbox server whose
// template code-interpreter-v1 is built.
//
// Environment (set by interpreter_test.go, or by hand against any server):
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the server under test
//   E2E_CSV_MB                                  size of the generated CSV (default 1024)

import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const MIN = 60_000
const CSV_MB = Number(process.env.E2E_CSV_MB || 1024)
const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`set ${k} to the server under test`)
}

const isPNG = (b64) => Buffer.from(b64, 'base64').subarray(0, 8).equals(PNG_MAGIC)

// raw calls the interpreter without the SDK, to see status codes and bodies
// the SDK hides.
async function raw(sbx, path, body, token = sbx.envdAccessToken) {
  const res = await fetch(process.env.E2B_SANDBOX_URL + path, {
    method: body === undefined ? 'GET' : 'POST',
    headers: {
      'Content-Type': 'application/json',
      'E2b-Sandbox-Id': sbx.sandboxId,
      'E2b-Sandbox-Port': '49999',
      ...(token ? { 'X-Access-Token': token } : {}),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  return { status: res.status, text: await res.text() }
}

describe('code interpreter (@e2b/code-interpreter 2.8.0)', { timeout: 30 * MIN }, () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create({ timeoutMs: 20 * MIN })
  })

  it('serves context calls without the access token, as E2B does (the SDK sends none there), and refuses a wrong one', async () => {
    const ctxs = await sbx.listCodeContexts()
    assert.ok(Array.isArray(ctxs), 'listCodeContexts without a token')
    for (const [method, path] of [['GET', '/contexts'], ['POST', '/contexts'], ['POST', '/contexts/x/restart']]) {
      const res = await fetch(process.env.E2B_SANDBOX_URL + path, {
        method,
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json', 'X-Access-Token': 'wrong' },
        body: method === 'POST' ? '{}' : undefined,
      })
      assert.equal(res.status, 401, `${method} ${path} with a wrong token`)
    }
  })
  after(async () => {
    await sbx?.kill()
  })

  it('keeps state across calls; the first call waits for the kernel', async () => {
    await sbx.runCode('x = 1')
    const e = await sbx.runCode('x += 1; x')
    assert.equal(e.text, '2')
    assert.ok(e.executionCount >= 2)
  })

  it('streams stdout and stderr in order, with callbacks', async () => {
    const seen = []
    const t0 = Date.now()
    const e = await sbx.runCode(
      'import sys, time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\nprint("err", file=sys.stderr)',
      {
        onStdout: (m) => seen.push(['out', m.line, Date.now() - t0]),
        onStderr: (m) => seen.push(['err', m.line, Date.now() - t0]),
      },
    )
    assert.deepEqual(e.logs.stdout.join(''), '0\n1\n2\n')
    assert.deepEqual(e.logs.stderr, ['err\n'])
    assert.deepEqual(seen.map((s) => s[1]), ['0\n', '1\n', '2\n', 'err\n'])
    // Streamed as produced, not at the end.
    assert.ok(seen[2][2] - seen[0][2] >= 600, `arrivals ${seen.map((s) => s[2])}`)
  })

  it('reports an exception with name, value and traceback', async () => {
    const errors = []
    const e = await sbx.runCode('def f(d):\n    return d["missing"]\nf({})', { onError: (x) => errors.push(x) })
    assert.equal(e.error.name, 'KeyError')
    assert.equal(e.error.value, "'missing'")
    assert.match(e.error.traceback, /in f/)
    assert.doesNotMatch(e.error.traceback, /\x1b\[/) // no ANSI colours
    assert.equal(errors.length, 1)
  })

  it('returns a matplotlib chart as PNG with its data', async () => {
    const e = await sbx.runCode(`
import matplotlib.pyplot as plt
authors = ['Author A', 'Author B', 'Author C', 'Author D']
sales = [100, 200, 300, 400]
plt.figure(figsize=(10, 6))
plt.bar(authors, sales, label='Books Sold', color='blue')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.show()
`)
    assert.equal(e.error, undefined)
    const r = e.results[0]
    assert.ok(isPNG(r.png), 'valid PNG')
    assert.deepEqual(r.extra, {})
    const chart = r.chart
    assert.equal(chart.type, 'bar')
    assert.equal(chart.title, 'Book Sales by Authors')
    assert.equal(chart.x_label, 'Authors')
    assert.equal(chart.y_label, 'Number of Books Sold')
    assert.equal(chart.x_unit, null)
    assert.deepEqual(chart.elements.map((b) => b.value), [100, 200, 300, 400])
    assert.deepEqual(chart.elements.map((b) => b.label), ['Author A', 'Author B', 'Author C', 'Author D'])
    assert.deepEqual([...new Set(chart.elements.map((b) => b.group))], ['Books Sold'])
  })

  it('extracts line, scatter and pie chart data', async () => {
    const line = await sbx.runCode(`
import numpy as np, matplotlib.pyplot as plt, datetime
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(seconds=i) for i in range(100)]
x = np.linspace(0, 2*np.pi, 100)
plt.figure(); plt.plot(dates, np.sin(x), label='sin(x)'); plt.plot(dates, np.cos(x), label='cos(x)')
plt.xlabel("Time (s)"); plt.ylabel("Amplitude (Hz)"); plt.title('Plot of sin(x) and cos(x)')
plt.show()`)
    const lc = line.results[0].chart
    assert.equal(lc.type, 'line')
    assert.equal(lc.x_scale, 'datetime')
    assert.equal(lc.y_scale, 'linear')
    assert.equal(lc.x_unit, 's')
    assert.equal(lc.y_unit, 'Hz')
    assert.deepEqual(lc.elements.map((l) => l.label), ['sin(x)', 'cos(x)'])
    assert.equal(lc.elements[0].points.length, 100)
    assert.equal(new Date(lc.elements[0].points[0][0]).toISOString(), '2023-09-01T00:00:00.000Z')
    assert.ok(lc.y_tick_labels.every((l) => typeof l === 'string'))

    const sc = (await sbx.runCode("plt.figure(); plt.scatter([1, 2, 3], [4, 5, 6], label='pts'); plt.show()")).results[0].chart
    assert.equal(sc.type, 'scatter')
    assert.deepEqual(sc.elements[0].points, [[1, 4], [2, 5], [3, 6]])

    const pie = (await sbx.runCode("plt.figure(); plt.pie([1, 1, 2], labels=['a', 'b', 'c']); plt.title('P'); plt.show()")).results[0].chart
    assert.equal(pie.type, 'pie')
    assert.deepEqual(pie.elements.map((w) => [w.label, Math.round(w.angle)]), [['a', 90], ['b', 90], ['c', 180]])
  })

  it('reports charts in the shapes of E2B: floats, box plots, rounded angles', async () => {
    // JSON numbers keep their float type (a Python SDK sees 100.0, not 100):
    // check the wire, which the JS SDK's JSON.parse would hide.
    const wire = await raw(sbx, '/execute', {
      code: "import matplotlib.pyplot as plt\nplt.figure(); plt.bar(['a', 'b'], [100, 200]); plt.show()",
    })
    assert.match(wire.text, /"value":100\.0[,}]/)
    assert.match(wire.text, /"group":"Group 0"/)

    const box = (await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.boxplot([[85, 90, 78, 92, 88, 30], [95, 89, 76, 91, 84, 87]], labels=['A', 'B'], patch_artist=True)
ax.set_title('Exam Scores'); ax.set_xlabel('Class'); ax.set_ylabel('Score')
plt.show()`)).results[0].chart
    assert.equal(box.type, 'box_and_whisker')
    assert.equal(box.title, 'Exam Scores')
    assert.equal(box.x_label, 'Class')
    assert.deepEqual(box.elements[0], {
      label: 'A', min: 78, first_quartile: 79.75, median: 86.5, third_quartile: 89.5, max: 92, outliers: [30],
    })

    const pie = (await sbx.runCode("plt.figure(); plt.pie([1, 1, 1], labels=['a', 'b', 'c']); plt.show()")).results[0].chart
    assert.deepEqual(pie.elements.map((w) => w.angle), [120, 120, 120]) // not 119.99999999999999
  })

  it('returns a dict or list value as JSON too, as E2B does', async () => {
    const e = await sbx.runCode("import numpy as np\n{'a': np.int64(1), 2: [1.5, None]}")
    assert.deepEqual(e.results[0].json, { a: 1, 2: [1.5, null] })
    assert.equal(e.text, "{'a': 1, 2: [1.5, None]}")
  })

  it('shows an image that PIL saves to a file, as E2B does', async () => {
    const e = await sbx.runCode("from PIL import Image\nimg = Image.new('RGB', (8, 6), 'blue')\nimg.save('/tmp/blue.png')")
    assert.equal(e.error, undefined)
    assert.equal(e.results.length, 1)
    assert.equal(e.results[0].isMainResult, false)
    assert.ok(isPNG(e.results[0].png))
    assert.equal((await sbx.files.read('/tmp/blue.png', { format: 'bytes' })).length > 0, true)
  })

  it('runs R cells on IRkernel with state and E2B-style errors', async () => {
    const e = await sbx.runCode('x <- 1+1; x', { language: 'r' })
    assert.equal(e.error, undefined)
    // IRkernel displays values (display_data), so, as on E2B, the value is
    // a result but not the main one.
    assert.equal(e.results[0].text, '[1] 2')
    assert.equal((await sbx.runCode('x * 21', { language: 'r' })).results[0].text, '[1] 42')
    assert.deepEqual((await sbx.runCode('cat("hi\\n")', { language: 'r' })).logs.stdout, ['hi\n'])
    const err = await sbx.runCode('stop("boom")', { language: 'r' })
    assert.equal(err.error.name, 'ERROR')
    assert.match(err.error.value, /boom/)
  })

  it('runs Java cells on jshell with state and E2B-style errors', async () => {
    const e = await sbx.runCode('int x = 41; x + 1', { language: 'java' })
    assert.equal(e.error, undefined)
    assert.equal(e.text, '42')
    assert.equal((await sbx.runCode('x * 2', { language: 'java' })).text, '82')
    assert.deepEqual((await sbx.runCode('System.out.println("hi");', { language: 'java' })).logs.stdout, ['hi', '\n'])
    // E2B's code-interpreter suite: the first chunk is the bare text.
    assert.equal((await sbx.runCode('System.out.println("Hello, World!")', { language: 'java' })).logs.stdout[0], 'Hello, World!')
    const err = await sbx.runCode('int[] a = new int[1]; a[2]', { language: 'java' })
    // IJava's names, as on E2B: EvalException, the thrown class in the traceback.
    assert.equal(err.error.name, 'EvalException')
    assert.match(err.error.value, /out of bounds/)
    assert.match(err.error.traceback, /ArrayIndexOutOfBoundsException/)
    const bad = await sbx.runCode('int y = ;', { language: 'java' })
    assert.equal(bad.error.name, 'CompilationException')
  })

  it('creates R and Java contexts by the names E2B uses', async () => {
    for (const language of ['r', 'java']) {
      const ctx = await sbx.createCodeContext({ language, cwd: '/tmp' })
      assert.equal(ctx.language, language)
      const code = language === 'r' ? 'getwd()' : 'System.getProperty("user.dir")'
      const e = await sbx.runCode(code, { context: ctx })
      assert.match(e.results[0].text, /\/tmp/)
      assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id && c.language === language))
      await sbx.removeCodeContext(ctx)
    }
  })

  it('returns a DataFrame as html, text and data', async () => {
    const e = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})")
    const r = e.results[0]
    assert.ok(r.isMainResult)
    assert.match(r.html, /<table/)
    assert.match(r.text, /a\s+b/)
    assert.deepEqual(r.data, { a: [1, 2, 3], b: ['x', 'y', 'z'] })
  })

  it('runs JavaScript and TypeScript cells with state', async () => {
    assert.deepEqual((await sbx.runCode('console.log("Hello World!")', { language: 'js' })).logs.stdout, ['Hello World!\n'])
    await sbx.runCode('let counter = 40', { language: 'js' })
    assert.equal((await sbx.runCode('counter += 2; counter', { language: 'javascript' })).text, '42')
    const imp = await sbx.runCode("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", { language: 'js' })
    assert.deepEqual(imp.logs.stdout, ['function\n'])
    assert.equal((await sbx.runCode("await Promise.resolve('Hello World!')", { language: 'js' })).text, 'Hello World!')
    assert.equal((await sbx.runCode('process.cwd()', { language: 'js' })).text, '/home/user')
    const jsErr = await sbx.runCode('null.x', { language: 'js' })
    assert.equal(jsErr.error.name, 'TypeError')

    const ts = await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })
    assert.deepEqual(ts.logs.stdout, ['Hello World!\n'])
    await sbx.runCode('interface P { x: number }\nconst p: P = { x: 41 }', { language: 'ts' })
    assert.equal((await sbx.runCode('const q: number = p.x + 1; q', { language: 'ts' })).text, '42')
  })

  it('runs bash, as a language and through IPython', async () => {
    assert.equal((await sbx.runCode('!pwd')).logs.stdout.join('').trim(), '/home/user')
    await sbx.runCode('cd /tmp; N=7', { language: 'bash' })
    const e = await sbx.runCode('pwd; echo $((N * 6)); echo oops >&2', { language: 'bash' })
    assert.equal(e.logs.stdout.join(''), '/tmp\n42\n')
    assert.equal(e.logs.stderr.join(''), 'oops\n')
    const f = await sbx.runCode('ls /nope', { language: 'bash' })
    assert.equal(f.error.name, 'ExitError')
  })

  it('creates, lists, restarts and removes contexts with a cwd', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    assert.equal((await sbx.runCode("'x' in dir()", { context: ctx })).text, 'False') // independent of the default context
    const list = await sbx.listCodeContexts()
    assert.equal(list[list.length - 1].id, ctx.id)
    assert.ok(list.some((c) => c.language === 'python') && list.some((c) => c.language === 'javascript'))
    await sbx.runCode('y = 1', { context: ctx })
    await sbx.restartCodeContext(ctx)
    const after = await sbx.runCode('y', { context: ctx })
    assert.equal(after.error.name, 'NameError')
    assert.equal(after.error.value, "name 'y' is not defined")
    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await assert.rejects(sbx.runCode('1', { context: ctx }), (err) => err.name === 'NotFoundError')

    const js = await sbx.createCodeContext({ language: 'js', cwd: '/etc' })
    assert.equal((await sbx.runCode('process.cwd()', { context: js })).text, '/etc')
    await assert.rejects(sbx.runCode('1', { context: js, language: 'python' }))
  })

  it('sets env vars per execution and restores them', async () => {
    for (const [language, code, after] of [
      ['python', 'import os; os.getenv("FOO")', "import os; os.getenv('FOO', 'default')"],
      ['javascript', 'process.env.FOO', "process.env.FOO || 'default'"],
    ]) {
      const e = await sbx.runCode(code, { language, envs: { FOO: "bar 'q' \"d\"" } })
      assert.equal(e.results[0].text.trim(), `bar 'q' "d"`.replace(/'/g, language === 'python' ? "\\'" : "'"), language)
      assert.equal((await sbx.runCode(after, { language })).text, 'default', language)
    }
    const b = await sbx.runCode('echo $FOO', { language: 'bash', envs: { FOO: 'bar' } })
    assert.deepEqual(b.logs.stdout, ['bar\n'])
    assert.deepEqual((await sbx.runCode('echo ${FOO:-default}', { language: 'bash' })).logs.stdout, ['default\n'])
  })

  it('interrupts a long loop when the client times out; the context stays usable', async () => {
    await sbx.runCode('kept = "still here"')
    await assert.rejects(sbx.runCode('import time\nwhile True:\n    time.sleep(0.01)', { timeoutMs: 3_000 }))
    const e = await sbx.runCode('kept', { timeoutMs: 15_000 })
    assert.equal(e.text, "still here", JSON.stringify(e))
    // A CPU-bound JavaScript loop too.
    await sbx.runCode('let jsKept = 5', { language: 'js' })
    await assert.rejects(sbx.runCode('while (true) {}', { language: 'js', timeoutMs: 2_000 }))
    assert.equal((await sbx.runCode('jsKept', { language: 'js', timeoutMs: 15_000 })).text, '5')
  })

  it('aborting runCode interrupts the cell on every language: state kept, its program gone', async () => {
    // The SDK aborts its (keep-alive) request at timeoutMs; that must stop
    // the cell, not leave it running behind the pooled connection.
    const langs = [
      ['python', 'kept = 7', 'kept', '7', "import subprocess, time\nsubprocess.Popen(['sleep', 'M'])\nwhile True: time.sleep(0.05)"],
      ['js', 'var kept = 7', 'kept', '7', "require('node:child_process').spawn('sleep', ['M']); while (true) {}"],
      ['ts', 'let tsKept: number = 7', 'tsKept', '7', "require('node:child_process').spawn('sleep', ['M']); while (true) {}"],
      ['java', 'int kept = 7;', 'kept', '7', 'new ProcessBuilder("sleep", "M").start(); while (true) { Thread.sleep(50); }'],
      ['bash', 'KEPT=7', 'echo $KEPT', '7', 'while true; do sleep M; done'],
      // A background command ignores SIGINT, as POSIX shells start them.
      ['r', 'kept <- 7', 'kept', '[1] 7', "system('sleep M', wait = FALSE); repeat { Sys.sleep(0.05) }", true],
      // system() ignores SIGINT while its command runs; the loop stops anyway.
      ['r', 'kept <- 7', 'kept', '[1] 7', "repeat { system('sleep M') }"],
    ]
    const running = async (marker) =>
      (await sbx.commands.run(`pgrep -fx 'sleep ${marker}' || true`, { user: 'root' })).stdout.trim() !== ''
    for (const [i, [language, set, get, want, loop, childStays]] of langs.entries()) {
      const marker = String(41000 + i)
      await sbx.runCode(set, { language })
      await assert.rejects(sbx.runCode(loop.replace('M', marker), { language, timeoutMs: 4_000 }), `${language}: the loop ends only by the abort`)
      const e = await sbx.runCode(get, { language, timeoutMs: 15_000 })
      const got = e.results.map((r) => r.text ?? '').join('') + e.logs.stdout.join('')
      assert.ok(got.includes(want) && !e.error, `${language}: state kept after the abort: ${JSON.stringify(e)}`)
      if (childStays) {
        await sbx.commands.run(`pgrep -fx 'sleep ${marker}' | xargs -r kill`, { user: 'root' })
        continue
      }
      for (let n = 0; await running(marker); n++) {
        assert.ok(n < 100, `${language}: sleep ${marker} still runs after the interrupt`)
        await new Promise((r) => setTimeout(r, 200))
      }
    }
  })

  it('reports a kernel killed from inside, names the dead context, and restarts it', async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('z = 1', { context: ctx })
    const died = await sbx.runCode('import os, signal; os.kill(os.getpid(), signal.SIGKILL)', { context: ctx })
    assert.equal(died.error.name, 'KernelDied')
    assert.match(died.error.value, /killed by signal/)
    const dead = await sbx.runCode('z', { context: ctx })
    assert.equal(dead.error.name, 'ContextDead')
    assert.match(dead.error.value, new RegExp(`context ${ctx.id}.*restart`))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('z = 2; z', { context: ctx })).text, '2')
  })

  it('rejects bad input with useful answers', async () => {
    const lang = await raw(sbx, '/execute', { code: '1', language: 'cobol' })
    assert.equal(lang.status, 400)
    assert.match(lang.text, /available languages are python, javascript, typescript, r, java, bash/)
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), /400/)
    const ctx = await raw(sbx, '/execute', { code: '1', context_id: 'nope' })
    assert.equal(ctx.status, 404)
    const both = await raw(sbx, '/execute', { code: '1', context_id: 'x', language: 'python' })
    assert.equal(both.status, 400)
    assert.equal((await raw(sbx, '/health')).text.trim(), '"OK"')
    // A secure sandbox runs code only for holders of its access token.
    assert.ok(sbx.envdAccessToken, 'sandbox is secure')
    assert.equal((await raw(sbx, '/execute', { code: '1' }, '')).status, 401)
    assert.equal((await raw(sbx, '/execute', { code: '1' }, 'wrong')).status, 401)
    assert.equal((await raw(sbx, '/execute', { code: '1' })).status, 200)
  })

  it('truncates a 100 MB output flood with a marker and keeps serving', async () => {
    const t0 = Date.now()
    const e = await sbx.runCode('import sys\nfor _ in range(100):\n    sys.stdout.write("x" * (1 << 20))\nprint("done")', { timeoutMs: 5 * MIN })
    const out = e.logs.stdout.join('').length
    assert.ok(out <= 16 << 20, `stdout ${out} bytes`)
    assert.match(e.logs.stderr.join(''), /output truncated/)
    assert.equal((await sbx.runCode('6 * 7')).text, '42')
    const rss = await sbx.commands.run("ps -o rss= -p $(pgrep -f '^/.agentbox/bin/envd interpreter')", { user: 'root' })
    const mb = Number(rss.stdout.trim()) / 1024
    console.log(`flood: ${out} bytes streamed in ${Date.now() - t0} ms; interpreter RSS afterwards ${mb.toFixed(0)} MB`)
    assert.ok(mb < 200, `interpreter RSS ${mb} MB after a flood`)
  })

  it(`analyses a ${CSV_MB} MB CSV generated in the sandbox with pandas and charts it`, async () => {
    const t0 = Date.now()
    const gen = await sbx.runCode(`
import numpy as np, pandas as pd, os, time
t = time.time()
rng = np.random.default_rng(42)
cats = np.array(['north', 'south', 'east', 'west', 'central'])
blocks = []
for b in range(4):
    n = 1_000_000
    df = pd.DataFrame({
        'region': cats[rng.integers(0, 5, n)],
        'units': rng.integers(1, 100, n),
        'price': rng.normal(50, 12, n).round(2),
        'day': rng.integers(0, 365, n),
    })
    blocks.append(df.to_csv(header=False, index=False))
target = ${CSV_MB} << 20
with open('/home/user/sales.csv', 'w') as f:
    f.write('region,units,price,day\\n')
    i = 0
    while f.tell() < target:
        f.write(blocks[i % len(blocks)]); i += 1
del blocks
print(f"{os.path.getsize('/home/user/sales.csv') >> 20} MB written in {time.time() - t:.1f}s")
`, { timeoutMs: 15 * MIN })
    assert.equal(gen.error, undefined, gen.error?.traceback)
    console.log('csv: ' + gen.logs.stdout.join('').trim())

    const summary = await sbx.runCode(`
import time
import matplotlib.pyplot as plt
t = time.time()
parts = []
rows = 0
for chunk in pd.read_csv('/home/user/sales.csv', chunksize=2_000_000, dtype={'region': 'category'}):
    chunk['revenue'] = chunk['units'] * chunk['price']
    parts.append(chunk.groupby('region', observed=True).agg(rows=('units', 'size'), units=('units', 'sum'), revenue=('revenue', 'sum')))
    rows += len(chunk)
by_region = pd.concat(parts).groupby(level=0).sum().sort_values('revenue', ascending=False)
by_region['avg_price'] = by_region['revenue'] / by_region['units']
print(f"{rows} rows summarised in {time.time() - t:.1f}s")
plt.figure(figsize=(8, 4))
plt.bar(by_region.index.astype(str), by_region['revenue'] / 1e6, label='revenue')
plt.title('Revenue by region'); plt.xlabel('Region'); plt.ylabel('Revenue (M$)')
plt.show()
by_region
`, { timeoutMs: 15 * MIN })
    assert.equal(summary.error, undefined, summary.error?.traceback)
    console.log('summary: ' + summary.logs.stdout.join('').trim() + `; whole flow ${((Date.now() - t0) / 1000).toFixed(1)} s`)
    const rows = Number(summary.logs.stdout.join('').match(/(\d+) rows/)[1])
    assert.ok(rows > CSV_MB * 25_000, `${rows} rows`) // ~38 bytes a row
    const chart = summary.results.find((r) => r.chart)
    assert.ok(isPNG(chart.png))
    assert.equal(chart.chart.type, 'bar')
    assert.equal(chart.chart.elements.length, 5)
    assert.equal(chart.chart.y_unit, 'M$')
    const table = summary.results.find((r) => r.isMainResult)
    assert.match(table.html, /<table/)
    assert.deepEqual(Object.keys(table.data).sort(), ['avg_price', 'revenue', 'rows', 'units'])
    assert.equal(table.data.rows.reduce((a, b) => a + b, 0), rows)
  })
})

describe('sandbox env vars reach the kernels', { timeout: 5 * MIN }, () => {
  it('python, javascript, bash and java see them, and a per-execution value overrides them once', async () => {
    const sbx = await Sandbox.create({ envs: { TEST_ENV_VAR: 'supertest' } })
    try {
      assert.equal((await sbx.runCode('import os; os.getenv("TEST_ENV_VAR")')).text, 'supertest')
      assert.equal((await sbx.runCode('process.env.TEST_ENV_VAR', { language: 'js' })).text, 'supertest')
      assert.deepEqual((await sbx.runCode('echo $TEST_ENV_VAR', { language: 'bash' })).logs.stdout, ['supertest\n'])
      const over = await sbx.runCode('import os; os.getenv("TEST_ENV_VAR")', { envs: { TEST_ENV_VAR: 'overwrite' } })
      assert.equal(over.text, 'overwrite')
      assert.equal((await sbx.runCode('import os; os.getenv("TEST_ENV_VAR")')).text, 'supertest')
      // Java shows them as system properties, as E2B's Java contexts do.
      const prop = 'System.getProperty("TEST_ENV_VAR")'
      assert.equal((await sbx.runCode(prop, { language: 'java' })).text?.trim(), 'supertest')
      assert.equal((await sbx.runCode(prop, { language: 'java', envs: { TEST_ENV_VAR: 'overwrite' } })).text?.trim(), 'overwrite')
      assert.equal((await sbx.runCode(prop, { language: 'java' })).text?.trim(), 'supertest')
    } finally {
      await sbx.kill()
    }
  })
})
