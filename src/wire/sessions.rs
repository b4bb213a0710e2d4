//! The bodies of the session routes: a session's opening, and a session as its routes
//! answer it, with what is held through it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{LockMode, Whole};
use crate::model::FencingToken;

/// Fields of a session's opening; each may also be given as a query parameter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_ms": 15000, "owner": "ingest-worker-7"}))]
pub(crate) struct SessionRequest {
    /// Session TTL in ms: from 100 to the configured maximum (default 3600000). Default
    /// 30000. Every hold made through the session lives this long unless it is renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 100, maximum = 3600000)]
    pub ttl_ms: Option<Whole>,
    /// Free text naming the holder (at most 256 bytes).
    #[schema(max_length = 256)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// With `Accept: text/event-stream`: how long the session (and every hold through it)
    /// outlives the stream's connection when it closes without a `DELETE` of the session,
    /// so that its holder may resume it (`POST /sessions/{session_id}/hold`) through any
    /// replica, in ms: at most the largest TTL; 0 (the default) ends it as the connection
    /// closes. It is renewed no further meanwhile. Ignored by a session answered as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 3600000)]
    pub grace_ms: Option<Whole>,
}

/// A session: what opening, renewing and reading it answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "session_id": "k2VdY1Qm0sJx9a7bTf4r3w", "ttl_ms": 15000, "validity_ms": 14840,
    "expires_at": "2026-11-25T03:00:15.000Z", "owner": "ingest-worker-7"
}))]
pub(crate) struct SessionBody {
    /// Opaque; whoever knows it can renew and end the session, and hold through it. Keep it
    /// secret.
    pub session_id: String,
    /// The TTL the session was opened or last renewed with.
    #[schema(minimum = 100, maximum = 3600000)]
    pub ttl_ms: u64,
    /// How long the session (and every hold made through it) may be relied on from the
    /// moment this response was written.
    pub validity_ms: u64,
    /// When the session lapses unless renewed.
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// With `GET /sessions/{session_id}`: what is held through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<Vec<SessionHoldBody>>,
    /// With a renew: the lease ids of the holds it kept. Only these are valid for the new
    /// `validity_ms`; a hold through the session that is not listed here was not extended
    /// (it is `unconfirmed`, or it has ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Vec<String>>,
    /// With a renew: the lease ids of holds it could neither confirm nor deny (a master that
    /// carries one did not answer). Each is still held where it was and not released, but
    /// its validity was not extended: rely on it only until what the last answer that kept
    /// it said. A later renew keeps it again or lists it in `lost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed: Option<Vec<String>>,
    /// With a renew: the lease ids of holds a majority of masters deny carrying (revoked,
    /// force-released, expired, or their grant reached only some of the masters). They have
    /// ended, as a lease whose renew is 404 has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<Vec<String>>,
}

/// One hold made through a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct SessionHoldBody {
    /// `lock`, `semaphore` or `election`.
    pub kind: String,
    /// The lock's, semaphore's or election's name (a lease on several names: the first).
    pub name: String,
    /// Its lease id (a permit's, a term's): renew is not needed, revoke releases it alone.
    pub lease_id: String,
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    /// A lease on several names: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
    /// A permit's slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u16>,
    /// A lock's lease: how it holds the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
}

/// The `data` of a session's held stream events, by event: `opened`, `resumed` and
/// `heartbeat` (`SessionBody`), `jeopardy` and `safe` (`JeopardyEvent`), `lost` and
/// `closed` (`LostEvent`), `failed` (`ErrorBody`).
// Documents the stream for the OpenAPI document; never built (each event is written from
// its own body type).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum SessionStreamData {
    Session(SessionBody),
    Jeopardy(super::JeopardyEvent),
    Lost(super::LostEvent),
    Failed(super::ErrorBody),
}
