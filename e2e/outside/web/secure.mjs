// Opens URL in Chromium and reports whether the page is a secure context.
// Input (environment): CHROMIUM, URL, RESOLVE (a --host-resolver-rules
// value: the test's domain has no DNS), SPKI (base64 SHA-256 of the
// certificate's public key, which Chromium then trusts like a public CA's).
// Output: one line "RESULT <json>".
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const dir = await mkdtemp(join(tmpdir(), "agentbox-secure-"));
const ctx = await chromium.launchPersistentContext(dir, {
  executablePath: process.env.CHROMIUM, headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=" + process.env.RESOLVE, "--ignore-certificate-errors-spki-list=" + process.env.SPKI],
});
const out = {};
try {
  const page = ctx.pages()[0] || await ctx.newPage();
  const resp = await page.goto(process.env.URL);
  out.status = resp ? resp.status() : 0;
  out.body = (await page.content()).slice(0, 200);
  Object.assign(out, await page.evaluate(() => ({ origin: location.origin, secure: window.isSecureContext })));
} catch (e) {
  out.error = String(e && e.stack || e);
} finally {
  await ctx.close();
  await rm(dir, { recursive: true, force: true });
}
console.log("RESULT " + JSON.stringify(out));
