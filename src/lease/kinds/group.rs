//! Several locks under one lease, all or none: one key of all the names
//! (`acquire_many.lua`), whose lease id carries the group's tail, and whose names a
//! lease id alone does not tell (the masters do, through any one of them).

use std::sync::Arc;

use super::Grant;
use crate::lease::granted::Lease;
use crate::lease::{LeaseError, LeaseService};
use crate::model::{Kind, LeaseId, LockKey, LockName};
use crate::redlock::EngineError;

/// A waiting grant of several names waits on each of their topics.
pub(super) fn topics(names: &[LockName]) -> Vec<String> {
    names.iter().map(|n| n.topic().into_owned()).collect()
}

/// The names, for an Idempotency-Key's fingerprint.
pub(super) fn fingerprint(names: &[LockName]) -> String {
    let names: Vec<&str> = names.iter().map(LockName::as_str).collect();
    format!("names {}", names.join(" "))
}

/// One attempt at every one of `names`.
pub(super) async fn attempt(
    service: &LeaseService,
    grant: &Grant<'_>,
    names: &Arc<[LockName]>,
) -> Result<Lease, EngineError> {
    let id = grant.base_id().group();
    let mut lease = service
        .attempt_once(grant, LockKey::group(names), id, grant.terms)
        .await?;
    lease.names = names.iter().map(|n| n.as_str().into()).collect();
    Ok(lease)
}

/// The key of all the names of the several-name lease `lease`, through its hold of
/// `member`.
pub(super) async fn key_of(
    service: &LeaseService,
    member: &LockKey,
    lease: &LeaseId,
) -> Result<LockKey, LeaseError> {
    let names = service
        .engine()
        .members(member, lease)
        .await?
        .ok_or(LeaseError::NotFound)?;
    Ok(LockKey {
        kind: Kind::Group,
        name: names.into(),
    })
}

/// A lease answered through `key`: a several-name lease's names are its members'.
pub(in crate::lease) fn with_names(mut lease: Lease, key: &LockKey) -> Lease {
    if key.kind == Kind::Group {
        lease.names = key.members().into_iter().map(|m| m.name).collect();
    }
    lease
}
