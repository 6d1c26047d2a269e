// The web-page attacker in a real browser: team A logs into the dashboard
// in a tab, then the same tab opens a page team B's sandbox serves, which
// tries to get at A's key (same-tab storage, a service worker over the
// dashboard, same-origin fetches, cookies for the parent domain). Then the
// tab goes back to the dashboard, where a captured key would show.
//
// Input (environment): CHROMIUM, DASH (the dashboard's origin), KEY (team
// A's key), ATTACKS (JSON [{name, url}]: each url is opened after a fresh
// login, in a browser profile of its own). Output: one line
// "RESULT <json>" with what each attack got; origin_test.go judges it.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const dash = process.env.DASH;
const key = process.env.KEY;
const attacks = JSON.parse(process.env.ATTACKS);
const args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

async function login(page) {
  await page.goto(dash + "/dashboard/");
  await page.fill("#apikey", key);
  await page.click("#login button");
  await page.waitForSelector("#sandbox-rows tr", { timeout: 60_000 });
}

async function run(a) {
  const dir = await mkdtemp(join(tmpdir(), "agentbox-origin-"));
  const ctx = await chromium.launchPersistentContext(dir, { executablePath: process.env.CHROMIUM, headless: true, args });
  const out = { name: a.name };
  try {
    const page = ctx.pages()[0] || await ctx.newPage();
    await login(page);
    out.keyStored = await page.evaluate(() => Object.values(sessionStorage).join(" "));

    // The attacker's page, in the same tab.
    const resp = await page.goto(a.url + "?dash=" + encodeURIComponent(dash));
    out.status = resp ? resp.status() : 0;
    await page.waitForFunction(() => window.__report !== undefined, null, { timeout: 60_000 });
    out.report = await page.evaluate(() => window.__report);
    out.finalURL = page.url();

    // Back to the dashboard in the same tab: still logged in (the tab's
    // session is the one the page had its chance at), and no service
    // worker of the page's sits over it.
    await page.goto(dash + "/dashboard/");
    await page.waitForSelector("#sandbox-rows tr", { timeout: 60_000 });
    // Let a service worker of the page, if one controls the dashboard, see
    // a request carrying the key.
    await page.evaluate(() => fetch("/v2/sandboxes?limit=1", { headers: { "X-API-Key": sessionStorage.getItem("agentbox.apiKey") } }).catch(() => {}));
    out.after = await page.evaluate(async () => {
      const regs = navigator.serviceWorker ? await navigator.serviceWorker.getRegistrations() : [];
      let loot = "";
      try {
        const c = await caches.open("loot");
        const m = await c.match("/__loot");
        if (m) loot = await m.text();
      } catch (e) { loot = ""; }
      return {
        controlled: !!(navigator.serviceWorker && navigator.serviceWorker.controller),
        registrations: regs.map((r) => r.scope),
        loot,
        stillLoggedIn: !!sessionStorage.getItem("agentbox.apiKey"),
      };
    });
    out.dashCookies = (await ctx.cookies(dash)).map((c) => `${c.name}=${c.value}; domain=${c.domain}`);
  } catch (e) {
    out.error = String(e && e.stack || e);
  } finally {
    await ctx.close();
    await rm(dir, { recursive: true, force: true });
  }
  return out;
}

const results = [];
for (const a of attacks) results.push(await run(a));
console.log("RESULT " + JSON.stringify(results));
