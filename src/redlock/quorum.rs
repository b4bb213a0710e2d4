//! The arithmetic of Redlock, as pure functions over the answers in hand.
//!
//! Every decision here takes the answers received so far plus the number still pending,
//! and says either "decided" or "wait for more". That is what lets the engine answer as
//! soon as a majority outcome is known: a healthy majority never waits for the slowest
//! master, and a dead master never costs more than its timeout.

use std::time::Duration;

use std::collections::BTreeMap;

use crate::store::node::{Acquired, Holding, ListPage, NodeResult};

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
    /// Another lease holds the key on a majority (or may, counting the masters that did not
    /// answer); `retry_after` is when enough of its keys expire for a majority to be free.
    Held { retry_after: Duration },
    /// No majority for anyone: simultaneous contenders each hold a minority, and every one
    /// of them is about to release what it won. Not a holder to wait for.
    Split,
    /// Too many masters failed to answer (or are not voting) for any majority.
    Unavailable,
    /// A master has the grant's Idempotency-Key on record for another request.
    Mismatch,
    /// A majority say the Idempotency-Key's lease held the lock and has ended.
    Ended,
    /// The lock is free, but an ended lease's lock-delay refuses it on a majority (or may,
    /// counting the masters that did not answer) until `retry_after`.
    Delayed { retry_after: Duration },
}

/// What a master's lock-delay counts as in the tally of holders: a holder of its own, which
/// no lease id can spell (lease ids are URL-safe).
const DELAY: &str = " delay";

/// Decide an acquire round, or `None` while the pending answers could still change it.
pub fn decide_grant(replies: &[Option<NodeResult<Acquired>>]) -> Option<GrantOutcome> {
    let n = replies.len();
    let q = majority(n);
    let mut tokens = Vec::new();
    let mut held: Vec<(&str, u64)> = Vec::new();
    let mut failed = 0;
    let mut pending = 0;
    let mut ended = 0;
    for reply in replies {
        match reply {
            None => pending += 1,
            Some(Ok(Acquired::Granted { token })) => tokens.push(*token),
            Some(Ok(Acquired::Held { pttl_ms, lease })) => held.push((lease, *pttl_ms)),
            Some(Ok(Acquired::Delayed { pttl_ms })) => held.push((DELAY, *pttl_ms)),
            // The key's record is the client's own request, on any master: no vote changes it.
            Some(Ok(Acquired::Mismatch)) => return Some(GrantOutcome::Mismatch),
            // A minority's record may be a failed attempt's that its clean-up missed; only a
            // majority's says the lease was granted and has ended.
            Some(Ok(Acquired::Ended)) => ended += 1,
            Some(Err(_)) => failed += 1,
        }
    }
    if tokens.len() >= q {
        let token = tokens.iter().copied().max().unwrap_or_default();
        let confirmed = tokens.iter().filter(|t| **t == token).count();
        return Some(GrantOutcome::Won { token, confirmed });
    }
    if ended >= q {
        return Some(GrantOutcome::Ended);
    }
    if tokens.len() + pending >= q || ended + pending >= q {
        return None;
    }
    if failed > n - q {
        return Some(GrantOutcome::Unavailable);
    }
    // This grant cannot win. The question left is whether someone holds the lock.
    let mut holder: Option<(&str, usize)> = None;
    for (lease, _) in &held {
        let count = held.iter().filter(|(l, _)| l == lease).count();
        if holder.is_none_or(|(_, c)| count > c) {
            holder = Some((lease, count));
        }
    }
    let Some((lease, count)) = holder else {
        // Nobody holds it anywhere: only failures stand in the way, and they are too few
        // for an outage. The pending answers decide.
        return if pending > 0 {
            None
        } else {
            Some(GrantOutcome::Unavailable)
        };
    };
    if count + failed + pending < q {
        return Some(GrantOutcome::Split);
    }
    if count < q && pending > 0 {
        return None;
    }
    // `lease` holds a majority, or may with the masters that failed. The lock frees when
    // enough of its keys expire that the other masters that answer form a majority.
    let mut pttls: Vec<u64> = held
        .iter()
        .filter(|(l, _)| *l == lease)
        .map(|(_, p)| *p)
        .collect();
    pttls.sort_unstable();
    let must_expire = (count + failed + q).saturating_sub(n).max(1);
    let retry_after =
        Duration::from_millis(pttls.get(must_expire - 1).copied().unwrap_or_default());
    if lease == DELAY {
        return Some(GrantOutcome::Delayed { retry_after });
    }
    Some(GrantOutcome::Held { retry_after })
}

/// Decide a confirm round: `true` once a majority hold the token, `false` once they
/// cannot, `None` while the pending answers could still make a majority.
pub fn decide_confirm(replies: &[Option<NodeResult<()>>]) -> Option<bool> {
    let q = majority(replies.len());
    let ok = replies.iter().filter(|r| matches!(r, Some(Ok(())))).count();
    let open = replies.iter().filter(|r| r.is_none()).count();
    (ok >= q || ok + open < q).then_some(ok >= q)
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
    replies: &[Option<NodeResult<crate::store::node::Owned<T>>>],
) -> Option<OwnedOutcome<T>> {
    use crate::store::node::Owned;
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

/// Decide a renew round as `decide_owned` does, except that while the masters that renewed
/// disagree on the lease's token and others have still to answer, it waits for them: a
/// master whose acquire answered after its grant was decided holds the lease with its own
/// counter until its backlog writes the grant's token there, and may answer first.
pub fn decide_renew(
    replies: &[Option<NodeResult<crate::store::node::Owned<Holding>>>],
) -> Option<OwnedOutcome<Holding>> {
    let outcome = decide_owned(replies)?;
    if let OwnedOutcome::Done(holdings) = &outcome
        && agree(holdings, replies.len()).is_none()
        && replies.iter().any(Option::is_none)
    {
        return None;
    }
    Some(outcome)
}

/// What a session renew's answers say of each hold attached to the session. A hold is
/// only ever taken from its holder on positive evidence: a majority of all masters must
/// deny carrying it before it counts as lost (and is released). A carrier that did not
/// answer (down, paused, partitioned, unverified, slower than the timeout) denies nothing:
/// it may still carry the hold, and so may the keys a previous answer promised a validity
/// on, so such a hold is only unconfirmed: kept where it is, not extended in the holder's
/// eyes, and judged again by the next renew.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionVerdicts {
    /// Carried (and extended) by a majority of all masters: valid as long as the session.
    pub kept: Vec<String>,
    /// Carried by fewer than a majority, and denied by fewer than a majority: its validity
    /// is not extended (what the last answer that kept it promised still holds).
    pub unconfirmed: Vec<String>,
    /// Denied by a majority of all masters (they have the session and not the hold): it has
    /// ended, as a lease whose renew a majority denied has.
    pub lost: Vec<String>,
}

/// Judge every hold that any answer names (carried, or found gone) by `states`, the
/// answers of the masters that renewed the session, out of `n` masters. Each list is in
/// the order the holds were first named.
pub fn judge_session_holds(
    states: &[crate::store::node::SessionState],
    n: usize,
) -> SessionVerdicts {
    let q = majority(n);
    let mut verdicts = SessionVerdicts::default();
    let mut seen: Vec<&str> = Vec::new();
    for lease in states
        .iter()
        .flat_map(|s| s.carried.iter().chain(&s.dropped))
    {
        if seen.contains(&lease.as_str()) {
            continue;
        }
        seen.push(lease);
        let carried = states.iter().filter(|s| s.carried.contains(lease)).count();
        // A master that has the session and does not carry the hold denies it, whether it
        // found the hold gone or never had it (its grant did not reach that master).
        let denied = states.len() - carried;
        let list = if carried >= q {
            &mut verdicts.kept
        } else if denied >= q {
            &mut verdicts.lost
        } else {
            &mut verdicts.unconfirmed
        };
        list.push(lease.clone());
    }
    verdicts
}

/// Decide a session's renew as `decide_owned` does, except that while some hold is neither
/// kept nor denied by a majority and others have still to answer, it waits for them: a
/// hold whose grant reached the masters that answer last is not left unconfirmed for their
/// slowness (each answer is bounded by the master timeout).
pub fn decide_session_renew(
    replies: &[Option<NodeResult<crate::store::node::Owned<crate::store::node::SessionState>>>],
) -> Option<OwnedOutcome<crate::store::node::SessionState>> {
    let outcome = decide_owned(replies)?;
    if let OwnedOutcome::Done(states) = &outcome
        && replies.iter().any(Option::is_none)
        && !judge_session_holds(states, replies.len())
            .unconfirmed
            .is_empty()
    {
        return None;
    }
    Some(outcome)
}

/// The outcome of a release round. It is decided as soon as the answers in hand decide it:
/// a master still silent then has its release finished (and repeated) by its backlog, and
/// keeps the key until that lands or the TTL ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was deleted from a majority: it held the lock, and no longer does.
    Released,
    /// The lease does not hold the lock on a majority (expired, revoked, never granted);
    /// whatever leftovers a minority had were deleted.
    NotFound,
    /// Too few answers to tell.
    Unavailable,
}

/// Decide a release from the answers so far (`None`: not answered yet); `None` while the
/// missing answers could still change the outcome.
pub fn decide_release(
    replies: &[Option<NodeResult<crate::store::node::Owned<()>>>],
) -> Option<ReleaseOutcome> {
    use crate::store::node::Owned;
    let q = majority(replies.len());
    let deleted = replies
        .iter()
        .filter(|r| matches!(r, Some(Ok(Owned::Yes(())))))
        .count();
    let unknown = replies.iter().filter(|r| matches!(r, Some(Err(_)))).count();
    let pending = replies.iter().filter(|r| r.is_none()).count();
    if deleted >= q {
        Some(ReleaseOutcome::Released)
    } else if deleted + unknown + pending < q {
        Some(ReleaseOutcome::NotFound)
    } else if pending > 0 {
        None
    } else {
        Some(ReleaseOutcome::Unavailable)
    }
}

/// What a majority of masters agree a lock's holder is: a holding whose `pttl_ms` is when
/// it stops being on a majority (the majority-th longest remaining TTL).
pub type Agreed = Holding;

/// The outcome of reading a lock from every master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    Held(Agreed),
    /// No lease holds the lock on a majority (free, or held only on a minority).
    Free,
    /// Too few answers to tell, or the holders disagree on the token.
    Unavailable,
    /// A lease holds a majority, but the masters that hold it report different tokens: its
    /// grant is still writing its token back (or settling a master that answered late), so
    /// the token a majority report may not be the one the grant was given.
    Unsettled,
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

/// Decide a read for an observer, which must never report a term its leader was not
/// given: every master's answer is awaited, and a lease whose holders report different
/// tokens is `Unsettled` (a grant decided on the first answers may still raise the token
/// of the masters that answered them, and only after that is it answered).
pub fn decide_settled_read(replies: &[Option<NodeResult<Option<Holding>>>]) -> Option<ReadOutcome> {
    if replies.iter().any(Option::is_none) {
        return None;
    }
    match decide_read(replies, None)? {
        ReadOutcome::Held(agreed) => {
            let disagree = replies
                .iter()
                .flatten()
                .flatten()
                .flatten()
                .any(|h| h.lease == agreed.lease && h.token != agreed.token);
            Some(if disagree {
                ReadOutcome::Unsettled
            } else {
                ReadOutcome::Held(agreed)
            })
        }
        other => Some(other),
    }
}

/// One merged page of held locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// The names a majority hold, with what they agree on, in name order.
    pub held: Vec<(String, Agreed)>,
    /// The name to continue after, when more may follow.
    pub next: Option<String>,
}

/// Merge one page of held locks from every master: the names a majority hold, in name
/// order, at most `limit`, and the cursor to continue after (`None` when nothing is left).
/// `None` when fewer than a majority answered.
///
/// A master that stopped early has told us nothing past the last name it looked at, so the
/// page ends there: a lock is never skipped because one master's page was shorter.
pub fn merge_pages(pages: &[NodeResult<ListPage>], limit: usize) -> Option<Merged> {
    let q = majority(pages.len());
    if pages.iter().filter(|p| p.is_ok()).count() < q {
        return None;
    }
    let bound: Option<&str> = pages
        .iter()
        .filter_map(|p| p.as_ref().ok())
        .filter(|p| p.more)
        .filter_map(|p| p.last.as_deref())
        .min();
    let blank: Vec<Option<NodeResult<Option<Holding>>>> = pages
        .iter()
        .map(|p| Some(p.as_ref().map(|_| None).map_err(Clone::clone)))
        .collect();
    let mut by_name = BTreeMap::<&str, Vec<_>>::new();
    for (i, page) in pages.iter().enumerate() {
        let Ok(page) = page else { continue };
        for (name, holding) in &page.locks {
            if bound.is_some_and(|b| name.as_str() > b) {
                continue;
            }
            by_name.entry(name).or_insert_with(|| blank.clone())[i] =
                Some(Ok(Some(holding.clone())));
        }
    }
    let mut held: Vec<(String, Agreed)> = by_name
        .into_iter()
        .filter_map(|(name, replies)| match decide_read(&replies, None) {
            Some(ReadOutcome::Held(agreed)) => Some((name.to_owned(), agreed)),
            _ => None,
        })
        .collect();
    let next = if held.len() > limit {
        held.truncate(limit);
        held.last().map(|(name, _)| name.clone())
    } else {
        bound.map(str::to_owned)
    };
    Some(Merged { held, next })
}

/// What a majority of `n` masters agree on, given the holdings of those that renewed a lease
/// (the others count as not holding it).
pub fn agree(holdings: &[Holding], n: usize) -> Option<Agreed> {
    let mut replies: Vec<Option<NodeResult<Option<Holding>>>> =
        holdings.iter().map(|h| Some(Ok(Some(h.clone())))).collect();
    replies.resize_with(n.max(holdings.len()), || Some(Ok(None)));
    match decide_read(&replies, None) {
        Some(ReadOutcome::Held(agreed)) => Some(agreed),
        _ => None,
    }
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
    use crate::store::node::{NodeError, Owned};

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
        held_by("L", p)
    }
    fn held_by(lease: &str, p: u64) -> Option<NodeResult<Acquired>> {
        Some(Ok(Acquired::Held {
            pttl_ms: p,
            lease: lease.into(),
        }))
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
    fn a_split_vote_is_not_a_holder() {
        // Three contenders, one master each: nobody holds a majority, nobody waits for a TTL.
        assert_eq!(
            decide_grant(&[granted(4), held_by("B", 30_000), held_by("C", 30_000)]),
            Some(GrantOutcome::Split)
        );
        // Five masters, two contenders with two each and this grant with one.
        assert_eq!(
            decide_grant(&[
                granted(1),
                held_by("B", 9_000),
                held_by("B", 9_000),
                held_by("C", 9_000),
                held_by("C", 9_000),
            ]),
            Some(GrantOutcome::Split)
        );
        // The third answer may make B a majority holder: wait for it.
        assert_eq!(
            decide_grant(&[held_by("B", 500), held_by("C", 900), None]),
            None
        );
        assert_eq!(
            decide_grant(&[held_by("B", 500), held_by("C", 900), held_by("B", 700)]),
            Some(GrantOutcome::Held {
                retry_after: ms(500)
            })
        );
        // A failed master may be B's second key: B may hold the lock.
        assert_eq!(
            decide_grant(&[held_by("B", 500), down(), granted(3)]),
            Some(GrantOutcome::Held {
                retry_after: ms(500)
            })
        );
    }

    #[test]
    fn a_renew_whose_first_answers_disagree_on_the_token_waits_for_the_rest() {
        let renewed = |token: u64| {
            Some(Ok(Owned::Yes(Holding {
                lease: "a".into(),
                token,
                ttl_ms: 1000,
                pttl_ms: 1000,
                owner: None,
            })))
        };
        // The second master's late acquire has not been given the grant's token 9 yet.
        assert_eq!(decide_renew(&[renewed(9), renewed(7), None]), None);
        match decide_renew(&[renewed(9), renewed(7), renewed(9)]) {
            Some(OwnedOutcome::Done(holdings)) => {
                assert_eq!(agree(&holdings, 3).map(|a| a.token), Some(9));
            }
            other => panic!("unexpected {other:?}"),
        }
        // Nothing more will come: decided as before (the engine answers 503).
        assert!(matches!(
            decide_renew(&[renewed(9), renewed(7), down()]),
            Some(OwnedOutcome::Done(_))
        ));
        assert!(matches!(
            decide_renew(&[renewed(9), renewed(9), None]),
            Some(OwnedOutcome::Done(_))
        ));
    }

    #[test]
    fn confirm_is_decided_by_a_majority() {
        let ok = || Some(Ok(()));
        assert_eq!(decide_confirm(&[ok(), ok(), None]), Some(true));
        assert_eq!(decide_confirm(&[ok(), None, None]), None);
        assert_eq!(decide_confirm(&[ok(), down(), None]), None);
        assert_eq!(decide_confirm(&[ok(), down(), down()]), Some(false));
    }

    #[test]
    fn renew_needs_a_majority_of_owners() {
        let yes = |v: u64| Some(Ok(Owned::Yes(v)));
        let no = || Some(Ok(Owned::<u64>::NotOwner));
        let done = Some(OwnedOutcome::Done(vec![1, 1]));
        let not_owner = Some(OwnedOutcome::NotOwner);
        let unavailable = Some(OwnedOutcome::Unavailable);
        assert_eq!(decide_owned(&[yes(1), yes(1), None]), done);
        assert_eq!(decide_owned(&[yes(1), no(), None]), None);
        assert_eq!(decide_owned(&[no(), no(), None]), not_owner);
        assert_eq!(decide_owned(&[no(), down(), yes(1)]), unavailable);
        assert_eq!(decide_owned(&[down(), down(), yes(1)]), unavailable);
    }

    #[test]
    fn release_outcomes() {
        let yes = || Some(Ok(Owned::Yes(())));
        let no = || Some(Ok(Owned::NotOwner));
        let err = || Some(Err(NodeError::Timeout));
        let silent = || None;
        let released = Some(ReleaseOutcome::Released);
        let not_found = Some(ReleaseOutcome::NotFound);
        let unavailable = Some(ReleaseOutcome::Unavailable);
        assert_eq!(decide_release(&[yes(), yes(), yes()]), released);
        assert_eq!(decide_release(&[yes(), yes(), err()]), released);
        // A majority deleted it: the silent master's release is the backlog's business.
        assert_eq!(decide_release(&[yes(), yes(), silent()]), released);
        // A leftover on one master is deleted, but the lease held no majority: 404.
        assert_eq!(decide_release(&[yes(), no(), no()]), not_found);
        assert_eq!(decide_release(&[no(), no(), silent()]), not_found);
        // The master that did not answer may make it a majority: cannot tell.
        assert_eq!(decide_release(&[yes(), no(), err()]), unavailable);
        assert_eq!(decide_release(&[yes(), no(), silent()]), None);
        assert_eq!(decide_release(&[no(), no(), err()]), not_found);
        assert_eq!(decide_release(&[yes(), err(), err()]), unavailable);
        assert_eq!(decide_release(&[no(), err(), err()]), unavailable);
        assert_eq!(decide_release(&[yes(), silent(), silent()]), None);
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

    fn page(names: &[&str], more: bool) -> NodeResult<ListPage> {
        let Some(Ok(Some(h))) = holding("a", 4, 900) else {
            unreachable!()
        };
        Ok(ListPage {
            locks: names.iter().map(|n| (n.to_string(), h.clone())).collect(),
            more,
            last: names.last().map(|n| n.to_string()),
        })
    }

    fn names(merged: &Merged) -> Vec<&str> {
        merged.held.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn pages_merge_by_majority_and_never_skip_a_name() {
        // Every master listed everything: the majority's names, no cursor.
        let merged = merge_pages(
            &[
                page(&["a", "b"], false),
                page(&["a"], false),
                page(&["b"], false),
            ],
            10,
        )
        .unwrap();
        assert_eq!(
            (names(&merged), merged.next.as_deref()),
            (vec!["a", "b"], None)
        );
        // The second master stopped at "b": nothing past it is known yet, "c" waits for
        // the next page even though two masters listed it.
        let merged = merge_pages(
            &[
                page(&["a", "c"], false),
                page(&["a", "b"], true),
                page(&["a", "c"], false),
            ],
            10,
        )
        .unwrap();
        assert_eq!(
            (names(&merged), merged.next.as_deref()),
            (vec!["a"], Some("b"))
        );
        // A full page continues after its last name.
        let merged = merge_pages(
            &[
                page(&["a", "b", "c"], false),
                page(&["a", "b", "c"], false),
                Err(NodeError::Timeout),
            ],
            2,
        )
        .unwrap();
        assert_eq!(
            (names(&merged), merged.next.as_deref()),
            (vec!["a", "b"], Some("b"))
        );
        assert_eq!(
            merge_pages(
                &[
                    page(&["a"], false),
                    Err(NodeError::Timeout),
                    Err(NodeError::Timeout)
                ],
                2
            ),
            None
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

    #[test]
    fn an_observers_read_waits_for_every_master_and_for_the_token_to_settle() {
        // A majority agree on token 4, but the third master holds the same lease with 9: its
        // grant may have chosen 9 and be writing it back. Never report 4 as its term.
        let deciding = [
            holding("a", 4, 900),
            holding("a", 4, 900),
            holding("a", 9, 900),
        ];
        assert_eq!(decide_settled_read(&deciding), Some(ReadOutcome::Unsettled));
        assert_eq!(
            decide_settled_read(&[holding("a", 4, 900), holding("a", 4, 900), None]),
            None,
            "the third master may hold it with another token"
        );
        match decide_settled_read(&[holding("a", 9, 900), holding("a", 9, 900), down()]) {
            Some(ReadOutcome::Held(agreed)) => assert_eq!(agreed.token, 9),
            other => panic!("unexpected {other:?}"),
        }
        let free = Some(Ok(None));
        assert_eq!(
            decide_settled_read(&[holding("a", 9, 900), free.clone(), free]),
            Some(ReadOutcome::Free)
        );
    }

    /// A master's answer to a session renew: the holds it carried and those it found gone.
    fn session(carried: &[&str], dropped: &[&str]) -> crate::store::node::SessionState {
        crate::store::node::SessionState {
            carried: carried.iter().map(|l| l.to_string()).collect(),
            dropped: dropped.iter().map(|l| l.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_session_hold_is_lost_only_when_a_majority_deny_it() {
        let names = |v: &[&str]| v.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        // (answers of the masters that renewed, out of n) => (kept, unconfirmed, lost)
        type Case<'a> = (
            Vec<crate::store::node::SessionState>,
            usize,
            [&'a [&'a str]; 3],
        );
        let cases: Vec<Case> = vec![
            // Carried by two of three: kept, whoever else answered.
            (
                vec![session(&["h"], &[]), session(&["h"], &[])],
                3,
                [&["h"], &[], &[]],
            ),
            // One carrier answered, the other did not; the third never had it: unconfirmed.
            (
                vec![session(&["h"], &[]), session(&[], &[])],
                3,
                [&[], &["h"], &[]],
            ),
            // One carrier answered, the other found it gone: with the third, a majority deny.
            (
                vec![
                    session(&["h"], &[]),
                    session(&[], &["h"]),
                    session(&[], &[]),
                ],
                3,
                [&[], &[], &["h"]],
            ),
            // Gone from both answering masters (the third silent): a majority deny.
            (
                vec![session(&[], &["h"]), session(&[], &["h"])],
                3,
                [&[], &[], &["h"]],
            ),
            // Five masters, three answered: two carry it, one denies; two silent.
            (
                vec![
                    session(&["h"], &[]),
                    session(&["h"], &[]),
                    session(&[], &[]),
                ],
                5,
                [&[], &["h"], &[]],
            ),
        ];
        for (i, (states, n, [kept, unconfirmed, lost])) in cases.into_iter().enumerate() {
            let verdicts = judge_session_holds(&states, n);
            assert_eq!(verdicts.kept, names(kept), "case {i}");
            assert_eq!(verdicts.unconfirmed, names(unconfirmed), "case {i}");
            assert_eq!(verdicts.lost, names(lost), "case {i}");
        }
    }

    #[test]
    fn a_session_renew_waits_for_a_silent_carrier_only_while_a_hold_is_undecided() {
        use crate::store::node::Owned;
        let yes = |s| Some(Ok(Owned::Yes(s)));
        // A carries h, C answered without it, B silent: B decides whether h is kept.
        assert_eq!(
            decide_session_renew(&[yes(session(&["h"], &[])), None, yes(session(&[], &[]))]),
            None
        );
        // A and C both carry it: kept whatever B says.
        assert!(
            decide_session_renew(&[yes(session(&["h"], &[])), None, yes(session(&["h"], &[]))])
                .is_some()
        );
        // A and C both deny it: lost whatever B says.
        assert!(
            decide_session_renew(&[yes(session(&[], &["h"])), None, yes(session(&[], &[]))])
                .is_some()
        );
    }
}
