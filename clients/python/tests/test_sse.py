"""The shared table of event streams (clients/cases/sse.json): every client reads each the
same way."""

import json
import pathlib

import httpx
import pytest

from redlockd import _core

CASES = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "cases" / "sse.json").read_text()
)["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["about"])
def test_each_stream_is_read_as_the_table_says(case):
    # The lines as the client reads them off a response (`iter_lines`), fed to its parser.
    response = httpx.Response(200, content=case["text"].encode())
    sse = _core.Sse()
    events = [got for line in response.iter_lines() if (got := sse.feed(line)) is not None]
    assert [[name, data] for name, data in events] == case["events"]
