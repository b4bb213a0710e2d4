//! One Redis Cluster, reached as one master of the quorum: the wire under `RedisNode` when
//! its URL is `redis+cluster://`.
//!
//! Routing: every step's keys share one hash slot (`store::layout`), so a step is one
//! EVALSHA sent to the primary that owns its slot. The slot map comes from `CLUSTER SLOTS`;
//! a `MOVED` answer (a slot moved for good) refreshes it and the step is sent once more to
//! the new owner, an `ASK` (a slot being migrated) is followed with `ASKING`. A slot's
//! fencing counter and marker are keys of that slot, so a migration carries them with its
//! locks. Steps are not batched: a batch's keys would span slots. Each is sent as its own
//! script's call (`scripts/single.lua`), not as a batch of one.
//!
//! Shard health, the cluster's part of promise 7: the engine's monitor judges the cluster as
//! one master, and this module judges each shard (primary) inside it, so that one shard's
//! loss stops only the names in its slots.
//! - A shard found without its markers (it restarted empty) while others keep theirs is
//!   quarantined for the largest TTL plus lock-delay, then its slots' counters are raised to
//!   the wall clock in microseconds (above every token granted) and their markers put back.
//! - A shard that restarted since its data was verified (its first slot's marker carries a
//!   run record, `<marker>:run`, naming the process it was written or verified under)
//!   without `appendonly yes` and `appendfsync always` may have lost its last writes with
//!   its markers kept: its markers are removed and it is quarantined, as a single master is
//!   (`redlock::health`).
//! - A shard whose connection broke, or whose run_id changed, is unverified: its steps are
//!   refused until a probe has compared each slot's counter with the highest token this
//!   process saw granted there. A counter below it means the shard came back from an old
//!   snapshot: its markers are removed and it is quarantined.
//! - A slot whose new owner was ever a replica (a failover: replication is
//!   asynchronous, so the newest locks may be missing) is treated the same way. A slot that
//!   moves between primaries (resharding) is followed: its keys moved with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use redis::aio::ConnectionManager;
use redis::{Cmd, Script, Value};
use tokio::time::Instant;

use super::batch::{Step, split_time};
use super::clock::{self, ClockPolicy, ClockWatch, Reading};
use super::clock_floor;
use super::layout::{Keys, SLOTS};

mod health;
mod listen;
mod replies;

use super::node::{HeldPage, LostShard, NodeError, NodeResult};
use super::redis::steps;
use crate::model::{ClusterStatus, ShardStatus};
use listen::{Heard, listen_on};
use replies::{info_field, node_address, promoted, replica_address};

/// How long one pipelined chunk of a shard's upkeep (a restore of 512 slots) may take: a
/// restore that stops half-way leaves its shard unmarked, which a loaded machine must not
/// cause.
const UPKEEP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one probe or restore of a whole cluster may take (each of its pipelined chunks
/// is bounded by `UPKEEP_TIMEOUT`).
pub(crate) const UPKEEP_BUDGET: Duration = Duration::from_secs(30);

/// How long a shard that was unverified waits before a probe may verify it (as a master's).
const VERIFY_AFTER: Duration = Duration::from_millis(300);

/// What a master's clock and a cluster's shards are held to: the engine's quarantine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardPolicy {
    /// How long a shard that lost its data stays out (the largest TTL plus lock-delay).
    pub quarantine: Duration,
    /// `REDLOCKD_UNSAFE_SKIP_QUARANTINE`: restore at once (tests of data loss only).
    pub skip_quarantine: bool,
    /// How each master's (each shard's) clock is watched.
    pub clock: ClockPolicy,
}

impl Default for ShardPolicy {
    /// The quarantine of the default largest TTL and lock-delay (a minute each).
    fn default() -> Self {
        Self {
            quarantine: Duration::from_secs(120),
            skip_quarantine: false,
            clock: ClockPolicy::default(),
        }
    }
}

/// What one shard looks like to this process.
#[derive(Debug, Default)]
struct ShardHealth {
    up: bool,
    latency: Option<Duration>,
    run_id: Option<String>,
    /// Since when its answers must not count (see the module's doc).
    unverified_since: Option<Instant>,
    /// Until when it is out, having lost its data (`SystemTime` for `/readyz`).
    quarantine: Option<(Instant, SystemTime)>,
    /// Whether its slots carried their markers at the last probe.
    marked: bool,
    /// The highest token this process saw granted in each of its slots.
    seen: HashMap<u16, u64>,
    /// How many slots it serves.
    slots: usize,
    /// Why it was quarantined, for `/readyz`.
    why: Option<&'static str>,
    /// How many times this process has quarantined it: which loss a read of the other
    /// masters' holds is for (`LostShard`).
    losses: u64,
    /// Once the other masters' holds were read for this quarantine: how many found on too
    /// few of them keep it out (`Cluster::shorten_shard`).
    outstanding: Option<usize>,
    /// The run id whose restart this process has judged (`ClusterHealth::judge_run`).
    run_checked: Option<String>,
    /// The data layout it keeps, as its first slot's `<marker>:layout` said at the last
    /// probe, when this release does not know it (its steps are refused by their scripts;
    /// this is what `/readyz` says of it).
    layout: Option<String>,
}

/// Why a shard is quarantined, as `/readyz` says it.
const EMPTY: &str = "its slots' markers are gone (it restarted without its data, or another replica found it lost some)";
const LOSSY: &str = "it restarted without appendonly yes and appendfsync always: the writes it acknowledged last may be lost";
const ROLLED_BACK: &str =
    "went back in time (a slot's fencing counter fell: restarted from an old snapshot)";
const FAILED_OVER: &str = "a replica took over its slots (a failover): replication is asynchronous, so the newest locks may be missing";
const UNMARKED: &str = "the whole cluster went back in time";
const CLOCK_JUMPED: &str = "its clock jumped forward (every lock on it may have expired early)";

impl ShardHealth {
    /// Whether its answers may count. A shard without its markers needs no refusal here
    /// (its scripts refuse by themselves); one quarantined with its markers still there
    /// (their removal failed, or another replica restored it since the last probe) does.
    fn admits(&self) -> Result<(), NodeError> {
        if self.quarantine.is_some() && self.marked {
            Err(NodeError::Amnesic)
        } else if self.unverified_since.is_some() {
            Err(NodeError::Unverified)
        } else {
            Ok(())
        }
    }
}

/// One primary of the cluster.
pub(crate) struct Shard {
    /// `host:port`, as the cluster names it.
    pub address: String,
    /// Steps and probes, answered within the master timeout.
    conn: ConnectionManager,
    /// Upkeep (restores, rollback checks, scans): thousands of commands at once, answered
    /// within `UPKEEP_TIMEOUT`.
    upkeep: ConnectionManager,
    health: Mutex<ShardHealth>,
    /// Read with every step's answer and every probe (`store::clock`).
    clock: ClockWatch,
}

impl Shard {
    fn health(&self) -> std::sync::MutexGuard<'_, ShardHealth> {
        // A poisoned lock only means a panic elsewhere mid-update of plain data.
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether its answers may count: its health, and its clock.
    fn admits(&self) -> Result<(), NodeError> {
        match self.clock.refusal() {
            Some(refused) => Err(refused),
            None => self.health().admits(),
        }
    }
}

/// Who serves each slot.
#[derive(Default)]
struct Topology {
    /// Per slot, the index in `shards` of its primary.
    owners: Vec<Option<usize>>,
    shards: Vec<Arc<Shard>>,
    /// Why the slot map is not whole, when it is not.
    problem: Option<String>,
    /// Raised whenever a slot's owner changes: a read of every shard's holds that began
    /// under another map may have missed a key that moved (`Cluster::held`).
    generation: u64,
}

pub(crate) struct Cluster {
    /// The seed's URL (credentials included), the pattern of every node's.
    seed: url::Url,
    timeout: Duration,
    policy: ShardPolicy,
    keys: Keys,
    topology: RwLock<Arc<Topology>>,
    /// One connection per node ever seen, by `host:port`.
    nodes: Mutex<HashMap<String, Arc<Shard>>>,
    /// Every node ever listed as a replica: a slot that moves to one failed over (a slot map
    /// read mid-failover may list the replica nowhere, so one map's list is not enough).
    replicas_seen: Mutex<std::collections::HashSet<String>>,
    /// Per slot, the primary that served it when last it had one.
    owned_by: Mutex<Vec<Option<String>>>,
    /// One refresh of the slot map at a time.
    refreshing: tokio::sync::Mutex<()>,
    /// The largest counter ever reported to the engine: what the cluster reports never
    /// falls (a shard's rollback is handled here, per shard).
    reported: std::sync::atomic::AtomicU64,
}

/// Whether the Redis server behind `conn` (a master, or a cluster's shard) keeps every
/// write it acknowledged through a crash: `appendonly yes` with `appendfsync always`. A
/// refused `CONFIG` (a managed service that forbids it, an ACL) does not say that it does,
/// so it is taken not to. Unbounded here: the callers bound it.
pub(crate) async fn durable(conn: &ConnectionManager) -> NodeResult<bool> {
    let mut conn = conn.clone();
    // One `CONFIG GET` per parameter: Redis before 7 takes one pattern a call.
    let read: redis::RedisResult<(Vec<String>, Vec<String>)> = redis::pipe()
        .cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async(&mut conn)
        .await;
    match read {
        Ok((appendonly, appendfsync)) => Ok(appendonly.get(1).is_some_and(|v| v == "yes")
            && appendfsync.get(1).is_some_and(|v| v == "always")),
        Err(e) if e.code().is_some() => Ok(false),
        Err(e) => Err(classify(&e)),
    }
}

/// Classify a client error by its kind, never by its message (a script's refusal of a
/// data layout it does not know is its error code, `LAYOUT`).
pub(crate) fn classify(e: &redis::RedisError) -> NodeError {
    use redis::{ErrorKind, ServerErrorKind};
    if e.code() == Some("LAYOUT") {
        NodeError::Layout(e.detail().unwrap_or("an unknown data layout").to_owned())
    } else if e.is_timeout() {
        NodeError::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        NodeError::Connection(e.to_string())
    } else {
        match e.kind() {
            // Still loading its data after a restart, or a cluster without every slot
            // served: as good as not there yet.
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask,
            ) => NodeError::Connection(e.to_string()),
            ErrorKind::Server(
                ServerErrorKind::ResponseError
                | ServerErrorKind::ExecAbort
                | ServerErrorKind::NoScript,
            ) => NodeError::Script(e.to_string()),
            _ => NodeError::Other(e.to_string()),
        }
    }
}

fn is(e: &redis::RedisError, kind: redis::ServerErrorKind) -> bool {
    e.kind() == redis::ErrorKind::Server(kind)
}

impl Cluster {
    pub(crate) fn new(
        seed: &str,
        keys: Keys,
        timeout: Duration,
        policy: ShardPolicy,
    ) -> Result<Self, String> {
        let seed = url::Url::parse(seed).map_err(|e| e.to_string())?;
        Ok(Self {
            seed,
            timeout,
            policy,
            keys,
            topology: RwLock::new(Arc::new(Topology::default())),
            nodes: Mutex::new(HashMap::new()),
            replicas_seen: Mutex::new(std::collections::HashSet::new()),
            owned_by: Mutex::new(Vec::new()),
            refreshing: tokio::sync::Mutex::new(()),
            reported: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The seed's URL with `address` as its host and port.
    fn url_of(&self, address: &str) -> Option<String> {
        let (host, port) = address.rsplit_once(':')?;
        let mut url = self.seed.clone();
        let host = if host.is_empty() || host == "?" {
            self.seed.host_str()?.to_owned()
        } else {
            host.to_owned()
        };
        url.set_host(Some(host.trim_start_matches('[').trim_end_matches(']')))
            .ok()?;
        url.set_port(Some(port.parse().ok()?)).ok()?;
        Some(url.to_string())
    }

    /// The connection to the node at `address`, made when first needed.
    fn node(&self, address: &str) -> NodeResult<Arc<Shard>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(shard) = nodes.get(address) {
            return Ok(shard.clone());
        }
        let url = self
            .url_of(address)
            .ok_or_else(|| NodeError::Other(format!("the cluster named a node {address:?}")))?;
        let client = redis::Client::open(url).map_err(|e| classify(&e))?;
        let manager = |timeout: Duration| {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(250))))
                .set_max_delay(Duration::from_secs(1))
                .set_number_of_retries(usize::MAX);
            ConnectionManager::new_lazy_with_config(client.clone(), config)
                .map_err(|e| classify(&e))
        };
        let shard = Arc::new(Shard {
            address: address.to_owned(),
            conn: manager(self.timeout)?,
            upkeep: manager(UPKEEP_TIMEOUT)?,
            health: Mutex::new(ShardHealth::default()),
            clock: ClockWatch::new(self.policy.clock),
        });
        nodes.insert(address.to_owned(), shard.clone());
        Ok(shard)
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The primary that serves `slot`, reading the slot map first if it is not known.
    async fn owner(&self, slot: u16) -> NodeResult<Arc<Shard>> {
        if let Some(shard) = self.owner_now(slot) {
            return Ok(shard);
        }
        self.refresh().await?;
        self.owner_now(slot).ok_or_else(|| {
            NodeError::Connection(format!("no primary of the cluster serves slot {slot}"))
        })
    }

    fn owner_now(&self, slot: u16) -> Option<Arc<Shard>> {
        let topology = self.topology();
        let at = (*topology.owners.get(usize::from(slot))?)?;
        topology.shards.get(at).cloned()
    }

    /// Read the slot map again, from the seed or any node known. A slot whose new owner was
    /// a replica of its old one failed over: that shard's slots are unmarked (see the
    /// module's doc).
    pub(crate) async fn refresh(&self) -> NodeResult<()> {
        let _one = self.refreshing.lock().await;
        let seed = format!(
            "{}:{}",
            self.seed.host_str().unwrap_or_default(),
            self.seed.port().unwrap_or(6379)
        );
        let mut candidates = vec![seed];
        candidates.extend(self.topology().shards.iter().map(|s| s.address.clone()));
        let mut last = NodeError::Connection("no node of the cluster answers".into());
        for address in candidates {
            let shard = self.node(&address)?;
            let mut conn = shard.conn.clone();
            let read = tokio::time::timeout(
                self.timeout,
                redis::pipe()
                    .cmd("CLUSTER")
                    .arg("SLOTS")
                    .cmd("CLUSTER")
                    .arg("NODES")
                    .query_async::<(Value, String)>(&mut conn),
            )
            .await;
            match read {
                Ok(Ok((slots, nodes))) => {
                    // Every replica, syncing ones too (`CLUSTER SLOTS` lists only those
                    // ready to serve): a slot that later moves to one failed over.
                    self.replicas_seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(nodes.lines().filter_map(replica_address));
                    return self.adopt(&slots).await;
                }
                Ok(Err(e)) => last = classify(&e),
                Err(_) => last = NodeError::Timeout,
            }
        }
        Err(last)
    }

    async fn adopt(&self, slots: &Value) -> NodeResult<()> {
        let Value::Array(ranges) = slots else {
            return Err(NodeError::Other(format!(
                "CLUSTER SLOTS answered {slots:?}"
            )));
        };
        let mut next = Topology {
            owners: vec![None; usize::from(SLOTS)],
            ..Topology::default()
        };
        for range in ranges {
            let Value::Array(parts) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end))) = (parts.first(), parts.get(1))
            else {
                continue;
            };
            let mut nodes = parts.iter().skip(2).filter_map(node_address);
            let Some(primary) = nodes.next() else {
                continue;
            };
            self.replicas_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(nodes);
            let shard = self.node(&primary)?;
            let at = match next.shards.iter().position(|s| Arc::ptr_eq(s, &shard)) {
                Some(at) => at,
                None => {
                    next.shards.push(shard);
                    next.shards.len() - 1
                }
            };
            for slot in (*start).max(0)..=(*end).min(i64::from(SLOTS) - 1) {
                let slot = slot as usize;
                next.owners[slot] = Some(at);
            }
        }
        let now = self.topology();
        let same = |a: &Topology, b: &Topology| {
            a.owners.len() == b.owners.len()
                && a.owners.iter().zip(&b.owners).all(|(x, y)| {
                    match (x.map(|at| &a.shards[at]), y.map(|at| &b.shards[at])) {
                        (Some(x), Some(y)) => x.address == y.address,
                        (None, None) => true,
                        _ => false,
                    }
                })
        };
        next.generation = if same(&now, &next) {
            now.generation
        } else {
            now.generation + 1
        };
        let unserved = next.owners.iter().filter(|o| o.is_none()).count();
        if unserved > 0 {
            next.problem = Some(format!(
                "{unserved} of {SLOTS} hash slots have no primary (the cluster is not whole)"
            ));
        }
        let failed_over_to = |shard: &Shard| {
            self.replicas_seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&shard.address)
        };
        // Slots whose owner changed, by new owner.
        let mut moved: Vec<(Arc<Shard>, Vec<u16>)> = Vec::new();
        {
            // The owner each slot had when last it had one: a map read mid-failover may
            // show the slot unserved for a moment.
            let mut owned_by = self.owned_by.lock().unwrap_or_else(|e| e.into_inner());
            owned_by.resize(usize::from(SLOTS), None);
            for (slot, owner) in next.owners.iter().enumerate() {
                let Some(now) = owner.map(|at| &next.shards[at]) else {
                    continue;
                };
                let was = owned_by[slot].replace(now.address.clone());
                if was.is_some_and(|was| was != now.address) {
                    match moved.iter_mut().find(|(s, _)| Arc::ptr_eq(s, now)) {
                        Some((_, slots)) => slots.push(slot as u16),
                        None => moved.push((now.clone(), vec![slot as u16])),
                    }
                }
            }
        }
        // A new owner listed as a replica in some earlier read failed over. One never seen
        // as a replica may have been one all the same, attached and promoted between two
        // reads of the map: its own replication info says so (a promoted replica keeps its
        // old primary's replication history as its second one). Unanswered, it is taken
        // for a failover: a shard quarantined for nothing costs less than one that lost
        // locks and votes.
        let mut failed_over: Vec<(Arc<Shard>, Vec<u16>)> = Vec::new();
        for (shard, slots) in moved {
            if failed_over_to(&shard) || self.was_promoted(&shard).await {
                failed_over.push((shard, slots));
            }
        }
        for shard in &next.shards {
            let slots = next
                .owners
                .iter()
                .filter(|o| o.is_some_and(|at| Arc::ptr_eq(&next.shards[at], shard)))
                .count();
            shard.health().slots = slots;
        }
        *self.topology.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
        for (shard, slots) in failed_over {
            tracing::error!(
                shard = %shard.address,
                slots = slots.len(),
                "a replica took over slots of this cluster (a failover): replication is asynchronous, so the newest locks may be missing there; the shard stops voting until its quarantine is over"
            );
            {
                let mut health = shard.health();
                // Refused until its markers are gone (see `admits`).
                health.marked = true;
            }
            self.quarantine(&shard, FAILED_OVER);
            match self.unmark_slots(&shard, &slots).await {
                Ok(()) => shard.health().marked = false,
                Err(e) => {
                    tracing::warn!(shard = %shard.address, error = %e, "could not remove the markers of a failed-over shard");
                }
            }
        }
        Ok(())
    }

    /// Whether `shard` says it was a replica once (`INFO replication`: a second replication
    /// offset, which only a promotion sets), or does not answer.
    async fn was_promoted(&self, shard: &Shard) -> bool {
        let mut conn = shard.conn.clone();
        let info = tokio::time::timeout(
            self.timeout,
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut conn),
        )
        .await;
        match info {
            Ok(Ok(info)) => promoted(&info),
            _ => true,
        }
    }

    /// Why the cluster cannot serve every slot, when it cannot.
    pub(crate) fn problem(&self) -> Option<String> {
        self.topology().problem.clone()
    }

    /// Send `call` (one EVALSHA of `script`, the batch of `steps` steps) to the primary of
    /// `slot`: its answers, once the shard's clock, read with them, shows they may count.
    pub(crate) async fn call(
        &self,
        slot: u16,
        call: &Cmd,
        script: &Script,
        steps: usize,
    ) -> NodeResult<Vec<Value>> {
        let shard = self.owner(slot).await?;
        shard.admits()?;
        let sent = Instant::now();
        let (shard, reply) = match self.send(&shard, call, script, false).await {
            Err(e) if is(&e, redis::ServerErrorKind::Moved) => {
                // The slot moved for good: read the map again and follow it, once.
                self.refresh().await?;
                let shard = self.owner(slot).await?;
                shard.admits()?;
                let reply = self
                    .send(&shard, call, script, false)
                    .await
                    .map_err(|e| self.failed(&shard, &e));
                (shard, reply)
            }
            Err(e) if is(&e, redis::ServerErrorKind::Ask) => {
                let Some((address, _)) = e.redirect_node() else {
                    return Err(classify(&e));
                };
                let target = self.node(address)?;
                target.admits()?;
                let reply = self
                    .send(&target, call, script, true)
                    .await
                    .map_err(|e| self.failed(&target, &e));
                (target, reply)
            }
            other => {
                let reply = other.map_err(|e| self.failed(&shard, &e));
                (shard, reply)
            }
        };
        let (answers, master_us) = split_time(reply?, steps)?;
        shard.clock.observe(Reading {
            sent,
            received: Instant::now(),
            master_us,
            local_us: clock::wall_us(),
        })?;
        Ok(answers)
    }

    /// A call to `shard` failed: a broken connection leaves it unverified.
    fn failed(&self, shard: &Shard, e: &redis::RedisError) -> NodeError {
        let error = classify(e);
        let broke = !e.is_timeout()
            && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal());
        let mut health = shard.health();
        if broke {
            health.up = false;
            health.unverified_since.get_or_insert_with(Instant::now);
        } else if e.is_timeout() {
            health.up = false;
        }
        error
    }

    async fn send(
        &self,
        shard: &Shard,
        call: &Cmd,
        script: &Script,
        asking: bool,
    ) -> Result<Value, redis::RedisError> {
        let mut conn = shard.conn.clone();
        let started = Instant::now();
        let mut reply = query(&mut conn, call, asking).await;
        if let Err(e) = &reply
            && is(e, redis::ServerErrorKind::NoScript)
        {
            script.prepare_invoke().load_async(&mut conn).await?;
            reply = query(&mut conn, call, asking).await;
        }
        if reply.is_ok() {
            let mut health = shard.health();
            health.up = true;
            health.latency = Some(started.elapsed());
        }
        reply
    }

    /// This process saw `token` granted (or confirmed) in `slot`.
    pub(crate) fn saw(&self, slot: u16, token: u64) {
        if let Some(shard) = self.owner_now(slot) {
            let mut health = shard.health();
            let seen = health.seen.entry(slot).or_insert(0);
            *seen = (*seen).max(token);
        }
    }

    /// A plain command on the primary of `slot` (a shard channel's publish).
    pub(crate) async fn command<T: redis::FromRedisValue>(
        &self,
        slot: u16,
        cmd: &Cmd,
    ) -> NodeResult<T> {
        let shard = self.owner(slot).await?;
        let mut conn = shard.conn.clone();
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.failed(&shard, &e))
    }

    /// The primaries, as the last slot map named them, with the slots each serves.
    pub(crate) fn shards(&self) -> Vec<(Arc<Shard>, Vec<u16>)> {
        let topology = self.topology();
        let mut out: Vec<(Arc<Shard>, Vec<u16>)> = topology
            .shards
            .iter()
            .map(|s| (s.clone(), Vec::new()))
            .collect();
        for (slot, owner) in topology.owners.iter().enumerate() {
            if let Some(at) = owner {
                out[*at].1.push(slot as u16);
            }
        }
        out
    }

    pub(crate) fn status(&self) -> ClusterStatus {
        let shards = self
            .topology()
            .shards
            .iter()
            .map(|shard| {
                let clock = shard.clock.status();
                let health = shard.health();
                let refused = clock.pending.map(|j| j.describe()).or(clock.settling.clone());
                ShardStatus {
                    address: shard.address.clone(),
                    up: health.up,
                    voting: health.up
                        && health.admits().is_ok()
                        && health.marked
                        && health.layout.is_none()
                        && refused.is_none(),
                    slots: health.slots,
                    latency: health.latency,
                    quarantined_until: health.quarantine.map(|(_, wall)| wall),
                    problem: health.layout.clone().or(refused).or_else(|| {
                        health.quarantine.and(health.why).map(|why| {
                            let jump = (why == CLOCK_JUMPED)
                                .then(|| clock.last.map(|j| format!(" ({})", j.describe())))
                                .flatten()
                                .unwrap_or_default();
                            let holds = match health.outstanding {
                                None => " (the longest a hold may last, until the holds on the other masters are read)".to_owned(),
                                Some(0) => " (no hold on the other masters relied on it)".to_owned(),
                                Some(holds) => format!(
                                    " (until the last of {holds} holds found on too few of the other masters ends)"
                                ),
                            };
                            format!(
                                "{why}{jump}; the names in its slots get no vote from this cluster until its quarantine is over{holds}"
                            )
                        })
                    }),
                    clock_offset_s: clock.offset_s,
                    clock_jumps: [clock.forward_jumps, clock.backward_jumps],
                }
            })
            .collect();
        ClusterStatus {
            shards,
            problem: self.problem(),
        }
    }

    /// Every (shard, matching key) of a scan of the whole cluster for `pattern`.
    pub(crate) async fn scan(&self, pattern: &str) -> NodeResult<Vec<String>> {
        let mut found = Vec::new();
        for (shard, _) in self.shards() {
            let mut conn = shard.upkeep.clone();
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = tokio::time::timeout(
                    UPKEEP_TIMEOUT,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut conn),
                )
                .await
                .map_err(|_| NodeError::Timeout)?
                .map_err(|e| self.failed(&shard, &e))?;
                found.extend(keys);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(found)
    }

    /// Subscribe to every slot's two shard channels, on each primary for its slots, and
    /// hand each message to `deliver` (`"released"` or `"events"`, and the payload) until
    /// a subscription ends (its error: the caller subscribes again, and whatever waits for
    /// an announcement looks again). `subscribed` is called once every channel is
    /// subscribed.
    ///
    /// Each primary's subscription is a blocking connection on a thread of its own: a
    /// primary serves thousands of slots, each a `SSUBSCRIBE` (a shard channel command
    /// takes channels of one slot only), and a plain connection sends them all at once and
    /// reads the confirmations back, where the async clients answer each in turn.
    pub(crate) async fn listen(
        &self,
        deliver: impl Fn(&str, &str),
        subscribed: impl FnOnce(),
    ) -> Result<(), NodeError> {
        self.refresh().await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Stop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _stop = Stop(stop.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Heard>();
        let shards = self.shards();
        for (shard, slots) in &shards {
            let url = self
                .url_of(&shard.address)
                .ok_or_else(|| NodeError::Other(format!("a node named {:?}", shard.address)))?;
            let channels: Vec<[String; 2]> = slots
                .iter()
                .map(|&slot| [self.keys.channel_at(slot), self.keys.events_at(slot)])
                .collect();
            let (tx, stop) = (tx.clone(), stop.clone());
            std::thread::Builder::new()
                .name("redlockd-shard-listen".into())
                .spawn(move || {
                    let ended = listen_on(&url, &channels, &tx, &stop);
                    let _ = tx.send(Heard::Ended(ended.err().map(|e| e.to_string())));
                })
                .map_err(|e| NodeError::Other(e.to_string()))?;
        }
        drop(tx);
        let released_head = self.keys.channel_at(0);
        let released_head = released_head
            .split_once('{')
            .map_or(released_head.as_str(), |(head, _)| head)
            .to_owned();
        let mut waiting = shards.len();
        let mut subscribed = Some(subscribed);
        if waiting == 0 {
            return Err(NodeError::Connection(
                "no primary serves the cluster's slots".into(),
            ));
        }
        while let Some(heard) = rx.recv().await {
            match heard {
                Heard::Subscribed => {
                    waiting -= 1;
                    if waiting == 0
                        && let Some(subscribed) = subscribed.take()
                    {
                        subscribed();
                    }
                }
                Heard::Message(channel, payload) => {
                    let freed = channel
                        .strip_prefix(&released_head)
                        .is_some_and(|rest| rest.starts_with('{'));
                    deliver(if freed { "released" } else { "events" }, &payload);
                }
                Heard::Ended(why) => {
                    return Err(NodeError::Connection(
                        why.unwrap_or_else(|| "a shard's subscription ended".into()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// What a probe of the whole cluster tells the engine.
#[derive(Debug, Default)]
pub(crate) struct ClusterProbe {
    /// A marker's value, when any shard carries its markers.
    pub identity: Option<String>,
    /// The largest of the shards' sampled counters, never falling.
    pub fence: u64,
    /// The least uptime of any shard.
    pub uptime: Option<Duration>,
}

/// Send one batch's call (after `ASKING` when following an ASK), its reply taken as
/// `batch::send_batch` takes it.
async fn query(
    conn: &mut ConnectionManager,
    call: &Cmd,
    asking: bool,
) -> redis::RedisResult<Value> {
    if !asking {
        return super::batch::send_batch(conn, call).await;
    }
    // One pipeline, so that no other command on the shared connection comes between.
    let pipe = redis::pipe()
        .cmd("ASKING")
        .add_command(call.clone())
        .clone();
    let mut replies = redis::aio::ConnectionLike::req_packed_commands(conn, &pipe, 0, 2).await?;
    match (replies.pop(), replies.pop()) {
        (_, Some(Value::ServerError(e))) | (Some(Value::ServerError(e)), _) => Err(e.into()),
        (Some(value), Some(_)) => Ok(value),
        _ => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "ASKING and a call were not answered twice",
        ))),
    }
}
