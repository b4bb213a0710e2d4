//! The request and response bodies of the contract, with their OpenAPI schemas, and the
//! parsing that turns a body plus query parameters into one typed request.

use std::time::SystemTime;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::error::ApiError;
use crate::lease::{Lease, LockHolder, MasterStatus, millis as ms_of};

/// A non-negative integer field given as a JSON number or, from a query string, as text.
fn millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Millis;
    impl serde::de::Visitor<'_> for Millis {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a non-negative integer")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u64::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(E::invalid_value(serde::de::Unexpected::Float(v), &self))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            v.parse()
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(v), &self))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Millis)
}

/// Fields of a grant; each may also be given as a query parameter of the same name.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_ms": 60000, "wait_ms": 5000, "owner": "report-worker-3"}))]
pub struct GrantRequest {
    /// Lease TTL in ms: from 100 to the configured maximum (default 3600000). Default 30000.
    #[schema(minimum = 100)]
    #[serde(default, deserialize_with = "millis")]
    pub ttl_ms: Option<u64>,
    /// How long to wait while another lease holds the lock, in ms (default 0: do not wait).
    #[serde(default, deserialize_with = "millis")]
    pub wait_ms: Option<u64>,
    /// Free text naming the holder (at most 256 bytes), shown by inspect and list.
    #[schema(max_length = 256)]
    pub owner: Option<String>,
}

/// Fields of a renew; `ttl_ms` may also be a query parameter.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_ms": 60000}))]
pub struct RenewRequest {
    /// The new TTL in ms (default: the lease's own).
    #[schema(minimum = 100)]
    #[serde(default, deserialize_with = "millis")]
    pub ttl_ms: Option<u64>,
}

/// Calls that take no fields still refuse unknown ones, so typos do not pass silently.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

/// Query of the list call.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub prefix: Option<String>,
    pub after: Option<String>,
    #[serde(default, deserialize_with = "millis")]
    pub limit: Option<u64>,
}

/// An RFC 3339 time in UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A lease: what grant, renew and check answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "name": "nightly-report", "lease_id": "q3JtZ0kPq6Nw2b1xVf8u4A", "fencing_token": 42,
    "ttl_ms": 30000, "validity_ms": 29697, "expires_at": "2026-11-22T03:00:30.000Z",
    "owner": "report-worker-3"
}))]
pub struct LeaseBody {
    pub name: String,
    /// Opaque; whoever knows it can renew and revoke the lease. Keep it secret.
    pub lease_id: String,
    /// Greater than the token of every earlier grant of this name. Pass it to the resource
    /// you protect, and have it refuse tokens lower than the highest it has seen.
    pub fencing_token: u64,
    /// The TTL the lease was granted or last renewed with.
    pub ttl_ms: u64,
    /// How long you may rely on the lock from the moment this response was written: the
    /// TTL less the time the quorum took and less the clock-drift allowance.
    pub validity_ms: u64,
    /// When the lease lapses unless renewed (the masters may free it up to the drift
    /// allowance earlier).
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// With check: what is left of the lease on a majority of masters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_remaining_ms: Option<u64>,
}

impl LeaseBody {
    pub fn new(lease: &Lease, with_remaining: bool) -> Self {
        Self {
            name: lease.name.to_string(),
            lease_id: lease.id.as_str().to_owned(),
            fencing_token: lease.token.0,
            ttl_ms: ms_of(lease.ttl),
            validity_ms: ms_of(lease.validity_now()),
            expires_at: rfc3339(SystemTime::now() + lease.remaining_now()),
            owner: lease.owner.as_deref().map(str::to_owned),
            ttl_remaining_ms: with_remaining.then(|| ms_of(lease.remaining_now())),
        }
    }
}

/// A lock as inspect shows it; never with its lease id.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"name": "nightly-report", "held": true, "fencing_token": 42, "ttl_remaining_ms": 17250, "owner": "report-worker-3"}))]
pub struct LockStatus {
    pub name: String,
    pub held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_remaining_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl LockStatus {
    pub fn new(name: &str, holder: Option<LockHolder>) -> Self {
        match holder {
            Some(h) => Self {
                name: name.to_owned(),
                held: true,
                fencing_token: Some(h.token.0),
                ttl_remaining_ms: Some(ms_of(h.remaining)),
                owner: h.owner,
            },
            None => Self {
                name: name.to_owned(),
                held: false,
                fencing_token: None,
                ttl_remaining_ms: None,
                owner: None,
            },
        }
    }
}

/// A held lock in a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct LockEntry {
    pub name: String,
    pub fencing_token: u64,
    pub ttl_remaining_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Held locks, sorted by name.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"locks": [{"name": "invoice:42", "fencing_token": 7, "ttl_remaining_ms": 2900}], "next": "invoice:42"}))]
pub struct LockList {
    pub locks: Vec<LockEntry>,
    /// Present when more locks may follow: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl From<LockHolder> for LockEntry {
    fn from(h: LockHolder) -> Self {
        Self {
            name: h.name,
            fencing_token: h.token.0,
            ttl_remaining_ms: ms_of(h.remaining),
            owner: h.owner,
        }
    }
}

/// `/healthz`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub struct Health {
    pub status: &'static str,
}

/// One master in `/readyz`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MasterReport {
    /// The master's URL without credentials.
    pub address: String,
    pub up: bool,
    /// How long its last answer took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Whether its answers count towards a majority.
    pub voting: bool,
    /// Set while the master is quarantined after losing its data: when it votes again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined_until: Option<String>,
}

impl From<MasterStatus> for MasterReport {
    fn from(m: MasterStatus) -> Self {
        Self {
            address: m.address,
            up: m.up,
            latency_ms: m.latency.map(|l| (l.as_secs_f64() * 1e6).round() / 1e3),
            voting: m.voting,
            quarantined_until: m.quarantined_until.map(rfc3339),
        }
    }
}

/// `/readyz`: ready while a majority of masters answer and vote.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"ready": true, "backend": "redis", "masters": [
    {"address": "redis://10.0.0.5:6379", "up": true, "latency_ms": 0.21, "voting": true}
]}))]
pub struct Readiness {
    pub ready: bool,
    /// `redis`, or `embedded` for the in-process store (one process, not distributed).
    pub backend: &'static str,
    /// When not ready for a reason beyond masters being down (a new deployment waiting for
    /// every master, a majority that lost its data): what is wrong and what to do, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub masters: Vec<MasterReport>,
}

/// Parse a request from its JSON body (which may be empty) and its query parameters. A
/// field may come from either, not both; unknown fields are refused.
pub fn parse_fields<T: DeserializeOwned>(query: Option<&str>, body: &[u8]) -> Result<T, ApiError> {
    let mut fields = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => map,
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

    #[test]
    fn fields_come_from_the_body_or_the_query() {
        let g: GrantRequest = parse_fields(Some("ttl_ms=5000&owner=me"), b"").unwrap();
        assert_eq!((g.ttl_ms, g.owner.as_deref()), (Some(5000), Some("me")));
        let g: GrantRequest = parse_fields(None, br#"{"wait_ms": 10}"#).unwrap();
        assert_eq!(g.wait_ms, Some(10));
        let g: GrantRequest = parse_fields(Some("owner=123"), b"").unwrap();
        assert_eq!(g.owner.as_deref(), Some("123"));
        let g: GrantRequest = parse_fields(None, b"  \n").unwrap();
        assert!(g.ttl_ms.is_none());
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
