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
pub struct TtlMs;
/// `wait_ms` as a query parameter.
pub struct WaitMs;
/// A list call's `limit`.
pub struct ListLimit;

schema_of! {
    LockName => lock_name,
    NamePrefix => name_prefix,
    LeaseId => lease_id,
    Owner => owner,
    IdempotencyKey => idempotency_key,
    TtlMs => ttl_ms,
    WaitMs => wait_ms,
    ListLimit => list_limit,
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

/// What every lock and election route may answer besides its own outcomes: the bearer
/// token's refusals and the caps.
pub struct Refusals;

impl IntoResponses for Refusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ResponsesBuilder::new()
            .response("401", error("`unauthorized`: with REDLOCKD_AUTH_FILE, no bearer token or an unknown one (`WWW-Authenticate: Bearer`)"))
            .response("403", error("`forbidden`: the token's role, or a name outside its prefixes"))
            .response("429", error("`too_many_requests`: past a cap (waiting grants, streams) or the token's rate; `Retry-After` says when to try again"))
            .build()
            .into()
    }
}

/// What a route that reads a body may answer about the body itself.
pub struct BodyRefusals;

impl IntoResponses for BodyRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ResponsesBuilder::new()
            .response(
                "408",
                error("`request_timeout`: the body did not arrive in time"),
            )
            .response(
                "413",
                error(&format!(
                    "`invalid_request`: the body is larger than {} bytes",
                    super::BODY_LIMIT_BYTES
                )),
            )
            .build()
            .into()
    }
}
