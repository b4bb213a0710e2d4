//! The contract's request and response bodies, as data: one definition that the server
//! serialises and parses and that a Rust client (the `redlockd lock` command) uses in the
//! other direction, so that the two cannot drift. Each carries its OpenAPI schema. No
//! behaviour lives here: the server's conversions from its models are in `http::types`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::FencingToken;

/// The schemas of the values the server parses, built from the constants its parsers use,
/// so that the OpenAPI document states exactly what the edge accepts (`lock_name` is what
/// `LockName::parse` takes, and so on). The path, query and header parameters use them
/// through the newtypes' `PartialSchema` (in `http::schema`); the bodies' fields state the
/// same bounds as literals (utoipa takes no constant there), held to these by a test.
pub(crate) mod schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
    use utoipa::openapi::{Object, RefOr, Schema};

    use crate::model::{
        DEFAULT_MAX_TTL_MS, DEFAULT_MAX_WAIT_MS, MAX_IDEMPOTENCY_KEY_BYTES, MAX_LEASE_ID_LEN,
        MAX_LIST_LIMIT, MAX_NAME_BYTES, MAX_OWNER_BYTES, MIN_TTL_MS,
    };

    /// The bytes a lock name is made of, as a regular expression class.
    const NAME_CHARS: &str = "A-Za-z0-9._:~-";

    fn text(min: usize, max: usize, pattern: Option<String>) -> Object {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length((min > 0).then_some(min))
            .max_length(Some(max))
            .pattern(pattern)
            .build()
    }

    fn integer(min: u64, max: u64) -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(min as f64))
            .maximum(Some(max as f64))
            .build()
    }

    /// 1 to 256 bytes of `A-Z a-z 0-9 . _ : ~ -`.
    pub(crate) fn lock_name() -> Object {
        text(
            1,
            MAX_NAME_BYTES,
            Some(format!("^[{NAME_CHARS}]{{1,{MAX_NAME_BYTES}}}$")),
        )
    }

    /// A Dapr lock store's name: the first bytes of its locks' names.
    pub(crate) fn store_name() -> Object {
        let max = super::MAX_STORE_BYTES;
        text(1, max, Some(format!("^[{NAME_CHARS}]{{1,{max}}}$")))
    }

    /// A FleetLock reboot group, as the protocol names one.
    pub(crate) fn fleetlock_group() -> Object {
        text(1, 128, Some("^[a-zA-Z0-9.-]{1,128}$".to_owned()))
    }

    /// FleetLock's `fleet-lock-protocol` header: `true`.
    pub(crate) fn fleetlock_header() -> Object {
        text(4, 4, Some("^[Tt][Rr][Uu][Ee]$".to_owned()))
    }

    /// Several lock names as a query parameter: separated by commas (no name has one).
    pub(crate) fn name_list() -> Object {
        let max = crate::model::MAX_GROUP_NAMES;
        text(
            1,
            max * (MAX_NAME_BYTES + 1) - 1,
            Some(format!(
                "^[{NAME_CHARS}]{{1,{MAX_NAME_BYTES}}}(,[{NAME_CHARS}]{{1,{MAX_NAME_BYTES}}}){{0,{}}}$",
                max - 1
            )),
        )
    }

    /// A name's first bytes (`prefix`) or a whole name to list after (`after`); may be empty.
    pub(crate) fn name_prefix() -> Object {
        text(
            0,
            MAX_NAME_BYTES,
            Some(format!("^[{NAME_CHARS}]{{0,{MAX_NAME_BYTES}}}$")),
        )
    }

    pub(crate) fn lease_id() -> Object {
        text(
            1,
            MAX_LEASE_ID_LEN,
            Some(format!("^[A-Za-z0-9_-]{{1,{MAX_LEASE_ID_LEN}}}$")),
        )
    }

    /// An owner (a leader's value): free text, no control characters.
    pub(crate) fn owner() -> Object {
        text(0, MAX_OWNER_BYTES, None)
    }

    /// 1 to 255 visible ASCII characters.
    pub(crate) fn idempotency_key() -> Object {
        text(
            1,
            MAX_IDEMPOTENCY_KEY_BYTES,
            Some(format!("^[!-~]{{1,{MAX_IDEMPOTENCY_KEY_BYTES}}}$")),
        )
    }

    /// A TTL in ms, within the contract's default bounds (REDLOCKD_MAX_TTL_MS moves the
    /// upper one).
    pub(crate) fn ttl_ms() -> Object {
        integer(MIN_TTL_MS, DEFAULT_MAX_TTL_MS)
    }

    /// A wait in ms (REDLOCKD_MAX_WAIT_MS moves the upper bound).
    pub(crate) fn wait_ms() -> Object {
        integer(0, DEFAULT_MAX_WAIT_MS)
    }

    /// A fencing token as a path parameter: a whole number from 1 (tokens start at 1).
    pub(crate) fn fencing_token() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1.0))
            .build()
    }

    /// A held stream's grace in ms (REDLOCKD_MAX_TTL_MS moves the upper bound).
    pub(crate) fn grace_ms() -> Object {
        integer(0, DEFAULT_MAX_TTL_MS)
    }

    /// A lock-delay in ms.
    pub(crate) fn lock_delay_ms() -> Object {
        integer(0, crate::model::MAX_LOCK_DELAY_MS)
    }

    /// A semaphore's `limit`.
    pub(crate) fn permit_limit() -> Object {
        integer(1, u64::from(crate::model::MAX_PERMITS))
    }

    /// A list call's page size.
    pub(crate) fn list_limit() -> Object {
        integer(1, MAX_LIST_LIMIT)
    }

    /// `f` as a schema, for `PartialSchema` impls.
    pub(crate) fn of(f: fn() -> Object) -> RefOr<Schema> {
        RefOr::T(Schema::Object(f()))
    }
}

/// Declares the body of a grant of some kind: the kind's own fields, then the terms every
/// hold takes, written once here so that each kind's grant states them alike (its `ttl_ms`
/// and `wait_ms` with the kind's own words; `session`, `kept` and `grace_ms` word for word).
macro_rules! hold_request {
    (
        $(#[$meta:meta])*
        struct $name:ident { $($own:tt)* }
        $(#[$ttl:meta])* ttl_ms,
        $(#[$wait:meta])* wait_ms,
    ) => {
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        $(#[$meta])*
        pub(crate) struct $name {
            $($own)*
            $(#[$ttl])*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<u64>, minimum = 100, maximum = 3600000)]
            pub ttl_ms: Option<Whole>,
            $(#[$wait])*
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<u64>, minimum = 0, maximum = 60000)]
            pub wait_ms: Option<Whole>,
            /// A session (`POST /sessions`) to hold this through instead of its own renews: it is
            /// held for as long as the session is, renewed by the session's renews, and released
            /// when the session ends or expires (its `ttl_ms`, if any, is the session's then).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub session: Option<String>,
            /// Kept by the server (`true`): the hold needs no renew and lives until revoked, at most
            /// REDLOCKD_MAX_KEPT_HOLD_MS (default 2 h); its `ttl_ms` is that maximum. Not with
            /// `ttl_ms`, `session` or a held stream (each says how long it lives). Default false.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<bool>)]
            pub kept: Option<Flag>,
            /// For a held stream (`/hold`, or `Accept: text/event-stream`): how long the lease
            /// outlives the stream's connection when it closes without a `DELETE` of the lease, in
            /// ms (at most the largest TTL; default 0: revoked as the connection closes), so that
            /// its holder may resume it (`POST .../leases/{lease_id}/hold`) through any replica. It
            /// is renewed no further meanwhile: the grace never outlasts the validity last answered.
            /// After a drop, rely on the lease no longer than the shorter of the last event's
            /// `validity_ms` and the grace. Ignored by a grant answered as JSON, which has no
            /// connection to outlive.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(value_type = Option<u64>, minimum = 0, maximum = 3600000)]
            pub grace_ms: Option<Whole>,
        }
    };
}

hold_request! {
    /// Fields of a grant; each may also be given as a query parameter of the same name.
    #[schema(example = json!({"ttl_ms": 60000, "wait_ms": 5000, "owner": "report-worker-3"}))]
    struct GrantRequest {
        /// Free text naming the holder (at most 256 bytes), shown by inspect and list.
        #[schema(max_length = 256)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub owner: Option<String>,
        /// `exclusive` (the default: one holder) or `shared`: shared grants of a name hold it
        /// together, an exclusive grant excludes every other grant. A waiting exclusive grant
        /// is not overtaken by shared grants that come after it, on any replica.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mode: Option<LockMode>,
        /// Lock-delay in ms (0 to the configured maximum, default 60000; default 0): when this
        /// lease ends other than by its holder's revoke (it expires, or is force-released), the
        /// name is not granted again until this long after, judged by the masters' clocks;
        /// grants meanwhile are 409 `lock_delay`. For an exclusive lease on one name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<u64>, minimum = 0, maximum = 60000)]
        pub lock_delay_ms: Option<Whole>,
    }
    /// Lease TTL in ms: from 100 to the configured maximum (default 3600000). Default 30000.
    ttl_ms,
    /// How long to wait while another lease holds the lock, in ms (default 0: do not wait).
    wait_ms,
}

hold_request! {
    /// Fields of a grant of several names under one lease (`POST /locks`); each but `names`
    /// may also be a query parameter.
    #[schema(example = json!({"names": ["account:17", "account:4"], "ttl_ms": 10000, "wait_ms": 5000, "owner": "transfer-81"}))]
    struct GroupRequest {
        /// 1 to 64 distinct lock names, in any order: the server orders them itself, so that
        /// two grants listing the same names in opposite orders never deadlock. (As a query
        /// parameter: the names separated by commas.)
        #[schema(min_items = 1, max_items = 64)]
        #[serde(deserialize_with = "names_or_list")]
        pub names: Vec<String>,
        /// Free text naming the holder (at most 256 bytes), shown by inspect and list.
        #[schema(max_length = 256)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub owner: Option<String>,
        /// `exclusive` only (the default): a lease on several names is exclusive.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub mode: Option<LockMode>,
    }
    /// Lease TTL in ms: from 100 to the configured maximum (default 3600000). Default 30000.
    ttl_ms,
    /// How long to wait while another lease holds any of the names, in ms (default 0).
    wait_ms,
}

/// `names` as a JSON array, or as one string of names separated by commas (a query
/// parameter's form).
fn names_or_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        List(Vec<String>),
        Joined(String),
    }
    Ok(match Names::deserialize(d)? {
        Names::List(names) => names,
        Names::Joined(joined) => joined.split(',').map(str::to_owned).collect(),
    })
}

/// How a lock is held: by one exclusive holder, or by any number of shared holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LockMode {
    Exclusive,
    Shared,
}

impl From<crate::model::Mode> for LockMode {
    fn from(mode: crate::model::Mode) -> Self {
        match mode {
            crate::model::Mode::Exclusive => LockMode::Exclusive,
            crate::model::Mode::Shared => LockMode::Shared,
        }
    }
}

impl From<LockMode> for crate::model::Mode {
    fn from(mode: LockMode) -> Self {
        match mode {
            LockMode::Exclusive => crate::model::Mode::Exclusive,
            LockMode::Shared => crate::model::Mode::Shared,
        }
    }
}

/// Fields of a renew; `ttl_ms` may also be a query parameter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_ms": 60000}))]
pub(crate) struct RenewRequest {
    /// The new TTL in ms (default: the lease's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 100, maximum = 3600000)]
    pub ttl_ms: Option<Whole>,
}

/// Calls that take no fields still refuse unknown ones, so typos do not pass silently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoFields {}

/// Query of the list call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Whole>,
}

/// A lease: what grant, renew and check answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "name": "nightly-report", "lease_id": "q3JtZ0kPq6Nw2b1xVf8u4A", "fencing_token": 42,
    "ttl_ms": 30000, "validity_ms": 29697, "expires_at": "2026-11-22T03:00:30.000Z",
    "owner": "report-worker-3"
}))]
pub(crate) struct LeaseBody {
    pub name: String,
    /// Opaque; whoever knows it can renew and revoke the lease. Keep it secret.
    pub lease_id: String,
    /// Greater than the token of every earlier grant of this name. Pass it to the resource
    /// you protect, and have it refuse tokens lower than the highest it has seen.
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    /// The TTL the lease was granted or last renewed with.
    #[schema(minimum = 100, maximum = 3600000)]
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
    /// How the lease holds the lock.
    pub mode: LockMode,
    /// A lease on several names (`POST /locks`): all of them, sorted. It is renewed,
    /// checked and revoked through any of them, for all at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
}

/// A lock as inspect shows it; never with its lease id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "nightly-report", "held": true, "fencing_token": 42, "ttl_remaining_ms": 17250, "owner": "report-worker-3"}))]
pub(crate) struct LockStatus {
    pub name: String,
    pub held: bool,
    /// When held: how (`exclusive` or `shared`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// The holder's token; of a shared lock, the highest of its holders'.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub fencing_token: Option<FencingToken>,
    /// What is left of the holder's lease; of a shared lock, the longest of its holders'.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_remaining_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A kept hold's (`kept: true`): when it ends unless revoked, RFC 3339. Absent for a
    /// lease its holder renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<String>,
    /// A shared lock's holders (never their lease ids).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holders: Option<Vec<SharedHolder>>,
    /// While free: how long a lock-delay still refuses grants (the last lease ended other
    /// than by its release, and was granted with `lock_delay_ms`); absent when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_remaining_ms: Option<u64>,
}

/// One shared holder of a lock, as inspect shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct SharedHolder {
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    pub ttl_remaining_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A kept hold's (`kept: true`): when it ends unless revoked, RFC 3339. Absent for a
    /// lease its holder renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<String>,
}

/// Whether a fencing token is current: a lease with that token holds the name on a
/// majority of masters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "nightly-report", "fencing_token": 42, "current": true}))]
pub(crate) struct FenceStatus {
    pub name: String,
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    pub current: bool,
}

/// A held lock in a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct LockEntry {
    pub name: String,
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    pub ttl_remaining_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A kept hold's (`kept: true`): when it ends unless revoked, RFC 3339. Absent for a
    /// lease its holder renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<String>,
}

/// Held locks, sorted by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"locks": [{"name": "invoice:42", "fencing_token": 7, "ttl_remaining_ms": 2900}], "next": "invoice:42"}))]
pub(crate) struct LockList {
    pub locks: Vec<LockEntry>,
    /// Present when more locks may follow: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The `queued` event of a held stream: the grant waits, at this place in the replica's
/// line of waiting grants for the name (1 is next).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"position": 2}))]
pub(crate) struct QueuedEvent {
    pub position: u64,
}

/// The `lost` event of a held stream: the lease is no longer held, and why. The stream
/// ends after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"reason": "quorum_lost", "message": "no renew reached a majority of masters before the lease's validity ran out"}))]
pub(crate) struct LostEvent {
    /// `lease_not_found` (a renew found it expired), `quorum_lost` (no renew reached a
    /// majority in time), `released` (revoked with its lease id, not by this stream),
    /// `force_released` (an administrator removed it). When the replica holding a stream
    /// stops, the stream ends with a `closed` event of the same shape instead (reason
    /// `shutting_down`): a held lease or session is then not revoked, and `validity_ms`
    /// says how long it may still be relied on; an observer's `closed` has no `validity_ms`.
    /// A held stream whose lease was resumed through another stream ends with `closed`
    /// (reason `resumed`), revoking nothing.
    pub reason: String,
    pub message: String,
    /// With `closed` of a held lease, campaign or session: how long it may still be relied
    /// on from when the event was written. A held lease's or campaign's replica keeps
    /// renewing it until its drain deadline, or until it is resumed elsewhere; a session
    /// lapses at its TTL unless renewed through another replica before then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validity_ms: Option<u64>,
    /// `true` with `closed` of a held lease or campaign: resume it through another replica
    /// (`POST .../leases/{lease_id}/hold`) within `validity_ms`, and the stream goes on
    /// there with the same lease and fencing token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
}

/// Fields of a resume (holding a lease granted before through a new stream); each may also
/// be given as a query parameter of the same name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"grace_ms": 5000}))]
pub(crate) struct ResumeRequest {
    /// How long the lease outlives this stream's connection when it closes without a
    /// revoke, so that its holder may resume it again (through any replica), in ms: at most
    /// the largest TTL; 0 (the default) revokes it as the connection closes. It is renewed
    /// no further meanwhile, so the grace never outlasts the validity last answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 3600000)]
    pub grace_ms: Option<Whole>,
}

hold_request! {
    /// Fields of a campaign; each may also be given as a query parameter of the same name.
    #[schema(example = json!({"value": "10.0.0.7:9000", "ttl_ms": 10000, "wait_ms": 60000}))]
    struct CampaignRequest {
        /// What the leader publishes while it leads (its address, say): at most 256 bytes.
        #[schema(max_length = 256)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub value: Option<String>,
        /// Lock-delay in ms (default 0): when this term ends other than by the leader's resign
        /// (it expires, or is force-released), no candidate is elected until this long after;
        /// campaigns meanwhile are 409 `lock_delay`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<u64>, minimum = 0, maximum = 60000)]
        pub lock_delay_ms: Option<Whole>,
    }
    /// Term TTL in ms, renewed like a lease's: from 100 to the configured maximum.
    /// Default 30000.
    ttl_ms,
    /// How long to wait while another candidate leads, in ms (default 0).
    wait_ms,
}

/// Fields of a leader's renew; with `value`, the leader proclaims a new value and keeps
/// its term.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"value": "10.0.0.7:9001"}))]
pub(crate) struct ProclaimRequest {
    #[schema(max_length = 256)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The new TTL in ms (default: the term's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, minimum = 100, maximum = 3600000)]
    pub ttl_ms: Option<Whole>,
}

/// A leader's lease: what campaign and a leader's renew answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "name": "queue-worker", "lease_id": "q3JtZ0kPq6Nw2b1xVf8u4A", "term": 43,
    "value": "10.0.0.7:9000", "ttl_ms": 10000, "validity_ms": 9897,
    "expires_at": "2026-11-22T03:00:10.000Z"
}))]
pub(crate) struct ElectionLease {
    pub name: String,
    /// Opaque; whoever knows it can renew, proclaim and resign. Keep it secret.
    pub lease_id: String,
    /// The term: the lease's fencing token, greater than every earlier term of this
    /// election. Stamp the leader's writes with it.
    #[schema(value_type = u64)]
    pub term: FencingToken,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[schema(minimum = 100, maximum = 3600000)]
    pub ttl_ms: u64,
    /// How long the leader may rely on leading from the moment this response was written.
    pub validity_ms: u64,
    pub expires_at: String,
}

/// Who leads an election now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "queue-worker", "vacant": false, "term": 43, "value": "10.0.0.7:9000", "ttl_remaining_ms": 7210}))]
pub(crate) struct Leader {
    pub name: String,
    pub vacant: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub term: Option<FencingToken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A kept hold's (`kept: true`): when it ends unless revoked, RFC 3339. Absent for a
    /// lease its holder renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_remaining_ms: Option<u64>,
    /// While vacant: how long a lock-delay still refuses campaigns (the last term ended
    /// other than by a resign, and was taken with `lock_delay_ms`); absent when none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_remaining_ms: Option<u64>,
}

/// The `jeopardy` and `safe` events of a held stream. `jeopardy`: renews have not got
/// through (masters down or unreachable) and less than a third of the TTL is left: stop
/// what the lease guards unless a `safe` comes before `validity_ms` is up. Told once; the
/// stream goes on (`lost` follows if no renew gets through in time). `safe`: a renew got
/// through after `jeopardy`, and the lease is held for `validity_ms` again (its
/// `heartbeat` follows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"validity_ms": 312, "message": "renews are not getting through; less than a third of the TTL is left"}))]
pub(crate) struct JeopardyEvent {
    /// How long the lease may still be relied on, from when the event was written.
    pub validity_ms: u64,
    pub message: String,
}

/// The `data` of a held lock's stream events, by event: `queued` (`QueuedEvent`),
/// `granted` and `heartbeat` (`LeaseBody`), `jeopardy` and `safe` (`JeopardyEvent`), `lost`
/// and `closed` (`LostEvent`), `failed` (`ErrorBody`).
// The three stream-data types document the streams for the OpenAPI document; they are
// never built (each event is written from its own body type).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum HoldStreamData {
    Queued(QueuedEvent),
    Lease(LeaseBody),
    Jeopardy(JeopardyEvent),
    Lost(LostEvent),
    Failed(ErrorBody),
}

/// The `data` of an election's held stream events: as a held lock's, with
/// `ElectionLease` for `elected` and `heartbeat`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum CampaignStreamData {
    Queued(QueuedEvent),
    Lease(ElectionLease),
    Jeopardy(JeopardyEvent),
    Lost(LostEvent),
    Failed(ErrorBody),
}

/// The `data` of an observer's stream events: `elected`, `proclaimed` and `vacant`
/// (`LeaderEvent`), then `closed` (`LostEvent`) when the replica stops.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum ObserveStreamData {
    Change(LeaderEvent),
    Closed(LostEvent),
}

/// An event of an election's observe stream: `elected` (a new term), `proclaimed` (the
/// leader's new value), `vacant` (`term` is the last leader's, if one was seen).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "queue-worker", "term": 43, "value": "10.0.0.7:9000"}))]
pub(crate) struct LeaderEvent {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub term: Option<FencingToken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

hold_request! {
    /// Fields of a semaphore's grant (taking a permit); each may also be given as a query
    /// parameter of the same name.
    #[schema(example = json!({"limit": 3, "ttl_ms": 60000, "wait_ms": 5000, "owner": "pool-worker-3"}))]
    struct SemaphoreRequest {
        /// How many permits of this name may be held at once: 1 to 1000. Required. Grants with
        /// different limits share the slots: a permit is one of slots 0 to `limit` - 1.
        #[schema(value_type = u64, minimum = 1, maximum = 1000)]
        pub limit: Option<Whole>,
        /// Free text naming the holder (at most 256 bytes), shown by inspect.
        #[schema(max_length = 256)]
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub owner: Option<String>,
    }
    /// Permit TTL in ms: from 100 to the configured maximum (default 3600000). Default 30000.
    ttl_ms,
    /// How long to wait while every permit is taken, in ms (default 0: do not wait).
    wait_ms,
}

/// A permit: what taking and renewing a semaphore's permit answer. A lease body with the
/// permit's slot and the limit it was granted with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "name": "db-pool", "lease_id": "q3JtZ0kPq6Nw2b1xVf8u4A_1_3", "fencing_token": 42,
    "slot": 1, "limit": 3, "ttl_ms": 30000, "validity_ms": 29697,
    "expires_at": "2026-11-22T03:00:30.000Z", "owner": "pool-worker-3"
}))]
pub(crate) struct PermitBody {
    pub name: String,
    /// Opaque; whoever knows it can renew and release the permit. Keep it secret.
    pub lease_id: String,
    /// Greater than the token of every earlier permit of this slot (and of every earlier
    /// grant these masters made). Stamp the slot's work with it.
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    /// Which of the `limit` slots this permit is: 0 to `limit` - 1.
    pub slot: u16,
    /// The limit the permit was granted with.
    pub limit: u16,
    #[schema(minimum = 100, maximum = 3600000)]
    pub ttl_ms: u64,
    /// How long you may rely on the permit from the moment this response was written.
    pub validity_ms: u64,
    /// When the permit lapses unless renewed.
    pub expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// One holder of a semaphore's permit, as inspect shows it; never with its lease id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct PermitHolder {
    pub slot: u16,
    #[schema(value_type = u64)]
    pub fencing_token: FencingToken,
    pub ttl_remaining_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A kept hold's (`kept: true`): when it ends unless revoked, RFC 3339. Absent for a
    /// lease its holder renews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until: Option<String>,
}

/// A semaphore as inspect shows it: the permits a majority of masters hold, by slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "db-pool", "holders": [{"slot": 0, "fencing_token": 41, "ttl_remaining_ms": 17250, "owner": "pool-worker-1"}]}))]
pub(crate) struct SemaphoreStatus {
    pub name: String,
    pub holders: Vec<PermitHolder>,
}

/// The `data` of a held permit's stream events: as a held lock's, with `PermitBody` for
/// `granted` and `heartbeat`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum PermitStreamData {
    Queued(QueuedEvent),
    Lease(PermitBody),
    Jeopardy(JeopardyEvent),
    Lost(LostEvent),
    Failed(ErrorBody),
}

/// What an administrator's force-release removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "nightly-report", "released": true, "fencing_token": 42}))]
pub(crate) struct ForceReleased {
    pub name: String,
    /// Whether a holder was removed (false: nobody held it).
    pub released: bool,
    /// The removed lease's token (a semaphore's: the highest of the permits removed);
    /// every later grant's is greater.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub fencing_token: Option<FencingToken>,
}

/// Every error body: `{"error": "<code>", "message": "<text for a person>"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"error": "lock_held", "message": "the lock is held by another lease", "retry_after_ms": 12000}))]
pub(crate) struct ErrorBody {
    /// A stable code: `invalid_request`, `request_timeout`, `unauthorized`, `forbidden`,
    /// `lock_held`, `lease_not_found`, `idempotency_mismatch`, `too_many_requests`,
    /// `quorum_unavailable`, `shutting_down`, `not_found`, `method_not_allowed`, `internal`.
    pub error: String,
    pub message: String,
    /// With `lock_held`: the holder's remaining TTL, best estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// With `quorum_unavailable`: the masters that failed the step, and how.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masters: Vec<MasterError>,
}

/// One master that failed a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct MasterError {
    /// The master's address, without credentials.
    pub address: String,
    /// `timeout`, `connection`, `script`, `amnesic` (lost its data or quarantined: not
    /// voting), `unverified` (reconnected: not voting until a probe has checked it kept its
    /// data), `clock` (its clock jumped or is too far off: not voting), `layout` (it keeps a
    /// data layout a later release wrote, which this one does not know), or `other`. A
    /// master whose answer the step did not wait for is not listed.
    pub error: String,
}

mod dapr;
mod fleetlock;
mod ops;
mod sessions;
mod values;

pub(crate) use dapr::{
    DaprErrorBody, DaprLockRequest, DaprLockResponse, DaprMetadata, DaprUnlockRequest,
    DaprUnlockResponse, MAX_RESOURCE_BYTES, MAX_STORE_BYTES,
};
pub(crate) use fleetlock::{FleetLockAnswer, FleetLockError, FleetLockRequest};
pub(crate) use ops::{Health, MasterReport, Readiness, ShardReport};
pub(crate) use sessions::{SessionBody, SessionHoldBody, SessionRequest, SessionStreamData};
pub(crate) use values::{Flag, Whole, flag, whole};

#[cfg(test)]
mod tests;
