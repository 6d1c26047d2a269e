// Computer use with the official @e2b/desktop SDK against agentbox's builtin
// "desktop" template: the SDK starts the display and XFCE itself, then every
// input helper is checked by what the X server delivered (xev prints the
// events a window received), typing by what a shell in a terminal window did,
// screenshots by their pixels, and the stream by a VNC handshake through the
// gateway on the URL the SDK hands out.
//
// Environment (set by desktop_test.go, or by hand against any server):
//   E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY   the server under test

import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { inflateSync } from 'node:zlib'
import { randomBytes } from 'node:crypto'
import { Sandbox, CommandExitError } from '@e2b/desktop'

const MIN = 60_000
const WIDTH = 1280
const HEIGHT = 800

for (const k of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[k]) throw new Error(`set ${k} to the server under test`)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function waitFor(what, fn, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    last = await fn()
    if (last) return last
    await sleep(250)
  }
  assert.fail(`timed out waiting for ${what}`)
}

// sh runs a command and returns its stdout whatever its exit code.
async function sh(sbx, cmd) {
  try {
    return (await sbx.commands.run(cmd)).stdout
  } catch (err) {
    if (err instanceof CommandExitError) return err.stdout
    throw err
  }
}

// decodePNG decodes an 8-bit RGB or RGBA, non-interlaced PNG (what scrot
// writes) into { width, height, channels, pixels }.
function decodePNG(buf) {
  buf = Buffer.from(buf)
  assert.equal(buf.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'PNG signature')
  let off = 8
  let width, height, channels
  const idat = []
  while (off < buf.length) {
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    const data = buf.subarray(off + 8, off + 8 + len)
    if (type === 'IHDR') {
      width = data.readUInt32BE(0)
      height = data.readUInt32BE(4)
      assert.equal(data[8], 8, 'bit depth')
      assert.ok(data[9] === 2 || data[9] === 6, `colour type ${data[9]}`)
      assert.equal(data[12], 0, 'interlace')
      channels = data[9] === 2 ? 3 : 4
    } else if (type === 'IDAT') {
      idat.push(data)
    }
    off += 12 + len
  }
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const pixels = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? pixels[y * stride + x - channels] : 0
      const b = y > 0 ? pixels[(y - 1) * stride + x] : 0
      const c = x >= channels && y > 0 ? pixels[(y - 1) * stride + x - channels] : 0
      let p
      switch (filter) {
        case 0: p = 0; break
        case 1: p = a; break
        case 2: p = b; break
        case 3: p = (a + b) >> 1; break
        case 4: {
          const pa = Math.abs(b - c), pb = Math.abs(a - c), pc = Math.abs(a + b - 2 * c)
          p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c
          break
        }
        default: assert.fail(`PNG filter ${filter}`)
      }
      pixels[y * stride + x] = (line[x] + p) & 0xff
    }
  }
  return { width, height, channels, pixels }
}

// changedPixels counts the pixels inside rect that differ between two
// screenshots of the same size.
function changedPixels(a, b, { x, y, w, h }) {
  let n = 0
  for (let row = y; row < y + h; row++) {
    for (let col = x; col < x + w; col++) {
      const i = (row * a.width + col) * a.channels
      if (a.pixels[i] !== b.pixels[i] || a.pixels[i + 1] !== b.pixels[i + 1] || a.pixels[i + 2] !== b.pixels[i + 2]) n++
    }
  }
  return n
}

// geometry is a window's position and size, from xdotool.
async function geometry(sbx, id) {
  const out = await sh(sbx, `xdotool getwindowgeometry --shell ${id}`)
  const v = Object.fromEntries(out.trim().split('\n').map((l) => l.split('=')))
  return { x: Number(v.X), y: Number(v.Y), w: Number(v.WIDTH), h: Number(v.HEIGHT) }
}

// xevEvents parses what xev printed: one object per event with its type,
// button, keysym name, modifier state, the text it typed and its root
// position.
async function xevEvents(sbx, path) {
  const out = await sh(sbx, `cat ${path}`)
  return out.split('\n\n').map((block) => {
    const type = block.trim().split(' ')[0]
    const ev = { type }
    let m
    if ((m = block.match(/button (\d+)/))) ev.button = Number(m[1])
    if ((m = block.match(/keysym 0x[0-9a-f]+, ([^)]+)\)/))) ev.keysym = m[1]
    if ((m = block.match(/state (0x[0-9a-f]+)/))) ev.state = Number(m[1])
    if ((m = block.match(/XLookupString gives \d+ bytes: (?:\([0-9a-f]+\) )?"(.*)"/))) ev.text = m[1]
    if ((m = block.match(/root:\((-?\d+),(-?\d+)\)/))) ev.root = [Number(m[1]), Number(m[2])]
    return ev
  }).filter((ev) => /^(KeyPress|KeyRelease|ButtonPress|ButtonRelease|MotionNotify)$/.test(ev.type))
}

// websocket opens a websocket through the gateway to the sandbox port the
// host names and returns { read(n), write(bytes), close() } over its binary
// frames: enough to speak RFB to x11vnc through noVNC's websockify.
function websocket(hostHeader, path) {
  const api = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: api.hostname, port: api.port, path,
      headers: {
        Host: hostHeader, Connection: 'Upgrade', Upgrade: 'websocket',
        'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
        'Sec-WebSocket-Protocol': 'binary',
      },
    })
    req.on('response', (res) => reject(new Error(`websocket ${path}: HTTP ${res.statusCode}`)))
    req.on('error', reject)
    req.on('upgrade', (res, socket, head) => {
      let buf = head
      let data = Buffer.alloc(0)
      const waiters = []
      const pump = () => {
        while (buf.length >= 2) {
          let len = buf[1] & 0x7f, off = 2
          if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4 }
          else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10 }
          if (buf.length < off + len) return
          const opcode = buf[0] & 0x0f
          if (opcode === 2 || opcode === 0) data = Buffer.concat([data, buf.subarray(off, off + len)])
          buf = buf.subarray(off + len)
        }
      }
      const settle = () => {
        while (waiters.length && data.length >= waiters[0].n) {
          const w = waiters.shift()
          w.resolve(data.subarray(0, w.n))
          data = data.subarray(w.n)
        }
      }
      socket.on('data', (chunk) => { buf = Buffer.concat([buf, chunk]); pump(); settle() })
      socket.on('close', () => { for (const w of waiters.splice(0)) w.reject(new Error('websocket closed')) })
      pump()
      resolve({
        read: (n) => new Promise((res, rej) => { waiters.push({ n, resolve: res, reject: rej }); settle() }),
        write: (payload) => {
          const mask = randomBytes(4)
          const body = Buffer.from(payload).map((b, i) => b ^ mask[i % 4])
          socket.write(Buffer.concat([Buffer.from([0x82, 0x80 | body.length]), mask, body]))
        },
        close: () => socket.destroy(),
      })
    })
    req.end()
  })
}

// rfbSecurityTypes does the first steps of the RFB handshake and returns
// the security types the VNC server offers, with the socket to go on.
async function rfbSecurityTypes(ws) {
  const version = (await ws.read(12)).toString('latin1')
  assert.match(version, /^RFB 003\.00[378]\n$/, 'RFB greeting')
  ws.write(Buffer.from('RFB 003.008\n'))
  const [n] = await ws.read(1)
  assert.ok(n > 0, 'the VNC server offers a security type')
  return [...(await ws.read(n))]
}

describe('@e2b/desktop computer use', { timeout: 15 * MIN }, () => {
  let sbx

  before(async () => {
    sbx = await Sandbox.create('desktop', { resolution: [WIDTH, HEIGHT], dpi: 96, timeoutMs: 15 * MIN })
  })

  after(async () => {
    await sbx?.kill()
  })

  it('starts the display at the requested size with an XFCE session', async () => {
    assert.deepEqual(await sbx.getScreenSize(), { width: WIDTH, height: HEIGHT })
    for (const p of ['xfce4-session', 'xfwm4', 'xfdesktop']) {
      assert.notEqual((await sh(sbx, `pgrep -x ${p}`)).trim(), '', `${p} runs`)
    }
  })

  it('takes screenshots as PNG bytes of the screen size', async () => {
    const png = await sbx.screenshot()
    assert.ok(png instanceof Uint8Array, 'bytes')
    const img = decodePNG(png)
    assert.equal(img.width, WIDTH)
    assert.equal(img.height, HEIGHT)
    // XFCE paints its desktop and panel soon after the SDK saw its
    // processes: the screen stops being one flat colour.
    await waitFor('XFCE to paint the screen', async () => {
      const { pixels, channels } = decodePNG(await sbx.screenshot())
      const first = pixels.subarray(0, channels).toString('hex')
      let other = 0
      for (let i = 0; i < pixels.length; i += channels) {
        if (pixels.subarray(i, i + channels).toString('hex') !== first) other++
      }
      return other > 10_000
    })
  })

  it('moves the mouse and reads the cursor position', async () => {
    await sbx.moveMouse(321, 123)
    assert.deepEqual(await sbx.getCursorPosition(), { x: 321, y: 123 })
    await sbx.moveMouse(WIDTH - 1, HEIGHT - 1)
    assert.deepEqual(await sbx.getCursorPosition(), { x: WIDTH - 1, y: HEIGHT - 1 })
  })

  it('clicks, scrolls, drags, types and presses keys into a window', async () => {
    const log = '/tmp/xev.log'
    await (await sbx.commands.run(`stdbuf -oL xev -geometry 500x400+100+100 > ${log} 2>&1`, { background: true, timeoutMs: 0 })).disconnect()
    const id = await waitFor('the xev window', async () => (await sh(sbx, "xdotool search --onlyvisible --name '^Event Tester$'")).trim().split('\n')[0])
    const g = await geometry(sbx, id)
    const cx = g.x + Math.floor(g.w / 2), cy = g.y + Math.floor(g.h / 2)
    const inside = ([x, y]) => x >= g.x && x < g.x + g.w && y >= g.y && y < g.y + g.h
    let seen = 0
    // next returns the input events since the last call.
    const next = async (what, ok) => {
      let evs
      await waitFor(what, async () => {
        const all = await xevEvents(sbx, log)
        evs = all.slice(seen)
        if (!ok(evs)) return false
        seen = all.length
        return true
      }, 10_000)
      return evs
    }
    const presses = (evs) => evs.filter((e) => e.type === 'ButtonPress').map((e) => e.button)
    const keys = (evs) => evs.filter((e) => e.type === 'KeyPress')

    // The first click also gives the window the focus (click to focus).
    await sbx.leftClick(cx, cy)
    let evs = await next('a left click', (e) => presses(e).includes(1))
    assert.deepEqual(presses(evs), [1])
    assert.ok(evs.some((e) => e.type === 'ButtonRelease' && e.button === 1))
    assert.deepEqual(evs.find((e) => e.type === 'ButtonPress').root, [cx, cy], 'clicked where asked')

    await sbx.doubleClick(cx + 10, cy + 10)
    evs = await next('a double click', (e) => presses(e).length >= 2)
    assert.deepEqual(presses(evs), [1, 1])
    assert.deepEqual(evs.find((e) => e.type === 'ButtonPress').root, [cx + 10, cy + 10])

    await sbx.rightClick(cx, cy)
    assert.deepEqual(presses(await next('a right click', (e) => presses(e).length >= 1)), [3])
    await sbx.middleClick(cx, cy)
    assert.deepEqual(presses(await next('a middle click', (e) => presses(e).length >= 1)), [2])

    await sbx.scroll('up', 3)
    assert.deepEqual(presses(await next('scrolling up', (e) => presses(e).length >= 3)), [4, 4, 4])
    await sbx.scroll('down')
    assert.deepEqual(presses(await next('scrolling down', (e) => presses(e).length >= 1)), [5])

    const from = [g.x + 50, g.y + 60], to = [g.x + 300, g.y + 250]
    assert.ok(inside(to), 'the drag ends inside the window')
    await sbx.drag(from, to)
    evs = await next('a drag', (e) => e.some((x) => x.type === 'ButtonRelease'))
    const down = evs.find((e) => e.type === 'ButtonPress')
    const up = evs.find((e) => e.type === 'ButtonRelease')
    assert.equal(down.button, 1)
    assert.deepEqual(down.root, from, 'the drag presses at its start')
    assert.deepEqual(up.root, to, 'and releases at its end')
    assert.ok(evs.some((e) => e.type === 'MotionNotify' && (e.state & 0x100) && e.root[0] === to[0] && e.root[1] === to[1]),
      'the pointer moved to the end with button 1 held')

    const text = "Hi agentbox, it's me!"
    await sbx.write(text)
    evs = await next('the typed text', (e) => keys(e).map((k) => k.text).join('') === text)
    assert.equal(keys(evs).map((k) => k.text).join(''), text)

    await sbx.press('enter')
    assert.deepEqual(keys(await next('Return', (e) => keys(e).length >= 1)).map((k) => k.keysym), ['Return'])

    await sbx.press(['ctrl', 'shift', 'a'])
    evs = keys(await next('the hotkey', (e) => keys(e).length >= 3))
    assert.deepEqual(evs.map((k) => k.keysym).slice(0, 2), ['Control_L', 'Shift_L'])
    const a = evs[2]
    assert.equal(a.keysym, 'A', 'a with shift held')
    assert.equal(a.state & 0x5, 0x5, 'pressed with shift and control held')
  })

  it('writes into a terminal it launched: a shell runs what was typed, a screenshot shows it', async () => {
    await sbx.launch('xfce4-terminal')
    const id = await waitFor('a terminal window', async () => {
      const ids = (await sh(sbx, 'xdotool search --onlyvisible --class xfce4-terminal')).trim()
      return ids && ids.split('\n')[0]
    })
    await sh(sbx, `xdotool windowactivate --sync ${id}`)
    assert.equal(await sbx.getCurrentWindowId(), id, 'the terminal has the focus')
    assert.match(await sbx.getWindowTitle(id), /Terminal/)
    const g = await geometry(sbx, id)
    // Leave the pointer out of the window so only the text changes it.
    await sbx.moveMouse(WIDTH - 2, Math.floor(HEIGHT / 2))
    // A prompt, then the shot before.
    await sbx.wait(1000)
    const before = decodePNG(await sbx.screenshot())

    const word = `typed-${randomBytes(3).toString('hex')}`
    await sbx.write(`echo ${word} > /tmp/typed.txt`)
    await sbx.press('enter')
    assert.equal(await waitFor('the typed command to run', async () => (await sh(sbx, 'cat /tmp/typed.txt 2>/dev/null')).trim()), word)

    const afterShot = decodePNG(await sbx.screenshot())
    const changed = changedPixels(before, afterShot, g)
    assert.ok(changed > 400, `the typed line shows in the terminal (${changed} pixels changed)`)

    // A hotkey reaches the terminal: ctrl+c interrupts the shell's sleep.
    await sbx.write('sleep 300')
    await sbx.press('enter')
    await waitFor('sleep to run', async () => (await sh(sbx, 'pgrep -x sleep')).trim() !== '')
    await sbx.press(['ctrl', 'c'])
    await sbx.write('echo rc=$? > /tmp/rc.txt')
    await sbx.press('enter')
    assert.equal(await waitFor('the exit status', async () => (await sh(sbx, 'cat /tmp/rc.txt 2>/dev/null')).trim()), 'rc=130')
  })

  it('opens a file in its default application', async () => {
    await sbx.files.write('/home/user/notes-agentbox.txt', 'opened by xdg-open\n')
    await sbx.open('/home/user/notes-agentbox.txt')
    const id = await waitFor('the editor window', async () => {
      const ids = (await sh(sbx, "xdotool search --onlyvisible --name 'notes-agentbox'")).trim()
      return ids && ids.split('\n')[0]
    })
    assert.match(await sbx.getWindowTitle(id), /notes-agentbox\.txt/)
    assert.ok((await sbx.getApplicationWindows('mousepad')).includes(id), 'Mousepad opened it')
  })

  it('opens a URL in the browser', async () => {
    // file:// keeps it offline; xdg-open hands URLs to the default browser.
    await sbx.files.write('/home/user/page.html', '<title>agentbox-page</title><h1>hello</h1>')
    await sbx.open('file:///home/user/page.html')
    const id = await waitFor('the browser window', async () => {
      const ids = (await sh(sbx, "xdotool search --onlyvisible --name 'agentbox-page'")).trim()
      return ids && ids.split('\n')[0]
    }, 60_000)
    assert.match(await sbx.getWindowTitle(id), /agentbox-page.*Chromium/)
  })

  it('streams the desktop through noVNC on port 6080 behind the gateway', async () => {
    await sbx.stream.start()
    const url = new URL(sbx.stream.getUrl())
    assert.equal(url.host, sbx.getHost(6080))
    assert.equal(url.pathname, '/vnc.html')
    assert.equal(url.searchParams.get('autoconnect'), 'true')
    assert.equal(url.searchParams.get('resize'), 'scale')

    // The page the URL names, through the gateway by Host.
    const api = new URL(process.env.E2B_SANDBOX_URL)
    const get = (path) => new Promise((resolve, reject) => {
      http.get({ host: api.hostname, port: api.port, path, headers: { Host: url.host } }, (res) => {
        let body = ''
        res.on('data', (c) => (body += c))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      }).on('error', reject)
    })
    const page = await get(url.pathname + url.search)
    assert.equal(page.status, 200)
    assert.match(page.body, /<title>noVNC<\/title>/)
    const rfb = await get('/core/rfb.js')
    assert.equal(rfb.status, 200, 'noVNC scripts load')

    // What the page's client does next: a websocket to /websockify carrying
    // RFB to x11vnc, which serves the SDK's display at its size.
    const ws = await websocket(url.host, '/websockify')
    try {
      const types = await rfbSecurityTypes(ws)
      assert.ok(types.includes(1), `no password asked (security types ${types})`)
      ws.write(Buffer.from([1]))
      assert.equal((await ws.read(4)).readUInt32BE(0), 0, 'security result OK')
      ws.write(Buffer.from([1])) // ClientInit, shared
      const init = await ws.read(4)
      assert.deepEqual([init.readUInt16BE(0), init.readUInt16BE(2)], [WIDTH, HEIGHT], 'the stream is the SDK display')
    } finally {
      ws.close()
    }

    await assert.rejects(sbx.stream.start(), /already running/)
    await sbx.stream.stop()
    await waitFor('x11vnc to stop', async () => (await sh(sbx, 'pgrep -x x11vnc')).trim() === '')
  })

  it('streams with a password when asked to', async () => {
    await sbx.stream.start({ requireAuth: true })
    const key = sbx.stream.getAuthKey()
    assert.match(key, /^[A-Za-z0-9]{16}$/)
    const url = new URL(sbx.stream.getUrl({ authKey: key }))
    assert.equal(url.searchParams.get('password'), key)
    const ws = await websocket(url.host, '/websockify')
    try {
      assert.deepEqual(await rfbSecurityTypes(ws), [2], 'VNC authentication only')
    } finally {
      ws.close()
    }
    await sbx.stream.stop()
  })
})
