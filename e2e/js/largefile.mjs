// Streams SIZE_MB MiB of random bytes into sandbox SANDBOX_ID with the
// official e2b SDK (files.write with a ReadableStream), reads them back
// (files.read with format 'stream'), and prints one JSON line: the sizes,
// the seconds each way and whether the SHA-256 of both sides match. Neither
// side holds more than a chunk: the bytes are made and hashed as they go.
import { createHash, randomFillSync } from 'node:crypto'
import { Sandbox } from 'e2b'

const id = process.env.SANDBOX_ID
const total = Number(process.env.SIZE_MB) * 1024 * 1024
const path = process.env.FILE_PATH || '/home/user/large.bin'
if (!id || !(total > 0)) throw new Error('set SANDBOX_ID and SIZE_MB')

const sbx = await Sandbox.connect(id)
const chunk = 1 << 20
const upHash = createHash('sha256')
let sent = 0
const body = new ReadableStream({
  pull(ctrl) {
    if (sent >= total) {
      ctrl.close()
      return
    }
    const b = randomFillSync(Buffer.allocUnsafe(Math.min(chunk, total - sent)))
    upHash.update(b)
    sent += b.length
    ctrl.enqueue(new Uint8Array(b.buffer, b.byteOffset, b.length))
  },
})
let t0 = performance.now()
await sbx.files.write(path, body)
const upSeconds = (performance.now() - t0) / 1000

const downHash = createHash('sha256')
let got = 0
t0 = performance.now()
const stream = await sbx.files.read(path, { format: 'stream', requestTimeoutMs: 0 })
for await (const c of stream) {
  downHash.update(c)
  got += c.length
}
const downSeconds = (performance.now() - t0) / 1000
const up = upHash.digest('hex')
const down = downHash.digest('hex')
console.log(JSON.stringify({ sent, got, upSeconds, downSeconds, same: up === down }))
