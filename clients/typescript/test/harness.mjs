// Real parts for the client's tests: redis-server masters on free loopback ports, each in
// its own directory, and the project's `redlockd` binary in front of them; a proxy that can
// lose answers. Everything started here is stopped here, by PID.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

/** The project's root: the nearest folder above this file with a Cargo.toml (this file
 * runs from test/ and, compiled, from build/test/). */
function projectRoot() {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "Cargo.toml"))) {
    const up = resolve(dir, "..");
    if (up === dir) throw new Error("no Cargo.toml above the tests: set REDLOCKD_BIN");
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

export function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
  });
}

function binary() {
  if (process.env.REDLOCKD_BIN) return process.env.REDLOCKD_BIN;
  return join(process.env.CARGO_TARGET_DIR ?? join(ROOT, "target"), "debug", "redlockd");
}

function ping(port) {
  return new Promise((ok) => {
    const s = net.connect(port, "127.0.0.1");
    s.setTimeout(500, () => (s.destroy(), ok(false)));
    s.on("error", () => ok(false));
    s.on("connect", () => s.write("PING\r\n"));
    s.on("data", (d) => (s.destroy(), ok(d.toString().startsWith("+PONG"))));
  });
}

export class Master {
  static async start() {
    for (let i = 0; i < 5; i++) {
      const m = new Master(await freePort());
      if (await m.spawn()) return m;
    }
    throw new Error("could not start redis-server on a free port");
  }

  constructor(port) {
    this.port = port;
    this.dir = mkdtempSync(join(tmpdir(), "redlockd-ts-master-"));
  }

  async spawn() {
    this.proc = spawn("redis-server", ["--port", String(this.port), "--bind", "127.0.0.1", "--save", "",
      "--appendonly", "no", "--dir", this.dir, "--logfile", "redis.log"], { stdio: "ignore" });
    let exited = false;
    this.proc.once("exit", () => (exited = true));
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && !exited) {
      if (await ping(this.port)) return true;
      await sleep(20);
    }
    this.stop();
    return false;
  }

  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }

  pause() {
    process.kill(this.proc.pid, "SIGSTOP");
  }

  resume() {
    process.kill(this.proc.pid, "SIGCONT");
  }

  stop() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      process.kill(this.proc.pid, "SIGCONT");
      this.proc.kill("SIGKILL");
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export class Replica {
  static async start(masters) {
    const r = new Replica(await freePort(), masters);
    await waitFor(`redlockd on ${r.url} to be ready`, async () => {
      const resp = await fetch(`${r.url}/readyz`, { signal: AbortSignal.timeout(1000) });
      return (await resp.json()).ready;
    });
    return r;
  }

  constructor(port, masters) {
    this.url = `http://127.0.0.1:${port}`;
    this.proc = spawn(binary(), [], {
      stdio: "ignore",
      env: {
        PATH: process.env.PATH,
        REDLOCKD_LISTEN: `127.0.0.1:${port}`,
        REDLOCKD_REDIS_URLS: masters.map((m) => m.url).join(","),
        RUST_LOG: "warn",
      },
    });
  }

  stop() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGKILL");
  }
}

export class Cluster {
  static async start({ masters = 3, replicas = 1 } = {}) {
    const c = new Cluster();
    c.masters = await Promise.all(Array.from({ length: masters }, () => Master.start()));
    c.replicas = [];
    for (let i = 0; i < replicas; i++) c.replicas.push(await Replica.start(c.masters));
    return c;
  }

  get urls() {
    return this.replicas.map((r) => r.url);
  }

  stop() {
    for (const r of this.replicas) r.stop();
    for (const m of this.masters) m.stop();
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
