//! What the lease service answers when it cannot do what was asked: the one error type the
//! HTTP layer sees, with the engine's per-master picture kept for the 503 body.

use std::time::Duration;

use crate::model::Unavailability;
use crate::redlock::EngineError;

/// How long a grant that kept meeting split votes is told to wait: contenders release what
/// they won at once, so the lock is about to be free.
const AFTER_A_SPLIT: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// Another lease holds the lock; it lapses in `retry_after` unless renewed.
    #[error("the lock is held by another lease")]
    Held { retry_after: Duration },
    /// The lock is free, but the lock-delay of a lease that ended without its holder's
    /// revoke refuses it for `retry_after` more.
    #[error("the lock is in its lock-delay: a lease ended without a revoke")]
    Delayed { retry_after: Duration },
    /// No such lease holds the lock on a majority: expired, revoked, or never granted.
    #[error("no such lease holds this lock: it expired, was revoked, or never existed")]
    NotFound,
    /// No such session lives on a majority: it expired, was ended, or never existed.
    #[error("no such session: it expired, was ended, or never existed")]
    SessionNotFound,
    /// The grant's Idempotency-Key stands for a lease that was granted and has ended.
    #[error("the lease of this Idempotency-Key has ended")]
    KeyEnded,
    /// The grant's Idempotency-Key was used for another request.
    #[error("the Idempotency-Key was used for another request")]
    IdempotencyMismatch,
    /// Fewer than a majority of masters could take part; which failed, and how.
    #[error("{}", .0.reason)]
    Unavailable(Unavailability),
    /// Past a configured cap (waiting grants on the name or in all, held streams): try
    /// again later.
    #[error("{what}")]
    TooMany { what: String },
    /// A resume by a token other than the one that opened the lease's held stream: only
    /// that token may take the stream over.
    #[error(
        "this lease is held through a stream another token opened; only that token may resume it"
    )]
    NotYours,
    /// The process is stopping: waiting grants are answered at once.
    #[error("redlockd is shutting down; retry the grant, on another replica if there is one")]
    ShuttingDown,
}

impl From<EngineError> for LeaseError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Held { retry_after } => LeaseError::Held { retry_after },
            EngineError::Split => LeaseError::Held {
                retry_after: AFTER_A_SPLIT,
            },
            EngineError::NotFound => LeaseError::NotFound,
            EngineError::Ended => LeaseError::KeyEnded,
            EngineError::Delayed { retry_after } => LeaseError::Delayed { retry_after },
            EngineError::IdempotencyMismatch => LeaseError::IdempotencyMismatch,
            EngineError::Unavailable(why) => LeaseError::Unavailable(why),
        }
    }
}
