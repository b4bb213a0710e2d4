//! The Redlock engine: one step at a time, fanned out to every master concurrently, each
//! call bounded by the master timeout, decided as soon as the answers in hand decide it.
//!
//! On top of the classic algorithm (majority, validity = TTL - elapsed - drift, unlock
//! everywhere on failure) it keeps two promises of the contract:
//! - fencing tokens rise even when the masters' counters diverge: a grant's token is the
//!   largest counter among the granting majority, and it is written back to a majority
//!   (`confirm`) before the grant is answered, unless a majority already hold it;
//! - a master that lost its data does not vote until it is safe (see `health`).

pub mod health;
pub mod node;
pub mod quorum;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

pub use health::{MasterStatus, Monitor};
use node::{Acquired, Holding, LockNode, NodeError, NodeResult, Owned};
use quorum::{GrantOutcome, OwnedOutcome, ReadOutcome, ReleaseOutcome};

use crate::metrics::Metrics;

/// The engine's knobs, all from the contract's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long one master may take to answer one step.
    pub master_timeout: Duration,
    /// The clock-drift allowance as a share of the TTL (plus 2 ms).
    pub drift_factor: f64,
    /// The largest TTL a lease may have: how long an amnesic master stays quarantined.
    pub max_ttl: Duration,
}

/// Why a step did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("the lock is held by another lease")]
    Held { retry_after: Duration },
    #[error("no such lease holds the lock")]
    NotFound,
    #[error("{0}")]
    Unavailable(String),
}

/// A lease as the masters agree on it at the end of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub token: u64,
    /// The TTL the lease was granted or last renewed with.
    pub ttl: Duration,
    /// How long the client may rely on the lease from now.
    pub validity: Duration,
    /// How long until the lease's keys expire on a majority, unless renewed.
    pub remaining: Duration,
    pub owner: Option<String>,
}

/// A held lock as inspect and list show it (never with its lease id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub name: String,
    pub token: u64,
    pub remaining: Duration,
    pub owner: Option<String>,
}

/// Longest a list step may take on one master: it scans the keyspace, so it gets more
/// than the per-step master timeout, but it is still bounded.
const LIST_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

pub struct Redlock {
    nodes: Vec<Arc<dyn LockNode>>,
    config: EngineConfig,
    /// Liveness, latency and quarantine of each master, for `/readyz` and the monitor.
    monitor: Arc<Monitor>,
}

type Pending<T> = FuturesUnordered<BoxFuture<'static, (usize, NodeResult<T>)>>;

impl Redlock {
    pub fn new(nodes: Vec<Arc<dyn LockNode>>, config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        let monitor = Arc::new(Monitor::new(&nodes, config.clone(), metrics));
        Self {
            nodes,
            config,
            monitor,
        }
    }

    pub fn nodes(&self) -> &[Arc<dyn LockNode>] {
        &self.nodes
    }

    pub fn monitor(&self) -> &Arc<Monitor> {
        &self.monitor
    }

    fn drift(&self, ttl: Duration) -> Duration {
        quorum::drift(ttl, self.config.drift_factor)
    }

    /// Run `call` on every master at once, each bounded by `limit`, until `decide` returns
    /// an outcome or every master has answered. Returns the outcome (`None` only if the
    /// answers never decided it) with the calls still in flight, for the caller to finish
    /// or drop.
    async fn fan_out<T, D>(
        &self,
        limit: Duration,
        call: impl Fn(Arc<dyn LockNode>) -> BoxFuture<'static, NodeResult<T>>,
        decide: impl Fn(&[Option<NodeResult<T>>]) -> Option<D>,
    ) -> (Option<D>, Pending<T>)
    where
        T: Send + 'static,
    {
        // Each call is its own task: all start at once, and a call whose answer is no longer
        // awaited (the step was decided, or the request dropped) still runs to its end
        // rather than being abandoned half-way.
        let mut pending: Pending<T> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let fut = call(node.clone());
                let monitor = self.monitor.clone();
                let task = tokio::spawn(async move {
                    let started = Instant::now();
                    let reply = match tokio::time::timeout(limit, fut).await {
                        Ok(reply) => reply,
                        Err(_) => Err(NodeError::Timeout),
                    };
                    monitor.observe(i, &reply, started.elapsed());
                    reply
                });
                Box::pin(async move {
                    let reply = task.await.unwrap_or_else(|e| {
                        Err(NodeError::Other(format!("master call failed: {e}")))
                    });
                    (i, reply)
                }) as BoxFuture<'static, _>
            })
            .collect();
        let mut replies: Vec<Option<NodeResult<T>>> = (0..self.nodes.len()).map(|_| None).collect();
        while let Some((i, reply)) = pending.next().await {
            replies[i] = Some(reply);
            if let Some(outcome) = decide(&replies) {
                return (Some(outcome), pending);
            }
        }
        (decide(&replies), pending)
    }

    /// Acquire `name` for `lease`: Redlock's grant, with a fencing token that is greater
    /// than every earlier grant's.
    pub async fn acquire(
        &self,
        name: &str,
        lease: &str,
        ttl: Duration,
        owner: Option<&str>,
    ) -> Result<Leased, EngineError> {
        let started = Instant::now();
        let ttl_ms = millis(ttl);
        let (name, lease): (Arc<str>, Arc<str>) = (name.into(), lease.into());
        let owner: Option<Arc<str>> = owner.map(Into::into);
        let (outcome, stragglers) = self
            .fan_out(
                self.config.master_timeout,
                |node| {
                    let (name, lease, owner) = (name.clone(), lease.clone(), owner.clone());
                    Box::pin(
                        async move { node.acquire(&name, &lease, ttl_ms, owner.as_deref()).await },
                    )
                },
                quorum::decide_grant,
            )
            .await;
        let (token, confirmed) = match outcome {
            Some(GrantOutcome::Won { token, confirmed }) => (token, confirmed),
            Some(GrantOutcome::Held { retry_after }) => {
                drop(stragglers);
                self.abandon(&name, &lease, ttl).await;
                return Err(EngineError::Held { retry_after });
            }
            Some(GrantOutcome::Unavailable) | None => {
                drop(stragglers);
                self.abandon(&name, &lease, ttl).await;
                return Err(EngineError::Unavailable(
                    "fewer than a majority of masters granted the lock".into(),
                ));
            }
        };

        let q = quorum::majority(self.nodes.len());
        if confirmed < q && !self.confirm(&name, &lease, token).await {
            self.abandon(&name, &lease, ttl).await;
            return Err(EngineError::Unavailable(
                "could not record the fencing token on a majority of masters".into(),
            ));
        }
        self.settle_stragglers(stragglers, name.clone(), lease.clone(), token);

        let elapsed = started.elapsed();
        let Some(validity) = quorum::validity(ttl, elapsed, self.config.drift_factor) else {
            self.abandon(&name, &lease, ttl).await;
            return Err(EngineError::Unavailable(format!(
                "the masters took {} ms, leaving no validity of a {} ms TTL",
                elapsed.as_millis(),
                ttl_ms
            )));
        };
        Ok(Leased {
            token,
            ttl,
            validity,
            remaining: ttl.saturating_sub(elapsed),
            owner: owner.map(|o| o.to_string()),
        })
    }

    /// Write `token` back to every master; true once a majority have it.
    async fn confirm(&self, name: &Arc<str>, lease: &Arc<str>, token: u64) -> bool {
        let q = quorum::majority(self.nodes.len());
        let (outcome, _) = self
            .fan_out(
                self.config.master_timeout,
                |node| {
                    let (name, lease) = (name.clone(), lease.clone());
                    Box::pin(async move { node.confirm(&name, &lease, token).await })
                },
                |replies| {
                    let ok = replies.iter().filter(|r| matches!(r, Some(Ok(())))).count();
                    let open = replies.iter().filter(|r| r.is_none()).count();
                    (ok >= q || ok + open < q).then_some(ok >= q)
                },
            )
            .await;
        outcome.unwrap_or(false)
    }

    /// Masters that answer after the grant was decided may have set the key with another
    /// token (or, for a lost reply, an unknown one): give them the chosen token, so that
    /// reads agree. Runs in the background; the grant is already safe without it.
    fn settle_stragglers(
        &self,
        mut stragglers: Pending<Acquired>,
        name: Arc<str>,
        lease: Arc<str>,
        token: u64,
    ) {
        if stragglers.is_empty() {
            return;
        }
        let nodes = self.nodes.clone();
        let limit = self.config.master_timeout;
        tokio::spawn(async move {
            while let Some((i, reply)) = stragglers.next().await {
                let needs = match reply {
                    Ok(Acquired::Granted { token: t }) => t != token,
                    Ok(Acquired::Held { .. }) | Err(NodeError::Amnesic) => false,
                    Err(_) => true,
                };
                if needs {
                    let _ =
                        tokio::time::timeout(limit, nodes[i].confirm(&name, &lease, token)).await;
                }
            }
        });
    }

    /// Undo a failed grant: release it everywhere now, and keep releasing on the masters
    /// that did not answer. Such a master may still run the grant's acquire later: a paused
    /// master runs its queued commands when it resumes, and a release sent over a new
    /// connection may run before an acquire queued on the old one. So the release is
    /// repeated until one is answered, once more after that (when the backlog has run),
    /// and never past the grant's TTL, when the key expires by itself anyway.
    async fn abandon(&self, name: &Arc<str>, lease: &Arc<str>, ttl: Duration) {
        let replies = self.release_everywhere(name, lease).await;
        let give_up = Instant::now() + ttl;
        for (node, reply) in self.nodes.iter().zip(replies) {
            if !matches!(reply, Err(ref e) if *e != NodeError::Amnesic) {
                continue;
            }
            let (node, name, lease) = (node.clone(), name.clone(), lease.clone());
            let limit = self.config.master_timeout;
            tokio::spawn(async move {
                let mut backoff = Duration::from_millis(50);
                let mut answered = false;
                while Instant::now() + backoff < give_up {
                    tokio::time::sleep(backoff).await;
                    if let Ok(Ok(_)) =
                        tokio::time::timeout(limit, node.release(&name, &lease)).await
                    {
                        if answered {
                            return;
                        }
                        answered = true;
                        backoff = Duration::from_millis(100);
                    } else {
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                }
            });
        }
    }

    /// Delete `lease` from every master, waiting at most one master timeout. Used when a
    /// step fails, so that a failed grant leaves nothing behind on any master that heard it.
    async fn release_everywhere(
        &self,
        name: &Arc<str>,
        lease: &Arc<str>,
    ) -> Vec<NodeResult<Owned<()>>> {
        self.fan_out(
            self.config.master_timeout,
            |node| {
                let (name, lease) = (name.clone(), lease.clone());
                Box::pin(async move { node.release(&name, &lease).await })
            },
            all_answers,
        )
        .await
        .0
        .unwrap_or_default()
    }

    /// Extend `lease` to `ttl` (its own TTL when `None`) on a majority of masters.
    pub async fn renew(
        &self,
        name: &str,
        lease: &str,
        ttl: Option<Duration>,
    ) -> Result<Leased, EngineError> {
        let started = Instant::now();
        let ttl_ms = ttl.map(millis);
        let (name, lease): (Arc<str>, Arc<str>) = (name.into(), lease.into());
        let (outcome, _) = self
            .fan_out(
                self.config.master_timeout,
                |node| {
                    let (name, lease) = (name.clone(), lease.clone());
                    Box::pin(async move { node.renew(&name, &lease, ttl_ms).await })
                },
                quorum::decide_owned,
            )
            .await;
        let holdings = match outcome {
            Some(OwnedOutcome::Done(holdings)) => holdings,
            Some(OwnedOutcome::NotOwner) => {
                // Whatever minority still holds the lease can only get in the way now.
                self.release_everywhere(&name, &lease).await;
                return Err(EngineError::NotFound);
            }
            Some(OwnedOutcome::Unavailable) | None => {
                return Err(EngineError::Unavailable(
                    "fewer than a majority of masters renewed the lease".into(),
                ));
            }
        };
        let Some(agreed) = self.agree(&holdings) else {
            return Err(EngineError::Unavailable(
                "the masters disagree about this lease's fencing token".into(),
            ));
        };
        let ttl = Duration::from_millis(agreed.ttl_ms);
        let elapsed = started.elapsed();
        let validity = quorum::validity(ttl, elapsed, self.config.drift_factor)
            .ok_or_else(|| EngineError::Unavailable("renewal took longer than the TTL".into()))?;
        Ok(Leased {
            token: agreed.token,
            ttl,
            validity,
            remaining: ttl.saturating_sub(elapsed),
            owner: agreed.owner,
        })
    }

    /// The token and metadata a majority of `holdings` agree on.
    fn agree(&self, holdings: &[Holding]) -> Option<quorum::Agreed> {
        let replies: Vec<_> = holdings.iter().map(|h| Some(Ok(Some(h.clone())))).collect();
        let mut padded = replies;
        padded.resize_with(self.nodes.len(), || Some(Ok(None)));
        match quorum::decide_read(&padded, None) {
            Some(ReadOutcome::Held(agreed)) => Some(agreed),
            _ => None,
        }
    }

    /// Delete `lease` from every master that has it.
    pub async fn release(&self, name: &str, lease: &str) -> Result<(), EngineError> {
        let replies = self.release_everywhere(&name.into(), &lease.into()).await;
        match quorum::decide_release(&replies) {
            ReleaseOutcome::Released => Ok(()),
            ReleaseOutcome::NotFound => Err(EngineError::NotFound),
            ReleaseOutcome::Unavailable => Err(EngineError::Unavailable(
                "could not confirm the release on a majority of masters".into(),
            )),
        }
    }

    async fn read(
        &self,
        name: &str,
        only: Option<&str>,
    ) -> Result<(Option<quorum::Agreed>, Duration), EngineError> {
        let started = Instant::now();
        let name: Arc<str> = name.into();
        let (outcome, _) = self
            .fan_out(
                self.config.master_timeout,
                |node| {
                    let name = name.clone();
                    Box::pin(async move { node.read(&name).await })
                },
                |replies| quorum::decide_read(replies, only),
            )
            .await;
        match outcome {
            Some(ReadOutcome::Held(agreed)) => Ok((Some(agreed), started.elapsed())),
            Some(ReadOutcome::Free) => Ok((None, started.elapsed())),
            Some(ReadOutcome::Unavailable) | None => Err(EngineError::Unavailable(
                "fewer than a majority of masters answered".into(),
            )),
        }
    }

    /// The lease as a majority of masters hold it now.
    pub async fn check(&self, name: &str, lease: &str) -> Result<Leased, EngineError> {
        let (agreed, elapsed) = self.read(name, Some(lease)).await?;
        let agreed = agreed.ok_or(EngineError::NotFound)?;
        let ttl = Duration::from_millis(agreed.ttl_ms);
        let remaining = Duration::from_millis(agreed.pttl_ms).saturating_sub(elapsed);
        let validity = remaining.saturating_sub(self.drift(ttl));
        if validity.is_zero() {
            return Err(EngineError::NotFound);
        }
        Ok(Leased {
            token: agreed.token,
            ttl,
            validity,
            remaining,
            owner: agreed.owner,
        })
    }

    /// Who holds `name`, if a majority agree that someone does.
    pub async fn inspect(&self, name: &str) -> Result<Option<Holder>, EngineError> {
        let (agreed, elapsed) = self.read(name, None).await?;
        Ok(agreed.map(|a| Holder {
            name: name.to_owned(),
            token: a.token,
            remaining: Duration::from_millis(a.pttl_ms).saturating_sub(elapsed),
            owner: a.owner,
        }))
    }

    /// Held locks whose names start with `prefix`, sorted by name, at most `limit`.
    pub async fn list(&self, prefix: &str, limit: usize) -> Result<Vec<Holder>, EngineError> {
        let started = Instant::now();
        let prefix: Arc<str> = prefix.into();
        // Each master may return keys the others do not; scanning well past `limit` lets
        // the majority merge still fill the page in the common case.
        let cap = limit.saturating_mul(4).max(limit + 16);
        let answers = self
            .fan_out(
                self.config.master_timeout.max(LIST_TIMEOUT_FLOOR),
                |node| {
                    let prefix = prefix.clone();
                    Box::pin(async move { node.list(&prefix, cap).await })
                },
                all_answers,
            )
            .await
            .0
            .unwrap_or_default();
        let q = quorum::majority(self.nodes.len());
        if answers.iter().filter(|a| a.is_ok()).count() < q {
            return Err(EngineError::Unavailable(
                "fewer than a majority of masters answered".into(),
            ));
        }
        // Per name, what each master said: a master that answered but did not list the
        // name does not hold it; one that failed is unknown.
        let blank: Vec<Option<NodeResult<Option<Holding>>>> = answers
            .iter()
            .map(|a| Some(a.as_ref().map(|_| None).map_err(Clone::clone)))
            .collect();
        let mut by_name = std::collections::BTreeMap::<String, Vec<_>>::new();
        for (i, answer) in answers.into_iter().enumerate() {
            for (name, holding) in answer.unwrap_or_default() {
                by_name.entry(name).or_insert_with(|| blank.clone())[i] = Some(Ok(Some(holding)));
            }
        }
        let elapsed = started.elapsed();
        Ok(by_name
            .into_iter()
            .filter_map(
                |(name, replies)| match quorum::decide_read(&replies, None) {
                    Some(ReadOutcome::Held(a)) => Some(Holder {
                        name,
                        token: a.token,
                        remaining: Duration::from_millis(a.pttl_ms).saturating_sub(elapsed),
                        owner: a.owner,
                    }),
                    _ => None,
                },
            )
            .take(limit)
            .collect())
    }
}

/// A `decide` for steps that need every master's answer (or its timeout).
fn all_answers<T: Clone>(replies: &[Option<NodeResult<T>>]) -> Option<Vec<NodeResult<T>>> {
    replies.iter().map(Option::clone).collect()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
