//! `LockNode` in process: the embedded store and the fault-injection node.
//!
//! With no Redis configured, redlockd serves from one of these (one process, not
//! distributed: for development and tests). The same node, given a fault plan, is the
//! deterministic target of the engine tests: it can be down, slower than the timeout,
//! lose its reply after applying the write, restart empty, or run its clock fast. Its
//! semantics mirror the Lua scripts in `scripts/` step for step, and its clock is tokio's,
//! so `tokio::time::pause()` drives expiry in tests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::clock::{self, ClockPolicy, ClockStatus, ClockWatch, Reading};
use super::group;
use super::node::{
    Acquired, Announcement, Claim, Ending, HeldPage, Holding, ListPage, Listener, Listing,
    LockNode, NodeError, NodeResult, Owned, Probe, Renewal, SessionState, SessionStep,
};
use crate::model::{
    FencingToken, Idem, Kind, LeaseId, LockKey, Owner, SessionHold, claimant_of, opener_of,
};

mod data;
mod several;

use data::{Data, Entry, Session};

/// How a memory node misbehaves.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Fault {
    #[default]
    None,
    /// Refuses every step at once, like a master whose port is closed.
    Down,
    /// Never answers, like a paused master; nothing is applied.
    Hang,
    /// Answers every step after this long; the step is applied when it answers.
    Slow(Duration),
    /// Applies every step, then never answers: the write lands but the reply is lost.
    LoseReply,
    /// Applies every step at once and answers this long after: a reply held up on its
    /// way back (on a loaded host, a master's answer read late).
    SlowReply(Duration),
}

/// A copy of a node's data at one moment: what a master restarted from an old RDB
/// snapshot (or an `appendfsync everysec` tail) comes back with.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Clone)]
pub struct Snapshot {
    locks: HashMap<LockKey, Entry>,
    records: HashMap<String, (String, Instant)>,
    fence: u64,
    marker: Option<String>,
    run_record: Option<String>,
    watermarks: HashMap<String, u64>,
    delays: HashMap<LockKey, (String, Instant)>,
    sessions: HashMap<String, Session>,
}

pub struct MemoryNode {
    address: String,
    data: Mutex<Data>,
    fault: Mutex<Fault>,
    /// The node's clock as the engine watches a master's (`store::clock`), read on every
    /// step, on the same time base as the keys' expiry (tokio's, so paused time holds).
    clock: ClockWatch,
    /// Tokio's clock and the wall clock at one moment: a step's "wall" time is the
    /// second plus the tokio time since the first.
    epoch: (Instant, i64),
    /// Source of run ids: each restart gets a new one, as a Redis restart does.
    #[cfg(any(test, feature = "test-util"))]
    restarts: AtomicU64,
    /// Whether the node keeps every write it acknowledged through a restart (a Redis
    /// master with `appendfsync always`): the embedded store's restarts are the process's
    /// own, and a test's `restart_from` models a master that went back in time. A test
    /// makes it a master on `appendfsync everysec` (`set_durable(false)`).
    durable: AtomicBool,
    /// A test's control of the quarantine's read (`held`): holds whose TTL is longer than
    /// this many ms are left out of it, as a read that forgot kept holds would (u64::MAX:
    /// none is). Set only by `set_read_skips_longer_than`, to show that the tests of the read
    /// fail when it misses a hold.
    read_skips_longer_than: AtomicU64,
    /// Who hears this node's announcements (`listen`): the replicas sharing it in a test,
    /// as a Redis master's subscribers do; a release a waiting grant marked is told to
    /// them all, as release.lua publishes it.
    listeners: Mutex<Vec<(Listener, CancellationToken)>>,
}

impl MemoryNode {
    pub fn new(address: impl Into<String>) -> Self {
        Self::with_clock(address, ClockPolicy::default())
    }

    /// A node whose clock is watched under `policy` (`trust` shows what the watch
    /// prevents).
    pub fn with_clock(address: impl Into<String>, policy: ClockPolicy) -> Self {
        Self {
            address: address.into(),
            data: Mutex::new(Data {
                locks: HashMap::new(),
                records: HashMap::new(),
                fence: 0,
                marker: None,
                run_record: None,
                watermarks: HashMap::new(),
                run_id: 0,
                started: Instant::now(),
                clock_rate: 1.0,
                clock_offset: Duration::ZERO,
                since_sweep: 0,
                shared: HashMap::new(),
                claims: HashMap::new(),
                met: std::collections::HashSet::new(),
                delays: HashMap::new(),
                sessions: HashMap::new(),
            }),
            fault: Mutex::new(Fault::None),
            clock: ClockWatch::new(policy),
            epoch: (Instant::now(), clock::wall_us()),
            #[cfg(any(test, feature = "test-util"))]
            restarts: AtomicU64::new(0),
            durable: AtomicBool::new(true),
            read_skips_longer_than: AtomicU64::new(u64::MAX),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Tell every listener that `topic` was released (release.lua's release channel).
    fn announce_freed(&self, topic: &str) {
        let listeners: Vec<Listener> = {
            let mut all = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|(_, stop)| !stop.is_cancelled());
            all.iter().map(|(l, _)| l.clone()).collect()
        };
        for listener in listeners {
            listener(Announcement::Freed(topic));
        }
    }

    // The data is plain values: a panic mid-step elsewhere cannot leave it half-written
    // in a way that matters more than refusing to serve would.
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(any(test, feature = "test-util"))]
    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Make the node's clock run `rate` times as fast as the process's: its keys expire early.
    pub fn set_clock_rate(&self, rate: f64) {
        self.data().clock_rate = rate;
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Move the node's clock `by` forward at once, as a master's wall clock jumps: every
    /// key with less than that left expires now.
    pub fn jump_clock(&self, by: Duration) {
        self.data().clock_offset += by;
    }

    /// The embedded store: one node that is its own deployment. It is marked from the
    /// start, and its fencing counter starts from the wall clock in microseconds, so that
    /// tokens keep rising across restarts of redlockd although nothing is persisted (it
    /// would take more than a million grants a second to catch up with the clock).
    pub(crate) fn embedded() -> Self {
        let node = Self::new("embedded");
        {
            let mut data = node.data();
            data.marker = Some("embedded".into());
            data.fence = super::clock_floor();
        }
        node
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Lose everything, as a master without persistence does when it restarts: locks,
    /// fencing counter and marker. The node gets a new run id.
    pub fn restart_empty(&self) {
        self.restart_from(Snapshot {
            locks: HashMap::new(),
            records: HashMap::new(),
            fence: 0,
            marker: None,
            run_record: None,
            watermarks: HashMap::new(),
            delays: HashMap::new(),
            sessions: HashMap::new(),
        });
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Leave holds whose TTL is longer than `ttl` out of the quarantine's read (see
    /// `read_skips_longer_than`): the control that proves a test of the read.
    pub fn set_read_skips_longer_than(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.read_skips_longer_than.store(ms, Ordering::Relaxed);
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Whether the node keeps every acknowledged write through a restart (see `durable`).
    pub fn set_durable(&self, durable: bool) {
        self.durable.store(durable, Ordering::Relaxed);
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The node's data now, to restart from later.
    pub fn snapshot(&self) -> Snapshot {
        let data = self.data();
        Snapshot {
            locks: data.locks.clone(),
            records: data.records.clone(),
            fence: data.fence,
            marker: data.marker.clone(),
            run_record: data.run_record.clone(),
            watermarks: data.watermarks.clone(),
            delays: data.delays.clone(),
            sessions: data.sessions.clone(),
        }
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Restart with `snapshot`'s data, as a master restarted from an old snapshot does:
    /// whatever happened since is lost. The node gets a new run id.
    pub fn restart_from(&self, snapshot: Snapshot) {
        let mut data = self.data();
        data.locks = snapshot.locks;
        data.records = snapshot.records;
        data.fence = snapshot.fence;
        data.marker = snapshot.marker;
        data.run_record = snapshot.run_record;
        data.watermarks = snapshot.watermarks;
        data.delays = snapshot.delays;
        data.sessions = snapshot.sessions;
        data.claims.clear();
        data.met.clear();
        data.shared.clear();
        let readers: Vec<LockKey> = data
            .locks
            .keys()
            .filter(|k| k.kind == Kind::Reader)
            .cloned()
            .collect();
        for key in readers {
            data.shared
                .entry(key.owner_name().to_owned())
                .or_default()
                .insert(key);
        }
        data.run_id = self.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        data.started = Instant::now();
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Whether the node carries its marker (votes), for tests.
    pub fn marked(&self) -> bool {
        self.data().marker.is_some()
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The node's fencing counter, for tests.
    pub fn fence(&self) -> u64 {
        self.data().fence
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Whether the node holds the mutex `name` for `lease` now, for tests.
    pub fn holds(&self, name: &str, lease: &str) -> bool {
        let mut data = self.data();
        let now = Instant::now() + data.clock_offset;
        data.live(&LockKey::mutex(name), now)
            .is_some_and(|e| e.lease.as_str() == lease)
    }

    /// Apply a lock's `step` under the fault plan, as one atomic step: refused, as a Redis
    /// master's batch is, while the node's clock is seen to have jumped.
    async fn step<T>(
        &self,
        step: impl FnOnce(&mut Data, Instant) -> NodeResult<T>,
    ) -> NodeResult<T> {
        if let Some(refused) = self.clock.refusal() {
            return Err(refused);
        }
        let sent = Instant::now();
        let (result, master_us) = self.apply(step).await?;
        self.clock.observe(self.reading(sent, master_us))?;
        result
    }

    /// Apply an upkeep step (a probe, restore, unmark): it reads the node's clock, which the
    /// monitor acts on, but is never refused for it.
    async fn upkeep<T>(
        &self,
        step: impl FnOnce(&mut Data, Instant) -> NodeResult<T>,
    ) -> NodeResult<T> {
        let sent = Instant::now();
        let (result, master_us) = self.apply(step).await?;
        let _ = self.clock.observe(self.reading(sent, master_us));
        result
    }

    /// This process's wall clock now, in microseconds, as tokio's clock runs.
    fn local_us(&self) -> i64 {
        self.epoch.1
            + i64::try_from(
                Instant::now()
                    .saturating_duration_since(self.epoch.0)
                    .as_micros(),
            )
            .unwrap_or(i64::MAX)
    }

    /// The reading of a call sent at `sent` and answered now, whose step read the node's
    /// clock as `master_us`.
    fn reading(&self, sent: Instant, master_us: i64) -> Reading {
        Reading {
            sent,
            received: Instant::now(),
            master_us,
            local_us: self.local_us(),
        }
    }

    /// Apply `step` under the fault plan: its result (`Err` when nothing answered) and the
    /// node's clock (in microseconds since the epoch) when it was applied.
    async fn apply<T>(
        &self,
        step: impl FnOnce(&mut Data, Instant) -> NodeResult<T>,
    ) -> NodeResult<(NodeResult<T>, i64)> {
        let fault = *self.fault.lock().unwrap_or_else(|e| e.into_inner());
        match fault {
            Fault::Down => {
                return Err(NodeError::Connection(format!(
                    "{} is down (injected)",
                    self.address
                )));
            }
            Fault::Hang => return std::future::pending().await,
            Fault::Slow(delay) => tokio::time::sleep(delay).await,
            Fault::None | Fault::LoseReply | Fault::SlowReply(_) => {}
        }
        let result = {
            let mut data = self.data();
            let now = Instant::now() + data.clock_offset;
            data.sweep(now);
            let offset = i64::try_from(data.clock_offset.as_micros()).unwrap_or(i64::MAX);
            (step(&mut data, now), self.local_us() + offset)
        };
        match fault {
            Fault::LoseReply => std::future::pending().await,
            Fault::SlowReply(delay) => {
                tokio::time::sleep(delay).await;
                Ok(result)
            }
            _ => Ok(result),
        }
    }
}

#[async_trait]
impl LockNode for MemoryNode {
    fn address(&self) -> &str {
        &self.address
    }

    fn clock(&self) -> Option<ClockStatus> {
        Some(self.clock.status())
    }

    async fn held(&self, _cursor: u64) -> NodeResult<Option<HeldPage>> {
        self.upkeep(|data, now| {
            // Time left by this node's clock, as a master's PTTL answers it.
            let left = |until: Instant| {
                let left = until
                    .saturating_duration_since(now)
                    .mul_f64(data.clock_rate);
                u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
            };
            let named =
                |what: &str, key: &LockKey| format!("{what}:{}:{}", key.kind.segment(), key.name);
            let mut holds: Vec<(String, String, u64)> = Vec::new();
            let skipped = self.read_skips_longer_than.load(Ordering::Relaxed);
            for (key, entry) in data.locks.iter().filter(|(_, e)| e.ttl_ms <= skipped) {
                holds.push((
                    named("lock", key),
                    entry.lease.as_str().to_owned(),
                    left(entry.expires),
                ));
            }
            for (key, (lease, until)) in &data.delays {
                holds.push((named("delay", key), lease.clone(), left(*until)));
            }
            for (name, (claimant, until)) in &data.claims {
                holds.push((format!("claim:{name}"), claimant.clone(), left(*until)));
            }
            for (id, session) in &data.sessions {
                holds.push((
                    format!("session:{id}"),
                    String::new(),
                    left(session.expires),
                ));
            }
            for (record, (_, until)) in &data.records {
                holds.push((format!("idem:{record}"), String::new(), left(*until)));
            }
            holds.retain(|(_, _, pttl)| *pttl > 0);
            // One page: the whole of an in-process store is read under its lock at once.
            Ok(Some(HeldPage { holds, next: 0 }))
        })
        .await
    }

    async fn longest_delay(&self) -> NodeResult<Option<Duration>> {
        self.upkeep(|data, now| {
            let longest = data
                .delays
                .values()
                .map(|(_, until)| {
                    until
                        .saturating_duration_since(now)
                        .mul_f64(data.clock_rate)
                })
                .max()
                .unwrap_or_default();
            Ok(Some(longest))
        })
        .await
    }

    fn settle_clock(&self) {
        self.clock.settle();
    }

    fn listen(&self, listener: Listener, shutdown: CancellationToken) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((listener, shutdown));
    }

    async fn acquire(&self, claim: Claim<'_>) -> NodeResult<Acquired> {
        let Claim {
            key,
            lease,
            ttl_ms,
            owner,
            idem,
            // The embedded store announces nothing: its replica hears of its own doings; a
            // waiting grant's claim on a lock held shared is all it keeps of them.
            listeners,
            lock_delay_ms,
        } = claim;
        if key.kind == Kind::Group {
            return self.acquire_many(claim).await;
        }
        self.step(|data, now| {
            data.check_marker()?;
            let record = match data.record(idem, now) {
                Ok(record) => record,
                Err(mismatch) => return Ok(mismatch),
            };
            if data.live(key, now).is_some()
                && let Some(entry) = data.locks.get_mut(key)
            {
                if let Some(idem) = idem
                    && entry.lease == *lease
                {
                    entry.seen = Some(idem.attempt.clone());
                    let token = entry.token;
                    data.refresh(key, idem, ttl_ms, now);
                    return Ok(Acquired::Granted {
                        token: FencingToken::new(token),
                    });
                }
                entry.waited |= listeners.waiting;
                entry.single |= listeners.waiting;
                let entry = &data.locks[key];
                return Ok(Acquired::Held {
                    pttl_ms: data.pttl(entry, now),
                    lease: entry.lease.clone(),
                });
            }
            if key.kind == Kind::Reader
                && let Some(refused) = data.share_refused(key, listeners.waiting, now)
            {
                return Ok(refused);
            }
            if let Some(claimed) = data.group_claim(key, None, listeners.waiting, now) {
                return Ok(claimed);
            }
            if let Some(delayed) = data.delayed(key, now) {
                return Ok(delayed);
            }
            if let Some(pttl_ms) = data.readers_refuse(
                key,
                lease,
                listeners.waiting,
                listeners.waiting.then_some(listeners.patience_ms),
                now,
            ) {
                return Ok(Acquired::Held {
                    pttl_ms,
                    lease: LeaseId::stored("shared"),
                });
            }
            if record.is_some() {
                return Ok(Acquired::Ended);
            }
            if key.kind == Kind::Reader {
                data.shared
                    .entry(key.owner_name().to_owned())
                    .or_default()
                    .insert(key.clone());
            }
            // A semaphore's slot always wakes its waiters (acquire.lua's 'a').
            let waited =
                listeners.pooled || (key.kind == Kind::Mutex && data.end_claim(&key.name, now));
            data.fence += 1;
            let token = data.fence;
            let expires = data.expiry(now, ttl_ms);
            if let Some(idem) = idem {
                data.records
                    .insert(idem.record.clone(), (idem.fingerprint.clone(), expires));
            }
            data.locks.insert(
                key.clone(),
                Entry {
                    delay_ms: lock_delay_ms,
                    waited,
                    ..Entry::granted(lease, token, ttl_ms, owner, expires, idem)
                },
            );
            if lock_delay_ms > 0 {
                data.delay_after(key, lease.as_str(), lock_delay_ms, expires);
            }
            Ok(Acquired::Granted {
                token: FencingToken::new(token),
            })
        })
        .await
    }

    async fn confirm(&self, key: &LockKey, lease: &LeaseId, token: FencingToken) -> NodeResult<()> {
        if key.kind == Kind::Group {
            return group::confirm(self, key, lease, token).await;
        }
        self.step(|data, now| {
            data.check_marker()?;
            data.fence = data.fence.max(token.get());
            if let Some(entry) = data.live(key, now).filter(|e| e.lease == *lease) {
                entry.token = token.get();
            }
            Ok(())
        })
        .await
    }

    async fn renew(&self, renewal: Renewal<'_>) -> NodeResult<Owned<Holding>> {
        if renewal.key.kind == Kind::Group {
            return group::renew(self, renewal).await;
        }
        let (key, lease) = (renewal.key, renewal.lease);
        let (ttl_ms, owner, stream) = (renewal.ttl_ms, renewal.owner, renewal.stream);
        self.step(|data, now| {
            data.check_marker()?;
            let rate = data.clock_rate;
            let Some(entry) = data.live(key, now).filter(|e| e.lease == *lease) else {
                return Ok(Owned::NotOwner);
            };
            // As renew.lua: a stream another token opened keeps the lease.
            if let Some(stream) = stream {
                let kept = entry.stream.as_deref().unwrap_or("");
                if kept.is_empty() || opener_of(kept) == opener_of(stream) {
                    entry.stream = Some(stream.to_owned());
                }
            }
            if entry.session.is_some() {
                // Held through a session: it lives as long as the session (see renew.lua).
                // Its TTL is the session's, as a check reports it; what is left of it (the
                // validity) is what a majority will keep.
                if let Some(owner) = owner {
                    entry.owner = Some(owner.clone());
                }
                let entry = entry.clone();
                let kept_by = entry.stream.as_deref().unwrap_or("").into();
                return Ok(Owned::Yes(Holding {
                    stream: Some(kept_by),
                    ..data.holding(&entry, now)
                }));
            }
            let ttl_ms = ttl_ms.unwrap_or(entry.ttl_ms);
            entry.ttl_ms = ttl_ms;
            entry.expires = now + Duration::from_millis(ttl_ms).div_f64(rate);
            if let Some(owner) = owner {
                entry.owner = Some(owner.clone());
            }
            // The node's own clock says the full TTL is left.
            let holding = Holding {
                lease: entry.lease.clone(),
                token: FencingToken::new(entry.token),
                ttl_ms,
                pttl_ms: ttl_ms,
                owner: entry.owner.clone(),
                stream: Some(entry.stream.as_deref().unwrap_or("").into()),
            };
            let (delay_ms, expires) = (entry.delay_ms, entry.expires);
            if delay_ms > 0 {
                data.delay_after(key, lease.as_str(), delay_ms, expires);
            }
            Ok(Owned::Yes(holding))
        })
        .await
    }

    async fn release(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ending: &Ending,
    ) -> NodeResult<Owned<()>> {
        if key.kind == Kind::Group {
            return group::release(self, key, lease, ending).await;
        }
        let released = self
            .step(|data, now| {
                data.check_marker()?;
                let ours = |e: &Entry| match ending {
                    Ending::Undo {
                        attempt: Some(attempt),
                    } => {
                        e.made.as_deref() == Some(&**attempt)
                            && e.seen.as_deref() == Some(&**attempt)
                    }
                    Ending::Leave { stream } => e.stream.as_deref().unwrap_or("") == &**stream,
                    _ => true,
                };
                if data
                    .live(key, now)
                    .is_some_and(|e| e.lease == *lease && ours(e))
                {
                    let entry = data.locks.remove(key);
                    let delay_ms = entry.as_ref().map_or(0, |e| e.delay_ms);
                    let waited = entry.as_ref().is_some_and(|e| e.waited);
                    let turn = entry
                        .as_ref()
                        .is_some_and(|e| e.group.is_some() && e.single);
                    if turn && !matches!(ending, Ending::Undo { .. }) {
                        // The name's turn goes to single grants (release.lua's 't:'), in
                        // place of the next several-name grant's claim. (A lock-delay is
                        // kept apart here, in `delays`.)
                        data.met.remove(&*key.name);
                        data.claims.insert(
                            key.name.to_string(),
                            ("t:".to_owned(), now + Duration::from_millis(250)),
                        );
                    }
                    if let (Some(record), Ending::Undo { .. }) =
                        (entry.and_then(|e| e.record), ending)
                    {
                        data.records.remove(&record);
                    }
                    if delay_ms > 0 {
                        if *ending == Ending::Evict {
                            data.delay_after(key, lease.as_str(), delay_ms, now);
                        } else if data
                            .delays
                            .get(key)
                            .is_some_and(|(l, _)| l == lease.as_str())
                        {
                            data.delays.remove(key);
                        }
                    }
                    Ok(Owned::Yes(waited))
                } else {
                    Ok(Owned::NotOwner)
                }
            })
            .await?;
        Ok(match released {
            Owned::Yes(waited) => {
                if waited {
                    self.announce_freed(&key.topic());
                }
                Owned::Yes(())
            }
            Owned::NotOwner => Owned::NotOwner,
        })
    }

    async fn read(&self, key: &LockKey) -> NodeResult<Vec<Holding>> {
        if key.kind == Kind::Group {
            return group::read(self, key).await;
        }
        self.step(|data, now| {
            data.check_marker()?;
            if data.live(key, now).is_none() {
                return Ok(Vec::new());
            }
            Ok(data
                .locks
                .get(key)
                .map(|e| data.holding(e, now))
                .into_iter()
                .collect())
        })
        .await
    }

    async fn session(&self, id: &str, step: SessionStep<'_>) -> NodeResult<Owned<SessionState>> {
        self.step(|data, now| {
            data.check_marker()?;
            if let SessionStep::Open { ttl_ms, owner } = step {
                let session = Session {
                    ttl_ms,
                    owner: owner.filter(|o| !o.is_empty()).cloned(),
                    expires: data.expiry(now, ttl_ms),
                    holds: Vec::new(),
                    stream: None,
                };
                let state = data.session_state(&session, now, false);
                data.sessions.insert(id.to_owned(), session);
                return Ok(Owned::Yes(state));
            }
            let Some(mut session) = data.sessions.get(id).filter(|s| s.expires > now).cloned()
            else {
                data.sessions.remove(id);
                return Ok(Owned::NotOwner);
            };
            let state = match step {
                SessionStep::Open { .. } => unreachable!("answered above"),
                SessionStep::Renew { ttl_ms, stream } => {
                    if let Some(stream) = stream.filter(|s| !s.is_empty()) {
                        session.stream = Some(stream.to_owned());
                    }
                    session.ttl_ms = ttl_ms.unwrap_or(session.ttl_ms);
                    session.expires = data.expiry(now, session.ttl_ms);
                    let (kept, gone): (Vec<SessionHold>, Vec<SessionHold>) =
                        std::mem::take(&mut session.holds)
                            .into_iter()
                            .partition(|h| data.carry(h, session.expires, None, now));
                    session.holds = kept;
                    SessionState {
                        carried: session.holds.iter().map(|h| h.lease.clone()).collect(),
                        dropped: gone.into_iter().map(|h| h.lease).collect(),
                        stream: Some(session.stream.as_deref().unwrap_or("").into()),
                        ..data.session_state(&session, now, false)
                    }
                }
                SessionStep::Read => {
                    // Only holds that still exist: one revoked, force-released or expired
                    // stays attached until the next renew takes it off.
                    let mut state = data.session_state(&session, now, true);
                    state.holds.retain(|h| data.carries(h, now));
                    state
                }
                SessionStep::End { stream } => {
                    // As session.lua: a held stream's end ends only a session it keeps.
                    if stream.is_some_and(|s| s != session.stream.as_deref().unwrap_or("")) {
                        return Ok(Owned::NotOwner);
                    }
                    data.sessions.remove(id);
                    return Ok(Owned::Yes(data.session_state(&session, now, true)));
                }
                SessionStep::Attach { hold } => {
                    if !data.carry(hold, session.expires, Some(id), now) {
                        return Ok(Owned::Yes(SessionState::default()));
                    }
                    for key in match hold.key.kind {
                        Kind::Group => hold.key.members(),
                        _ => vec![hold.key.clone()],
                    } {
                        if let Some(entry) = data.locks.get_mut(&key) {
                            entry.ttl_ms = session.ttl_ms;
                        }
                    }
                    session.holds.push(hold.clone());
                    SessionState {
                        attached: true,
                        ..data.session_state(&session, now, false)
                    }
                }
            };
            data.sessions.insert(id.to_owned(), session);
            Ok(Owned::Yes(state))
        })
        .await
    }

    async fn lock_delay(&self, key: &LockKey) -> NodeResult<Option<Duration>> {
        self.step(|data, now| {
            data.check_marker()?;
            if data.live(key, now).is_some() {
                return Ok(None);
            }
            Ok(match data.delayed(key, now) {
                Some(Acquired::Delayed { pttl_ms }) => Some(Duration::from_millis(pttl_ms)),
                _ => None,
            })
        })
        .await
    }

    async fn members(&self, key: &LockKey, lease: &LeaseId) -> NodeResult<Option<String>> {
        self.step(|data, now| {
            data.check_marker()?;
            Ok(data
                .live(key, now)
                .filter(|e| e.lease == *lease)
                .and_then(|e| e.group.clone()))
        })
        .await
    }

    async fn slots(&self, name: &str, limit: u16) -> NodeResult<Vec<(u16, Holding)>> {
        self.step(|data, now| {
            data.check_marker()?;
            let mut held = Vec::new();
            for slot in 0..limit {
                let key = LockKey::slot(name, slot);
                if data.live(&key, now).is_some() {
                    held.push((slot, data.holding(&data.locks[&key], now)));
                }
            }
            Ok(held)
        })
        .await
    }

    async fn list(&self, listing: Listing<'_>) -> NodeResult<ListPage> {
        let (after, limit) = (listing.after, listing.limit);
        self.step(|data, now| {
            data.check_marker()?;
            let mut keys: Vec<&LockKey> = data
                .locks
                .iter()
                .filter(|(key, e)| {
                    key.kind == listing.kind
                        && key.name.starts_with(listing.prefix)
                        && &*key.name > after
                        && e.expires > now
                })
                .map(|(key, _)| key)
                .collect();
            keys.sort_unstable();
            let more = keys.len() > limit;
            keys.truncate(limit);
            Ok(ListPage {
                last: keys.last().map(|k| k.name.to_string()),
                locks: keys
                    .into_iter()
                    .map(|key| (key.name.to_string(), data.holding(&data.locks[key], now)))
                    .collect(),
                more,
            })
        })
        .await
    }

    async fn probe(&self) -> NodeResult<Probe> {
        self.upkeep(|data, now| {
            Ok(Probe {
                run_id: format!("{}#{}", self.address, data.run_id),
                marker: data.marker.clone(),
                fence: data.fence,
                watermarks: data
                    .watermarks
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
                uptime: now.saturating_duration_since(data.started),
                unknown_layout: None,
                run_record: data.run_record.clone(),
            })
        })
        .await
    }

    async fn restore(&self, fence: u64, identity: &str, run_id: Option<&str>) -> NodeResult<()> {
        self.upkeep(|data, _| {
            data.fence = data.fence.max(fence);
            data.marker = Some(identity.to_owned());
            if let Some(run_id) = run_id {
                data.run_record = Some(run_id.to_owned());
            }
            Ok(())
        })
        .await
    }

    async fn durable(&self) -> NodeResult<bool> {
        let durable = self.durable.load(Ordering::Relaxed);
        self.upkeep(|_, _| Ok(durable)).await
    }

    async fn record_run(&self, identity: &str, run_id: &str) -> NodeResult<()> {
        self.upkeep(|data, _| {
            if data.marker.as_deref() == Some(identity) {
                data.run_record = Some(run_id.to_owned());
            }
            Ok(())
        })
        .await
    }

    async fn unmark(&self, identity: &str) -> NodeResult<()> {
        self.upkeep(|data, _| {
            if data.marker.as_deref() == Some(identity) {
                data.marker = None;
            }
            Ok(())
        })
        .await
    }

    async fn record_watermarks(&self, seen: &[(String, u64)]) -> NodeResult<()> {
        self.upkeep(|data, _| {
            for (identity, fence) in seen {
                let recorded = data.watermarks.entry(identity.clone()).or_insert(0);
                *recorded = (*recorded).max(*fence);
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_embedded_store_keeps_tokens_rising_across_restarts_of_redlockd() {
        let grant = async |node: &MemoryNode| match node
            .acquire(Claim::new(
                &LockKey::mutex("a"),
                &LeaseId::stored("L"),
                1000,
            ))
            .await
        {
            Ok(Acquired::Granted { token }) => token,
            other => panic!("{other:?}"),
        };
        let before = grant(&MemoryNode::embedded()).await;
        // A new process: nothing survives but the clock, which the floor counts in
        // microseconds; step past one for certain.
        std::thread::sleep(Duration::from_millis(2));
        let after = grant(&MemoryNode::embedded()).await;
        assert!(after > before, "{after} after {before}");
    }
}
