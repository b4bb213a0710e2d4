"""The README's examples, run as a newcomer copies them: each ```python block of
clients/python/README.md, with the test's servers in place of the README's and a
`send_report` that records the fencing token it was given."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import httpx

README = Path(__file__).resolve().parents[1] / "README.md"
#: The docs site's clients page shows the same five lines.
PROJECT_README = Path(__file__).resolve().parents[3] / "docs" / "clients.md"
SERVERS = '"http://redlockd-0:8080", "http://redlockd-1:8080"'


def python_blocks(readme: Path = README) -> List[str]:
    return re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)


def run_block(code: str, urls: List[str], send_report, **names) -> None:
    if "Client(" in code:
        assert SERVERS in code, "the README's example names its servers as the test expects"
        code = code.replace(SERVERS, ", ".join(f'"{u}"' for u in urls))
    scope = {"send_report": send_report, "__name__": "readme", **names}
    exec(compile(code, str(README), "exec"), scope)


def test_the_readme_has_the_sync_and_the_asyncio_forms():
    blocks = python_blocks()
    assert len(blocks) == 4, blocks
    assert "with client.lock(" in blocks[0]
    assert "async with client.lock(" in blocks[1]
    assert "with client.permit(" in blocks[2]
    assert "with client.session(" in blocks[3]


def test_the_five_lines_run_as_written(cluster):
    fences = []

    def send_report(fence):
        # While the block runs, the lock is held with this very token.
        held = httpx.get(f"{cluster.urls[0]}/locks/nightly-report", timeout=2).json()
        assert held["held"] and held["fencing_token"] == fence
        fences.append(fence)

    run_block(python_blocks()[0], cluster.urls, send_report)
    assert len(fences) == 1
    after = httpx.get(f"{cluster.urls[0]}/locks/nightly-report", timeout=2).json()
    assert after["held"] is False, "released on leaving the block"


def test_the_docs_sites_python_lines_run_as_written(cluster):
    fences = []
    blocks = python_blocks(PROJECT_README)
    assert len(blocks) == 1, blocks
    run_block(blocks[0], cluster.urls, lambda fence: fences.append(fence))
    assert len(fences) == 1
    after = httpx.get(f"{cluster.urls[0]}/locks/nightly-report", timeout=2).json()
    assert after["held"] is False


def test_the_asyncio_form_runs_as_written(cluster):
    fences = []

    async def send_report(fence):
        held = httpx.get(f"{cluster.urls[0]}/locks/nightly-report", timeout=2).json()
        assert held["held"] and held["fencing_token"] == fence
        fences.append(fence)

    run_block(python_blocks()[1], cluster.urls, send_report)
    assert len(fences) == 1
    after = httpx.get(f"{cluster.urls[0]}/locks/nightly-report", timeout=2).json()
    assert after["held"] is False, "released on leaving the block"


def test_the_permit_lines_run_as_written(cluster):
    from redlockd import Client

    client = Client(cluster.urls)
    seen = []

    def query(slot, fence):
        status = httpx.get(f"{cluster.urls[0]}/semaphores/db-pool", timeout=2).json()
        assert [(h["slot"], h["fencing_token"]) for h in status["holders"]] == [(slot, fence)]
        seen.append(slot)

    run_block(python_blocks()[2], cluster.urls, None, client=client, query=query)
    assert len(seen) == 1 and 0 <= seen[0] < 3
    after = httpx.get(f"{cluster.urls[0]}/semaphores/db-pool", timeout=2).json()
    assert after["holders"] == [], "released on leaving the block"


def test_the_session_lines_run_as_written(cluster):
    from redlockd import Client

    client = Client(cluster.urls)
    seen = []

    def ingest(partition, slot):
        # Both holds are held through one session, with their own tokens.
        lock = httpx.get(f"{cluster.urls[0]}/locks/partition-3", timeout=2).json()
        assert lock["held"] and lock["fencing_token"] == partition
        permits = httpx.get(f"{cluster.urls[0]}/semaphores/db-pool", timeout=2).json()
        assert [h["slot"] for h in permits["holders"]] == [slot]
        seen.append((partition, slot))

    run_block(python_blocks()[3], cluster.urls, None, client=client, ingest=ingest)
    assert len(seen) == 1
    # Ending the session released both.
    lock = httpx.get(f"{cluster.urls[0]}/locks/partition-3", timeout=2).json()
    assert lock["held"] is False
    permits = httpx.get(f"{cluster.urls[0]}/semaphores/db-pool", timeout=2).json()
    assert permits["holders"] == []
