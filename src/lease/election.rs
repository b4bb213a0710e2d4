//! Leader election on top of leases. An election is a lock of its own kind (its keys never
//! collide with a mutex of the same name): to campaign is to be granted it, the leader's
//! value is the lease's owner text, its term is the lease's fencing token (so terms
//! strictly rise), to proclaim is to renew with a new value, to resign is to revoke.
//!
//! Observers follow who leads without polling: the event bus (fed by this replica and, via
//! the masters, by the others) says when something happened, and the observer reads the
//! leader from a majority then; it also reads when the leader's lease would lapse, which
//! is how a crashed leader's end is seen. What it reports is what a majority says, never a
//! term older than one it reported, and never a term its leader was not given: a new term
//! is read again from every master, and while they disagree on its token (the grant is
//! writing it back) the observer looks again a moment later.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::{LeaseError, LeaseService, LockHolder};
use crate::metrics::StreamKind;
use crate::model::{FencingToken, LockName};
use crate::redlock::Sighting;

/// Changes an observer may have waiting. One that falls further behind is cut off (its
/// stream ends) rather than buffered for: on reconnecting it is told the current leader.
const OBSERVE_BUFFER: usize = 16;
/// How soon an observer reads again after a read that could not reach a majority.
const RETRY_READ: Duration = Duration::from_millis(250);
/// How soon an observer reads again after finding a grant being decided: its token is
/// written back within a master's answer.
const SETTLE_PAUSE: Duration = Duration::from_millis(5);
/// Read a little after the leader's lease would lapse, so that the read finds it lapsed.
const LAPSE_MARGIN: Duration = Duration::from_millis(5);
/// The longest an observer goes without reading: announcements between replicas are best
/// effort, and one that never arrives (every master's publish lost) must cost an observer
/// a second at most, not the rest of a vacancy or of a long term.
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// A change of leadership, as an observer is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaderChange {
    /// A leader was elected for a new term.
    Elected {
        term: FencingToken,
        value: Option<String>,
    },
    /// The leader of `term` proclaimed a new value.
    Proclaimed {
        term: FencingToken,
        value: Option<String>,
    },
    /// Nobody leads; `last_term` is the term of the last leader this observer saw.
    Vacant { last_term: Option<FencingToken> },
    /// This replica is shutting down: the stream ends here (reconnect to another replica).
    ShuttingDown,
}

impl LeaseService {
    /// Follow `name`'s leadership: first the current state, then every change seen, until
    /// the receiver is dropped, it falls behind, or the process shuts down.
    pub(crate) fn observe(
        self: &Arc<Self>,
        name: LockName,
    ) -> Result<mpsc::Receiver<LeaderChange>, LeaseError> {
        self.stream(OBSERVE_BUFFER, |service, tx| service.observe_task(name, tx))
    }

    async fn observe_task(self: Arc<Self>, name: LockName, tx: mpsc::Sender<LeaderChange>) {
        let _open = self.metrics.stream_opened(StreamKind::Observe);
        // Subscribed before the first read, so that nothing happens unseen in between.
        let mut events = self.events().subscribe(&name.topic());
        let mut known = Known::default();
        loop {
            let look_again = match self.read_leader(&name, &known).await {
                // Its token is being written back: the term is not yet the leader's.
                Ok(None) => Instant::now() + SETTLE_PAUSE,
                Ok(Some(leader)) => {
                    let remaining = leader.as_ref().map(|l| l.remaining);
                    let change = known
                        .update(leader.map(|l| (l.token, l.owner.as_deref().map(str::to_owned))));
                    if let Some(change) = change
                        && tx.try_send(change).is_err()
                    {
                        return;
                    }
                    let lapse = remaining.map_or(LOOK_AT_LEAST_EVERY, |r| r + LAPSE_MARGIN);
                    Instant::now() + lapse.min(LOOK_AT_LEAST_EVERY)
                }
                Err(_) => Instant::now() + RETRY_READ,
            };
            tokio::select! {
                () = tx.closed() => return,
                () = self.shutdown.cancelled() => {
                    // Told, so that the observer reconnects rather than wonders.
                    super::hold::deliver(&tx, LeaderChange::ShuttingDown).await;
                    return;
                }
                seen = events.next() => if seen.is_none() { return },
                () = sleep_until(look_again) => {}
            }
        }
    }
}

impl LeaseService {
    /// What an observer reads: the leader (or nobody), or `None` while a new term's grant
    /// is still writing its token back. A term the observer has not told yet is read again
    /// from every master, settled (see `Redlock::sight`), so that it is never told a term
    /// its leader was not given; a proclaim or a vacancy is taken from the first majority
    /// to answer, as fast as any read, so that an observer keeps up with a leader that
    /// proclaims and resigns in quick succession.
    async fn read_leader(
        &self,
        name: &LockName,
        known: &Known,
    ) -> Result<Option<Option<LockHolder>>, LeaseError> {
        let leader = self.inspect(name).await?.into_iter().next();
        if leader.as_ref().is_some_and(|l| known.is_new(l.token)) {
            return Ok(match self.engine().sight(&name.key()).await? {
                Sighting::Settled(leader) => Some(leader.map(LockHolder::from)),
                Sighting::Unsettled => None,
            });
        }
        Ok(Some(leader))
    }
}

/// What an observer has been told so far.
#[derive(Debug, Default)]
struct Known {
    /// Nothing told yet: the first read is told whatever it finds.
    started: bool,
    /// The last leader told: its term and value.
    leader: Option<(FencingToken, Option<String>)>,
    /// The highest term told.
    last_term: Option<FencingToken>,
}

impl Known {
    /// Whether `term` is not the term of the leader told last.
    fn is_new(&self, term: FencingToken) -> bool {
        self.leader.as_ref().is_none_or(|(t, _)| *t != term)
    }

    /// The change a read of the leader (`(term, value)`, or none) makes, if any.
    fn update(&mut self, read: Option<(FencingToken, Option<String>)>) -> Option<LeaderChange> {
        let first = !std::mem::replace(&mut self.started, true);
        match read {
            // A read behind what was told already (a lagging majority): not news.
            Some((term, _)) if self.last_term.is_some_and(|t| term < t) => None,
            Some((term, value)) => {
                let change = match &self.leader {
                    Some((t, v)) if *t == term && *v == value => return None,
                    Some((t, _)) if *t == term => LeaderChange::Proclaimed {
                        term,
                        value: value.clone(),
                    },
                    _ => LeaderChange::Elected {
                        term,
                        value: value.clone(),
                    },
                };
                self.leader = Some((term, value));
                self.last_term = Some(term);
                Some(change)
            }
            None if first || self.leader.is_some() => {
                self.leader = None;
                Some(LeaderChange::Vacant {
                    last_term: self.last_term,
                })
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FencingToken;

    #[test]
    fn observers_are_told_each_change_once_and_never_an_older_term() {
        let mut k = Known::default();
        let v = |s: &str| Some(s.to_owned());
        assert_eq!(
            k.update(None),
            Some(LeaderChange::Vacant { last_term: None })
        );
        assert_eq!(k.update(None), None);
        assert_eq!(
            k.update(Some((FencingToken::new(5), v("a")))),
            Some(LeaderChange::Elected {
                term: FencingToken::new(5),
                value: v("a")
            })
        );
        assert_eq!(k.update(Some((FencingToken::new(5), v("a")))), None);
        assert_eq!(
            k.update(Some((FencingToken::new(5), v("b")))),
            Some(LeaderChange::Proclaimed {
                term: FencingToken::new(5),
                value: v("b")
            })
        );
        assert_eq!(
            k.update(Some((FencingToken::new(4), v("old")))),
            None,
            "a lagging read"
        );
        assert_eq!(
            k.update(None),
            Some(LeaderChange::Vacant {
                last_term: Some(FencingToken::new(5))
            })
        );
        assert_eq!(
            k.update(Some((FencingToken::new(9), None))),
            Some(LeaderChange::Elected {
                term: FencingToken::new(9),
                value: None
            })
        );
    }

    #[test]
    fn the_first_read_is_told_even_when_a_leader_is_there() {
        let mut k = Known::default();
        assert!(matches!(
            k.update(Some((FencingToken::new(3), None))),
            Some(LeaderChange::Elected { term, .. }) if term == 3
        ));
    }
}
