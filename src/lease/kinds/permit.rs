//! A semaphore's permits: `limit` slots of the name, each an ordinary Redlock hold of its
//! own key; a permit's lease id names its slot and the limit it was taken under.

use std::time::Duration;

use super::Grant;
use crate::lease::granted::{Lease, LockHolder};
use crate::lease::{LeaseError, LeaseService};
use crate::model::{Kind, LeaseId, LockKey, LockName, MAX_PERMITS, PermitLimit, Slot, claimant_of};
use crate::redlock::{EngineError, Holder};

/// One attempt at a permit: the slots a majority hold are read, and the free ones below
/// `limit` are tried, in a random order (so that grants on several replicas seldom go for
/// the same one), each as an ordinary Redlock grant of its own. A keyed retry first goes
/// back to the slot its key's lease holds. Held when no slot below `limit` is free (or
/// every free one was taken first), with the earliest lapse among the holders as its
/// retry-after.
pub(super) async fn attempt(
    service: &LeaseService,
    grant: &Grant<'_>,
    limit: PermitLimit,
) -> Result<Lease, EngineError> {
    let name = &grant.target.name;
    let limit = limit.get();
    let holders = service.engine().slots(name.as_str(), limit).await?;
    let base = match (grant.keyed, &grant.target.holder) {
        (Some((id, _)), _) => id.clone(),
        // A permit of a holder named by an identity: told from others' by its id's first
        // half (see `LeaseId::of_holder`).
        (None, Some(holder)) => LeaseId::attempt_of(holder),
        (None, None) => LeaseId::generate(),
    };
    let mut taken = vec![false; usize::from(limit)];
    let mut earliest: Option<Duration> = None;
    let mut ours = None;
    for (slot, holder) in &holders {
        if holder.lease.as_str().starts_with(base.as_str()) {
            ours = Some(*slot);
        }
        if let Some(t) = taken.get_mut(usize::from(*slot)) {
            *t = true;
            earliest = Some(earliest.map_or(holder.remaining, |e| e.min(holder.remaining)));
        }
    }
    let mut free: Vec<u16> = (0..limit).filter(|s| !taken[usize::from(*s)]).collect();
    {
        use rand::seq::SliceRandom as _;
        free.shuffle(&mut rand::rng());
    }
    // The key's own permit, if a majority hold it, is the one to answer with.
    if let Some(slot) = ours.filter(|s| *s < limit) {
        free.insert(0, slot);
    }
    // A keyed grant asks the masters even when every slot is taken: they know whether its
    // key was used for another request (422 before 409, as a lock's grant answers).
    if free.is_empty()
        && grant.keyed.is_some()
        && let Some((slot, _)) = holders.iter().find(|(s, _)| *s < limit)
    {
        free.push(*slot);
    }
    let mut split = false;
    // A permit leaves no lock-delay behind.
    let terms = grant.terms.listeners.into();
    for index in free {
        let id = base.permit(Slot { index, limit });
        let key = LockKey::slot(name.as_str(), index);
        match service.attempt_once(grant, key, id, terms).await {
            Err(EngineError::Held { retry_after }) => {
                earliest = Some(earliest.map_or(retry_after, |e| e.min(retry_after)));
            }
            Err(EngineError::Split) => split = true,
            result => return result,
        }
    }
    if split {
        return Err(EngineError::Split);
    }
    Err(EngineError::Held {
        retry_after: earliest.unwrap_or(Duration::from_millis(1)),
    })
}

/// The slot a permit's lease id names (an id that names none is not found).
pub(super) fn key_of(name: &LockName, id: &LeaseId) -> Result<LockKey, LeaseError> {
    id.slot()
        .map(|slot| LockKey::slot(name.as_str(), slot.index))
        .ok_or(LeaseError::NotFound)
}

/// A semaphore's holders, by slot.
pub(super) async fn inspect(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<LockHolder>, LeaseError> {
    Ok(all_slots(service, name)
        .await?
        .into_iter()
        .map(|(slot, holder)| LockHolder {
            name: name.to_string(),
            slot: Some(slot),
            ..LockHolder::from(holder)
        })
        .collect())
}

/// Every permit of semaphore `name` held now.
pub(super) async fn keys(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<LockKey>, LeaseError> {
    Ok(all_slots(service, name)
        .await?
        .into_iter()
        .map(|(slot, _)| LockKey::slot(name.as_str(), slot))
        .collect())
}

/// The lease id of the permit of semaphore `name` below `limit` that the holder
/// `identity` names holds (`Target::held_by`), if a majority hold one. Each slot is read as
/// a lock is, so that a slot whose holder a majority cannot tell is a 503, never "none".
pub(super) async fn held_by(
    service: &LeaseService,
    name: &LockName,
    limit: PermitLimit,
    identity: &LeaseId,
) -> Result<Option<LeaseId>, LeaseError> {
    let reads = (0..limit.get()).map(|slot| {
        let key = LockKey::slot(name.as_str(), slot);
        async move { service.engine().inspect(&key).await }
    });
    let holder = claimant_of(identity.as_str());
    Ok(futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .flatten()
        .map(|h| h.lease)
        .find(|lease| claimant_of(lease.as_str()) == holder))
}

/// Every slot of semaphore `name` that a majority hold, whatever the limits they were
/// taken with (from the masters' index, for inspect and force-release; a grant reads only
/// the slots below its limit, `Redlock::slots`).
async fn all_slots(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<(u16, Holder)>, EngineError> {
    let prefix = format!("{name}/");
    let holders =
        super::held_under(service, Kind::Semaphore, name, usize::from(MAX_PERMITS)).await?;
    let mut slots: Vec<(u16, Holder)> = holders
        .into_iter()
        .filter_map(|h| {
            let slot = h.name.strip_prefix(&prefix)?.parse().ok()?;
            Some((slot, h))
        })
        .collect();
    slots.sort_by_key(|(slot, _)| *slot);
    Ok(slots)
}
