// The microvm tier through the official e2b SDK: commands, files, a PTY and
// the guest kernel of its own, on a sandbox created with the
// "agentbox.isolation" metadata key. Run by e2e/microvm (which starts the
// server); not part of the version suites (package.json's `node --test .`
// runs *.test.mjs only).
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import os from 'node:os'
import { Sandbox, CommandExitError } from 'e2b'

const MIN = 60_000
const EGRESS_PROBE = process.env.E2E_EGRESS_PROBE || '203.0.113.80:80'

describe('microvm tier', { concurrency: false }, () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create(process.env.E2E_TEMPLATE || 'base', {
      timeoutMs: 10 * MIN,
      requestTimeoutMs: 5 * MIN,
      metadata: { e2e: 'microvm', 'agentbox.isolation': 'microvm' },
    })
  })
  after(async () => { if (sbx) await sbx.kill() })

  it('runs commands in a guest kernel of its own', async () => {
    const r = await sbx.commands.run('echo out-$((6*7)); echo err >&2; uname -r; hostname', { timeoutMs: 2 * MIN })
    assert.equal(r.exitCode, 0)
    const lines = r.stdout.trim().split('\n')
    assert.equal(lines[0], 'out-42')
    assert.equal(r.stderr, 'err\n')
    assert.notEqual(lines[1], os.release(), 'the guest runs the host kernel')
    assert.equal(lines[2], sbx.sandboxId)
    try {
      await sbx.commands.run('exit 3')
      assert.fail('exit 3 did not throw')
    } catch (err) {
      assert.ok(err instanceof CommandExitError)
      assert.equal(err.exitCode, 3)
    }
  })

  it('files: write, read, list', async () => {
    await sbx.files.write('/home/user/hello.txt', 'hello, microvm\n')
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello, microvm\n')
    const blob = new Uint8Array(300_000).map((_, i) => (i * 7) & 0xff)
    await sbx.files.write('/tmp/blob.bin', blob)
    const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
    assert.deepEqual(Buffer.from(back), Buffer.from(blob))
    const names = (await sbx.files.list('/home/user')).map((e) => e.name)
    assert.ok(names.includes('hello.txt'), `list: ${names}`)
    const r = await sbx.commands.run('cat /home/user/hello.txt')
    assert.equal(r.stdout, 'hello, microvm\n')
  })

  it('limits: the guest has the CPUs and memory of the sandbox', async () => {
    const info = await sbx.getInfo()
    const r = await sbx.commands.run("nproc; awk '/^MemTotal/ {print $2}' /proc/meminfo")
    const [cpus, memKB] = r.stdout.trim().split('\n').map(Number)
    assert.equal(cpus, info.cpuCount)
    // The guest kernel keeps some of its RAM for itself.
    assert.ok(memKB <= info.memoryMB * 1024 && memKB > info.memoryMB * 1024 * 0.7, `MemTotal ${memKB} kB for memoryMB ${info.memoryMB}`)
  })

  it('network: the sandbox address, egress by default, none with allowInternetAccess:false', async () => {
    const ok = await sbx.commands.run(`curl -sS -o /dev/null --connect-timeout 5 --max-time 10 http://${EGRESS_PROBE}/`)
    assert.equal(ok.exitCode, 0)
    const closed = await Sandbox.create(process.env.E2E_TEMPLATE || 'base', {
      timeoutMs: 5 * MIN,
      requestTimeoutMs: 5 * MIN,
      allowInternetAccess: false,
      metadata: { e2e: 'microvm', 'agentbox.isolation': 'microvm' },
    })
    try {
      let code
      try {
        code = (await closed.commands.run(`curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://${EGRESS_PROBE}/`)).exitCode
      } catch (err) {
        if (!(err instanceof CommandExitError)) throw err
        code = err.exitCode
      }
      assert.notEqual(code, 0, `egress to ${EGRESS_PROBE} allowed with allowInternetAccess:false`)
    } finally {
      await closed.kill()
    }
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

  it('pause and resume keep memory: processes, shell variables, files', async () => {
    await sbx.files.write('/home/user/kept.txt', 'kept')
    const bg = await sbx.commands.run('sleep 3600', { background: true })
    const before = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
    assert.equal(await sbx.pause(), true)
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
    const s2 = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs: 5 * MIN })
    assert.equal(await s2.isRunning(), true)
    assert.equal(await s2.files.read('/home/user/kept.txt'), 'kept')
    const r = await s2.commands.run(`cat /proc/sys/kernel/random/boot_id; tr '\\0' ' ' < /proc/${bg.pid}/cmdline`)
    const [after, cmdline] = r.stdout.split('\n')
    assert.equal(after, before, 'the guest was rebooted, not resumed')
    assert.match(cmdline, /^sleep 3600/)
  })
  it('snapshot and fork: a new sandbox and a fork see the files and processes of the source', async () => {
    const api = async (path, body) => {
      const res = await fetch(`${process.env.E2B_API_URL}${path}`, {
        method: 'POST',
        headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      })
      const text = await res.text()
      assert.ok(res.ok, `POST ${path}: ${res.status} ${text}`)
      return JSON.parse(text)
    }
    await sbx.files.write('/home/user/snap.txt', 'from the source')
    const bg = await sbx.commands.run('sleep 7200', { background: true })
    const check = async (s) => {
      const r = await s.commands.run(`cat /home/user/snap.txt; echo; tr '\\0' ' ' < /proc/${bg.pid}/cmdline`)
      const [file, cmdline] = r.stdout.split('\n')
      assert.equal(file, 'from the source')
      assert.match(cmdline, /^sleep 7200/)
    }
    const snap = await api(`/sandboxes/${sbx.sandboxId}/snapshots`, {})
    assert.ok(snap.snapshotID, JSON.stringify(snap))
    // The source runs on.
    await sbx.files.write('/home/user/snap.txt', 'changed after the snapshot')
    const fromSnap = await Sandbox.create(snap.snapshotID, { timeoutMs: 5 * MIN, requestTimeoutMs: 5 * MIN })
    try {
      assert.notEqual(fromSnap.sandboxId, sbx.sandboxId)
      await check(fromSnap)
    } finally {
      await fromSnap.kill()
    }
    await sbx.files.write('/home/user/snap.txt', 'from the source')
    const forks = await api(`/sandboxes/${sbx.sandboxId}/fork`, { count: 1, timeout: 300 })
    assert.equal(forks.length, 1)
    assert.ok(forks[0].sandbox, JSON.stringify(forks[0]))
    const fork = await Sandbox.connect(forks[0].sandbox.sandboxID, { requestTimeoutMs: 5 * MIN })
    try {
      await check(fork)
      // Its own address: the source's answers as before, and both keep going.
      await check(sbx)
      await fork.files.write('/home/user/snap.txt', 'fork')
      assert.equal(await sbx.files.read('/home/user/snap.txt'), 'from the source')
    } finally {
      await fork.kill()
    }
  })
})
