//! What the OpenAPI document says of the values the edge parses and of the answers every
//! lock and election route may give, from the same definitions the server uses: the
//! newtypes' schemas (`wire::schema`) and the shared refusal rows. Nothing is patched into
//! the document after it is generated.

use std::collections::BTreeMap;

use utoipa::openapi::response::{ResponseBuilder, ResponsesBuilder};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, Schema};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use crate::model::{IdempotencyKey, LeaseId, LockName, NamePrefix, Owner};
use crate::wire::schema;

/// Each type's schema is the `wire::schema` function of the same value.
macro_rules! schema_of {
    ($($ty:ty => $f:ident),* $(,)?) => {$(
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                schema::of(schema::$f)
            }
        }
        impl ToSchema for $ty {}
    )*};
}

/// `ttl_ms` as a query parameter.
pub(crate) struct TtlMs;
/// `wait_ms` as a query parameter.
pub(crate) struct WaitMs;
/// A list call's `limit`.
pub(crate) struct ListLimit;
/// A fencing token in a path.
pub(crate) struct FenceToken;
/// A semaphore's `limit` as a query parameter.
pub(crate) struct PermitLimitParam;
/// Several lock names as a query parameter, separated by commas.
pub(crate) struct NameList;
/// `lock_delay_ms` as a query parameter.
pub(crate) struct LockDelayMs;
/// `grace_ms` as a query parameter.
pub(crate) struct GraceMs;
/// A session id, in a path or as the `session` query parameter.
pub(crate) struct SessionIdParam;
/// A Dapr lock store's name, in a path.
pub(crate) struct StoreName;
/// A FleetLock reboot group, in a path.
pub(crate) struct GroupName;
/// FleetLock's `fleet-lock-protocol` header.
pub(crate) struct FleetLockHeader;

schema_of! {
    LockName => lock_name,
    NamePrefix => name_prefix,
    LeaseId => lease_id,
    Owner => owner,
    IdempotencyKey => idempotency_key,
    TtlMs => ttl_ms,
    WaitMs => wait_ms,
    ListLimit => list_limit,
    FenceToken => fencing_token,
    PermitLimitParam => permit_limit,
    NameList => name_list,
    LockDelayMs => lock_delay_ms,
    GraceMs => grace_ms,
    SessionIdParam => lease_id,
    StoreName => store_name,
    GroupName => fleetlock_group,
    FleetLockHeader => fleetlock_header,
}

/// An answer with the contract's error body.
fn error(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(RefOr::<Schema>::Ref(Ref::from_schema_name(
                    "ErrorBody",
                ))))
                .build(),
        )
        .build()
        .into()
}

/// Each set of answers that many routes share, as rows of status and description, every
/// one with the contract's error body. A route lists the sets, then its own rows (which
/// replace a set's row of the same status).
macro_rules! answer_sets {
    ($($(#[$doc:meta])* $set:ident { $($status:literal => $description:expr),* $(,)? })*) => {$(
        $(#[$doc])*
        pub(crate) struct $set;

        impl IntoResponses for $set {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                let rows = ResponsesBuilder::new();
                $(let rows = rows.response($status, error(&$description));)*
                rows.build().into()
            }
        }
    )*};
}

answer_sets! {
    /// What every lock and election route may answer besides its own outcomes: a refused
    /// input, the bearer token's refusals, the caps, and a body that came too slowly or
    /// too large.
    Refusals {
        "400" => "`invalid_request`",
        "401" => "`unauthorized`: with REDLOCKD_AUTH_FILE, no bearer token or an unknown one (`WWW-Authenticate: Bearer`)",
        "403" => "`forbidden`: the token's role, or a name outside its prefixes",
        "408" => "`request_timeout`: the body did not arrive in time",
        "413" => format!("`invalid_request`: the body is larger than {} bytes", super::BODY_LIMIT_BYTES),
        "429" => "`too_many_requests`: past a cap (waiting grants, streams) or the token's rate; `Retry-After` says when to try again",
    }

    /// What a route that asks the masters answers when a majority cannot be reached.
    NoQuorum {
        "503" => "`quorum_unavailable`",
    }

    /// The refusals of a route for administrators only (listed after `Refusals`, whose
    /// rows these replace).
    AdminOnly {
        "401" => "`unauthorized`",
        "403" => "`forbidden`: an admin token is required",
    }
}
