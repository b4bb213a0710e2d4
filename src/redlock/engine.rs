//! The engine: each step fanned out to every master in the caller's task, each call bounded
//! by the master timeout, decided by `quorum` as soon as the answers in hand decide it; what
//! a master still owes afterwards goes to its backlog.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tracing::Instrument as _;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use super::backlog::{Backlog, Job};
use super::health::Monitor;
use super::quorum::{self, GrantOutcome, OwnedOutcome, ReadOutcome, ReleaseOutcome};
use crate::model::News;
use crate::model::{
    FencingToken, GrantTerms, Idem, Kind, LeaseId, Listeners, LockKey, MasterFailure, MasterStatus,
    Owner, Traffic, Unavailability, millis,
};
use crate::store::node::{
    Acquired, Claim, Ending, Holding, ListPage, Listing, LockNode, NodeError, NodeResult, Renewal,
};

use crate::metrics::Metrics;

mod reads;
mod sessions;
pub use sessions::SessionLease;

/// The engine's knobs, all from the contract's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long one master may take to answer one step.
    pub master_timeout: Duration,
    /// The clock-drift allowance as a share of the TTL (plus 2 ms).
    pub drift_factor: f64,
    /// The largest TTL a lease may have.
    pub max_ttl: Duration,
    /// The largest lock-delay a lease may have: an amnesic master stays quarantined for
    /// the largest TTL and up to this (the delay in force on the others, see
    /// `Monitor::quarantine_for`), so that a delay it forgot is over before it votes.
    pub max_lock_delay: Duration,
    /// UNSAFE, for the fault suite only: a master that lost its data votes again at once.
    /// It exists so that the suite can show its checker catches the double grants this
    /// causes; nothing else should ever set it.
    pub unsafe_skip_quarantine: bool,
}

impl EngineConfig {
    /// The engine's settings with the contract's defaults.
    pub fn new(master_timeout: Duration, drift_factor: f64, max_ttl: Duration) -> Self {
        Self {
            master_timeout,
            drift_factor,
            max_ttl,
            max_lock_delay: Duration::ZERO,
            unsafe_skip_quarantine: false,
        }
    }

    /// The longest a master that lost its data sits out: until every lease (and its
    /// lock-delay) it may have held is over, whatever lock-delay was in force.
    pub(crate) fn quarantine(&self) -> Duration {
        self.max_ttl + self.max_lock_delay
    }
}

/// Why a step did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the lock is held by another lease")]
    Held { retry_after: Duration },
    /// Simultaneous grants each won a minority and none a majority: nobody holds the lock,
    /// and every contender has released what it won. Worth retrying at once (after a short
    /// random pause), unlike `Held`.
    #[error("the lock was contended by simultaneous grants and none won a majority")]
    Split,
    #[error("no such lease holds the lock")]
    NotFound,
    /// The grant's Idempotency-Key was used for another request (name, TTL or owner).
    #[error("the Idempotency-Key was used for another request")]
    IdempotencyMismatch,
    /// The lease the grant's Idempotency-Key stands for was granted and has ended.
    #[error("the lease of this Idempotency-Key has ended")]
    Ended,
    /// The lock is free but an ended lease's lock-delay refuses it until `retry_after`.
    #[error("the lock is in its lock-delay after a lease that ended without a revoke")]
    Delayed { retry_after: Duration },
    #[error("{}", .0.reason)]
    Unavailable(Unavailability),
}

/// Unavailable for `reason`, blaming `masters`.
fn unavailable(reason: impl Into<String>, masters: Vec<MasterFailure>) -> EngineError {
    EngineError::Unavailable(Unavailability {
        reason: reason.into(),
        masters,
    })
}

/// A lease as the masters agree on it at the end of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub token: FencingToken,
    /// The TTL the lease was granted or last renewed with.
    pub ttl: Duration,
    /// How long the client may rely on the lease from `at`.
    pub validity: Duration,
    /// How long from `at` until the lease's keys expire on a majority, unless renewed.
    pub remaining: Duration,
    pub owner: Option<Owner>,
    /// When the step was decided: `validity` and `remaining` count from here, so that what
    /// the client is told can be reduced by the time spent until the answer is written.
    pub at: Instant,
    /// The held stream a majority of masters say keeps the lease (`""`: the one that granted
    /// it), as a renew found it; `None` from a grant or a read.
    pub kept_by: Option<Arc<str>>,
}

/// A held lock as inspect and list show it (never with its lease id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub name: String,
    /// The holder's lease id: for the lease service only (a keyed retry finds its permit
    /// by it), never shown.
    pub lease: LeaseId,
    pub token: FencingToken,
    pub remaining: Duration,
    /// The TTL it was granted or last renewed with.
    pub ttl: Duration,
    pub owner: Option<Owner>,
}

impl Holder {
    /// The holder a majority agree on, its remaining time less `elapsed` since the read.
    fn of(key: &LockKey, agreed: quorum::Agreed, elapsed: Duration) -> Self {
        Self::named(key.name.to_string(), agreed, elapsed)
    }

    /// The holder of `name` (a lock's, or a semaphore's slot's) a majority agree on.
    pub(crate) fn named(name: String, agreed: quorum::Agreed, elapsed: Duration) -> Self {
        Self {
            name,
            token: agreed.token,
            lease: agreed.lease,
            remaining: Duration::from_millis(agreed.pttl_ms).saturating_sub(elapsed),
            ttl: Duration::from_millis(agreed.ttl_ms),
            owner: agreed.owner,
        }
    }
}

/// What an observer's read found (see `Redlock::sight`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sighting {
    /// The holder, or nobody, as every master that holds it agrees.
    Settled(Option<Holder>),
    /// A grant of the name is being decided: look again in a moment.
    Unsettled,
}

/// Longest a list step may take on one master: it scans the keyspace, so it gets more
/// than the per-step master timeout, but it is still bounded.
const LIST_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

pub struct Redlock {
    nodes: Vec<Arc<dyn LockNode>>,
    config: EngineConfig,
    /// Liveness, latency and quarantine of each master, for `/readyz` and the monitor.
    monitor: Arc<Monitor>,
    /// What each master still owes after a request was answered.
    backlog: Backlog,
    /// Ends the backlog workers (and whatever else the engine started) with the engine.
    stop: CancellationToken,
    /// Which master announces the next grant.
    announcer: std::sync::atomic::AtomicUsize,
}

impl Drop for Redlock {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One master's call in a fan-out, carrying the master's index so that a call still in
/// flight when the step is decided can be handed to that master's backlog.
struct Call<T> {
    master: usize,
    reply: BoxFuture<'static, NodeResult<T>>,
}

impl<T> Future for Call<T> {
    type Output = (usize, NodeResult<T>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let master = self.master;
        self.reply.as_mut().poll(cx).map(|reply| (master, reply))
    }
}

type Pending<T> = FuturesUnordered<Call<T>>;

/// What a fan-out came to: the decision, the calls still in flight, and the masters that
/// failed (or had not answered) when it was made.
struct Round<T, D> {
    outcome: Option<D>,
    pending: Pending<T>,
    failures: Vec<MasterFailure>,
    /// The masters that answered with an error, by index.
    errors: Vec<(usize, NodeError)>,
}

#[cfg(test)]
impl Redlock {
    /// The engine over one in-process store, for the unit tests of the layer above, which
    /// never names the store itself.
    pub(crate) fn over_one_memory_node(metrics: Arc<Metrics>) -> Self {
        Self::new(
            vec![Arc::new(crate::store::memory::MemoryNode::new("m"))],
            EngineConfig::new(Duration::from_millis(100), 0.01, Duration::from_secs(3600)),
            metrics,
        )
    }
}

impl Redlock {
    /// The engine over `nodes`. Starts one backlog worker per master (so it must be called
    /// within a tokio runtime); they stop when the engine is dropped or `stop` is called.
    pub fn new(nodes: Vec<Arc<dyn LockNode>>, config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        for node in &nodes {
            metrics.register_master(node.address(), &NodeError::KINDS);
        }
        let stop = CancellationToken::new();
        let monitor = Arc::new(Monitor::new(&nodes, config.clone(), metrics.clone()));
        let backlog = Backlog::start(&nodes, config.master_timeout, metrics, stop.clone());
        Self {
            nodes,
            config,
            monitor,
            backlog,
            stop,
            announcer: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The nodes themselves: for the engine's own layer and tests. Layers above ask the
    /// engine (`masters`, `traffic`), never a node.
    pub fn nodes(&self) -> &[Arc<dyn LockNode>] {
        &self.nodes
    }

    /// Each master as `/readyz` shows it: the monitor's view, with what its node reports
    /// of itself (a cluster's shards, its announcements' subscription).
    pub(crate) fn masters(&self) -> Vec<MasterStatus> {
        self.monitor
            .status()
            .into_iter()
            .zip(&self.nodes)
            .map(|(status, node)| MasterStatus {
                cluster: node.report().shards,
                subscribed: node.subscribed(),
                ..status
            })
            .collect()
    }

    /// How each master's steps have travelled (address, traffic), for the masters that
    /// send them in batches.
    pub(crate) fn traffic(&self) -> impl Iterator<Item = (&str, Traffic)> {
        self.nodes
            .iter()
            .filter_map(|node| Some((node.address(), node.traffic()?)))
    }

    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    /// Probe every master once (so that the first requests find the deployment judged),
    /// then keep probing in the background until `shutdown` fires or the engine stops.
    pub(crate) async fn start(&self, shutdown: CancellationToken) {
        self.monitor.probe_round(&self.nodes).await;
        let stop = self.stop.child_token();
        self.monitor.spawn(self.nodes.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => stop.cancel(),
                () = stop.cancelled() => {}
            }
        });
    }

    /// Stop the engine's background work (the backlog is abandoned: its keys expire at
    /// their TTL).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// How much work master `i` still owes (late acquires to settle, releases to repeat).
    #[cfg(any(test, feature = "test-util"))]
    pub fn backlog(&self, i: usize) -> usize {
        self.backlog.depth(i)
    }

    fn drift(&self, ttl: Duration) -> Duration {
        quorum::drift(ttl, self.config.drift_factor)
    }

    /// Run `call` on every master at once, each bounded by `limit`, until `decide` returns
    /// an outcome or every master has answered. Returns the outcome (`None` only if the
    /// answers never decided it) with the calls still in flight, for the caller to hand to
    /// the backlog or drop.
    ///
    /// The calls run in the caller's task, not one task each: a task per call lets a later
    /// command for the same lease (a release) reach a master's connection before an earlier
    /// one (its acquire). Here every call has been handed to its connection before the
    /// caller can issue the next step.
    async fn fan_out<T, D>(
        &self,
        step: &'static str,
        limit: Duration,
        call: impl Fn(usize, Arc<dyn LockNode>) -> BoxFuture<'static, NodeResult<T>>,
        decide: impl Fn(&[Option<NodeResult<T>>]) -> Option<D>,
    ) -> Round<T, D>
    where
        T: Send + 'static,
    {
        let calls = self.nodes.iter().enumerate().map(|(i, node)| {
            // An unverified master (its connection broke: it may have restarted without its
            // data) is not asked at all: even a discounted acquire would raise its counter
            // and hide how far it went back.
            let fut = if self.monitor.unverified(i) {
                Box::pin(std::future::ready(Err(NodeError::Unverified)))
            } else {
                call(i, node.clone())
            };
            let monitor = self.monitor.clone();
            // A child of the request's span in a trace (nothing unless traces are sent).
            let span = tracing::debug_span!(
                target: crate::telemetry::TARGET,
                "master step",
                otel.name = %format_args!("{step} {}", node.address()),
                step,
                master = node.address(),
                outcome = tracing::field::Empty,
            );
            let recorder = span.clone();
            Call {
                master: i,
                // Unconstrained by tokio's cooperative budget: a task that has used its
                // budget gets Pending from the connection's queue even when there is room,
                // and a call dropped before it was queued is a step that never reached the
                // master (seen: a renew that skipped one master, which kept the old TTL).
                reply: Box::pin(tokio::task::unconstrained(
                    async move {
                        let started = Instant::now();
                        let reply = match tokio::time::timeout(limit, fut).await {
                            Ok(reply) => reply,
                            Err(_) => Err(NodeError::Timeout),
                        };
                        monitor.observe(i, &reply, started.elapsed());
                        let reply = match reply {
                            Ok(_) if monitor.unverified(i) => Err(NodeError::Unverified),
                            reply => reply,
                        };
                        if !recorder.is_disabled() {
                            let outcome = reply.as_ref().err().map_or("ok", NodeError::kind);
                            recorder.record("outcome", outcome);
                        }
                        reply
                    }
                    .instrument(span),
                )),
            }
        });
        let mut replies: Vec<Option<NodeResult<T>>> = (0..self.nodes.len()).map(|_| None).collect();
        // Poll every call once before deciding anything: that is what hands each command to
        // its master's connection, in order, before a later step can follow it. (A set of
        // futures polls one only until another is ready.)
        let mut pending: Pending<T> = FuturesUnordered::new();
        for mut call in calls {
            match futures::poll!(&mut call) {
                Poll::Ready((i, reply)) => replies[i] = Some(reply),
                Poll::Pending => pending.push(call),
            }
        }
        let mut outcome = decide(&replies);
        while outcome.is_none()
            && let Some((i, reply)) = pending.next().await
        {
            replies[i] = Some(reply);
            outcome = decide(&replies);
        }
        let errors = replies
            .iter()
            .enumerate()
            .filter_map(|(i, reply)| match reply {
                Some(Err(e)) => Some((i, e.clone())),
                _ => None,
            })
            .collect();
        Round {
            outcome,
            pending,
            failures: self.failures(&replies),
            errors,
        }
    }

    /// Hand the calls still in flight to their masters' backlogs to run to their end: a
    /// renew or confirm decided without a master's answer still reaches that master.
    fn finish<T: Send + 'static>(&self, pending: Pending<T>) {
        for call in pending {
            let master = call.master;
            self.backlog.push(
                master,
                Job::Finish(Box::pin(async move {
                    let _ = call.await;
                })),
            );
        }
    }

    /// The masters whose reply is an error. A master whose answer the step was decided
    /// without did not fail (the majority was out of reach before it answered, or was won
    /// without it): it is not named, where `no_answer` read as one more master down.
    /// A master passed over as unverified is named by why, when it is quarantined: it lost
    /// its data (`amnesic`) or its clock jumped (`clock`).
    fn failures<T>(&self, replies: &[Option<NodeResult<T>>]) -> Vec<MasterFailure> {
        replies
            .iter()
            .zip(&self.nodes)
            .enumerate()
            .filter_map(|(i, (reply, node))| {
                let kind = match reply {
                    Some(Err(NodeError::Unverified)) => self.monitor.unverified_error(i).kind(),
                    Some(Err(e)) => e.kind(),
                    None | Some(Ok(_)) => return None,
                };
                Some(MasterFailure {
                    address: node.address().to_owned(),
                    kind,
                })
            })
            .collect()
    }

    /// Tell the other replicas that a grant of `name` was decided with `token`, through
    /// one master (every replica listens to all of them), without waiting: the master's
    /// backlog sends it, bounded like the rest of its work. The masters take turns.
    pub(crate) fn announce(&self, key: &LockKey, news: News, token: FencingToken) {
        let n = self.nodes.len();
        let start = self
            .announcer
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(i) = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.monitor.unverified(i))
        else {
            return;
        };
        let node = self.nodes[i].clone();
        let (key, limit) = (key.clone(), self.config.master_timeout);
        self.backlog.push(
            i,
            Job::Finish(Box::pin(async move {
                let _ = tokio::time::timeout(limit, node.announce(&key, news, token)).await;
            })),
        );
    }

    /// Acquire `key` for `lease`: Redlock's grant, with a fencing token that is greater
    /// than every earlier grant's.
    pub async fn acquire(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ttl: Duration,
        owner: Option<Owner>,
    ) -> Result<Leased, EngineError> {
        self.acquire_keyed(key, lease, ttl, owner, None, Listeners::default())
            .await
    }

    /// `acquire` made idempotent by `idem`: a lease that already holds `key` on a majority
    /// is answered as granted with its token (a retry whose first answer was lost), a key
    /// used for another request is `IdempotencyMismatch`, and a lease that held the lock
    /// and has ended is `Ended`, never granted again. `listeners` tells the masters who
    /// wants to hear of the hold's end: nobody, unless a grant waits for it or observers
    /// follow it.
    pub async fn acquire_keyed(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ttl: Duration,
        owner: Option<Owner>,
        idem: Option<Idem>,
        terms: impl Into<GrantTerms>,
    ) -> Result<Leased, EngineError> {
        let GrantTerms {
            listeners,
            lock_delay_ms,
        } = terms.into();
        let started = Instant::now();
        let ttl_ms = millis(ttl);
        let (key, lease) = (key.clone(), lease.clone());
        let idem = idem.map(|mut idem| {
            idem.attempt = format!("{:016x}", rand::random::<u64>());
            Arc::new(idem)
        });
        let Round {
            outcome,
            pending: stragglers,
            failures,
            ..
        } = self
            .fan_out(
                "acquire",
                self.config.master_timeout,
                |i, node| {
                    let (key, lease, owner) = (key.clone(), lease.clone(), owner.clone());
                    let idem = idem.clone();
                    let monitor = self.monitor.clone();
                    Box::pin(async move {
                        let claim = Claim {
                            key: &key,
                            lease: &lease,
                            ttl_ms,
                            owner: owner.as_ref(),
                            idem: idem.as_deref(),
                            listeners,
                            lock_delay_ms,
                        };
                        let reply = node.acquire(claim).await;
                        if let Ok(Acquired::Granted { token }) = &reply {
                            monitor.saw_fence(i, token.get());
                        }
                        reply
                    })
                },
                quorum::decide_grant,
            )
            .await;
        // A failed grant drops the calls still in flight: each has been handed to its
        // connection already (and then runs before the release below), or never will be.
        let (token, confirmed) = match outcome {
            Some(GrantOutcome::Won { token, confirmed }) => (token, confirmed),
            Some(GrantOutcome::Held { retry_after }) => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(EngineError::Held { retry_after });
            }
            Some(GrantOutcome::Split) => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(EngineError::Split);
            }
            // What this round granted is released; the key's own lease, if it holds
            // anywhere, is another request's (mismatch) or has let go (ended).
            Some(GrantOutcome::Mismatch) => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(EngineError::IdempotencyMismatch);
            }
            Some(GrantOutcome::Ended) => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(EngineError::Ended);
            }
            Some(GrantOutcome::Delayed { retry_after }) => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(EngineError::Delayed { retry_after });
            }
            Some(GrantOutcome::Unavailable) | None => {
                drop(stragglers);
                self.abandon(&key, &lease, ttl, idem.as_deref()).await;
                return Err(unavailable(
                    "fewer than a majority of masters granted the lock",
                    failures,
                ));
            }
        };
        for call in stragglers {
            self.backlog.push(
                call.master,
                Job::Settle {
                    reply: Box::pin(call),
                    key: key.clone(),
                    lease: lease.clone(),
                    token,
                },
            );
        }

        let q = quorum::majority(self.nodes.len());
        if confirmed < q
            && let Err(failures) = self.confirm(&key, &lease, token).await
        {
            self.abandon(&key, &lease, ttl, idem.as_deref()).await;
            return Err(unavailable(
                "could not record the fencing token on a majority of masters",
                failures,
            ));
        }

        let at = Instant::now();
        let elapsed = at - started;
        let Some(validity) = quorum::validity(ttl, elapsed, self.config.drift_factor) else {
            self.abandon(&key, &lease, ttl, idem.as_deref()).await;
            return Err(unavailable(
                format!(
                    "the masters took {} ms, leaving no validity of a {} ms TTL",
                    elapsed.as_millis(),
                    ttl_ms
                ),
                Vec::new(),
            ));
        };
        Ok(Leased {
            token,
            ttl,
            validity,
            remaining: ttl.saturating_sub(elapsed),
            owner,
            at,
            kept_by: None,
        })
    }

    /// Write `token` back to every master, until a majority have it; or the masters that
    /// failed, when too few could.
    async fn confirm(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        token: FencingToken,
    ) -> Result<(), Vec<MasterFailure>> {
        let round = self
            .fan_out(
                "confirm",
                self.config.master_timeout,
                |_, node| {
                    let (key, lease) = (key.clone(), lease.clone());
                    Box::pin(async move { node.confirm(&key, &lease, token).await })
                },
                quorum::decide_confirm,
            )
            .await;
        self.finish(round.pending);
        if round.outcome == Some(true) {
            Ok(())
        } else {
            Err(round.failures)
        }
    }

    /// Undo a failed grant: release it everywhere, quietly (nothing was granted, so no
    /// waiter is woken), and keep releasing on the masters that did not answer.
    /// A keyed grant's attempt undoes only what it made and no other attempt of its key
    /// has answered for since (see `Ending::Undo`).
    async fn abandon(&self, key: &LockKey, lease: &LeaseId, ttl: Duration, attempt: Option<&Idem>) {
        let attempt = attempt.map(|i| Arc::from(i.attempt.as_str()));
        self.release_everywhere(key, lease, Ending::Undo { attempt }, ttl)
            .await;
    }

    /// Delete `lease` from every master, until a majority's answers decide the outcome (at
    /// most one master timeout). A master that has not answered by then, or failed, gets
    /// the release finished and repeated by its backlog until the lease's TTL: a revoke
    /// with one master down answers at the others' pace, not at its timeout.
    async fn release_everywhere(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ending: Ending,
        ttl: Duration,
    ) -> (Option<ReleaseOutcome>, Vec<MasterFailure>) {
        let give_up = Instant::now() + ttl;
        let Round {
            outcome,
            pending,
            failures,
            errors,
        } = self
            .fan_out(
                "release",
                self.config.master_timeout,
                |_, node| {
                    let (key, lease, ending) = (key.clone(), lease.clone(), ending.clone());
                    Box::pin(async move { node.release(&key, &lease, &ending).await })
                },
                quorum::decide_release,
            )
            .await;
        let owed = |in_flight| Job::Release {
            key: key.clone(),
            lease: lease.clone(),
            ending: ending.clone(),
            give_up,
            in_flight,
        };
        for call in pending {
            let master = call.master;
            let answered: BoxFuture<'static, bool> = Box::pin(async move {
                let (_, reply) = call.await;
                reply.is_ok()
            });
            self.backlog.push(master, owed(Some(answered)));
        }
        for (master, error) in errors {
            // An amnesic master has no keys to release.
            if error != NodeError::Amnesic {
                self.backlog.push(master, owed(None));
            }
        }
        (outcome, failures)
    }

    /// Extend `lease` to `ttl` (its own TTL when `None`) on a majority of masters.
    pub async fn renew(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ttl: Option<Duration>,
    ) -> Result<Leased, EngineError> {
        self.renew_with(key, lease, ttl, None, None).await
    }

    /// `renew`, replacing the lease's owner text with `owner` on every master that renews
    /// it (an elected leader proclaiming a new value), and with `stream`, handing the lease
    /// to that held stream (a resume: see `Ending::Leave`).
    pub(crate) async fn renew_with(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ttl: Option<Duration>,
        owner: Option<Owner>,
        stream: Option<Arc<str>>,
    ) -> Result<Leased, EngineError> {
        let started = Instant::now();
        let ttl_ms = ttl.map(millis);
        let (key, lease) = (key.clone(), lease.clone());
        let Round {
            outcome,
            pending,
            failures,
            ..
        } = self
            .fan_out(
                "renew",
                self.config.master_timeout,
                |_, node| {
                    let (key, lease, owner) = (key.clone(), lease.clone(), owner.clone());
                    let stream = stream.clone();
                    Box::pin(async move {
                        let renewal = Renewal {
                            stream: stream.as_deref(),
                            ..Renewal::new(&key, &lease, ttl_ms, owner.as_ref())
                        };
                        node.renew(renewal).await
                    })
                },
                quorum::decide_renew,
            )
            .await;
        self.finish(pending);
        let holdings = match outcome {
            Some(OwnedOutcome::Done(holdings)) => holdings,
            Some(OwnedOutcome::NotOwner) => {
                // Whatever minority still holds the lease can only get in the way now.
                let ttl = ttl.unwrap_or(self.config.max_ttl);
                self.release_everywhere(&key, &lease, Ending::Undo { attempt: None }, ttl)
                    .await;
                return Err(EngineError::NotFound);
            }
            Some(OwnedOutcome::Unavailable) | None => {
                return Err(unavailable(
                    "fewer than a majority of masters renewed the lease",
                    failures,
                ));
            }
        };
        let Some(agreed) = quorum::agree(&holdings, self.nodes.len()) else {
            return Err(unavailable(
                "the masters disagree about this lease's fencing token",
                failures,
            ));
        };
        let ttl = Duration::from_millis(agreed.ttl_ms);
        // What a majority will keep: a renewed key lives its TTL, but a hold through a session
        // (which a renew by its lease id does not extend) lives only what is left of it, and
        // no more than the majority-th longest of those may be promised.
        let kept = ttl.min(Duration::from_millis(agreed.pttl_ms));
        let at = Instant::now();
        let elapsed = at - started;
        let validity = quorum::validity(kept, elapsed, self.config.drift_factor)
            .ok_or_else(|| unavailable("renewal took longer than the TTL", failures))?;
        Ok(Leased {
            token: agreed.token,
            ttl,
            validity,
            remaining: kept.saturating_sub(elapsed),
            owner: agreed.owner,
            at,
            kept_by: agreed.stream,
        })
    }

    /// Delete `lease` from every master that has it (a revoke, or a grant whose client
    /// left): waiting grants are woken. Masters that do not answer get the release repeated
    /// from their backlog, so a key set by an acquire they had not yet answered is removed
    /// too.
    pub async fn release(&self, key: &LockKey, lease: &LeaseId) -> Result<(), EngineError> {
        self.end(key, lease, Ending::Revoke).await
    }

    /// `release`, for the end of the held stream `stream` (`""`: the one that granted the
    /// lease): only where that stream still keeps the lease, so that an old connection
    /// closing after its holder resumed elsewhere releases nothing (`NotFound` then).
    pub async fn leave(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        stream: Arc<str>,
    ) -> Result<(), EngineError> {
        self.end(key, lease, Ending::Leave { stream }).await
    }

    /// Release `lease` everywhere, announced as `ending` says (a revoke or an eviction).
    async fn end(&self, key: &LockKey, lease: &LeaseId, ending: Ending) -> Result<(), EngineError> {
        let (outcome, failures) = self
            .release_everywhere(key, lease, ending, self.config.max_ttl)
            .await;
        match outcome {
            Some(ReleaseOutcome::Released) => Ok(()),
            Some(ReleaseOutcome::NotFound) => Err(EngineError::NotFound),
            Some(ReleaseOutcome::Unavailable) | None => Err(unavailable(
                "could not confirm the release on a majority of masters",
                failures,
            )),
        }
    }

    /// Remove whoever holds `key` on a majority, whatever its lease (an administrator's
    /// force-release): the lease found is released everywhere, announced like a revoke.
    /// The removed lease's token, or `None` when nobody held it (or its holder released it
    /// meanwhile). Later grants' tokens are greater, as every grant's are.
    pub async fn evict(&self, key: &LockKey) -> Result<Option<FencingToken>, EngineError> {
        let Some(held) = self.read(key, None).await?.0 else {
            return Ok(None);
        };
        match self.end(key, &held.lease, Ending::Evict).await {
            Ok(()) => Ok(Some(held.token)),
            Err(EngineError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A `decide` for steps that need every master's answer (or its timeout).
fn all_answers<T: Clone>(replies: &[Option<NodeResult<T>>]) -> Option<Vec<NodeResult<T>>> {
    replies.iter().map(Option::clone).collect()
}
