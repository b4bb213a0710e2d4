// Retries and reconnects are spread out (jittered), so that clients that failed together
// do not all come back in the same instant.

import assert from "node:assert/strict";
import { test } from "node:test";

import { jittered } from "../src/index.js";

test("a jittered wait lies between half and all of it, and varies", () => {
  const waits = Array.from({ length: 200 }, () => jittered(800));
  assert.ok(waits.every((w) => w >= 400 && w <= 800), String(waits));
  assert.ok(new Set(waits).size > 100);
  assert.equal(jittered(0), 0);
});
