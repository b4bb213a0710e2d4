"""Real parts for the client's tests: redis-server masters and the project's `redlockd`
binary in front of them, started and stopped by scripts/client-bed (the launcher the
TypeScript and Go suites use too); a proxy that can lose answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], Optional[T]], timeout: float = 10.0) -> T:
    """Poll `check` until it returns something other than None, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - not there yet
            value = None
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


BED = ROOT / "scripts" / "client-bed"


class Started:
    """A process the test bed started for this suite (a master or a replica): a test may
    pause, resume or stop it, by the PID the bed gave."""

    def __init__(self, entry: dict) -> None:
        self.url: str = entry["url"]
        self.pid: int = entry["pid"]

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill it, and wait until its port refuses connections."""
        os.kill(self.pid, signal.SIGCONT)
        os.kill(self.pid, signal.SIGKILL)
        host, port = self.url.split("//")[1].split(":")

        def refused() -> Optional[bool]:
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
                return None
            except OSError:
                return True

        wait_for(f"{self.url} to stop", refused)


class Cluster:
    """Masters and `redlockd` replicas over them, from scripts/client-bed (the launcher
    every client's suite uses); `env` is set for every replica."""

    def __init__(self, masters: int = 3, replicas: int = 1,
                 env: Optional[dict] = None) -> None:
        args = [sys.executable, str(BED), "--masters", str(masters), "--replicas", str(replicas)]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        self.bed = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.bed.stdout is not None
        line = self.bed.stdout.readline()
        if not line:
            self.bed.wait()
            raise RuntimeError("scripts/client-bed could not start the bed (see its stderr)")
        started = json.loads(line)
        self.masters = [Started(m) for m in started["masters"]]
        self.replicas = [Started(r) for r in started["replicas"]]

    @property
    def urls(self) -> List[str]:
        return [r.url for r in self.replicas]

    def stop(self) -> None:
        """Close the bed's input: it stops everything it started."""
        assert self.bed.stdin is not None
        self.bed.stdin.close()
        self.bed.wait()


class LosingProxy:
    """Forwards each HTTP request to `upstream` and, while `lose` is set, reads the
    upstream's answer but closes the client's connection without it: a response lost on
    the network after the server acted. Records each request's head."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.lose = True
        self.requests: List[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, socket.create_connection(self.upstream) as up:
            request = _read_request(conn)
            if not request:
                return
            self.requests.append(request)
            up.sendall(request)
            answer = up.recv(65536)
            if not self.lose:
                conn.sendall(answer)

    def close(self) -> None:
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def cluster():
    c = Cluster(masters=3, replicas=1)
    yield c
    c.stop()


@pytest.fixture
def two_replicas():
    c = Cluster(masters=3, replicas=2)
    yield c
    c.stop()
