// Template.build() from the official e2b SDK against an agentbox server,
// then sandboxes from the built template. Prints one JSON line of results;
// the Go test (templates_test.go) checks them. Env: E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY, E2B_MODULE (path of e2b's index.mjs),
// TEMPLATE_NAME.
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const { Template, Sandbox, waitForPort } = await import(process.env.E2B_MODULE)
const here = path.dirname(fileURLToPath(import.meta.url))
const name = process.env.TEMPLATE_NAME || 'sdk-built'
const out = {}

const tpl = Template({ fileContextPath: path.join(here, 'context') })
  .fromTemplate('base')
  .setEnvs({ GREETING: 'hi', APP_MODE: 'test' })
  .copy('app', '/opt/app/')
  .runCmd('echo "$GREETING $(whoami)" > /tmp/built-as.txt && mkdir -p /opt/data && cp /tmp/built-as.txt /opt/data/', { user: 'root' })
  .setWorkdir('/opt/app')
  .runCmd('pwd > /opt/data/pwd.txt && id -un > /opt/data/user.txt', { user: 'root' })
  .setUser('user')
  .setStartCmd('python3 -m http.server 8000 --directory /opt/app', waitForPort(8000))

const logs = []
let t0 = Date.now()
const info = await Template.build(tpl, `${name}:v1`, { onBuildLogs: (e) => logs.push(e.message) })
out.coldMs = Date.now() - t0
out.info = info
t0 = Date.now()
const info2 = await Template.build(tpl, `${name}:v1`, { onBuildLogs: (e) => logs.push(e.message) })
out.cachedMs = Date.now() - t0
out.sameID = info2.templateId === info.templateId
out.logs = logs
out.exists = await Template.exists(name)

t0 = Date.now()
const sbx = await Sandbox.create(`${name}:v1`)
out.createMs = Date.now() - t0
const run = async (cmd) => (await sbx.commands.run(cmd)).stdout.trim()
out.hello = await run('cat /opt/app/app/hello.txt 2>/dev/null || cat /opt/app/hello.txt')
out.ignored = await run('ls /opt/app /opt/app/app 2>/dev/null | grep -c secret.log || true')
out.builtAs = await run('cat /opt/data/built-as.txt')
out.pwd = await run('cat /opt/data/pwd.txt')
out.env = await run('echo $GREETING-$APP_MODE')
out.whoami = await run('whoami')
out.cwd = await run('pwd')
// The start command serves /opt/app on :8000 and create waited for it.
out.served = await run('curl -s localhost:8000/hello.txt || curl -s localhost:8000/app/hello.txt')
out.sandboxID = sbx.sandboxId
await sbx.kill()

// A failing RUN: the build fails with the step's output and exit code.
try {
  await Template.build(Template().fromTemplate('base').runCmd('echo broken-step-output; exit 7'), `${name}-broken`)
  out.brokenError = null
} catch (e) {
  out.brokenError = String(e.message || e)
}
out.brokenExists = await Template.exists(`${name}-broken`)
console.log(JSON.stringify(out))
