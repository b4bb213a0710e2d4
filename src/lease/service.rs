//! The lease service: what the HTTP handlers call. It mints lease ids, waits for held
//! locks, keeps grants safe against cancelled requests, and counts what it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::LeaseError;
use super::events::{Events, LockEvent, Ticket};
use super::{Ttl, WaitTime};
use crate::config::Caps;
use crate::metrics::Metrics;
use crate::model::News;
use crate::model::SessionId;
use crate::model::Slot;
use crate::model::{FencingToken, GrantKey, LeaseId, LockName, NamePrefix, Owner, millis};
use crate::model::{GrantTerms, Idem, Kind, Listeners, LockKey, MAX_PERMITS, Mode, PermitLimit};
use crate::model::{MasterStatus, Traffic};
use crate::redlock::{EngineError, Holder, Leased, Redlock};

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
                let _ = engine.release(&key, id.as_str()).await;
                for member in key.members() {
                    events.wake(&member.topic());
                }
            },
            &runtime,
        );
    }
}

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
    pub owner: Option<Arc<str>>,
    /// When the masters' answers were in: `validity` and `remaining` count from here.
    pub at: tokio::time::Instant,
    /// The session it is held through, if any: it lives as long as the session.
    pub session: Option<SessionId>,
}

impl Lease {
    fn new(name: LockName, id: LeaseId, leased: Leased) -> Self {
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
        }
    }

    /// The key the lease holds on the masters: its name's, a shared lease's own, a permit's
    /// slot's, or a several-name lease's key of all its names.
    fn hold_key(&self) -> LockKey {
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
    fn keys(&self) -> Vec<LockKey> {
        if self.names.is_empty() {
            return vec![self.name.key()];
        }
        self.names
            .iter()
            .map(|n| LockKey::mutex(n.clone()))
            .collect()
    }

    /// How long the client may still rely on the lease, now.
    pub fn validity_now(&self) -> Duration {
        self.validity.saturating_sub(self.at.elapsed())
    }

    /// How long until the lease's keys expire, now.
    pub fn remaining_now(&self) -> Duration {
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
    pub owner: Option<String>,
}

impl From<Holder> for LockHolder {
    fn from(h: Holder) -> Self {
        Self {
            name: h.name,
            slot: None,
            mode: Mode::Exclusive,
            token: h.token,
            remaining: h.remaining,
            owner: h.owner,
        }
    }
}

/// What a grant takes: a lock or an election by its name, or one of `limit` permits of a
/// semaphore. A name alone is a target (`LockName` converts), so that a lock's grant reads
/// as it always has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: LockName,
    /// A semaphore's limit; `None` for every other kind.
    pub limit: Option<PermitLimit>,
    /// A lock's mode: shared holders hold it together.
    pub mode: Mode,
    /// Several locks under one lease: all its names (`name` is the first), sorted.
    pub group: Option<Arc<[LockName]>>,
    /// How long the name stays refused after the lease ends other than by its holder's
    /// revoke (zero: not at all). An exclusive lock's or an election term's only.
    pub lock_delay: Duration,
    /// The session the hold is made through, if any: it lives as long as the session.
    pub session: Option<SessionId>,
}

impl Target {
    /// One of `limit` permits of the semaphore `name`.
    pub fn permit(name: LockName, limit: PermitLimit) -> Self {
        Self {
            limit: Some(limit),
            ..Self::from(name)
        }
    }

    /// A shared hold of the lock `name`.
    pub fn shared(name: LockName) -> Self {
        Self {
            mode: Mode::Shared,
            ..Self::from(name)
        }
    }

    /// The locks `names` (1 or more, distinct) under one lease, all or none.
    pub fn group(mut names: Vec<LockName>) -> Option<Self> {
        names.sort();
        names.dedup();
        let first = names.first()?.clone();
        Some(Self {
            group: Some(names.into()),
            ..Self::from(first)
        })
    }

    /// The same target, whose lease leaves its name refused for `delay` after it ends
    /// other than by its holder's revoke.
    pub fn with_lock_delay(self, delay: Duration) -> Self {
        Self {
            lock_delay: delay,
            ..self
        }
    }

    /// The same target, held through session `id`.
    pub fn in_session(self, id: SessionId) -> Self {
        Self {
            session: Some(id),
            ..self
        }
    }

    /// The key a grant of this target's lock takes (not a permit's: it picks a slot).
    fn key(&self, id: &LeaseId) -> LockKey {
        match (&self.group, self.mode) {
            (Some(names), _) => LockKey::group(names),
            (None, Mode::Shared) => LockKey::reader(self.name.as_str(), id),
            (None, Mode::Exclusive) => self.name.key(),
        }
    }

    /// The topics a grant of this target waits on: each of its names'.
    fn topics(&self) -> Vec<String> {
        match &self.group {
            Some(names) => names.iter().map(|n| n.topic().into_owned()).collect(),
            None => vec![self.name.topic().into_owned()],
        }
    }

    /// What the request asks besides the name, TTL and owner, for its Idempotency-Key's
    /// fingerprint: empty for a lock's exclusive grant.
    fn variant(&self) -> String {
        let mut variant = if let Some(names) = &self.group {
            let names: Vec<&str> = names.iter().map(LockName::as_str).collect();
            format!("names {}", names.join(" "))
        } else {
            match (self.limit, self.mode) {
                (Some(limit), _) => limit.get().to_string(),
                (None, Mode::Shared) => "shared".to_owned(),
                (None, Mode::Exclusive) => String::new(),
            }
        };
        if !self.lock_delay.is_zero() {
            variant.push_str(&format!(" delay {}", millis(self.lock_delay)));
        }
        if let Some(session) = &self.session {
            variant.push_str(&format!(" session {}", session.key()));
        }
        variant
    }
}

impl From<LockName> for Target {
    fn from(name: LockName) -> Self {
        Self {
            name,
            limit: None,
            mode: Mode::Exclusive,
            group: None,
            lock_delay: Duration::ZERO,
            session: None,
        }
    }
}

/// A waiting grant's places in line: one per name it waits for (a several-name grant's,
/// one per name). It tries when it is first in any of them (first in all of them could
/// leave two such grants each first in one line and second in the other, both waiting).
struct Line(Vec<Ticket>);

impl Line {
    fn is_first(&self) -> bool {
        self.0.iter().any(Ticket::is_first)
    }

    fn position(&self) -> usize {
        self.0.iter().map(Ticket::position).min().unwrap_or(0)
    }

    fn mark_seen(&mut self) {
        self.0.iter_mut().for_each(Ticket::mark_seen);
    }

    async fn woken(&mut self) {
        let woken = self.0.iter_mut().map(|t| Box::pin(t.woken()));
        futures::future::select_all(woken).await;
    }
}

/// Whether this replica can grant, and why not.
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    /// A majority of masters answer and vote, and the process is not shutting down.
    pub ready: bool,
    /// Why a majority cannot vote, in words, when it is more than masters being down.
    pub problem: Option<String>,
    pub masters: Vec<MasterStatus>,
}

/// The most shared holders of one lock that inspect lists (and force-release removes in
/// one call).
const MAX_SHARED_LISTED: usize = 1000;

/// How many times a grant that met a split vote tries again within the request.
const SPLIT_RETRIES: u32 = 4;

/// The random pause before the `attempt`-th retry after a split vote: up to 2 ms, doubling
/// each time, so that contenders that collided spread out.
fn split_pause(attempt: u32) -> Duration {
    let ceiling = 2_000u64 << attempt.min(6);
    Duration::from_micros(rand::random_range(100..=ceiling))
}

/// A lease this process granted.
struct Tracked {
    lapses: Instant,
    token: FencingToken,
}

pub struct LeaseService {
    engine: Arc<Redlock>,
    events: Arc<Events>,
    pub(super) metrics: Arc<Metrics>,
    /// Leases this process granted, with when each lapses unless renewed and its token:
    /// the source of `redlockd_leases_active`, and of `Lost` events.
    active: Mutex<HashMap<LeaseId, Tracked>>,
    /// Fires when the process begins to shut down: waiting grants stop waiting, held
    /// streams end.
    pub(super) shutdown: CancellationToken,
    /// Grant attempts and held streams run in tasks of their own (see `attempt_once` and
    /// `hold`); shutdown drains them so that a lease won for a client that left, or held
    /// for a stream, is released before the process goes.
    pub(super) tasks: TaskTracker,
    pub(super) caps: Caps,
    /// Event streams open now (held leases, campaigns, observers).
    pub(super) streams: std::sync::atomic::AtomicUsize,
    /// Sessions opened or renewed here: the source of `redlockd_sessions_active`.
    pub(super) sessions: super::sessions::Sessions,
}

impl LeaseService {
    pub fn new(
        engine: Arc<Redlock>,
        events: Arc<Events>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Self::with_caps(engine, events, metrics, shutdown, Caps::NONE)
    }

    /// A service that answers `TooMany` past `caps`.
    pub fn with_caps(
        engine: Arc<Redlock>,
        events: Arc<Events>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        caps: Caps,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            events,
            metrics,
            active: Mutex::new(HashMap::new()),
            shutdown,
            tasks: TaskTracker::new(),
            caps,
            streams: std::sync::atomic::AtomicUsize::new(0),
            sessions: Default::default(),
        })
    }

    /// Wait, at most until `deadline`, for the grant attempts still running (each bounded
    /// by the master timeout) to finish and release what their departed clients won;
    /// whatever is left then is abandoned, and its keys expire at their TTL. For shutdown,
    /// after the requests in flight were answered.
    pub async fn drain(&self, deadline: tokio::time::Instant) -> bool {
        self.tasks.close();
        tokio::time::timeout_at(deadline, self.tasks.wait())
            .await
            .is_ok()
    }

    pub fn engine(&self) -> &Arc<Redlock> {
        &self.engine
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Tracked>> {
        // Plain map of deadlines: nothing a panic elsewhere could leave half-done.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, lease: &Lease) {
        let mut active = self.active();
        let now = Instant::now();
        // Leases that lapse without a word from their client are dropped here, so the map
        // stays as large as the live leases, amortised over grants.
        if active.len() >= 1024 && active.len().is_power_of_two() {
            active.retain(|_, t| t.lapses > now);
        }
        active.insert(
            lease.id.clone(),
            Tracked {
                lapses: now + lease.remaining_now(),
                token: lease.token,
            },
        );
    }

    /// A lease that ended here other than by its own revoke (its session's end).
    pub(super) fn forget(&self, id: &LeaseId) {
        self.active().remove(id);
    }

    /// Sessions opened or renewed here that are neither ended nor lapsed.
    pub fn active_sessions(&self) -> usize {
        self.sessions.active()
    }

    /// Leases granted here that are neither revoked nor lapsed.
    pub fn active_leases(&self) -> usize {
        let now = Instant::now();
        let mut active = self.active();
        active.retain(|_, t| t.lapses > now);
        active.len()
    }

    /// The per-name event bus: waiting grants queue on it, observers subscribe to it.
    pub fn events(&self) -> &Arc<Events> {
        &self.events
    }

    /// Grant `target`, waiting up to `wait` while another lease holds it (every permit of a
    /// semaphore is taken).
    pub async fn grant(
        &self,
        target: impl Into<Target>,
        ttl: Ttl,
        wait: WaitTime,
        owner: Option<Owner>,
    ) -> Result<Lease, LeaseError> {
        self.grant_keyed(target, ttl, wait, owner, None).await
    }

    /// `grant` with an Idempotency-Key: sent again, the same key and request answer the
    /// lease the first attempt won (same lease id and token) if it still holds the lock,
    /// `IdempotencyMismatch` for another request, `KeyEnded` once that lease has let go.
    /// Such a grant is not undone when its client leaves before the answer: the client
    /// said it would ask again.
    pub async fn grant_keyed(
        &self,
        target: impl Into<Target>,
        ttl: Ttl,
        wait: WaitTime,
        owner: Option<Owner>,
        key: Option<GrantKey>,
    ) -> Result<Lease, LeaseError> {
        self.grant_reporting(target.into(), ttl, wait, owner, key.as_ref(), None)
            .await
    }

    /// `grant` for a held stream when `stream` is given: the stream is told this grant's
    /// place in this replica's line (1 is next) whenever it waits and its place has
    /// changed, and the hold is observed (its end is announced to every replica).
    pub async fn grant_reporting(
        &self,
        target: Target,
        ttl: Ttl,
        wait: WaitTime,
        owner: Option<Owner>,
        key: Option<&GrantKey>,
        mut stream: Option<&mut (dyn FnMut(usize) + Send)>,
    ) -> Result<Lease, LeaseError> {
        let name = &target.name;
        let listeners = Listeners {
            waiting: wait != WaitTime::NONE,
            observed: stream.is_some() || name.kind() == Kind::Election,
            pooled: target.limit.is_some(),
            patience_ms: 0,
        };
        let ttl = ttl.get();
        let owner: Option<Arc<str>> = owner.map(|o| o.shared());
        let variant = target.variant();
        let keyed = key.map(|k| k.derive(name, &variant, ttl, owner.as_deref()));
        if wait == WaitTime::NONE {
            let result = self
                .attempt(&target, ttl, owner, keyed.as_ref(), None, listeners)
                .await;
            self.account(name, &result, false, listeners);
            return result;
        }

        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + wait.get();
        let mut contended = false;
        let mut tickets = Vec::new();
        for topic in target.topics() {
            let eager = target.group.is_some();
            let ticket = self
                .events
                .join_as(&topic, self.caps.waiters_per_name, self.caps.waiters, eager)
                .map_err(|cap| LeaseError::TooMany {
                    what: format!("too many {cap}; try again later"),
                })?;
            tickets.push(ticket);
        }
        let mut ticket = Line(tickets);
        // What the masters know this grant's claims by, from one attempt to the next.
        let claimant = LeaseId::generate();
        let mut reported = 0;
        // Queued behind another waiter, this grant has found its lock contended already.
        if !ticket.is_first() {
            contended = true;
            self.metrics.contended(name.class());
        }
        loop {
            ticket.mark_seen();
            let now = tokio::time::Instant::now();
            // At its deadline a waiter tries once more even if others are ahead of it, so
            // that its 409 carries the holder's real remaining TTL.
            let mut wake_at = deadline;
            if ticket.is_first() || now >= deadline {
                let listeners = Listeners {
                    patience_ms: millis(deadline.saturating_duration_since(now)),
                    ..listeners
                };
                let result = self
                    .attempt(
                        &target,
                        ttl,
                        owner.clone(),
                        keyed.as_ref(),
                        Some(&claimant),
                        listeners,
                    )
                    .await;
                match result {
                    Err(LeaseError::Held { retry_after } | LeaseError::Delayed { retry_after })
                        if tokio::time::Instant::now() < deadline =>
                    {
                        if !contended {
                            contended = true;
                            self.metrics.contended(name.class());
                        }
                        // The holder's lease lapses then, unless renewed (or the lock-delay
                        // ends then, and no announcement will say so): look again.
                        let lapse =
                            tokio::time::Instant::now() + retry_after.max(Duration::from_millis(1));
                        wake_at = deadline.min(lapse);
                    }
                    result => {
                        if contended {
                            self.metrics.waited(started.elapsed());
                        }
                        self.account(name, &result, contended, listeners);
                        return result;
                    }
                }
            }
            let place = ticket.position();
            if place != reported {
                reported = place;
                if let Some(queued) = stream.as_mut() {
                    queued(place);
                }
            }
            tokio::select! {
                () = ticket.woken() => {}
                () = tokio::time::sleep_until(wake_at) => {}
                () = self.shutdown.cancelled() => return Err(LeaseError::ShuttingDown),
            }
        }
    }

    /// Count a finished grant: contention (once per grant) and the lease if one was
    /// granted, whose grant is announced to other replicas when observers follow it.
    fn account(
        &self,
        name: &LockName,
        result: &Result<Lease, LeaseError>,
        already_contended: bool,
        listeners: Listeners,
    ) {
        match result {
            Ok(lease) => {
                self.track(lease);
                let token = lease.token;
                if lease.names.is_empty() {
                    self.events
                        .publish(&name.topic(), LockEvent::Acquired { token });
                    if listeners.observed {
                        self.engine.announce(&name.key(), News::Acquired, token);
                    }
                    return;
                }
                for key in lease.keys() {
                    self.events
                        .publish(&key.topic(), LockEvent::Acquired { token });
                    if listeners.observed {
                        self.engine.announce(&key, News::Acquired, token);
                    }
                }
            }
            Err(LeaseError::Held { .. }) if !already_contended => {
                self.metrics.contended(name.class())
            }
            Err(_) => {}
        }
    }

    /// Try the lock (or a semaphore's permit); a split vote (simultaneous contenders, none
    /// with a majority, all releasing) is no holder to wait for, so it is tried again after
    /// a short random pause, a bounded number of times, even for a grant that does not
    /// wait. A split that persists is answered as held with that short pause as its
    /// retry-after, never with another contender's TTL.
    async fn attempt(
        &self,
        target: &Target,
        ttl: Duration,
        owner: Option<Arc<str>>,
        keyed: Option<&(LeaseId, Idem)>,
        claimant: Option<&LeaseId>,
        listeners: Listeners,
    ) -> Result<Lease, LeaseError> {
        let mut tries = 0;
        loop {
            let result = match target.limit {
                Some(limit) => {
                    self.attempt_permit(&target.name, limit, ttl, &owner, keyed, listeners)
                        .await
                }
                None => {
                    let idem = keyed.map(|(_, idem)| idem.clone());
                    // An attempt's lease id is its own (a late undo of one attempt must never
                    // take what another won); its first half is the grant's, which is what
                    // the masters know the grant's claims by.
                    let id = match (keyed, claimant) {
                        (Some((id, _)), _) => id.clone(),
                        (None, Some(claimant)) => LeaseId::attempt_of(claimant),
                        (None, None) => LeaseId::generate(),
                    };
                    let id = match (&target.group, target.mode) {
                        (Some(_), _) => id.group(),
                        (None, Mode::Shared) => id.shared(),
                        (None, Mode::Exclusive) => id,
                    };
                    let key = target.key(&id);
                    let terms = GrantTerms {
                        listeners,
                        lock_delay_ms: millis(target.lock_delay),
                    };
                    let mut lease = self
                        .attempt_once(&target.name, key, Some(id), ttl, owner.clone(), idem, terms)
                        .await;
                    if let (Ok(lease), Some(names)) = (&mut lease, &target.group) {
                        lease.names = names.iter().map(|n| n.as_str().into()).collect();
                    }
                    lease
                }
            };
            match result {
                Err(EngineError::Split) => {
                    let pause = split_pause(tries);
                    if tries == SPLIT_RETRIES {
                        return Err(LeaseError::Held { retry_after: pause });
                    }
                    tries += 1;
                    tokio::time::sleep(pause).await;
                }
                // A hold through a session lives as long as the session from now on.
                Ok(lease) => {
                    return match &target.session {
                        Some(id) => {
                            let key = lease.hold_key();
                            self.attach_to(id, lease, key).await
                        }
                        None => Ok(lease),
                    };
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One attempt at a permit of `name`: the slots a majority hold are read, and the free
    /// ones below `limit` are tried, in a random order (so that grants on several replicas
    /// seldom go for the same one), each as an ordinary Redlock grant of its own. A keyed
    /// retry first goes back to the slot its key's lease holds. Held when no slot below
    /// `limit` is free (or every free one was taken first), with the earliest lapse among
    /// the holders as its retry-after.
    async fn attempt_permit(
        &self,
        name: &LockName,
        limit: PermitLimit,
        ttl: Duration,
        owner: &Option<Arc<str>>,
        keyed: Option<&(LeaseId, Idem)>,
        listeners: Listeners,
    ) -> Result<Lease, EngineError> {
        let limit = limit.get();
        let holders = self.engine.slots(name.as_str(), limit).await?;
        let base = match keyed {
            Some((id, _)) => id.clone(),
            None => LeaseId::generate(),
        };
        let mut taken = vec![false; usize::from(limit)];
        let mut earliest: Option<Duration> = None;
        let mut ours = None;
        for (slot, holder) in &holders {
            if holder.lease.starts_with(base.as_str()) {
                ours = Some(*slot);
            }
            if let Some(t) = taken.get_mut(usize::from(*slot)) {
                *t = true;
                earliest = Some(earliest.map_or(holder.remaining, |e| e.min(holder.remaining)));
            }
        }
        let mut free: Vec<u16> = (0..limit).filter(|s| !taken[usize::from(*s)]).collect();
        {
            use rand::seq::SliceRandom as _;
            free.shuffle(&mut rand::rng());
        }
        // The key's own permit, if a majority hold it, is the one to answer with.
        if let Some(slot) = ours.filter(|s| *s < limit) {
            free.insert(0, slot);
        }
        // A keyed grant asks the masters even when every slot is taken: they know whether
        // its key was used for another request (422 before 409, as a lock's grant answers).
        if free.is_empty()
            && keyed.is_some()
            && let Some((slot, _)) = holders.iter().find(|(s, _)| *s < limit)
        {
            free.push(*slot);
        }
        let mut split = false;
        for index in free {
            let id = base.permit(Slot { index, limit });
            let key = LockKey::slot(name.as_str(), index);
            let idem = keyed.map(|(_, idem)| idem.clone());
            match self
                .attempt_once(
                    name,
                    key,
                    Some(id),
                    ttl,
                    owner.clone(),
                    idem,
                    listeners.into(),
                )
                .await
            {
                Err(EngineError::Held { retry_after }) => {
                    earliest = Some(earliest.map_or(retry_after, |e| e.min(retry_after)));
                }
                Err(EngineError::Split) => split = true,
                result => return result,
            }
        }
        if split {
            return Err(EngineError::Split);
        }
        Err(EngineError::Held {
            retry_after: earliest.unwrap_or(Duration::from_millis(1)),
        })
    }

    /// Every slot of semaphore `name` that a majority hold, whatever the limits they were
    /// taken with (from the masters' index, for inspect and force-release; a grant reads
    /// only the slots below its limit, `Redlock::slots`).
    async fn all_slots(&self, name: &LockName) -> Result<Vec<(u16, Holder)>, EngineError> {
        let prefix = format!("{name}/");
        let (holders, _) = self
            .engine
            .list(Kind::Semaphore, &prefix, "", usize::from(MAX_PERMITS))
            .await?;
        let mut slots: Vec<(u16, Holder)> = holders
            .into_iter()
            .filter_map(|h| {
                let slot = h.name.strip_prefix(&prefix)?.parse().ok()?;
                Some((slot, h))
            })
            .collect();
        slots.sort_by_key(|(slot, _)| *slot);
        Ok(slots)
    }

    /// One Redlock grant attempt of `key`, run in the request's own task. If the request is
    /// dropped mid-way (its client left), whatever the attempt may have won is released by
    /// a task started then, unless the grant has an Idempotency-Key: its client will ask
    /// again, and must find the lease. (A task per attempt, as before, cost every grant a
    /// spawn and a hand-off between tasks to guard against a departure that seldom comes.)
    #[allow(clippy::too_many_arguments)]
    async fn attempt_once(
        &self,
        name: &LockName,
        key: LockKey,
        id: Option<LeaseId>,
        ttl: Duration,
        owner: Option<Arc<str>>,
        idem: Option<Idem>,
        terms: GrantTerms,
    ) -> Result<Lease, EngineError> {
        let id = id.unwrap_or_else(LeaseId::generate);
        let mut abandoned = (idem.is_none()).then(|| Abandoned {
            engine: self.engine.clone(),
            events: self.events.clone(),
            tasks: self.tasks.clone(),
            key: key.clone(),
            id: Some(id.clone()),
        });
        let result = self
            .engine
            .acquire_keyed(&key, id.as_str(), ttl, owner, idem, terms)
            .await
            .map(|leased| Lease::new(name.clone(), id, leased));
        // Finished: the answer is the request's to give.
        if let Some(abandoned) = abandoned.as_mut() {
            abandoned.id = None;
        }
        result
    }

    /// The key a lease of `name` holds: the name's own, for a semaphore the slot its
    /// permit's id names, for a shared lease its own key beside the lock's, and for a
    /// several-name lease the key of all its names, which the masters tell (an id that
    /// names none of these is not found).
    async fn hold_key(&self, name: &LockName, id: &LeaseId) -> Result<LockKey, LeaseError> {
        match name.kind() {
            Kind::Mutex if id.is_shared() => Ok(LockKey::reader(name.as_str(), id)),
            Kind::Mutex if id.is_group() => self.group_key(&name.key(), id.as_str()).await,
            Kind::Semaphore => id
                .slot()
                .map(|slot| LockKey::slot(name.as_str(), slot.index))
                .ok_or(LeaseError::NotFound),
            _ => Ok(name.key()),
        }
    }

    /// The key of all the names of the several-name lease `lease`, through its hold of
    /// `member`.
    async fn group_key(&self, member: &LockKey, lease: &str) -> Result<LockKey, LeaseError> {
        let names = self
            .engine
            .members(member, lease)
            .await?
            .ok_or(LeaseError::NotFound)?;
        Ok(LockKey {
            kind: Kind::Group,
            name: names.into(),
        })
    }

    /// A lease answered through `key`: a several-name lease's names are its members'.
    fn with_names(mut lease: Lease, key: &LockKey) -> Lease {
        if key.kind == Kind::Group {
            lease.names = key.members().into_iter().map(|m| m.name).collect();
        }
        lease
    }

    pub async fn renew(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Lease, LeaseError> {
        self.renew_with(name, id, ttl, None).await
    }

    /// Renew a lease and make `value` its owner text: an elected leader proclaims a new
    /// value without losing its term. Observers on every replica are told.
    pub async fn proclaim(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
        value: Owner,
    ) -> Result<Lease, LeaseError> {
        let lease = self.renew_with(name, id, ttl, Some(value)).await?;
        let token = lease.token;
        self.events
            .publish(&lease.name.topic(), LockEvent::Proclaimed { token });
        self.engine
            .announce(&lease.name.key(), News::Proclaimed, token);
        Ok(lease)
    }

    async fn renew_with(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
        owner: Option<Owner>,
    ) -> Result<Lease, LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let leased = match self
            .engine
            .renew_with(
                &key,
                id.as_str(),
                ttl.map(Ttl::get),
                owner.map(|o| o.shared()),
            )
            .await
        {
            Ok(leased) => leased,
            Err(EngineError::NotFound) => {
                if let Some(lost) = self.active().remove(&id) {
                    let token = lost.token;
                    self.events
                        .publish(&name.topic(), LockEvent::Lost { token });
                }
                return Err(LeaseError::NotFound);
            }
            Err(e) => return Err(e.into()),
        };
        let lease = Self::with_names(Lease::new(name, id, leased), &key);
        self.track(&lease);
        Ok(lease)
    }

    pub async fn revoke(&self, name: LockName, id: LeaseId) -> Result<(), LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let result = self
            .engine
            .release(&key, id.as_str())
            .await
            .map_err(LeaseError::from);
        if result.is_ok() {
            // Redis announces it to every replica; this covers this process at once, and
            // the embedded store, which has no pub/sub.
            let revoked = self.active().remove(&id);
            for member in key.members() {
                match &revoked {
                    Some(revoked) => {
                        let token = revoked.token;
                        self.events
                            .publish(&member.topic(), LockEvent::Released { token });
                    }
                    // Granted through another replica: the masters' announcement carries it.
                    None => self.events.wake(&member.topic()),
                }
            }
        }
        result
    }

    pub async fn check(&self, name: LockName, id: LeaseId) -> Result<Lease, LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let leased = self.engine.check(&key, id.as_str()).await?;
        Ok(Self::with_names(Lease::new(name, id, leased), &key))
    }

    /// Remove whoever holds `name` (an administrator's force-release; every permit of a
    /// semaphore): the removed leases' tokens, none when nobody held it. A removed holder's
    /// next renew answers not found, a stream holding it is told `force_released`, waiters
    /// are woken.
    pub async fn force_release(&self, name: &LockName) -> Result<Vec<FencingToken>, LeaseError> {
        let keys = match name.kind() {
            Kind::Semaphore => self
                .all_slots(name)
                .await?
                .into_iter()
                .map(|(slot, _)| LockKey::slot(name.as_str(), slot))
                .collect(),
            Kind::Mutex => {
                // A several-name lease is removed from every one of its names.
                let key = match self.engine.inspect(&name.key()).await? {
                    Some(holder) if LeaseId::parse(&holder.lease).is_ok_and(|id| id.is_group()) => {
                        self.group_key(&name.key(), &holder.lease).await?
                    }
                    _ => name.key(),
                };
                let mut keys = vec![key];
                keys.extend(self.readers(name).await?.into_iter().map(|(key, _)| key));
                keys
            }
            _ => vec![name.key()],
        };
        let mut removed = Vec::new();
        for key in keys {
            if let Some(token) = self.engine.evict(&key).await? {
                removed.push(token);
                self.active().retain(|_, t| t.token != token);
                for member in key.members() {
                    self.events
                        .publish(&member.topic(), LockEvent::Evicted { token });
                }
            }
        }
        if removed.is_empty() {
            self.events.wake(&name.topic());
        }
        Ok(removed)
    }

    /// Who holds `name`, if a majority agree that someone does: a lock's or an election's
    /// one holder, a semaphore's holders by slot.
    pub async fn inspect(&self, name: &LockName) -> Result<Vec<LockHolder>, LeaseError> {
        if name.kind() == Kind::Semaphore {
            return Ok(self
                .all_slots(name)
                .await?
                .into_iter()
                .map(|(slot, holder)| LockHolder {
                    name: name.to_string(),
                    slot: Some(slot),
                    ..LockHolder::from(holder)
                })
                .collect());
        }
        if name.kind() != Kind::Mutex {
            let holder = self.engine.inspect(&name.key()).await?;
            return Ok(holder.map(LockHolder::from).into_iter().collect());
        }
        // The exclusive holder and the shared ones are read at once: one round trip.
        let key = name.key();
        let (holder, readers) = tokio::join!(self.engine.inspect(&key), self.readers(name));
        if let Some(holder) = holder? {
            return Ok(vec![LockHolder::from(holder)]);
        }
        let mut holders: Vec<LockHolder> = readers?
            .into_iter()
            .map(|(_, holder)| LockHolder {
                name: name.to_string(),
                mode: Mode::Shared,
                ..LockHolder::from(holder)
            })
            .collect();
        holders.sort_by_key(|h| h.token);
        Ok(holders)
    }

    /// The shared holds of lock `name` that a majority hold, with their keys.
    async fn readers(&self, name: &LockName) -> Result<Vec<(LockKey, Holder)>, EngineError> {
        let prefix = format!("{name}/");
        let (holders, _) = self
            .engine
            .list(Kind::Reader, &prefix, "", MAX_SHARED_LISTED)
            .await?;
        Ok(holders
            .into_iter()
            .map(|h| {
                let key = LockKey {
                    kind: Kind::Reader,
                    name: h.name.as_str().into(),
                };
                (key, h)
            })
            .collect())
    }

    /// One page of held locks in name order, and where the next page starts.
    pub async fn list(
        &self,
        prefix: &NamePrefix,
        after: &NamePrefix,
        limit: usize,
    ) -> Result<(Vec<LockHolder>, Option<String>), LeaseError> {
        let (holders, next) = self
            .engine
            .list(Kind::Mutex, prefix.as_str(), after.as_str(), limit)
            .await?;
        Ok((holders.into_iter().map(LockHolder::from).collect(), next))
    }

    /// How each master's steps have travelled (address, traffic), for the masters that
    /// send them in batches.
    pub fn master_traffic(&self) -> impl Iterator<Item = (&str, Traffic)> {
        self.engine
            .nodes()
            .iter()
            .filter_map(|node| Some((node.address(), node.traffic()?)))
    }

    /// Whether grants can succeed now, and each master as `/readyz` shows it.
    pub fn readiness(&self) -> Readiness {
        let monitor = self.engine.monitor();
        Readiness {
            ready: monitor.ready() && !self.shutdown.is_cancelled(),
            problem: monitor.problem(),
            masters: monitor
                .status()
                .into_iter()
                .zip(self.engine.nodes())
                .map(|(status, node)| MasterStatus {
                    cluster: node.cluster_status(),
                    subscribed: node.subscribed(),
                    ..status
                })
                .collect(),
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
            token: FencingToken(1),
            ttl: Duration::from_secs(10),
            validity: Duration::from_millis(9_898),
            remaining: Duration::from_secs(10),
            owner: None,
            at: tokio::time::Instant::now(),
            session: None,
        };
        // Time spent between the masters' answers and the response (serialising, a slow
        // task) is time the client can no longer rely on.
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(lease.validity_now(), Duration::from_millis(9_598));
        assert_eq!(lease.remaining_now(), Duration::from_millis(9_700));
    }
}
