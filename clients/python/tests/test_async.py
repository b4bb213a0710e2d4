"""The asyncio client against real masters and the redlockd binary."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from redlockd import AsyncClient, LeaseLost


def held(url: str, name: str) -> dict:
    return httpx.get(f"{url}/locks/{name}", timeout=2).json()


def test_async_lock_renews_and_releases_on_exception(cluster):
    async def main() -> None:
        async with AsyncClient(cluster.urls) as client:
            with pytest.raises(RuntimeError):
                async with await client.lock("async", ttl=1.0) as lease:
                    await asyncio.sleep(2.5)
                    lease.ensure_valid()
                    assert held(cluster.urls[0], "async")["fencing_token"] == lease.fencing_token
                    raise RuntimeError("boom")
            assert held(cluster.urls[0], "async")["held"] is False

    asyncio.run(main())


def test_async_loss_is_signalled_when_a_majority_stops(cluster):
    async def main() -> None:
        told = []

        async def on_lost(lease) -> None:
            told.append(lease.lost_reason)

        async with AsyncClient(cluster.urls) as client:
            lease = await client.lock("async-lost", ttl=1.0, on_lost=on_lost)
            granted = time.monotonic()
            for m in cluster.masters[:2]:
                m.pause()
            await asyncio.wait_for(lease.lost.wait(), 5)
            assert time.monotonic() - granted < 1.25
            assert told == ["expired"]
            with pytest.raises(LeaseLost):
                lease.ensure_valid()

    try:
        asyncio.run(main())
    finally:
        for m in cluster.masters[:2]:
            m.resume()


def test_async_jeopardy_and_safe_are_told_to_coroutines(cluster):
    async def main() -> None:
        told = []

        async def on_jeopardy(held, left) -> None:
            told.append(("jeopardy", type(held).__name__))

        async def on_safe(held) -> None:
            told.append(("safe", type(held).__name__))

        async with AsyncClient(cluster.urls, on_jeopardy=on_jeopardy, on_safe=on_safe) as client:
            session = await client.session(ttl=1.5)
            for m in cluster.masters[:2]:
                m.pause()
            try:
                deadline = time.monotonic() + 5.0
                while not told and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                for m in cluster.masters[:2]:
                    m.resume()
            assert session.in_jeopardy
            deadline = time.monotonic() + 5.0
            while len(told) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert [kind for kind, _ in told] == ["jeopardy", "safe"], told
            assert not session.in_jeopardy and session.lost_reason is None
            await session.end()

    try:
        asyncio.run(main())
    finally:
        for m in cluster.masters[:2]:
            m.resume()


def test_async_once_per_tick(cluster):
    async def main() -> None:
        ran = []
        clients = [AsyncClient(cluster.urls) for _ in range(8)]

        async def job(lease) -> str:
            ran.append(lease.fencing_token)
            return "done"

        results = await asyncio.gather(
            *(c.run_once_per_tick("async-tick", job, hold_at_least=0.5) for c in clients))
        assert len(ran) == 1
        assert [r.value for r in results if r.ran] == ["done"]
        for c in clients:
            await c.aclose()

    asyncio.run(main())


def test_async_permit_holds_a_slot_and_releases_it(cluster):
    async def main() -> None:
        async with AsyncClient(cluster.urls) as client:
            async with client.permit("async-pool", 1, ttl=1.0) as permit:
                assert (permit.slot, permit.limit) == (0, 1)
                await asyncio.sleep(2.5)
                permit.ensure_valid()
                status = await client.semaphore("async-pool")
                assert [h.fencing_token for h in status.holders] == [permit.fencing_token]
            assert (await client.semaphore("async-pool")).holders == ()

    asyncio.run(main())


def test_async_session_holds_locks_and_ends_them_together(cluster):
    async def main():
        async with AsyncClient(cluster.urls) as client:
            async with await client.session(ttl=1.0) as session:
                lock = await session.lock("as:lock")
                permit = await session.permit("as:pool", 1)
                await asyncio.sleep(2.0)  # only the session is renewed
                lock.ensure_valid()
                permit.ensure_valid()
                assert len((await session.info())["holds"]) == 2
            status = await client.inspect("as:lock")
            assert status.held is False
            assert (await client.semaphore("as:pool")).holders == ()
    asyncio.run(main())


def test_async_session_is_a_context_manager_without_await_as_a_lock_is(cluster):
    async def main():
        async with AsyncClient(cluster.urls) as client:
            async with client.session(ttl=5.0) as session:
                lock = await session.lock("as:direct")
                assert (await client.inspect("as:direct")).held is True
            assert lock.released
            assert (await client.inspect("as:direct")).held is False
    asyncio.run(main())
