// stream-consumers: each message of a stream processed by exactly one of four consumers.
//
// All four consumers read the whole stream. For each message a consumer takes
// `msg:<stream>:<id>` without waiting; the one that gets it processes the message and
// records it in the sink with the lease's fencing token (the sink keeps the first record
// of each message and refuses a token not above the message's last), then releases on
// leaving the `await using` scope. A consumer that finds the message done skips it.
//
//   REDLOCKD_SERVER=http://127.0.0.1:8080 node stream-consumers.js [messages] [consumers]

import { Client, LockHeld } from "redlockd";

class Sink {
  readonly records = new Map<number, { consumer: string; token: number }>();
  private readonly fences = new Map<number, number>();

  done(message: number): boolean {
    return this.records.has(message);
  }

  write(message: number, consumer: string, token: number): boolean {
    if (token <= (this.fences.get(message) ?? 0) || this.records.has(message)) return false;
    this.fences.set(message, token);
    this.records.set(message, { consumer, token });
    return true;
  }
}

async function consume(client: Client, stream: string, consumer: string, messages: number, sink: Sink) {
  let processed = 0;
  for (let message = 0; message < messages; message++) {
    if (sink.done(message)) continue;
    try {
      await using lease = await client.lock(`msg:${stream}:${message}`, { ttlMs: 10_000 });
      if (sink.done(message)) continue;
      // Something slower than a map: the others get their turn meanwhile.
      await new Promise((resolve) => setTimeout(resolve, 5, { signal: lease.signal }));
      lease.ensureValid();
      if (sink.write(message, consumer, lease.fencingToken)) processed++;
    } catch (e) {
      if (!(e instanceof LockHeld)) throw e;
    }
  }
  return processed;
}

const messages = Number(process.argv[2] ?? 40);
const consumers = Number(process.argv[3] ?? 4);
const stream = `orders-${process.pid}`;
const servers = process.env.REDLOCKD_SERVER ?? "http://127.0.0.1:8080";
const sink = new Sink();
const counts = await Promise.all(
  Array.from({ length: consumers }, (_, i) => consume(new Client({ servers }), stream, `consumer-${i}`, messages, sink)),
);
counts.forEach((count, i) => console.log(`consumer-${i}: processed ${count}`));
const total = counts.reduce((a, b) => a + b, 0);
console.log(`messages processed: ${sink.records.size} of ${messages}, each once: ${total === sink.records.size}`);
