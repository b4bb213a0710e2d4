//! What the lease service answers: a lease granted (renewed, checked) and a holder as
//! inspect and list show it.

use std::sync::Arc;
use std::time::Duration;

use crate::model::{FencingToken, Kind, LeaseId, LockKey, LockName, Mode, Owner, SessionId, Slot};
use crate::redlock::{Holder, Leased};

/// A lease as the service hands it to the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: LockName,
    pub id: LeaseId,
    /// Which permit it is, for a semaphore's.
    pub slot: Option<Slot>,
    /// A lock's lease: shared or exclusive.
    pub mode: Mode,
    /// A several-name lease's names, sorted (empty for a lease on one name).
    pub names: Vec<Arc<str>>,
    pub token: FencingToken,
    pub ttl: Duration,
    pub validity: Duration,
    pub remaining: Duration,
    pub owner: Option<Owner>,
    /// When the masters' answers were in: `validity` and `remaining` count from here.
    pub at: tokio::time::Instant,
    /// The session it is held through, if any: it lives as long as the session.
    pub session: Option<SessionId>,
    /// The held stream that keeps it, as its last renew found (see `Leased::kept_by`).
    pub kept_by: Option<Arc<str>>,
}

impl Lease {
    pub(super) fn new(name: LockName, id: LeaseId, leased: Leased) -> Self {
        Self {
            slot: (name.kind() == Kind::Semaphore)
                .then(|| id.slot())
                .flatten(),
            mode: if id.is_shared() {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            names: Vec::new(),
            name,
            id,
            token: leased.token,
            ttl: leased.ttl,
            validity: leased.validity,
            remaining: leased.remaining,
            owner: leased.owner,
            at: leased.at,
            session: None,
            kept_by: leased.kept_by,
        }
    }

    /// The key the lease holds on the masters: its name's, a shared lease's own, a permit's
    /// slot's, or a several-name lease's key of all its names.
    pub(super) fn hold_key(&self) -> LockKey {
        if !self.names.is_empty() {
            return LockKey {
                kind: Kind::Group,
                name: self.names.join(" ").into(),
            };
        }
        match (self.slot, self.mode) {
            (Some(slot), _) => LockKey::slot(self.name.as_str(), slot.index),
            (None, Mode::Shared) => LockKey::reader(self.name.as_str(), &self.id),
            (None, Mode::Exclusive) => self.name.key(),
        }
    }

    /// The names' keys the lease holds: its name's, or each of a several-name lease's.
    pub(super) fn keys(&self) -> Vec<LockKey> {
        if self.names.is_empty() {
            return vec![self.name.key()];
        }
        self.names
            .iter()
            .map(|n| LockKey::mutex(n.clone()))
            .collect()
    }

    /// How long the client may still rely on the lease, now.
    pub(crate) fn validity_now(&self) -> Duration {
        self.validity.saturating_sub(self.at.elapsed())
    }

    /// How long until the lease's keys expire, now.
    pub(crate) fn remaining_now(&self) -> Duration {
        self.remaining.saturating_sub(self.at.elapsed())
    }
}

/// A held lock as inspect and list show it: never with its lease id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    pub name: String,
    /// A semaphore's holder: its slot.
    pub slot: Option<u16>,
    /// A lock's holder: shared or exclusive.
    pub mode: Mode,
    pub token: FencingToken,
    /// How long until its keys expire on a majority, unless renewed.
    pub remaining: Duration,
    /// The TTL it was granted or last renewed with: longer than any a client may ask for a
    /// kept hold (`LeasePolicy::is_kept`).
    pub ttl: Duration,
    pub owner: Option<Owner>,
}

impl From<Holder> for LockHolder {
    fn from(h: Holder) -> Self {
        Self {
            name: h.name,
            slot: None,
            mode: Mode::Exclusive,
            token: h.token,
            remaining: h.remaining,
            ttl: h.ttl,
            owner: h.owner,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn validity_counts_down_to_the_moment_the_answer_is_written() {
        let lease = Lease {
            name: LockName::parse("a").unwrap(),
            slot: None,
            mode: Mode::Exclusive,
            names: Vec::new(),
            id: LeaseId::generate(),
            token: FencingToken::new(1),
            ttl: Duration::from_secs(10),
            validity: Duration::from_millis(9_898),
            remaining: Duration::from_secs(10),
            owner: None,
            at: tokio::time::Instant::now(),
            session: None,
            kept_by: None,
        };
        // Time spent between the masters' answers and the response (serialising, a slow
        // task) is time the client can no longer rely on.
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(lease.validity_now(), Duration::from_millis(9_598));
        assert_eq!(lease.remaining_now(), Duration::from_millis(9_700));
    }
}
