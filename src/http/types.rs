//! From the service's models to the contract's bodies (defined in `crate::wire`), and the
//! parsing that turns a body plus query parameters into one typed request.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::lease::{Lease, LeasePolicy, LockHolder};
use crate::model::{MasterStatus, Mode, Slot, millis as ms_of};
use crate::wire::{ElectionLease, Leader, LeaseBody, LockEntry, LockStatus, MasterReport};
use crate::wire::{LockMode, PermitBody, PermitHolder, SemaphoreStatus, ShardReport, SharedHolder};

/// An RFC 3339 time in UTC with milliseconds.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl LeaseBody {
    pub(crate) fn new(lease: &Lease, with_remaining: bool) -> Self {
        Self {
            name: lease.name.to_string(),
            lease_id: lease.id.as_str().to_owned(),
            fencing_token: lease.token,
            ttl_ms: ms_of(lease.ttl),
            validity_ms: ms_of(lease.validity_now()),
            expires_at: rfc3339(SystemTime::now() + lease.remaining_now()),
            owner: lease.owner.as_deref().map(str::to_owned),
            ttl_remaining_ms: with_remaining.then(|| ms_of(lease.remaining_now())),
            mode: lease.mode.into(),
            names: (!lease.names.is_empty())
                .then(|| lease.names.iter().map(|n| n.to_string()).collect()),
        }
    }
}

/// A granted or renewed lease as its grant answers it.
impl From<&Lease> for LeaseBody {
    fn from(lease: &Lease) -> Self {
        Self::new(lease, false)
    }
}

impl From<&Lease> for ElectionLease {
    fn from(lease: &Lease) -> Self {
        Self::new(lease)
    }
}

impl ElectionLease {
    pub(crate) fn new(lease: &Lease) -> Self {
        Self {
            name: lease.name.to_string(),
            lease_id: lease.id.as_str().to_owned(),
            term: lease.token,
            value: lease.owner.as_deref().map(str::to_owned),
            ttl_ms: ms_of(lease.ttl),
            validity_ms: ms_of(lease.validity_now()),
            expires_at: rfc3339(SystemTime::now() + lease.remaining_now()),
        }
    }
}

impl Leader {
    /// The leader `holders` name, or a vacancy (with the lock-delay that `delay` says still
    /// refuses campaigns).
    pub(crate) fn new(
        name: &str,
        holders: Vec<LockHolder>,
        delay: Option<Duration>,
        policy: &LeasePolicy,
    ) -> Self {
        match holders.into_iter().next() {
            Some(h) => Self {
                name: name.to_owned(),
                vacant: false,
                term: Some(h.token),
                value: h.owner.as_deref().map(str::to_owned),
                kept_until: kept_until(&h, policy),
                ttl_remaining_ms: Some(ms_of(h.remaining)),
                lock_delay_remaining_ms: None,
            },
            None => Self {
                name: name.to_owned(),
                vacant: true,
                term: None,
                value: None,
                kept_until: None,
                ttl_remaining_ms: None,
                lock_delay_remaining_ms: delay.map(ms_of),
            },
        }
    }
}

impl LockStatus {
    /// The lock `holders` hold, or a free one (with the lock-delay that `delay` says still
    /// refuses grants).
    pub(crate) fn new(
        name: &str,
        holders: Vec<LockHolder>,
        delay: Option<Duration>,
        policy: &LeasePolicy,
    ) -> Self {
        let free = Self {
            name: name.to_owned(),
            held: false,
            mode: None,
            fencing_token: None,
            ttl_remaining_ms: None,
            owner: None,
            kept_until: None,
            holders: None,
            lock_delay_remaining_ms: None,
        };
        let Some(first) = holders.first() else {
            return Self {
                lock_delay_remaining_ms: delay.map(ms_of),
                ..free
            };
        };
        if first.mode == Mode::Exclusive {
            let mut holders = holders;
            let h = holders.swap_remove(0);
            return Self {
                held: true,
                mode: Some(LockMode::Exclusive),
                fencing_token: Some(h.token),
                ttl_remaining_ms: Some(ms_of(h.remaining)),
                owner: h.owner.as_deref().map(str::to_owned),
                kept_until: kept_until(&h, policy),
                ..free
            };
        }
        Self {
            held: true,
            mode: Some(LockMode::Shared),
            fencing_token: holders.iter().map(|h| h.token).max(),
            ttl_remaining_ms: holders.iter().map(|h| ms_of(h.remaining)).max(),
            holders: Some(
                holders
                    .into_iter()
                    .map(|h| SharedHolder {
                        fencing_token: h.token,
                        ttl_remaining_ms: ms_of(h.remaining),
                        kept_until: kept_until(&h, policy),
                        owner: h.owner.as_deref().map(str::to_owned),
                    })
                    .collect(),
            ),
            ..free
        }
    }
}

impl From<&Lease> for PermitBody {
    fn from(lease: &Lease) -> Self {
        let slot = lease.slot.unwrap_or(Slot { index: 0, limit: 1 });
        Self {
            name: lease.name.to_string(),
            lease_id: lease.id.as_str().to_owned(),
            fencing_token: lease.token,
            slot: slot.index,
            limit: slot.limit,
            ttl_ms: ms_of(lease.ttl),
            validity_ms: ms_of(lease.validity_now()),
            expires_at: rfc3339(SystemTime::now() + lease.remaining_now()),
            owner: lease.owner.as_deref().map(str::to_owned),
        }
    }
}

impl SemaphoreStatus {
    /// A semaphore's permits by slot. Permits take no lock-delay: `delay` is always `None`
    /// for a semaphore (the service reads none).
    pub(crate) fn new(
        name: &str,
        holders: Vec<LockHolder>,
        delay: Option<Duration>,
        policy: &LeasePolicy,
    ) -> Self {
        debug_assert!(delay.is_none(), "a semaphore has no lock-delay");
        Self {
            name: name.to_owned(),
            holders: holders
                .into_iter()
                .map(|h| PermitHolder {
                    slot: h.slot.unwrap_or_default(),
                    fencing_token: h.token,
                    ttl_remaining_ms: ms_of(h.remaining),
                    kept_until: kept_until(&h, policy),
                    owner: h.owner.as_deref().map(str::to_owned),
                })
                .collect(),
        }
    }
}

impl LockEntry {
    pub(crate) fn new(h: LockHolder, policy: &LeasePolicy) -> Self {
        Self {
            kept_until: kept_until(&h, policy),
            name: h.name,
            fencing_token: h.token,
            ttl_remaining_ms: ms_of(h.remaining),
            owner: h.owner.as_deref().map(str::to_owned),
        }
    }
}

/// When a kept hold ends unless revoked, by this replica's clock; `None` for a lease its
/// holder renews.
fn kept_until(h: &LockHolder, policy: &LeasePolicy) -> Option<String> {
    policy
        .is_kept(h.ttl)
        .then(|| rfc3339(SystemTime::now() + h.remaining))
}

/// A clock offset in seconds as `/readyz` shows it: ms, to the tenth.
fn offset_ms(seconds: f64) -> f64 {
    (seconds * 1e4).round() / 10.0
}

impl From<MasterStatus> for MasterReport {
    fn from(m: MasterStatus) -> Self {
        Self {
            address: m.address,
            up: m.up,
            latency_ms: m.latency.map(|l| (l.as_secs_f64() * 1e6).round() / 1e3),
            voting: m.voting,
            quarantined_until: m.quarantined_until.map(rfc3339),
            problem: m
                .problem
                .or_else(|| m.cluster.as_ref().and_then(|c| c.problem.clone())),
            clock_offset_ms: m.clock_offset_s.map(offset_ms),
            subscribed: m.subscribed,
            shards: m.cluster.map(|c| {
                c.shards
                    .into_iter()
                    .map(|s| ShardReport {
                        address: s.address,
                        up: s.up,
                        voting: s.voting,
                        slots: s.slots,
                        latency_ms: s.latency.map(|l| (l.as_secs_f64() * 1e6).round() / 1e3),
                        quarantined_until: s.quarantined_until.map(rfc3339),
                        problem: s.problem,
                        clock_offset_ms: s.clock_offset_s.map(offset_ms),
                    })
                    .collect()
            }),
        }
    }
}

/// Parse a request from its JSON body (which may be empty) and its query parameters. A
/// field may come from either, not both; unknown fields are refused.
pub(crate) fn parse_fields<T: DeserializeOwned>(
    query: Option<&str>,
    body: &[u8],
) -> Result<T, ApiError> {
    let mut fields = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => map,
            // What the document allows for an absent body, which generated clients send.
            Ok(Value::Null) => Map::new(),
            Ok(_) => return Err(ApiError::Invalid("the body must be a JSON object".into())),
            Err(e) => {
                return Err(ApiError::Invalid(format!(
                    "the body is not valid JSON: {e}"
                )));
            }
        }
    };
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        // Query values are text; numeric fields accept text that is a number (`millis`).
        if fields
            .insert(key.clone().into_owned(), Value::from(value.into_owned()))
            .is_some()
        {
            return Err(ApiError::Invalid(format!("`{key}` is given twice")));
        }
    }
    serde_json::from_value(Value::Object(fields)).map_err(|e| ApiError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{GrantRequest, Whole};

    #[test]
    fn fields_come_from_the_body_or_the_query() {
        let g: GrantRequest = parse_fields(Some("ttl_ms=5000&owner=me"), b"").unwrap();
        assert_eq!(
            (g.ttl_ms, g.owner.as_deref()),
            (Some(Whole(5000)), Some("me"))
        );
        let g: GrantRequest = parse_fields(None, br#"{"wait_ms": 10}"#).unwrap();
        assert_eq!(g.wait_ms, Some(Whole(10)));
        let g: GrantRequest = parse_fields(Some("owner=123"), b"").unwrap();
        assert_eq!(g.owner.as_deref(), Some("123"));
        let g: GrantRequest = parse_fields(None, b"  \n").unwrap();
        assert_eq!(g, GrantRequest::default());
        let g: GrantRequest = parse_fields(Some("ttl_ms=5000"), b"null").unwrap();
        assert_eq!(g.ttl_ms, Some(Whole(5000)));
    }

    #[test]
    fn typos_duplicates_and_bad_types_are_refused() {
        let err =
            |q: Option<&str>, b: &[u8]| parse_fields::<GrantRequest>(q, b).unwrap_err().to_string();
        assert!(err(None, br#"{"ttl": 5}"#).contains("unknown field"));
        assert!(err(Some("tll_ms=5"), b"").contains("unknown field"));
        assert!(err(Some("ttl_ms=5"), br#"{"ttl_ms": 5}"#).contains("twice"));
        assert!(err(Some("ttl_ms=soon"), b"").contains("invalid value"));
        assert!(err(None, br#"{"ttl_ms": 1.5}"#).contains("invalid value"));
        assert!(err(None, br#"{"ttl_ms": -1}"#).contains("invalid value"));
        assert!(err(None, b"[1]").contains("JSON object"));
        assert!(err(None, b"{").contains("not valid JSON"));
    }
}
