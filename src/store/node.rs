//! The seam between the Redlock engine and one master.
//!
//! The engine never talks to Redis directly: it talks to `LockNode`s. The Redis node
//! (`store::redis`) proves the Lua and the wire against real masters; the memory node
//! (`store::memory`) is the embedded store and, with a fault plan, the deterministic
//! target for engine tests. Every operation is one atomic step on one master.

use std::sync::Arc;

use async_trait::async_trait;

use crate::model::{
    FencingToken, Idem, Kind, LeaseId, Listeners, LockKey, News, Owner, SessionHold, Traffic,
};

/// What one master holds for one lock, for one of its holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub lease: LeaseId,
    pub token: FencingToken,
    /// The TTL the lease was granted or last renewed with; a renew without `ttl_ms` reuses it.
    pub ttl_ms: u64,
    /// What is left of it on this master, by this master's clock.
    pub pttl_ms: u64,
    pub owner: Option<Owner>,
    /// The held stream that keeps the lease here since a resume (renew.lua's 'stream'):
    /// `None` when this master did not say (reads), `""` for the stream that granted it.
    pub stream: Option<Arc<str>>,
}

/// One master's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The key was set; `token` is this master's counter after its increment.
    Granted { token: FencingToken },
    /// Another lease holds the lock here for `pttl_ms` more. Naming the lease is what lets
    /// the engine tell a real holder (one lease on a majority) from a split vote (several
    /// contenders, each on a minority, whose keys are about to be released).
    Held { pttl_ms: u64, lease: LeaseId },
    /// The grant's Idempotency-Key was used here, within its TTL, for another request
    /// (another name, TTL or owner). Nothing was written.
    Mismatch,
    /// The key's lease held the lock here and has ended (revoked, or force-released): a
    /// retry must not lock again for a holder that has let go. Nothing was written.
    Ended,
    /// The lock is free here, but the lock-delay of a lease that ended other than by its
    /// holder's revoke lasts `pttl_ms` more, by this master's clock. Nothing was written.
    Delayed { pttl_ms: u64 },
}

/// How a lease's hold on one master ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The holder let go (or an administrator made it): announced, so that waiting grants
    /// and observers learn of it at once. An Idempotency-Key's record stays until the
    /// grant's TTL, so that a late retry of the key does not lock again for nobody.
    Revoke,
    /// An administrator removed the holder (force-release): announced as an eviction, so
    /// that the holder's stream can say so rather than "revoked".
    Evict,
    /// A failed grant attempt is undone: quietly (nothing was granted, and waking waiters
    /// would only make them spin), and its key's record is forgotten. With `attempt` (a
    /// keyed grant's), only a hold that attempt made and that no other attempt of the key
    /// has answered for since.
    Undo { attempt: Option<Arc<str>> },
    /// A held stream ends (its client left): a revoke, but only while `stream` still keeps
    /// the lease (`""`: the stream that granted it). Once its holder resumed the lease
    /// through another stream (`Renewal::stream`), the old stream's end leaves it alone.
    Leave { stream: Arc<str> },
}

/// One page of a master's held locks, in name order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    pub locks: Vec<(String, Holding)>,
    /// Whether names past `last` were not looked at (the page is full, or the master's
    /// budget for one call ran out).
    pub more: bool,
    /// The last name the master looked at, held or not.
    pub last: Option<String>,
}

/// One master's answer to a renew or release that names a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned<T> {
    Yes(T),
    /// The lock is free here or held by another lease.
    NotOwner,
}

/// What one master holds for a session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionState {
    pub ttl_ms: u64,
    /// What is left of it on this master, by this master's clock.
    pub pttl_ms: u64,
    pub owner: Option<Owner>,
    /// Its holds (read and end only).
    pub holds: Vec<SessionHold>,
    /// The lease ids of the holds a renew carried along.
    pub carried: Vec<LeaseId>,
    /// The lease ids of holds a renew found attached and gone here (revoked, force-released,
    /// expired): taken off the session here, and a denial of the hold.
    pub dropped: Vec<LeaseId>,
    /// An attach: whether the hold was here to attach (its grant may have reached only a
    /// majority of masters).
    pub attached: bool,
    /// A renew: the held stream that keeps the session here (`""` for the one that opened
    /// it, or none); `None` from other steps.
    pub stream: Option<Arc<str>>,
}

/// One step of a session's life on one master.
#[derive(Debug, Clone, Copy)]
pub enum SessionStep<'a> {
    /// Make the session, with its TTL and owner text.
    Open {
        ttl_ms: u64,
        owner: Option<&'a Owner>,
    },
    /// Extend it, and every hold made through it, to `ttl_ms` (its own when `None`); with
    /// `stream` (a resume of a session's held stream), the session kept from now on by
    /// that stream (as `Renewal::stream` for a lease).
    Renew {
        ttl_ms: Option<u64>,
        stream: Option<&'a str>,
    },
    /// What it is and holds.
    Read,
    /// Delete it, answering its holds, which the caller then releases. With `stream` (a
    /// held stream's end), only while that stream keeps the session (`""`: the stream that
    /// opened it); else `NotOwner`, and nothing is done.
    End { stream: Option<&'a str> },
    /// Make `hold` one of the session's: its keys live as long as the session from now.
    Attach { hold: &'a SessionHold },
}

/// What a health probe learns about a master.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Probe {
    /// Changes whenever the master process restarts.
    pub run_id: String,
    /// The marker key redlockd leaves on every master, whose value is the master's identity
    /// (random, new each time the marker is written). `None` when it is gone: the master
    /// has lost its data and must not vote until it is safe again.
    pub marker: Option<String>,
    /// The master's fencing counter.
    pub fence: u64,
    /// The highest fencing counter ever seen on each *other* master, by identity. A master
    /// whose counter is below what the others recorded for it went back in time (restarted
    /// from an old snapshot) and may have lost locks, marker or not.
    pub watermarks: Vec<(String, u64)>,
    /// How long the master process has been running.
    pub uptime: std::time::Duration,
    /// The run id of the master process under which its marker was last written or its data
    /// last verified (`<marker>:run`): a master whose `run_id` is not this one restarted
    /// since, and what it came back with may lack its last writes (`LockNode::durable`).
    /// `None` when nothing is recorded (a release before this one marked it).
    pub run_record: Option<String>,
    /// The data layout the master names, when it names one this release does not know
    /// (a later release's): its steps are refused (`NodeError::Layout`), and `/readyz`
    /// says why it does not vote.
    pub unknown_layout: Option<String>,
}

impl Probe {
    pub(crate) fn marked(&self) -> bool {
        self.marker.is_some()
    }
}

/// One loss of data by one shard of a cluster (`LockNode::lost_shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostShard {
    /// The shard's `host:port`.
    pub address: String,
    /// Which of its losses, as this process counts them: a read of the holds begun for one
    /// must not shorten the next.
    pub loss: u64,
}

/// One page of every hold a master carries (`LockNode::held`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldPage {
    /// Each key with a time to live: its name, what names its holder there (a lease id, a
    /// claim's value; empty where the key's name is the holder's), and its time left in ms
    /// by the master's clock.
    pub holds: Vec<(String, String, u64)>,
    /// Where the next page starts; 0 once the read is done.
    pub next: u64,
}

/// Why one master gave no usable answer. Classified, never collapsed to a bool: the engine
/// tells 409 from 503 by these, and metrics count them by kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("no answer within the master timeout")]
    Timeout,
    #[error("connection failed: {0}")]
    Connection(String),
    #[error("script failed: {0}")]
    Script(String),
    /// The master has no marker key: it restarted empty (or was flushed) and cannot vote.
    #[error("master has lost its data and is not voting")]
    Amnesic,
    /// The master's connection broke (it may have restarted): its answers do not count
    /// until a probe has checked that it kept its data.
    #[error("master reconnected and is not voting until it is verified")]
    Unverified,
    /// The master's clock jumped (its locks may have expired early), or was first met too
    /// far from this replica's: its answers do not count (see `store::clock`).
    #[error("master's {0}: it is not voting")]
    Clock(String),
    /// The master keeps a data layout this release does not know (a later release wrote
    /// it): every step refuses to act on it rather than misread it (`layout.lua`).
    #[error("{0}")]
    Layout(String),
    #[error("{0}")]
    Other(String),
}

impl NodeError {
    /// Every `kind` label value.
    pub(crate) const KINDS: [&'static str; 8] = [
        "timeout",
        "connection",
        "script",
        "amnesic",
        "unverified",
        "clock",
        "layout",
        "other",
    ];

    /// The `kind` label of `redlockd_master_errors_total`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            NodeError::Timeout => "timeout",
            NodeError::Connection(_) => "connection",
            NodeError::Script(_) => "script",
            NodeError::Amnesic => "amnesic",
            NodeError::Unverified => "unverified",
            NodeError::Clock(_) => "clock",
            NodeError::Layout(_) => "layout",
            NodeError::Other(_) => "other",
        }
    }
}

pub(crate) type NodeResult<T> = Result<T, NodeError>;

/// What a master relays from the redlockd replicas that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announcement<'a> {
    /// `name` was released by a revoke, in the form every version of redlockd announces:
    /// enough to wake its waiting grants.
    Freed(&'a str),
    /// The lease of `name` with this token was released by a revoke.
    Released(&'a str, FencingToken),
    /// The lease of `name` with this token was removed by an administrator.
    Evicted(&'a str, FencingToken),
    /// A grant of `name` was decided on a majority with this token.
    Acquired(&'a str, FencingToken),
    /// The holder of `name`'s lease with this token changed its owner text (an elected
    /// leader proclaimed a new value).
    Proclaimed(&'a str, FencingToken),
    /// Announcements may have been missed (the subscription was re-established): whatever
    /// waits for one should look again.
    Missed,
}

/// One grant's step on one master: `lease` asks for `key` for `ttl_ms`, with the owner
/// text it shows and, for a grant with an Idempotency-Key, its record.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub key: &'a LockKey,
    pub lease: &'a LeaseId,
    pub ttl_ms: u64,
    pub owner: Option<&'a Owner>,
    pub idem: Option<&'a Idem>,
    pub listeners: Listeners,
    /// How long after the lease ends other than by its holder's revoke the name stays
    /// refused (0: not at all).
    pub lock_delay_ms: u64,
}

impl<'a> Claim<'a> {
    /// A claim with no owner text, no Idempotency-Key and no lock-delay.
    pub fn new(key: &'a LockKey, lease: &'a LeaseId, ttl_ms: u64) -> Self {
        Self {
            key,
            lease,
            ttl_ms,
            owner: None,
            idem: None,
            listeners: Listeners::default(),
            lock_delay_ms: 0,
        }
    }

    /// The same claim, made under an Idempotency-Key's record.
    pub fn with_idem(self, idem: &'a Idem) -> Self {
        Self {
            idem: Some(idem),
            ..self
        }
    }
}

/// One renew's step on one master: `lease`'s hold on `key` is extended to `ttl_ms` (its
/// own TTL when `None`), its owner text replaced with `owner` when given, and, with
/// `stream` (a resume), the lease kept from now on by that held stream (see
/// `Ending::Leave`).
#[derive(Debug, Clone, Copy)]
pub struct Renewal<'a> {
    pub key: &'a LockKey,
    pub lease: &'a LeaseId,
    pub ttl_ms: Option<u64>,
    pub owner: Option<&'a Owner>,
    pub stream: Option<&'a str>,
}

/// One page of a list on one master: up to `limit` held locks of `kind` whose names start
/// with `prefix` and sort after `after` (from the start when empty), in name order.
#[derive(Debug, Clone, Copy)]
pub struct Listing<'a> {
    pub kind: Kind,
    pub prefix: &'a str,
    pub after: &'a str,
    pub limit: usize,
}

impl<'a> Renewal<'a> {
    pub(crate) fn new(
        key: &'a LockKey,
        lease: &'a LeaseId,
        ttl_ms: Option<u64>,
        owner: Option<&'a Owner>,
    ) -> Self {
        Self {
            key,
            lease,
            ttl_ms,
            owner,
            stream: None,
        }
    }
}

/// Called with every announcement a master relays, so that waiting grants and observers
/// in every redlockd replica learn of releases and grants at once.
pub(crate) type Listener = Arc<dyn Fn(Announcement<'_>) + Send + Sync>;

/// What a master shows of itself to `/readyz` (`LockNode::report`): its live status beyond
/// its probe.
#[derive(Debug, Clone, Default)]
pub struct NodeReport {
    /// Its parts: a Redis Cluster's shards (none for one server).
    pub shards: Option<crate::model::ClusterStatus>,
}

/// How the monitor must treat a master (`LockNode::rules`): facts fixed when the master's
/// node is built, so that the upkeep loops read them for nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeRules {
    /// How long its upkeep (probe, restore, unmark) may take, when longer than the master
    /// timeout: a cluster's restores a shard slot by slot.
    pub upkeep_budget: Option<std::time::Duration>,
    /// Where its fencing counters restart from after it lost its data.
    pub fences: FenceSource,
}

impl NodeRules {
    /// A master whose counters restart from the clock judges its own rollbacks: it keeps
    /// no single counter the monitor could compare with a high-water mark, and no marker
    /// the monitor retires.
    pub(crate) fn judges_own_rollbacks(&self) -> bool {
        self.fences == FenceSource::Clock
    }
}

/// Where a master's fencing counters restart from after it lost its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FenceSource {
    /// One counter per master, restored above what the other masters saw; the monitor
    /// judges its rollbacks from the high-water marks the masters record.
    #[default]
    Counter,
    /// Counters restored from the wall clock (a cluster's, one per slot): the master judges
    /// its own rollbacks; every other master's restore must start from the clock too, so
    /// that no restored counter is below a token this master granted.
    Clock,
}

/// One independent master. Each method is a single atomic step on that master; the engine
/// bounds every call with the master timeout, so implementations need not.
#[async_trait]
pub trait LockNode: Send + Sync + 'static {
    /// Where the master is, without credentials: safe for logs, metrics and `/readyz`.
    fn address(&self) -> &str;

    /// Make `lease` a holder of `key` for `ttl_ms` if the kind's rule allows it (for a
    /// mutex: the lock is free), taking a fencing token from this master's counter. With
    /// `idem`, a lease that holds the key already is answered as granted with its token,
    /// and the key's record decides `Mismatch` and `Ended`; a grant leaves the record for
    /// `ttl_ms`.
    async fn acquire(&self, claim: Claim<'_>) -> NodeResult<Acquired>;

    /// Raise this master's counter to at least `token` and, if `lease` holds `key` here,
    /// record `token` as its fencing token. Makes a chosen token known to a majority.
    async fn confirm(&self, key: &LockKey, lease: &LeaseId, token: FencingToken) -> NodeResult<()>;

    /// Extend the renewal's hold, if its lease holds its key (see `Renewal`).
    async fn renew(&self, renewal: Renewal<'_>) -> NodeResult<Owned<Holding>>;

    /// End `lease`'s hold on `key`, if it holds it, as `ending` says (see `Ending`).
    async fn release(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ending: &Ending,
    ) -> NodeResult<Owned<()>>;

    /// Every holder of `key` here (for a mutex, none or one).
    async fn read(&self, key: &LockKey) -> NodeResult<Vec<Holding>>;

    /// How long a lock-delay still refuses grants of the lock `key` here, while it is free
    /// (`None`: it is held, or no delay runs): what inspect shows of a delay.
    async fn lock_delay(&self, key: &LockKey) -> NodeResult<Option<std::time::Duration>>;

    /// The names the several-name lease `lease` holds, read through its hold of the mutex
    /// `key` here (`None` when it does not hold it here).
    async fn members(&self, key: &LockKey, lease: &LeaseId) -> NodeResult<Option<String>>;

    /// The held slots below `limit` of semaphore `name` here, in slot order, with their
    /// holders: what a permit's grant reads before it takes a free slot.
    async fn slots(&self, name: &str, limit: u16) -> NodeResult<Vec<(u16, Holding)>>;

    /// One step of session `id` (see `SessionStep`); `NotOwner` when the session does not
    /// exist here.
    async fn session(&self, id: &str, step: SessionStep<'_>) -> NodeResult<Owned<SessionState>>;

    /// A page of held locks (see `Listing`). A master may stop early to keep one call
    /// short; `ListPage::more` says so.
    async fn list(&self, listing: Listing<'_>) -> NodeResult<ListPage>;

    async fn probe(&self) -> NodeResult<Probe>;

    /// Raise the counter to at least `fence` and leave the marker with the new `identity`:
    /// the master votes again. With `run_id` (the process this replica's probe saw), the
    /// marker's run record names it (see `Probe::run_record`), in the same step.
    async fn restore(&self, fence: u64, identity: &str, run_id: Option<&str>) -> NodeResult<()>;

    /// Whether every write the master acknowledged survives its crash: `appendonly yes`
    /// with `appendfsync always`. A master that refuses to say (a managed service that
    /// forbids `CONFIG`) is not. Asked once per restart, never on a hot path.
    async fn durable(&self) -> NodeResult<bool> {
        Ok(false)
    }

    /// Record `run_id` as the process under which the master's data was verified, if its
    /// marker still carries `identity` (see `Probe::run_record`).
    async fn record_run(&self, identity: &str, run_id: &str) -> NodeResult<()>;

    /// Remove the marker if it still carries `identity`: the master went back in time and
    /// every replica must stop counting its votes until it is restored.
    async fn unmark(&self, identity: &str) -> NodeResult<()>;

    /// Record on this master the highest counter seen on each other master (by identity),
    /// keeping the larger of the recorded and the given value.
    async fn record_watermarks(&self, seen: &[(String, u64)]) -> NodeResult<()>;

    /// Tell the other replicas, through this master, what happened to the lease of `key`
    /// with `token` (a grant decided, a value proclaimed). Best effort: a lost announcement
    /// costs an observer elsewhere the news, never a lock. Nodes that share the process
    /// with the engine need not.
    async fn announce(&self, _key: &LockKey, _news: News, _token: FencingToken) -> NodeResult<()> {
        Ok(())
    }

    /// Start delivering this master's announcements to `listener` until `shutdown` fires.
    /// Nodes that share the process with the engine need not.
    fn listen(&self, _listener: Listener, _shutdown: tokio_util::sync::CancellationToken) {}

    /// Whether this process hears the master's announcements now, for `/readyz` (`None`
    /// for nodes that share the process with the engine and announce nothing).
    fn subscribed(&self) -> Option<bool> {
        None
    }

    /// Record on this master how far its clock stands from this replica's (`offset_us`,
    /// as last read and verified), under the replica's `id`: what a replica meeting it for
    /// the first time compares its own reading with.
    async fn record_clock(&self, _id: &str, _offset_us: i64) -> NodeResult<()> {
        Ok(())
    }

    /// The longest any lock-delay claim here still runs (a lease's TTL and its delay, as
    /// acquire.lua claims them), for the quarantine of another master that lost its data;
    /// `None` when this master cannot tell (a cluster: its claims are spread over shards).
    async fn longest_delay(&self) -> NodeResult<Option<std::time::Duration>> {
        Ok(None)
    }

    /// One page of every hold this master carries, from `cursor` (0: the first page), for
    /// the quarantine of another master that lost its data; `None` when this master cannot
    /// tell (a cluster: its holds are spread over shards). A page may be short or empty
    /// with more to come: a read is done when `next` is 0.
    async fn held(&self, _cursor: u64) -> NodeResult<Option<HeldPage>> {
        Ok(None)
    }

    /// The shards of this master (a Redis Cluster's primaries) that lost their data and are
    /// quarantined, whose quarantine no read of the other masters' holds has shortened yet
    /// (`shorten_shard`). None for a single master.
    fn lost_shards(&self) -> Vec<LostShard> {
        Vec::new()
    }

    /// Let the quarantine of `shard` (as `lost_shards` named it) end within `left` if it
    /// would end later: the other masters were read, and `outstanding` holds found on too
    /// few of them may have relied on it, the last of them ending by then. Nothing, if the
    /// shard has been restored since, or lost its data again.
    fn shorten_shard(&self, _shard: &LostShard, _left: std::time::Duration, _outstanding: usize) {}

    /// What this master's clock looked like when last read (`store::clock`); `None` for a
    /// cluster, whose shards are watched one by one and shown in its `report`.
    fn clock(&self) -> Option<super::clock::ClockStatus> {
        None
    }

    /// The master whose clock jumped has been quarantined (its marker removed): its
    /// scripts refuse by themselves from here on (see `ClockWatch::settle`).
    fn settle_clock(&self) {}

    /// How the monitor must treat this master. Fixed for the node's life; one method, so
    /// that what a master is made of (one server, or a Redis Cluster's shards) stays
    /// behind this trait.
    fn rules(&self) -> NodeRules {
        NodeRules::default()
    }

    /// What `/readyz` shows of this master beyond its probe (built on each call: for the
    /// readiness report, not for upkeep loops).
    fn report(&self) -> NodeReport {
        NodeReport::default()
    }

    /// How this master's steps have travelled so far, for nodes that send them over a
    /// wire in batches (none for a node in this process).
    fn traffic(&self) -> Option<Traffic> {
        None
    }
}
