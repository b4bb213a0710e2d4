// The shared table of failover (clients/cases/failover.json): every client goes round the
// replicas the same way.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Client, RedlockdError } from "../src/index.js";

import { classes } from "./classes.js";

type Answer = "refused" | "ok" | { status: number; body: Record<string, unknown> };

const table = JSON.parse(
  readFileSync(new URL("../../../../../cases/failover.json", import.meta.url), "utf8"),
) as {
  ok_body: Record<string, unknown>;
  cases: Array<{
    name: string;
    replicas: Answer[][];
    calls: Array<{ tried: number[]; result: string; code?: string }>;
  }>;
};

for (const c of table.cases) {
  test(c.name, async () => {
    const answers = c.replicas.map((r) => [...r]);
    const tried: number[] = [];
    const real = globalThis.fetch;
    // The replicas, in place of the network, for this case only (the cases run one by one).
    globalThis.fetch = (async (input: string | URL | Request) => {
      const i = Number(new URL(String(input)).hostname.replace("replica-", ""));
      tried.push(i);
      const answer = answers[i].length > 1 ? answers[i].shift()! : answers[i][0];
      if (answer === "refused") throw new TypeError("fetch failed: connection refused");
      const [status, body] = answer === "ok" ? [200, table.ok_body] : [answer.status, answer.body];
      return new Response(JSON.stringify(body), {
        status,
        headers: { "content-type": "application/json" },
      });
    }) as typeof fetch;
    try {
      const client = new Client({ servers: c.replicas.map((_, i) => `http://replica-${i}`) });
      for (const call of c.calls) {
        tried.length = 0;
        if (call.result === "ok") {
          const status = await client.inspect("job");
          assert.ok(status.held && status.fencingToken === 7);
        } else {
          const error = await client.inspect("job").then(
            () => assert.fail("an error was expected"),
            (e: unknown) => e,
          );
          assert.ok(error instanceof RedlockdError, String(error));
          assert.equal(error.constructor, classes[call.result], String(error));
          assert.equal(error.code, call.code);
        }
        assert.deepEqual(tried, call.tried);
      }
    } finally {
      globalThis.fetch = real;
    }
  });
}
