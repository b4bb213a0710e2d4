"""The asyncio client: `AsyncClient` and its `AsyncLease`, renewed by a task."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Generator, Generic, Optional,
                    Sequence, TypeVar, Union)

import httpx

from . import _core
from ._errors import LeaseLost, LockHeld, RedlockdError, Unavailable, from_response
from ._models import Leader, LeaderEvent, LockStatus, SemaphoreStatus, TickResult

log = logging.getLogger("redlockd")

OnLost = Callable[["AsyncLease"], Union[None, Awaitable[None]]]


class _RenewsItself:
    """A task's renewing, for a lease and a session alike: at a third of the TTL, a failed
    renew again every tenth of it while still valid, and the loss signalled at the end of
    the validity at the latest."""

    # Each user has these: `renew()`, `renew_every()`, `retry_every()`, `_lose(reason)`,
    # `_done()` (released or ended).
    valid_until: float
    in_jeopardy: bool

    async def _renew_loop(self) -> None:
        delay = self.renew_every()  # type: ignore[attr-defined]
        while True:
            await asyncio.sleep(delay)
            if self._done():  # type: ignore[attr-defined]
                return
            try:
                await self.renew()  # type: ignore[attr-defined]
                delay = self.renew_every()  # type: ignore[attr-defined]
                if self.in_jeopardy:
                    self.in_jeopardy = False
                    await self._client._tell(self._client.on_safe, self)  # type: ignore[attr-defined]
            except LeaseLost:
                return
            except RedlockdError as e:
                log.debug("renew of %r failed: %s", self, e)
                delay = self.retry_every()  # type: ignore[attr-defined]
            now = time.monotonic()
            left = self.valid_until - now
            if left <= 0:
                await self._lose("expired")  # type: ignore[attr-defined]
                return
            due = self.jeopardy_in(now)  # type: ignore[attr-defined]
            if due == 0.0:
                self.in_jeopardy = True
                await self._client._tell(self._client.on_jeopardy, self, left)  # type: ignore[attr-defined]
            elif due is not None:
                delay = min(delay, due)
            delay = min(delay, left)


class AsyncLease(_core.LeaseState, _RenewsItself):
    """A granted lease, renewed by a task at a third of its TTL until released; `lost` is
    set (and `on_lost` called, once) when it can no longer be relied on. `async with`
    releases it on leaving the block, exception or not."""

    def __init__(self, client: "AsyncClient", grant: _core.Grant, on_lost: Optional[OnLost] = None,
                 auto_renew: bool = True):
        super().__init__(grant)
        self._client = client
        self._on_lost = on_lost
        self.lost = asyncio.Event()
        self._task: Optional[asyncio.Task[None]] = None
        if auto_renew:
            self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def renew(self, ttl: Optional[float] = None, *, value: Optional[str] = None) -> None:
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl_ms"] = max(1, int(ttl * 1000))
        if value is not None:
            body["value"] = value
        sent = time.monotonic()
        timeout = self.renew_timeout(sent, self._client.timeout)
        try:
            answer = await self._client._call(
                "PUT", _core.path(self.kind, self.name, self.lease_id), body=body,
                timeout=timeout, deadline=sent + timeout)
        except LeaseLost:
            await self._lose("lease_not_found")
            raise
        self.renewed(answer, sent)

    async def proclaim(self, value: str) -> None:
        await self.renew(value=value)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        try:
            await self._client._call("DELETE", _core.path(self.kind, self.name, self.lease_id),
                                     expect_body=False)
        except LeaseLost:
            pass

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.release()
        except RedlockdError as e:
            log.warning("release of %s failed (%s); it lapses at its TTL", self.name, e)

    async def _lose(self, reason: str) -> None:
        if self.lost_reason is not None or self.released:
            return
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is not None:
            try:
                result = self._on_lost(self)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
                log.exception("on_lost callback for %s failed", self.name)

    def _done(self) -> bool:
        return self.released


_Held = TypeVar("_Held", "AsyncLease", "AsyncSession")


class Pending(Awaitable[_Held], Generic[_Held]):
    """A grant (or a session) not yet made: `await` it for the `AsyncLease` (or
    `AsyncSession`), or use it directly in `async with` (made on entering the block, ended
    on leaving it). Nothing is sent until one of the two happens."""

    def __init__(self, make: Callable[[], Awaitable[_Held]]):
        self._make: Callable[[], Awaitable[_Held]] = make
        self._held: Optional[_Held] = None

    async def _get(self) -> _Held:
        if self._held is None:
            self._held = await self._make()
        return self._held

    def __await__(self) -> Generator[Any, None, _Held]:
        return self._get().__await__()

    async def __aenter__(self) -> _Held:
        held = await self._get()
        await held.__aenter__()
        return held

    async def __aexit__(self, *exc: Any) -> None:
        if self._held is not None:
            await self._held.__aexit__(*exc)


PendingLease = Pending[AsyncLease]


class AsyncSession(_core.SessionState, _RenewsItself):
    """The asyncio flavour of `Session`: renewed by a task at a third of its TTL until
    ended; `async with` ends it (releasing every hold through it) on leaving the block."""

    def __init__(self, client: "AsyncClient", body: Dict[str, Any], sent: float,
                 on_lost: Optional[Callable[["AsyncSession"], Any]] = None):
        super().__init__(body, sent)
        self._client = client
        self._on_lost = on_lost
        self.lost = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def lock(self, name: str, *, wait: float = 0.0, owner: Optional[str] = None,
                   mode: str = "exclusive", idempotency_key: Optional[str] = None,
                   lock_delay: Optional[float] = None) -> AsyncLease:
        """Lock `name` through this session (`SessionState.lock`'s arguments)."""
        return self._hold(await self._client._grant(
            "locks", name, self.ttl, wait, owner, idempotency_key, mode=mode,
            session=self.session_id, lock_delay=lock_delay))

    async def permit(self, name: str, limit: int, *, wait: float = 0.0,
                     owner: Optional[str] = None,
                     idempotency_key: Optional[str] = None) -> AsyncLease:
        """One of `limit` permits of semaphore `name`, through this session."""
        return self._hold(await self._client._grant(
            "semaphores", name, self.ttl, wait, owner, idempotency_key, limit,
            session=self.session_id))

    async def lock_many(self, names: Sequence[str], *, wait: float = 0.0,
                        owner: Optional[str] = None,
                        idempotency_key: Optional[str] = None) -> AsyncLease:
        """Every one of `names` under one lease, through this session."""
        body = _core.grant_body("locks", self.ttl, wait, owner, session=self.session_id)
        body["names"] = list(names)
        sent = time.monotonic()
        answer = await self._client._call(
            "POST", "/locks", body=body,
            idempotency_key=idempotency_key or _core.new_idempotency_key(),
            timeout=self._client.timeout + wait)
        return self._hold(_core.Grant.read("locks", answer, sent))

    async def campaign(self, name: str, value: Optional[str] = None, *,
                       wait: float = 0.0) -> AsyncLease:
        """Become leader of election `name` through this session."""
        return self._hold(await self._client._grant(
            "elections", name, self.ttl, wait, value, None, session=self.session_id))

    async def renew(self) -> None:
        """Renew the session, and every hold through it, now."""
        sent = time.monotonic()
        timeout = self.renew_timeout(sent, self._client.timeout)
        try:
            answer = await self._client._call("PUT", f"/sessions/{self.session_id}", body={},
                                              timeout=timeout, deadline=sent + timeout)
        except LeaseLost:
            await self._lose("session_not_found")
            raise
        for hold, reason in self.renewed(answer, sent):
            await hold._lose(reason)  # type: ignore[attr-defined]

    async def info(self) -> Dict[str, Any]:
        """The session as the server reads it, with `holds`."""
        return await self._client._call("GET", f"/sessions/{self.session_id}")

    async def end(self) -> None:
        """End the session: every hold through it is released."""
        if self.ended:
            return
        self.ended = True
        if self._task is not asyncio.current_task():
            self._task.cancel()
        for hold in self.holds:
            hold.released = True
        try:
            await self._client._call("DELETE", f"/sessions/{self.session_id}",
                                     expect_body=False)
        except LeaseLost:
            pass

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.end()
        except RedlockdError as e:
            log.warning("end of session failed (%s); it lapses at its TTL", e)

    def _hold(self, grant: _core.Grant) -> AsyncLease:
        lease = AsyncLease(self._client, grant, auto_renew=False)
        self.holds.append(lease)
        return lease

    async def _lose(self, reason: str) -> None:
        if self.lost_reason is not None or self.ended:
            return
        self.lost_reason = reason
        self.lost.set()
        for hold in self.holds:
            await hold._lose(reason)  # type: ignore[attr-defined]
        if self._on_lost is not None:
            try:
                result = self._on_lost(self)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
                log.exception("on_lost callback of a session failed")

    def _done(self) -> bool:
        return self.ended


class AsyncClient:
    """The asyncio flavour of `Client`, with the same behaviour."""

    def __init__(self, servers: Union[str, Sequence[str]], *, token: Optional[str] = None,
                 timeout: float = 5.0, http: Optional[httpx.AsyncClient] = None,
                 traceparent: Optional[_core.TraceContext] = None,
                 on_jeopardy: Optional[Callable[[Any, float], Any]] = None,
                 on_safe: Optional[Callable[[Any], Any]] = None):
        """`on_jeopardy` and `on_safe` as `Client`'s (either may be a coroutine function)."""
        self.on_jeopardy = on_jeopardy
        self.on_safe = on_safe
        self.servers = _core.Servers(servers)
        self.token = token
        # Each request carries the caller's trace (W3C `traceparent`): from this function,
        # or by default from OpenTelemetry when the application uses it.
        self.traceparent = traceparent or _core.opentelemetry_traceparent
        self.timeout = timeout
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    @staticmethod
    async def _tell(callback: Optional[Callable[..., Any]], *args: Any) -> None:
        if callback is None:
            return
        try:
            result = callback(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:  # noqa: BLE001 - a callback's bug must not kill the renewer
            log.exception("a jeopardy or safe callback failed")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def lock(self, name: str, ttl: float = 30.0, *, wait: float = 0.0,
             owner: Optional[str] = None, on_lost: Optional[OnLost] = None,
             auto_renew: bool = True, idempotency_key: Optional[str] = None,
             mode: str = "exclusive", lock_delay: Optional[float] = None) -> PendingLease:
        """`lease = await client.lock(...)`, or `async with client.lock(...) as lease:`;
        `mode="shared"` and `lock_delay` as `Client.lock`."""
        async def grant() -> AsyncLease:
            made = await self._grant("locks", name, ttl, wait, owner, idempotency_key, mode=mode,
                                     lock_delay=lock_delay)
            return AsyncLease(self, made, on_lost, auto_renew)
        return PendingLease(grant)

    def session(self, ttl: float = 30.0, *, owner: Optional[str] = None,
                on_lost: Optional[Callable[[AsyncSession], Any]] = None) -> "Pending[AsyncSession]":
        """`Client.session`: `async with client.session(15) as session:` (or
        `session = await client.session(15)`)."""
        body: Dict[str, Any] = {"ttl_ms": max(1, int(ttl * 1000))}
        if owner is not None:
            body["owner"] = owner

        async def open_session() -> AsyncSession:
            sent = time.monotonic()
            answer = await self._call("POST", "/sessions", body=body)
            return AsyncSession(self, answer, sent, on_lost)
        return Pending(open_session)

    def lock_many(self, names: Sequence[str], ttl: float = 30.0, *, wait: float = 0.0,
                  owner: Optional[str] = None, on_lost: Optional[OnLost] = None,
                  auto_renew: bool = True, idempotency_key: Optional[str] = None) -> PendingLease:
        """`Client.lock_many`: `async with client.lock_many(["a", "b"]) as lease:`."""
        async def grant() -> AsyncLease:
            body = _core.grant_body("locks", ttl, wait, owner)
            body["names"] = list(names)
            sent = time.monotonic()
            answer = await self._call("POST", "/locks", body=body,
                                      idempotency_key=idempotency_key or _core.new_idempotency_key(),
                                      timeout=self.timeout + wait)
            return AsyncLease(self, _core.Grant.read("locks", answer, sent), on_lost, auto_renew)
        return PendingLease(grant)

    def permit(self, name: str, limit: int, ttl: float = 30.0, *, wait: float = 0.0,
               owner: Optional[str] = None, on_lost: Optional[OnLost] = None,
               auto_renew: bool = True, idempotency_key: Optional[str] = None) -> PendingLease:
        """One of `limit` permits of semaphore `name`, as `lock` (the lease's `slot` says
        which): `async with client.permit("db-pool", 3) as permit:`."""
        async def grant() -> AsyncLease:
            made = await self._grant("semaphores", name, ttl, wait, owner, idempotency_key, limit)
            return AsyncLease(self, made, on_lost, auto_renew)
        return PendingLease(grant)

    async def semaphore(self, name: str) -> SemaphoreStatus:
        """The permits of semaphore `name` held now, by slot (never a lease id)."""
        return SemaphoreStatus.read(await self._call("GET", _core.path("semaphores", name)))

    def campaign(self, name: str, value: Optional[str] = None, *, ttl: float = 10.0,
                 wait: float = 0.0, on_lost: Optional[OnLost] = None) -> PendingLease:
        """`lease = await client.campaign(...)`, or `async with client.campaign(...)`."""
        async def grant() -> AsyncLease:
            made = await self._grant("elections", name, ttl, wait, value, None)
            return AsyncLease(self, made, on_lost)
        return PendingLease(grant)

    async def leader(self, name: str) -> Optional[Leader]:
        return Leader.read(await self._call("GET", _core.path("elections", name)))

    async def observe(self, name: str) -> AsyncIterator[LeaderEvent]:
        failures = 0
        while True:
            for url in self.servers.order():
                try:
                    async with self._http.stream(
                        "GET", url + _core.observe_path(name),
                        headers=_core.headers(self.token, traceparent=self.traceparent()),
                        timeout=httpx.Timeout(self.timeout, read=None),
                    ) as resp:
                        if resp.status_code != 200:
                            raise from_response(resp.status_code, _core.parse_json(await resp.aread()),
                                                resp.headers)
                        self.servers.answered(url)
                        failures = 0
                        sse = _core.Sse()
                        async for line in resp.aiter_lines():
                            got = sse.feed(line)
                            if got is not None and got[0] != "closed":  # the replica stops: reconnect
                                yield LeaderEvent.read(name, *got)
                except (httpx.TransportError, Unavailable):
                    failures += 1
            await asyncio.sleep(_core.reconnect_pause(failures))

    async def inspect(self, name: str) -> LockStatus:
        """Who holds lock `name`, if anyone (never a lease id)."""
        return LockStatus.read(await self._call("GET", _core.path("locks", name)))

    async def run_once_per_tick(self, name: str, fn: Callable[[AsyncLease], Awaitable[Any]], *,
                                hold_at_least: float, ttl: Optional[float] = None) -> TickResult:
        ttl = ttl if ttl is not None else max(hold_at_least * 2, 1.0)
        try:
            lease = await self.lock(name, ttl=ttl)
        except LockHeld:
            return TickResult(False)
        granted = time.monotonic()
        async with lease:
            value = await fn(lease)
            left = hold_at_least - (time.monotonic() - granted)
            if left > 0:
                try:
                    await asyncio.wait_for(lease.lost.wait(), left)
                except asyncio.TimeoutError:
                    pass
        return TickResult(True, value)

    async def _grant(self, kind: str, name: str, ttl: float, wait: float, owner: Optional[str],
                     key: Optional[str], limit: Optional[int] = None,
                     mode: Optional[str] = None, session: Optional[str] = None,
                     lock_delay: Optional[float] = None) -> _core.Grant:
        body = _core.grant_body(kind, ttl, wait, owner, limit, mode, session, lock_delay)
        sent = time.monotonic()
        answer = await self._call("POST", _core.path(kind, name), body=body,
                                  idempotency_key=key or _core.new_idempotency_key(),
                                  timeout=self.timeout + wait)
        return _core.Grant.read(kind, answer, sent)

    async def _call(self, method: str, path: str, *, body: Optional[Dict[str, Any]] = None,
                    idempotency_key: Optional[str] = None, timeout: Optional[float] = None,
                    expect_body: bool = True,
                    deadline: Optional[float] = None) -> Dict[str, Any]:
        last: Optional[RedlockdError] = None
        for _ in range(_core.ROUNDS):
            for url in self.servers.order():
                each = _core.attempt_timeout(
                    timeout if timeout is not None else self.timeout, deadline)
                if each is None and last is not None:
                    raise last
                try:
                    try:
                        resp = await self._http.request(
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
