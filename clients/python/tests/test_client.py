"""The blocking client against real masters and the redlockd binary."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from conftest import LosingProxy, wait_for
from redlockd import BadRequest, Client, LeaseLost, LockHeld, Unavailable


def held(url: str, name: str) -> dict:
    return httpx.get(f"{url}/locks/{name}", timeout=2).json()


def test_the_readme_example_holds_a_lock_with_auto_renew(cluster):
    client = Client(cluster.urls)
    with client.lock("report", ttl=1.0) as lease:
        first = lease.fencing_token
        # Three TTLs later the lease is still valid, renewed in the background.
        time.sleep(3.0)
        lease.ensure_valid()
        assert not lease.lost.is_set()
        assert held(cluster.urls[0], "report")["fencing_token"] == first
    assert held(cluster.urls[0], "report")["held"] is False, "released on leaving the block"


def test_auto_renew_carries_on_through_a_replicas_death(two_replicas):
    a, b = two_replicas.replicas
    client = Client([a.url, b.url])
    lease = client.lock("failover", ttl=1.0)
    a.stop()
    # Past three TTLs, the lease has been renewed through the other replica.
    time.sleep(3.0)
    lease.ensure_valid()
    assert held(b.url, "failover")["fencing_token"] == lease.fencing_token
    lease.release()
    assert held(b.url, "failover")["held"] is False


def test_loss_is_signalled_when_a_majority_of_masters_stop(cluster):
    client = Client(cluster.urls)
    told = []
    lease = client.lock("majority", ttl=1.0, on_lost=told.append)
    granted = time.monotonic()
    for m in cluster.masters[:2]:
        m.pause()
    try:
        assert lease.wait_lost(timeout=5.0), "lost is set"
        # Never later than the validity the server gave (plus the loop's scheduling).
        assert time.monotonic() - granted < 1.0 + 0.25
        assert told == [lease]
        assert lease.lost_reason == "expired"
        with pytest.raises(LeaseLost):
            lease.ensure_valid()
        with pytest.raises(Unavailable):
            client.lock("other", ttl=1.0)
    finally:
        for m in cluster.masters[:2]:
            m.resume()


def test_jeopardy_is_told_before_the_loss_and_safe_when_a_renew_gets_through(cluster):
    told = []
    client = Client(cluster.urls,
                    on_jeopardy=lambda held, left: told.append(("jeopardy", held, left)),
                    on_safe=lambda held: told.append(("safe", held)))
    lease = client.lock("shaky", ttl=1.5)
    for m in cluster.masters[:2]:
        m.pause()
    try:
        deadline = time.monotonic() + 5.0
        while not told and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        for m in cluster.masters[:2]:
            m.resume()
    assert told, "jeopardy was told"
    kind, held_lease, left = told[0]
    assert (kind, held_lease) == ("jeopardy", lease)
    assert 0 < left <= 0.5 + 0.05, left
    deadline = time.monotonic() + 5.0
    while len(told) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told[1:] == [("safe", lease)], told
    assert not lease.in_jeopardy and lease.lost_reason is None
    lease.ensure_valid()
    lease.release()


def test_jeopardy_is_told_before_the_loss_when_the_replica_stops_answering(cluster):
    # A renew that hangs (the replica paused) ends at the jeopardy point, not at the end of
    # the validity: the warning comes first, with time left.
    told = []
    client = Client(cluster.urls,
                    on_jeopardy=lambda held, left: told.append(("jeopardy", left)),
                    on_safe=lambda held: told.append(("safe", 0.0)))
    lease = client.lock("hangs", ttl=3.0)
    cluster.replicas[0].pause()
    try:
        assert lease.wait_lost(timeout=6.0), "the lease is lost once its validity is over"
    finally:
        cluster.replicas[0].resume()
    assert told and told[0][0] == "jeopardy", told
    assert told[0][1] >= 0.5, f"told with only {told[0][1]:.3f} s left"
    assert lease.lost_reason == "expired"


def test_a_revoked_lease_is_lost_at_the_next_renew(cluster):
    client = Client(cluster.urls)
    lease = client.lock("revoked", ttl=0.6)
    httpx.delete(f"{cluster.urls[0]}/locks/revoked/leases/{lease.lease_id}")
    assert lease.wait_lost(timeout=2.0)
    assert lease.lost_reason == "lease_not_found"


def test_the_lock_is_released_when_the_block_raises(cluster):
    client = Client(cluster.urls)
    with pytest.raises(RuntimeError, match="boom"):
        with client.lock("raises", ttl=30):
            assert held(cluster.urls[0], "raises")["held"] is True
            raise RuntimeError("boom")
    assert held(cluster.urls[0], "raises")["held"] is False


def test_errors_are_typed(cluster):
    client = Client(cluster.urls)
    with client.lock("typed", ttl=30):
        with pytest.raises(LockHeld) as e:
            client.lock("typed", ttl=30, wait=0.05)
        assert 25 < e.value.retry_after <= 30
    with pytest.raises(BadRequest) as e:
        client.lock("no spaces allowed", ttl=30)
    assert e.value.code == "invalid_request"
    with pytest.raises(BadRequest):
        client.lock("typed", ttl=0)
    # Nothing listens here: Unavailable, never "held".
    with pytest.raises(Unavailable):
        Client(["http://127.0.0.1:9"], timeout=0.5).lock("typed")


def test_a_grant_whose_answer_is_lost_is_retried_with_its_key(two_replicas):
    a, b = two_replicas.replicas
    proxy = LosingProxy(a.url)
    try:
        client = Client([proxy.url, b.url])
        with client.lock("lost-answer", ttl=30) as lease:
            # The first attempt reached redlockd through the proxy, which lost the answer;
            # the retry went to the other replica with the same key and got that lease.
            assert len(proxy.requests) == 1
            keys = [line for line in proxy.requests[0].split(b"\r\n")
                    if line.lower().startswith(b"idempotency-key:")]
            assert len(keys) == 1
            state = held(b.url, "lost-answer")
            assert state["fencing_token"] == lease.fencing_token
            assert httpx.get(f"{b.url}/locks/lost-answer/leases/{lease.lease_id}").status_code == 200
        assert held(b.url, "lost-answer")["held"] is False, "one release frees it: one lease"
    finally:
        proxy.close()


def test_the_same_key_is_bound_to_its_request(cluster):
    client = Client(cluster.urls)
    lease = client.lock("bound", ttl=30, idempotency_key="order-42")
    again = client.lock("bound", ttl=30, idempotency_key="order-42", auto_renew=False)
    assert (again.lease_id, again.fencing_token) == (lease.lease_id, lease.fencing_token)
    with pytest.raises(BadRequest) as e:
        client.lock("bound-elsewhere", ttl=30, idempotency_key="order-42")
    assert e.value.code == "idempotency_mismatch"
    lease.release()


def test_once_per_tick_runs_on_one_of_eight_instances(cluster):
    ran = []
    results = []

    def instance(i: int) -> None:
        client = Client(cluster.urls)
        results.append(client.run_once_per_tick("tick:2026-11-23", lambda lease: ran.append(i),
                                                hold_at_least=1.0))

    threads = [threading.Thread(target=instance, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ran) == 1
    assert sorted(r.ran for r in results) == [False] * 7 + [True]


def test_campaign_and_observe(two_replicas):
    a, b = two_replicas.replicas
    client = Client([a.url, b.url])
    events = []

    def follow() -> None:
        for event in Client([b.url]).observe("primary"):
            events.append(event)
            if len(events) == 4:
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_for("the observer's first event", lambda: events or None)
    leader = client.campaign("primary", "10.0.0.1:5432", ttl=2)
    assert client.leader("primary").term == leader.term
    # An observer is told what it reads on each change; a change undone before its read
    # can go unseen, so each step waits for the observer to have seen the last.
    wait_for("the observer to see the election", lambda: len(events) >= 2 or None)
    leader.proclaim("10.0.0.1:5433")
    wait_for("the observer to see the proclaim", lambda: len(events) >= 3 or None)
    leader.release()
    follower.join(timeout=10)
    kinds = [e.kind for e in events]
    assert kinds == ["vacant", "elected", "proclaimed", "vacant"], events
    assert events[1].term == events[2].term == leader.term
    assert events[2].value == "10.0.0.1:5433"
    assert client.leader("primary") is None


def test_a_bearer_token_is_sent_and_scopes_the_lock(tmp_path):
    import hashlib
    import json

    from conftest import Cluster
    from redlockd import Unauthorized

    secret = "s3cret-token-for-jobs"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{
        "name": "jobs", "sha256": hashlib.sha256(secret.encode()).hexdigest(),
        "role": "client", "prefixes": ["jobs:"]}]}))
    bed = Cluster(masters=3, replicas=1, env={"REDLOCKD_AUTH_FILE": str(tokens)})
    replica = bed.replicas[0]
    try:
        with Client(replica.url, token=secret).lock("jobs:nightly", ttl=5) as lease:
            assert lease.fencing_token > 0
        with pytest.raises(Unauthorized) as e:
            Client(replica.url, token=secret).lock("other:nightly", ttl=5)
        assert e.value.status == 403
        with pytest.raises(Unauthorized) as e:
            Client(replica.url).lock("jobs:nightly", ttl=5)
        assert e.value.status == 401
    finally:
        bed.stop()


def test_a_server_url_without_a_scheme_is_a_configuration_error():
    import pytest as _pytest

    from redlockd import AsyncClient, Client

    for make in (Client, AsyncClient):
        with _pytest.raises(ValueError, match="http://"):
            make(["127.0.0.1:8080"])


class _Recorder:
    """A stand-in replica that records each request's headers and answers a lease."""

    def __init__(self) -> None:
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes) -> None:
                seen.append((self.command, dict(self.headers)))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's names
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(201, json.dumps({
                    "name": "t", "lease_id": "L1", "fencing_token": 7, "ttl_ms": 30000,
                    "validity_ms": 29000, "expires_at": "2026-11-24T00:00:00.000Z"}).encode())

            def do_DELETE(self) -> None:  # noqa: N802
                self._answer(204, b"")

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_every_request_carries_the_callers_trace_context():
    import asyncio

    from redlockd import AsyncClient, Client

    replica = _Recorder()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        client = Client([replica.url], traceparent=lambda: parent)
        with client.lock("t", ttl=30, auto_renew=False):
            pass

        async def main() -> None:
            async with AsyncClient([replica.url], traceparent=lambda: parent) as aclient:
                async with aclient.lock("t", ttl=30, auto_renew=False):
                    pass

        asyncio.run(main())
        methods = [m for m, _ in replica.seen]
        assert methods == ["POST", "DELETE", "POST", "DELETE"]
        assert all(h.get("traceparent") == parent for _, h in replica.seen), replica.seen
        # Without OpenTelemetry in the application and no function given: no header.
        Client([replica.url]).lock("t", ttl=30, auto_renew=False).release()
        assert "traceparent" not in replica.seen[-1][1]
    finally:
        replica.close()


def test_inspect_says_who_holds_a_lock_typed(cluster):
    client = Client(cluster.urls)
    free = client.inspect("inspected")
    assert (free.held, free.fencing_token, free.owner) == (False, None, None)
    with client.lock("inspected", ttl=30.0, owner="worker-7") as lease:
        status = client.inspect("inspected")
        assert status.held and status.name == "inspected"
        assert status.fencing_token == lease.fencing_token
        assert status.owner == "worker-7"
        assert 0 < status.ttl_remaining <= 30.0


def test_a_permit_is_a_lease_on_one_of_limit_slots_with_renew_and_a_loss_signal(cluster):
    client = Client(cluster.urls)
    told = []
    with client.permit("db-pool", 2, ttl=1.0, owner="py-1") as first, \
            client.permit("db-pool", 2, ttl=1.0, on_lost=told.append) as second:
        assert {first.slot, second.slot} == {0, 1}
        assert (first.limit, second.limit) == (2, 2)
        with pytest.raises(LockHeld):
            client.permit("db-pool", 2, ttl=1.0)
        # Three TTLs later both are still held, renewed in the background.
        time.sleep(3.0)
        first.ensure_valid()
        status = client.semaphore("db-pool")
        assert [h.slot for h in status.holders] == [0, 1]
        assert {h.fencing_token for h in status.holders} == {first.fencing_token, second.fencing_token}
        assert [h.owner for h in status.holders if h.slot == first.slot] == ["py-1"]
        # Released by someone who knows its id: lost at the next renew, and said so.
        httpx.delete(f"{cluster.urls[0]}/semaphores/db-pool/leases/{second.lease_id}")
        assert second.wait_lost(timeout=2.0)
        assert told == [second] and second.lost_reason == "lease_not_found"
    assert client.semaphore("db-pool").holders == (), "released on leaving the block"


def test_shared_leases_hold_a_lock_together_and_an_exclusive_one_waits(cluster):
    client = Client(cluster.urls)
    with client.lock("file", ttl=1.0, mode="shared", owner="reader-1") as r1, \
            client.lock("file", ttl=1.0, mode="shared", owner="reader-2") as r2:
        assert (r1.mode, r2.mode) == ("shared", "shared")
        with pytest.raises(LockHeld):
            client.lock("file", ttl=1.0)
        time.sleep(2.5)  # renewed in the background, both
        r1.ensure_valid()
        status = client.inspect("file")
        assert status.mode == "shared" and status.fencing_token == max(r1.fencing_token, r2.fencing_token)
        assert sorted(h.owner for h in status.holders) == ["reader-1", "reader-2"]
    with client.lock("file", ttl=1.0) as writer:
        assert writer.mode == "exclusive" and writer.fencing_token > r2.fencing_token
        assert client.inspect("file").mode == "exclusive"


def test_several_names_are_one_lease_all_or_none(cluster):
    client = Client(cluster.urls)
    with client.lock("acct:1", ttl=30):
        with pytest.raises(LockHeld):
            client.lock_many(["acct:2", "acct:1"], ttl=1.0)
        assert held(cluster.urls[0], "acct:2")["held"] is False, "none taken"
    with client.lock_many(["acct:2", "acct:1"], ttl=1.0) as lease:
        assert lease.names == ("acct:1", "acct:2")
        time.sleep(2.5)  # renewed in the background, both names
        lease.ensure_valid()
        for name in lease.names:
            assert held(cluster.urls[0], name)["fencing_token"] == lease.fencing_token
    for name in ("acct:1", "acct:2"):
        assert held(cluster.urls[0], name)["held"] is False


def test_a_session_holds_a_lock_a_permit_and_a_shared_lock_with_one_heartbeat(cluster):
    client = Client(cluster.urls)
    with client.session(ttl=1.0, owner="py-session") as session:
        lock = session.lock("s:lock")
        permit = session.permit("s:pool", 1)
        shared = session.lock("s:doc", mode="shared")
        # Two TTLs later all three are still held: only the session was renewed.
        time.sleep(2.0)
        for lease in (lock, permit, shared):
            lease.ensure_valid()
        assert held(cluster.urls[0], "s:lock")["held"] is True
        assert len(session.info()["holds"]) == 3
        with pytest.raises(LockHeld):
            client.lock("s:lock", ttl=1.0)
    # Ending the session released every hold at once.
    assert held(cluster.urls[0], "s:lock")["held"] is False
    assert held(cluster.urls[0], "s:doc")["held"] is False
    assert client.semaphore("s:pool").holders == ()
    with pytest.raises(LeaseLost):
        client._call("PUT", f"/sessions/{session.session_id}", body={})


def test_a_lost_session_marks_its_holds_lost(cluster):
    client = Client(cluster.urls)
    told = []
    session = client.session(ttl=1.0, on_lost=told.append)
    lock = session.lock("s:lost")
    # Someone ends the session behind the client's back: the next renew finds it gone.
    httpx.delete(f"{cluster.urls[0]}/sessions/{session.session_id}")
    assert session.lost.wait(timeout=2.0)
    assert told == [session] and session.lost_reason == "session_not_found"
    assert lock.lost.is_set()
    with pytest.raises(LeaseLost):
        lock.ensure_valid()


def test_a_session_renew_marks_a_force_released_hold_lost(cluster):
    client = Client(cluster.urls)
    with client.session(ttl=5.0) as session:
        lock = session.lock("s:forced")
        kept = session.lock("s:kept")
        # An administrator takes the lock away: the next renew does not keep it, and the
        # client must stop relying on it (before, it was extended with the session).
        assert httpx.delete(f"{cluster.urls[0]}/locks/s:forced").status_code == 200
        # The renew that names it lost has its answer lost (sent past the client); the
        # client's own renew after it must still stop relying on the hold.
        client._call("PUT", f"/sessions/{session.session_id}", body={})
        session.renew()
        assert lock.lost.is_set() and lock.lost_reason == "lease_not_found"
        with pytest.raises(LeaseLost):
            lock.ensure_valid()
        session.renew()
        kept.ensure_valid()
        assert session.holds == [kept]


def test_a_lock_through_a_session_takes_a_lock_delay_too(cluster):
    client = Client(cluster.urls)
    with client.session(ttl=5.0) as session:
        session.lock("s:sdelay", lock_delay=1.0)
        # Force-released: ended other than by its holder, so its lock-delay applies.
        assert httpx.delete(f"{cluster.urls[0]}/locks/s:sdelay").status_code == 200
        with pytest.raises(LockHeld) as refused:
            client.lock("s:sdelay", ttl=1.0)
        assert refused.value.code == "lock_delay"


def test_a_lock_delay_refuses_the_name_after_a_lease_that_lapsed(cluster):
    client = Client(cluster.urls)
    client.lock("s:delay", ttl=0.3, lock_delay=1.0, auto_renew=False)
    wait_for("the lease to lapse", lambda: held(cluster.urls[0], "s:delay")["held"] is False)
    with pytest.raises(LockHeld) as refused:
        client.lock("s:delay", ttl=1.0)
    assert refused.value.code == "lock_delay" and 0 < refused.value.retry_after <= 1.0
    # Validity counts from when the grant was sent: a TTL longer than the wait.
    with client.lock("s:delay", ttl=10.0, wait=2.0) as after:
        after.ensure_valid()
