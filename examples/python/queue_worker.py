"""A fleet of workers elects one to process an ordered queue; the next carries on when it dies.

Every worker campaigns for `queue:<name>`; the leader processes the queue's items in order,
after the last one done, stamping each with its term (the election's fencing token). The
"done" log is a fenced resource: it refuses a write whose term is below the highest it has
seen, so a deposed leader that has not noticed yet cannot write. When the leader dies, its
lease lapses at the TTL and the next worker is elected; when the queue is drained, the
leader resigns and every worker exits.

    REDLOCKD_SERVER=http://127.0.0.1:8080 python queue_worker.py NAME QUEUE_FILE DONE_FILE
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

from redlockd import Client, LeaseLost

TTL = 1.0


class FencedLog:
    """Lines of `item term`, appended under a file lock; a term below the highest written
    is refused."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> list:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [line.split() for line in f if line.strip()]

    def append(self, item: str, term: int) -> bool:
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            terms = [int(line.split()[1]) for line in f if line.strip()]
            if terms and term < max(terms):
                return False
            f.write(f"{item} {term}\n")
            f.flush()
            return True


def main() -> None:
    name, queue_file, done_file = sys.argv[1:4]
    client = Client(os.environ.get("REDLOCKD_SERVER", "http://127.0.0.1:8080"))
    me = f"worker-{os.getpid()}"
    with open(queue_file) as f:
        items = [line.strip() for line in f if line.strip()]
    done = FencedLog(done_file)
    while len(done.read()) < len(items):
        leader = client.campaign(f"queue:{name}", me, ttl=TTL, wait=30)
        print(f"{me}: elected, term {leader.term}", flush=True)
        with leader:
            try:
                for item in items[len(done.read()):]:
                    leader.ensure_valid()
                    time.sleep(0.05)  # the work
                    if not done.append(item, leader.term):
                        print(f"{me}: refused (a newer term wrote)", flush=True)
                        break
            except LeaseLost:
                print(f"{me}: lost the election", flush=True)
    print(f"{me}: queue drained", flush=True)


if __name__ == "__main__":
    main()
