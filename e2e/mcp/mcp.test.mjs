// agentbox's MCP server driven by the official MCP TypeScript SDK: over
// streamable HTTP at /mcp with an API key, and over stdio by spawning
// `agentbox mcp`.
//
// Environment (set by e2e/mcp/mcp_test.go):
//   E2B_API_URL, E2B_API_KEY   the server under test and a key of team one
//   E2E_OTHER_API_KEY          a key of a second team
//   AGENTBOX_BIN               the agentbox binary, for stdio

import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
const OTHER = process.env.E2E_OTHER_API_KEY
const BIN = process.env.AGENTBOX_BIN
// Reachable from sandboxes unless their policy denies it (as in e2e/js).
const EGRESS_PROBE = process.env.E2E_EGRESS_PROBE || '203.0.113.80:80'
const curl = `curl -sS -o /dev/null --connect-timeout 3 --max-time 5 http://${EGRESS_PROBE}/`
const MIN = 60_000

const TOOLS = ['create_sandbox', 'list_sandboxes', 'kill_sandbox', 'pause_sandbox', 'resume_sandbox', 'run_command',
  'run_code', 'read_file', 'write_file', 'list_files', 'expose_port']

async function httpClient(headers) {
  const client = new Client({ name: 'agentbox-e2e', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL('/mcp', API), { requestInit: { headers } })
  await client.connect(transport)
  return client
}

// call returns the structured result of a tool, failing on a tool error.
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args })
  assert.ok(!res.isError, `${name}: ${text(res)}`)
  assert.ok(res.structuredContent, `${name}: no structured content`)
  return res.structuredContent
}

// refused returns the reason of a tool error, failing on success.
async function refused(client, name, args) {
  const res = await client.callTool({ name, arguments: args })
  assert.ok(res.isError, `${name} succeeded: ${JSON.stringify(res.structuredContent)}`)
  return text(res)
}

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('')

describe('MCP over streamable HTTP', { timeout: 10 * MIN }, () => {
  let one, two, id
  before(async () => {
    assert.ok(API && KEY && OTHER, 'set E2B_API_URL, E2B_API_KEY and E2E_OTHER_API_KEY')
    one = await httpClient({ 'X-API-Key': KEY })
    two = await httpClient({ Authorization: `Bearer ${OTHER}` })
  })
  after(async () => {
    if (id) await one.callTool({ name: 'kill_sandbox', arguments: { sandboxId: id } })
    await one?.close()
    await two?.close()
  })

  it('lists every tool with input and output schemas', async () => {
    const { tools } = await one.listTools()
    const byName = new Map(tools.map((t) => [t.name, t]))
    for (const name of TOOLS) {
      const t = byName.get(name)
      assert.ok(t, `tool ${name} missing`)
      assert.equal(t.inputSchema.type, 'object', name)
      assert.equal(t.outputSchema?.type, 'object', `${name} has no output schema`)
    }
    assert.deepEqual(byName.get('run_command').inputSchema.required.sort(), ['cmd', 'sandboxId'])
  })

  it('creates a sandbox, runs commands, moves files, exposes a port', async () => {
    const created = await call(one, 'create_sandbox', { template: 'base', timeoutSeconds: 600, metadata: { by: 'mcp-e2e' } })
    id = created.sandboxId
    assert.match(id, /^[a-z0-9]+$/)

    const r = await call(one, 'run_command', {
      sandboxId: id, cmd: 'echo "$GREETING from $(pwd) as $(whoami)"; echo oops >&2; exit 3',
      cwd: '/tmp', envs: { GREETING: 'hello' }, user: 'root', timeoutSeconds: 30,
    })
    assert.equal(r.exitCode, 3)
    assert.equal(r.stdout, 'hello from /tmp as root\n')
    assert.equal(r.stderr, 'oops\n')

    // A flood is cut at 1 MiB and flagged, not held whole by the server.
    const flood = await call(one, 'run_command', { sandboxId: id, cmd: "head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2" })
    assert.deepEqual([flood.exitCode, flood.stdout.length, flood.stdout[0], flood.stderr, flood.truncated], [0, 1 << 20, 'a', 'done\n', true])

    const body = 'line one\nünïcode ✓\n'
    const w = await call(one, 'write_file', { sandboxId: id, path: '/tmp/mcp/note.txt', content: body })
    assert.equal(w.path, '/tmp/mcp/note.txt')
    assert.equal(w.size, Buffer.byteLength(body))
    const rd = await call(one, 'read_file', { sandboxId: id, path: '/tmp/mcp/note.txt' })
    assert.deepEqual([rd.content, rd.encoding], [body, 'utf8'])

    const bin = Buffer.from([0, 255, 1, 254])
    await call(one, 'write_file', { sandboxId: id, path: '/tmp/mcp/bin', content: bin.toString('base64'), encoding: 'base64' })
    const rb = await call(one, 'read_file', { sandboxId: id, path: '/tmp/mcp/bin' })
    assert.deepEqual([rb.content, rb.encoding, rb.size], [bin.toString('base64'), 'base64', 4])

    const ls = await call(one, 'list_files', { sandboxId: id, path: '/tmp/mcp' })
    assert.deepEqual(ls.entries.map((e) => [e.name, e.type]).sort(), [['bin', 'file'], ['note.txt', 'file']])

    assert.match(await refused(one, 'read_file', { sandboxId: id, path: '/tmp/mcp/absent' }), /absent/)

    const listed = await call(one, 'list_sandboxes', {})
    const mine = listed.sandboxes.find((s) => s.sandboxId === id)
    assert.ok(mine, 'the new sandbox is listed')
    assert.deepEqual([mine.state, mine.metadata.by], ['running', 'mcp-e2e'])

    // A port: a one-line HTTP server in the sandbox, reached at the URL the
    // tool returns.
    await call(one, 'write_file', { sandboxId: id, path: '/tmp/www/index.html', content: 'served by ' + id })
    await call(one, 'run_command', { sandboxId: id, cmd: 'cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &' })
    const port = await call(one, 'expose_port', { sandboxId: id, port: 8000 })
    // The port's own origin, never a path on the API's.
    const api = new URL(API)
    assert.equal(port.url, `http://8000-${id}.localhost:${api.port}/`)
    assert.equal(port.host, `8000-${id}.localhost:${api.port}`)
    let got = ''
    for (let i = 0; i < 100 && got !== 'served by ' + id; i++) {
      got = await viaHost(api, port.host, '/')
      if (got !== 'served by ' + id) await new Promise((r) => setTimeout(r, 200))
    }
    assert.equal(got, 'served by ' + id)

    // base has no code interpreter: the refusal says so and what to do.
    assert.match(await refused(one, 'run_code', { sandboxId: id, code: '1+1' }), /no code interpreter.*code-interpreter-v1/)
  })

  it('creates sandboxes with a network policy', async () => {
    assert.ok(id, 'needs the sandbox of the previous test')
    const open = await call(one, 'run_command', { sandboxId: id, cmd: curl })
    assert.equal(open.exitCode, 0, `the default policy cannot reach ${EGRESS_PROBE}: ${open.stderr}`)
    const probeIP = EGRESS_PROBE.split(':')[0]
    const policies = [
      [{ allowInternetAccess: false }, false],
      [{ denyOut: ['0.0.0.0/0'] }, false],
      [{ denyOut: ['0.0.0.0/0'], allowOut: [probeIP] }, true],
    ]
    for (const [policy, reachable] of policies) {
      const sbx = (await call(one, 'create_sandbox', { timeoutSeconds: 120, ...policy })).sandboxId
      try {
        const r = await call(one, 'run_command', { sandboxId: sbx, cmd: curl })
        assert.equal(r.exitCode === 0, reachable, `${JSON.stringify(policy)}: exit ${r.exitCode} ${r.stderr}`)
      } finally {
        await call(one, 'kill_sandbox', { sandboxId: sbx })
      }
    }
  })

  it('pauses and resumes a sandbox', async () => {
    assert.ok(id, 'needs the sandbox of the previous test')
    await call(one, 'run_command', { sandboxId: id, cmd: 'echo kept > /tmp/state' })
    assert.equal((await call(one, 'pause_sandbox', { sandboxId: id })).state, 'paused')
    const paused = await call(one, 'list_sandboxes', { state: 'paused' })
    assert.ok(paused.sandboxes.some((s) => s.sandboxId === id), 'listed as paused')
    assert.equal((await call(one, 'resume_sandbox', { sandboxId: id, timeoutSeconds: 600 })).state, 'running')
    assert.equal((await call(one, 'run_command', { sandboxId: id, cmd: 'cat /tmp/state' })).stdout, 'kept\n')
  })

  it("another team's key sees and touches nothing of it", async () => {
    assert.ok(id, 'needs the sandbox of the previous test')
    const listed = await call(two, 'list_sandboxes', {})
    assert.ok(!listed.sandboxes.some((s) => s.sandboxId === id), "the other team's list shows it")
    const missing = 'i0000000000nonexistent'
    const attempts = [
      ['run_command', { cmd: 'id' }], ['read_file', { path: '/tmp/state' }], ['write_file', { path: '/tmp/x', content: 'x' }],
      ['list_files', { path: '/' }], ['expose_port', { port: 8000 }], ['pause_sandbox', {}], ['resume_sandbox', {}],
      ['kill_sandbox', {}], ['run_code', { code: '1' }],
    ]
    for (const [tool, args] of attempts) {
      const theirs = await refused(two, tool, { sandboxId: id, ...args })
      assert.match(theirs, new RegExp(`Sandbox "${id}" doesn't exist`), tool)
      // Word for word what a sandbox that does not exist gets.
      const none = await refused(two, tool, { sandboxId: missing, ...args })
      assert.equal(theirs.replaceAll(id, 'ID'), none.replaceAll(missing, 'ID'), tool)
    }
    assert.equal((await call(one, 'run_command', { sandboxId: id, cmd: 'cat /tmp/state' })).stdout, 'kept\n', 'still there, untouched')
  })

  it('kills the sandbox', async () => {
    assert.ok(id, 'needs the sandbox of the previous test')
    assert.equal((await call(one, 'kill_sandbox', { sandboxId: id })).state, 'killed')
    const listed = await call(one, 'list_sandboxes', {})
    assert.ok(!listed.sandboxes.some((s) => s.sandboxId === id), 'still listed after kill')
    assert.match(await refused(one, 'run_command', { sandboxId: id, cmd: 'true' }), new RegExp(`Sandbox "${id}" doesn't exist`))
    id = undefined
  })

  it('refuses a request without a key, or with a wrong one', async () => {
    await assert.rejects(httpClient({}), /401.*missing API key/s)
    await assert.rejects(httpClient({ 'X-API-Key': 'e2b_' + '0'.repeat(40) }), /401/)
    const resp = await fetch(new URL('/mcp', API), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    assert.equal(resp.status, 401)
    assert.match((await resp.json()).message, /missing API key/)
  })
})

describe('MCP over stdio (agentbox mcp)', { timeout: 5 * MIN }, () => {
  let client, id
  before(async () => {
    assert.ok(BIN, 'set AGENTBOX_BIN to the agentbox binary')
    client = new Client({ name: 'agentbox-e2e-stdio', version: '1.0.0' })
    await client.connect(new StdioClientTransport({
      command: BIN,
      args: ['mcp'],
      env: { PATH: process.env.PATH, AGENTBOX_API_URL: API, AGENTBOX_API_KEY: KEY },
    }))
  })
  after(async () => {
    if (id) await client.callTool({ name: 'kill_sandbox', arguments: { sandboxId: id } })
    await client?.close()
  })

  it('lists tools and runs a command', async () => {
    const { tools } = await client.listTools()
    assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort())
    id = (await call(client, 'create_sandbox', { timeoutSeconds: 300 })).sandboxId
    const r = await call(client, 'run_command', { sandboxId: id, cmd: 'echo $((6*7))' })
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, '42\n', ''])
    await call(client, 'kill_sandbox', { sandboxId: id })
    id = undefined
  })
})

// viaHost GETs path from the server at api with Host host (a *.localhost
// name the host's resolver may not know; browsers map it to loopback) and
// resolves with the body of a 200, else ''.
function viaHost(api, host, path) {
  return new Promise((resolve) => {
    http.get({ host: api.hostname, port: api.port, path, headers: { Host: host } }, (res) => {
      let b = ''
      res.on('data', (d) => (b += d))
      res.on('end', () => resolve(res.statusCode === 200 ? b : ''))
    }).on('error', () => resolve(''))
  })
}
