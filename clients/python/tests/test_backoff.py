"""Retries and reconnects are spread out (jittered), so that clients that failed together
do not all come back in the same instant."""

from redlockd import _core


def test_a_jittered_wait_lies_between_half_and_all_of_it_and_varies():
    waits = [_core.jittered(0.8) for _ in range(200)]
    assert all(0.4 <= w <= 0.8 for w in waits), waits
    assert len(set(waits)) > 100
    assert _core.jittered(0.0) == 0.0


def test_reconnect_pauses_double_to_two_seconds_with_jitter():
    for failures, full in [(0, 0.05), (1, 0.1), (3, 0.4), (6, 2.0), (20, 2.0)]:
        pause = _core.reconnect_pause(failures)
        assert full / 2 <= pause <= full, (failures, pause)


def test_a_failed_renew_is_retried_within_a_tenth_of_the_ttl_spread_out():
    class Held(_core.Renewable):
        def __init__(self):
            self.ttl = 10.0
            self.valid_until = 0.0

    held = Held()
    retries = [held.retry_every() for _ in range(100)]
    assert all(0.5 <= r <= 1.0 for r in retries), retries
    assert len(set(retries)) > 50
