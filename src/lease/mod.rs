//! The lease domain: the values a client hands us, parsed once at the edge into types
//! that cannot hold an invalid value, and the lease service that grants, renews and
//! revokes leases on top of the Redlock engine.
//!
//! Handlers never pass raw strings or integers around: a `LockName` is always a valid
//! name, a `LeaseId` always looks like one we could have minted, and so on.

mod election;
mod error;
pub mod events;
mod granted;
mod hold;
mod kinds;
mod service;
mod sessions;

use crate::config::LeaseBounds;
use crate::model::{InvalidInput, MAX_LOCK_DELAY_MS, MIN_TTL_MS, millis};
pub(crate) use election::LeaderChange;
pub use error::LeaseError;
pub use events::{Events, LockEvent};
pub use granted::{Lease, LockHolder};
pub use hold::{HoldEvent, LostReason, StreamTerms};
pub(crate) use kinds::HeldBy;
pub use kinds::{Hold, Target};
pub(crate) use service::OwnedRevoke;
pub use service::{LeaseService, Readiness};
pub(crate) use sessions::{HeldThrough, Session, SessionEvent, SessionLost};

use std::time::Duration;

/// A lease's TTL, within the configured bounds: only `LeasePolicy` makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl(Duration);

impl Ttl {
    pub(crate) fn get(self) -> Duration {
        self.0
    }
}

/// How long a grant may wait for a held lock, within the configured bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitTime(Duration);

impl WaitTime {
    /// Do not wait: answer 409 at once when the lock is held.
    pub const NONE: WaitTime = WaitTime(Duration::ZERO);

    pub(crate) fn get(self) -> Duration {
        self.0
    }
}

/// The bounds every lease is held to (from the configuration): the only way a client's
/// `ttl_ms` or `wait_ms` becomes a `Ttl` or a `WaitTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    default_ttl: Duration,
    max_ttl: Duration,
    max_wait: Duration,
    max_lock_delay: Duration,
    /// A kept hold's TTL, longer than `max_ttl` (`None`: kept holds are off).
    max_kept: Option<Duration>,
}

impl From<LeaseBounds> for LeasePolicy {
    fn from(b: LeaseBounds) -> Self {
        Self {
            max_lock_delay: b.max_lock_delay,
            max_kept: b.max_kept,
            ..Self::new(b.default_ttl, b.max_ttl, b.max_wait)
        }
    }
}

impl LeasePolicy {
    /// The caller (the configuration) has checked `MIN_TTL_MS <= default_ttl <= max_ttl`.
    pub fn new(default_ttl: Duration, max_ttl: Duration, max_wait: Duration) -> Self {
        Self {
            default_ttl,
            max_ttl,
            max_wait,
            max_lock_delay: Duration::from_millis(MAX_LOCK_DELAY_MS),
            max_kept: None,
        }
    }

    /// A kept hold's TTL: it lives until revoked, at most this long, renewed by no one.
    pub(crate) fn kept_ttl(&self) -> Result<Ttl, InvalidInput> {
        self.max_kept.map(Ttl).ok_or_else(|| {
            InvalidInput(
                "kept holds are off on this server: REDLOCKD_MAX_KEPT_HOLD_MS is not more than \
                 REDLOCKD_MAX_TTL_MS"
                    .into(),
            )
        })
    }

    /// Whether a hold granted (or last renewed) with `ttl` is a kept one: no client may ask
    /// a TTL that long.
    pub(crate) fn is_kept(&self, ttl: Duration) -> bool {
        self.max_kept.is_some() && ttl > self.max_ttl
    }

    /// A grant's lock-delay: `lock_delay_ms`, or none.
    pub(crate) fn lock_delay(&self, lock_delay_ms: Option<u64>) -> Result<Duration, InvalidInput> {
        let ms = lock_delay_ms.unwrap_or(0);
        let max = millis(self.max_lock_delay);
        if ms <= max {
            Ok(Duration::from_millis(ms))
        } else {
            Err(InvalidInput(format!(
                "lock_delay_ms must be at most {max}, got {ms}"
            )))
        }
    }

    /// The largest TTL a grant may ask for.
    pub(crate) fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    /// A grant's TTL: `ttl_ms`, or the default when it names none.
    pub fn ttl(&self, ttl_ms: Option<u64>) -> Result<Ttl, InvalidInput> {
        ttl_ms.map_or(Ok(Ttl(self.default_ttl)), |ms| self.explicit_ttl(ms))
    }

    /// A renew's TTL: `ttl_ms`, or `None` to keep the lease's own.
    pub(crate) fn renew_ttl(&self, ttl_ms: Option<u64>) -> Result<Option<Ttl>, InvalidInput> {
        ttl_ms.map(|ms| self.explicit_ttl(ms)).transpose()
    }

    fn explicit_ttl(&self, ms: u64) -> Result<Ttl, InvalidInput> {
        let max = millis(self.max_ttl);
        if (MIN_TTL_MS..=max).contains(&ms) {
            Ok(Ttl(Duration::from_millis(ms)))
        } else {
            Err(InvalidInput(format!(
                "ttl_ms must be from {MIN_TTL_MS} to {max}, got {ms}"
            )))
        }
    }

    /// A held stream's grace: how long its lease outlives the stream's connection, for a
    /// resume (`grace_ms`, at most the largest TTL; none by default).
    pub fn grace(&self, grace_ms: Option<u64>) -> Result<Duration, InvalidInput> {
        let ms = grace_ms.unwrap_or(0);
        let max = millis(self.max_ttl);
        if ms <= max {
            Ok(Duration::from_millis(ms))
        } else {
            Err(InvalidInput(format!(
                "grace_ms must be at most {max} (the largest TTL), got {ms}"
            )))
        }
    }

    /// A grant's wait: `wait_ms`, or none.
    pub fn wait(&self, wait_ms: Option<u64>) -> Result<WaitTime, InvalidInput> {
        let ms = wait_ms.unwrap_or(0);
        let max = millis(self.max_wait);
        if ms <= max {
            Ok(WaitTime(Duration::from_millis(ms)))
        } else {
            Err(InvalidInput(format!(
                "wait_ms must be at most {max}, got {ms}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_turns_fields_into_bounded_ttls_and_waits() {
        let policy = LeasePolicy::new(
            Duration::from_secs(30),
            Duration::from_secs(3600),
            Duration::from_secs(60),
        );
        assert_eq!(policy.ttl(None).unwrap().get(), Duration::from_secs(30));
        assert_eq!(
            policy.ttl(Some(100)).unwrap().get(),
            Duration::from_millis(100)
        );
        assert!(policy.ttl(Some(99)).is_err());
        assert!(policy.ttl(Some(3_600_001)).is_err());
        assert_eq!(policy.renew_ttl(None).unwrap(), None);
        assert_eq!(policy.wait(None).unwrap(), WaitTime::NONE);
        assert!(policy.wait(Some(60_001)).is_err());
        assert_eq!(policy.grace(None).unwrap(), Duration::ZERO);
        assert_eq!(
            policy.grace(Some(3_600_000)).unwrap(),
            Duration::from_secs(3600)
        );
        assert!(policy.grace(Some(3_600_001)).is_err());
    }
}
