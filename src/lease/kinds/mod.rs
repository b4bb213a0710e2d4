//! What a lease holds, kind by kind.
//!
//! A grant takes a `Target`: a name, the `Hold` it asks of that name, and the terms any
//! hold may carry (a lock-delay, a session). Each kind of hold lives in a file of its own
//! that owns what differs between kinds: the keys it takes on the masters, its part of an
//! Idempotency-Key's fingerprint, how one attempt at it runs, and how a name of its kind
//! is inspected and force-released. The lease service (`service.rs`) waits, tracks and
//! announces the same way for every kind, and asks the hold for the rest through the one
//! delegating match of each method here. A new kind of hold is a variant, its file, its
//! script, and its routes line.

mod group;
mod lock;
mod permit;

pub(super) use group::with_names;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::events::Events;
use super::granted::{Lease, LockHolder};
use super::{LeaseError, LeaseService};
use crate::model::{
    GrantTerms, Idem, Kind, LeaseId, LockKey, LockName, Owner, PermitLimit, SessionId, claimant_of,
    millis,
};
use crate::redlock::{EngineError, Holder, Redlock};

/// What a grant asks of its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// A lock, held alone.
    Lock,
    /// A lock, held together with its other shared holders (never with an exclusive one).
    Shared,
    /// One of `limit` permits of a semaphore.
    Permit { limit: PermitLimit },
    /// Several locks under one lease, all or none: every name, sorted (the target's name is
    /// the first).
    Group(Arc<[LockName]>),
    /// An election's term.
    Term,
}

/// What a grant takes: a lock or an election by its name, or one of `limit` permits of a
/// semaphore. A name alone is a target (`LockName` converts), so that a lock's grant reads
/// as it always has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: LockName,
    pub hold: Hold,
    /// How long the name stays refused after the lease ends other than by its holder's
    /// revoke (zero: not at all). An exclusive lock's or an election term's only.
    pub lock_delay: Duration,
    /// The session the hold is made through, if any: it lives as long as the session.
    pub session: Option<SessionId>,
    /// Who holds it, when the holder is named by an identity rather than by a lease id
    /// (a Dapr `lockOwner`): `LeaseId::of_holder`, the first half of every id the grant
    /// tries (see `Grant::base_id`).
    pub holder: Option<LeaseId>,
}

impl From<LockName> for Target {
    fn from(name: LockName) -> Self {
        let hold = match name.kind() {
            Kind::Election => Hold::Term,
            _ => Hold::Lock,
        };
        Self {
            name,
            hold,
            lock_delay: Duration::ZERO,
            session: None,
            holder: None,
        }
    }
}

impl Target {
    /// One of `limit` permits of the semaphore `name`.
    pub(crate) fn permit(name: LockName, limit: PermitLimit) -> Self {
        Self {
            hold: Hold::Permit { limit },
            ..Self::from(name)
        }
    }

    /// A shared hold of the lock `name`.
    pub fn shared(name: LockName) -> Self {
        Self {
            hold: Hold::Shared,
            ..Self::from(name)
        }
    }

    /// The locks `names` (1 or more, distinct) under one lease, all or none.
    pub fn group(mut names: Vec<LockName>) -> Option<Self> {
        names.sort();
        names.dedup();
        let first = names.first()?.clone();
        Some(Self {
            hold: Hold::Group(names.into()),
            ..Self::from(first)
        })
    }

    /// The same target, whose lease leaves its name refused for `delay` after it ends
    /// other than by its holder's revoke.
    pub(crate) fn with_lock_delay(self, delay: Duration) -> Self {
        Self {
            lock_delay: delay,
            ..self
        }
    }

    /// The same target, held through session `id`.
    pub(crate) fn in_session(self, id: SessionId) -> Self {
        Self {
            session: Some(id),
            ..self
        }
    }

    /// The same target, held by the holder `identity` names (`LeaseId::of_holder`).
    pub(crate) fn held_by(self, identity: LeaseId) -> Self {
        Self {
            holder: Some(identity),
            ..self
        }
    }

    /// The topics a grant of this target waits on: each of its names'.
    pub(super) fn topics(&self) -> Vec<String> {
        match &self.hold {
            Hold::Group(names) => group::topics(names),
            _ => vec![self.name.topic().into_owned()],
        }
    }

    /// Whether a waiting grant of it tries as soon as it is first in any of its lines.
    pub(super) fn eager(&self) -> bool {
        matches!(self.hold, Hold::Group(_))
    }

    /// Whether its grants take from a pool (observers are told which permit).
    pub(super) fn pooled(&self) -> bool {
        matches!(self.hold, Hold::Permit { .. })
    }

    /// What the request asks besides the name, TTL and owner, for its Idempotency-Key's
    /// fingerprint: empty for a lock's exclusive grant.
    pub(super) fn fingerprint(&self) -> String {
        let mut fingerprint = match &self.hold {
            Hold::Lock | Hold::Term => String::new(),
            Hold::Shared => "shared".to_owned(),
            Hold::Permit { limit } => limit.get().to_string(),
            Hold::Group(names) => group::fingerprint(names),
        };
        if !self.lock_delay.is_zero() {
            fingerprint.push_str(&format!(" delay {}", millis(self.lock_delay)));
        }
        if let Some(session) = &self.session {
            fingerprint.push_str(&format!(" session {}", session.key()));
        }
        fingerprint
    }
}

/// What `LeaseService::held_by` finds of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeldBy {
    /// The target's holder holds it, by this lease.
    Holder(LeaseId),
    /// Another holder does.
    Another,
    /// Nobody does (of a semaphore: the holder holds no permit).
    Nobody,
}

/// One grant's terms, the same for every attempt and every key it tries.
pub(super) struct Grant<'a> {
    pub target: &'a Target,
    pub ttl: Duration,
    pub owner: Option<Owner>,
    /// The Idempotency-Key's lease id and record, for a keyed grant.
    pub keyed: Option<&'a (LeaseId, Idem)>,
    /// What the masters know a waiting grant's claims by, from one attempt to the next.
    pub claimant: Option<&'a LeaseId>,
    pub terms: GrantTerms,
}

impl Grant<'_> {
    /// The lease id an attempt asks under, before its kind's tail: the key's for a keyed
    /// grant; else the attempt's own (a late undo of one attempt must never take what
    /// another won), whose first half is the claimant's, or the holder's for a grant that
    /// names its holder (a waiting one's claimant is its holder then).
    pub(super) fn base_id(&self) -> LeaseId {
        match (self.keyed, self.claimant.or(self.target.holder.as_ref())) {
            (Some((id, _)), _) => id.clone(),
            (None, Some(claimant)) => LeaseId::attempt_of(claimant),
            (None, None) => LeaseId::generate(),
        }
    }

    pub(super) fn idem(&self) -> Option<Idem> {
        self.keyed.map(|(_, idem)| idem.clone())
    }
}

impl LeaseService {
    /// One Redlock grant attempt of `key`, run in the request's own task. If the request is
    /// dropped mid-way (its client left), whatever the attempt may have won is released by
    /// a task started then, unless the grant has an Idempotency-Key: its client will ask
    /// again, and must find the lease. (A task per attempt, as before, cost every grant a
    /// spawn and a hand-off between tasks to guard against a departure that seldom comes.)
    pub(super) async fn attempt_once(
        &self,
        grant: &Grant<'_>,
        key: LockKey,
        id: LeaseId,
        terms: GrantTerms,
    ) -> Result<Lease, EngineError> {
        let idem = grant.idem();
        let mut abandoned = (idem.is_none()).then(|| Abandoned {
            engine: self.engine().clone(),
            events: self.events().clone(),
            tasks: self.tasks.clone(),
            key: key.clone(),
            id: Some(id.clone()),
        });
        let result = self
            .engine()
            .acquire_keyed(&key, &id, grant.ttl, grant.owner.clone(), idem, terms)
            .await
            .map(|leased| Lease::new(grant.target.name.clone(), id, leased));
        // Finished: the answer is the request's to give.
        if let Some(abandoned) = abandoned.as_mut() {
            abandoned.id = None;
        }
        result
    }

    /// One attempt at `grant`'s target, as its kind makes one.
    pub(super) async fn attempt_hold(&self, grant: &Grant<'_>) -> Result<Lease, EngineError> {
        match &grant.target.hold {
            Hold::Lock | Hold::Term => lock::attempt(self, grant, grant.base_id()).await,
            Hold::Shared => lock::attempt(self, grant, grant.base_id().shared()).await,
            Hold::Permit { limit } => permit::attempt(self, grant, *limit).await,
            Hold::Group(names) => group::attempt(self, grant, names).await,
        }
    }

    /// The key the lease `id` of `name` holds: the name's own, for a semaphore the slot its
    /// permit's id names, for a shared lease its own key beside the lock's, and for a
    /// several-name lease the key of all its names, which the masters tell (an id that
    /// names none of these is not found).
    pub(super) async fn hold_key(
        &self,
        name: &LockName,
        id: &LeaseId,
    ) -> Result<LockKey, LeaseError> {
        match name.kind() {
            Kind::Mutex if id.is_shared() => Ok(LockKey::reader(name.as_str(), id)),
            Kind::Mutex if id.is_group() => group::key_of(self, &name.key(), id).await,
            Kind::Semaphore => permit::key_of(name, id),
            _ => Ok(name.key()),
        }
    }

    /// Who holds `name`, if a majority agree that someone does: a lock's one holder (or
    /// its shared holders), an election's leader, a semaphore's holders by slot.
    pub(crate) async fn inspect(&self, name: &LockName) -> Result<Vec<LockHolder>, LeaseError> {
        match name.kind() {
            Kind::Semaphore => permit::inspect(self, name).await,
            Kind::Mutex => lock::inspect(self, name).await,
            _ => lock::inspect_one(self, name).await,
        }
    }

    /// How long a lock-delay still refuses grants of the free `name`, as a majority of
    /// masters would refuse them (`None`: none runs). Permits and several-name leases take
    /// no lock-delay.
    pub(crate) async fn lock_delay(&self, name: &LockName) -> Result<Option<Duration>, LeaseError> {
        match name.kind() {
            Kind::Mutex | Kind::Election => Ok(self.engine().lock_delay(&name.key()).await?),
            _ => Ok(None),
        }
    }

    /// Whose hold of its name `target`'s holder (`Target::held_by`) finds, as a majority
    /// agree: its own lease (a lock's, or one of a semaphore's permits below the target's
    /// limit), another holder's, or nobody's. A semaphore's other permits are not this
    /// holder's business: it is `Nobody` there when the holder has none.
    pub(crate) async fn held_by(&self, target: &Target) -> Result<HeldBy, LeaseError> {
        let Some(identity) = &target.holder else {
            return Ok(HeldBy::Nobody);
        };
        let name = &target.name;
        if let Hold::Permit { limit } = target.hold {
            let ours = permit::held_by(self, name, limit, identity).await?;
            return Ok(ours.map_or(HeldBy::Nobody, HeldBy::Holder));
        }
        Ok(match self.engine().inspect(&name.key()).await? {
            None => HeldBy::Nobody,
            Some(h) if claimant_of(h.lease.as_str()) == claimant_of(identity.as_str()) => {
                HeldBy::Holder(h.lease)
            }
            Some(_) => HeldBy::Another,
        })
    }

    /// The keys a force-release of `name` removes: every hold of it.
    pub(super) async fn holds_of(&self, name: &LockName) -> Result<Vec<LockKey>, LeaseError> {
        match name.kind() {
            Kind::Semaphore => permit::keys(self, name).await,
            Kind::Mutex => lock::keys(self, name).await,
            _ => Ok(vec![name.key()]),
        }
    }
}

/// The holds of `kind` under `name` (a semaphore's slots, a lock's shared holds) that a
/// majority hold, from the masters' index: at most `most`.
async fn held_under(
    service: &LeaseService,
    kind: Kind,
    name: &LockName,
    most: usize,
) -> Result<Vec<Holder>, EngineError> {
    let prefix = format!("{name}/");
    let (holders, _) = service.engine().list(kind, &prefix, "", most).await?;
    Ok(holders)
}

/// A grant attempt whose request was dropped before it finished: on drop, it releases the
/// lease it may have won (a compare-and-delete by lease id, queued on each master behind
/// the attempt's own acquire), and wakes this replica's waiters for the name.
struct Abandoned {
    engine: Arc<Redlock>,
    events: Arc<Events>,
    tasks: TaskTracker,
    /// What the attempt acquires (a lock, or one slot of a semaphore).
    key: LockKey,
    /// `None` once the attempt has finished.
    id: Option<LeaseId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        // A request is dropped by the runtime that ran it; without one (the process is
        // ending) there is nothing left to release with, and the lease lapses at its TTL.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (engine, events) = (self.engine.clone(), self.events.clone());
        let key = self.key.clone();
        self.tasks.spawn_on(
            async move {
                tracing::info!(lock = %key, "client left before its grant completed; releasing it");
                let _ = engine.release(&key, &id).await;
                for member in key.members() {
                    events.wake(&member.topic());
                }
            },
            &runtime,
        );
    }
}
