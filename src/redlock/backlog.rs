//! Work a master still owes after the request that caused it was answered: an acquire that
//! had not answered when its grant was decided (settled with the chosen token once it does),
//! and releases to repeat on a master that did not answer them.
//!
//! One worker per master drives all of it, with a cap on how much may wait and a metric for
//! how much does: a master that is down under contention costs a bounded queue, not a task
//! per failed attempt. Everything stops with the engine.
//!
//! Order: a job for a lease is queued only after the request's own call to that master was
//! handed to the connection, and the connection keeps the order of what it is handed, so a
//! release never overtakes the acquire it undoes. A connection that was re-established in
//! between may still run the acquire late (a paused master runs what it had read when it
//! resumes), which is why a release is repeated until it is answered, then once more.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::model::{FencingToken, LeaseId, LockKey, jittered};
use crate::store::node::{Acquired, Ending, LockNode, NodeError, NodeResult};

/// How much work one master's backlog may hold; past it new work is refused (counted in
/// `redlockd_master_backlog_dropped_total`) and the keys concerned expire at their TTL.
pub const MAX_BACKLOG: usize = 4096;

/// First pause before a release is repeated; it doubles up to a second.
const FIRST_RETRY: Duration = Duration::from_millis(50);

/// One piece of owed work.
pub(super) enum Job {
    /// An acquire still in flight when its grant was decided. When it answers, the master
    /// gets the chosen token if it set the key with another one (or its reply was lost).
    Settle {
        reply: BoxFuture<'static, (usize, NodeResult<Acquired>)>,
        key: LockKey,
        lease: LeaseId,
        token: FencingToken,
    },
    /// A step whose outcome was decided without this master's answer (a renew, a confirm):
    /// it is finished rather than dropped, since a call may take more than one round trip
    /// (EVALSHA, then SCRIPT LOAD and EVALSHA again on a master that lost its scripts).
    Finish(BoxFuture<'static, ()>),
    /// A release the master did not answer: repeat it until it is answered, once more after
    /// that (when any backlog on an old connection has run), and never past `give_up`, when
    /// the key has expired by itself anyway.
    Release {
        key: LockKey,
        lease: LeaseId,
        ending: Ending,
        give_up: Instant,
        /// The request's own release call, if it was still in flight when the request was
        /// answered: it is awaited first, and if the master answers it nothing more is owed.
        in_flight: Option<BoxFuture<'static, bool>>,
    },
}

struct Queue {
    tx: mpsc::UnboundedSender<Job>,
    depth: Arc<AtomicUsize>,
    address: String,
}

pub(super) struct Backlog {
    queues: Vec<Queue>,
    metrics: Arc<Metrics>,
}

impl Backlog {
    /// Start one worker per master; they stop when `stop` fires.
    pub(super) fn start(
        nodes: &[Arc<dyn LockNode>],
        limit: Duration,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Self {
        let queues = nodes
            .iter()
            .map(|node| {
                let (tx, rx) = mpsc::unbounded_channel();
                let depth = Arc::new(AtomicUsize::new(0));
                let worker = Worker {
                    node: node.clone(),
                    depth: depth.clone(),
                    limit,
                    metrics: metrics.clone(),
                };
                tokio::spawn(worker.run(rx, stop.clone()));
                Queue {
                    tx,
                    depth,
                    address: node.address().to_owned(),
                }
            })
            .collect();
        Self { queues, metrics }
    }

    /// Hand `job` to master `i`'s worker, unless its backlog is full.
    pub(super) fn push(&self, i: usize, job: Job) {
        let queue = &self.queues[i];
        let depth = queue.depth.fetch_add(1, Ordering::AcqRel) + 1;
        if depth > MAX_BACKLOG || queue.tx.send(job).is_err() {
            queue.depth.fetch_sub(1, Ordering::AcqRel);
            self.metrics.master_backlog_dropped(&queue.address);
            return;
        }
        self.metrics.master_backlog(&queue.address, depth);
    }

    /// How much work master `i` still owes.
    #[cfg(any(test, feature = "test-util"))]
    pub(super) fn depth(&self, i: usize) -> usize {
        self.queues[i].depth.load(Ordering::Acquire)
    }
}

struct Worker {
    node: Arc<dyn LockNode>,
    depth: Arc<AtomicUsize>,
    limit: Duration,
    metrics: Arc<Metrics>,
}

impl Worker {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Job>, stop: CancellationToken) {
        let mut active = FuturesUnordered::new();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                job = rx.recv() => match job {
                    Some(job) => active.push(self.work(job)),
                    None => return,
                },
                Some(()) = active.next(), if !active.is_empty() => {
                    let depth = self.depth.fetch_sub(1, Ordering::AcqRel) - 1;
                    self.metrics.master_backlog(self.node.address(), depth);
                }
            }
        }
    }

    fn work(&self, job: Job) -> BoxFuture<'static, ()> {
        let node = self.node.clone();
        let limit = self.limit;
        Box::pin(async move {
            match job {
                Job::Finish(call) => call.await,
                Job::Settle {
                    reply,
                    key,
                    lease,
                    token,
                } => {
                    let (_, reply) = reply.await;
                    let needs = match reply {
                        Ok(Acquired::Granted { token: t }) => t != token,
                        Ok(
                            Acquired::Held { .. }
                            | Acquired::Mismatch
                            | Acquired::Ended
                            | Acquired::Delayed { .. },
                        )
                        | Err(NodeError::Amnesic) => false,
                        Err(_) => true,
                    };
                    if needs {
                        let _ =
                            tokio::time::timeout(limit, node.confirm(&key, &lease, token)).await;
                    }
                }
                Job::Release {
                    key,
                    lease,
                    ending,
                    give_up,
                    in_flight,
                } => {
                    // The request's own call, answered late, is as good as an answer in
                    // time: it reached the master in order after the acquire it undoes.
                    // Only a release that failed is repeated (and once more after it
                    // lands, for an acquire left on a connection that broke meanwhile).
                    if let Some(call) = in_flight
                        && call.await
                    {
                        return;
                    }
                    let mut answered = false;
                    let mut backoff = FIRST_RETRY;
                    while Instant::now() + backoff < give_up {
                        tokio::time::sleep(jittered(backoff)).await;
                        let reply =
                            tokio::time::timeout(limit, node.release(&key, &lease, &ending)).await;
                        if let Ok(Ok(_)) = reply {
                            if answered {
                                return;
                            }
                            answered = true;
                            backoff = FIRST_RETRY * 2;
                        } else {
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                        }
                    }
                }
            }
        })
    }
}
