"""The blocking client: `Client` and its `Lease`, renewed by a background thread."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

import httpx

from . import _core
from ._errors import LeaseLost, LockHeld, RedlockdError, Unavailable, from_response
from ._models import Leader, LeaderEvent, LockStatus, SemaphoreStatus, TickResult

log = logging.getLogger("redlockd")


class _RenewsItself:
    """A background thread's renewing, for a lease and a session alike: at a third of the
    TTL, a failed renew again every tenth of it while still valid, and the loss signalled
    at the end of the validity at the latest."""

    # Each user has these: `renew()`, `renew_every()`, `retry_every()`, `_lose(reason)`.
    _stop: threading.Event
    valid_until: float
    in_jeopardy: bool

    def _renew_loop(self) -> None:
        delay = self.renew_every()  # type: ignore[attr-defined]
        while not self._stop.wait(delay):
            try:
                self.renew()  # type: ignore[attr-defined]
                delay = self.renew_every()  # type: ignore[attr-defined]
                if self.in_jeopardy:
                    self.in_jeopardy = False
                    self._client._tell(self._client.on_safe, self)  # type: ignore[attr-defined]
            except LeaseLost:
                return
            except RedlockdError as e:
                log.debug("renew of %r failed: %s", self, e)
                delay = self.retry_every()  # type: ignore[attr-defined]
            now = time.monotonic()
            left = self.valid_until - now
            if left <= 0:
                self._lose("expired")  # type: ignore[attr-defined]
                return
            due = self.jeopardy_in(now)  # type: ignore[attr-defined]
            if due == 0.0:
                self.in_jeopardy = True
                self._client._tell(self._client.on_jeopardy, self, left)  # type: ignore[attr-defined]
            elif due is not None:
                delay = min(delay, due)
            # Wake at the end of the validity at the latest, to signal the loss on time.
            delay = min(delay, left)


class Lease(_core.LeaseState, _RenewsItself):
    """A granted lease. Renewed in the background at a third of its TTL until released;
    `lost` is set (and `on_lost` called, once, with the lease) when it can no longer be
    relied on. Use it as a context manager to release it on leaving the block, exception
    or not."""

    def __init__(self, client: "Client", grant: _core.Grant,
                 on_lost: Optional[Callable[["Lease"], None]] = None, auto_renew: bool = True):
        super().__init__(grant)
        self._client = client
        self._on_lost = on_lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        if auto_renew:
            self._thread = threading.Thread(
                target=self._renew_loop, name=f"redlockd-renew-{self.name}", daemon=True)
            self._thread.start()

    def renew(self, ttl: Optional[float] = None, *, value: Optional[str] = None) -> None:
        """Renew now (the background thread does this on its own). `value` proclaims an
        election leader's new value. Raises `LeaseLost` if the lease is gone."""
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl_ms"] = max(1, int(ttl * 1000))
        if value is not None:
            body["value"] = value
        sent = time.monotonic()
        timeout = self.renew_timeout(sent, self._client.timeout)
        try:
            answer = self._client._call("PUT", _core.path(self.kind, self.name, self.lease_id),
                                        body=body, timeout=timeout, deadline=sent + timeout)
        except LeaseLost:
            self._lose("lease_not_found")
            raise
        self.renewed(answer, sent)

    def proclaim(self, value: str) -> None:
        """An elected leader's new value, published to observers; the term stays."""
        self.renew(value=value)

    def release(self) -> None:
        """Stop renewing and let go of the lock. A lease already gone is not an error."""
        with self._guard:
            if self.released:
                return
            self.released = True
        self._stop.set()
        try:
            self._client._call("DELETE", _core.path(self.kind, self.name, self.lease_id),
                               expect_body=False)
        except LeaseLost:
            pass

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Block until the lease is lost (True) or `timeout` passes (False)."""
        return self.lost.wait(timeout)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except RedlockdError as e:
            # The lock lapses at its TTL anyway; a failed release must not hide the block's
            # own exception, nor turn a finished block into a failure.
            log.warning("release of %s failed (%s); it lapses at its TTL", self.name, e)

    def _lose(self, reason: str) -> None:
        with self._guard:
            if self.lost_reason is not None or self.released:
                return
            self.lost_reason = reason
        self._stop.set()
        self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
                log.exception("on_lost callback for %s failed", self.name)



class Session(_core.SessionState, _RenewsItself):
    """A session: one heartbeat for many holds. Renewed in the background at a third of
    its TTL until ended; every lock, permit and term taken through it (`lock`, `permit`,
    `lock_many`, `campaign`) needs no renew of its own and is valid as long as the session
    is. `lost` is set (and every hold marked lost) when it can no longer be renewed. Use it
    as a context manager to end it on leaving the block: ending it releases every hold."""

    def __init__(self, client: "Client", body: Dict[str, Any], sent: float,
                 on_lost: Optional[Callable[["Session"], None]] = None):
        super().__init__(body, sent)
        self._client = client
        self._on_lost = on_lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self._thread = threading.Thread(target=self._renew_loop, name="redlockd-session",
                                        daemon=True)
        self._thread.start()

    def lock(self, name: str, *, wait: float = 0.0, owner: Optional[str] = None,
             mode: str = "exclusive", idempotency_key: Optional[str] = None,
             lock_delay: Optional[float] = None) -> Lease:
        """Lock `name` through this session (see `Client.lock`, `lock_delay` included: it
        applies when the session ends other than by its end, and so the hold)."""
        return self._hold(self._client._grant("locks", name, self.ttl, wait, owner,
                                              idempotency_key, mode=mode,
                                              session=self.session_id, lock_delay=lock_delay))

    def permit(self, name: str, limit: int, *, wait: float = 0.0, owner: Optional[str] = None,
               idempotency_key: Optional[str] = None) -> Lease:
        """One of `limit` permits of semaphore `name`, through this session."""
        return self._hold(self._client._grant("semaphores", name, self.ttl, wait, owner,
                                              idempotency_key, limit,
                                              session=self.session_id))

    def lock_many(self, names: Sequence[str], *, wait: float = 0.0, owner: Optional[str] = None,
                  idempotency_key: Optional[str] = None) -> Lease:
        """Every one of `names` under one lease, through this session."""
        body = _core.grant_body("locks", self.ttl, wait, owner, session=self.session_id)
        body["names"] = list(names)
        sent = time.monotonic()
        answer = self._client._call("POST", "/locks", body=body,
                                    idempotency_key=idempotency_key or _core.new_idempotency_key(),
                                    timeout=self._client.timeout + wait)
        return self._hold(_core.Grant.read("locks", answer, sent))

    def campaign(self, name: str, value: Optional[str] = None, *, wait: float = 0.0) -> Lease:
        """Become leader of election `name` through this session."""
        return self._hold(self._client._grant("elections", name, self.ttl, wait, value, None,
                                              session=self.session_id))

    def renew(self) -> None:
        """Renew the session, and every hold through it, now (the background thread does
        this on its own). Raises `LeaseLost` when the session is gone."""
        sent = time.monotonic()
        timeout = self.renew_timeout(sent, self._client.timeout)
        try:
            answer = self._client._call("PUT", f"/sessions/{self.session_id}", body={},
                                        timeout=timeout, deadline=sent + timeout)
        except LeaseLost:
            self._lose("session_not_found")
            raise
        for hold, reason in self.renewed(answer, sent):
            hold._lose(reason)  # type: ignore[attr-defined]

    def info(self) -> Dict[str, Any]:
        """The session as the server reads it, with `holds`."""
        return self._client._call("GET", f"/sessions/{self.session_id}")

    def end(self) -> None:
        """End the session: every hold through it is released. A session already gone is
        not an error."""
        with self._guard:
            if self.ended:
                return
            self.ended = True
        self._stop.set()
        for hold in self.holds:
            hold.released = True
        try:
            self._client._call("DELETE", f"/sessions/{self.session_id}", expect_body=False)
        except LeaseLost:
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.end()
        except RedlockdError as e:
            log.warning("end of session failed (%s); it lapses at its TTL", e)

    def _hold(self, grant: _core.Grant) -> Lease:
        lease = Lease(self._client, grant, auto_renew=False)
        self.holds.append(lease)
        return lease

    def _lose(self, reason: str) -> None:
        with self._guard:
            if self.lost_reason is not None or self.ended:
                return
            self.lost_reason = reason
        self._stop.set()
        self.lost.set()
        for hold in self.holds:
            # A session of this client holds this client's leases.
            if isinstance(hold, Lease):
                hold._lose(reason)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
                log.exception("on_lost callback of a session failed")



class Client:
    """A redlockd client over one or more replicas (failover between them).

    >>> client = Client(["http://127.0.0.1:8080"], token=None)
    >>> with client.lock("nightly-report", ttl=30) as lease:
    ...     lease.ensure_valid(); write(fencing_token=lease.fencing_token)
    """

    def __init__(self, servers: Union[str, Sequence[str]], *, token: Optional[str] = None,
                 timeout: float = 5.0, http: Optional[httpx.Client] = None,
                 traceparent: Optional[_core.TraceContext] = None,
                 on_jeopardy: Optional[Callable[[Any, float], None]] = None,
                 on_safe: Optional[Callable[[Any], None]] = None):
        """`on_jeopardy(lease_or_session, seconds_left)` is called, once, when the renews of
        a lease or session this client renews have not got through and less than a third
        of its TTL is left (it is then `in_jeopardy`); `on_safe(lease_or_session)` when one
        gets through again. Both run on the renewing thread: return quickly."""
        self.on_jeopardy = on_jeopardy
        self.on_safe = on_safe
        self.servers = _core.Servers(servers)
        self.token = token
        # Each request carries the caller's trace (W3C `traceparent`): from this function,
        # or by default from OpenTelemetry when the application uses it.
        self.traceparent = traceparent or _core.opentelemetry_traceparent
        self.timeout = timeout
        self._http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    @staticmethod
    def _tell(callback: Optional[Callable[..., None]], *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
            log.exception("a jeopardy or safe callback failed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def lock(self, name: str, ttl: float = 30.0, *, wait: float = 0.0, owner: Optional[str] = None,
             on_lost: Optional[Callable[[Lease], None]] = None, auto_renew: bool = True,
             idempotency_key: Optional[str] = None, mode: str = "exclusive",
             lock_delay: Optional[float] = None) -> Lease:
        """Grant `name` for `ttl` seconds, waiting up to `wait` while another holds it.
        `mode="shared"` holds it together with other shared holders (an exclusive grant
        waits for them all). Raises `LockHeld`, `Unavailable`, `BadRequest`, `Unauthorized`.
        The grant carries an Idempotency-Key, so that a retry after a lost answer gets the
        same lease. `lock_delay` (seconds): if the lease ends other than by its release
        (it expires, is force-released), nobody gets `name` until that long after."""
        grant = self._grant("locks", name, ttl, wait, owner, idempotency_key, mode=mode,
                            lock_delay=lock_delay)
        return Lease(self, grant, on_lost, auto_renew)

    def session(self, ttl: float = 30.0, *, owner: Optional[str] = None,
                on_lost: Optional[Callable[[Session], None]] = None) -> Session:
        """Open a session that lives `ttl` seconds unless renewed (it renews itself until
        ended): take locks, permits and terms through it with `session.lock(...)`; `with`
        ends it, releasing all of them at once."""
        body: Dict[str, Any] = {"ttl_ms": max(1, int(ttl * 1000))}
        if owner is not None:
            body["owner"] = owner
        sent = time.monotonic()
        return Session(self, self._call("POST", "/sessions", body=body), sent, on_lost)

    def lock_many(self, names: Sequence[str], ttl: float = 30.0, *, wait: float = 0.0,
                  owner: Optional[str] = None, on_lost: Optional[Callable[[Lease], None]] = None,
                  auto_renew: bool = True, idempotency_key: Optional[str] = None) -> Lease:
        """Every one of `names` under one lease, or none (in any order: the server orders
        them, so two callers never deadlock); renewed, signalled and released as one lock's
        lease, whose `names` lists them. Raises `LockHeld` while any is held past `wait`."""
        body = _core.grant_body("locks", ttl, wait, owner)
        body["names"] = list(names)
        sent = time.monotonic()
        answer = self._call("POST", "/locks", body=body,
                            idempotency_key=idempotency_key or _core.new_idempotency_key(),
                            timeout=self.timeout + wait)
        return Lease(self, _core.Grant.read("locks", answer, sent), on_lost, auto_renew)

    def permit(self, name: str, limit: int, ttl: float = 30.0, *, wait: float = 0.0,
               owner: Optional[str] = None, on_lost: Optional[Callable[[Lease], None]] = None,
               auto_renew: bool = True, idempotency_key: Optional[str] = None) -> Lease:
        """One of `limit` permits of semaphore `name`, renewed and signalled like a lock's
        lease; `slot` says which of the `limit` slots it holds, and `fencing_token` rises per
        slot. Raises `LockHeld` when all are taken for the whole `wait`."""
        grant = self._grant("semaphores", name, ttl, wait, owner, idempotency_key, limit)
        return Lease(self, grant, on_lost, auto_renew)

    def semaphore(self, name: str) -> SemaphoreStatus:
        """The permits of semaphore `name` held now, by slot (never a lease id)."""
        return SemaphoreStatus.read(self._call("GET", _core.path("semaphores", name)))

    def campaign(self, name: str, value: Optional[str] = None, *, ttl: float = 10.0,
                 wait: float = 0.0, on_lost: Optional[Callable[[Lease], None]] = None) -> Lease:
        """Become leader of election `name` (waiting up to `wait`). The lease's `term` is
        the fencing token; `proclaim(value)` publishes a new value."""
        grant = self._grant("elections", name, ttl, wait, value, None)
        return Lease(self, grant, on_lost)

    def leader(self, name: str) -> Optional[Leader]:
        """Who leads `name` now, or None when vacant."""
        return Leader.read(self._call("GET", _core.path("elections", name)))

    def observe(self, name: str) -> Iterator[LeaderEvent]:
        """Every change of `name`'s leadership, starting with the current state, for as long
        as the caller iterates; reconnects (to another replica if need be) when a stream
        ends, and is told the current state again then."""
        failures = 0
        while True:
            for url in self.servers.order():
                try:
                    with self._http.stream(
                        "GET", url + _core.observe_path(name),
                        headers=_core.headers(self.token, traceparent=self.traceparent()),
                        timeout=httpx.Timeout(self.timeout, read=None),
                    ) as resp:
                        if resp.status_code != 200:
                            raise from_response(resp.status_code, _core.parse_json(resp.read()), resp.headers)
                        self.servers.answered(url)
                        failures = 0
                        sse = _core.Sse()
                        for line in resp.iter_lines():
                            got = sse.feed(line)
                            if got is not None and got[0] != "closed":  # the replica stops: reconnect
                                yield LeaderEvent.read(name, *got)
                except (httpx.TransportError, Unavailable):
                    failures += 1
            time.sleep(_core.reconnect_pause(failures))

    def inspect(self, name: str) -> LockStatus:
        """Who holds lock `name`, if anyone (never a lease id)."""
        return LockStatus.read(self._call("GET", _core.path("locks", name)))

    def run_once_per_tick(self, name: str, fn: Callable[[Lease], Any], *, hold_at_least: float,
                          ttl: Optional[float] = None) -> TickResult:
        """Run `fn` on this instance only if no other instance runs it this tick: take
        `name` without waiting, run `fn(lease)`, and keep the lock at least `hold_at_least`
        seconds after the grant, so that instances whose clocks fire a little later find it
        held. `ran` is False when another instance had it."""
        ttl = ttl if ttl is not None else max(hold_at_least * 2, 1.0)
        try:
            lease = self.lock(name, ttl=ttl)
        except LockHeld:
            return TickResult(False)
        granted = time.monotonic()
        with lease:
            value = fn(lease)
            lease.lost.wait(max(0.0, hold_at_least - (time.monotonic() - granted)))
        return TickResult(True, value)

    # Plumbing.

    def _grant(self, kind: str, name: str, ttl: float, wait: float, owner: Optional[str],
               key: Optional[str], limit: Optional[int] = None,
               mode: Optional[str] = None, session: Optional[str] = None,
               lock_delay: Optional[float] = None) -> _core.Grant:
        body = _core.grant_body(kind, ttl, wait, owner, limit, mode, session, lock_delay)
        sent = time.monotonic()
        answer = self._call("POST", _core.path(kind, name), body=body,
                            idempotency_key=key or _core.new_idempotency_key(),
                            timeout=self.timeout + wait)
        return _core.Grant.read(kind, answer, sent)

    def _call(self, method: str, path: str, *, body: Optional[Dict[str, Any]] = None,
              idempotency_key: Optional[str] = None, timeout: Optional[float] = None,
              expect_body: bool = True,
              deadline: Optional[float] = None) -> Dict[str, Any]:
        """One request, tried on each replica in turn while none answers or a replica cannot
        reach a majority (503). Only requests that are safe to repeat come here: renews and
        releases name their lease, and grants carry an Idempotency-Key."""
        last: Optional[RedlockdError] = None
        for _ in range(_core.ROUNDS):
            for url in self.servers.order():
                each = _core.attempt_timeout(
                    timeout if timeout is not None else self.timeout, deadline)
                if each is None and last is not None:
                    raise last
                try:
                    try:
                        resp = self._http.request(
                            method, url + path, json=body,
                            headers=_core.headers(self.token, idempotency_key, self.traceparent()),
                            timeout=each if each is not None else 0.01)
                    except httpx.TransportError as e:
                        raise _core.network_error(url, e) from e
                    result = _core.answer(resp.status_code, resp.content, resp.headers, expect_body)
                    self.servers.answered(url)
                    return result
                except _core.Retry as retry:
                    last = retry.error
                except RedlockdError:
                    self.servers.answered(url)
                    raise
        assert last is not None
        raise last
