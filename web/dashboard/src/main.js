// agentbox dashboard: a small page over the REST API. The API key lives in
// sessionStorage and travels in the X-API-Key header (for the terminal's
// WebSocket, as a subprotocol), never in a URL. Every string that comes from
// the server is put into the page as text (textContent), never as markup:
// sandbox metadata, file names and terminal output are tenant-controlled.
import { Terminal } from "@xterm/xterm";
import uPlot from "uplot";

const KEY = "agentbox.apiKey";
const $ = (id) => document.getElementById(id);

// h builds an element; string children become text nodes.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "className") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function showError(msg) {
  const el = $("error");
  el.textContent = msg;
  el.hidden = !msg;
  if (msg) setTimeout(() => { if (el.textContent === msg) el.hidden = true; }, 8000);
}

class HTTPError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

async function api(path, opts = {}) {
  const headers = { "X-API-Key": sessionStorage.getItem(KEY) || "", ...(opts.headers || {}) };
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(opts.json);
  }
  const r = await fetch(path, { method: opts.method || "GET", headers, body: opts.body, cache: "no-store", credentials: "omit" });
  if (r.status === 401) {
    logout("The API key was refused; log in again.");
    throw new HTTPError(401, "unauthenticated");
  }
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try { const b = await r.json(); if (b && b.message) msg = b.message; } catch { /* not JSON */ }
    throw new HTTPError(r.status, msg);
  }
  if (opts.raw) return r;
  if (r.status === 204) return null;
  return r.json();
}

// ---- routing ----

let cleanup = [];
function leave() { for (const f of cleanup) { try { f(); } catch { /* best effort */ } } cleanup = []; }
function every(ms, f) { f(); const t = setInterval(f, ms); cleanup.push(() => clearInterval(t)); }

function route() {
  leave();
  const main = $("main");
  main.replaceChildren();
  if (!sessionStorage.getItem(KEY)) { $("nav").hidden = true; return login(main); }
  $("nav").hidden = false;
  const [page, arg] = location.hash.slice(1).split("/");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + (page || "sandboxes"));
  const pages = { sandboxes, sandbox: () => sandboxPage(main, decodeURIComponent(arg || "")), audit: () => auditPage(main, decodeURIComponent(arg || "")), templates, pools, usage };
  (pages[page] || sandboxes)(main);
}

function logout(msg) {
  sessionStorage.removeItem(KEY);
  portOrigin = undefined;
  location.hash = "";
  route();
  if (msg) showError(msg);
}

function login(main) {
  const input = h("input", { id: "apikey", type: "password", autocomplete: "off", placeholder: "e2b_…", size: 50, required: true });
  main.append(h("h2", {}, "Log in"),
    h("p", { className: "muted" }, "Paste an API key (the server's ", h("code", {}, "<data-dir>/apikey"), " or one from ", h("code", {}, "agentbox apikey create"), "). It is kept in this tab only."),
    h("form", { id: "login", onsubmit: async (e) => {
      e.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      try { await api("/v2/sandboxes?limit=1"); } catch (err) { if (err.status !== 401) showError(err.message); return; }
      showError("");
      location.hash = "#sandboxes";
      route();
    } }, input, h("button", { type: "submit" }, "Log in")));
  input.focus();
}

// ---- sandboxes ----

function age(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function metaText(m) {
  return Object.entries(m || {}).map(([k, v]) => `${k}=${v}`).join("\n");
}

function sandboxes(main) {
  const tpl = h("input", { id: "new-template", value: "base", size: 20, "aria-label": "template" });
  const status = h("span", { className: "muted", id: "create-status" });
  const body = h("tbody", { id: "sandbox-rows" });
  main.append(h("h2", {}, "Sandboxes"),
    h("form", { id: "create", onsubmit: async (e) => {
      e.preventDefault();
      status.textContent = "creating…";
      try {
        const sb = await api("/v2/sandboxes", { method: "POST", json: { templateID: tpl.value.trim(), timeout: 600, metadata: { createdBy: "dashboard" } } });
        status.textContent = "";
        location.hash = "#sandbox/" + encodeURIComponent(sb.sandboxID);
      } catch (err) { status.textContent = ""; showError(err.message); }
    } }, h("label", {}, "Template ", tpl), h("button", { type: "submit", id: "create-button" }, "New sandbox"), status),
    h("table", {}, h("thead", {}, h("tr", {}, ["ID", "State", "Template", "Tier", "CPU / MiB", "Age", "Metadata"].map((t) => h("th", {}, t)))), body));
  every(3000, async () => {
    try {
      const list = await api("/v2/sandboxes?state=running,paused&limit=100");
      list.sort((a, b) => Date.parse(b.startedAt) - Date.parse(a.startedAt));
      body.replaceChildren(...list.map((s) => h("tr", { className: "link", "data-id": s.sandboxID, onclick: () => { location.hash = "#sandbox/" + encodeURIComponent(s.sandboxID); } },
        h("td", { className: "mono" }, s.sandboxID),
        h("td", { className: "state-" + s.state }, s.state),
        h("td", {}, s.alias || s.templateID),
        h("td", {}, s.isolation || ""),
        h("td", {}, `${s.cpuCount} / ${s.memoryMB}`),
        h("td", {}, age(s.startedAt)),
        h("td", { className: "meta mono" }, metaText(s.metadata)))));
      if (!list.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 7, className: "muted" }, "No sandboxes yet.")));
    } catch (err) { showError(err.message); }
  });
}

function sandboxPage(main, id) {
  const info = h("div", { id: "sandbox-info" });
  const plot = h("div", { id: "plot" });
  const term = h("div", { id: "terminal" });
  const files = h("div", { id: "files" });
  const ports = h("div", { id: "ports" });
  main.append(
    h("div", { className: "bar" }, h("a", { href: "#sandboxes" }, "← Sandboxes"), h("h2", { className: "mono" }, id),
      h("button", { type: "button", onclick: async () => {
        if (!confirm("Kill this sandbox?")) return;
        try { await api(`/sandboxes/${encodeURIComponent(id)}`, { method: "DELETE" }); location.hash = "#sandboxes"; } catch (err) { showError(err.message); }
      } }, "Kill"),
      h("a", { href: "#audit/" + encodeURIComponent(id) }, "Audit log")),
    h("div", { className: "panel" }, info),
    h("div", { className: "panel" }, h("h3", {}, "Ports"), ports),
    h("div", { className: "grid" },
      h("div", { className: "panel" }, h("h3", {}, "Terminal"), term),
      h("div", { className: "panel" }, h("h3", {}, "CPU and memory"), plot)),
    h("div", { className: "panel" }, h("h3", {}, "Files"), files));
  api(`/sandboxes/${encodeURIComponent(id)}`).then((s) => {
    info.replaceChildren(h("table", {}, h("tbody", {},
      [["State", s.state], ["Template", s.alias || s.templateID], ["Tier", s.isolation || ""], ["Started", `${s.startedAt} (${age(s.startedAt)} ago)`],
        ["Ends", s.endAt], ["CPU / memory", `${s.cpuCount} vCPU, ${s.memoryMB} MiB`], ["Metadata", metaText(s.metadata)]]
        .map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", { className: "meta", "data-field": k }, v))))));
  }).catch((err) => showError(err.message));
  portLinks(ports, id);
  metricsPlot(plot, id);
  terminal(term, id);
  fileBrowser(files, id, "/home/user");
}

// The server's port origin, asked once: where <port>-<id>.<domain> hosts
// are reached.
let portOrigin;
function portURL(id, port) {
  portOrigin ||= api("/dashboard/api/config");
  return portOrigin.then((c) => `${c.portScheme}://${port}-${id}.${c.portDomain}/`);
}

// portLinks links a port of the sandbox to its own origin, never to this
// page's: what the sandbox serves must not run where the key is kept. The
// link opens without an opener or a referrer.
function portLinks(el, id) {
  const port = h("input", { id: "port", type: "number", min: 1, max: 65535, value: 8000, size: 6, "aria-label": "port" });
  const link = h("a", { id: "port-link", target: "_blank", rel: "noopener noreferrer" });
  const update = async () => {
    const p = Number(port.value);
    if (!Number.isInteger(p) || p < 1 || p > 65535) { link.removeAttribute("href"); link.textContent = ""; return; }
    try {
      const url = await portURL(id, p);
      link.href = url;
      link.textContent = url;
    } catch (err) { portOrigin = undefined; showError(err.message); }
  };
  port.addEventListener("input", update);
  el.append(h("label", {}, "Port ", port), " ", link,
    h("p", { className: "muted" }, "Each port is served on an origin of its own; a server in the sandbox listening on 0.0.0.0 answers there."));
  update();
}

function metricsPlot(el, id) {
  const width = () => Math.max(300, el.clientWidth - 10);
  const u = new uPlot({
    width: width(), height: 300,
    series: [{}, { label: "CPU %", stroke: "#1a73e8", width: 2, scale: "%" }, { label: "Memory MiB", stroke: "#d93025", width: 2, scale: "mb" }],
    axes: [{}, { scale: "%", label: "CPU %" }, { scale: "mb", side: 1, label: "MiB", grid: { show: false } }],
    // The last ten minutes, whatever the points cover (one point alone
    // would otherwise stretch the axis over years).
    scales: { x: { time: true, range: () => { const now = Date.now() / 1000; return [now - 600, now]; } }, "%": { range: [0, 100] } },
  }, [[], [], []], el);
  cleanup.push(() => u.destroy());
  every(2000, async () => {
    try {
      const start = Math.floor(Date.now() / 1000) - 600;
      const pts = await api(`/sandboxes/${encodeURIComponent(id)}/metrics?start=${start}`);
      u.setData([pts.map((p) => p.timestampUnix), pts.map((p) => p.cpuUsedPct), pts.map((p) => p.memUsed / 1048576)]);
      el.dataset.points = String(pts.length);
      if (u.width !== width()) u.setSize({ width: width(), height: 300 });
    } catch (err) { if (err.status !== 404) showError(err.message); }
  });
}

function terminal(el, id) {
  const t = new Terminal({ cols: 80, rows: 18, fontSize: 13, convertEol: false, scrollback: 2000 });
  t.open(el);
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${proto}//${location.host}/dashboard/api/sandboxes/${encodeURIComponent(id)}/terminal?cols=${t.cols}&rows=${t.rows}`;
  const ws = new WebSocket(url, ["agentbox.terminal", "agentbox.key." + sessionStorage.getItem(KEY)]);
  ws.binaryType = "arraybuffer";
  const enc = new TextEncoder();
  ws.onopen = () => { el.dataset.state = "open"; t.focus(); };
  ws.onmessage = (e) => { t.write(new Uint8Array(e.data)); };
  ws.onclose = (e) => { el.dataset.state = "closed"; t.write(`\r\n[terminal closed${e.reason ? ": " + e.reason : ""}]\r\n`); };
  const input = t.onData((d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  const resize = t.onResize(({ cols, rows }) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ cols, rows })); });
  // The test (and a reader) gets the screen's text without touching markup.
  el.screenText = () => {
    const b = t.buffer.active;
    const lines = [];
    for (let i = 0; i < b.length; i++) lines.push(b.getLine(i)?.translateToString(true) ?? "");
    return lines.join("\n");
  };
  cleanup.push(() => { input.dispose(); resize.dispose(); ws.close(); t.dispose(); });
}

function fileBrowser(el, id, start) {
  const sid = encodeURIComponent(id);
  const dirInput = h("input", { id: "dir", value: start, size: 40, "aria-label": "directory" });
  const rows = h("tbody", { id: "file-rows" });
  const upload = h("input", { id: "upload", type: "file" });
  const list = async () => {
    try {
      const entries = await api(`/dashboard/api/sandboxes/${sid}/dir?path=${encodeURIComponent(dirInput.value)}`);
      entries.sort((a, b) => (b.dir - a.dir) || a.name.localeCompare(b.name));
      rows.replaceChildren(...entries.map((e) => h("tr", {},
        h("td", { className: "mono" }, e.dir
          ? h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); dirInput.value = e.path; list(); } }, e.name + "/")
          : e.name),
        h("td", {}, e.dir ? "" : String(e.size)),
        h("td", {}, e.dir ? "" : h("button", { type: "button", "data-path": e.path, onclick: () => download(e.path, e.name) }, "Download")))));
    } catch (err) { rows.replaceChildren(h("tr", {}, h("td", { colspan: 3, className: "muted" }, err.message))); }
  };
  const download = async (path, name) => {
    try {
      const r = await api(`/dashboard/api/sandboxes/${sid}/files?path=${encodeURIComponent(path)}`, { raw: true });
      const url = URL.createObjectURL(await r.blob());
      const a = h("a", { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) { showError(err.message); }
  };
  upload.addEventListener("change", async () => {
    const f = upload.files[0];
    if (!f) return;
    const dir = dirInput.value.replace(/\/+$/, "");
    try {
      await api(`/dashboard/api/sandboxes/${sid}/files?path=${encodeURIComponent(dir + "/" + f.name)}`, { method: "POST", body: f, headers: { "Content-Type": "application/octet-stream" } });
      upload.value = "";
      el.dataset.uploaded = f.name;
      await list();
    } catch (err) { showError(err.message); }
  });
  el.append(
    h("form", { onsubmit: (e) => { e.preventDefault(); list(); } }, dirInput, h("button", { type: "submit" }, "List"), h("label", {}, "Upload ", upload)),
    h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Bytes"), h("th", {}, ""))), rows));
  list();
}

// ---- audit log ----

const KINDS = ["", "lifecycle", "process", "file", "egress", "limit", "syscall", "ingress"];

function auditPage(main, id) {
  const sel = h("select", { id: "audit-sandbox", "aria-label": "sandbox" });
  const kind = h("select", { id: "audit-kind", "aria-label": "kind" }, KINDS.map((k) => h("option", { value: k }, k || "all kinds")));
  const text = h("input", { id: "audit-text", placeholder: "contains…", "aria-label": "text filter" });
  const rows = h("tbody", { id: "audit-rows" });
  const lifeRows = h("tbody", { id: "events-rows" });
  let entries = [];
  const render = () => {
    const q = text.value.toLowerCase();
    const shown = entries.filter((e) => !q || e.message.toLowerCase().includes(q));
    rows.replaceChildren(...shown.map((e) => h("tr", {}, h("td", { className: "mono" }, e.timestamp), h("td", {}, e.level), h("td", {}, e.fields?.kind || ""), h("td", { className: "meta" }, e.message))));
    if (!shown.length) rows.replaceChildren(h("tr", {}, h("td", { colspan: 4, className: "muted" }, "No events.")));
  };
  const load = async () => {
    if (!sel.value) return;
    try {
      const k = kind.value ? `&kind=${encodeURIComponent(kind.value)}` : "";
      entries = (await api(`/v2/sandboxes/${encodeURIComponent(sel.value)}/logs?limit=1000${k}`)).logs;
      render();
      // Lifecycle events (E2B's events API), oldest first.
      const evs = (await api(`/events/sandboxes/${encodeURIComponent(sel.value)}?limit=100`)).reverse();
      lifeRows.replaceChildren(...evs.map((e) => h("tr", {}, h("td", { className: "mono" }, e.timestamp), h("td", {}, e.type.replace(/^sandbox\.(lifecycle\.)?/, "")),
        h("td", { className: "meta mono" }, e.eventData ? JSON.stringify(e.eventData) : ""))));
      if (!evs.length) lifeRows.replaceChildren(h("tr", {}, h("td", { colspan: 3, className: "muted" }, "No lifecycle events.")));
    } catch (err) { showError(err.message); }
  };
  sel.addEventListener("change", load);
  kind.addEventListener("change", load);
  text.addEventListener("input", render);
  main.append(h("h2", {}, "Audit log"), h("div", { className: "bar" }, h("label", {}, "Sandbox ", sel), h("label", {}, "Kind ", kind), text, h("button", { type: "button", onclick: load }, "Refresh")),
    h("table", {}, h("thead", {}, h("tr", {}, ["Time", "Level", "Kind", "Event"].map((t) => h("th", {}, t)))), rows),
    h("h3", {}, "Lifecycle events"),
    h("table", {}, h("thead", {}, h("tr", {}, ["Time", "Event", "Data"].map((t) => h("th", {}, t)))), lifeRows));
  api("/v2/sandboxes?limit=100").then((list) => {
    const ids = list.map((s) => s.sandboxID);
    if (id && !ids.includes(id)) ids.unshift(id);
    sel.replaceChildren(...ids.map((i) => h("option", { value: i }, i)));
    if (id) sel.value = id;
    load();
  }).catch((err) => showError(err.message));
}

// ---- templates, pools, usage ----

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c)))) : h("tr", {}, h("td", { colspan: headers.length, className: "muted" }, "None."))));
}

async function templates(main) {
  const log = h("pre", { id: "build-log", className: "panel mono", hidden: true });
  main.append(h("h2", {}, "Templates"));
  const showLog = async (t) => {
    log.hidden = false;
    log.textContent = `build ${t.buildID} of ${t.templateID}: loading…`;
    try {
      const r = await api(`/templates/${encodeURIComponent(t.templateID)}/builds/${encodeURIComponent(t.buildID)}/logs`);
      const lines = (r.logs || []).map((e) => `${e.timestamp} ${e.level}${e.step ? " [" + e.step + "]" : ""} ${e.message}`);
      log.textContent = `build ${t.buildID} of ${t.templateID} (${t.buildStatus})\n` + (lines.join("\n") || "(no log lines)");
    } catch (err) {
      log.textContent = `build ${t.buildID} of ${t.templateID}: ${err.status === 404 ? "no build log on this server (built in, or built before it kept logs)" : err.message}`;
    }
  };
  try {
    const list = await api("/templates");
    main.append(table(["Template", "Names", "Build", "Status", "Builds", "CPU / MiB / disk MiB", "Spawns", "Updated", ""],
      list.map((t) => [h("span", { className: "mono" }, t.templateID), (t.names || t.aliases || []).join(", "), h("span", { className: "mono" }, t.buildID), t.buildStatus,
        String(t.buildCount), `${t.cpuCount} / ${t.memoryMB} / ${t.diskSizeMB}`, String(t.spawnCount), t.updatedAt,
        t.buildID ? h("button", { type: "button", onclick: () => showLog(t) }, "Build log") : ""])), log);
  } catch (err) { showError(err.message); }
}

async function pools(main) {
  main.append(h("h2", {}, "Warm pools"));
  try {
    const list = await api("/pools");
    main.append(table(["Template", "Ready", "Filling", "Min", "Target", "Hits"],
      list.map((p) => [p.template || p.templateID, String(p.ready), String(p.filling), String(p.min), String(p.target), String(p.hits)])));
  } catch (err) { showError(err.message); }
}

const num = (v, d = 1) => (typeof v === "number" ? v.toFixed(d) : "");

async function usage(main) {
  main.append(h("h2", {}, "Usage"));
  let u;
  try {
    u = await api("/usage");
  } catch (err) {
    if (err.status === 404) { main.append(h("p", { id: "usage-absent", className: "muted" }, "usage metering is not available on this server")); return; }
    showError(err.message);
    return;
  }
  const t = u.totals || {};
  main.append(h("p", {}, `Team ${u.teamID}, ${u.from} to ${u.to}`),
    table(["CPU seconds", "Memory GiB·s", "Disk GiB·h", "Snapshot GiB·h", "Egress bytes"],
      [[num(t.cpuSeconds), num(t.memoryGiBSeconds), num(t.diskGiBHours, 3), num(t.snapshotGiBHours, 3), String(t.egressBytes ?? "")]]),
    h("h3", {}, "Per sandbox"),
    table(["Sandbox", "Template", "CPU seconds", "Memory GiB·s", "Disk GiB·h", "Egress bytes"],
      (u.sandboxes || []).map((s) => [h("span", { className: "mono" }, s.sandboxID), s.templateID, num(s.cpuSeconds), num(s.memoryGiBSeconds), num(s.diskGiBHours, 3), String(s.egressBytes ?? "")])));
}

// ---- start ----

$("logout").addEventListener("click", () => logout(""));
window.addEventListener("hashchange", route);
route();
