"""The values the clients return: who holds a lock, who leads an election, what an
observer is told, what a tick did. Shared by the blocking and the asyncio client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, NamedTuple, Optional, Tuple


@dataclass(frozen=True)
class SharedHolder:
    """One shared holder of a lock as inspect answers it (never a lease id)."""

    fencing_token: int
    ttl_remaining: float
    owner: Optional[str] = None


@dataclass(frozen=True)
class LockStatus:
    """A lock's state as inspect answers it: `held`, and when held its `mode` ("exclusive"
    or "shared"), the holder's `fencing_token` (a shared lock's highest), what is left of
    its lease (`ttl_remaining`, seconds; a shared lock's longest) and its `owner`; a shared
    lock's `holders`. It never names a lease id."""

    name: str
    held: bool
    fencing_token: Optional[int] = None
    ttl_remaining: Optional[float] = None
    owner: Optional[str] = None
    mode: Optional[str] = None
    holders: Tuple[SharedHolder, ...] = ()

    @classmethod
    def read(cls, body: Dict[str, Any]) -> "LockStatus":
        """The state in a `GET /locks/{name}` answer."""
        remaining = body.get("ttl_remaining_ms")
        token = body.get("fencing_token")
        return cls(
            body["name"],
            bool(body.get("held")),
            int(token) if token is not None else None,
            float(remaining) / 1000.0 if remaining is not None else None,
            body.get("owner"),
            body.get("mode"),
            tuple(SharedHolder(int(h["fencing_token"]), float(h["ttl_remaining_ms"]) / 1000.0,
                               h.get("owner"))
                  for h in body.get("holders") or []),
        )


@dataclass(frozen=True)
class PermitHolder:
    """One permit of a semaphore as inspect answers it: its `slot`, `fencing_token`, what
    is left of it (`ttl_remaining`, seconds) and its `owner`. Never a lease id."""

    slot: int
    fencing_token: int
    ttl_remaining: float
    owner: Optional[str] = None


@dataclass(frozen=True)
class SemaphoreStatus:
    """A semaphore's permits held now, by slot."""

    name: str
    holders: Tuple[PermitHolder, ...]

    @classmethod
    def read(cls, body: Dict[str, Any]) -> "SemaphoreStatus":
        """The state in a `GET /semaphores/{name}` answer."""
        return cls(body["name"], tuple(
            PermitHolder(int(h["slot"]), int(h["fencing_token"]),
                         float(h["ttl_remaining_ms"]) / 1000.0, h.get("owner"))
            for h in body.get("holders", [])))


@dataclass(frozen=True)
class Leader:
    """Who leads an election now (`term` is the leader's fencing token)."""

    name: str
    term: int
    value: Optional[str]
    ttl_remaining: float

    @classmethod
    def read(cls, body: Dict[str, Any]) -> Optional["Leader"]:
        """The leader in a `GET /elections/{name}` answer, or None when vacant."""
        if body.get("vacant"):
            return None
        return cls(body["name"], int(body["term"]), body.get("value"),
                   float(body.get("ttl_remaining_ms", 0)) / 1000.0)


@dataclass(frozen=True)
class LeaderEvent:
    """One change an observer is told of: `elected` (a new term), `proclaimed` (the
    leader's new value, same term) or `vacant` (`term` is the last leader's, if known)."""

    kind: str
    name: str
    term: Optional[int]
    value: Optional[str]

    @classmethod
    def read(cls, name: str, kind: str, data: Dict[str, Any]) -> "LeaderEvent":
        return cls(kind, data.get("name", name), data.get("term"), data.get("value"))


class TickResult(NamedTuple):
    """What `run_once_per_tick` did: `ran` is False when another instance held the tick."""

    ran: bool
    value: Any = None


