//! Master health: who answers, how fast, and who may vote.
//!
//! Liveness comes from live traffic and from a probe about once a second. The probe also
//! enforces the contract's promise 7, Redlock's "delayed restart" done by redlockd: every
//! master carries a marker key, and every script refuses to act on a master without it.
//!
//! - A master found without its marker (it restarted empty, or was flushed) is quarantined
//!   for the largest TTL, because any lease it had may still be live on the others; then
//!   its fencing counter is raised to what a majority holds and the marker is put back.
//! - A master whose fencing counter went *down* (restarted from an old snapshot: marker
//!   kept, recent locks lost) is caught by the high-water marks every replica records on
//!   the other masters; its marker is removed, so every replica quarantines it the same way.
//! - A master that restarted with all its data keeps its marker and its counter, and votes
//!   at once.
//! - A deployment is initialised only when it can be shown to be new: every configured
//!   master answers and none carries a marker or any trace of redlockd, or enough marked
//!   masters answer with a counter of 0 that no grant can ever have succeeded. A replica's
//!   first sight of an unmarked master is never enough.
//! - When a majority lost their data at once nothing can restore their counters safely:
//!   grants answer 503, `/readyz` says why, and the operator runs `redlockd recover`.

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::EngineConfig;
use super::quorum;
use crate::metrics::Metrics;
use crate::model::MasterStatus;
use crate::store::clock::Jump;
use crate::store::clock_floor;
use crate::store::node::{FenceSource, LockNode, LostShard, NodeError, NodeResult, Probe};

/// How often every master is probed when nothing else prompts it.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How often masters are probed while one is unverified (its connection broke).
const FAST_PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// The least time between the starts of two probe rounds, however often the monitor is
/// woken: a master that refuses a connection at once wakes it from its own probe, and
/// would otherwise be probed in a loop that never yields to the clock.
const MIN_PROBE_GAP: Duration = Duration::from_millis(10);

/// The high-water mark recorded for a marker that a master no longer carries (unmarked,
/// or replaced by a restore): no counter is ever at least this, so a master that comes back
/// with it (restarted from a snapshot taken before) is caught as gone back in time, however
/// high its counter then.
const RETIRED: u64 = u64::MAX;

/// How long reading a master's lock-delay claims (a scan of its claim keys) may take when
/// another master's quarantine is decided; past it, the quarantine is the longest allowed.
const DELAY_SCAN_BUDGET: Duration = Duration::from_secs(5);

/// How long one probe round may spend reading the other masters' holds for a quarantine
/// (`Monitor::read_holds`); the read resumes at the next round.
const HOLDS_READ_BUDGET: Duration = Duration::from_millis(200);

/// A hold as seen on a master (its key and what names its holder there), hashed to 128
/// bits: a read of a million held names keeps 16 bytes of each, and two holds that share a
/// hash (which would count as one carried further than it is) are as good as impossible.
fn hold_hash(key: &str, holder: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let half = |seed: u8| {
        let mut hasher = std::hash::DefaultHasher::new();
        seed.hash(&mut hasher);
        key.hash(&mut hasher);
        holder.hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// How long an unverified master waits before a probe may verify it: time for every
/// replica that knew its counter to have recorded that on the other masters.
const VERIFY_AFTER: Duration = Duration::from_millis(300);

#[derive(Debug, Default)]
struct NodeState {
    up: bool,
    latency: Option<Duration>,
    run_id: Option<String>,
    quarantine: Option<Quarantine>,
    /// The marker's value (the master's identity) when last seen, and the highest fencing
    /// counter this process saw under it: a counter below it went back in time.
    identity: Option<String>,
    highest_fence: u64,
    /// Since when the master is unverified: its connection broke or its run_id changed, so
    /// it may have restarted without (all) its data. It does not vote until a probe has
    /// compared its counter with everything known about it.
    unverified_since: Option<Instant>,
    /// Set while the master carries no marker and this process cannot yet tell a new
    /// deployment from one whose masters lost their data (a master has not answered yet):
    /// it waits for the deployment to be initialised, and does not vote meanwhile.
    awaiting_init: bool,
    /// The forward jump of its clock that got it quarantined, until it is restored: what
    /// `/readyz` says of it meanwhile.
    jumped: Option<Jump>,
    /// Why its steps are refused for the data layout it keeps (a later release's), as the
    /// last probe read it (a single master's; a cluster's steps say so in their errors).
    layout: Option<String>,
    /// Whether a probe has judged the master's present process (`catch_lossy_restarts`): it
    /// is the one its data was verified under, it keeps every write it acknowledged, or it
    /// was found to have lost data and is out. Until then its answers do not count, so that
    /// a replica meeting a master for the first time never counts a vote that a lost write
    /// could have made wrong. Cleared when its run id changes.
    run_checked: bool,
    /// The read of the other masters' holds that may shorten its quarantine, while it runs.
    holds_read: Option<HoldsRead>,
    /// The same for the shards of a cluster that lost their data, and which shards it is for.
    shard_read: Option<(Vec<LostShard>, HoldsRead)>,
}

impl NodeState {
    /// The one rule for a vote: the master answers, carries its marker as far as this
    /// process knows, is not quarantined, and keeps a data layout this release knows.
    fn votes(&self) -> bool {
        self.up
            && self.quarantine.is_none()
            && !self.unverified()
            && !self.awaiting_init
            && self.layout.is_none()
    }

    /// Whether its answers must not count yet: its connection broke or it restarted, and no
    /// probe has checked it since.
    fn unverified(&self) -> bool {
        self.unverified_since.is_some() || !self.run_checked
    }
}

/// What was known about the counters before a probe round read them.
struct Before {
    /// The highest high-water mark recorded on any master, per identity.
    marks: std::collections::HashMap<String, u64>,
    /// This process's identity and highest counter seen, per master.
    known: Vec<(Option<String>, u64)>,
}

#[derive(Debug, Clone, Copy)]
struct Quarantine {
    until: Instant,
    until_wall: SystemTime,
    /// Once the holds on the other masters have been read (`read_holds`): how many of them
    /// were found on too few of the others to need no wait. Until then the quarantine is
    /// the longest any hold may last.
    outstanding: Option<usize>,
}

/// A read of the holds on the masters that vote, for the quarantine of one that lost its
/// data (`Monitor::read_holds`): a SCAN of each, resumed probe after probe.
#[derive(Debug, Default)]
struct HoldsRead {
    /// The masters read (each voted when the read began) and the cursor each is at, `None`
    /// once its read is done.
    from: Vec<(usize, Option<u64>)>,
    /// Each hold seen (its key and holder, hashed): the masters it was seen on (a bit
    /// each: SCAN may answer a key twice) and when it ends at the latest, by ours.
    seen: std::collections::HashMap<u128, (u64, Instant)>,
    /// How many of `from` could not tell what they hold (`LockNode::held` answered `None`)
    /// and are left out.
    untold: usize,
}

/// Where a read of the holds stands after a probe round's part of it.
enum ReadStep {
    /// To be resumed at the next round.
    Pending(HoldsRead),
    /// Too few masters could be read: the quarantine keeps its bound, for now.
    Abandoned,
    /// Read: the holds found on too few of the others end by `until`.
    Done {
        until: Instant,
        outstanding: usize,
        seen: usize,
    },
}

pub struct Monitor {
    addresses: Vec<String>,
    /// The masters, for what their clocks' watches say (`store::clock`).
    nodes: Vec<Arc<dyn LockNode>>,
    states: Vec<Mutex<NodeState>>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    /// Whether this process has ever seen a marked master: then the deployment is not new,
    /// whatever the masters look like now.
    ever_marked: AtomicBool,
    /// Why the masters cannot form a voting majority, in words, when the probe knows.
    problem: Mutex<Option<String>>,
    /// Poked when a script reports a master without its marker, so the probe runs now
    /// rather than at the next tick.
    wake: Notify,
    /// This process's id in the masters' records of their clocks (`record_clocks`).
    replica_id: String,
}

/// A fresh random identity for a master's marker.
fn new_identity() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Monitor {
    pub(super) fn new(
        nodes: &[Arc<dyn LockNode>],
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            addresses: nodes.iter().map(|n| n.address().to_owned()).collect(),
            nodes: nodes.to_vec(),
            states: nodes.iter().map(|_| Mutex::default()).collect(),
            config,
            metrics,
            ever_marked: AtomicBool::new(false),
            problem: Mutex::new(None),
            wake: Notify::new(),
            replica_id: format!("{:016x}", rand::random::<u64>()),
        }
    }

    fn state(&self, i: usize) -> std::sync::MutexGuard<'_, NodeState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain data.
        self.states[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock().unwrap_or_else(|e| e.into_inner()) = problem;
    }

    /// Why a majority cannot vote, when it is more than "masters are down".
    pub fn problem(&self) -> Option<String> {
        self.problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record what one call to master `i` (a step or a probe) showed about its health, in
    /// `/readyz` and in the per-master metrics.
    pub(super) fn observe<T>(&self, i: usize, reply: &NodeResult<T>, took: Duration) {
        let address = &self.addresses[i];
        match reply {
            Ok(_) => self.metrics.master_answered(address, took),
            Err(e) => self.metrics.master_failed(address, e.kind()),
        }
        let up = !matches!(reply, Err(NodeError::Timeout | NodeError::Connection(_)));
        let broke = matches!(reply, Err(NodeError::Connection(_)));
        {
            let mut state = self.state(i);
            state.up = up;
            if up {
                state.latency = Some(took);
            }
            if broke && state.unverified_since.is_none() {
                state.unverified_since = Some(Instant::now());
            }
        }
        self.metrics.master_up(&self.addresses[i], up);
        if broke || matches!(reply, Err(NodeError::Amnesic | NodeError::Clock(_))) {
            self.wake.notify_one();
        }
    }

    /// Why master `i`'s answers are refused for its clock, if they are: it jumped and is
    /// not quarantined yet, or was first met too far off.
    fn clock_refusal(&self, i: usize) -> Option<String> {
        let clock = self.nodes[i].clock()?;
        clock.pending.map(|j| j.describe()).or(clock.settling)
    }

    /// Whether master `i` votes: its state, and its clock.
    fn votes(&self, i: usize) -> bool {
        self.state(i).votes() && self.clock_refusal(i).is_none()
    }

    /// Whether master `i`'s answers must not count yet (see `NodeState::unverified_since`).
    pub(super) fn unverified(&self, i: usize) -> bool {
        self.state(i).unverified()
    }

    /// Why an unverified master `i` does not vote, as the error a refusal names it by: a
    /// quarantined one lost its data (`amnesic`), or had its clock jump (`clock`); else it
    /// only awaits a probe's check (`unverified`). For naming only: the step itself sees
    /// `Unverified`, as the health record expects.
    pub(super) fn unverified_error(&self, i: usize) -> NodeError {
        let state = self.state(i);
        match (&state.quarantine, &state.jumped) {
            (Some(_), Some(jump)) => NodeError::Clock(jump.describe()),
            (Some(_), None) => NodeError::Amnesic,
            (None, _) => NodeError::Unverified,
        }
    }

    /// Master `i`'s counter was at least `fence` (it granted that token): a counter found
    /// below it later went back in time.
    pub(super) fn saw_fence(&self, i: usize, fence: u64) {
        let mut state = self.state(i);
        state.highest_fence = state.highest_fence.max(fence);
    }

    pub fn status(&self) -> Vec<MasterStatus> {
        (0..self.states.len())
            .map(|i| {
                let clock = self.nodes[i].clock().unwrap_or_default();
                let refused = self.clock_refusal(i);
                let state = self.state(i);
                let problem = match (refused, state.jumped) {
                    _ if state.layout.is_some() => state.layout.clone(),
                    (Some(refused), _) => Some(refused),
                    (None, Some(jump)) if state.quarantine.is_some() => Some(format!(
                        "{}: every lock on it may have expired early, so it is quarantined as a master that lost its data",
                        jump.describe()
                    )),
                    (None, None) => state.quarantine.map(|q| match q.outstanding {
                        None => "it lost its data (or may have: see the log): quarantined for the longest a hold may last, until the holds on the other masters are read".to_owned(),
                        Some(0) => "it lost its data: quarantined until it is restored; no hold on the other masters relied on it".to_owned(),
                        Some(holds) => format!(
                            "it lost its data: quarantined until the last of {holds} holds found on too few of the other masters (which may have relied on it) ends"
                        ),
                    }),
                    _ => None,
                };
                MasterStatus {
                    address: self.addresses[i].clone(),
                    up: state.up,
                    latency: state.latency,
                    voting: state.votes() && problem.is_none(),
                    quarantined_until: state.quarantine.map(|q| q.until_wall),
                    cluster: None,
                    subscribed: None,
                    problem,
                    clock_offset_s: clock.offset_s,
                    clock_jumps: [clock.forward_jumps, clock.backward_jumps],
                }
            })
            .collect()
    }

    /// Whether a majority of masters answer and vote: grants can succeed.
    pub fn ready(&self) -> bool {
        let voting = (0..self.states.len()).filter(|&i| self.votes(i)).count();
        voting >= quorum::majority(self.states.len())
    }

    /// Probe every master once and act on what is found: initialise a new deployment,
    /// quarantine a master that lost its data or went back in time, restore one whose
    /// quarantine is over.
    pub async fn probe_round(&self, nodes: &[Arc<dyn LockNode>]) {
        let before = self.before(nodes).await;
        let limit = self.config.master_timeout;
        let mut probes: Vec<NodeResult<Probe>> =
            futures::future::join_all(nodes.iter().map(|node| async move {
                let started = Instant::now();
                let limit = node.rules().upkeep_budget.unwrap_or(limit);
                let reply = tokio::time::timeout(limit, node.probe())
                    .await
                    .unwrap_or(Err(NodeError::Timeout));
                (reply, started.elapsed())
            }))
            .await
            .into_iter()
            .enumerate()
            .map(|(i, (reply, took))| {
                self.observe(i, &reply, took);
                reply
            })
            .collect();
        for (i, probe) in probes.iter().enumerate() {
            if let Ok(probe) = probe {
                self.note_run_id(i, &probe.run_id);
                self.state(i).layout = probe
                    .unknown_layout
                    .as_ref()
                    .map(|layout| crate::store::layout::unknown(layout));
            }
        }
        self.catch_lossy_restarts(nodes, &mut probes).await;
        self.catch_clock_jumps(nodes, &mut probes).await;
        self.catch_rollbacks(nodes, &mut probes, &before).await;
        self.record_watermarks(nodes, &probes).await;
        self.record_clocks(nodes, &probes).await;
        self.read_lost_shards(nodes).await;

        let n = nodes.len();
        let q = quorum::majority(n);
        let marked = |p: &NodeResult<Probe>| matches!(p, Ok(p) if p.marked());
        if probes.iter().any(marked) {
            self.ever_marked.store(true, Ordering::Release);
        }
        let unmarked: Vec<usize> = (0..n)
            .filter(|&i| matches!(&probes[i], Ok(p) if !p.marked()))
            .collect();
        if let Some(why) = self.provably_new(&probes) {
            for &i in &unmarked {
                self.restore(i, nodes, 0, why).await;
            }
        } else if !self.ever_marked.load(Ordering::Acquire) {
            // Not "lost its data": nothing shows it had any. Quarantine starts, if it must,
            // when a marked master answers; until then these masters cannot vote anyway.
            for &i in &unmarked {
                let mut state = self.state(i);
                if !state.awaiting_init {
                    state.awaiting_init = true;
                    tracing::warn!(
                        master = %self.addresses[i],
                        "waiting for every master to answer before initialising a new deployment"
                    );
                }
            }
        } else {
            for &i in &unmarked {
                self.state(i).awaiting_init = false;
                self.quarantine_or_restore(i, nodes, &probes).await;
            }
        }
        for (i, probe) in probes.iter().enumerate() {
            if marked(probe) {
                // Initialised, by this replica or another.
                self.state(i).awaiting_init = false;
            }
            if marked(probe) && self.state(i).quarantine.take().is_some() {
                self.state(i).holds_read = None;
                // Restored by another redlockd replica, whose quarantine ran out first.
                tracing::info!(master = %self.addresses[i], "master votes again");
            }
        }
        for (i, probe) in probes.iter().enumerate() {
            let mut state = self.state(i);
            let Some(since) = state.unverified_since else {
                continue;
            };
            if marked(probe) && since.elapsed() >= VERIFY_AFTER {
                state.unverified_since = None;
                tracing::info!(master = %self.addresses[i], "master verified: it kept its data; it votes");
            }
        }
        let lost = (0..n)
            .filter(|&i| self.state(i).quarantine.is_some())
            .count();
        let silent = probes.iter().filter(|p| p.is_err()).count();
        let problem = if self.ready() {
            None
        } else if !self.ever_marked.load(Ordering::Acquire) {
            Some(format!(
                "no master carries redlockd's marker yet: a new deployment is initialised once every configured \
                 master has answered ({silent} of {n} do not), since until then it cannot be told from one whose \
                 masters lost their data"
            ))
        } else if lost <= n - q {
            None
        } else {
            Some(format!(
                "{lost} of {n} masters lost their data (or went back to an old snapshot) and are quarantined; \
                 fewer than a majority can vote, so grants answer 503. Each votes again when its quarantine is over \
                 and {} masters that kept their data can restore its fencing counter; if too few kept their data, \
                 an operator must run `redlockd recover` (see docs/guarantees.md, \"Masters that lose their data\")",
                n - q + 1
            ))
        };
        self.set_problem(problem);
    }

    /// Whether the masters show that no grant can ever have succeeded on them, and why.
    fn provably_new(&self, probes: &[NodeResult<Probe>]) -> Option<&'static str> {
        let n = probes.len();
        let untouched = |p: &NodeResult<Probe>| matches!(p, Ok(p) if !p.marked() && p.fence == 0 && p.watermarks.is_empty());
        if !self.ever_marked.load(Ordering::Acquire) && probes.iter().all(untouched) {
            return Some(
                "new deployment: every master answered and none was ever used; master initialised",
            );
        }
        // A grant takes a majority of marked masters and raises each one's counter; enough
        // marked masters still at 0 to meet every majority prove that none ever succeeded.
        let never_granted = probes
            .iter()
            .filter(|p| matches!(p, Ok(p) if p.marked() && p.fence == 0))
            .count();
        (never_granted > n - quorum::majority(n))
            .then_some("no grant has ever succeeded on these masters; master initialised")
    }

    /// Masters that restarted since their data was last verified (the run id recorded beside
    /// the marker is not the process's now), unless they keep every write they acknowledged
    /// (`LockNode::durable`: `appendonly yes` with `appendfsync always`). With `appendfsync
    /// everysec`, or from a snapshot, a crash loses the last writes: a grant or a renew among
    /// them, while the marker and the counter, written long before, are kept. Neither the
    /// marker nor the high-water marks can see that, so each such master is taken to have
    /// lost its data: its marker is removed and it sits out a quarantine like one restarted
    /// empty. A durable one has its run recorded, and its counter is checked as before.
    ///
    /// A marker with no run record was written by a release before this one: the master is
    /// judged by its uptime instead. One that started before the longest hold could have
    /// been granted has lost nothing still held.
    async fn catch_lossy_restarts(
        &self,
        nodes: &[Arc<dyn LockNode>],
        probes: &mut [NodeResult<Probe>],
    ) {
        for (i, node) in nodes.iter().enumerate() {
            let Ok(probe) = &mut probes[i] else { continue };
            if self.state(i).run_checked {
                continue;
            }
            let Some(identity) = probe.marker.clone() else {
                // Nothing to judge: its scripts refuse, and its restore records its run.
                self.state(i).run_checked = true;
                continue;
            };
            // A cluster judges each shard's restart by its slots' markers (store::cluster).
            if node.rules().judges_own_rollbacks()
                || probe.run_record.as_deref() == Some(probe.run_id.as_str())
            {
                self.state(i).run_checked = true;
                continue;
            }
            let durable = match self.bounded(&**node, node.durable()).await {
                Ok(durable) => durable,
                Err(e) => {
                    tracing::warn!(master = %self.addresses[i], error = %e, "could not read the persistence of a master that restarted; it does not vote until a probe can");
                    continue;
                }
            };
            let lost =
                !durable && (probe.run_record.is_some() || probe.uptime < self.config.max_ttl);
            if !lost {
                match self
                    .bounded(&**node, node.record_run(&identity, &probe.run_id))
                    .await
                {
                    Ok(()) => {
                        self.state(i).run_checked = true;
                        probe.run_record = Some(probe.run_id.clone());
                    }
                    Err(e) => {
                        tracing::warn!(master = %self.addresses[i], error = %e, "could not record the run of a master that kept its data; it does not vote until a probe can")
                    }
                }
                continue;
            }
            tracing::error!(
                master = %self.addresses[i],
                uptime_s = probe.uptime.as_secs(),
                "master restarted without appendonly yes and appendfsync always: the writes it acknowledged last (a grant, a renew) may be lost while its marker was kept; it is quarantined as a master that lost its data"
            );
            if let Err(e) = self.bounded(&**node, node.unmark(&identity)).await {
                tracing::warn!(master = %self.addresses[i], error = %e, "could not remove the marker of a master that restarted without its last writes; its answers stay refused");
                continue;
            }
            self.retire(i, nodes, &identity).await;
            self.lost_again(i);
            self.state(i).run_checked = true;
            probe.marker = None;
        }
    }

    /// Masters whose clock was seen to jump forward (by a step's answer or this round's
    /// probe): every lock on them may have expired early, so each is quarantined as one
    /// that lost its data. Its marker is removed (every replica then does the same, and
    /// this one after a restart), and until that is done its answers stay refused.
    ///
    /// A jump seen on a majority of the masters at once is this replica's own: its
    /// monotonic clock stood still while the masters' ran (the host or VM was suspended),
    /// and quarantining every master for it would stop the whole deployment. Those readings
    /// are set aside and nothing is removed. (A real jump on a majority of masters at once
    /// is beyond what Redlock can survive either way: docs/guarantees.md, "What is not promised".)
    async fn catch_clock_jumps(
        &self,
        nodes: &[Arc<dyn LockNode>],
        probes: &mut [NodeResult<Probe>],
    ) {
        let jumped = nodes
            .iter()
            .filter(|n| n.clock().is_some_and(|c| c.pending.is_some()))
            .count();
        if jumped >= quorum::majority(nodes.len()) && nodes.len() > 1 {
            tracing::warn!(
                jumped,
                "the clocks of a majority of masters moved ahead of this replica's at once: this replica's own clock stood still (suspended?); nothing is quarantined"
            );
            for node in nodes {
                node.settle_clock();
            }
            return;
        }
        for (i, node) in nodes.iter().enumerate() {
            let Some(jump) = node.clock().and_then(|c| c.pending) else {
                continue;
            };
            let Ok(probe) = &mut probes[i] else { continue };
            if let Some(identity) = probe.marker.clone() {
                tracing::error!(
                    master = %self.addresses[i],
                    jump_s = jump.by_us as f64 / 1e6,
                    "master's clock jumped forward: every lock on it may have expired early; it is quarantined as a master that lost its data"
                );
                if let Err(e) = self.bounded(&**node, node.unmark(&identity)).await {
                    tracing::warn!(master = %self.addresses[i], error = %e, "could not remove the marker of a master whose clock jumped; its answers stay refused");
                    continue;
                }
                probe.marker = None;
                if !node.rules().judges_own_rollbacks() {
                    self.retire(i, nodes, &identity).await;
                }
            }
            self.lost_again(i);
            self.state(i).jumped = Some(jump);
            node.settle_clock();
        }
    }

    /// Find masters whose fencing counter is below what was seen on them before (by this
    /// process, or recorded on the other masters by any replica): they went back in time.
    /// Their marker is removed, and they are treated as unmarked from here on.
    async fn catch_rollbacks(
        &self,
        nodes: &[Arc<dyn LockNode>],
        probes: &mut [NodeResult<Probe>],
        before: &Before,
    ) {
        for j in 0..probes.len() {
            // A cluster judges each shard's rollback itself (store::cluster): its reported
            // counter is one slot's, not a bound on its tokens.
            if nodes[j].rules().judges_own_rollbacks() {
                continue;
            }
            let Ok(probe) = &probes[j] else { continue };
            let Some(identity) = probe.marker.clone() else {
                continue;
            };
            let recorded = before.marks.get(&identity).copied().unwrap_or(0);
            let known = match &before.known[j] {
                (Some(id), fence) if *id == identity => *fence,
                _ => 0,
            };
            let highest = recorded.max(known);
            {
                let mut state = self.state(j);
                if state.identity.as_deref() != Some(identity.as_str()) {
                    state.identity = Some(identity.clone());
                    state.highest_fence = probe.fence;
                } else {
                    state.highest_fence = state.highest_fence.max(probe.fence);
                }
            }
            if probe.fence >= highest {
                continue;
            }
            tracing::error!(
                master = %self.addresses[j],
                fence = probe.fence,
                seen_before = highest,
                "master went back in time (its fencing counter fell): it restarted from an old snapshot and may have lost locks; it stops voting"
            );
            if let Err(e) = self.bounded(&*nodes[j], nodes[j].unmark(&identity)).await {
                tracing::warn!(master = %self.addresses[j], error = %e, "could not remove the marker of a master that went back in time");
            }
            self.retire(j, nodes, &identity).await;
            self.lost_again(j);
            if let Ok(probe) = &mut probes[j] {
                probe.marker = None;
            }
        }
    }

    /// Master `i` lost locks just now (its clock jumped, it went back in time, it
    /// restarted): any quarantine this replica still keeps for it is for an earlier loss,
    /// and must not be spent on this one. That quarantine may have run out while another
    /// replica restored the master unseen by this one (its probes of it did not answer),
    /// and the master granted since; restoring it at once would let it vote for a second
    /// holder of what it just lost. The next step quarantines it anew, from now.
    fn lost_again(&self, i: usize) {
        let mut state = self.state(i);
        state.quarantine = None;
        state.holds_read = None;
    }

    /// What is known about every master's counter before this round reads it: the
    /// high-water marks recorded on the masters, and this process's own knowledge. Read
    /// first, so that nothing in it can be newer than the counters it is compared with.
    async fn before(&self, nodes: &[Arc<dyn LockNode>]) -> Before {
        let known = (0..nodes.len())
            .map(|i| {
                let state = self.state(i);
                (state.identity.clone(), state.highest_fence)
            })
            .collect();
        // A cluster records no high-water marks (see `catch_rollbacks`): not probed twice.
        let probes = futures::future::join_all(
            nodes
                .iter()
                .filter(|n| !n.rules().judges_own_rollbacks())
                .map(|n| self.bounded(&**n, n.probe())),
        )
        .await;
        let mut marks = std::collections::HashMap::new();
        for (identity, fence) in probes.iter().flatten().flat_map(|p| &p.watermarks) {
            let mark = marks.entry(identity.clone()).or_insert(0);
            *mark = (*mark).max(*fence);
        }
        Before { marks, known }
    }

    /// Tell every marked master the counters seen on the others this round.
    async fn record_watermarks(&self, nodes: &[Arc<dyn LockNode>], probes: &[NodeResult<Probe>]) {
        let seen: Vec<(usize, String, u64)> = probes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref().ok()?;
                if nodes[i].rules().judges_own_rollbacks() {
                    return None;
                }
                let identity = p.marker.clone()?;
                // What this replica knows beyond the probe: tokens the master granted.
                let state = self.state(i);
                let known = if state.identity.as_deref() == Some(identity.as_str()) {
                    state.highest_fence
                } else {
                    0
                };
                Some((i, identity, p.fence.max(known)))
            })
            .collect();
        futures::future::join_all(seen.iter().map(|(i, _, _)| {
            let others: Vec<(String, u64)> = seen
                .iter()
                .filter(|(j, _, _)| j != i)
                .map(|(_, id, fence)| (id.clone(), *fence))
                .collect();
            let node = nodes[*i].clone();
            async move { self.bounded(&*node, node.record_watermarks(&others)).await }
        }))
        .await;
    }

    /// Record on every master but `i` that master `i`'s marker `identity` is retired (see
    /// `RETIRED`). Best effort, bounded: a master that does not answer misses it, and the
    /// others still carry it.
    async fn retire(&self, i: usize, nodes: &[Arc<dyn LockNode>], identity: &str) {
        let retired = [(identity.to_owned(), RETIRED)];
        futures::future::join_all(nodes.iter().enumerate().filter(|(j, _)| *j != i).map(
            |(_, node)| {
                let retired = &retired;
                async move {
                    let _ = self.bounded(&**node, node.record_watermarks(retired)).await;
                }
            },
        ))
        .await;
    }

    /// Tell every marked master how far its clock stands from this replica's, where this
    /// replica has watched it (no jump pending, not settling): what a replica meeting the
    /// master for the first time compares its own reading with (`ClockWatch::observe_vouched`).
    async fn record_clocks(&self, nodes: &[Arc<dyn LockNode>], probes: &[NodeResult<Probe>]) {
        futures::future::join_all(nodes.iter().zip(probes).filter_map(|(node, probe)| {
            let marked = probe.as_ref().is_ok_and(Probe::marked);
            let clock = node.clock()?;
            if !marked || clock.pending.is_some() || clock.settling.is_some() {
                return None;
            }
            let offset_us = (clock.offset_s? * 1e6).round() as i64;
            Some(async move {
                let _ = self
                    .bounded(&**node, node.record_clock(&self.replica_id, offset_us))
                    .await;
            })
        }))
        .await;
    }

    /// `step` on `node`, given the master timeout (or the node's upkeep budget: a
    /// cluster's upkeep is a call per slot of a shard).
    async fn bounded<T>(
        &self,
        node: &dyn LockNode,
        step: impl Future<Output = NodeResult<T>>,
    ) -> NodeResult<T> {
        let limit = node
            .rules()
            .upkeep_budget
            .unwrap_or(self.config.master_timeout);
        tokio::time::timeout(limit, step)
            .await
            .unwrap_or(Err(NodeError::Timeout))
    }

    fn note_run_id(&self, i: usize, run_id: &str) {
        let mut state = self.state(i);
        if state.run_id.as_deref().is_some_and(|old| old != run_id) {
            tracing::warn!(master = %self.addresses[i], "master restarted (its run_id changed)");
            state.unverified_since.get_or_insert_with(Instant::now);
            state.run_checked = false;
            // What it held before may be gone: see `lost_again`.
            state.quarantine = None;
        }
        state.run_id = Some(run_id.to_owned());
    }

    async fn quarantine_or_restore(
        &self,
        i: usize,
        nodes: &[Arc<dyn LockNode>],
        probes: &[NodeResult<Probe>],
    ) {
        if self.state(i).quarantine.is_none() {
            let length = self.quarantine_for(i, nodes, probes).await;
            let now = Instant::now();
            self.state(i).quarantine.get_or_insert_with(|| {
                tracing::warn!(
                    master = %self.addresses[i],
                    quarantine_ms = length.as_millis() as u64,
                    "master has lost its data; it will not vote until every lease it may have held, and its lock-delay, has ended"
                );
                Quarantine {
                    until: now + length,
                    until_wall: SystemTime::now() + length,
                    outstanding: None,
                }
            });
            self.state(i).holds_read = None;
        }
        if self
            .state(i)
            .quarantine
            .is_some_and(|q| q.outstanding.is_none())
        {
            self.read_holds(i, nodes).await;
        }
        let now = Instant::now();
        let Some(quarantine) = self.state(i).quarantine else {
            return;
        };
        if now < quarantine.until && !self.config.unsafe_skip_quarantine {
            return;
        }
        // Every token ever granted is on a majority; with this master's copy gone, reading
        // n - majority + 1 of the others is sure to include one that has it.
        let n = nodes.len();
        let needed = n - quorum::majority(n) + 1;
        let fences: Vec<u64> = probes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, p)| p.as_ref().ok().filter(|p| p.marked()).map(|p| p.fence))
            .collect();
        if fences.len() < needed {
            tracing::warn!(
                master = %self.addresses[i],
                "quarantine over, but fewer than {needed} masters with their data answer to restore its fencing counter"
            );
            return;
        }
        let mut fence = fences.into_iter().max().unwrap_or(0);
        if nodes.iter().any(|n| n.rules().fences == FenceSource::Clock) {
            // A cluster reports one sampled slot's counter, not its largest: with clusters
            // among the masters the restored counter starts from the wall clock, as theirs.
            fence = fence.max(clock_floor());
        }
        self.restore(i, nodes, fence, "quarantine over; master votes again")
            .await;
    }

    /// Shorten the quarantine of master `i` to the holds that need it. Every hold a majority
    /// granted is on at least `majority - 1` masters besides `i`. One found on at least
    /// `n - majority + 1` of the others needs no wait: without `i`'s copy, too few masters
    /// lack it for anyone else to win a majority, with `i` voting. One found on fewer may
    /// have relied on `i`; it cannot be renewed meanwhile (a renew needs a majority of its
    /// carriers, and `i` refuses), so its time only runs down, and `i` waits for the longest
    /// of them, by the others' clocks plus the drift allowance. Holds granted from now on
    /// are on a majority without `i`, so they need no wait either.
    ///
    /// When the read is done the quarantine ends at the earlier of its bound and that
    /// wait: a read only ever shortens it, once per quarantine (`advance_read` says how the
    /// masters are read).
    async fn read_holds(&self, i: usize, nodes: &[Arc<dyn LockNode>]) {
        let read = self.state(i).holds_read.take();
        let (until, outstanding, seen) = match self.advance_read(i, nodes, read).await {
            ReadStep::Pending(read) => {
                self.state(i).holds_read = Some(read);
                return;
            }
            ReadStep::Abandoned => return,
            ReadStep::Done {
                until,
                outstanding,
                seen,
            } => (until, outstanding, seen),
        };
        let now = Instant::now();
        let mut state = self.state(i);
        let Some(quarantine) = &mut state.quarantine else {
            return;
        };
        if until < quarantine.until {
            quarantine.until = until;
            quarantine.until_wall = SystemTime::now() + (until - now);
        }
        quarantine.outstanding = Some(outstanding);
        tracing::info!(
            master = %self.addresses[i],
            holds_read = seen,
            outstanding,
            quarantine_left_ms = quarantine.until.saturating_duration_since(now).as_millis() as u64,
            "the holds on the other masters are read: the quarantine lasts until the last one that may have relied on this master ends"
        );
    }

    /// The same rule for the shards of master `j`, a Redis Cluster, that lost their data:
    /// every hold that relied on the cluster for a name in their slots is on at least
    /// `majority - 1` of the other masters. Their holds are read whole, not by slot (a
    /// single master's keys carry no hash tag to tell a slot by): a hold of another slot
    /// found on too few of them only makes the shards wait longer. One read serves every
    /// shard that was already out when it began; one lost later waits for the next.
    async fn read_lost_shards(&self, nodes: &[Arc<dyn LockNode>]) {
        for j in 0..nodes.len() {
            let lost = nodes[j].lost_shards();
            let taken = self.state(j).shard_read.take();
            let (shards, read) = match taken {
                Some((shards, read)) if shards.iter().all(|s| lost.contains(s)) => {
                    (shards, Some(read))
                }
                // A shard it was for is restored, or lost again: it starts afresh.
                _ if lost.is_empty() => continue,
                _ => (lost, None),
            };
            match self.advance_read(j, nodes, read).await {
                ReadStep::Pending(read) => self.state(j).shard_read = Some((shards, read)),
                ReadStep::Abandoned => {}
                ReadStep::Done {
                    until,
                    outstanding,
                    seen,
                } => {
                    let left = until.saturating_duration_since(Instant::now());
                    for shard in &shards {
                        nodes[j].shorten_shard(shard, left, outstanding);
                    }
                    tracing::info!(
                        master = %self.addresses[j],
                        shards = ?shards.iter().map(|s| &s.address).collect::<Vec<_>>(),
                        holds_read = seen,
                        outstanding,
                        "the holds on the other masters are read: the cluster's lost shards stay out until the last one that may have relied on them ends"
                    );
                }
            }
        }
    }

    /// Go on with a read of the holds on the masters other than `out` that vote, for a
    /// loss of data on `out`: at least `n - majority + 1` of them are read whole, by a SCAN
    /// of every key (so that keys of an earlier release, and of every script added later,
    /// are seen), `HOLDS_READ_BUDGET` of it per probe round, resumed at the next. A read
    /// whose masters stop voting starts again; one that cannot tell (a cluster whose slot
    /// map changed, or one of whose shards is out) is left out, and the read abandoned when
    /// too few are left. What a master showed before it was left out still counts as
    /// carried by it: it was there when read.
    async fn advance_read(
        &self,
        out: usize,
        nodes: &[Arc<dyn LockNode>],
        read: Option<HoldsRead>,
    ) -> ReadStep {
        let n = nodes.len();
        let needed = n - quorum::majority(n) + 1;
        let voting: Vec<usize> = (0..n).filter(|&j| j != out && self.votes(j)).collect();
        let mut read = read.unwrap_or_default();
        if read.from.is_empty() || read.from.iter().any(|(j, _)| !voting.contains(j)) {
            if voting.len() < needed {
                // Too few to read: today's bound stands, and the next probe tries again.
                return ReadStep::Abandoned;
            }
            read = HoldsRead {
                from: voting.iter().map(|&j| (j, Some(0))).collect(),
                ..HoldsRead::default()
            };
        }
        let budget = Instant::now() + HOLDS_READ_BUDGET;
        loop {
            let pending: Vec<(usize, usize, u64)> = read
                .from
                .iter()
                .enumerate()
                .filter_map(|(k, (j, cursor))| Some((k, *j, (*cursor)?)))
                .collect();
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= budget {
                return ReadStep::Pending(read);
            }
            let pages = futures::future::join_all(
                pending
                    .iter()
                    .map(|&(_, j, cursor)| self.bounded(&*nodes[j], nodes[j].held(cursor))),
            )
            .await;
            let now = Instant::now();
            for (&(k, j, _), page) in pending.iter().zip(pages) {
                match page {
                    Ok(Some(page)) => {
                        for (key, holder, pttl) in &page.holds {
                            let pttl = Duration::from_millis(*pttl);
                            let ends = now + pttl + quorum::drift(pttl, self.config.drift_factor);
                            let seen = read.seen.entry(hold_hash(key, holder)).or_insert((0, ends));
                            seen.0 |= 1 << (j % 64);
                            seen.1 = seen.1.max(ends);
                        }
                        read.from[k].1 = (page.next != 0).then_some(page.next);
                    }
                    Ok(None) => {
                        read.from[k].1 = None;
                        read.untold += 1;
                        if read.from.len() - read.untold < needed {
                            return ReadStep::Abandoned;
                        }
                    }
                    // Tried again within the budget, or at the next probe.
                    Err(_) => {}
                }
            }
        }
        let now = Instant::now();
        let short: Vec<Instant> = read
            .seen
            .values()
            .filter(|(on, _)| (on.count_ones() as usize) < needed)
            .map(|(_, ends)| *ends)
            .collect();
        ReadStep::Done {
            until: short.iter().copied().max().unwrap_or(now).max(now),
            outstanding: short.len(),
            seen: read.seen.len(),
        }
    }

    /// How long master `i`, found without its data, must sit out: the largest TTL (a lease
    /// it held may be live on the others until then), or longer while a lock-delay that may
    /// have been on it still runs. Every lease, and every renew, that relied on it reached a
    /// majority, so reading the lock-delay claims of `n - majority + 1` others finds each
    /// one it carried; with fewer answering (or a cluster among them, whose claims are spread
    /// over shards) it is the largest TTL plus the largest lock-delay allowed.
    async fn quarantine_for(
        &self,
        i: usize,
        nodes: &[Arc<dyn LockNode>],
        probes: &[NodeResult<Probe>],
    ) -> Duration {
        let full = self.config.quarantine();
        if self.config.max_lock_delay.is_zero() {
            return full;
        }
        let n = nodes.len();
        let needed = n - quorum::majority(n) + 1;
        let others: Vec<usize> = (0..n)
            .filter(|&j| j != i && matches!(&probes[j], Ok(p) if p.marked()))
            .collect();
        if others.len() < needed {
            return full;
        }
        let reads = futures::future::join_all(
            others
                .iter()
                .map(|&j| tokio::time::timeout(DELAY_SCAN_BUDGET, nodes[j].longest_delay())),
        )
        .await;
        let longest: Vec<Duration> = reads
            .into_iter()
            .filter_map(|read| read.ok()?.ok()?)
            .collect();
        if longest.len() < needed {
            return full;
        }
        let longest = longest.into_iter().max().unwrap_or_default();
        // A claim's remaining time is this master's clock's; allow for drift against ours.
        let longest = longest + quorum::drift(longest, self.config.drift_factor);
        self.config.max_ttl.max(longest).min(full)
    }

    async fn restore(&self, i: usize, nodes: &[Arc<dyn LockNode>], fence: u64, why: &str) {
        // The marker it had before it lost its data is never to be seen on it again.
        let before = self.state(i).identity.clone();
        if let Some(before) = before
            && !nodes[i].rules().judges_own_rollbacks()
        {
            self.retire(i, nodes, &before).await;
        }
        let identity = new_identity();
        // The process this round's probe saw: if the master restarted since, the record
        // names another run, and the restart is judged at the next probe.
        let run_id = self.state(i).run_id.clone();
        match self
            .bounded(
                &*nodes[i],
                nodes[i].restore(fence, &identity, run_id.as_deref()),
            )
            .await
        {
            Ok(()) => {
                {
                    let mut state = self.state(i);
                    state.quarantine = None;
                    state.holds_read = None;
                    state.awaiting_init = false;
                    state.jumped = None;
                    // Its counter was just set from the others: nothing left to verify.
                    state.unverified_since = None;
                    state.run_checked = true;
                    state.identity = Some(identity);
                    state.highest_fence = fence;
                }
                self.ever_marked.store(true, Ordering::Release);
                tracing::info!(master = %self.addresses[i], fence, "{why}");
            }
            Err(e) => {
                tracing::warn!(master = %self.addresses[i], error = %e, "could not restore master")
            }
        }
    }

    /// The operator's recovery after a majority of masters lost their data at once (see
    /// docs/guarantees.md, "Masters that lose their data"): every master must answer, every master that
    /// lost its data must have been up for the largest TTL (so that every lease it may
    /// have held has expired everywhere) unless `force` says the operator knows better, and
    /// then every master's fencing counter is raised to a floor above any token that can
    /// have been granted: the largest counter or high-water mark any master still has, the
    /// wall clock in microseconds (in case every trace was lost), or `floor` if larger.
    /// Returns what was done, a line per master.
    pub async fn recover(
        &self,
        nodes: &[Arc<dyn LockNode>],
        floor: Option<u64>,
        force: bool,
    ) -> Result<Vec<String>, String> {
        let probes =
            futures::future::join_all(nodes.iter().map(|n| self.bounded(&**n, n.probe()))).await;
        let silent: Vec<&str> = probes
            .iter()
            .zip(&self.addresses)
            .filter(|(p, _)| p.is_err())
            .map(|(_, a)| a.as_str())
            .collect();
        if !silent.is_empty() {
            return Err(format!(
                "every master must answer to recover; these do not: {}",
                silent.join(", ")
            ));
        }
        let probes: Vec<Probe> = probes.into_iter().flatten().collect();
        if !force {
            for (probe, address) in probes.iter().zip(&self.addresses) {
                let quarantine = self.config.quarantine();
                if !probe.marked() && probe.uptime < quarantine {
                    return Err(format!(
                        "{address} restarted {} s ago: a lease it held (or its lock-delay) may be live elsewhere until REDLOCKD_MAX_TTL_MS plus REDLOCKD_MAX_LOCK_DELAY_MS ({} s) after its restart; wait {} s more, or pass --force if no lease can be live",
                        probe.uptime.as_secs(),
                        quarantine.as_secs(),
                        (quarantine - probe.uptime).as_secs() + 1
                    ));
                }
            }
        }
        let seen = probes
            .iter()
            .flat_map(|p| std::iter::once(p.fence).chain(p.watermarks.iter().map(|(_, f)| *f)))
            .filter(|f| *f != RETIRED)
            .max()
            .unwrap_or(0);
        let fence = seen.max(clock_floor()).max(floor.unwrap_or(0)) + 1;
        let mut report = Vec::new();
        for (i, probe) in probes.iter().enumerate() {
            let identity = new_identity();
            self.bounded(
                &*nodes[i],
                nodes[i].restore(fence, &identity, Some(&probe.run_id)),
            )
            .await
            .map_err(|e| format!("{}: could not restore: {e}", self.addresses[i]))?;
            report.push(format!(
                "{}: {}, fencing counter {} -> {fence}",
                self.addresses[i],
                if probe.marked() {
                    "kept its data"
                } else {
                    "had lost its data"
                },
                probe.fence
            ));
        }
        Ok(report)
    }

    /// Probe every master about once a second (and at once when a script reports a master
    /// without its marker, at most every `MIN_PROBE_GAP`) until `shutdown` fires.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        nodes: Vec<Arc<dyn LockNode>>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let monitor = self.clone();
        tokio::spawn(async move {
            loop {
                let began = tokio::time::Instant::now();
                monitor.probe_round(&nodes).await;
                let unverified = (0..nodes.len()).any(|i| monitor.unverified(i));
                let interval = if unverified {
                    FAST_PROBE_INTERVAL
                } else {
                    PROBE_INTERVAL
                };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                    _ = monitor.wake.notified() => {
                        tokio::time::sleep_until(began + MIN_PROBE_GAP).await;
                    }
                }
            }
        })
    }
}
