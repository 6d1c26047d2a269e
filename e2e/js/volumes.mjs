// Volumes end to end with the official e2b SDK 2.51.0: E2B's /volumes API,
// volumeMounts on create on both isolation tiers, the volume content API
// (Volume's file methods, at E2B_VOLUME_API_URL with the volume's token),
// the size limit and another team's view. Run by e2e/volume_test.go
// (`node --test volumes.mjs`), or by hand against any server:
//
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL, E2B_API_KEY   the server
//   E2E_OTHER_API_KEY                                               a key of a second team
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import * as sdk from 'e2b'

const { Sandbox, Volume } = sdk
const MIN = 60_000
const other = process.env.E2E_OTHER_API_KEY
const runId = randomBytes(4).toString('hex')
const GVISOR = { 'agentbox.isolation': 'gvisor' }

// run returns a command's result whatever its exit code.
async function run(sbx, cmd, opts = {}) {
  try {
    return await sbx.commands.run(cmd, opts)
  } catch (err) {
    if (err instanceof sdk.CommandExitError) return err
    throw err
  }
}

const out = async (sbx, cmd, opts) => {
  const r = await run(sbx, cmd, opts)
  assert.equal(r.exitCode, 0, `${cmd}: exit ${r.exitCode}: ${r.stderr}`)
  return r.stdout.trim()
}

describe('volumes (e2b 2.51.0)', { concurrency: false, timeout: 20 * MIN }, () => {
  const sandboxes = new Set()
  const volumes = new Set()
  let vol

  async function create(mounts, metadata = {}) {
    const sbx = await Sandbox.create('base', { timeoutMs: 10 * MIN, volumeMounts: mounts, metadata: { e2e: runId, ...metadata } })
    sandboxes.add(sbx.sandboxId)
    return sbx
  }
  async function kill(sbx) {
    await sbx.kill()
    sandboxes.delete(sbx.sandboxId)
  }

  before(async () => {
    for (const k of ['E2B_API_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY', 'E2E_OTHER_API_KEY']) {
      assert.ok(process.env[k], `${k} must be set`)
    }
    vol = await Volume.create(`ws-${runId}`)
    volumes.add(vol.volumeId)
  })
  after(async () => {
    await Promise.allSettled([...sandboxes].map((id) => Sandbox.kill(id)))
    await Promise.allSettled([...volumes].map((id) => Volume.destroy(id)))
  })

  it('create, get, list; names are checked and unique in the team', async () => {
    assert.match(vol.volumeId, /^[0-9a-f-]{36}$/)
    assert.ok(vol.token, 'a content token')
    const info = await Volume.getInfo(vol.volumeId)
    assert.equal(info.name, vol.name)
    assert.ok(info.token)
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === vol.name))
    await assert.rejects(Volume.create(vol.name), sdk.VolumeError, 'same name twice')
    await assert.rejects(Volume.create('bad name!'), /name/, 'invalid name')
    await assert.rejects(Volume.getInfo('00000000-0000-4000-8000-000000000000'), sdk.VolumeNotFoundError)
  })

  it('another team gets 404 and cannot mount it', async () => {
    await assert.rejects(Volume.getInfo(vol.volumeId, { apiKey: other }), sdk.VolumeNotFoundError)
    assert.equal(await Volume.destroy(vol.volumeId, { apiKey: other }), false)
    assert.ok(!(await Volume.list({ apiKey: other })).some((v) => v.volumeId === vol.volumeId))
    await assert.rejects(
      Sandbox.create('base', { apiKey: other, timeoutMs: MIN, volumeMounts: { '/w': vol.name }, metadata: { e2e: runId } }),
      /not found/,
    )
    // The team's volume is untouched.
    assert.equal((await Volume.getInfo(vol.volumeId)).name, vol.name)
  })

  it('the volume file API works without a sandbox', async () => {
    const st = await vol.writeFile('/seed.txt', 'seeded', { uid: 1000, gid: 1000, mode: 0o644 })
    assert.equal(st.type, sdk.VolumeFileType.FILE)
    assert.equal(st.path, '/seed.txt')
    assert.equal(st.uid, 1000)
    assert.equal(st.mode, 0o644)
    assert.ok(st.mtime instanceof Date && !isNaN(st.mtime))
    assert.equal(await vol.readFile('/seed.txt'), 'seeded')
    assert.deepEqual(await vol.readFile('/seed.txt', { format: 'bytes' }), new TextEncoder().encode('seeded'))
    await assert.rejects(vol.writeFile('/seed.txt', 'again'), sdk.VolumeError, 'no overwrite without force')
    await vol.writeFile('/seed.txt', 'seeded!', { force: true, uid: 1000, gid: 1000 })
    assert.equal(await vol.readFile('/seed.txt'), 'seeded!')

    const dir = await vol.makeDir('/a/b/c', { force: true, uid: 1000, gid: 1000, mode: 0o755 })
    assert.equal(dir.type, sdk.VolumeFileType.DIRECTORY)
    await assert.rejects(vol.makeDir('/a/b/c'), sdk.VolumeError, 'existing dir without force')
    await assert.rejects(vol.makeDir('/x/y'), sdk.VolumePathNotFoundError, 'parents without force')
    // A streamed upload and a streamed read of 8 MiB.
    const big = randomBytes(8 << 20)
    await vol.writeFile('/a/b/c/big.bin', new Blob([big]).stream())
    const chunks = []
    for await (const c of await vol.readFile('/a/b/c/big.bin', { format: 'stream' })) chunks.push(c)
    assert.ok(Buffer.concat(chunks).equals(big), 'streamed round trip')
    await vol.writeFile('/empty', '')
    assert.equal(await vol.readFile('/empty'), '')

    const names = (await vol.list('/')).map((e) => e.name).sort()
    assert.deepEqual(names, ['a', 'empty', 'seed.txt'])
    const deep = (await vol.list('/a', { depth: 3 })).map((e) => e.path).sort()
    assert.deepEqual(deep, ['/a/b', '/a/b/c', '/a/b/c/big.bin'])
    await assert.rejects(vol.list('/missing'), sdk.VolumePathNotFoundError)

    const info = await vol.getInfo('/a/b/c/big.bin')
    assert.equal(info.size, 8 << 20)
    assert.equal(await vol.exists('/nope'), false)
    assert.equal(await vol.exists('/a'), true)
    const upd = await vol.updateMetadata('/empty', { uid: 1001, gid: 1002, mode: 0o600 })
    assert.deepEqual([upd.uid, upd.gid, upd.mode], [1001, 1002, 0o600])
    await assert.rejects(vol.updateMetadata('/nope', { mode: 0o600 }), sdk.VolumePathNotFoundError)
    await vol.remove('/empty')
    assert.equal(await vol.exists('/empty'), false)
    await assert.rejects(vol.remove('/empty'), sdk.VolumePathNotFoundError)
    // Paths stay in the volume.
    await assert.rejects(vol.readFile('/../../../../etc/passwd'), sdk.VolumePathNotFoundError)
  })

  it('the content API refuses other tokens', async () => {
    const mine = new Volume(vol.volumeId, vol.name, 'vol1.9999999999.' + '0'.repeat(64))
    // A refused token is a 401: the SDK's AuthenticationError.
    await assert.rejects(mine.readFile('/seed.txt'), sdk.AuthenticationError, 'forged token')
    const theirs = await Volume.create(`theirs-${runId}`, { apiKey: other })
    try {
      const crossed = new Volume(vol.volumeId, vol.name, theirs.token)
      await assert.rejects(crossed.readFile('/seed.txt'), sdk.AuthenticationError, "another team's volume's token")
      await assert.rejects(crossed.writeFile('/pwned', 'x'), sdk.AuthenticationError)
      const keyed = new Volume(vol.volumeId, vol.name, process.env.E2B_API_KEY)
      await assert.rejects(keyed.readFile('/seed.txt'), sdk.AuthenticationError, 'the API key is not a volume token')
    } finally {
      await Volume.destroy(theirs.volumeId, { apiKey: other })
    }
    assert.equal(await vol.exists('/pwned'), false)
  })

  it('two sandboxes on both tiers share it; owners agree; data outlives them', async () => {
    const a = await create({ '/workspace': vol })
    const b = await create({ '/data': vol.name }, GVISOR)
    try {
      const info = await Sandbox.getInfo(a.sandboxId)
      assert.deepEqual(info.volumeMounts, [{ name: vol.name, path: '/workspace' }])
      const listed = (await Sandbox.list({ query: { metadata: { e2e: runId } } }).nextItems()).find((s) => s.sandboxId === b.sandboxId)
      assert.deepEqual(listed.volumeMounts, [{ name: vol.name, path: '/data' }])

      // What the content API wrote as uid 1000 is the sandboxes' user.
      assert.equal(await out(a, 'cat /workspace/seed.txt; echo; stat -c %U /workspace/seed.txt'), 'seeded!\nuser')
      assert.equal(await out(b, 'cat /data/seed.txt; echo; stat -c %U /data/seed.txt'), 'seeded!\nuser')
      // The default user writes (the root is open to every user) ...
      await out(a, 'echo from-container > /workspace/from-a.txt && mkdir /workspace/adir')
      await out(b, 'echo from-gvisor > /data/from-b.txt')
      await out(a, 'echo as-root > /workspace/root.txt && chown 4242:4343 /workspace/root.txt', { user: 'root' })
      await out(b, 'echo gv-root > /data/gv-root.txt', { user: 'root' })
      // ... and each reads the other's, with the same owners.
      const owners = 'stat -c "%n %u:%g" from-a.txt from-b.txt root.txt gv-root.txt seed.txt adir'
      const seenA = await out(a, `cd /workspace && cat from-b.txt gv-root.txt && ${owners}`)
      const seenB = await out(b, `cd /data && cat from-a.txt root.txt && ${owners}`)
      assert.equal(seenA.split('\n').slice(0, 2).join(' '), 'from-gvisor gv-root')
      assert.equal(seenB.split('\n').slice(0, 2).join(' '), 'from-container as-root')
      const ownA = seenA.split('\n').slice(2)
      assert.deepEqual(ownA, seenB.split('\n').slice(2), 'both tiers see the same owners')
      assert.deepEqual(ownA, ['from-a.txt 1000:1000', 'from-b.txt 1000:1000', 'root.txt 4242:4343', 'gv-root.txt 0:0', 'seed.txt 1000:1000', 'adir 1000:1000'])
      // The content API sees the owners the sandboxes see.
      assert.equal((await vol.getInfo('/root.txt')).uid, 4242)
      assert.equal((await vol.getInfo('/from-b.txt')).uid, 1000)
      assert.equal(await vol.readFile('/from-a.txt'), 'from-container\n')

      // A volume in use is not deleted; the error names the sandboxes.
      await assert.rejects(Volume.destroy(vol.volumeId), (err) => err instanceof sdk.VolumeError && err.message.includes(a.sandboxId))

      // Pause and resume (container tier, memory kept): a process keeps
      // writing to a file open in the volume.
      await out(a, "nohup sh -c 'exec 3>>/workspace/ticks; while :; do echo t >&3; sleep 0.2; done' >/dev/null 2>&1 &")
      await new Promise((r) => setTimeout(r, 600))
      assert.equal(await a.pause(), true)
      const a2 = await Sandbox.connect(a.sandboxId)
      const n1 = Number(await out(a2, 'wc -l < /workspace/ticks'))
      await new Promise((r) => setTimeout(r, 800))
      const n2 = Number(await out(a2, 'wc -l < /workspace/ticks'))
      assert.ok(n2 > n1, `the writer kept writing across pause/resume: ${n1} -> ${n2}`)
      assert.equal(await out(a2, 'cat /workspace/from-b.txt'), 'from-gvisor')
      // The gVisor tier too.
      await out(b, "nohup sh -c 'exec 3>>/data/gticks; while :; do echo t >&3; sleep 0.2; done' >/dev/null 2>&1 &")
      await new Promise((r) => setTimeout(r, 600))
      assert.equal(await b.pause(), true)
      const b2 = await Sandbox.connect(b.sandboxId)
      const g1 = Number(await out(b2, 'wc -l < /data/gticks'))
      await new Promise((r) => setTimeout(r, 800))
      const g2 = Number(await out(b2, 'wc -l < /data/gticks'))
      assert.ok(g2 > g1, `the gVisor writer kept writing across pause/resume: ${g1} -> ${g2}`)
      assert.equal(await out(b2, 'cat /data/from-a.txt'), 'from-container')
    } finally {
      await kill(a)
      await kill(b)
    }
    // Data survives its sandboxes.
    assert.equal(await vol.readFile('/from-b.txt'), 'from-gvisor\n')
    const c = await create({ '/srv/ws': vol })
    try {
      assert.equal(await out(c, 'cat /srv/ws/from-a.txt /srv/ws/gv-root.txt'), 'from-container\ngv-root')
    } finally {
      await kill(c)
    }
  })

  it('the size limit holds in the sandbox and harms nobody else', async () => {
    const a = await create({ '/workspace': vol })
    const bystander = await create({})
    try {
      const total = Number(await out(a, "df -B1M --output=size /workspace | tail -1"))
      assert.ok(total > 900 && total <= 1024, `volume is about 1 GiB: ${total} MiB`)
      const r = await run(a, 'dd if=/dev/zero of=/workspace/fill bs=4M count=400 2>&1', { user: 'root' })
      assert.notEqual(r.exitCode, 0, 'writing past the size fails')
      assert.match(r.stdout + r.stderr, /No space left on device/)
      // The rest of the sandbox and other sandboxes write on.
      await out(a, 'head -c 1048576 /dev/zero > /tmp/ok')
      await out(bystander, 'head -c 8388608 /dev/zero > /tmp/ok')
      await assert.rejects(vol.writeFile('/more', 'x'.repeat(16 << 20)), /full/, 'the content API gets the full volume too (507)')
      assert.equal(await vol.exists('/more'), false, 'a failed upload keeps nothing')
      await out(a, 'rm /workspace/fill', { user: 'root' })
      await vol.writeFile('/more', 'fits again')
    } finally {
      await kill(a)
      await kill(bystander)
    }
  })

  it('a mount path is checked and a missing volume named', async () => {
    await assert.rejects(create({ '/proc': vol }), /volumeMounts\[0\]\.path/)
    await assert.rejects(create({ 'relative': vol }), /must be absolute/)
    await assert.rejects(create({ '/w': 'no-such-volume' }), /no-such-volume.*not found/)
  })

  it('delete: refused while mounted, then gone with its token', async () => {
    const token = (await Volume.getInfo(vol.volumeId)).token
    assert.equal(await Volume.destroy(vol.volumeId), true)
    volumes.delete(vol.volumeId)
    await assert.rejects(Volume.getInfo(vol.volumeId), sdk.VolumeNotFoundError)
    assert.equal(await Volume.destroy(vol.volumeId), false)
    await assert.rejects(new Volume(vol.volumeId, vol.name, token).readFile('/seed.txt'), sdk.AuthenticationError)
    await assert.rejects(create({ '/w': vol.name }), /not found/)
  })
})
