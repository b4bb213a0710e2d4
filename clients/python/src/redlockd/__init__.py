"""redlockd client: distributed locks with auto-renew, a loss signal, fencing tokens and
safe retries, over one or more redlockd replicas.

    from redlockd import Client
    client = Client(["http://127.0.0.1:8080"])
    with client.lock("nightly-report", ttl=30) as lease:
        lease.ensure_valid()          # raises LeaseLost once the lease is gone
        send_report(fence=lease.fencing_token)
"""

from ._async import AsyncClient, AsyncLease, AsyncSession, Pending, PendingLease
from ._errors import (
    BadRequest,
    Forbidden,
    LeaseLost,
    LockHeld,
    RedlockdError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from ._models import (
    Leader,
    LeaderEvent,
    LockStatus,
    PermitHolder,
    SemaphoreStatus,
    SharedHolder,
    TickResult,
)
from ._sync import Client, Lease, Session

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "AsyncSession",
    "BadRequest",
    "Client",
    "Forbidden",
    "Leader",
    "LeaderEvent",
    "Lease",
    "LeaseLost",
    "LockHeld",
    "LockStatus",
    "Pending",
    "PendingLease",
    "PermitHolder",
    "RedlockdError",
    "SemaphoreStatus",
    "Session",
    "SharedHolder",
    "TickResult",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
]
