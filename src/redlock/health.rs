//! Master health: who answers, how fast, and who may vote.
//!
//! Liveness comes from live traffic and from a probe about once a second. The probe also
//! enforces the contract's promise 7, Redlock's "delayed restart" done by redlockd: every
//! master carries a marker key, and every script refuses to act on a master without it.
//! A master found without its marker (it restarted empty, or was flushed) is quarantined
//! for the largest TTL, because any lease it had may still be live on the others; then
//! its fencing counter is raised to what a majority holds and the marker is put back.
//! A master that restarted with its data still has the marker and votes at once.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::EngineConfig;
use super::node::{LockNode, NodeError, NodeResult, Probe};
use super::quorum;
use crate::metrics::Metrics;

/// How often every master is probed when nothing else prompts it.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// A master as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MasterStatus {
    pub address: String,
    pub up: bool,
    pub latency: Option<Duration>,
    /// Set while the master is quarantined: when it will vote again at the earliest.
    pub quarantined_until: Option<SystemTime>,
}

#[derive(Debug, Default)]
struct NodeState {
    up: bool,
    latency: Option<Duration>,
    run_id: Option<String>,
    quarantine: Option<Quarantine>,
}

#[derive(Debug, Clone, Copy)]
struct Quarantine {
    until: Instant,
    until_wall: SystemTime,
}

pub struct Monitor {
    addresses: Vec<String>,
    states: Vec<Mutex<NodeState>>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    /// Whether this process has ever seen a marked master. Until it has, a set of masters
    /// none of which is marked is a fresh deployment, not one that lost its data.
    ever_marked: AtomicBool,
    /// Poked when a script reports a master without its marker, so the probe runs now
    /// rather than at the next tick.
    wake: Notify,
}

impl Monitor {
    pub(super) fn new(
        nodes: &[Arc<dyn LockNode>],
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            addresses: nodes.iter().map(|n| n.address().to_owned()).collect(),
            states: nodes.iter().map(|_| Mutex::default()).collect(),
            config,
            metrics,
            ever_marked: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    fn state(&self, i: usize) -> std::sync::MutexGuard<'_, NodeState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain data.
        self.states[i].lock().unwrap_or_else(|e| e.into_inner())
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
        {
            let mut state = self.state(i);
            state.up = up;
            if up {
                state.latency = Some(took);
            }
        }
        self.metrics.master_up(&self.addresses[i], up);
        if matches!(reply, Err(NodeError::Amnesic)) {
            self.wake.notify_one();
        }
    }

    pub fn status(&self) -> Vec<MasterStatus> {
        (0..self.states.len())
            .map(|i| {
                let state = self.state(i);
                MasterStatus {
                    address: self.addresses[i].clone(),
                    up: state.up,
                    latency: state.latency,
                    quarantined_until: state.quarantine.map(|q| q.until_wall),
                }
            })
            .collect()
    }

    /// Whether a majority of masters answer and vote: grants can succeed.
    pub fn ready(&self) -> bool {
        let voting = (0..self.states.len())
            .filter(|&i| {
                let state = self.state(i);
                state.up && state.quarantine.is_none()
            })
            .count();
        voting >= quorum::majority(self.states.len())
    }

    /// Probe every master once and act on what is found: initialise a fresh deployment,
    /// quarantine a master that lost its data, restore one whose quarantine is over.
    pub async fn probe_round(&self, nodes: &[Arc<dyn LockNode>]) {
        let limit = self.config.master_timeout;
        let probes: Vec<NodeResult<Probe>> =
            futures::future::join_all(nodes.iter().map(|node| async move {
                let started = Instant::now();
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

        let any_marked = probes.iter().any(|p| matches!(p, Ok(p) if p.marked));
        let fresh = !any_marked && !self.ever_marked.load(Ordering::Acquire);
        if any_marked {
            self.ever_marked.store(true, Ordering::Release);
        }
        for (i, probe) in probes.iter().enumerate() {
            let Ok(probe) = probe else { continue };
            self.note_run_id(i, &probe.run_id);
            if probe.marked {
                // Marked again, possibly restored by another redlockd replica.
                if self.state(i).quarantine.take().is_some() {
                    tracing::info!(master = %self.addresses[i], "master votes again");
                }
            } else if fresh {
                self.restore(i, nodes, 0, "fresh master initialised").await;
            } else {
                self.quarantine_or_restore(i, nodes, &probes).await;
            }
        }
    }

    fn note_run_id(&self, i: usize, run_id: &str) {
        let mut state = self.state(i);
        if state.run_id.as_deref().is_some_and(|old| old != run_id) {
            tracing::warn!(master = %self.addresses[i], "master restarted (its run_id changed)");
        }
        state.run_id = Some(run_id.to_owned());
    }

    async fn quarantine_or_restore(
        &self,
        i: usize,
        nodes: &[Arc<dyn LockNode>],
        probes: &[NodeResult<Probe>],
    ) {
        let now = Instant::now();
        let quarantine = *self.state(i).quarantine.get_or_insert_with(|| {
            tracing::warn!(
                master = %self.addresses[i],
                quarantine_ms = self.config.max_ttl.as_millis() as u64,
                "master has lost its data; it will not vote until every lease it may have held has expired"
            );
            Quarantine {
                until: now + self.config.max_ttl,
                until_wall: SystemTime::now() + self.config.max_ttl,
            }
        });
        if now < quarantine.until {
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
            .filter_map(|(_, p)| p.as_ref().ok().filter(|p| p.marked).map(|p| p.fence))
            .collect();
        if n == 1 {
            tracing::error!(
                master = %self.addresses[i],
                "the only master lost its data: fencing tokens for its locks start again from its counter"
            );
        } else if fences.len() < needed {
            tracing::warn!(master = %self.addresses[i], "quarantine over, but too few masters answer to restore its fencing counter");
            return;
        }
        let fence = fences.into_iter().max().unwrap_or(0);
        self.restore(i, nodes, fence, "quarantine over; master votes again")
            .await;
    }

    async fn restore(&self, i: usize, nodes: &[Arc<dyn LockNode>], fence: u64, why: &str) {
        match tokio::time::timeout(self.config.master_timeout, nodes[i].restore(fence)).await {
            Ok(Ok(())) => {
                self.state(i).quarantine = None;
                self.ever_marked.store(true, Ordering::Release);
                tracing::info!(master = %self.addresses[i], fence, "{why}");
            }
            Ok(Err(e)) => {
                tracing::warn!(master = %self.addresses[i], error = %e, "could not restore master")
            }
            Err(_) => tracing::warn!(master = %self.addresses[i], "restoring master timed out"),
        }
    }

    /// Probe every master about once a second (and at once when a script reports a master
    /// without its marker) until `shutdown` fires.
    pub fn spawn(
        self: &Arc<Self>,
        nodes: Vec<Arc<dyn LockNode>>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let monitor = self.clone();
        tokio::spawn(async move {
            loop {
                monitor.probe_round(&nodes).await;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                    _ = monitor.wake.notified() => {}
                }
            }
        })
    }
}
