//! The lease service: what the HTTP handlers call. It mints lease ids, waits for held
//! locks, keeps grants safe against cancelled requests, and counts what it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::events::{Events, Line, LockEvent};
use super::granted::{Lease, LockHolder};
use super::kinds::{self, Grant, Target};
use super::{LeaseError, Ttl, WaitTime};
use crate::config::Caps;
use crate::metrics::Metrics;
use crate::model::{FencingToken, GrantKey, LeaseId, LockName, NamePrefix, Owner, millis};
use crate::model::{GrantTerms, Kind, Listeners, MasterStatus, News, Traffic};
use crate::redlock::{EngineError, Redlock};

/// Whether this replica can grant, and why not.
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    /// A majority of masters answer and vote, and the process is not shutting down.
    pub ready: bool,
    /// Why a majority cannot vote, in words, when it is more than masters being down.
    pub problem: Option<String>,
    pub masters: Vec<MasterStatus>,
}

/// How many times a grant that met a split vote tries again within the request.
const SPLIT_RETRIES: u32 = 4;

/// What `revoke_held_by` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnedRevoke {
    /// The holder's lease held the lock and is revoked.
    Revoked,
    /// No lease holds the lock.
    Free,
    /// Another holder's lease holds it: left as it is.
    Others,
}

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
    /// How long after shutdown begins held streams' leases are still renewed (the drain's
    /// grace), for their holders to resume them elsewhere; unset: not at all.
    pub(super) drain_grace: std::sync::OnceLock<Duration>,
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
            drain_grace: std::sync::OnceLock::new(),
        })
    }

    /// Renew held streams' leases for `grace` after shutdown begins (told `closed`), so
    /// that their holders resume them through another replica without a gap. The process
    /// waits for those renews as it drains, so `grace` is the drain's own.
    pub fn keep_streams_through(&self, grace: Duration) {
        let _ = self.drain_grace.set(grace);
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
    pub(crate) fn active_sessions(&self) -> usize {
        self.sessions.active()
    }

    /// Leases granted here that are neither revoked nor lapsed.
    pub(crate) fn active_leases(&self) -> usize {
        let now = Instant::now();
        let mut active = self.active();
        active.retain(|_, t| t.lapses > now);
        active.len()
    }

    /// The per-name event bus: waiting grants queue on it, observers subscribe to it.
    pub(crate) fn events(&self) -> &Arc<Events> {
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
    pub(crate) async fn grant_keyed(
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
    pub(crate) async fn grant_reporting(
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
            pooled: target.pooled(),
            patience_ms: 0,
        };
        let ttl = ttl.get();
        let fingerprint = target.fingerprint();
        let keyed = key.map(|k| k.derive(name, &fingerprint, ttl, owner.as_deref()));
        let lock_delay_ms = millis(target.lock_delay);
        let grant = |listeners, claimant| Grant {
            target: &target,
            ttl,
            owner: owner.clone(),
            keyed: keyed.as_ref(),
            claimant,
            terms: GrantTerms {
                listeners,
                lock_delay_ms,
            },
        };
        if wait == WaitTime::NONE {
            let result = self.attempt(&grant(listeners, None)).await;
            self.account(name, &result, false, listeners);
            return result;
        }

        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + wait.get();
        let mut contended = false;
        let mut tickets = Vec::new();
        for topic in target.topics() {
            let eager = target.eager();
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
        let claimant = target.holder.clone().unwrap_or_else(LeaseId::generate);
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
                let result = self.attempt(&grant(listeners, Some(&claimant))).await;
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
    async fn attempt(&self, grant: &Grant<'_>) -> Result<Lease, LeaseError> {
        let mut tries = 0;
        loop {
            let result = self.attempt_hold(grant).await;
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
                    return match &grant.target.session {
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

    pub(crate) async fn renew(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
    ) -> Result<Lease, LeaseError> {
        self.renew_with(name, id, ttl, None, None).await
    }

    /// Renew a lease and make `value` its owner text: an elected leader proclaims a new
    /// value without losing its term. Observers on every replica are told.
    pub(crate) async fn proclaim(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
        value: Owner,
    ) -> Result<Lease, LeaseError> {
        let lease = self.renew_with(name, id, ttl, Some(value), None).await?;
        let token = lease.token;
        self.events
            .publish(&lease.name.topic(), LockEvent::Proclaimed { token });
        self.engine
            .announce(&lease.name.key(), News::Proclaimed, token);
        Ok(lease)
    }

    /// Renew a lease, with new owner text when given, and with `stream`, handing it to that
    /// held stream (a resume: `Engine::leave`).
    pub(super) async fn renew_with(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Ttl>,
        owner: Option<Owner>,
        stream: Option<Arc<str>>,
    ) -> Result<Lease, LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let leased = match self
            .engine
            .renew_with(&key, &id, ttl.map(Ttl::get), owner, stream)
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
        let lease = kinds::with_names(Lease::new(name, id, leased), &key);
        self.track(&lease);
        Ok(lease)
    }

    pub async fn revoke(&self, name: LockName, id: LeaseId) -> Result<(), LeaseError> {
        self.end_lease(name, id, None).await
    }

    /// Revoke the lease that `target`'s holder holds (`held_by`): Dapr's unlock and
    /// FleetLock's steady-state, which name their holder, not a lease. `Others` when someone
    /// else holds the lock (never for a semaphore: its other permits are not this holder's
    /// business). Between the read and the revoke the lease may end and another take the
    /// name, but the revoke is by the lease id the masters compare, so it never ends that
    /// other one (it answers `Free`).
    pub(crate) async fn revoke_held_by(&self, target: &Target) -> Result<OwnedRevoke, LeaseError> {
        let lease = match self.held_by(target).await? {
            kinds::HeldBy::Holder(lease) => lease,
            kinds::HeldBy::Another => return Ok(OwnedRevoke::Others),
            kinds::HeldBy::Nobody => return Ok(OwnedRevoke::Free),
        };
        match self.revoke(target.name.clone(), lease).await {
            Ok(()) => Ok(OwnedRevoke::Revoked),
            Err(LeaseError::NotFound) => Ok(OwnedRevoke::Free),
            Err(e) => Err(e),
        }
    }

    /// Revoke a lease as the held stream `stream` ends, only while that stream keeps it
    /// (`Engine::leave`): `NotFound` when its holder resumed it elsewhere.
    pub(super) async fn leave(
        &self,
        name: LockName,
        id: LeaseId,
        stream: Arc<str>,
    ) -> Result<(), LeaseError> {
        self.end_lease(name, id, Some(stream)).await
    }

    async fn end_lease(
        &self,
        name: LockName,
        id: LeaseId,
        stream: Option<Arc<str>>,
    ) -> Result<(), LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let ended = match stream {
            Some(stream) => self.engine.leave(&key, &id, stream).await,
            None => self.engine.release(&key, &id).await,
        };
        let result = ended.map_err(LeaseError::from);
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

    pub(crate) async fn check(&self, name: LockName, id: LeaseId) -> Result<Lease, LeaseError> {
        let key = self.hold_key(&name, &id).await?;
        let leased = self.engine.check(&key, &id).await?;
        Ok(kinds::with_names(Lease::new(name, id, leased), &key))
    }

    /// Remove whoever holds `name` (an administrator's force-release; every permit of a
    /// semaphore): the removed leases' tokens, none when nobody held it. A removed holder's
    /// next renew answers not found, a stream holding it is told `force_released`, waiters
    /// are woken.
    pub(crate) async fn force_release(
        &self,
        name: &LockName,
    ) -> Result<Vec<FencingToken>, LeaseError> {
        let keys = self.holds_of(name).await?;
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

    /// One page of held locks in name order, and where the next page starts.
    pub(crate) async fn list(
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
    pub(crate) fn master_traffic(&self) -> impl Iterator<Item = (&str, Traffic)> {
        self.engine.traffic()
    }

    /// Whether grants can succeed now, and each master as `/readyz` shows it.
    pub(crate) fn readiness(&self) -> Readiness {
        let monitor = self.engine.monitor();
        Readiness {
            ready: monitor.ready() && !self.shutdown.is_cancelled(),
            problem: monitor.problem(),
            masters: self.engine.masters(),
        }
    }
}
