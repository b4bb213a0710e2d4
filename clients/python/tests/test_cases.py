"""The shared table of answers (clients/cases/errors.json): every client classifies each the
same way."""

import json
import pathlib

import httpx
import pytest

import redlockd
from redlockd._errors import from_response

CASES = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "cases" / "errors.json").read_text()
)["cases"]

CLASSES = {
    "held": redlockd.LockHeld,
    "lease_lost": redlockd.LeaseLost,
    "bad_request": redlockd.BadRequest,
    "unauthorized": redlockd.Unauthorized,
    "forbidden": redlockd.Forbidden,
    "too_many_requests": redlockd.TooManyRequests,
    "unavailable": redlockd.Unavailable,
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['status']}-{c['class']}")
def test_each_answer_is_classified_as_the_table_says(case):
    headers = httpx.Headers({"retry-after": case["retry_after_header"]}) if "retry_after_header" in case else httpx.Headers()
    error = from_response(case["status"], case["body"], headers)
    expected = CLASSES[case["class"]]
    assert type(error) is expected, f"{case}: {type(error).__name__}"
    if case["class"] == "forbidden":
        assert isinstance(error, redlockd.Unauthorized)
    if "retry_after_ms" in case:
        assert round(error.retry_after * 1000) == case["retry_after_ms"]
