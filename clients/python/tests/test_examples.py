"""The Python examples under examples/python, run as their users would, against real
masters and the redlockd binary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, wait_for

EXAMPLES = ROOT / "examples" / "python"


def run(cluster, script: str, *args: str, timeout: float = 60) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], env=env(cluster),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def env(cluster) -> dict:
    return dict(os.environ, REDLOCKD_SERVER=",".join(cluster.urls), PYTHONUNBUFFERED="1")


def start(cluster, script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(EXAMPLES / script), *args], env=env(cluster),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_cron_runs_once_on_eight_instances(cluster):
    out = run(cluster, "cron_once.py", "--instances", "8", "--tick", "t1").splitlines()
    assert len(out) == 8
    assert sum("report sent" in line for line in out) == 1, out


def test_double_submission_is_throttled(cluster):
    out = run(cluster, "throttle.py", "alice", "alice", "bob").splitlines()
    assert out[0] == "alice: accepted"
    assert out[1].startswith("alice: throttled, try again in ")
    assert out[2] == "bob: accepted"


def test_each_message_is_processed_by_one_consumer(cluster):
    out = run(cluster, "stream_consumers.py", "--messages", "40", "--consumers", "4")
    assert "messages processed: 40 of 40, each once: True" in out, out


def test_queue_workers_hand_over_when_the_leader_dies(cluster, tmp_path: Path):
    queue, done = tmp_path / "queue", tmp_path / "done"
    queue.write_text("".join(f"item-{i}\n" for i in range(40)))
    workers = [start(cluster, "queue_worker.py", "q", str(queue), str(done)) for _ in range(3)]
    try:
        wait_for("five items done", lambda: done.exists() and
                 len(done.read_text().splitlines()) >= 5 or None)
        from redlockd import Client
        leader = Client(cluster.urls).leader("queue:q")
        victim = next(w for w in workers if f"worker-{w.pid}" == leader.value)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        for w in workers:
            if w is not victim:
                assert w.wait(timeout=60) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    lines = [line.split() for line in done.read_text().splitlines()]
    assert [item for item, _ in lines] == [f"item-{i}" for i in range(40)], "each once, in order"
    terms = [int(term) for _, term in lines]
    assert terms == sorted(terms) and len(set(terms)) >= 2, terms


def test_the_standby_takes_over_and_followers_learn_of_it(cluster):
    follower = start(cluster, "standby.py", "--follow")
    primary = start(cluster, "standby.py", "10.0.0.1:5432")
    standby = None
    try:
        assert "10.0.0.1:5432: standing by" in primary.stdout.readline()
        assert "10.0.0.1:5432: primary" in primary.stdout.readline()
        standby = start(cluster, "standby.py", "10.0.0.2:5432")
        assert "standing by" in standby.stdout.readline()
        primary.send_signal(signal.SIGKILL)
        primary.wait()
        started = time.monotonic()
        assert "10.0.0.2:5432: primary" in standby.stdout.readline()
        assert time.monotonic() - started < 5, "taken over within about a TTL"
        seen = []
        while not any("10.0.0.2:5432" in line for line in seen):
            seen.append(follower.stdout.readline())
        assert any("primary is 10.0.0.1:5432" in line for line in seen), seen
        standby.send_signal(signal.SIGTERM)
        assert standby.wait(timeout=10) == 0
        assert "resigned" in standby.stdout.read()
    finally:
        for p in (follower, primary, standby):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
