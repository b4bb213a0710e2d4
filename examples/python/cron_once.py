"""A job that must run once per tick although every instance fires it.

Eight instances (threads here; processes or hosts in real life) fire the nightly job at
about the same time. Each tries the tick's lock without waiting; the one that gets it runs
the job and keeps the lock a while after it finishes, so that an instance whose clock fires
a little late finds it held rather than free. The others skip.

    REDLOCKD_SERVER=http://127.0.0.1:8080 python cron_once.py [--instances 8] [--tick 2026-11-23]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from redlockd import Client


def nightly_report(instance: int, fencing_token: int) -> str:
    # Real work would send the e-mails, stamping the run with the fencing token so that
    # the mail service can refuse a run older than the last one it saw.
    time.sleep(0.2)
    return f"report sent by instance {instance} (token {fencing_token})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--tick", default=time.strftime("%Y-%m-%d"))
    args = parser.parse_args()
    servers = os.environ.get("REDLOCKD_SERVER", "http://127.0.0.1:8080")

    def instance(i: int) -> None:
        client = Client(servers)
        result = client.run_once_per_tick(
            f"cron:nightly-report:{args.tick}",
            lambda lease: nightly_report(i, lease.fencing_token),
            hold_at_least=5.0,
        )
        print(f"instance {i}: {result.value if result.ran else 'skipped: another instance ran it'}",
              flush=True)

    threads = [threading.Thread(target=instance, args=(i,)) for i in range(args.instances)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
