"""The errors a redlockd client raises: one class per thing a caller does differently."""

from __future__ import annotations

from typing import Any, Dict, Optional


class RedlockdError(Exception):
    """Base of every error this client raises. `code` is the contract's error code (or
    `network` when no server answered) and `status` the HTTP status (0 without one)."""

    def __init__(self, message: str, code: str = "", status: int = 0, body: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.code = code
        self.status = status
        self.body = body or {}


class LockHeld(RedlockdError):
    """Another lease holds the lock (after `wait`, if any). `retry_after` is in seconds:
    when the holder's lease lapses unless renewed."""

    @property
    def retry_after(self) -> float:
        return float(self.body.get("retry_after_ms", 0)) / 1000.0


class Unavailable(RedlockdError):
    """No replica could reach a majority of masters, or none answered: the lock's state is
    unknown. Not "held": try later, or fail over."""


class LeaseLost(RedlockdError):
    """The lease no longer protects anything: revoked, expired, or its validity ran out
    before a renew succeeded (for a session: the session is gone, code
    `session_not_found`). Stop the protected work."""


class BadRequest(RedlockdError):
    """The request is wrong (a bad name, TTL, Idempotency-Key reused for another request):
    retrying it as is will not help."""


class Unauthorized(RedlockdError):
    """No token, or one the server does not know (401); or, as `Forbidden`, one not allowed
    to do this (403)."""


class Forbidden(Unauthorized):
    """The token is known, but its role or name prefixes do not allow this (403). An
    `Unauthorized` too, so `except Unauthorized` catches both."""


class TooManyRequests(RedlockdError):
    """Past a server cap or the token's rate (429); `retry_after` is in seconds."""

    def __init__(self, message: str, code: str = "", status: int = 0, body: Optional[Dict[str, Any]] = None,
                 retry_after: float = 1.0):
        super().__init__(message, code, status, body)
        self.retry_after = retry_after


def from_response(status: int, body: Any, headers: Any = None) -> RedlockdError:
    """The typed error for a non-2xx answer with the contract's error body."""
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("error", ""))
    message = str(body.get("message", "")) or f"HTTP {status}"
    text = f"{code}: {message}" if code else message
    if status == 409:
        return LockHeld(text, code, status, body)
    if status == 404 and code in ("lease_not_found", "session_not_found"):
        return LeaseLost(text, code, status, body)
    if status == 401:
        return Unauthorized(text, code, status, body)
    if status == 403:
        return Forbidden(text, code, status, body)
    if status == 429:
        after = 1.0
        if headers is not None and headers.get("retry-after"):
            try:
                after = float(headers.get("retry-after"))
            except ValueError:
                pass
        return TooManyRequests(text, code, status, body, retry_after=after)
    if status in (408, 503):
        # 408: the body did not reach the server in time; another try (or replica) may.
        return Unavailable(text, code, status, body)
    if 400 <= status < 500:
        return BadRequest(text, code, status, body)
    return Unavailable(text, code or "server_error", status, body)
