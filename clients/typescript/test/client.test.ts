// The client against real masters and the redlockd binary.

import assert from "node:assert/strict";
import { test } from "node:test";

import { BadRequest, Client, LeaseLost, LockHeld, Unavailable } from "../src/index.js";
import { Cluster, LosingProxy, held, sleep, waitFor } from "./harness.mjs";

async function withCluster(options: { replicas?: number }, fn: (cluster: any) => Promise<void>) {
  const cluster = await Cluster.start(options);
  try {
    await fn(cluster);
  } finally {
    cluster.stop();
  }
}

test("the README example holds a lock with auto-renew and releases it with await using", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    {
      await using lease = await client.lock("report", { ttlMs: 1000 });
      await sleep(3000);
      lease.ensureValid();
      assert.equal(lease.signal.aborted, false);
      assert.equal((await held(cluster.urls[0], "report")).fencing_token, lease.fencingToken);
    }
    assert.equal((await held(cluster.urls[0], "report")).held, false);
  }));

test("auto-renew carries on through a replica's death", () =>
  withCluster({ replicas: 2 }, async (cluster) => {
    const [a, b] = cluster.replicas;
    const client = new Client({ servers: [a.url, b.url] });
    const lease = await client.lock("failover", { ttlMs: 1000 });
    a.stop();
    await sleep(3000);
    lease.ensureValid();
    assert.equal((await held(b.url, "failover")).fencing_token, lease.fencingToken);
    await lease.release();
    assert.equal((await held(b.url, "failover")).held, false);
  }));

test("the signal aborts when a majority of masters stop", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const told: (string | undefined)[] = [];
    const lease = await client.lock("majority", { ttlMs: 1000, onLost: (l) => told.push(l.lostReason) });
    const granted = performance.now();
    for (const m of cluster.masters.slice(0, 2)) m.pause();
    try {
      await waitFor("the lease to be lost", () => lease.signal.aborted, 5000);
      assert.ok(performance.now() - granted < 1250, "no later than the validity, near enough");
      assert.ok(lease.signal.reason instanceof LeaseLost);
      assert.deepEqual(told, ["expired"]);
      assert.throws(() => lease.ensureValid(), LeaseLost);
      await assert.rejects(client.lock("other", { ttlMs: 1000 }), Unavailable);
    } finally {
      for (const m of cluster.masters.slice(0, 2)) m.resume();
    }
  }));

test("jeopardy is told before the loss, and safe when a renew gets through", () =>
  withCluster({}, async (cluster) => {
    const told: [string, unknown, number?][] = [];
    const client = new Client({
      servers: cluster.urls,
      onJeopardy: (held, leftMs) => told.push(["jeopardy", held, leftMs]),
      onSafe: (held) => told.push(["safe", held]),
    });
    const lease = await client.lock("shaky", { ttlMs: 1500 });
    for (const m of cluster.masters.slice(0, 2)) m.pause();
    try {
      await waitFor("jeopardy", () => told.length > 0, 5000);
      assert.ok(lease.inJeopardy);
    } finally {
      for (const m of cluster.masters.slice(0, 2)) m.resume();
    }
    const [kind, held, leftMs] = told[0];
    assert.equal(kind, "jeopardy");
    assert.equal(held, lease);
    assert.ok(leftMs !== undefined && leftMs > 0 && leftMs <= 550, String(leftMs));
    await waitFor("safe", () => told.length > 1, 5000);
    assert.deepEqual(told.slice(1), [["safe", lease]]);
    assert.equal(lease.inJeopardy, false);
    lease.ensureValid();
    await lease.release();
  }));

test("jeopardy is told before the loss when the replica stops answering", () =>
  withCluster({}, async (cluster) => {
    // A renew that hangs (the replica paused) ends at the jeopardy point, not at the end
    // of the validity: the warning comes first, with time left.
    const told: [string, number?][] = [];
    const client = new Client({
      servers: cluster.urls,
      onJeopardy: (_held, leftMs) => told.push(["jeopardy", leftMs]),
      onSafe: () => told.push(["safe"]),
    });
    const lease = await client.lock("hangs", { ttlMs: 3000 });
    cluster.replicas[0].pause();
    try {
      await waitFor("the lease to be lost", () => lease.signal.aborted, 6000);
    } finally {
      cluster.replicas[0].resume();
    }
    assert.equal(told[0]?.[0], "jeopardy", JSON.stringify(told));
    assert.ok((told[0][1] ?? 0) >= 500, `told with only ${told[0][1]} ms left`);
    assert.equal(lease.lostReason, "expired");
  }));

test("the lock is released when the scope throws", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    await assert.rejects(async () => {
      await using lease = await client.lock("throws", { ttlMs: 30_000 });
      assert.equal((await held(cluster.urls[0], "throws")).fencing_token, lease.fencingToken);
      throw new Error("boom");
    }, /boom/);
    assert.equal((await held(cluster.urls[0], "throws")).held, false);
  }));

test("errors are typed", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const lease = await client.lock("typed", { ttlMs: 30_000 });
    const err = await client.lock("typed", { waitMs: 50 }).catch((e: unknown) => e);
    assert.ok(err instanceof LockHeld, String(err));
    assert.ok(err.retryAfterMs > 25_000 && err.retryAfterMs <= 30_000);
    await assert.rejects(client.lock("no spaces"), (e: any) => e instanceof BadRequest && e.code === "invalid_request");
    await lease.release();
    const nobody = new Client({ servers: "http://127.0.0.1:9", timeoutMs: 500 });
    await assert.rejects(nobody.lock("typed"), Unavailable);
  }));

test("a grant whose answer is lost is retried with its Idempotency-Key", () =>
  withCluster({ replicas: 2 }, async (cluster) => {
    const [a, b] = cluster.replicas;
    const proxy = await LosingProxy.start(a.url);
    try {
      const client = new Client({ servers: [proxy.url, b.url] });
      const lease = await client.lock("lost-answer", { ttlMs: 30_000 });
      assert.equal(proxy.requests.length, 1, "the first attempt went through the proxy");
      assert.match(proxy.requests[0], /idempotency-key: \S+/i);
      assert.equal((await held(b.url, "lost-answer")).fencing_token, lease.fencingToken);
      await lease.release();
      assert.equal((await held(b.url, "lost-answer")).held, false, "one release frees it: one lease");
    } finally {
      proxy.close();
    }
  }));

test("once per tick runs on one of eight instances", () =>
  withCluster({}, async (cluster) => {
    const ran: number[] = [];
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        new Client({ servers: cluster.urls }).runOncePerTick("tick:1", () => ran.push(i), { holdAtLeastMs: 500 }),
      ),
    );
    assert.equal(ran.length, 1);
    assert.equal(results.filter((r) => r.ran).length, 1);
  }));

test("campaign, proclaim, observe, resign", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const stop = new AbortController();
    const events: any[] = [];
    const following = (async () => {
      for await (const e of client.observe("primary", stop.signal)) {
        events.push(e);
        if (events.length === 4) stop.abort();
      }
    })();
    let term = 0;
    try {
      await waitFor("the observer's first event", () => events.length > 0);
      const leader = await client.campaign("primary", "10.0.0.1:5432", { ttlMs: 2000 });
      term = leader.term;
      assert.equal((await client.leader("primary"))?.term, leader.term);
      // An observer is told what it reads on each change; a change undone before its read
      // can go unseen, so each step waits for the observer to have seen the last.
      await waitFor("the observer to see the election", () => events.length >= 2);
      await leader.proclaim("10.0.0.1:5433");
      await waitFor("the observer to see the proclaim", () => events.length >= 3);
      await leader.release();
      await waitFor("four events", () => events.length >= 4);
    } finally {
      // An observer reconnects for as long as it is not stopped.
      stop.abort();
      await following;
    }
    assert.deepEqual(events.map((e: any) => e.kind), ["vacant", "elected", "proclaimed", "vacant"]);
    assert.equal(events[2].value, "10.0.0.1:5433");
    assert.equal(events[1].term, term);
    assert.equal(events[2].term, term);
    assert.equal(await client.leader("primary"), null);
  }));


test("the stream-consumers example processes each message once", () =>
  withCluster({}, async (cluster) => {
    const script = new URL("../../../examples/typescript/stream-consumers.js", import.meta.url);
    const { execFile } = await import("node:child_process");
    const out = await new Promise<string>((resolve, reject) =>
      execFile(process.execPath, [script.pathname, "40", "4"], { env: { ...process.env, REDLOCKD_SERVER: cluster.urls[0] } },
        (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout))),
    );
    assert.match(out, /messages processed: 40 of 40, each once: true/);
  }));

test("every request carries the caller's trace context", async () => {
  // A stand-in replica that records each request's headers and answers a lease.
  const { createServer } = await import("node:http");
  const seen: Array<[string, string | undefined]> = [];
  const replica = createServer((req, res) => {
    seen.push([req.method ?? "", req.headers.traceparent as string | undefined]);
    req.resume();
    req.on("end", () => {
      if (req.method === "POST") {
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify({ name: "t", lease_id: "L1", fencing_token: 7, ttl_ms: 30000, validity_ms: 29000, expires_at: "2026-11-24T00:00:00.000Z" }));
      } else {
        res.writeHead(204).end();
      }
    });
  });
  await new Promise<void>((ok) => replica.listen(0, "127.0.0.1", ok));
  const { port } = replica.address() as { port: number };
  const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  try {
    const client = new Client({ servers: [`http://127.0.0.1:${port}`], traceparent: () => parent });
    const lease = await client.lock("t", { autoRenew: false });
    await lease.release();
    assert.deepEqual(seen, [["POST", parent], ["DELETE", parent]]);
    const plain = new Client({ servers: [`http://127.0.0.1:${port}`] });
    await (await plain.lock("t", { autoRenew: false })).release();
    assert.equal(seen[2][1], undefined, "no trace context, no header");
  } finally {
    replica.close();
  }
});

test("inspect is typed, and a waiting grant given up by its signal leaves nothing held", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const holder = await client.lock("busy", { ttlMs: 30_000, owner: "a" });
    const status = await client.inspect("busy");
    assert.deepEqual(
      [status.held, status.fencingToken, status.owner],
      [true, holder.fencingToken, "a"],
    );
    const giveUp = new AbortController();
    const waiting = client.lock("busy", { waitMs: 2000, signal: giveUp.signal });
    await sleep(200);
    const abortedAt = performance.now();
    giveUp.abort(new Error("the caller gave up"));
    await assert.rejects(waiting, /the caller gave up/);
    assert.ok(performance.now() - abortedAt < 500, "rejected at once");
    // Whether the server dropped the abandoned grant or won it as the holder let go (the
    // client then releases it once the wait is over), nothing stays held.
    await holder.release();
    await waitFor("the abandoned grant to be released", async () => {
      const now = await client.inspect("busy");
      return now.held ? undefined : true;
    }, 8000);
    const inspectGivenUp = new AbortController();
    inspectGivenUp.abort(new Error("not wanted"));
    await assert.rejects(client.inspect("busy", { signal: inspectGivenUp.signal }), /not wanted/);
  }));

test("a permit is a lease on one of limit slots, renewed, with a loss signal", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const told: (string | undefined)[] = [];
    await using first = await client.permit("db-pool", 2, { ttlMs: 1000, owner: "ts-1" });
    const second = await client.permit("db-pool", 2, { ttlMs: 1000, onLost: (l) => told.push(l.lostReason) });
    assert.deepEqual(new Set([first.slot, second.slot]), new Set([0, 1]));
    assert.equal(first.limit, 2);
    await assert.rejects(client.permit("db-pool", 2, { ttlMs: 1000 }), LockHeld);
    await sleep(3000);
    first.ensureValid();
    const status = await client.semaphore("db-pool");
    assert.deepEqual(status.holders.map((h) => h.slot), [0, 1]);
    assert.deepEqual(
      status.holders.filter((h) => h.slot === first.slot).map((h) => [h.fencingToken, h.owner]),
      [[first.fencingToken, "ts-1"]],
    );
    await fetch(`${cluster.urls[0]}/semaphores/db-pool/leases/${second.leaseId}`, { method: "DELETE" });
    await waitFor("the released permit to be lost", () => second.signal.aborted, 2000);
    assert.deepEqual(told, ["lease_not_found"]);
  }));

test("shared leases hold a lock together and an exclusive one waits for them", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const r1 = await client.lock("file", { ttlMs: 1000, mode: "shared", owner: "reader-1" });
    const r2 = await client.lock("file", { ttlMs: 1000, mode: "shared", owner: "reader-2" });
    assert.deepEqual([r1.mode, r2.mode], ["shared", "shared"]);
    await assert.rejects(client.lock("file", { ttlMs: 1000 }), LockHeld);
    const status = await client.inspect("file");
    assert.equal(status.mode, "shared");
    assert.deepEqual(status.holders?.map((h) => h.owner).sort(), ["reader-1", "reader-2"]);
    const writer = client.lock("file", { ttlMs: 1000, waitMs: 5000 });
    await r1.release();
    await r2.release();
    const w = await writer;
    assert.equal(w.mode, "exclusive");
    assert.ok(w.fencingToken > Math.max(r1.fencingToken, r2.fencingToken));
    await w.release();
  }));

test("several names are one lease, all or none", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const one = await client.lock("acct:1", { ttlMs: 30_000 });
    await assert.rejects(client.lockMany(["acct:2", "acct:1"], { ttlMs: 1000 }), LockHeld);
    assert.equal((await held(cluster.urls[0], "acct:2")).held, false);
    await one.release();
    const both = await client.lockMany(["acct:2", "acct:1"], { ttlMs: 1000 });
    assert.deepEqual(both.names, ["acct:1", "acct:2"]);
    await sleep(2500);
    both.ensureValid();
    for (const name of both.names) assert.equal((await held(cluster.urls[0], name)).fencing_token, both.fencingToken);
    await both.release();
    assert.equal((await held(cluster.urls[0], "acct:2")).held, false);
  }));

test("a session holds a lock, a permit and a shared lock with one heartbeat, and ends them together", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    {
      await using session = await client.session({ ttlMs: 1000 });
      const lock = await session.lock("s:lock");
      const permit = await session.permit("s:pool", 1);
      const shared = await session.lock("s:doc", { mode: "shared" });
      await sleep(2000); // only the session is renewed
      for (const lease of [lock, permit, shared]) lease.ensureValid();
      assert.equal((await held(cluster.urls[0], "s:lock")).held, true);
      assert.equal(((await session.info()).holds as unknown[]).length, 3);
      await assert.rejects(client.lock("s:lock", { ttlMs: 1000 }), LockHeld);
    }
    assert.equal((await held(cluster.urls[0], "s:lock")).held, false);
    assert.equal((await held(cluster.urls[0], "s:doc")).held, false);
    assert.deepEqual((await client.semaphore("s:pool")).holders, []);
  }));

test("a session renew marks a force-released hold lost and keeps the others", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    await using session = await client.session({ ttlMs: 5000 });
    const forced = await session.lock("s:forced");
    const kept = await session.lock("s:kept");
    // An administrator takes the lock away: the next renew does not keep it.
    assert.equal((await fetch(`${cluster.urls[0]}/locks/s:forced`, { method: "DELETE" })).status, 200);
    // The renew that names it lost has its answer lost (sent past the client); the
    // client's own renew after it must still stop relying on the hold.
    await fetch(`${cluster.urls[0]}/sessions/${session.sessionId}`, { method: "PUT", headers: { "content-type": "application/json" }, body: "{}" });
    await session.renew();
    assert.equal(forced.lostReason, "lease_not_found");
    assert.throws(() => forced.ensureValid(), LeaseLost);
    await session.renew();
    kept.ensureValid();
    assert.deepEqual(session.holds, [kept]);
  }));

test("a lost session marks its holds lost; a lock-delay refuses the name after a lapse", () =>
  withCluster({}, async (cluster) => {
    const client = new Client({ servers: cluster.urls });
    const session = await client.session({ ttlMs: 1000 });
    const lock = await session.lock("s:lost");
    await fetch(`${cluster.urls[0]}/sessions/${session.sessionId}`, { method: "DELETE" });
    await waitFor("the session to be lost", async () => session.signal.aborted);
    assert.equal(session.lostReason, "session_not_found");
    assert.equal(lock.signal.aborted, true);
    assert.throws(() => lock.ensureValid(), LeaseLost);

    await client.lock("s:delay", { ttlMs: 300, lockDelayMs: 1000, autoRenew: false });
    await waitFor("the lease to lapse", async () => (await held(cluster.urls[0], "s:delay")).held === false);
    await assert.rejects(client.lock("s:delay"), (e: LockHeld) => e.code === "lock_delay" && e.retryAfterMs > 0);
    const after = await client.lock("s:delay", { waitMs: 2000 });
    await after.release();
  }));
