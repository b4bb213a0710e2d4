//! A lock's holds: exclusive (a lock's, and an election's term: one key of the name) and
//! shared (a key of its own per holder beside the lock's, which `share.lua` keeps apart
//! from an exclusive hold).

use super::Grant;
use crate::lease::granted::{Lease, LockHolder};
use crate::lease::{LeaseError, LeaseService};
use crate::model::{Kind, LeaseId, LockKey, LockName, Mode};
use crate::redlock::{EngineError, Holder};

/// The most shared holders of one lock that inspect lists (and force-release removes in
/// one call).
const MAX_SHARED_LISTED: usize = 1000;

/// One attempt at a lock of one name under `id` (a shared hold's id carries its tail, and
/// its key is its own).
pub(super) async fn attempt(
    service: &LeaseService,
    grant: &Grant<'_>,
    id: LeaseId,
) -> Result<Lease, EngineError> {
    let name = &grant.target.name;
    let key = if id.is_shared() {
        LockKey::reader(name.as_str(), &id)
    } else {
        name.key()
    };
    service.attempt_once(grant, key, id, grant.terms).await
}

/// A lock's holder: the exclusive one, or else every shared one (read at once: one round
/// trip).
pub(super) async fn inspect(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<LockHolder>, LeaseError> {
    let key = name.key();
    let (holder, readers) = tokio::join!(service.engine().inspect(&key), readers(service, name));
    if let Some(holder) = holder? {
        return Ok(vec![LockHolder::from(holder)]);
    }
    let mut holders: Vec<LockHolder> = readers?
        .into_iter()
        .map(|(_, holder)| LockHolder {
            name: name.to_string(),
            mode: Mode::Shared,
            ..LockHolder::from(holder)
        })
        .collect();
    holders.sort_by_key(|h| h.token);
    Ok(holders)
}

/// The one holder of a name held by one lease at a time (an election's leader).
pub(super) async fn inspect_one(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<LockHolder>, LeaseError> {
    let holder = service.engine().inspect(&name.key()).await?;
    Ok(holder.map(LockHolder::from).into_iter().collect())
}

/// Every hold of lock `name`: the exclusive one (a several-name lease's key of all its
/// names, when it is one: it is removed from every one of them) and the shared ones.
pub(super) async fn keys(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<LockKey>, LeaseError> {
    let key = match service.engine().inspect(&name.key()).await? {
        Some(holder) if holder.lease.is_group() => {
            super::group::key_of(service, &name.key(), &holder.lease).await?
        }
        _ => name.key(),
    };
    let mut keys = vec![key];
    keys.extend(
        readers(service, name)
            .await?
            .into_iter()
            .map(|(key, _)| key),
    );
    Ok(keys)
}

/// The shared holds of lock `name` that a majority hold, with their keys.
async fn readers(
    service: &LeaseService,
    name: &LockName,
) -> Result<Vec<(LockKey, Holder)>, EngineError> {
    let holders = super::held_under(service, Kind::Reader, name, MAX_SHARED_LISTED).await?;
    Ok(holders
        .into_iter()
        .map(|h| {
            let key = LockKey {
                kind: Kind::Reader,
                name: h.name.as_str().into(),
            };
            (key, h)
        })
        .collect())
}
