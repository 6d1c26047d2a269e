// Network policy, egress proxy, credential injection and port exposure,
// end to end with the official e2b SDK (2.51.0 from e2e/js). Run by
// network_test.go, which starts the server and a fake internet:
//   allowed.test → A, api.allowed.test → B, sub.wild.test → B, other.test → C
import { Sandbox } from '../js/node_modules/e2b/dist/index.mjs'
import net from 'node:net'
import http from 'node:http'
import https from 'node:https'
import tls from 'node:tls'
import fs from 'node:fs'
import crypto from 'node:crypto'
import { spawn } from 'node:child_process'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
const A = process.env.E2E_FAKE_A, B = process.env.E2E_FAKE_B, C = process.env.E2E_FAKE_C
const DOMAIN = process.env.E2E_DOMAIN
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..')

let failures = 0
const ok = (cond, what, detail = '') => {
  console.log(`${cond ? 'ok  ' : 'FAIL'} ${what}${detail ? ' — ' + detail : ''}`)
  if (!cond) failures++
}
const sandboxes = []
const create = async (opts) => { const s = await Sandbox.create('base', { timeoutMs: 300_000, ...opts }); sandboxes.push(s); return s }

// sh runs a command and never throws on a non-zero exit.
async function sh(sb, cmd) {
  try { return await sb.commands.run(cmd, { timeoutMs: 60_000 }) } catch (e) {
    if (e.exitCode !== undefined) return e
    throw e
  }
}

// curl from inside the sandbox; returns {code, rc, ms, out}.
async function curl(sb, url, extra = '') {
  const t = Date.now()
  const r = await sh(sb, `curl -sS -m 8 -o /tmp/body -w '%{http_code}' ${extra} '${url}'; echo " rc=$?"; cat /tmp/body 2>/dev/null`)
  const m = /^(\d{3}) rc=(\d+)\n?([\s\S]*)$/.exec(r.stdout.trim() + '\n') || []
  return { code: Number(m[1] ?? 0), rc: Number(m[2] ?? -1), body: m[3] ?? '', ms: Date.now() - t, raw: r.stdout + r.stderr }
}
const reached = (r) => r.rc === 0 && r.code === 200
const blocked = (r) => !reached(r) && r.ms < 3000

async function api(method, p, body) {
  const res = await fetch(API + p, { method, headers: { 'X-API-Key': KEY, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })
  const text = await res.text()
  return { status: res.status, text, json: (() => { try { return JSON.parse(text) } catch { return null } })() }
}

try {
  // ---- deny all ----
  {
    const sb = await create({ allowInternetAccess: false })
    for (const url of ['http://allowed.test/', `http://${A}/`, `https://${A}/`]) {
      const r = await curl(sb, url, '-k')
      ok(blocked(r), `deny-all: ${url} blocked fast`, `code=${r.code} rc=${r.rc} ${r.ms}ms`)
    }
    const t = await sh(sb, `timeout 3 bash -c 'exec 3<>/dev/tcp/${A}/7; echo hi >&3; read -t 2 x <&3; echo "[$x]"'`)
    ok(!t.stdout.includes('[hi]'), 'deny-all: raw TCP blocked')

    // ---- live update on the same sandbox ----
    await sb.updateNetwork({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] })
    ok(reached(await curl(sb, 'http://allowed.test/')), 'live update: allowed.test reachable after PUT network')
    ok(blocked(await curl(sb, 'http://other.test/')), 'live update: other.test still blocked')
    await sb.updateNetwork({})
    ok(reached(await curl(sb, 'http://other.test/')), 'live update: everything allowed after clearing the policy')
    const info = await Sandbox.getInfo(sb.sandboxId)
    ok(info.allowInternetAccess === true, 'live update: info shows internet access', JSON.stringify(info.network))
  }

  // ---- allow by CIDR ----
  {
    const sb = await create({ network: { allowOut: [`${C}/32`], denyOut: ['ALL_TRAFFIC'] } })
    ok(reached(await curl(sb, `http://${C}/`)), 'CIDR: allowed address reachable')
    // With the internet off the resolver answers only names in allowOut:
    // a range opens addresses, not names (no DNS tunnel).
    ok(blocked(await curl(sb, 'http://other.test/')), 'CIDR: a name resolving into the range is not resolved (internet off)')
    ok(blocked(await curl(sb, `http://${A}/`)), 'CIDR: address outside blocked')
    ok(blocked(await curl(sb, 'http://allowed.test/')), 'CIDR: name outside blocked')
    const t = await sh(sb, `timeout 3 bash -c 'exec 3<>/dev/tcp/${C}/7; echo hi >&3; read -t 2 x <&3; echo "[$x]"'`)
    ok(t.stdout.includes('[hi]'), 'CIDR: raw TCP to the range works')
  }

  // ---- allow by domain and wildcard; SNI without MITM ----
  {
    const sb = await create({ network: { allowOut: ['allowed.test', '*.wild.test'], denyOut: ['ALL_TRAFFIC'] } })
    ok(reached(await curl(sb, 'http://allowed.test/')), 'domain: http allowed.test')
    const tls = await curl(sb, 'https://allowed.test/', '-k -v')
    ok(reached(tls), 'domain: https allowed.test by SNI')
    ok(/issuer: CN=agentbox fake internet CA/.test(tls.raw), 'domain: TLS passed through untouched (upstream certificate)')
    ok(reached(await curl(sb, 'https://sub.wild.test/', '-k')), 'wildcard: https sub.wild.test')
    ok(blocked(await curl(sb, 'http://other.test/')), 'domain: other.test blocked (DNS)')
    ok(blocked(await curl(sb, 'https://other.test/', `-k --resolve other.test:443:${C}`)), 'SNI: other.test blocked by its TLS server name')
    ok(blocked(await curl(sb, `http://${C}/`)), 'domain: bare address outside allowOut blocked')
  }

  // ---- deny wins over the default; the platform wins over allowOut ----
  {
    const sb = await create({ network: { allowOut: ['10.0.0.0/8', '169.254.169.254'], denyOut: [B] } })
    ok(reached(await curl(sb, `http://${A}/`)), 'deny: other addresses allowed by default')
    ok(blocked(await curl(sb, `http://${B}/`)), 'deny: denyOut address blocked')
    ok(blocked(await curl(sb, 'http://169.254.169.254/')), 'platform: metadata blocked despite allowOut')
    ok(blocked(await curl(sb, 'http://10.255.255.1/')), 'platform: private range blocked despite allowOut')
    // Spoofing: one datagram from the sandbox's address, one with a forged
    // source through a raw socket; the Go test checks what arrived.
    const [sinkIP, sinkPort] = process.env.E2E_SINK.split(':')
    const py = `
import socket, struct
dst = '${sinkIP}'; port = ${sinkPort}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'legit', (dst, port))
payload = b'spoofed'
udp = struct.pack('!HHHH', 40000, port, 8 + len(payload), 0) + payload
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton('10.122.0.250'), socket.inet_aton(dst))
try:
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW); r.sendto(ip + udp, (dst, 0))
    print('sent')
except PermissionError:
    print('raw sockets denied')`
    await sb.files.write('/tmp/spoof.py', py)
    const sp = await sh(sb, 'python3 /tmp/spoof.py')
    // Either the sandbox cannot forge packets at all (no raw sockets), or
    // the forged one is dropped on the bridge port (checked by the Go side).
    ok(/sent|raw sockets denied/.test(sp.stdout), 'spoof: forged datagram attempted', sp.stdout.trim() + sp.stderr)
  }

  // ---- credential injection with a stored secret ----
  {
    const secret = 'sk-e2e-' + crypto.randomBytes(12).toString('hex')
    // The fake servers echo Authorization hashed, so no copy of the secret
    // travels back into the sandbox through the test itself.
    const hashed = 'sha256:' + crypto.createHash('sha256').update('Bearer ' + secret).digest('hex')
    const put = await api('POST', '/secrets', { name: 'E2E_TOKEN', value: secret })
    ok(put.status === 201 && !put.text.includes(secret), 'secrets: created, value not echoed', put.text)
    const list = await api('GET', '/secrets')
    ok(list.status === 200 && list.text.includes('E2E_TOKEN') && !list.text.includes(secret), 'secrets: listed without values')
    const sb = await create({
      network: {
        allowOut: ['api.allowed.test', 'allowed.test'], denyOut: ['ALL_TRAFFIC'],
        rules: { 'api.allowed.test': [{ transform: { headers: { Authorization: 'Bearer ${secrets.E2E_TOKEN}', 'X-Injected': 'yes' } } }] },
      },
    })
    const https = await curl(sb, 'https://api.allowed.test/v1/models', "-H 'Authorization: Bearer placeholder'")
    const hj = (() => { try { return JSON.parse(https.body) } catch { return {} } })()
    ok(reached(https) && hj.headers?.Authorization?.[0] === hashed, 'inject: HTTPS request carries the secret (sandbox trusts its CA)', `code=${https.code} rc=${https.rc}`)
    ok(hj.headers?.['X-Injected']?.[0] === 'yes', 'inject: extra header added')
    // Node ships its own roots and Python's requests its own copy: the
    // sandbox's env points them at the bundle that holds its CA.
    const caEnv = await sh(sb, 'echo "$NODE_EXTRA_CA_CERTS|$SSL_CERT_FILE|$REQUESTS_CA_BUNDLE"')
    ok(caEnv.stdout.trim() === '/usr/local/share/ca-certificates/agentbox-egress.crt|/etc/ssl/certs/ca-certificates.crt|/etc/ssl/certs/ca-certificates.crt', 'inject: CA env vars set for Node and Python', caEnv.stdout.trim())
    const authOf = (out) => { try { return JSON.parse(out.trim().split('\n').pop()).headers?.Authorization?.[0] } catch { return undefined } }
    const nodeFetch = await sh(sb, `node -e "fetch('https://api.allowed.test/v1/models').then(r => r.text()).then(t => console.log(t), e => { console.log('ERR', e.cause?.code ?? e); process.exit(1) })"`)
    ok(authOf(nodeFetch.stdout) === hashed, 'inject: HTTPS from node fetch carries the secret (Node trusts the CA)', (nodeFetch.stdout + nodeFetch.stderr).slice(0, 300))
    const pyUrllib = await sh(sb, `python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.allowed.test/v1/models', timeout=8).read().decode())"`)
    ok(authOf(pyUrllib.stdout) === hashed, 'inject: HTTPS from python3 urllib carries the secret (Python trusts the CA)', (pyUrllib.stdout + pyUrllib.stderr).slice(-300))
    // Debian's Node also reads the system store; hide it to show that
    // NODE_EXTRA_CA_CERTS alone is enough (as for a Node with only its own
    // roots), and that without either the proxy's certificate is rejected.
    const probe = `node -e "fetch('https://api.allowed.test/').then(() => console.log('trusted'), e => console.log('rejected', e.cause?.code))"`
    const hidden = 'SSL_CERT_FILE=/nonexistent SSL_CERT_DIR=/nonexistent'
    const extraOnly = await sh(sb, `env ${hidden} ${probe}`)
    ok(extraOnly.stdout.trim() === 'trusted', 'inject: NODE_EXTRA_CA_CERTS alone makes Node trust the CA', extraOnly.stdout.trim() + extraOnly.stderr.slice(0, 200))
    const neither = await sh(sb, `env -u NODE_EXTRA_CA_CERTS ${hidden} ${probe}`)
    ok(neither.stdout.trim().startsWith('rejected'), 'inject: without the CA Node rejects the proxy certificate (control)', neither.stdout.trim())
    const plain = await curl(sb, 'http://api.allowed.test/v1/models')
    const pj = (() => { try { return JSON.parse(plain.body) } catch { return {} } })()
    ok(reached(plain) && pj.headers?.Authorization === undefined, 'inject: plain HTTP carries no secret without allowPlainHTTP', plain.body.slice(0, 200))
    // A Host header naming the rule's domain, sent to another address:
    // the proxy sends it where the domain resolves, never to the
    // sandbox's choice.
    const spoof = await curl(sb, `https://api.allowed.test/v1/spoof`, `--resolve api.allowed.test:443:${A}`)
    const sj = (() => { try { return JSON.parse(spoof.body) } catch { return {} } })()
    ok(sj.local === `${B}:443` && sj.headers?.Authorization?.[0] === hashed, 'inject: SNI spoofed to another address goes to the domain\'s own address', spoof.body.slice(0, 200))
    const untouched = await curl(sb, 'https://allowed.test/')
    ok(untouched.rc === 60, 'inject: a domain without rules is not terminated (the sandbox does not trust the fake CA)', `rc=${untouched.rc}`)
    // The secret is nowhere inside: env, files, process memory.
    const env = await sh(sb, `env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'`)
    ok(!env.stdout.includes(secret), 'secret absent: environment')
    const files = await sh(sb, `grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e '${secret}' / 2>/dev/null | head -5; echo done`)
    ok(files.stdout.trim() === 'done', 'secret absent: files', files.stdout)
    await sb.files.write('/tmp/memscan.py', `
import os, re, sys
needle = sys.argv[1].encode(); hits = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    if int(pid) == os.getpid(): continue
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines(); mem = open(f'/proc/{pid}/mem', 'rb', 0)
    except Exception: continue
    for line in maps:
        m = re.match(r'([0-9a-f]+)-([0-9a-f]+) r', line)
        if not m: continue
        a, b = int(m.group(1), 16), int(m.group(2), 16)
        if b - a > 512 << 20: continue
        try:
            mem.seek(a); chunk = mem.read(b - a)
        except Exception: continue
        if needle in chunk: hits.append(pid)
print('hits', sorted(set(hits)))`)
    // Split the needle so the scanner's own argv does not hold it whole.
    const mem = await sh(sb, `python3 /tmp/memscan.py "$(printf '%s%s' '${secret.slice(0, 10)}' '${secret.slice(10)}')"`)
    ok(mem.stdout.includes('hits []'), 'secret absent: process memory', mem.stdout + mem.stderr)
    const info = await Sandbox.getInfo(sb.sandboxId)
    ok(!JSON.stringify(info).includes(secret), 'secret absent: sandbox info')

    // ---- audit ----
    const logs = await api('GET', `/v2/sandboxes/${sb.sandboxId}/logs?kind=egress`)
    const entries = logs.json?.logEntries ?? logs.json?.logs ?? []
    const allowed = entries.find(e => JSON.stringify(e).includes('api.allowed.test') && JSON.stringify(e).includes('allowed'))
    ok(allowed, 'audit: allowed request recorded', JSON.stringify(allowed ?? logs.text.slice(0, 300)))
    await curl(sb, 'http://other.test/')
    await curl(sb, `http://${C}/`)
    const logs2 = await api('GET', `/v2/sandboxes/${sb.sandboxId}/logs?kind=egress`)
    const denied = (logs2.json?.logEntries ?? logs2.json?.logs ?? []).filter(e => JSON.stringify(e).includes('denied'))
    ok(denied.length >= 2, 'audit: denied lookups and connections recorded with a reason', JSON.stringify(denied.slice(-2)))

    // ---- bad input ----
    const bad = async (network, want) => {
      try { await create({ network }); ok(false, `bad input rejected: ${want}`) } catch (e) { ok(String(e.message).includes(want), `bad input rejected: ${want}`, e.message) }
    }
    await bad({ allowOut: ['300.1.1.0/24'] }, 'network.allowOut[0]')
    await bad({ denyOut: ['8.8.8.8', 'evil.com'] }, 'network.denyOut[1]')
    await bad({ allowOut: ['ok.test', 'bad domain'], denyOut: ['ALL_TRAFFIC'] }, 'network.allowOut[1]')
    await bad({ rules: { 'api.test': [{ transform: { headers: { Authorization: 'Bearer ${secrets.NOPE}' } } }] } }, 'secret "NOPE" does not exist')
    await bad({ rules: { '*': [{ transform: { headers: { A: 'b' } } }] } }, 'network.rules["*"]')
    const put400 = await api('PUT', `/sandboxes/${sb.sandboxId}/network`, { allowOut: ['1.2.3.4/33'] })
    ok(put400.status === 400 && put400.text.includes('network.allowOut[0]'), 'bad input: PUT network names the entry', put400.text)
    // Rules added live: processes started afterwards get the CA env too.
    {
      const live = await create({ network: { allowOut: ['api.allowed.test'], denyOut: ['ALL_TRAFFIC'] } })
      const none = await sh(live, 'echo "[$NODE_EXTRA_CA_CERTS]"')
      ok(none.stdout.trim() === '[]', 'live rules: no CA env while the sandbox has no rules', none.stdout.trim())
      await live.updateNetwork({ allowOut: ['api.allowed.test'], denyOut: ['ALL_TRAFFIC'], rules: { 'api.allowed.test': [{ transform: { headers: { Authorization: 'Bearer ${secrets.E2E_TOKEN}' } } }] } })
      // The system store hidden, as above: only the pushed env can make
      // this Node trust the proxy.
      const after = await sh(live, `env ${hidden} node -e "fetch('https://api.allowed.test/v1/models').then(r => r.text()).then(t => console.log(t), e => console.log('rejected', e.cause?.code))"`)
      ok(authOf(after.stdout) === hashed, 'live rules: node fetch after PUT network trusts the CA and carries the secret', (after.stdout + after.stderr).slice(0, 300))
      // The SDK's updateNetwork drops fields it does not know: the
      // agentbox extension goes through the REST call itself.
      const put = await api('PUT', `/sandboxes/${live.sandboxId}/network`, { allowOut: ['api.allowed.test'], denyOut: ['ALL_TRAFFIC'], rules: { 'api.allowed.test': [{ transform: { headers: { Authorization: 'Bearer ${secrets.E2E_TOKEN}' } }, allowPlainHTTP: true }] } })
      ok(put.status === 204, 'live rules: PUT network with allowPlainHTTP', put.text)
      const optIn = await curl(live, 'http://api.allowed.test/v1/plain')
      const oj = (() => { try { return JSON.parse(optIn.body) } catch { return {} } })()
      ok(oj.headers?.Authorization?.[0] === hashed, 'inject: plain HTTP carries the secret with allowPlainHTTP', optIn.body.slice(0, 200))
    }
    const del = await api('DELETE', '/secrets/E2E_TOKEN')
    ok(del.status === 204, 'secrets: deleted')
  }

  // ---- ports: web app and WebSocket through the gateway, traffic token, port-forward ----
  {
    const sb = await create({ network: { allowPublicTraffic: false } })
    ok(typeof sb.trafficAccessToken === 'string' && sb.trafficAccessToken.length > 10, 'traffic token issued')
    await sb.files.write('/tmp/ws.py', `
import socket, base64, hashlib, threading
def handle(c):
    req = b''
    while b'\\r\\n\\r\\n' not in req: req += c.recv(1024)
    key = [l.split(b': ')[1] for l in req.split(b'\\r\\n') if l.lower().startswith(b'sec-websocket-key')][0]
    acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + acc + b'\\r\\n\\r\\n')
    while True:
        h = c.recv(2)
        if len(h) < 2: return
        n = h[1] & 0x7f; mask = c.recv(4); data = bytearray(c.recv(n))
        for i in range(n): data[i] ^= mask[i % 4]
        c.sendall(bytes([0x81, n]) + bytes(data))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 8765)); s.listen()
while True:
    c, _ = s.accept(); threading.Thread(target=handle, args=(c,), daemon=True).start()`)
    await sb.files.write('/tmp/www/index.html', 'hello from the sandbox web app')
    await sb.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
    await sb.commands.run('python3 /tmp/ws.py', { background: true })
    await sh(sb, 'for i in $(seq 50); do curl -s localhost:8000 >/dev/null && break; sleep 0.1; done')
    const id = sb.sandboxId
    const tok = { 'e2b-traffic-access-token': sb.trafficAccessToken }
    const hostGet = (host, p, headers) => new Promise((resolve) => {
      const u = new URL(API)
      http.get({ host: u.hostname, port: u.port, path: p, headers: { ...headers, Host: host } }, (res) => {
        let b = ''; res.on('data', (d) => (b += d)); res.on('end', () => resolve({ status: res.statusCode, body: b, location: res.headers.location }))
      }).on('error', (e) => resolve({ status: 0, body: String(e) }))
    })
    let r = await hostGet(`8000-${id}.${DOMAIN}`, '/index.html', {})
    ok(r.status === 403, 'traffic token: missing token refused', String(r.status))
    r = await hostGet(`8000-${id}.${DOMAIN}`, '/index.html', tok)
    ok(r.status === 200 && r.body.includes('hello from the sandbox'), 'web app: Host route <port>-<id>.<domain> with token')
    r = await fetch(`${API}/index.html`, { headers: { ...tok, 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '8000' } })
    ok(r.status === 200, 'web app: header route')
    // The path form on the API's origin only redirects to the port's own
    // origin: https on the TLS listener, the domain's wildcard certificate.
    r = await fetch(`${API}/sandboxes/${id}/ports/8000/index.html`, { headers: tok, redirect: 'manual' })
    const tlsPortOf = process.env.E2E_TLS.split(':')[1]
    ok(r.status === 308 && r.headers.get('location') === `https://8000-${id}.${DOMAIN}:${tlsPortOf}/index.html`, 'web app: path form redirects to the port\'s own https origin', `${r.status} ${r.headers.get('location')}`)
    ok((await sh(sb, 'echo envd-still-works')).stdout.includes('envd-still-works'), 'traffic token: envd port exempt')

    // WebSocket echo through the gateway (Host route), by hand: Node 20 has
    // no WebSocket client.
    const u = new URL(API)
    const ws = await wsEcho(net.connect(Number(u.port), u.hostname), '/', `8765-${id}.${DOMAIN}`, sb.trafficAccessToken)
    ok(ws === 'ping-ws', 'WebSocket echo through the gateway', ws)

    // The TLS listener with the operator's wildcard certificate for
    // *.<domain>: the client resolves every name to it (as a wildcard DNS
    // record would) and verifies the certificate against its CA.
    const [tlsHost, tlsPort] = process.env.E2E_TLS.split(':')
    const ca = fs.readFileSync(process.env.E2E_TLS_CA)
    const lookup = (h, o, cb) => (o && o.all ? cb(null, [{ address: tlsHost, family: 4 }]) : cb(null, tlsHost, 4))
    const tlsGet = (host, p, headers = tok) => new Promise((resolve) => {
      https.get({ hostname: host, port: Number(tlsPort), path: p, headers, ca, lookup }, (res) => {
        let b = ''; res.on('data', (d) => (b += d)); res.on('end', () => resolve({ status: res.statusCode, body: b }))
      }).on('error', (e) => resolve({ status: 0, body: String(e) }))
    })
    const web = `8000-${id}.${DOMAIN}`
    r = await tlsGet(web, '/index.html')
    ok(r.status === 200 && r.body.includes('hello from the sandbox'), `TLS: https://${web} reaches the web app, certificate verified`, `status=${r.status} ${r.body.slice(0, 120)}`)
    r = await tlsGet(web, '/index.html', {})
    ok(r.status === 403, 'TLS: traffic token still required', String(r.status))
    const wrong = await new Promise((resolve) => {
      https.get({ hostname: '127.0.0.1', port: Number(tlsPort), path: '/', ca, servername: 'other.example' }, () => resolve('accepted'))
        .on('error', (e) => resolve(e.code ?? String(e)))
    })
    ok(wrong === 'ERR_TLS_CERT_ALTNAME_INVALID', 'TLS: the wildcard certificate does not cover other names', wrong)
    const wss = await wsEcho(tls.connect({ host: tlsHost, port: Number(tlsPort), servername: `8765-${id}.${DOMAIN}`, ca }), '/', `8765-${id}.${DOMAIN}`, sb.trafficAccessToken)
    ok(wss === 'ping-ws', 'TLS: WebSocket echo by Host route over wss://', wss)

    // agentbox port-forward (raw TCP through the server, API key auth).
    const pf = spawn(process.env.E2E_AGENTBOX ?? path.join(repo, 'bin/agentbox'), ['port-forward', id, ':8000', '--api-url', API, '--api-key', KEY])
    const local = await new Promise((resolve) => {
      pf.stdout.on('data', (d) => { const m = /127\.0\.0\.1:(\d+) -> 8000/.exec(String(d)); if (m) resolve(m[1]) })
      setTimeout(() => resolve(null), 5000)
    })
    if (local) {
      const pr = await fetch(`http://127.0.0.1:${local}/index.html`)
      ok(pr.status === 200 && (await pr.text()).includes('hello'), 'port-forward: local port reaches the sandbox app')
    } else ok(false, 'port-forward: started')
    pf.kill()
  }
} catch (e) {
  console.log('FAIL unexpected error', e)
  failures++
} finally {
  await Promise.all(sandboxes.map((s) => s.kill().catch(() => {})))
}
console.log(failures ? `${failures} failure(s)` : 'all network checks passed')
process.exit(failures ? 1 : 0)

// wsEcho upgrades c (plain or TLS) to a WebSocket at path, sends one masked
// text frame and resolves with the echoed text, or what went wrong.
function wsEcho(c, p, host, token) {
  return new Promise((resolve) => {
    const key = crypto.randomBytes(16).toString('base64')
    let buf = Buffer.alloc(0), upgraded = false
    c.on('data', (d) => {
      buf = Buffer.concat([buf, d])
      if (!upgraded) {
        const i = buf.indexOf('\r\n\r\n')
        if (i < 0) return
        if (!buf.slice(0, 12).toString().includes('101')) { c.destroy(); return resolve('no upgrade: ' + buf.slice(0, 60)) }
        upgraded = true; buf = buf.slice(i + 4)
        const msg = Buffer.from('ping-ws'), mask = crypto.randomBytes(4)
        const frame = Buffer.concat([Buffer.from([0x81, 0x80 | msg.length]), mask, Buffer.from(msg.map((b, j) => b ^ mask[j % 4]))])
        c.write(frame)
      }
      if (upgraded && buf.length >= 2 && buf.length >= 2 + buf[1]) { c.destroy(); resolve(buf.slice(2, 2 + buf[1]).toString()) }
    })
    c.on('error', (e) => resolve(String(e)))
    c.write(`GET ${p} HTTP/1.1\r\nHost: ${host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\ne2b-traffic-access-token: ${token}\r\n\r\n`)
    setTimeout(() => { c.destroy(); resolve('timeout') }, 5000)
  })
}
