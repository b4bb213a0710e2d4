// The README's install steps and examples, run as a newcomer follows them: a project of its
// own in a temporary folder, the client installed from this checkout, the tsconfig.json
// and the five lines compiled by TypeScript and run by Node, and the plain JavaScript form
// run by Node as it is. Only the checkout's path and the servers are put in.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Cluster, held } from "./harness.mjs";

const CLIENT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const ROOT = resolve(CLIENT, "../..");
const SERVERS = '"http://redlockd-0:8080", "http://redlockd-1:8080"';

function blocks(lang) {
  const readme = readFileSync(join(CLIENT, "README.md"), "utf8");
  return [...readme.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]);
}

// What the test stands in for: the user's own code. It checks that the lock is held with
// the very token it is given, and says so.
const SEND_REPORT = (typed) => `
async function sendReport({ fence, signal }${typed ? ": { fence: number; signal: AbortSignal }" : ""}) {
  if (signal.aborted) throw new Error("lost before the report");
  const held${typed ? ": any" : ""} = await (await fetch(process.env.CHECK_URL ?? "")).json();
  if (!held.held || held.fencing_token !== fence) throw new Error("not held: " + JSON.stringify(held));
  console.log("report sent with fence " + fence);
}
`;

function sh(line, cwd) {
  execFileSync("bash", ["-c", line], { cwd, stdio: ["ignore", "pipe", "inherit"] });
}

test("the README's install steps, tsconfig and examples run as written on Node 20", async () => {
  const [install] = blocks("sh");
  const [tsconfig] = blocks("json");
  const [fiveLines] = blocks("ts");
  const [plain] = blocks("js");
  assert.ok(install && tsconfig && fiveLines && plain, "the README has each block");
  assert.ok(fiveLines.includes("await using") && fiveLines.includes(SERVERS));

  const app = mkdtempSync(join(tmpdir(), "redlockd-ts-newcomer-"));
  const cluster = await Cluster.start({});
  try {
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "your-app", private: true, type: "module" }));
    for (const line of install.split("\n").filter((l) => l.trim() && !l.startsWith("#"))) {
      // The client is built already (the suite runs after its own build), and the packages
      // are in npm's cache: no download needed, but none forbidden either.
      if (line.startsWith("(cd /path/to/redlockd")) continue;
      sh(line.replaceAll("/path/to/redlockd", ROOT).replace(/ +#.*$/, "") + " --no-audit --no-fund --prefer-offline", app);
    }
    writeFileSync(join(app, "tsconfig.json"), tsconfig);
    const servers = cluster.urls.map((u) => JSON.stringify(u)).join(", ");
    writeFileSync(join(app, "main.ts"), fiveLines.replace(SERVERS, servers) + SEND_REPORT(true));
    writeFileSync(join(app, "main.mjs"), plain.replace(SERVERS, servers) + SEND_REPORT(false));
    const env = { ...process.env, CHECK_URL: `${cluster.urls[0]}/locks/nightly-report` };

    execFileSync("npx", ["tsc"], { cwd: app, env, stdio: ["ignore", "inherit", "inherit"] });
    for (const script of ["dist/main.js", "main.mjs"]) {
      const out = execFileSync("node", [script], { cwd: app, env, encoding: "utf8" });
      assert.match(out, /report sent with fence \d+/, script);
      assert.equal((await held(cluster.urls[0], "nightly-report")).held, false, `${script} released it`);
    }
  } finally {
    cluster.stop();
    rmSync(app, { recursive: true, force: true });
  }
});
