//! Sessions on the masters: one heartbeat for many holds. A session is a record on each
//! master (session.lua) that the holds made through it are attached to; each step here is
//! one call per master, however many holds the session has, decided by a majority as a
//! lease's steps are.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{EngineError, Redlock, Round, unavailable};
use crate::model::{LeaseId, Owner, SessionHold};
use crate::redlock::quorum::{self, OwnedOutcome};
use crate::store::node::{SessionState, SessionStep};

/// A session as a majority of masters have it at the end of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLease {
    pub ttl: Duration,
    /// How long the session (and every hold made through it) may be relied on from `at`.
    pub validity: Duration,
    /// How long until its keys expire on a majority, from `at`.
    pub remaining: Duration,
    pub owner: Option<Owner>,
    pub at: Instant,
    /// How many holds a renew carried along on a majority.
    pub holds: usize,
    /// The holds a renew kept (carried by a majority of all masters): valid as long as the
    /// session now. A hold attached to the session and absent here was not extended.
    pub kept: Vec<LeaseId>,
    /// The holds a renew could neither confirm nor deny (a master that carries one did not
    /// answer): left attached and in place, their validity not extended.
    pub unconfirmed: Vec<LeaseId>,
    /// The holds a majority of all masters deny carrying (revoked, force-released, expired,
    /// or their grant reached only a minority): no longer valid, and released.
    pub lost: Vec<LeaseId>,
    /// Those of them found again (their keys) and released.
    pub released: Vec<SessionHold>,
    /// A renew: the held stream that a majority of all masters say keeps the session
    /// (`""`: the one that opened it, or none), if a majority agree on one.
    pub kept_by: Option<Arc<str>>,
}

impl SessionLease {
    /// The session a step's answers describe, with nothing yet of its holds' fates (a
    /// renew fills those in).
    fn of(
        states: &[SessionState],
        ttl: Duration,
        validity: Duration,
        remaining: Duration,
        at: Instant,
    ) -> Self {
        Self {
            ttl,
            validity,
            remaining,
            owner: states.iter().find_map(|s| s.owner.clone()),
            at,
            holds: 0,
            kept: Vec::new(),
            unconfirmed: Vec::new(),
            lost: Vec::new(),
            released: Vec::new(),
            kept_by: None,
        }
    }
}

/// Which of a session's steps, as the engine asks for it (the node's step borrows).
#[derive(Clone)]
enum Op {
    Open {
        ttl_ms: u64,
        owner: Option<Owner>,
    },
    Renew {
        ttl_ms: Option<u64>,
        stream: Option<Arc<str>>,
    },
    Read,
    End {
        stream: Option<Arc<str>>,
    },
    Attach {
        hold: Arc<SessionHold>,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Open { .. } => "session open",
            Op::Renew { .. } => "session renew",
            Op::Read => "session read",
            Op::End { .. } => "session end",
            Op::Attach { .. } => "session attach",
        }
    }
}

impl Redlock {
    /// Make session `id` on every master; with fewer than a majority, undo it.
    pub async fn open_session(
        &self,
        id: &str,
        ttl: Duration,
        owner: Option<Owner>,
    ) -> Result<SessionLease, EngineError> {
        let ttl_ms = crate::model::millis(ttl);
        match self.session_step(id, Op::Open { ttl_ms, owner }).await {
            Ok((states, started, _)) => self.lease_of(&states, started, None),
            Err(e) => {
                let _ = self.session_step(id, Op::End { stream: None }).await;
                Err(match e {
                    EngineError::NotFound => unavailable("the session could not be made", vec![]),
                    e => e,
                })
            }
        }
    }

    /// Extend session `id`, and every hold made through it, to `ttl` (its own when `None`):
    /// one call per master. With `stream` (a resume), that held stream keeps the session
    /// from now on: only its end ends it (`end_session`).
    pub async fn renew_session(
        &self,
        id: &str,
        ttl: Option<Duration>,
        stream: Option<Arc<str>>,
    ) -> Result<SessionLease, EngineError> {
        let ttl_ms = ttl.map(crate::model::millis);
        let (states, started, _) = self.session_step(id, Op::Renew { ttl_ms, stream }).await?;
        let mut lease = self.lease_of(&states, started, None)?;
        lease.kept_by = quorum::agree_on_session_stream(&states, self.nodes.len());
        let verdicts = quorum::judge_session_holds(&states, self.nodes.len());
        lease.holds = verdicts.kept.len();
        lease.kept = verdicts.kept;
        lease.unconfirmed = verdicts.unconfirmed;
        lease.lost = verdicts.lost;
        if !lease.lost.is_empty() {
            // A majority deny each such hold: whatever copies a minority still has can only
            // keep its name from others. Release them, and take them off the session.
            if let Ok((states, _, _)) = self.session_step(id, Op::Read).await {
                let mut holds: Vec<SessionHold> = Vec::new();
                for hold in states.into_iter().flat_map(|s| s.holds) {
                    if lease.lost.contains(&hold.lease) && !holds.contains(&hold) {
                        holds.push(hold);
                    }
                }
                let releases = holds.iter().map(|h| self.release(&h.key, &h.lease));
                futures::future::join_all(releases).await;
                lease.released = holds;
            }
        }
        Ok(lease)
    }

    /// Session `id` and the holds a majority of masters list for it.
    pub async fn read_session(
        &self,
        id: &str,
    ) -> Result<(SessionLease, Vec<SessionHold>), EngineError> {
        let (states, started, _) = self.session_step(id, Op::Read).await?;
        let lease = self.remaining_of(&states, started)?;
        let q = quorum::majority(self.nodes.len());
        let mut holds: Vec<SessionHold> = Vec::new();
        for hold in states.iter().flat_map(|s| &s.holds) {
            let seen = states.iter().filter(|s| s.holds.contains(hold)).count();
            if seen >= q && !holds.contains(hold) {
                holds.push(hold.clone());
            }
        }
        Ok((lease, holds))
    }

    /// End session `id`: its record goes from every master, and every hold any master
    /// listed for it is released (announced, as a revoke is). The holds released.
    ///
    /// With `stream` (a held stream's end), only the masters where that stream still keeps
    /// the session end it, and the holds are released only when a majority did: a resume
    /// answered through another stream was claimed on a majority, which then refuse this
    /// end (two majorities share a master, and each master takes the claim or the end
    /// whole, in one order), so its holds stay. `NotFound` when a majority refused.
    pub(crate) async fn end_session(
        &self,
        id: &str,
        stream: Option<Arc<str>>,
    ) -> Result<Vec<SessionHold>, EngineError> {
        let (states, _, _) = self.session_step(id, Op::End { stream }).await?;
        let mut holds: Vec<SessionHold> = Vec::new();
        for hold in states.into_iter().flat_map(|s| s.holds) {
            if !holds.contains(&hold) {
                holds.push(hold);
            }
        }
        let releases = holds
            .iter()
            .map(|hold| self.release(&hold.key, &hold.lease));
        // A hold already gone (it was revoked) is no failure of the end.
        for result in futures::future::join_all(releases).await {
            match result {
                Ok(()) | Err(EngineError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(holds)
    }

    /// Make `hold` (just granted) one of session `id`'s: from now its keys live as long as
    /// the session. The session as the hold now has it; `NotFound` when a majority do not
    /// have the session (the caller releases the hold).
    pub async fn attach(&self, id: &str, hold: SessionHold) -> Result<SessionLease, EngineError> {
        let hold = Arc::new(hold);
        let (states, started, failures) = self.session_step(id, Op::Attach { hold }).await?;
        let attached: Vec<SessionState> = states.into_iter().filter(|s| s.attached).collect();
        if attached.len() < quorum::majority(self.nodes.len()) {
            return Err(unavailable(
                "fewer than a majority of masters attached the hold to its session",
                failures,
            ));
        }
        self.remaining_of(&attached, started)
    }

    /// One step of session `id` on every master, decided by a majority: their answers,
    /// when the step began, and the masters that failed.
    async fn session_step(
        &self,
        id: &str,
        op: Op,
    ) -> Result<(Vec<SessionState>, Instant, Vec<crate::model::MasterFailure>), EngineError> {
        let started = Instant::now();
        let id: Arc<str> = id.into();
        let Round {
            outcome,
            pending,
            failures,
            ..
        } = self
            .fan_out(
                op.name(),
                self.config.master_timeout,
                |_, node| {
                    let (id, op) = (id.clone(), op.clone());
                    Box::pin(async move {
                        let step = match &op {
                            Op::Open { ttl_ms, owner } => SessionStep::Open {
                                ttl_ms: *ttl_ms,
                                owner: owner.as_ref(),
                            },
                            Op::Renew { ttl_ms, stream } => SessionStep::Renew {
                                ttl_ms: *ttl_ms,
                                stream: stream.as_deref(),
                            },
                            Op::Read => SessionStep::Read,
                            Op::End { stream } => SessionStep::End {
                                stream: stream.as_deref(),
                            },
                            Op::Attach { hold } => SessionStep::Attach { hold },
                        };
                        node.session(&id, step).await
                    })
                },
                match op {
                    Op::Renew { .. } => quorum::decide_session_renew,
                    _ => quorum::decide_owned,
                },
            )
            .await;
        self.finish(pending);
        match outcome {
            Some(OwnedOutcome::Done(states)) => Ok((states, started, failures)),
            Some(OwnedOutcome::NotOwner) => Err(EngineError::NotFound),
            Some(OwnedOutcome::Unavailable) | None => Err(unavailable(
                "fewer than a majority of masters answered for the session",
                failures,
            )),
        }
    }

    /// The session as a step that set its TTL leaves it: the TTL (the smallest any master
    /// answered, `ttl` when given) less the time the step took and the drift.
    fn lease_of(
        &self,
        states: &[SessionState],
        started: Instant,
        ttl: Option<Duration>,
    ) -> Result<SessionLease, EngineError> {
        let ttl = ttl.unwrap_or_else(|| {
            Duration::from_millis(states.iter().map(|s| s.ttl_ms).min().unwrap_or_default())
        });
        let at = Instant::now();
        let elapsed = at - started;
        let validity = quorum::validity(ttl, elapsed, self.config.drift_factor)
            .ok_or_else(|| unavailable("the session's step took longer than its TTL", vec![]))?;
        Ok(SessionLease::of(
            states,
            ttl,
            validity,
            ttl.saturating_sub(elapsed),
            at,
        ))
    }

    /// The session as a step that read it finds it: what is left of it on a majority.
    fn remaining_of(
        &self,
        states: &[SessionState],
        started: Instant,
    ) -> Result<SessionLease, EngineError> {
        let q = quorum::majority(self.nodes.len());
        let mut left: Vec<u64> = states.iter().map(|s| s.pttl_ms).collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        let pttl = Duration::from_millis(left.get(q - 1).copied().unwrap_or_default());
        let at = Instant::now();
        let elapsed = at - started;
        let ttl = Duration::from_millis(states.iter().map(|s| s.ttl_ms).max().unwrap_or_default());
        let drift = quorum::drift(ttl, self.config.drift_factor);
        let validity = pttl
            .checked_sub(elapsed + drift)
            .filter(|v| !v.is_zero())
            .ok_or(EngineError::NotFound)?;
        Ok(SessionLease::of(
            states,
            ttl,
            validity,
            pttl.saturating_sub(elapsed),
            at,
        ))
    }
}
