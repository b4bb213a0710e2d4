// The shared table of answers (clients/cases/errors.json): every client classifies each the
// same way.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { LockHeld, TooManyRequests, Unauthorized, errorFrom } from "../src/index.js";

import { classes } from "./classes.js";

const table = JSON.parse(
  readFileSync(new URL("../../../../../cases/errors.json", import.meta.url), "utf8"),
) as { cases: Array<Record<string, any>> };

for (const c of table.cases) {
  test(`${c.status} is ${c.class}`, () => {
    const headers = new Headers(c.retry_after_header ? { "retry-after": c.retry_after_header } : {});
    const body = typeof c.body === "object" ? c.body : {};
    const error = errorFrom(c.status, body, headers);
    assert.equal(error.constructor, classes[c.class], `${JSON.stringify(c)}: ${error.constructor.name}`);
    if (c.class === "forbidden") assert.ok(error instanceof Unauthorized);
    if (c.retry_after_ms !== undefined) {
      const after = error instanceof TooManyRequests ? error.retryAfterMs : (error as LockHeld).retryAfterMs;
      assert.equal(after, c.retry_after_ms);
    }
  });
}
