"""A standby that takes over from a primary, and followers that learn who is primary.

`standby.py ADDRESS` campaigns for `db-primary` with its address and serves as primary for
as long as it leads (here: prints a heartbeat); started twice, the second is the standby
and takes over when the first goes. `standby.py --follow` prints each new primary.

    REDLOCKD_SERVER=http://127.0.0.1:8080 python standby.py 10.0.0.7:5432
    REDLOCKD_SERVER=http://127.0.0.1:8080 python standby.py --follow
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from redlockd import Client, LockHeld

ELECTION = "db-primary"


def follow(client: Client) -> None:
    for event in client.observe(ELECTION):
        if event.kind in ("elected", "proclaimed"):
            print(f"primary is {event.value} (term {event.term})", flush=True)
        elif event.kind == "vacant":
            print("no primary", flush=True)


def serve(client: Client, address: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"{address}: standing by", flush=True)
    leader = None
    while leader is None:
        try:
            leader = client.campaign(ELECTION, address, ttl=2.0, wait=30)
        except LockHeld:
            if stop.is_set():
                return
    with leader:
        print(f"{address}: primary, term {leader.term}", flush=True)
        # Serve until told to stop, or until leadership is lost (then stop serving at once:
        # another node may be primary already).
        while not stop.wait(0.5):
            if leader.lost.is_set():
                print(f"{address}: lost leadership, stepping down", flush=True)
                sys.exit(1)
    print(f"{address}: resigned", flush=True)


def main() -> None:
    client = Client(os.environ.get("REDLOCKD_SERVER", "http://127.0.0.1:8080"))
    if sys.argv[1:] == ["--follow"]:
        follow(client)
    elif len(sys.argv) == 2:
        serve(client, sys.argv[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
