"""What the sync and async clients share: configuration, request shapes, how answers are
read, and the renew schedule. No I/O here."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._errors import LeaseLost, RedlockdError, Unavailable, from_response

#: Grants, renews and releases are tried on each server in turn, this many rounds at most.
ROUNDS = 2
#: A renew that fails is tried again this often (as a share of the TTL) while the lease
#: is still valid.
RETRY_SHARE = 0.1


def jittered(seconds: float) -> float:
    """A wait of `seconds` spread evenly over its second half: clients that failed together
    (a replica restarted under all of them) do not all retry in the same instant."""
    return seconds / 2 + random.random() * seconds / 2


def reconnect_pause(failures: int) -> float:
    """How long to wait before reconnecting a stream after `failures` failed tries in a
    row: doubling from 50 ms to 2 s, jittered."""
    return jittered(min(2.0, 0.05 * 2 ** min(failures, 6)))


class Retry(Exception):
    """This replica cannot serve the request now (no answer, or no majority): try the
    next one. Carries the error to raise if none can."""

    def __init__(self, error: RedlockdError):
        super().__init__(str(error))
        self.error = error


def network_error(url: str, e: Exception) -> Retry:
    return Retry(Unavailable(f"{url}: {type(e).__name__}: {e}", "network"))


def answer(status: int, content: bytes, headers: Any, expect_body: bool) -> Dict[str, Any]:
    """The body of a success, the typed error of a failure, or `Retry` for a 503."""
    if status == 503:
        raise Retry(from_response(503, parse_json(content), headers))
    if status >= 400:
        raise from_response(status, parse_json(content), headers)
    return parse_json(content) if expect_body else {}


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def new_idempotency_key() -> str:
    """A fresh key for one grant: random, so that nobody else's request can match it."""
    return uuid.uuid4().hex


class Servers:
    """The replicas' base URLs. Requests go to the last one that answered, and move on
    to the next when a server cannot be reached, so that all callers stick to a healthy
    replica. Thread-safe."""

    def __init__(self, urls: Union[str, Sequence[str]]):
        if isinstance(urls, str):
            urls = [u for u in urls.replace(",", " ").split() if u]
        self.urls: List[str] = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("at least one server URL is required")
        for url in self.urls:
            # A configuration error, said at once: not an outage found on the first call.
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server URL {url!r} must start with http:// or https:// "
                                 f"(for example http://{url.split('://')[-1]})")
        self._preferred = 0
        self._lock = threading.Lock()

    def order(self) -> List[str]:
        with self._lock:
            start = self._preferred
        return [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]

    def answered(self, url: str) -> None:
        with self._lock:
            self._preferred = self.urls.index(url)


def path(kind: str, name: str, lease_id: Optional[str] = None) -> str:
    p = f"/{kind}/{quote(name, safe='')}"
    if lease_id is not None:
        p += f"/leases/{quote(lease_id, safe='')}"
    return p


def grant_body(kind: str, ttl: float, wait: float, owner: Optional[str],
               limit: Optional[int] = None, mode: Optional[str] = None,
               session: Optional[str] = None, lock_delay: Optional[float] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"ttl_ms": max(1, int(ttl * 1000)), "wait_ms": max(0, int(wait * 1000))}
    if session is not None:
        # A hold through a session lives as long as the session: it has no TTL of its own.
        del body["ttl_ms"]
        body["session"] = session
    if lock_delay:
        body["lock_delay_ms"] = max(0, int(lock_delay * 1000))
    if owner is not None:
        body["value" if kind == "elections" else "owner"] = owner
    if limit is not None:
        body["limit"] = limit
    if mode is not None and mode != "exclusive":
        body["mode"] = mode
    return body


def headers(token: Optional[str], idempotency_key: Optional[str] = None,
            traceparent: Optional[str] = None) -> Dict[str, str]:
    h = {"Accept": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    if idempotency_key:
        h["Idempotency-Key"] = idempotency_key
    if traceparent:
        h["traceparent"] = traceparent
    return h


#: What names the caller's trace for each request: a function returning a W3C
#: `traceparent`, or None for none.
TraceContext = Callable[[], Optional[str]]


def opentelemetry_traceparent() -> Optional[str]:
    """The current OpenTelemetry span's `traceparent`, when the application uses
    OpenTelemetry (the `opentelemetry-api` package); else None. The default of `Client`."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    carrier: Dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


@dataclass
class Grant:
    """A lease as the server answered it, read from the body, with the moment the request
    that won it was sent: validity counts from then, never from the answer's arrival."""

    name: str
    kind: str
    lease_id: str
    fencing_token: int
    ttl: float
    owner: Optional[str]
    valid_until: float
    slot: Optional[int] = None
    limit: Optional[int] = None
    mode: Optional[str] = None
    names: Tuple[str, ...] = ()

    @classmethod
    def read(cls, kind: str, body: Dict[str, Any], sent: float) -> "Grant":
        token = body.get("fencing_token", body.get("term"))
        if token is None:
            raise ValueError(f"a grant's answer without a fencing token: {body!r}")
        return cls(
            name=body["name"],
            kind=kind,
            lease_id=body["lease_id"],
            fencing_token=int(token),
            ttl=float(body["ttl_ms"]) / 1000.0,
            owner=body.get("value") if kind == "elections" else body.get("owner"),
            valid_until=sent + float(body["validity_ms"]) / 1000.0,
            slot=body.get("slot"),
            limit=body.get("limit"),
            mode=body.get("mode"),
            names=tuple(body.get("names") or ()),
        )


def attempt_timeout(each: float, deadline: Optional[float]) -> Optional[float]:
    """How long one attempt of a call may wait: `each`, cut to what is left before the
    whole call's `deadline` (a `time.monotonic()` time), or None once that has passed."""
    if deadline is None:
        return each
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    return min(each, max(left, 0.01))


class Renewable:
    """What leases and sessions share: a TTL renewed at a third of it, a failed renew tried
    again every tenth of it while still valid, and the warning when renews have not got
    through and less than a third of the TTL is left (`in_jeopardy`)."""

    ttl: float
    valid_until: float
    #: Renews have not got through and less than a third of the TTL is left: stop what the
    #: hold guards unless a renew gets through (the client's `on_safe`) before it ends.
    in_jeopardy: bool = False

    def renew_every(self) -> float:
        return max(self.ttl / 3.0, 0.01)

    def jeopardy_in(self, now: float) -> Optional[float]:
        """Seconds until the warning falls due (0 when it is due), or None once warned."""
        if self.in_jeopardy:
            return None
        return max(0.0, self.valid_until - self.ttl / 3.0 - now)

    def retry_every(self) -> float:
        return jittered(max(self.ttl * RETRY_SHARE, 0.01))

    def renew_timeout(self, now: float, most: float) -> float:
        """How long a renew sent at `now` may wait for its answer: at most `most` (the
        client's timeout), and no longer than until the next thing the renew loop must
        tell: the jeopardy point while not yet warned, then the end of the validity. A
        renew that hangs (its replica stopped answering) then fails in time for both."""
        due = self.jeopardy_in(now)
        until = due if due else self.valid_until - now
        return max(0.05, min(most, until))


class LeaseState(Renewable):
    """The part of a lease both flavours share: its fields, its validity, and the one-way
    step to lost."""

    def __init__(self, grant: Grant):
        self.name = grant.name
        self.kind = grant.kind
        self.lease_id = grant.lease_id
        self.fencing_token = grant.fencing_token
        self.ttl = grant.ttl
        self.owner = grant.owner
        self.valid_until = grant.valid_until
        #: A semaphore's permit: which of its `limit` slots it holds (None for a lock).
        self.slot = grant.slot
        self.limit = grant.limit
        #: A lock's lease: "exclusive" or "shared" (None for other kinds).
        self.mode = grant.mode
        #: A lease on several names: all of them, sorted (empty for one name).
        self.names = grant.names
        self.lost_reason: Optional[str] = None
        self.released = False
        #: When this process learnt of the grant: a session renew sent before then does not
        #: judge it.
        self.joined = time.monotonic()

    @property
    def term(self) -> int:
        """An election's term: its lease's fencing token."""
        return self.fencing_token

    @property
    def remaining(self) -> float:
        """Seconds this lease may still be relied on (0 once lost)."""
        if self.lost_reason is not None:
            return 0.0
        return max(0.0, self.valid_until - time.monotonic())

    def ensure_valid(self, margin: float = 0.0) -> None:
        """Raise `LeaseLost` unless the lease is still valid for `margin` more seconds. Call
        it right before each protected write, and send `fencing_token` with the write."""
        if self.lost_reason is not None:
            raise LeaseLost(f"lease of {self.name} lost: {self.lost_reason}", self.lost_reason)
        if time.monotonic() + margin >= self.valid_until:
            raise LeaseLost(f"lease of {self.name} has no validity left", "expired")

    def renewed(self, body: Dict[str, Any], sent: float) -> None:
        self.valid_until = max(self.valid_until, sent + float(body["validity_ms"]) / 1000.0)
        self.ttl = float(body["ttl_ms"]) / 1000.0
        owner = body.get("value") if self.kind == "elections" else body.get("owner")
        if owner is not None:
            self.owner = owner

    def __repr__(self) -> str:
        state = "lost: " + self.lost_reason if self.lost_reason else f"{self.remaining:.3f}s valid"
        return f"<Lease {self.kind}/{self.name} token={self.fencing_token} {state}>"


class SessionState(Renewable):
    """The part of a session both flavours share: its id, TTL and validity, and the holds
    made through it, whose validity is the session's."""

    def __init__(self, body: Dict[str, Any], sent: float):
        self.session_id: str = body["session_id"]
        self.ttl = float(body["ttl_ms"]) / 1000.0
        self.owner: Optional[str] = body.get("owner")
        self.valid_until = sent + float(body["validity_ms"]) / 1000.0
        self.lost_reason: Optional[str] = None
        self.ended = False
        self.holds: List[LeaseState] = []

    @property
    def remaining(self) -> float:
        """Seconds the session (and every hold through it) may still be relied on."""
        if self.lost_reason is not None:
            return 0.0
        return max(0.0, self.valid_until - time.monotonic())

    def renewed(self, body: Dict[str, Any], sent: float) -> List[Tuple[LeaseState, str]]:
        """Take a renew's answer: only the holds it lists in `kept` are valid as long as the
        session now; those it lists as `unconfirmed` keep the validity they had (a master
        that carries them did not answer) and are lost once it runs out; any other hold
        taken before the renew was sent has ended (`lost`, or released by someone else).
        Returns the holds to mark lost, each with its reason."""
        self.valid_until = max(self.valid_until, sent + float(body["validity_ms"]) / 1000.0)
        self.ttl = float(body["ttl_ms"]) / 1000.0
        kept = set(body.get("kept") or ())
        unconfirmed = set(body.get("unconfirmed") or ())
        now = time.monotonic()
        lost: List[Tuple[LeaseState, str]] = []
        for hold in self.holds:
            if hold.joined > sent:
                continue  # granted while this renew was under way: the next one judges it
            if hold.lease_id in kept:
                hold.valid_until = max(hold.valid_until, self.valid_until)
            elif hold.lease_id in unconfirmed:
                if hold.valid_until <= now:
                    lost.append((hold, "quorum_lost"))
            else:
                lost.append((hold, "lease_not_found"))
        gone = {id(h) for h, _ in lost}
        self.holds = [h for h in self.holds if id(h) not in gone]
        return lost

    def __repr__(self) -> str:
        state = "lost: " + self.lost_reason if self.lost_reason else f"{self.remaining:.3f}s valid"
        return f"<Session {len(self.holds)} holds {state}>"


class Sse:
    """Server-sent events, one line at a time: `feed` returns (event, JSON data) when a
    line completes an event."""

    def __init__(self) -> None:
        self.event, self.data = "message", []  # type: str, List[str]

    def feed(self, line: str) -> Optional[Tuple[str, Dict[str, Any]]]:
        if line == "":
            done = None
            if self.data:
                try:
                    done = (self.event, json.loads("\n".join(self.data)))
                except ValueError:
                    pass  # Not JSON: not one of ours.
            self.event, self.data = "message", []
            return done
        if line.startswith("event:"):
            self.event = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].lstrip())
        return None


def observe_path(name: str) -> str:
    return path("elections", name) + "/observe"
