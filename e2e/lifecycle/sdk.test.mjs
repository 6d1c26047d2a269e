// Lifecycle end-to-end tests with the official e2b SDK: pause/resume with
// memory, autoPause/autoResume, snapshots, fork, warm pools and bad input.
// Run by lifecycle_test.go against a real server (E2B_API_URL, E2B_API_KEY).
import { describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { Sandbox } from '../js/node_modules/e2b/dist/index.mjs'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const run = async (s, c) => (await s.commands.run(c)).stdout.trim()
const post = async (p, body) =>
  (await fetch(api + p, { method: 'POST', headers: { 'X-API-Key': key, 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).status
// The counter renames a complete file into place, so a reader (or a snapshot) never sees it
// truncated between two writes.
const counter = "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &"
// counterRuns waits until the counter has written a value and then until it moves past it: the
// process itself came along, not only its file.
const counterRuns = async (s) => {
  let first = 0
  for (let i = 0; i < 100; i++) {
    const n = Number(await run(s, 'cat /tmp/count 2>/dev/null || echo 0'))
    if (first === 0) first = n
    else if (n > first) return true
    await new Promise((r) => setTimeout(r, 100))
  }
  return false
}

describe('lifecycle', { concurrency: false, timeout: 600_000 }, () => {
  it('pause keeps files, env, pids, a counter and a PTY across two cycles', async () => {
    const sbx = await Sandbox.create('base', { envs: { FOO: 'bar' }, timeoutMs: 300_000 })
    try {
      await sbx.files.write('/home/user/hello.txt', 'world')
      const bg = await sbx.commands.run('sleep 3600', { background: true })
      await sbx.commands.run(counter)
      let out = ''
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('X=42\n'))
      await sleep(500)
      for (let cycle = 1; cycle <= 2; cycle++) {
        const before = Number(await run(sbx, 'cat /tmp/count'))
        assert.equal(await sbx.pause(), true)
        assert.equal(await sbx.isRunning(), false)
        assert.equal(await Sandbox.pause(sbx.sandboxId), false, 'second pause answers 409')
        assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
        const s2 = await Sandbox.connect(sbx.sandboxId)
        assert.equal(s2.sandboxId, sbx.sandboxId)
        assert.equal(await s2.isRunning(), true)
        assert.equal(await s2.files.read('/home/user/hello.txt'), 'world')
        assert.equal(await run(s2, 'echo $FOO'), 'bar')
        assert.match(await run(s2, `tr '\\0' ' ' < /proc/${bg.pid}/cmdline`), /^sleep 3600/)
        const after = Number(await run(s2, 'cat /tmp/count'))
        assert.ok(after >= before && after < before + 50, `counter continued: ${before} -> ${after}`)
        await sleep(300)
        assert.ok(Number(await run(s2, 'cat /tmp/count')) > after, 'counter keeps counting')
        out = ''
        await sbx.pty.sendInput(pty.pid, new TextEncoder().encode(`echo pty-$X-${cycle}\n`))
        await sleep(500)
        assert.match(out, new RegExp(`pty-42-${cycle}`), 'the PTY shell kept its variable')
      }
    } finally {
      await sbx.kill()
    }
  })

  it('gvisor: pause keeps files, env, pids and a counter; snapshot and fork', async () => {
    const sbx = await Sandbox.create('base', { envs: { FOO: 'gv' }, metadata: { 'agentbox.isolation': 'gvisor' }, timeoutMs: 300_000 })
    try {
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).isolation ?? 'gvisor', 'gvisor')
      await sbx.files.write('/home/user/hello.txt', 'gvisor-world')
      const bg = await sbx.commands.run('sleep 3600', { background: true })
      await sbx.commands.run(counter)
      await sleep(500)
      for (let cycle = 1; cycle <= 2; cycle++) {
        const before = Number(await run(sbx, 'cat /tmp/count'))
        assert.equal(await sbx.pause(), true)
        assert.equal(await sbx.isRunning(), false)
        assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
        const s2 = await Sandbox.connect(sbx.sandboxId)
        assert.equal(await s2.isRunning(), true)
        assert.equal(await s2.files.read('/home/user/hello.txt'), 'gvisor-world')
        assert.equal(await run(s2, 'echo $FOO'), 'gv')
        assert.match(await run(s2, `tr '\\0' ' ' < /proc/${bg.pid}/cmdline`), /^sleep 3600/)
        const after = Number(await run(s2, 'cat /tmp/count'))
        assert.ok(after >= before && after < before + 50, `counter continued: ${before} -> ${after}`)
        await sleep(500)
        assert.ok(Number(await run(s2, 'cat /tmp/count')) > after, 'counter keeps counting')
      }
      const snap = await sbx.createSnapshot({ name: 'e2e-gvisor-snap' })
      const b = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
      try {
        assert.equal(await b.files.read('/home/user/hello.txt'), 'gvisor-world')
        const n = Number(await run(b, 'cat /tmp/count'))
        assert.ok(n > 0, 'the counter came with the memory snapshot')
        await b.files.write('/home/user/hello.txt', 'from-b')
        assert.equal(await sbx.files.read('/home/user/hello.txt'), 'gvisor-world')
      } finally {
        await b.kill()
      }
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 })
      for (const f of forks) assert.ok(!(f instanceof Error), String(f))
      await Promise.all(forks.map((f, i) => f.files.write('/home/user/hello.txt', 'fork-' + i)))
      assert.deepEqual(await Promise.all(forks.map((f) => f.files.read('/home/user/hello.txt'))), ['fork-0', 'fork-1'])
      assert.equal(await sbx.files.read('/home/user/hello.txt'), 'gvisor-world')
      await Promise.all(forks.map((f) => f.kill()))
    } finally {
      await sbx.kill()
    }
  })

  for (const isolation of ['container', 'gvisor']) {
    it(`filesystem-only pause (${isolation}): files and env survive, processes restart`, async () => {
      const sbx = await Sandbox.create('base', { envs: { FOO: 'fs' }, metadata: { 'agentbox.isolation': isolation }, timeoutMs: 120_000 })
      try {
        await sbx.files.write('/home/user/keep.txt', 'on-disk')
        const bg = await sbx.commands.run('sleep 3600', { background: true })
        // A finished command leaves the gateway a kept-alive connection
        // into this boot, which the next boot must not be sent over.
        assert.equal(await run(sbx, 'echo before'), 'before')
        assert.equal(await sbx.pause({ keepMemory: false }), true)
        assert.equal(await sbx.isRunning(), false)
        assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
        const s2 = await Sandbox.connect(sbx.sandboxId)
        // Running means envd answers: a command works at once.
        assert.equal(await run(s2, 'echo $FOO'), 'fs')
        assert.equal(await s2.files.read('/home/user/keep.txt'), 'on-disk')
        assert.ok(bg.pid > 0)
        assert.equal(await run(s2, "pgrep -fc 'slee[p] 3600' || true"), '0', 'the old processes are gone')
        // A memory pause, then a resume from the files only: the memory is dropped.
        await s2.commands.run('sleep 3600', { background: true })
        assert.equal(await s2.pause(), true)
        assert.equal(await post(`/sandboxes/${sbx.sandboxId}/resume`, { memory: false, timeout: 60 }), 201)
        assert.equal(await run(s2, "pgrep -fc 'slee[p] 3600' || true"), '0', 'the memory image was not used')
        assert.equal(await s2.files.read('/home/user/keep.txt'), 'on-disk')
      } finally {
        await sbx.kill()
      }
    })
  }

  for (const isolation of ['container', 'gvisor']) {
    it(`pause and snapshot with connections in flight (${isolation})`, async () => {
      const sbx = await Sandbox.create('base', { metadata: { 'agentbox.isolation': isolation }, timeoutMs: 120_000 })
      const inflight = []
      try {
        // A server that never accepts: the connections below stay in its
        // accept queue, which a dump meets at any busy moment.
        await sbx.commands.run(`python3 -c 'import socket,time,pathlib; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("0.0.0.0",8000)); s.listen(16); pathlib.Path("/tmp/listening").touch(); time.sleep(3600)'`, { background: true })
        await run(sbx, 'while [ ! -e /tmp/listening ]; do sleep 0.05; done')
        const queued = () => run(sbx, "grep -c ':1F40 [0-9A-F]*:[0-9A-F]* 01 ' /proc/net/tcp || true")
        const connect = async () => {
          const ac = new AbortController()
          inflight.push(ac)
          fetch(api + '/', { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }, signal: ac.signal }).catch(() => {})
          // gVisor's /proc/net/tcp does not list its netstack's queue.
          if (isolation === 'gvisor') return sleep(300)
          for (let i = 0; i < 100 && Number(await queued()) < inflight.length; i++) await sleep(50)
        }
        await connect()
        if (isolation === 'container') assert.ok(Number(await queued()) >= 1, 'a connection waits in the accept queue')
        assert.equal(await sbx.pause(), true, 'pause with an unaccepted connection')
        const s2 = await Sandbox.connect(sbx.sandboxId)
        assert.equal(await run(s2, 'echo resumed'), 'resumed')
        await connect()
        const snap = await s2.createSnapshot({ name: `e2e-inflight-${isolation}` })
        assert.equal(await run(s2, 'echo still'), 'still', 'the source keeps running')
        assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      } finally {
        for (const ac of inflight) ac.abort()
        await sbx.kill()
      }
    })
  }

  for (const isolation of ['container', 'gvisor']) {
    it(`each boot has its own boot_id (${isolation})`, async () => {
      const host = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim()
      const bootID = (s) => run(s, 'cat /proc/sys/kernel/random/boot_id')
      const md = { metadata: { 'agentbox.isolation': isolation }, timeoutMs: 120_000 }
      const [a, b] = await Promise.all([Sandbox.create('base', md), Sandbox.create('base', md)])
      try {
        const first = await bootID(a)
        assert.match(first, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
        assert.notEqual(first, host, "the host's boot_id leaks into the sandbox")
        assert.notEqual(await bootID(b), first, 'two sandboxes share a boot_id')
        // Root in the sandbox can neither change nor uncover it.
        for (const attack of ["sh -c 'echo x > /proc/sys/kernel/random/boot_id'", 'umount /proc/sys/kernel/random/boot_id',
          'umount -l /proc/sys/kernel/random/boot_id', 'mount --bind /etc/hostname /proc/sys/kernel/random/boot_id']) {
          await run(a, `sudo -n ${attack} 2>/dev/null || true`)
        }
        assert.equal(await bootID(a), first, 'root changed the boot_id')
        assert.equal(await a.pause(), true)
        let s2 = await Sandbox.connect(a.sandboxId)
        assert.equal(await bootID(s2), first, 'a memory resume keeps the boot')
        assert.equal(await s2.pause({ keepMemory: false }), true)
        s2 = await Sandbox.connect(a.sandboxId)
        const second = await bootID(s2)
        assert.notEqual(second, first, 'a resume from files is a new boot')
        assert.notEqual(second, host)
      } finally {
        await Promise.all([a.kill(), b.kill()])
      }
    })
  }

  it('filesystem-only snapshot: files come along, processes start anew', async () => {
    const a = await Sandbox.create('base', { timeoutMs: 120_000, envs: { SNAP: 'fs' } })
    try {
      await a.files.write('/home/user/state.txt', 'from-a')
      await a.commands.run(counter)
      const res = await fetch(`${api}/sandboxes/${a.sandboxId}/snapshots`, {
        method: 'POST', headers: { 'X-API-Key': key, 'Content-Type': 'application/json' }, body: JSON.stringify({ memory: false }),
      })
      assert.equal(res.status, 201)
      const { snapshotID } = await res.json()
      assert.equal(await a.isRunning(), true, 'the source keeps running')
      const b = await Sandbox.create(snapshotID, { timeoutMs: 60_000 })
      try {
        assert.equal(await b.files.read('/home/user/state.txt'), 'from-a')
        assert.equal(await run(b, 'echo $SNAP'), 'fs')
        assert.equal(await run(b, "pgrep -fc 'while [:]' || true"), '0', 'no process came with the snapshot')
        await b.files.write('/home/user/state.txt', 'from-b')
        assert.equal(await a.files.read('/home/user/state.txt'), 'from-a')
      } finally {
        await b.kill()
      }
      assert.equal(await Sandbox.deleteSnapshot(snapshotID), true)
    } finally {
      await a.kill()
    }
  })

  it('autoPause keeping files only, resumed explicitly', async () => {
    const c = await Sandbox.create('base', { timeoutMs: 3000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
    try {
      await c.files.write('/tmp/keep', 'kept-fs')
      await sleep(5500)
      assert.equal((await Sandbox.getInfo(c.sandboxId)).state, 'paused')
      const s2 = await Sandbox.connect(c.sandboxId)
      assert.equal(await s2.files.read('/tmp/keep'), 'kept-fs')
    } finally {
      await c.kill()
    }
  })

  it('autoPause on timeout, then autoResume on traffic', async () => {
    const c = await Sandbox.create('base', { timeoutMs: 3000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    try {
      await c.files.write('/tmp/keep', 'kept')
      assert.deepEqual((await Sandbox.getInfo(c.sandboxId)).lifecycle, { onTimeout: 'pause', autoResume: true })
      await sleep(5500)
      assert.equal((await Sandbox.getInfo(c.sandboxId)).state, 'paused')
      assert.equal(await c.files.read('/tmp/keep'), 'kept') // traffic resumes it
      assert.equal((await Sandbox.getInfo(c.sandboxId)).state, 'running')
    } finally {
      await c.kill()
    }
  })

  it('snapshot, create from it, list and delete', async () => {
    const a = await Sandbox.create('base', { timeoutMs: 120_000, envs: { SNAP: 'yes' } })
    try {
      await a.files.write('/home/user/state.txt', 'from-a')
      await a.commands.run(counter)
      await sleep(400)
      const snap = await a.createSnapshot({ name: 'e2e-snap' })
      assert.equal(await a.isRunning(), true, 'the source keeps running')
      const list = []
      const p = Sandbox.listSnapshots()
      while (p.hasNext) list.push(...(await p.nextItems()))
      assert.ok(list.some((s) => s.snapshotId === snap.snapshotId))
      const b = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
      try {
        assert.equal(await b.files.read('/home/user/state.txt'), 'from-a')
        assert.equal(await run(b, 'echo $SNAP'), 'yes')
        const n = Number(await run(b, 'cat /tmp/count'))
        assert.ok(n > 0, 'the counter process came with the memory snapshot')
        await sleep(300)
        assert.ok(Number(await run(b, 'cat /tmp/count')) > n)
        await b.files.write('/home/user/state.txt', 'from-b')
        assert.equal(await a.files.read('/home/user/state.txt'), 'from-a')
      } finally {
        await b.kill()
      }
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    } finally {
      await a.kill()
    }
  })

  it('fork x5: each independent, own address', async () => {
    const a = await Sandbox.create('base', { timeoutMs: 120_000 })
    try {
      await a.files.write('/home/user/state.txt', 'parent')
      await a.commands.run(counter)
      assert.ok(await counterRuns(a), 'counter runs in the parent')
      const forks = await a.fork({ count: 5, timeoutMs: 60_000 })
      assert.equal(forks.length, 5)
      for (const f of forks) assert.ok(!(f instanceof Error), String(f))
      await Promise.all(forks.map((f, i) => f.files.write('/home/user/state.txt', 'fork-' + i)))
      assert.deepEqual(await Promise.all(forks.map((f) => f.files.read('/home/user/state.txt'))), forks.map((_, i) => 'fork-' + i))
      assert.equal(await a.files.read('/home/user/state.txt'), 'parent')
      const ips = await Promise.all(forks.map((f) => run(f, 'hostname -I')))
      assert.equal(new Set(ips).size, 5)
      for (const ok of await Promise.all(forks.map(counterRuns))) assert.ok(ok, 'counter runs in each fork')
      await Promise.all(forks.map((f) => f.kill()))
    } finally {
      await a.kill()
    }
  })

  it('warm pool hit is configured as requested', async () => {
    const before = JSON.parse(await (await fetch(api + '/pools', { headers: { 'X-API-Key': key } })).text())
    const s = await Sandbox.create('base', { envs: { POOLED: 'env-ok' }, metadata: { who: 'pool-test' }, timeoutMs: 60_000 })
    try {
      const after = JSON.parse(await (await fetch(api + '/pools', { headers: { 'X-API-Key': key } })).text())
      assert.equal(after[0].hits, before[0].hits + 1, 'served from the pool')
      assert.equal(await run(s, 'echo $POOLED'), 'env-ok')
      const info = await Sandbox.getInfo(s.sandboxId)
      assert.deepEqual(info.metadata, { who: 'pool-test' })
      assert.ok(info.endAt.getTime() - Date.now() < 61_000)
    } finally {
      await s.kill()
    }
  })

  it('bad input', async () => {
    const a = await Sandbox.create('base', { timeoutMs: 60_000 })
    assert.equal(await post(`/sandboxes/${a.sandboxId}/fork`, { count: 0 }), 400)
    assert.equal(await post(`/sandboxes/${a.sandboxId}/fork`, { count: 101 }), 400)
    const killing = a.kill()
    await sleep(15)
    const st = await post(`/sandboxes/${a.sandboxId}/snapshots`, {})
    assert.ok(st === 409 || st === 404, `snapshot of a sandbox being killed: ${st}`)
    await killing
    assert.equal(await post(`/sandboxes/${a.sandboxId}/resume`, {}), 404)
    assert.equal(await post(`/v2/sandboxes/${a.sandboxId}/connect`, { timeout: 10 }), 404)
    assert.equal(await post(`/sandboxes/${a.sandboxId}/pause`, {}), 404)
  })
})
