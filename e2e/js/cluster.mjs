// The E2B JS SDK against `agentbox serve --kubernetes` (the cluster's
// stateless API tier): every call goes through the replica, which turns
// creates into Sandbox objects run by node agents and proxies sandbox
// traffic to the agent of the sandbox's node. Run by e2e/kube
// (TestKubeAPIConformance).
//
// Environment:
//   E2B_API_URL = E2B_SANDBOX_URL   the replica
//   E2B_API_KEY                     a key of team A (apikey create --kubernetes)
//   E2E_OTHER_API_KEY               a key of team B
//   E2E_TEMPLATE                    template to start (default "base")

import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError } from 'e2b'

const TEMPLATE = process.env.E2E_TEMPLATE || 'base'
const OTHER = process.env.E2E_OTHER_API_KEY
const MIN = 60_000
const runId = randomBytes(4).toString('hex')
const sha256 = (data) => createHash('sha256').update(data).digest('hex')
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const NotFound = SandboxNotFoundError ?? NotFoundError

async function listAll(opts) {
  const pager = Sandbox.list(opts)
  const out = []
  while (pager.hasNext) out.push(...(await pager.nextItems()))
  return out
}

async function waitFor(what, fn, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await fn()) return
    await sleep(200)
  }
  assert.fail(`timed out waiting for ${what}`)
}

async function rawAPI(method, path, key, body) {
  const headers = { 'Content-Type': 'application/json' }
  if (key !== undefined) headers['X-API-Key'] = key
  const res = await fetch(new URL(path, process.env.E2B_API_URL), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  })
  return { status: res.status, text: await res.text() }
}

describe('e2b SDK against serve --kubernetes', { concurrency: false }, () => {
  let sbx
  const created = new Set()
  before(async () => {
    for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'E2E_OTHER_API_KEY']) {
      assert.ok(process.env[k], `set ${k}`)
    }
    sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 10 * MIN, metadata: { e2e: runId, role: 'main' }, envs: { SBX_ENV: 'from-create' } })
    created.add(sbx.sandboxId)
  })
  after(async () => {
    await Promise.allSettled([...created].map((id) => Sandbox.kill(id)))
  })

  it('lifecycle: getInfo and list describe it', async () => {
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.state, 'running')
    assert.equal(info.metadata.role, 'main')
    assert.ok(info.endAt > info.startedAt)
    const mine = await listAll({ query: { metadata: { e2e: runId, role: 'main' } } })
    assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.equal((await listAll({ query: { metadata: { e2e: runId, role: 'absent' } } })).length, 0)
  })

  it('lifecycle: the list paginator pages with limit', async () => {
    const second = await Sandbox.create(TEMPLATE, { timeoutMs: 5 * MIN, metadata: { e2e: runId, role: 'page' } })
    created.add(second.sandboxId)
    try {
      for (const order of ['desc', 'asc']) {
        const pager = Sandbox.list({ limit: 1, order, query: { metadata: { e2e: runId } } })
        const ids = []
        let pages = 0
        while (pager.hasNext) {
          const items = await pager.nextItems()
          assert.ok(items.length <= 1, `a page of ${items.length} with limit 1`)
          ids.push(...items.map((s) => s.sandboxId))
          pages++
        }
        assert.deepEqual([...ids].sort(), [sbx.sandboxId, second.sandboxId].sort(), `${order}: each sandbox once`)
        assert.ok(pages >= 2, `${order}: ${pages} page(s)`)
      }
    } finally {
      await second.kill()
      created.delete(second.sandboxId)
    }
    await waitFor('the second sandbox to leave the list', async () =>
      (await listAll({ query: { metadata: { e2e: runId, role: 'page' } } })).length === 0)
  })

  it('lifecycle: setTimeout moves endAt', async () => {
    await sbx.setTimeout(2 * MIN)
    const info = await sbx.getInfo()
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 0 && left <= 2 * MIN + 5_000, `endAt ${info.endAt.toISOString()} is ~2 min away`)
    await sbx.setTimeout(10 * MIN)
    assert.ok((await sbx.getInfo()).endAt > info.endAt, 'endAt extended')
  })

  it('commands: run, exit codes, env', async () => {
    const ok = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(ok.stdout, 'out\n')
    assert.equal(ok.stderr, 'err\n')
    await assert.rejects(sbx.commands.run('exit 7'), (err) => err instanceof CommandExitError && err.exitCode === 7)
    assert.equal((await sbx.commands.run('echo $SBX_ENV')).stdout, 'from-create\n')
  })

  it('commands: streamed output', async () => {
    const chunks = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done', { onStdout: (d) => chunks.push(d) })
    assert.equal(r.stdout, 'line1\nline2\nline3\n')
    assert.ok(chunks.length >= 2, `output came in ${chunks.length} chunk(s)`)
  })

  it('commands: background and kill', async () => {
    const h = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
    assert.equal(await h.kill(), true)
    await assert.rejects(h.wait(), CommandExitError)
  })

  it('files: write, read, list; upload and download URLs', async () => {
    await sbx.files.write('d/a.txt', 'hello, cluster\n')
    assert.equal(await sbx.files.read('d/a.txt'), 'hello, cluster\n')
    assert.deepEqual((await sbx.files.list('d')).map((e) => e.name), ['a.txt'])
    const blob = randomBytes(1024 * 1024 + 3)
    await sbx.files.write('/tmp/blob.bin', blob)
    assert.equal(sha256(await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })), sha256(blob))

    const up = await sbx.uploadUrl('/tmp/up.txt', { useSignatureExpiration: 600 })
    const form = new FormData()
    form.append('file', new Blob(['uploaded by URL\n']), 'up.txt')
    const put = await fetch(up, { method: 'POST', body: form })
    assert.ok(put.ok, `upload: ${put.status} ${await put.text()}`)
    const down = await fetch(await sbx.downloadUrl('/tmp/up.txt', { useSignatureExpiration: 600 }))
    assert.equal(down.status, 200)
    assert.equal(await down.text(), 'uploaded by URL\n')
  })

  it('pty: input and output', async () => {
    const dec = new TextDecoder()
    let out = ''
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((6*7)); exit 0\n'))
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.match(out, /pty-42/)
  })

  it('pause and resume keep a process and a file', async () => {
    const h = await sbx.commands.run('sleep 3000', { background: true, timeoutMs: 0 })
    await sbx.files.write('/tmp/kept.txt', 'kept')
    await sbx.betaPause()
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 5 * MIN })
    assert.equal((await back.getInfo()).state, 'running')
    assert.equal(await back.files.read('/tmp/kept.txt'), 'kept')
    assert.ok((await back.commands.list()).some((p) => p.pid === h.pid), 'the background process survived the pause')
    await back.commands.kill(h.pid)
  })

  it('snapshots: create, list, start from, delete; team B cannot', async () => {
    const allSnapshots = async (opts) => {
      const pager = Sandbox.listSnapshots(opts)
      const out = []
      while (pager.hasNext) out.push(...(await pager.nextItems()))
      return out.map((s) => s.snapshotId)
    }
    await sbx.files.write('/tmp/snap.txt', 'in the snapshot')
    const h = await sbx.commands.run('sleep 3000', { background: true, timeoutMs: 0 })
    const snap = await sbx.createSnapshot()
    assert.ok(snap.snapshotId, 'a snapshot id')
    await waitFor('the snapshot to be listed', async () =>
      (await allSnapshots({ sandboxId: sbx.sandboxId, limit: 1 })).includes(snap.snapshotId))

    const asB = { apiKey: OTHER }
    assert.ok(!(await allSnapshots(asB)).includes(snap.snapshotId), "team B lists team A's snapshot")
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, asB), false)
    await assert.rejects(Sandbox.create(snap.snapshotId, { ...asB, timeoutMs: MIN }))

    // The agents have no object store: it starts on the snapshot's node.
    const from = await Sandbox.create(snap.snapshotId, { timeoutMs: 5 * MIN })
    created.add(from.sandboxId)
    assert.equal(await from.files.read('/tmp/snap.txt'), 'in the snapshot')
    assert.ok((await from.commands.list()).some((p) => p.pid === h.pid), 'the background process is in the snapshot')
    await from.kill()
    created.delete(from.sandboxId)

    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    await waitFor('the snapshot to leave the list', async () => !(await allSnapshots()).includes(snap.snapshotId))
    await sbx.commands.kill(h.pid)
  })

  it("team B cannot list, get, kill, pause or connect team A's sandbox", async () => {
    const asB = { apiKey: OTHER }
    assert.equal((await listAll({ ...asB, query: { metadata: { e2e: runId } } })).length, 0)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, asB), NotFound)
    assert.equal(await Sandbox.kill(sbx.sandboxId, asB), false)
    await assert.rejects(Sandbox.connect(sbx.sandboxId, asB), (err) => err instanceof NotFoundError || /not found/i.test(String(err.message)))
    const unknown = `i${randomBytes(10).toString('hex')}`
    for (const [method, path] of [['GET', ''], ['DELETE', ''], ['POST', '/pause'], ['POST', '/timeout'], ['POST', '/resume']]) {
      const theirs = await rawAPI(method, `/sandboxes/${sbx.sandboxId}${path}`, OTHER, path === '/timeout' ? { timeout: 1 } : undefined)
      const none = await rawAPI(method, `/sandboxes/${unknown}${path}`, OTHER, path === '/timeout' ? { timeout: 1 } : undefined)
      assert.equal(theirs.status, 404, `${method} ${path}: ${theirs.status} ${theirs.text}`)
      assert.equal(theirs.text.replaceAll(sbx.sandboxId, 'ID'), none.text.replaceAll(unknown, 'ID'), `${method} ${path}: answered unlike an unknown id`)
    }
    assert.equal(await sbx.isRunning(), true, 'still running after team B tried')
  })

  it('no key and a wrong key are refused with 401', async () => {
    for (const key of [undefined, `e2b_${randomBytes(20).toString('hex')}`]) {
      const r = await rawAPI('GET', '/v2/sandboxes', key)
      assert.equal(r.status, 401, r.text)
    }
  })

  it('endpoints not served say so', async () => {
    const r = await rawAPI('GET', '/templates', process.env.E2B_API_KEY)
    assert.equal(r.status, 404)
    assert.match(r.text, /serve --kubernetes/)
  })

  it('an unknown template is named in the error', async () => {
    const name = `no-such-template-${randomBytes(3).toString('hex')}`
    await assert.rejects(Sandbox.create(name, { timeoutMs: MIN }), (err) => {
      assert.match(String(err.message), new RegExp(name))
      return true
    })
    const left = await listAll({ query: { metadata: { e2e: runId } } })
    assert.deepEqual(left.map((s) => s.sandboxId), [sbx.sandboxId], 'the failed create left nothing behind')
  })

  it('kill ends it', async () => {
    await sbx.kill()
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFound)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    created.delete(sbx.sandboxId)
    await waitFor('the killed sandbox to leave the list', async () =>
      (await listAll({ query: { metadata: { e2e: runId } } })).length === 0)
  })
})
