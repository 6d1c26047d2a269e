// Bundles the dashboard into internal/dashboard/dist, which the server
// embeds. The output depends only on src/ and the locked packages, so a
// rebuild of an unchanged tree is byte-identical (CI checks it is fresh).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";

const out = new URL("../../internal/dashboard/dist/", import.meta.url).pathname;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const common = { bundle: true, minify: true, legalComments: "eof", logLevel: "warning", target: ["chrome110", "firefox115", "safari16"] };
await build({ ...common, entryPoints: ["src/main.js"], outfile: out + "app.js", format: "iife" });
await build({ ...common, entryPoints: ["src/app.css"], outfile: out + "app.css" });
copyFileSync("src/index.html", out + "index.html");
