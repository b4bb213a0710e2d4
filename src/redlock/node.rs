//! The seam between the Redlock engine and one master.
//!
//! The engine never talks to Redis directly: it talks to `LockNode`s. The Redis node
//! (`store::redis`) proves the Lua and the wire against real masters; the memory node
//! (`store::memory`) is the embedded store and, with a fault plan, the deterministic
//! target for engine tests. Every operation is one atomic step on one master.

use std::sync::Arc;

use async_trait::async_trait;

/// What one master holds for one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    pub lease: String,
    pub token: u64,
    /// The TTL the lease was granted or last renewed with; a renew without `ttl_ms` reuses it.
    pub ttl_ms: u64,
    /// What is left of it on this master, by this master's clock.
    pub pttl_ms: u64,
    pub owner: Option<String>,
}

/// One master's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The key was set; `token` is this master's counter after its increment.
    Granted { token: u64 },
    /// Another lease holds the lock here for `pttl_ms` more.
    Held { pttl_ms: u64 },
}

/// One master's answer to a renew or release that names a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned<T> {
    Yes(T),
    /// The lock is free here or held by another lease.
    NotOwner,
}

/// What a health probe learns about a master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Changes whenever the master process restarts.
    pub run_id: String,
    /// Whether the key redlockd leaves on every master is still there: when it is gone the
    /// master has lost its data and must not vote until it is safe again.
    pub marked: bool,
    /// The master's fencing counter.
    pub fence: u64,
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
    #[error("{0}")]
    Other(String),
}

impl NodeError {
    /// The `kind` label of `redlockd_master_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeError::Timeout => "timeout",
            NodeError::Connection(_) => "connection",
            NodeError::Script(_) => "script",
            NodeError::Amnesic => "amnesic",
            NodeError::Other(_) => "other",
        }
    }
}

pub type NodeResult<T> = Result<T, NodeError>;

/// Called with a lock name whenever a master announces that the lock was released, so
/// that waiting grants in every redlockd replica wake at once; called with `None` when
/// announcements may have been missed (the subscription was re-established), so that
/// every waiter looks again.
pub type ReleaseListener = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// One independent master. Each method is a single atomic step on that master; the engine
/// bounds every call with the master timeout, so implementations need not.
#[async_trait]
pub trait LockNode: Send + Sync + 'static {
    /// Where the master is, without credentials: safe for logs, metrics and `/readyz`.
    fn address(&self) -> &str;

    /// Set the lock to `lease` for `ttl_ms` if it is free, taking a fencing token from this
    /// master's counter.
    async fn acquire(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: u64,
        owner: Option<&str>,
    ) -> NodeResult<Acquired>;

    /// Raise this master's counter to at least `token` and, if `lease` holds the lock here,
    /// record `token` as its fencing token. Makes a chosen token known to a majority.
    async fn confirm(&self, name: &str, lease: &str, token: u64) -> NodeResult<()>;

    /// Extend the lock to `ttl_ms` (the lease's own TTL when `None`) if `lease` holds it.
    async fn renew(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: Option<u64>,
    ) -> NodeResult<Owned<Holding>>;

    /// Delete the lock if `lease` holds it, and announce the release.
    async fn release(&self, name: &str, lease: &str) -> NodeResult<Owned<()>>;

    /// The lock's current holding here, if any.
    async fn read(&self, name: &str) -> NodeResult<Option<Holding>>;

    /// Up to `cap` held locks whose names start with `prefix`, in no particular order.
    async fn list(&self, prefix: &str, cap: usize) -> NodeResult<Vec<(String, Holding)>>;

    async fn probe(&self) -> NodeResult<Probe>;

    /// Raise the counter to at least `fence` and leave the marker: the master votes again.
    async fn restore(&self, fence: u64) -> NodeResult<()>;

    /// Start delivering release announcements from this master to `listener` until
    /// `shutdown` fires. Nodes that share the process with the engine need not.
    fn listen_for_releases(
        &self,
        _listener: ReleaseListener,
        _shutdown: tokio_util::sync::CancellationToken,
    ) {
    }
}
