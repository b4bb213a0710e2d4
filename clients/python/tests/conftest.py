"""Real parts for the client's tests: redis-server masters on free loopback ports, each in
its own directory, and the project's `redlockd` binary in front of them; a proxy that can
lose answers. Everything started here is stopped here, by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import httpx
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary() -> str:
    path = os.environ.get("REDLOCKD_BIN")
    if path:
        return path
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "debug" / "redlockd")


class Master:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="redlockd-py-master-")
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        for _ in range(5):
            self.port = free_port()
            if self._spawn():
                return
        raise RuntimeError("could not start redis-server on a free port")

    def _spawn(self) -> bool:
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--logfile", "redis.log"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Replica:
    """A `redlockd` process over the given masters."""

    def __init__(self, masters: List[Master], extra_env: Optional[dict] = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "PATH": os.environ.get("PATH", ""),
            "REDLOCKD_LISTEN": f"127.0.0.1:{self.port}",
            "REDLOCKD_REDIS_URLS": ",".join(m.url for m in masters),
            "RUST_LOG": "warn",
        }
        env.update(extra_env or {})
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([binary()], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for(f"redlockd on {self.url} to be ready",
                 lambda: httpx.get(self.url + "/readyz", timeout=1).json().get("ready"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Cluster:
    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        self.masters = [Master() for _ in range(masters)]
        self.replicas = [Replica(self.masters) for _ in range(replicas)]

    @property
    def urls(self) -> List[str]:
        return [r.url for r in self.replicas]

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()
        for m in self.masters:
            m.stop()


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
