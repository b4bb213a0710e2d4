//! A memory node's grant of several names: all of them or none, as acquire_many.lua.

use super::*;

impl MemoryNode {
    /// A several-name lease's grant: all of its names or none (see acquire_many.lua).
    pub(super) async fn acquire_many(&self, claim: Claim<'_>) -> NodeResult<Acquired> {
        let Claim {
            key,
            lease,
            ttl_ms,
            owner,
            idem,
            listeners,
            ..
        } = claim;
        let members = key.members();
        let claimant = format!("g:{}", claimant_of(lease.as_str()));
        self.step(|data, now| {
            data.check_marker()?;
            let record = match data.record(idem, now) {
                Ok(record) => record,
                Err(mismatch) => return Ok(mismatch),
            };
            if let Some(idem) = idem
                && let Some(first) = data.live(&members[0], now).filter(|e| e.lease == *lease)
            {
                let token = first.token;
                for member in &members {
                    if let Some(entry) = data.locks.get_mut(member) {
                        entry.seen = Some(idem.attempt.clone());
                        if entry.lease == *lease {
                            data.refresh(member, idem, ttl_ms, now);
                        }
                    }
                }
                return Ok(Acquired::Granted {
                    token: FencingToken::new(token),
                });
            }
            for member in &members {
                if let Some(claimed) =
                    data.group_claim(member, Some(&claimant), listeners.waiting, now)
                {
                    return Ok(claimed);
                }
                if data.live(member, now).is_none()
                    && let Some(delayed) = data.delayed(member, now)
                {
                    return Ok(delayed);
                }
            }
            let mut blocked = None;
            for member in &members {
                let held = data
                    .live(member, now)
                    .filter(|e| e.lease != *lease)
                    .map(|e| {
                        e.waited |= listeners.waiting;
                        e.clone()
                    })
                    .map(|e| (data.pttl(&e, now), e.lease));
                let held = match held {
                    Some(held) => Some(held),
                    None => data
                        .readers_refuse(member, lease, listeners.waiting, None, now)
                        .map(|pttl| (pttl, LeaseId::stored("shared"))),
                };
                if let Some((pttl_ms, holder)) = held {
                    if listeners.waiting && !data.delays.contains_key(member) {
                        let lasts = (pttl_ms + 1000).min(listeners.patience_ms + 100);
                        let until = now + Duration::from_millis(lasts);
                        data.claim(&member.name, &claimant, until, now);
                    }
                    blocked = blocked.or(Some(Acquired::Held {
                        pttl_ms,
                        lease: holder,
                    }));
                }
            }
            if let Some(blocked) = blocked {
                return Ok(blocked);
            }
            if record.is_some() {
                return Ok(Acquired::Ended);
            }
            data.fence += 1;
            let token = data.fence;
            let expires = data.expiry(now, ttl_ms);
            if let Some(idem) = idem {
                data.records
                    .insert(idem.record.clone(), (idem.fingerprint.clone(), expires));
            }
            for member in &members {
                let waited = data.end_claim(&member.name, now);
                data.locks.insert(
                    member.clone(),
                    Entry {
                        group: Some(key.name.to_string()),
                        waited,
                        ..Entry::granted(lease, token, ttl_ms, owner, expires, idem)
                    },
                );
            }
            Ok(Acquired::Granted {
                token: FencingToken::new(token),
            })
        })
        .await
    }
}
