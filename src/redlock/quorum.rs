//! The arithmetic of Redlock, as pure functions over the answers in hand.
//!
//! Every decision here takes the answers received so far plus the number still pending,
//! and says either "decided" or "wait for more". That is what lets the engine answer as
//! soon as a majority outcome is known: a healthy majority never waits for the slowest
//! master, and a dead master never costs more than its timeout.

use std::time::Duration;

use std::collections::BTreeMap;

use crate::model::{FencingToken, LeaseId};
use crate::store::node::{Acquired, Holding, ListPage, NodeResult};

/// How many masters make a majority of `n`.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The clock-drift allowance for a TTL: a share of it plus 2 ms for the rounding of
/// millisecond expiries on the masters.
pub(crate) fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor) + Duration::from_millis(2)
}

/// How long a client may rely on a lock that was set with `ttl` by steps that took
/// `elapsed`: `ttl - elapsed - drift`, or `None` when nothing is left.
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl, drift_factor))
        .filter(|left| !left.is_zero())
}

/// The outcome of an acquire round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GrantOutcome {
    /// A majority set the key. `token` is the largest counter value among them and
    /// `confirmed` how many of them already hold exactly that value.
    Won {
        token: FencingToken,
        confirmed: usize,
    },
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
pub(crate) fn decide_grant(replies: &[Option<NodeResult<Acquired>>]) -> Option<GrantOutcome> {
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
            Some(Ok(Acquired::Held { pttl_ms, lease })) => held.push((lease.as_str(), *pttl_ms)),
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
pub(crate) fn decide_confirm(replies: &[Option<NodeResult<()>>]) -> Option<bool> {
    let q = majority(replies.len());
    let ok = replies.iter().filter(|r| matches!(r, Some(Ok(())))).count();
    let open = replies.iter().filter(|r| r.is_none()).count();
    (ok >= q || ok + open < q).then_some(ok >= q)
}

/// The outcome of a step that changes an existing lease (renew, release).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnedOutcome<T> {
    /// A majority did it; their answers.
    Done(Vec<T>),
    /// A majority said the lease does not hold the lock.
    NotOwner,
    Unavailable,
}

/// Decide a renew round: it needs a majority of masters to extend the lease.
pub(crate) fn decide_owned<T: Clone>(
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
    // Denials still on their way may make that majority: a master that is out answers at
    // once (quarantined, unverified), and must not turn a 404 into a 503 by being first.
    if not_owner + pending > n - q {
        return None;
    }
    Some(OwnedOutcome::Unavailable)
}

/// Decide a renew round as `decide_owned` does, except that while the masters that renewed
/// disagree on the lease's token and others have still to answer, it waits for them: a
/// master whose acquire answered after its grant was decided holds the lease with its own
/// counter until its backlog writes the grant's token there, and may answer first.
pub(crate) fn decide_renew(
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
pub(crate) struct SessionVerdicts {
    /// Carried (and extended) by a majority of all masters: valid as long as the session.
    pub kept: Vec<LeaseId>,
    /// Carried by fewer than a majority, and denied by fewer than a majority: its validity
    /// is not extended (what the last answer that kept it promised still holds).
    pub unconfirmed: Vec<LeaseId>,
    /// Denied by a majority of all masters (they have the session and not the hold): it has
    /// ended, as a lease whose renew a majority denied has.
    pub lost: Vec<LeaseId>,
}

/// Judge every hold that any answer names (carried, or found gone) by `states`, the
/// answers of the masters that renewed the session, out of `n` masters. Each list is in
/// the order the holds were first named.
pub(crate) fn judge_session_holds(
    states: &[crate::store::node::SessionState],
    n: usize,
) -> SessionVerdicts {
    let q = majority(n);
    let mut verdicts = SessionVerdicts::default();
    let mut seen: Vec<&LeaseId> = Vec::new();
    for lease in states
        .iter()
        .flat_map(|s| s.carried.iter().chain(&s.dropped))
    {
        if seen.contains(&lease) {
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
pub(crate) fn decide_session_renew(
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
pub(crate) enum ReleaseOutcome {
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
pub(crate) fn decide_release(
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
pub(crate) type Agreed = Holding;

/// The outcome of reading a lock from every master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
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
pub(crate) fn decide_read(
    replies: &[Option<NodeResult<Option<Holding>>>],
    only: Option<&LeaseId>,
) -> Option<ReadOutcome> {
    let n = replies.len();
    let q = majority(n);
    let pending = replies.iter().filter(|r| r.is_none()).count();
    let answered: Vec<Option<&Holding>> = replies
        .iter()
        .filter_map(|r| match r {
            Some(Ok(h)) => Some(h.as_ref().filter(|h| only.is_none_or(|l| h.lease == *l))),
            _ => None,
        })
        .collect();
    let holders = |lease: &LeaseId| -> Vec<&Holding> {
        answered
            .iter()
            .flatten()
            .filter(|h| h.lease == *lease)
            .copied()
            .collect()
    };
    // The candidate is the lease reported most often; only it can reach a majority.
    let mut candidate: Option<(&LeaseId, usize)> = None;
    for h in answered.iter().flatten() {
        let count = holders(&h.lease).len();
        if candidate.is_none_or(|(_, c)| count > c) {
            candidate = Some((&h.lease, count));
        }
    }
    let count = candidate.map_or(0, |(_, count)| count);
    if let Some((lease, count)) = candidate
        && count >= q
    {
        let mut hs = holders(lease);
        return Some(match agree_on_token(&hs, q) {
            Some(token) => {
                hs.sort_by_key(|h| std::cmp::Reverse(h.pttl_ms));
                let agreed = hs.iter().find(|h| h.token == token).copied();
                let first = agreed.unwrap_or(hs[0]);
                ReadOutcome::Held(Agreed {
                    lease: lease.clone(),
                    token,
                    ttl_ms: first.ttl_ms,
                    pttl_ms: hs[q - 1].pttl_ms,
                    owner: first.owner.clone(),
                    stream: agree_on_stream(&hs, q),
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
pub(crate) fn decide_settled_read(
    replies: &[Option<NodeResult<Option<Holding>>>],
) -> Option<ReadOutcome> {
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
pub(crate) struct Merged {
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
pub(crate) fn merge_pages(pages: &[NodeResult<ListPage>], limit: usize) -> Option<Merged> {
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
pub(crate) fn agree(holdings: &[Holding], n: usize) -> Option<Agreed> {
    let mut replies: Vec<Option<NodeResult<Option<Holding>>>> =
        holdings.iter().map(|h| Some(Ok(Some(h.clone())))).collect();
    replies.resize_with(n.max(holdings.len()), || Some(Ok(None)));
    match decide_read(&replies, None) {
        Some(ReadOutcome::Held(agreed)) => Some(agreed),
        _ => None,
    }
}

/// The held stream that a majority of all masters say keeps a lease (renews say; reads
/// do not), if there is one: a stream that another resumed the lease from learns it so.
fn agree_on_stream(holders: &[&Holding], q: usize) -> Option<std::sync::Arc<str>> {
    named_by(holders.iter().map(|h| h.stream.as_ref()), q)
}

/// The held stream that a majority of all `nodes` masters say keeps a session (renews
/// say), if there is one: a session's stream that another resumed it from learns it so.
pub(crate) fn agree_on_session_stream(
    states: &[crate::store::node::SessionState],
    nodes: usize,
) -> Option<std::sync::Arc<str>> {
    named_by(states.iter().map(|s| s.stream.as_ref()), majority(nodes))
}

/// The stream at least `q` of the answers name (`None`: the answer did not say).
fn named_by<'a>(
    named: impl Iterator<Item = Option<&'a std::sync::Arc<str>>> + Clone,
    q: usize,
) -> Option<std::sync::Arc<str>> {
    named
        .clone()
        .flatten()
        .find(|s| named.clone().filter(|o| *o == Some(*s)).count() >= q)
        .cloned()
}

/// The token that a majority of all masters report for a lease, if there is one. A grant
/// is only answered once a majority hold its token, so a majority read finds it unless a
/// master that missed the confirmation answers in place of one that had it.
fn agree_on_token(holders: &[&Holding], q: usize) -> Option<FencingToken> {
    holders
        .iter()
        .map(|h| h.token)
        .find(|t| holders.iter().filter(|h| h.token == *t).count() >= q)
}

#[cfg(test)]
mod tests;
