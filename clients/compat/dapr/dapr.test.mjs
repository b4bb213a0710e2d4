// Dapr's JavaScript SDK, as published on npm, pointed at redlockd in place of a Dapr
// sidecar: it waits for /v1.0/metadata as it would for a sidecar, then takes and releases
// locks through its own HTTP calls, against three real redis-server masters. What Dapr's
// lock conformance cases pin is checked here through the SDK: a lock is not reentrant, an
// unlock names its owner, and a lock is free again once it expires. Under authentication
// the SDK's token (the `dapr-api-token` header) is one of redlockd's.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { CommunicationProtocolEnum, DaprClient } from "@dapr/dapr";
import { LockStatus } from "@dapr/dapr/types/lock/UnlockResponse.js";

import { Cluster, held, sleep } from "../../typescript/test/harness.mjs";

/** A Dapr client of the replica at `url`, over HTTP, with `token` if given. */
function daprClient(url, token) {
  const { hostname, port } = new URL(url);
  return new DaprClient({
    daprHost: hostname,
    daprPort: port,
    communicationProtocol: CommunicationProtocolEnum.HTTP,
    daprApiToken: token,
    logger: { level: 0 },
  });
}

const unique = (what) => `${what}-${randomBytes(4).toString("hex")}`;

describe("Dapr's JavaScript SDK against redlockd", () => {
  let cluster;
  let dapr;
  let other;

  before(async () => {
    cluster = await Cluster.start({ masters: 3, replicas: 2 });
    dapr = daprClient(cluster.urls[0]);
    // A second replica over the same masters: what one replica granted, the other sees.
    other = daprClient(cluster.urls[1]);
  });

  after(() => cluster?.stop());

  test("a lock is not reentrant and only its owner unlocks it", async () => {
    const resource = unique("order");
    assert.deepEqual(await dapr.lock.lock("lockstore", resource, "worker-1", 30), { success: true });
    // The lock is the name lockstore:<resource>; its lockOwner, a capability, is not shown.
    const seen = await held(cluster.urls[0], `lockstore:${resource}`);
    assert.equal(seen.held, true);
    assert.equal(seen.owner, undefined);
    for (const client of [dapr, other]) {
      assert.equal((await client.lock.lock("lockstore", resource, "worker-1", 30)).success, false);
      assert.equal((await client.lock.lock("lockstore", resource, "worker-2", 30)).success, false);
      assert.equal((await client.lock.unlock("lockstore", resource, "worker-2")).status, LockStatus.LockBelongsToOthers);
    }
    assert.equal((await held(cluster.urls[1], `lockstore:${resource}`)).held, true);
    assert.equal((await other.lock.unlock("lockstore", resource, "worker-1")).status, LockStatus.Success);
    assert.equal((await dapr.lock.unlock("lockstore", resource, "worker-1")).status, LockStatus.LockDoesNotExist);
    assert.equal((await other.lock.lock("lockstore", resource, "worker-2", 30)).success, true);
  });

  test("a lock is held for its whole expiry and free once it has passed", async () => {
    const resource = unique("nightly");
    const taken = Date.now();
    assert.equal((await dapr.lock.lock("lockstore", resource, "a", 1)).success, true);
    let takenAgain;
    const deadline = taken + 10_000;
    while (Date.now() < deadline) {
      const before = Date.now();
      if ((await other.lock.lock("lockstore", resource, "b", 30)).success) {
        takenAgain = before;
        break;
      }
      await sleep(50);
    }
    assert.ok(takenAgain !== undefined, "the lock was never free again");
    assert.ok(takenAgain - taken >= 1000, `taken again ${takenAgain - taken} ms after a 1 s lock`);
  });

  test("a call the SDK cannot make is an error it raises", async () => {
    await assert.rejects(dapr.lock.lock("lockstore", "not/a-name", "a", 30), /ERR_MALFORMED_REQUEST/);
    await assert.rejects(dapr.lock.lock("lockstore", unique("r"), "a", 0), /ERR_MALFORMED_REQUEST/);
  });
});

describe("Dapr's JavaScript SDK under authentication", () => {
  let cluster;
  let dir;
  const token = `rlk_${randomBytes(32).toString("base64url")}`;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "redlockd-dapr-"));
    const file = join(dir, "tokens.json");
    const sha256 = createHash("sha256").update(token).digest("hex");
    writeFileSync(file, JSON.stringify({ tokens: [{ name: "orders-app", sha256, role: "client", prefixes: ["orders:"] }] }));
    cluster = await Cluster.start({ masters: 3, replicas: 1, env: { REDLOCKD_AUTH_FILE: file } });
  });

  after(() => {
    cluster?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("the SDK's token takes locks within its prefixes and no others", async () => {
    const dapr = daprClient(cluster.urls[0], token);
    const resource = unique("o");
    assert.equal((await dapr.lock.lock("orders", resource, "a", 30)).success, true);
    assert.equal((await dapr.lock.unlock("orders", resource, "a")).status, LockStatus.Success);
    await assert.rejects(dapr.lock.lock("billing", resource, "a", 30), /forbidden/);
    await assert.rejects(daprClient(cluster.urls[0]).lock.lock("orders", resource, "a", 30), /401/);
  });
});
