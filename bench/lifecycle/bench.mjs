// Lifecycle benchmark with the official e2b SDK: hibernate (pause) and
// restore for 10 MB / 100 MB / 1 GB resident processes, paused disk cost,
// fork x10, warm-pool create p50, and a burst of 100 concurrent creates.
//
//   sudo agentbox serve ... --pool base=3
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... DATA_DIR=<server --data-dir> \
//     node bench/lifecycle/bench.mjs
import { execSync } from 'node:child_process'
import { Sandbox } from '../../e2e/js/node_modules/e2b/dist/index.mjs'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
const dataDir = process.env.DATA_DIR || ''
const burst = Number(process.env.BURST || 100)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] }
const rows = []
const row = (metric, value, note = '') => { rows.push([metric, value, note]); console.error(metric, value, note) }
const du = (p) => { try { return execSync(`du -sm ${p} 2>/dev/null`).toString().split('\t')[0] + ' MB' } catch { return '?' } }

async function createWithMemory(mb) {
  const res = await fetch(api + '/v2/sandboxes', { method: 'POST', headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', timeout: 600, memoryMB: mb }) })
  if (res.status !== 201) throw new Error(`create ${res.status} ${await res.text()}`)
  return Sandbox.connect((await res.json()).sandboxID)
}

for (const mb of [10, 100, 1024]) {
  const s = await createWithMemory(Math.max(512, mb * 2))
  await s.commands.run(`nohup python3 -c "import os,time; b=os.urandom(${mb}<<20); open('/tmp/ready','w').write('1'); time.sleep(1e6)" >/dev/null 2>&1 &`)
  for (let i = 0; i < 200 && (await s.commands.run('cat /tmp/ready 2>/dev/null || true')).stdout !== '1'; i++) await sleep(100)
  const p = [], r = []
  for (let i = 0; i < 3; i++) {
    let t = performance.now(); await s.pause(); p.push(performance.now() - t)
    if (i === 0 && dataDir) row(`paused disk cost, ${mb} MB resident`, du(`${dataDir}/sandboxes/${s.sandboxId}/checkpoint`), `memory image; writable layer ${du(`${dataDir}/sandboxes/${s.sandboxId}/disk`)}`)
    t = performance.now(); await Sandbox.connect(s.sandboxId); r.push(performance.now() - t)
  }
  row(`pause (hibernate) ${mb} MB resident`, `p50 ${pct(p, 50).toFixed(0)} ms`, `3 runs: ${p.map((x) => x.toFixed(0)).join('/')} ms`)
  row(`resume ${mb} MB resident`, `p50 ${pct(r, 50).toFixed(0)} ms`, `connect() until 201: ${r.map((x) => x.toFixed(0)).join('/')} ms`)
  await s.kill()
}

{
  const s = await Sandbox.create('base', { timeoutMs: 300_000 })
  await s.commands.run('true')
  const t = performance.now()
  const forks = await s.fork({ count: 10, timeoutMs: 120_000 })
  const ms = performance.now() - t
  row('fork x10', `${ms.toFixed(0)} ms`, `${forks.filter((f) => !(f instanceof Error)).length}/10 started (one checkpoint, 4 restores in parallel)`)
  await Promise.all(forks.filter((f) => !(f instanceof Error)).map((f) => f.kill()))
  await s.kill()
}

{
  const ts = []
  for (let i = 0; i < 10; i++) {
    await sleep(1500) // the pool refills between creates
    const t = performance.now()
    const s = await Sandbox.create('base', { timeoutMs: 60_000 })
    ts.push(performance.now() - t)
    await s.kill()
  }
  const pools = await (await fetch(api + '/pools', { headers: { 'X-API-Key': key } })).json()
  row('warm-pool create via SDK', `p50 ${pct(ts, 50).toFixed(0)} ms`, `p90 ${pct(ts, 90).toFixed(0)} ms; pools ${JSON.stringify(pools)}`)
}

{
  const t0 = performance.now()
  const times = []
  const res = await Promise.allSettled(Array.from({ length: burst }, async () => {
    const t = performance.now()
    const s = await Sandbox.create('base', { timeoutMs: 120_000 })
    times.push(performance.now() - t)
    return s
  }))
  const ok = res.filter((r) => r.status === 'fulfilled')
  row(`burst ${burst} concurrent creates`, `${ok.length}/${burst} ok`, `p50 ${pct(times, 50)?.toFixed(0)} ms, p99 ${pct(times, 99)?.toFixed(0)} ms, wall ${(performance.now() - t0).toFixed(0)} ms; first error: ${res.find((r) => r.status === 'rejected')?.reason?.message ?? 'none'}`)
  await Promise.allSettled(ok.map((r) => r.value.kill()))
}

console.log('METRIC | VALUE | NOTE')
for (const r of rows) console.log(r.join(' | '))
