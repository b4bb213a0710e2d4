//! The steps on a several-name lease's key (`Kind::Group`) other than its grant: each is
//! the same step on every member, sent at once (so that on a Redis master they travel in
//! one batch), and answered as one. The grant, all or nothing, is a script of its own on
//! each store (acquire_many.lua, and the memory node's mirror of it).

use futures::future::join_all;

use super::node::{Ending, Holding, LockNode, NodeResult, Owned, Renewal};
use crate::model::{FencingToken, LeaseId, LockKey};

/// Record `token` on every member.
pub(crate) async fn confirm<N: LockNode + ?Sized>(
    node: &N,
    key: &LockKey,
    lease: &LeaseId,
    token: FencingToken,
) -> NodeResult<()> {
    let members = key.members();
    let done = join_all(members.iter().map(|m| node.confirm(m, lease, token))).await;
    done.into_iter().collect()
}

/// Renew every member: renewed only where the lease holds all of them, answered with the
/// least that is left of any.
pub(crate) async fn renew<N: LockNode + ?Sized>(
    node: &N,
    renewal: Renewal<'_>,
) -> NodeResult<Owned<Holding>> {
    let members = renewal.key.members();
    let renewed = join_all(
        members
            .iter()
            .map(|m| node.renew(Renewal { key: m, ..renewal })),
    )
    .await;
    let mut least: Option<Holding> = None;
    for answer in renewed {
        match answer? {
            Owned::NotOwner => return Ok(Owned::NotOwner),
            Owned::Yes(h) => {
                if least.as_ref().is_none_or(|l| h.pttl_ms < l.pttl_ms) {
                    least = Some(h);
                }
            }
        }
    }
    Ok(least.map_or(Owned::NotOwner, Owned::Yes))
}

/// End the lease's hold on every member: ended where it held any of them.
pub(crate) async fn release<N: LockNode + ?Sized>(
    node: &N,
    key: &LockKey,
    lease: &LeaseId,
    ending: &Ending,
) -> NodeResult<Owned<()>> {
    let members = key.members();
    let ended = join_all(members.iter().map(|m| node.release(m, lease, ending))).await;
    let mut any = false;
    for answer in ended {
        any |= matches!(answer?, Owned::Yes(()));
    }
    Ok(if any { Owned::Yes(()) } else { Owned::NotOwner })
}

/// Who holds the members: the one lease that holds every one of them (with the least left
/// of any), or the first member's holder when they are not all one lease's.
pub(crate) async fn read<N: LockNode + ?Sized>(
    node: &N,
    key: &LockKey,
) -> NodeResult<Vec<Holding>> {
    let members = key.members();
    let read = join_all(members.iter().map(|m| node.read(m))).await;
    let mut holders = Vec::with_capacity(members.len());
    for answer in read {
        holders.push(answer?.into_iter().next());
    }
    let first = holders.first().cloned().flatten();
    let Some(first) = first else {
        return Ok(Vec::new());
    };
    let all_one = holders
        .iter()
        .all(|h| h.as_ref().is_some_and(|h| h.lease == first.lease));
    if !all_one {
        return Ok(vec![first]);
    }
    let least = holders
        .into_iter()
        .flatten()
        .min_by_key(|h| h.pttl_ms)
        .unwrap_or(first);
    Ok(vec![least])
}
