// The shared table of event streams (clients/cases/sse.json): every client reads each the
// same way.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { sse } from "../src/index.js";

const table = JSON.parse(
  readFileSync(new URL("../../../../../cases/sse.json", import.meta.url), "utf8"),
) as { cases: Array<{ about: string; text: string; events: Array<[string, unknown]> }> };

/** `text` as a response body arriving `size` bytes at a time (lines split across chunks). */
function body(text: string, size: number): ReadableStream<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  let at = 0;
  return new ReadableStream({
    pull(controller) {
      if (at >= bytes.length) {
        controller.close();
        return;
      }
      controller.enqueue(bytes.slice(at, at + size));
      at += size;
    },
  });
}

for (const c of table.cases) {
  for (const size of [1, 3, 1 << 16]) {
    test(`${c.about} (chunks of ${size})`, async () => {
      const events: Array<[string, unknown]> = [];
      for await (const event of sse(body(c.text, size))) events.push(event);
      assert.deepEqual(events, c.events);
    });
  }
}
