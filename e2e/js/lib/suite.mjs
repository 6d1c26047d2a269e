// The end-to-end suite shared by every pinned SDK version: one function that
// registers the same tests against whichever `e2b` module it is handed, so a
// wire difference between versions (v1 vs v2 create/connect) shows up as a
// failure in exactly one of the test files.
//
// Environment (set by e2e/e2e_test.go, or by hand against any server):
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the server under test
//   E2E_OTHER_API_KEY                           a key of a second team
//   E2E_TEMPLATE                                template to start (default "base")
//   E2E_EGRESS_PROBE                            host:port reachable from sandboxes by default
//                                               (default 203.0.113.80:80, this VM's egress proxy)

import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import os from 'node:os'

const TEMPLATE = process.env.E2E_TEMPLATE || 'base'
const EGRESS_PROBE = process.env.E2E_EGRESS_PROBE || '203.0.113.80:80'
// E2E_ISOLATION runs every sandbox on that agentbox tier (container, gvisor)
// through the metadata key the server reads, since the SDK has no field for it.
const ISOLATION = process.env.E2E_ISOLATION || ''
const MIN = 60_000
// Metadata whose keys and values hold what URL encodings treat specially.
const RESERVED = { 'idx': 'one & two=2/é', 'k&=/%+ é': 'v&=/%+ ü 100%', 'plus+key': 'a+b c%20d', '日本': 'データ=値&x' }

export function requiredEnv() {
  const missing = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY'].filter((k) => !process.env[k])
  if (missing.length) throw new Error(`set ${missing.join(', ')} to the server under test`)
}

const sha256 = (data) => createHash('sha256').update(data).digest('hex')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// run returns the result of a command whatever its exit code, so tests can
// assert on exit codes without try/catch noise.
async function run(sdk, sbx, cmd, opts = {}) {
  try {
    return await sbx.commands.run(cmd, opts)
  } catch (err) {
    if (err instanceof sdk.CommandExitError) return err
    throw err
  }
}

async function waitFor(what, fn, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    last = await fn()
    if (last) return last
    await sleep(200)
  }
  assert.fail(`timed out waiting for ${what}`)
}

async function listAll(sdk, opts) {
  const pager = sdk.Sandbox.list(opts)
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()))
  return out
}

function apiPort() {
  return new URL(process.env.E2B_API_URL).port || '80'
}

// hostAddresses are the IPv4 addresses of this machine a sandbox could try to
// reach the API on (per-sandbox veth ends excluded: there are many of them and
// the sandbox's own gateway is probed from inside).
function hostAddresses() {
  const addrs = new Set()
  for (const [name, list] of Object.entries(os.networkInterfaces())) {
    if (name.startsWith('veth') || name.startsWith('ab')) continue
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) addrs.add(a.address)
  }
  return [...addrs].slice(0, 8)
}

async function rawAPI(method, path, body, key = process.env.E2B_API_KEY, headers = {}) {
  const res = await fetch(new URL(path, process.env.E2B_API_URL), {
    method,
    headers: { 'X-API-Key': key, 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, text }
}

export function suite(label, sdk) {
  const { Sandbox } = sdk
  const runId = `${label}-${randomBytes(4).toString('hex')}`
  const created = new Set()

  async function create(opts = {}) {
    const sbx = await Sandbox.create(TEMPLATE, {
      timeoutMs: 10 * MIN,
      ...opts,
      metadata: { e2e: runId, ...(ISOLATION ? { 'agentbox.isolation': ISOLATION } : {}), ...(opts.metadata ?? {}) },
    })
    created.add(sbx.sandboxId)
    return sbx
  }

  describe(`e2b ${label}`, { concurrency: false }, () => {
    before(requiredEnv)
    after(async () => {
      await Promise.allSettled([...created].map((id) => Sandbox.kill(id)))
    })

    describe('one sandbox, end to end', { concurrency: false }, () => {
      let sbx
      before(async () => {
        sbx = await create({ metadata: { role: 'main', ...RESERVED }, envs: { SBX_ENV: 'from-create' } })
      })

      it('getInfo describes it', async () => {
        const info = await Sandbox.getInfo(sbx.sandboxId)
        assert.equal(info.sandboxId, sbx.sandboxId)
        assert.equal(info.state, 'running')
        assert.equal(info.metadata.e2e, runId)
        assert.equal(info.metadata.role, 'main')
        assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt))
        assert.ok(info.endAt > info.startedAt, 'endAt after startedAt')
        assert.ok(info.envdVersion, 'envdVersion set')
        assert.deepEqual(await sbx.getInfo().then((i) => i.sandboxId), sbx.sandboxId)
      })

      it('list filters by metadata', async () => {
        const mine = await listAll(sdk, { query: { metadata: { e2e: runId, role: 'main' } } })
        assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
        const none = await listAll(sdk, { query: { metadata: { e2e: runId, role: 'absent' } } })
        assert.equal(none.length, 0)
      })

      it('list filters by metadata with reserved and non-ASCII characters', async () => {
        // The SDK encodes each key and value, then the pairs, then the
        // parameter: the server undoes all three.
        for (const [k, v] of Object.entries(RESERVED)) {
          const got = await listAll(sdk, { query: { metadata: { e2e: runId, [k]: v } } })
          assert.deepEqual(got.map((s) => s.sandboxId), [sbx.sandboxId], `filter ${k}=${v}`)
          assert.equal(got[0].metadata[k], v)
        }
        const all = await listAll(sdk, { query: { metadata: { e2e: runId, ...RESERVED } } })
        assert.deepEqual(all.map((s) => s.sandboxId), [sbx.sandboxId])
        // One character off matches nothing.
        for (const [k, v] of Object.entries(RESERVED)) {
          assert.equal((await listAll(sdk, { query: { metadata: { e2e: runId, [k]: v + ' ' } } })).length, 0, `filter ${k}=${v} plus a space`)
        }
      })

      it('a malformed metadata filter is refused with 400, as E2B refuses it', async () => {
        for (const raw of ['user', 'a%3D1%26', 'a%3Db%3Dc', 'a%3D%25zz']) {
          for (const path of ['/sandboxes', '/v2/sandboxes']) {
            const r = await rawAPI('GET', `${path}?metadata=${raw}`)
            assert.equal(r.status, 400, `GET ${path}?metadata=${raw}: ${r.status} ${r.text}`)
            assert.match(r.text, /metadata/)
          }
        }
      })

      it('commands: stdout, stderr, exit codes', async () => {
        const ok = await sbx.commands.run('echo out; echo err >&2')
        assert.equal(ok.exitCode, 0)
        assert.equal(ok.stdout, 'out\n')
        assert.equal(ok.stderr, 'err\n')

        await assert.rejects(sbx.commands.run('echo partial; exit 7'), (err) => {
          assert.ok(err instanceof sdk.CommandExitError, `got ${err}`)
          assert.equal(err.exitCode, 7)
          assert.equal(err.stdout, 'partial\n')
          return true
        })
      })

      it('commands: envs, cwd, users', async () => {
        assert.equal((await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })).stdout, 'bar\n')
        assert.equal((await sbx.commands.run('echo $SBX_ENV')).stdout, 'from-create\n')
        assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
        assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
        assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
        assert.equal((await sbx.commands.run('whoami', { user: 'user' })).stdout, 'user\n')
        assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
      })

      it('commands: background and kill', async () => {
        const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
        assert.ok(h.pid > 0)
        const listed = await sbx.commands.list()
        assert.ok(listed.some((p) => p.pid === h.pid), 'background process listed')
        assert.equal(await h.kill(), true)
        await assert.rejects(h.wait(), sdk.CommandExitError)
        await waitFor('killed process to leave the list', async () =>
          !(await sbx.commands.list()).some((p) => p.pid === h.pid))
        assert.equal(await sbx.commands.kill(h.pid), false)
      })

      it('commands: stdin via sendStdin', async () => {
        const h = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
        await sbx.commands.sendStdin(h.pid, 'hello\n')
        const r = await h.wait()
        assert.equal(r.stdout, 'got:hello\n')
      })

      it('commands: 5 MB of output arrives intact', async () => {
        // 3932160 random bytes are exactly 5 MiB of base64.
        const r = await sbx.commands.run(
          'head -c 3932160 /dev/urandom | base64 -w0 | tee /tmp/out.b64', { timeoutMs: 2 * MIN })
        assert.equal(r.stdout.length, 5 * 1024 * 1024)
        const inside = await sbx.commands.run('sha256sum /tmp/out.b64 | cut -d" " -f1')
        assert.equal(sha256(r.stdout), inside.stdout.trim())
      })

      it('pty: create, input, resize, exit', async () => {
        const dec = new TextDecoder()
        let out = ''
        const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
        assert.ok(h.pid > 0)
        await sbx.pty.resize(h.pid, { cols: 123, rows: 45 })
        await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((6*7)); stty size; exit 0\n'))
        const r = await h.wait()
        assert.equal(r.exitCode, 0)
        assert.match(out, /pty-42/)
        assert.match(out, /45 123/)
      })

      it('files: text and binary round trip', async () => {
        const info = await sbx.files.write('hello.txt', 'hello, sandbox\n')
        assert.equal(info.path, '/home/user/hello.txt')
        assert.equal(await sbx.files.read('hello.txt'), 'hello, sandbox\n')
        assert.equal((await sbx.commands.run('cat /home/user/hello.txt')).stdout, 'hello, sandbox\n')

        const blob = randomBytes(3 * 1024 * 1024 + 7)
        await sbx.files.write('/tmp/blob.bin', blob)
        const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
        assert.equal(sha256(back), sha256(blob))
        const inside = await sbx.commands.run('sha256sum /tmp/blob.bin | cut -d" " -f1')
        assert.equal(inside.stdout.trim(), sha256(blob))
      })

      it('files: list, exists, rename, remove, makeDir', async () => {
        assert.equal(await sbx.files.makeDir('d/sub'), true)
        assert.equal(await sbx.files.makeDir('d/sub'), false)
        await sbx.files.write('d/a.txt', 'a')
        await sbx.files.write('d/b.txt', 'b')
        const names = (await sbx.files.list('d')).map((e) => e.name).sort()
        assert.deepEqual(names, ['a.txt', 'b.txt', 'sub'])
        const sub = (await sbx.files.list('d')).find((e) => e.name === 'sub')
        assert.equal(sub.type, 'dir')
        assert.equal(await sbx.files.exists('d/a.txt'), true)
        assert.equal(await sbx.files.exists('d/nope.txt'), false)
        await sbx.files.rename('d/a.txt', 'd/c.txt')
        assert.equal(await sbx.files.exists('d/a.txt'), false)
        assert.equal(await sbx.files.read('d/c.txt'), 'a')
        await sbx.files.remove('d/c.txt')
        assert.equal(await sbx.files.exists('d/c.txt'), false)
        await assert.rejects(sbx.files.read('d/c.txt'), sdk.FileNotFoundError)
        assert.equal((await sbx.commands.run('stat -c %U /home/user/d/b.txt')).stdout, 'user\n')
      })

      it('files: watchDir reports events', async () => {
        await sbx.files.makeDir('w')
        const events = []
        const w = await sbx.files.watchDir('w', (ev) => { events.push(ev) })
        try {
          await sbx.files.write('w/x.txt', 'x')
          await waitFor('write event for x.txt', async () =>
            events.some((e) => e.name === 'x.txt' && e.type === 'write'))
          // E2B's envd gives exactly these three for a new file written through the SDK.
          assert.deepEqual(events.filter((e) => e.name === 'x.txt').map((e) => e.type), ['create', 'chmod', 'write'])
          await sbx.files.remove('w/x.txt')
          await waitFor('remove event for x.txt', async () =>
            events.some((e) => e.name === 'x.txt' && e.type === 'remove'))
        } finally {
          await w.stop()
        }
      })

      it('setTimeout moves endAt', async () => {
        await sbx.setTimeout(2 * MIN)
        const info = await sbx.getInfo()
        const left = info.endAt.getTime() - Date.now()
        assert.ok(left > 0 && left <= 2 * MIN + 5_000, `endAt ${info.endAt.toISOString()} is ~2 min away`)
        await sbx.setTimeout(10 * MIN)
        const later = await sbx.getInfo()
        assert.ok(later.endAt > info.endAt, 'endAt extended')
      })

      it('kill ends it', async () => {
        assert.equal(await sbx.isRunning(), true)
        await sbx.kill()
        assert.equal(await sbx.isRunning(), false)
        await assert.rejects(Sandbox.getInfo(sbx.sandboxId), sdk.SandboxNotFoundError ?? sdk.NotFoundError)
        assert.equal(await Sandbox.kill(sbx.sandboxId), false)
        created.delete(sbx.sandboxId)
      })
    })

    describe('network policy inside a sandbox', { concurrency: false }, () => {
      let sbx
      before(async () => { sbx = await create() })

      it('cannot reach the API on any host address', async () => {
        const port = apiPort()
        const gw = (await sbx.commands.run("ip -4 route show default | awk '{print $3; exit}'")).stdout.trim()
        const targets = [...new Set([gw, '127.0.0.1', ...hostAddresses()].filter(Boolean))]
        for (const addr of targets) {
          const r = await run(sdk, sbx, `curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://${addr}:${port}/health`)
          assert.notEqual(r.exitCode, 0, `API reachable from the sandbox at ${addr}:${port}`)
        }
      })

      it('cannot reach cloud metadata', async () => {
        const r = await run(sdk, sbx, 'curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://169.254.169.254/latest/meta-data/')
        assert.notEqual(r.exitCode, 0, '169.254.169.254 reachable')
      })

      it('reaches the egress probe by default', async () => {
        const r = await run(sdk, sbx, `curl -sS -o /dev/null --connect-timeout 5 --max-time 10 http://${EGRESS_PROBE}/`)
        assert.equal(r.exitCode, 0, `default sandbox cannot reach ${EGRESS_PROBE}: ${r.stderr}`)
      })

      it('allowInternetAccess:false blocks egress', async () => {
        const closed = await create({ allowInternetAccess: false })
        const r = await run(sdk, closed, `curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://${EGRESS_PROBE}/`)
        assert.notEqual(r.exitCode, 0, `egress to ${EGRESS_PROBE} allowed with allowInternetAccess:false`)
        const info = await closed.getInfo()
        if (info.allowInternetAccess !== undefined) assert.equal(info.allowInternetAccess, false)
        await closed.kill()
        created.delete(closed.sandboxId)
      })
    })

    describe('twenty sandboxes at once', { concurrency: false }, () => {
      const N = 20
      let boxes = []
      before(async () => {
        boxes = await Promise.all(Array.from({ length: N }, (_, i) => create({ metadata: { fleet: String(i) } })))
      })
      after(async () => {
        await Promise.allSettled(boxes.map(async (b) => { await b.kill(); created.delete(b.sandboxId) }))
      })

      it('all are listed', async () => {
        const listed = await listAll(sdk, { query: { metadata: { e2e: runId } } })
        const ids = new Set(listed.map((s) => s.sandboxId))
        for (const b of boxes) assert.ok(ids.has(b.sandboxId), `${b.sandboxId} listed`)
      })

      it('filesystems are separate', async () => {
        await Promise.all(boxes.map((b, i) => b.files.write('/home/user/owner.txt', `box-${i}`)))
        await boxes[0].files.write('/tmp/only-in-0', 'x')
        const owners = await Promise.all(boxes.map((b) => b.files.read('/home/user/owner.txt')))
        assert.deepEqual(owners, boxes.map((_, i) => `box-${i}`))
        const seen = await Promise.all(boxes.slice(1).map((b) => b.files.exists('/tmp/only-in-0')))
        assert.ok(seen.every((s) => s === false), 'file written in one sandbox visible in another')
      })

      it('hostnames differ', async () => {
        const names = await Promise.all(boxes.map((b) => b.commands.run('hostname').then((r) => r.stdout.trim())))
        assert.equal(new Set(names).size, N, `hostnames: ${names.join(' ')}`)
      })

      it('cannot reach each other', async () => {
        const ipOf = async (b) => (await b.commands.run("ip -4 -o addr show scope global | awk '{split($4,a,\"/\"); print a[1]; exit}'")).stdout.trim()
        const [ip0, ip1] = await Promise.all([ipOf(boxes[0]), ipOf(boxes[1])])
        assert.ok(ip0 && ip1 && ip0 !== ip1, `addresses ${ip0} ${ip1}`)
        // envd listens on 49983 in every sandbox: a neighbour must not get to it.
        for (const [from, to] of [[boxes[0], ip1], [boxes[1], ip0]]) {
          const r = await run(sdk, from, `curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://${to}:49983/health`)
          assert.notEqual(r.exitCode, 0, `sandbox reached neighbour ${to}`)
        }
      })
    })

    describe('expiry', () => {
      it('an expired sandbox disappears', { timeout: 2 * MIN }, async () => {
        const sbx = await create({ timeoutMs: 3_000, metadata: { role: 'expiring' } })
        await waitFor('sandbox to expire', async () => {
          try {
            await Sandbox.getInfo(sbx.sandboxId)
            return false
          } catch (err) {
            if (err instanceof sdk.SandboxNotFoundError || err instanceof sdk.NotFoundError) return true
            throw err
          }
        }, 60_000)
        const listed = await listAll(sdk, { query: { metadata: { e2e: runId, role: 'expiring' } } })
        assert.equal(listed.length, 0)
        assert.equal(await sbx.isRunning(), false)
        created.delete(sbx.sandboxId)
      })
    })

    describe('bad input', { concurrency: false }, () => {
      it('unknown template is named in the error', async () => {
        const name = `no-such-template-${randomBytes(3).toString('hex')}`
        await assert.rejects(Sandbox.create(name, { timeoutMs: MIN }), (err) => {
          assert.match(String(err.message), new RegExp(name))
          return true
        })
      })

      it("another team's sandbox is not found", async () => {
        const other = process.env.E2E_OTHER_API_KEY
        assert.ok(other, 'E2E_OTHER_API_KEY must hold a key of a second team')
        const sbx = await create({ metadata: { role: 'private' } })
        await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: other }), sdk.SandboxNotFoundError ?? sdk.NotFoundError)
        assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: other }), false)
        const theirs = await listAll(sdk, { apiKey: other, query: { metadata: { e2e: runId } } })
        assert.equal(theirs.length, 0)
        assert.equal(await sbx.isRunning(), true, 'still running after the other team tried to kill it')
        await sbx.kill()
        created.delete(sbx.sandboxId)
      })

      for (const [what, seconds] of [['negative', -5], ['over the maximum', 31 * 24 * 3600]]) {
        it(`timeout ${what} is a 400 naming timeout`, async () => {
          for (const path of ['/v2/sandboxes', '/sandboxes']) {
            const r = await rawAPI('POST', path, { templateID: TEMPLATE, timeout: seconds, metadata: { e2e: runId } })
            if (r.status === 201) {
              const id = JSON.parse(r.text).sandboxID
              await Sandbox.kill(id)
            }
            assert.equal(r.status, 400, `${path} timeout=${seconds}: ${r.status} ${r.text}`)
            assert.match(r.text, /timeout/i, `${path}: ${r.text}`)
          }
          await assert.rejects(Sandbox.create(TEMPLATE, { timeoutMs: seconds * 1000 }), /timeout/i)
        })
      }

      it('mcp is accepted; on a template without an MCP gateway the SDK fails clearly and kills the sandbox', async () => {
        await assert.rejects(Sandbox.create(TEMPLATE, { mcp: { e2b: {} }, metadata: { e2e: `${runId}-mcp` } }), /MCP gateway/)
        const left = await listAll(sdk, { query: { metadata: { e2e: `${runId}-mcp` } } })
        assert.equal(left.length, 0, `sandboxes left: ${left.map((s) => s.sandboxId)}`)
      })

      it('timeout zero is accepted as E2B accepts it: the sandbox ends at once', async () => {
        const r = await rawAPI('POST', '/v2/sandboxes', { templateID: TEMPLATE, timeout: 0, metadata: { e2e: runId } })
        assert.equal(r.status, 201, r.text)
        const id = JSON.parse(r.text).sandboxID
        let gone = false
        for (let i = 0; i < 50 && !gone; i++) {
          gone = (await rawAPI('GET', `/sandboxes/${id}`)).status === 404
          if (!gone) await new Promise((res) => setTimeout(res, 200))
        }
        if (!gone) await Sandbox.kill(id)
        assert.ok(gone, 'a sandbox created with timeout 0 is still there after 10 s')
      })

      it('a create retried with its Idempotency-Key answers the same sandbox', async () => {
        const key = `e2e-${runId}-${Math.random()}`
        const body = { templateID: TEMPLATE, timeout: 60, metadata: { e2e: runId } }
        const [a, b] = await Promise.all([rawAPI('POST', '/v2/sandboxes', body, undefined, { 'Idempotency-Key': key }),
          rawAPI('POST', '/v2/sandboxes', body, undefined, { 'Idempotency-Key': key })])
        assert.equal(a.status, 201, a.text)
        assert.equal(b.status, 201, b.text)
        const id = JSON.parse(a.text).sandboxID
        try {
          assert.equal(JSON.parse(b.text).sandboxID, id, 'the retry made another sandbox')
          const c = await rawAPI('POST', '/v2/sandboxes', { ...body, timeout: 61 }, undefined, { 'Idempotency-Key': key })
          assert.equal(c.status, 409, `another body with the key: ${c.status} ${c.text}`)
        } finally {
          await Sandbox.kill(id)
        }
      })
    })
  })
}
