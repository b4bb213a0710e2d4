// Real parts for the client's tests: redis-server masters and the project's `redlockd`
// binary in front of them, started and stopped by scripts/client-bed (the launcher the
// Python and Go suites use too); a proxy that can lose answers.

import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

/** The project's root: the nearest folder above this file with a Cargo.toml (this file
 * runs from test/ and, compiled, from build/test/). */
function projectRoot() {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "Cargo.toml"))) {
    const up = resolve(dir, "..");
    if (up === dir) throw new Error("no Cargo.toml above the tests: they run from the project's checkout");
    dir = up;
  }
  return dir;
}

const ROOT = projectRoot();

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Poll `check` until it returns something truthy, or fail after `timeoutMs`. */
export async function waitFor(what, check, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let value;
    try {
      value = await check();
    } catch {
      value = undefined;
    }
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

const BED = join(ROOT, "scripts", "client-bed");

/** A process the test bed started for this suite (a master or a replica): a test may
 * pause, resume or stop it, by the PID the bed gave. */
class Started {
  constructor({ url, pid }) {
    this.url = url;
    this.pid = pid;
  }

  pause() {
    process.kill(this.pid, "SIGSTOP");
  }

  resume() {
    process.kill(this.pid, "SIGCONT");
  }

  stop() {
    process.kill(this.pid, "SIGCONT");
    process.kill(this.pid, "SIGKILL");
  }
}

/** The first line `stream` gives, or a rejection when it ends without one. */
function firstLine(stream) {
  return new Promise((ok, fail) => {
    let text = "";
    const onData = (chunk) => {
      text += chunk;
      const end = text.indexOf("\n");
      if (end >= 0) {
        stream.off("data", onData);
        ok(text.slice(0, end));
      }
    };
    stream.setEncoding("utf8");
    stream.on("data", onData);
    stream.once("end", () => fail(new Error("scripts/client-bed could not start the bed (see its stderr)")));
  });
}

/** Masters and `redlockd` replicas over them, from scripts/client-bed (the launcher every
 * client's suite uses). */
export class Cluster {
  static async start({ masters = 3, replicas = 1, env = {} } = {}) {
    const args = [BED, "--masters", String(masters), "--replicas", String(replicas)];
    for (const [key, value] of Object.entries(env)) args.push("--env", `${key}=${value}`);
    const bed = spawn("python3", args, { stdio: ["pipe", "pipe", "inherit"] });
    const started = JSON.parse(await firstLine(bed.stdout));
    const c = new Cluster();
    c.bed = bed;
    c.masters = started.masters.map((m) => new Started(m));
    c.replicas = started.replicas.map((r) => new Started(r));
    return c;
  }

  get urls() {
    return this.replicas.map((r) => r.url);
  }

  /** Close the bed's input: it stops everything it started. */
  stop() {
    this.bed.stdin.end();
  }
}

/** Forwards each HTTP request to `upstream` and, while `lose` is set, reads the upstream's
 * answer but closes the client's connection without it. Records each request's head. */
export class LosingProxy {
  static async start(upstream) {
    const p = new LosingProxy(new URL(upstream));
    await new Promise((ok) => p.server.listen(0, "127.0.0.1", ok));
    p.url = `http://127.0.0.1:${p.server.address().port}`;
    return p;
  }

  constructor(upstream) {
    this.url = "";
    this.lose = true;
    this.requests = [];
    this.server = net.createServer((client) => {
      let data = Buffer.alloc(0);
      let forwarded = false;
      client.on("error", () => {});
      client.on("data", (chunk) => {
        data = Buffer.concat([data, chunk]);
        const end = data.indexOf("\r\n\r\n");
        if (forwarded || end < 0) return;
        const head = data.subarray(0, end).toString();
        const length = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
        if (data.length < end + 4 + length) return;
        forwarded = true;
        this.requests.push(head);
        const up = net.connect(Number(upstream.port), upstream.hostname, () => up.write(data));
        up.on("error", () => client.destroy());
        up.once("data", (answer) => {
          if (!this.lose) client.write(answer);
          up.destroy();
          client.destroy();
        });
      });
    });
  }

  close() {
    this.server.close();
  }
}

/**
 * A lock's status, read on a connection of its own: a test that blocks the event loop (a
 * child process run synchronously) for longer than the server's client timeout would find
 * a pooled keep-alive connection closed under it ("other side closed").
 * @returns {Promise<any>}
 */
export function held(url, name) {
  return new Promise((resolve, reject) => {
    const req = http.get(`${url}/locks/${name}`, { agent: false }, (resp) => {
      let body = "";
      resp.setEncoding("utf8");
      resp.on("data", (chunk) => (body += chunk));
      resp.on("end", () => {
        try {
          resolve(JSON.parse(body));
        } catch (error) {
          reject(error);
        }
      });
    });
    req.on("error", reject);
  });
}
