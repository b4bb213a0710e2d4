"""A user's double submission throttled for five seconds.

Each submission takes `submit:<user>` for five seconds and never releases it: the lock's
expiry is the throttle. A second submission within the five seconds is refused with how
long to wait (the lock's remaining TTL), on whichever instance it lands.

    REDLOCKD_SERVER=http://127.0.0.1:8080 python throttle.py alice alice bob alice
"""

from __future__ import annotations

import os
import sys

from redlockd import Client, LockHeld

WINDOW = 5.0


def submit(client: Client, user: str) -> str:
    try:
        client.lock(f"submit:{user}", ttl=WINDOW, auto_renew=False)
    except LockHeld as held:
        return f"{user}: throttled, try again in {held.retry_after:.1f}s"
    return f"{user}: accepted"


def main() -> None:
    client = Client(os.environ.get("REDLOCKD_SERVER", "http://127.0.0.1:8080"))
    for user in sys.argv[1:] or ["alice", "alice"]:
        print(submit(client, user), flush=True)


if __name__ == "__main__":
    main()
