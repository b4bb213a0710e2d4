//! The arithmetic of Redlock, as pure functions over the answers in hand.
//!
//! Every decision here takes the answers received so far plus the number still pending,
//! and says either "decided" or "wait for more". That is what lets the engine answer as
//! soon as a majority outcome is known: a healthy majority never waits for the slowest
//! master, and a dead master never costs more than its timeout.

use std::time::Duration;

use super::node::{Acquired, Holding, NodeResult};

/// How many masters make a majority of `n`.
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The clock-drift allowance for a TTL: a share of it plus 2 ms for the rounding of
/// millisecond expiries on the masters.
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// How long a client may rely on a lock that was set with `ttl` by steps that took
/// `elapsed`: `ttl - elapsed - drift`, or `None` when nothing is left.
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl, drift_factor))
        .filter(|left| !left.is_zero())
}

/// The outcome of an acquire round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOutcome {
    /// A majority set the key. `token` is the largest counter value among them and
    /// `confirmed` how many of them already hold exactly that value.
    Won { token: u64, confirmed: usize },
    /// Other leases hold the key on enough masters that no majority is possible;
    /// `retry_after` is when enough of their keys expire for a majority to be free again.
    Held { retry_after: Duration },
    /// Too many masters failed to answer (or are not voting) for any majority.
    Unavailable,
}

/// Decide an acquire round, or `None` while the pending answers could still change it.
pub fn decide_grant(replies: &[Option<NodeResult<Acquired>>]) -> Option<GrantOutcome> {
    let n = replies.len();
    let q = majority(n);
    let mut tokens = Vec::new();
    let mut held = Vec::new();
    let mut failed = 0;
    let mut pending = 0;
    for reply in replies {
        match reply {
            None => pending += 1,
            Some(Ok(Acquired::Granted { token })) => tokens.push(*token),
            Some(Ok(Acquired::Held { pttl_ms })) => held.push(*pttl_ms),
            Some(Err(_)) => failed += 1,
        }
    }
    if tokens.len() >= q {
        let token = tokens.iter().copied().max().unwrap_or_default();
        let confirmed = tokens.iter().filter(|t| **t == token).count();
        return Some(GrantOutcome::Won { token, confirmed });
    }
    if tokens.len() + pending >= q {
        return None;
    }
    if failed > n - q {
        return Some(GrantOutcome::Unavailable);
    }
    // Holders and failures together block a majority, neither alone (yet): the answers
    // still pending decide whether this is contention or an outage.
    if held.len() <= n - q && pending > 0 {
        return None;
    }
    // Here held + failed > n - q with failed <= n - q, so some lease holds the key. The
    // lock frees once enough held keys expire that the free masters form a majority.
    held.sort_unstable();
    let must_expire = (q + failed + held.len()).saturating_sub(n).max(1);
    let retry_after = held.get(must_expire - 1).copied().unwrap_or_default();
    Some(GrantOutcome::Held {
        retry_after: Duration::from_millis(retry_after),
    })
}

/// The outcome of a step that changes an existing lease (renew, release).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedOutcome<T> {
    /// A majority did it; their answers.
    Done(Vec<T>),
    /// A majority said the lease does not hold the lock.
    NotOwner,
    Unavailable,
}

/// Decide a renew round: it needs a majority of masters to extend the lease.
pub fn decide_owned<T: Clone>(
    replies: &[Option<NodeResult<super::node::Owned<T>>>],
) -> Option<OwnedOutcome<T>> {
    use super::node::Owned;
    let n = replies.len();
    let q = majority(n);
    let mut done = Vec::new();
    let (mut not_owner, mut pending) = (0, 0);
    for reply in replies {
        match reply {
            None => pending += 1,
            Some(Ok(Owned::Yes(v))) => done.push(v.clone()),
            Some(Ok(Owned::NotOwner)) => not_owner += 1,
            Some(Err(_)) => {}
        }
    }
    if done.len() >= q {
        return Some(OwnedOutcome::Done(done));
    }
    if done.len() + pending >= q {
        return None;
    }
    // Only when a majority deny the lease is it gone for good; otherwise the masters that
    // did not answer may still hold it, and the client may retry within its validity.
    if not_owner > n - q {
        return Some(OwnedOutcome::NotOwner);
    }
    Some(OwnedOutcome::Unavailable)
}

/// The outcome of a release round, which waits for every master (each one it cannot
/// reach keeps the key until its TTL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease is gone from a majority, and was deleted from at least one master.
    Released,
    /// A majority said the lease does not hold the lock, and no master deleted it.
    NotFound,
    Unavailable,
}

pub fn decide_release(replies: &[NodeResult<super::node::Owned<()>>]) -> ReleaseOutcome {
    use super::node::Owned;
    let q = majority(replies.len());
    let deleted = replies
        .iter()
        .filter(|r| matches!(r, Ok(Owned::Yes(()))))
        .count();
    let not_owner = replies
        .iter()
        .filter(|r| matches!(r, Ok(Owned::NotOwner)))
        .count();
    if deleted > 0 && deleted + not_owner >= q {
        ReleaseOutcome::Released
    } else if deleted == 0 && not_owner > replies.len() - q {
        ReleaseOutcome::NotFound
    } else {
        ReleaseOutcome::Unavailable
    }
}

/// What a majority of masters agree a lock's holder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub lease: String,
    pub token: u64,
    pub ttl_ms: u64,
    /// When the holding stops being on a majority: the majority-th longest remaining TTL.
    pub pttl_ms: u64,
    pub owner: Option<String>,
}

/// The outcome of reading a lock from every master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    Held(Agreed),
    /// No lease holds the lock on a majority (free, or held only on a minority).
    Free,
    /// Too few answers to tell, or the holders disagree on the token.
    Unavailable,
}

/// Decide a read: a lease is the holder when a majority hold it, and its token is the
/// value a majority report. `only` restricts the question to one lease (a lease check).
pub fn decide_read(
    replies: &[Option<NodeResult<Option<Holding>>>],
    only: Option<&str>,
) -> Option<ReadOutcome> {
    let n = replies.len();
    let q = majority(n);
    let pending = replies.iter().filter(|r| r.is_none()).count();
    let answered: Vec<Option<&Holding>> = replies
        .iter()
        .filter_map(|r| match r {
            Some(Ok(h)) => Some(h.as_ref().filter(|h| only.is_none_or(|l| h.lease == l))),
            _ => None,
        })
        .collect();
    let holders = |lease: &str| -> Vec<&Holding> {
        answered
            .iter()
            .flatten()
            .filter(|h| h.lease == lease)
            .copied()
            .collect()
    };
    // The candidate is the lease reported most often; only it can reach a majority.
    let mut candidate: Option<(&str, usize)> = None;
    for h in answered.iter().flatten() {
        let count = holders(&h.lease).len();
        if candidate.is_none_or(|(_, c)| count > c) {
            candidate = Some((&h.lease, count));
        }
    }
    let (lease, count) = candidate.unwrap_or(("", 0));
    if count >= q {
        let mut hs = holders(lease);
        return Some(match agree_on_token(&hs, q) {
            Some(token) => {
                hs.sort_by_key(|h| std::cmp::Reverse(h.pttl_ms));
                let agreed = hs.iter().find(|h| h.token == token).copied();
                let first = agreed.unwrap_or(hs[0]);
                ReadOutcome::Held(Agreed {
                    lease: lease.to_owned(),
                    token,
                    ttl_ms: first.ttl_ms,
                    pttl_ms: hs[q - 1].pttl_ms,
                    owner: first.owner.clone(),
                })
            }
            None if pending > 0 => return None,
            None => ReadOutcome::Unavailable,
        });
    }
    // Masters that failed to answer may hold the lease too: it is free only if even they
    // could not make up a majority with those that do.
    let unknown = n - answered.len();
    if count + unknown < q {
        return Some(ReadOutcome::Free);
    }
    if pending > 0 {
        return None;
    }
    Some(ReadOutcome::Unavailable)
}

/// The token that a majority of all masters report for a lease, if there is one. A grant
/// is only answered once a majority hold its token, so a majority read finds it unless a
/// master that missed the confirmation answers in place of one that had it.
fn agree_on_token(holders: &[&Holding], q: usize) -> Option<u64> {
    holders
        .iter()
        .map(|h| h.token)
        .find(|t| holders.iter().filter(|h| h.token == *t).count() >= q)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::node::{NodeError, Owned};

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn majority_of_n() {
        assert_eq!([1, 2, 3, 4, 5, 6, 7].map(majority), [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        // 10 s TTL, 1% drift = 100 ms + 2 ms; 30 ms elapsed.
        assert_eq!(validity(ms(10_000), ms(30), 0.01), Some(ms(9_868)));
        assert_eq!(validity(ms(100), ms(97), 0.01), None);
        assert_eq!(validity(ms(100), ms(200), 0.01), None);
        assert_eq!(validity(ms(100), ms(0), 0.0), Some(ms(98)));
    }

    fn granted(t: u64) -> Option<NodeResult<Acquired>> {
        Some(Ok(Acquired::Granted { token: t }))
    }
    fn held(p: u64) -> Option<NodeResult<Acquired>> {
        Some(Ok(Acquired::Held { pttl_ms: p }))
    }
    fn down<T>() -> Option<NodeResult<T>> {
        Some(Err(NodeError::Timeout))
    }

    #[test]
    fn grant_decides_as_soon_as_a_majority_answers() {
        assert_eq!(
            decide_grant(&[granted(5), granted(5), None]),
            Some(GrantOutcome::Won {
                token: 5,
                confirmed: 2
            })
        );
        assert_eq!(decide_grant(&[granted(5), None, None]), None);
        assert_eq!(
            decide_grant(&[granted(7), granted(5), None]),
            Some(GrantOutcome::Won {
                token: 7,
                confirmed: 1
            })
        );
    }

    #[test]
    fn grant_tells_held_from_unavailable() {
        assert_eq!(
            decide_grant(&[held(900), held(1000), None]),
            Some(GrantOutcome::Held {
                retry_after: ms(900)
            })
        );
        // One holder and one failure: the holder alone could not block, but together
        // they do; the lock frees when the one held key expires.
        assert_eq!(
            decide_grant(&[held(400), down(), granted(1)]),
            Some(GrantOutcome::Held {
                retry_after: ms(400)
            })
        );
        // ...but while the third may still fail too, it is not yet contention.
        assert_eq!(decide_grant(&[held(400), down(), None]), None);
        assert_eq!(
            decide_grant(&[down(), down(), None]),
            Some(GrantOutcome::Unavailable)
        );
        assert_eq!(
            decide_grant(&[down(), down(), held(10)]),
            Some(GrantOutcome::Unavailable)
        );
        // Five masters, three held: two must expire before three are free.
        assert_eq!(
            decide_grant(&[held(300), held(100), held(200), granted(1), granted(1)]),
            Some(GrantOutcome::Held {
                retry_after: ms(100)
            })
        );
        assert_eq!(
            decide_grant(&[held(300), held(100), held(200), held(50), granted(1)]),
            Some(GrantOutcome::Held {
                retry_after: ms(100)
            })
        );
    }

    #[test]
    fn renew_needs_a_majority_of_owners() {
        let yes = |v: u64| Some(Ok(Owned::Yes(v)));
        let no = || Some(Ok(Owned::<u64>::NotOwner));
        assert_eq!(
            decide_owned(&[yes(1), yes(1), None]),
            Some(OwnedOutcome::Done(vec![1, 1]))
        );
        assert_eq!(decide_owned(&[yes(1), no(), None]), None);
        assert_eq!(
            decide_owned(&[no(), no(), None]),
            Some(OwnedOutcome::NotOwner)
        );
        assert_eq!(
            decide_owned(&[no(), down(), yes(1)]),
            Some(OwnedOutcome::Unavailable)
        );
        assert_eq!(
            decide_owned(&[down(), down(), yes(1)]),
            Some(OwnedOutcome::Unavailable)
        );
    }

    #[test]
    fn release_outcomes() {
        let yes = || Ok(Owned::Yes(()));
        let no = || Ok(Owned::NotOwner);
        let err = || Err(NodeError::Timeout);
        assert_eq!(
            decide_release(&[yes(), yes(), yes()]),
            ReleaseOutcome::Released
        );
        assert_eq!(
            decide_release(&[yes(), no(), err()]),
            ReleaseOutcome::Released
        );
        assert_eq!(
            decide_release(&[no(), no(), err()]),
            ReleaseOutcome::NotFound
        );
        assert_eq!(
            decide_release(&[yes(), err(), err()]),
            ReleaseOutcome::Unavailable
        );
        assert_eq!(
            decide_release(&[no(), err(), err()]),
            ReleaseOutcome::Unavailable
        );
    }

    fn holding(lease: &str, token: u64, pttl: u64) -> Option<NodeResult<Option<Holding>>> {
        Some(Ok(Some(Holding {
            lease: lease.into(),
            token,
            ttl_ms: 1000,
            pttl_ms: pttl,
            owner: None,
        })))
    }

    #[test]
    fn read_finds_the_majority_holder_and_its_token() {
        let outcome = decide_read(&[holding("a", 4, 900), holding("a", 4, 800), None], None);
        match outcome {
            Some(ReadOutcome::Held(agreed)) => {
                assert_eq!((agreed.lease.as_str(), agreed.token), ("a", 4));
                assert_eq!(agreed.pttl_ms, 800);
            }
            other => panic!("unexpected {other:?}"),
        }
        let free = Some(Ok(None));
        assert_eq!(
            decide_read(&[holding("a", 4, 900), free.clone(), free.clone()], None),
            Some(ReadOutcome::Free)
        );
        assert_eq!(
            decide_read(&[holding("a", 4, 900), free.clone(), None], None),
            None
        );
        assert_eq!(
            decide_read(
                &[holding("a", 4, 900), holding("a", 4, 900), free],
                Some("b")
            ),
            Some(ReadOutcome::Free)
        );
        assert_eq!(
            decide_read(&[holding("a", 4, 900), down(), down()], None),
            Some(ReadOutcome::Unavailable)
        );
        // The failed master may be the second holder: cannot tell.
        assert_eq!(
            decide_read(&[holding("a", 4, 900), down(), Some(Ok(None))], None),
            Some(ReadOutcome::Unavailable)
        );
        assert_eq!(
            decide_read(&[Some(Ok(None)), down(), Some(Ok(None))], None),
            Some(ReadOutcome::Free)
        );
    }

    #[test]
    fn read_needs_a_majority_to_agree_on_the_token() {
        // The third master may still send the missing vote.
        assert_eq!(
            decide_read(&[holding("a", 4, 900), holding("a", 9, 900), None], None),
            None
        );
        assert_eq!(
            decide_read(&[holding("a", 4, 900), holding("a", 9, 900), down()], None),
            Some(ReadOutcome::Unavailable)
        );
        match decide_read(
            &[
                holding("a", 4, 900),
                holding("a", 9, 900),
                holding("a", 4, 700),
            ],
            None,
        ) {
            Some(ReadOutcome::Held(agreed)) => assert_eq!(agreed.token, 4),
            other => panic!("unexpected {other:?}"),
        }
    }
}
