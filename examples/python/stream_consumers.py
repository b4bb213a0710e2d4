"""Each message of a stream processed by exactly one of four consumers.

All four consumers read the whole stream (as with a broadcast topic, or a queue that
redelivers). For each message a consumer takes `msg:<stream>:<id>` without waiting; the one
that gets it processes the message, records it in the sink with the lease's fencing token
(the sink keeps the first record of each message and refuses a write whose token is not
above the message's last), and releases. A consumer that finds the message done skips it.

    REDLOCKD_SERVER=http://127.0.0.1:8080 python stream_consumers.py [--messages 40] [--consumers 4]
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Dict, Tuple

from redlockd import Client, LeaseLost, LockHeld


class Sink:
    """Where processed messages land: at most one record per message, fenced by token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: Dict[int, Tuple[str, int]] = {}
        self.fences: Dict[int, int] = {}

    def done(self, message: int) -> bool:
        with self._lock:
            return message in self.records

    def write(self, message: int, consumer: str, token: int) -> bool:
        with self._lock:
            if token <= self.fences.get(message, 0) or message in self.records:
                return False
            self.fences[message] = token
            self.records[message] = (consumer, token)
            return True


def consume(client: Client, stream: str, consumer: str, messages: int, sink: Sink) -> int:
    processed = 0
    for message in range(messages):
        if sink.done(message):
            continue
        try:
            lease = client.lock(f"msg:{stream}:{message}", ttl=10)
        except LockHeld:
            continue
        with lease:
            if sink.done(message):
                continue
            try:
                lease.ensure_valid()
            except LeaseLost:
                continue
            if sink.write(message, consumer, lease.fencing_token):
                processed += 1
    return processed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--stream", default=f"orders-{os.getpid()}")
    args = parser.parse_args()
    servers = os.environ.get("REDLOCKD_SERVER", "http://127.0.0.1:8080")
    sink = Sink()
    counts: Dict[str, int] = {}

    def run(i: int) -> None:
        name = f"consumer-{i}"
        counts[name] = consume(Client(servers), args.stream, name, args.messages, sink)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, count in sorted(counts.items()):
        print(f"{name}: processed {count}", flush=True)
    print(f"messages processed: {len(sink.records)} of {args.messages}, "
          f"each once: {sum(counts.values()) == len(sink.records)}", flush=True)


if __name__ == "__main__":
    main()
