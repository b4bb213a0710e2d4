//! Dapr's distributed lock API (v1.0-alpha1), so that applications written against a Dapr
//! SDK's lock calls use redlockd where they used a sidecar's lock store: a lock is an
//! exclusive lease on `{store}:{resourceId}` held by `lockOwner`, not reentrant, and an
//! unlock names that holder rather than a lease id (`Target::held_by`). The store's name is a namespace of lock
//! names, so every store is served. Also the two reads an SDK makes before its first call:
//! `GET /v1.0/metadata` (the JavaScript SDK waits until it answers 200) and
//! `GET /v1.0/healthz/outbound` (other SDKs wait for its 204). Errors are Dapr's body,
//! `{"errorCode","message"}`, with Dapr's codes.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::{ApiError, Outcome};
use super::extract::in_scope;
use super::kinds::scope_of;
use super::schema::{Refusals, StoreName};
use crate::auth::Caller;
use crate::lease::{LeaseError, LeasePolicy, OwnedRevoke, Target, WaitTime};
use crate::model::{LeaseId, LockName, MAX_OWNER_BYTES, Owner, is_name_byte, millis};
use crate::wire::{
    DaprErrorBody, DaprLockRequest, DaprLockResponse, DaprMetadata, DaprUnlockRequest,
    DaprUnlockResponse,
};
use crate::wire::{MAX_RESOURCE_BYTES, MAX_STORE_BYTES};

/// Why a Dapr call failed, answered in Dapr's error body.
#[derive(Debug)]
pub(crate) enum DaprError {
    /// 400 `ERR_MALFORMED_REQUEST`: a body that is not the call's JSON, or a field out of
    /// its bounds.
    Malformed(String),
    /// A refusal in redlockd's own error body, as the middleware's refusals before the
    /// call is read are: a name outside the token's prefixes (403 `forbidden`), past a cap
    /// (429).
    Refused(ApiError),
    /// 500 `ERR_TRY_LOCK` or `ERR_UNLOCK`: the lease service could not answer (too few
    /// masters, shutting down, past a cap).
    Failed(&'static str, LeaseError),
    /// 500 `ERR_HEALTH_NOT_READY`: too few masters answer and vote, or shutting down.
    NotReady(String),
    /// 500 `ERR_LOCK_STORE_NOT_CONFIGURED`: this server's settings leave Dapr's locks off
    /// (`config::DAPR_NEEDS_A_SECOND`).
    Off(&'static str),
}

impl IntoResponse for DaprError {
    fn into_response(self) -> Response {
        let (status, code, message, outcome) = match self {
            DaprError::Malformed(message) => (
                StatusCode::BAD_REQUEST,
                "ERR_MALFORMED_REQUEST",
                message,
                "invalid_request",
            ),
            DaprError::Refused(refusal) => return refusal.into_response(),
            DaprError::Failed(code, cause) => {
                let message = cause.to_string();
                let outcome = ApiError::from(cause).code();
                tracing::warn!(reason = %message, code, "Dapr lock call failed");
                (StatusCode::INTERNAL_SERVER_ERROR, code, message, outcome)
            }
            DaprError::NotReady(message) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_HEALTH_NOT_READY",
                message,
                "not_ready",
            ),
            DaprError::Off(why) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "ERR_LOCK_STORE_NOT_CONFIGURED",
                why.to_owned(),
                "dapr_off",
            ),
        };
        let body = DaprErrorBody {
            error_code: code.to_owned(),
            message,
        };
        let mut response = (status, Json(body)).into_response();
        response.extensions_mut().insert(Outcome(outcome));
        response
    }
}

/// A call's JSON body. Fields Dapr's API does not name are ignored, as Dapr does.
fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, DaprError> {
    serde_json::from_slice(bytes)
        .map_err(|e| DaprError::Malformed(format!("the body is not this call's JSON: {e}")))
}

/// The lock `{store}:{resourceId}` names, if the caller's token may use it.
fn lock_name(parts: &Parts, store: &str, resource_id: &str) -> Result<LockName, DaprError> {
    for (what, value, max) in [
        ("the store's name", store, MAX_STORE_BYTES),
        ("resourceId", resource_id, MAX_RESOURCE_BYTES),
    ] {
        let fits = (1..=max).contains(&value.len()) && value.bytes().all(is_name_byte);
        if !fits {
            return Err(DaprError::Malformed(format!(
                "{what} must be 1 to {max} bytes of A-Z a-z 0-9 . _ : ~ -, got {value:?}"
            )));
        }
    }
    let name = LockName::parse(&format!("{store}:{resource_id}"))
        .map_err(|e| DaprError::Malformed(e.0))?;
    in_scope(parts, name).map_err(DaprError::Refused)
}

/// What the masters know `lockOwner` by on `name`, for the caller's token: the owner is a
/// capability (whoever sends it unlocks), so it is kept apart from the display `owner` that
/// inspect shows, and never shown or logged.
fn holder(parts: &Parts, name: &LockName, lock_owner: &str) -> Result<LeaseId, DaprError> {
    if lock_owner.is_empty() || Owner::parse(lock_owner).is_err() {
        return Err(DaprError::Malformed(format!(
            "lockOwner must be 1 to {MAX_OWNER_BYTES} bytes without control characters"
        )));
    }
    let caller = parts.extensions.get::<Caller>();
    Ok(LeaseId::of_holder(scope_of(caller), name, lock_owner))
}

/// Take the lock `{store}:{resourceId}` for `expiryInSeconds` if nobody holds it, without
/// waiting: `{"success": false}` while anyone does, its owner included.
#[utoipa::path(
    post, path = "/v1.0-alpha1/lock/{store}", tag = "dapr", operation_id = "daprLock",
    summary = "Dapr: take a lock",
    params(("store" = inline(StoreName), Path, description = "the lock store's name: a namespace of lock names")),
    request_body(content = DaprLockRequest, content_type = "application/json"),
    responses(
        Refusals,
        (status = 200, description = "Taken (`true`), or held by anyone (`false`)", body = DaprLockResponse),
        (status = 400, description = "Not this call's body, or a field out of its bounds", body = DaprErrorBody),
        (status = 500, description = "Too few masters answered (`ERR_TRY_LOCK`), or this server's largest TTL (REDLOCKD_MAX_TTL_MS) is below Dapr's one second (`ERR_LOCK_STORE_NOT_CONFIGURED`)", body = DaprErrorBody),
    )
)]
pub(crate) async fn lock(
    State(state): State<AppState>,
    Path(store): Path<String>,
    parts: Parts,
    bytes: Bytes,
) -> Result<Response, DaprError> {
    let req: DaprLockRequest = body(&bytes)?;
    let name = lock_name(&parts, &store, &req.resource_id)?;
    let holder = holder(&parts, &name, &req.lock_owner)?;
    let policy = LeasePolicy::from(state.settings.leases);
    if crate::config::dapr_off(policy.max_ttl()) {
        return Err(DaprError::Off(crate::config::DAPR_NEEDS_A_SECOND));
    }
    let max = millis(policy.max_ttl()) / 1000;
    let ttl = u64::try_from(req.expiry_in_seconds)
        .ok()
        .filter(|s| (1..=max).contains(s))
        .and_then(|s| policy.ttl(Some(s * 1000)).ok())
        .ok_or_else(|| {
            DaprError::Malformed(format!(
                "expiryInSeconds must be from 1 to {max}, got {}",
                req.expiry_in_seconds
            ))
        })?;
    let target = Target::from(name).held_by(holder);
    match state.service.grant(target, ttl, WaitTime::NONE, None).await {
        Ok(_) => Ok(Json(DaprLockResponse { success: true }).into_response()),
        Err(e @ (LeaseError::Held { .. } | LeaseError::Delayed { .. })) => {
            // Counted as a refused grant is, so that contention shows in the metrics.
            let mut response = Json(DaprLockResponse { success: false }).into_response();
            response
                .extensions_mut()
                .insert(Outcome(ApiError::from(e).code()));
            Ok(response)
        }
        Err(e @ LeaseError::TooMany { .. }) => Err(DaprError::Refused(e.into())),
        Err(e) => Err(DaprError::Failed("ERR_TRY_LOCK", e)),
    }
}

/// Release the lock `{store}:{resourceId}` if `lockOwner` holds it.
#[utoipa::path(
    post, path = "/v1.0-alpha1/unlock/{store}", tag = "dapr", operation_id = "daprUnlock",
    summary = "Dapr: release a lock its owner holds",
    params(("store" = inline(StoreName), Path, description = "the lock store's name: a namespace of lock names")),
    request_body(content = DaprUnlockRequest, content_type = "application/json"),
    responses(
        Refusals,
        (status = 200, description = "`0` released, `1` nobody holds the lock, `2` another owner does (left held)", body = DaprUnlockResponse),
        (status = 400, description = "Not this call's body, or a field out of its bounds", body = DaprErrorBody),
        (status = 500, description = "Too few masters answered (`ERR_UNLOCK`)", body = DaprErrorBody),
    )
)]
pub(crate) async fn unlock(
    State(state): State<AppState>,
    Path(store): Path<String>,
    parts: Parts,
    bytes: Bytes,
) -> Result<Json<DaprUnlockResponse>, DaprError> {
    let req: DaprUnlockRequest = body(&bytes)?;
    let name = lock_name(&parts, &store, &req.resource_id)?;
    let holder = holder(&parts, &name, &req.lock_owner)?;
    let target = Target::from(name).held_by(holder);
    let status = match state.service.revoke_held_by(&target).await {
        Ok(OwnedRevoke::Revoked) => 0,
        Ok(OwnedRevoke::Free) => 1,
        Ok(OwnedRevoke::Others) => 2,
        Err(e @ LeaseError::TooMany { .. }) => return Err(DaprError::Refused(e.into())),
        Err(e) => return Err(DaprError::Failed("ERR_UNLOCK", e)),
    };
    Ok(Json(DaprUnlockResponse { status }))
}

/// What a Dapr SDK reads to see its sidecar started.
#[utoipa::path(
    get, path = "/v1.0/metadata", tag = "dapr", operation_id = "daprMetadata",
    summary = "Dapr: the sidecar's metadata",
    responses((status = 200, description = "Serving", body = DaprMetadata))
)]
pub(crate) async fn metadata() -> Json<DaprMetadata> {
    Json(DaprMetadata {
        id: "redlockd".to_owned(),
        runtime_version: concat!("redlockd ", env!("CARGO_PKG_VERSION")).to_owned(),
        components: Vec::new(),
    })
}

/// Dapr's readiness, as `/readyz`'s: 204 while a majority of masters answer and vote.
#[utoipa::path(
    get, path = "/v1.0/healthz", tag = "dapr", operation_id = "daprHealthz",
    summary = "Dapr: ready",
    responses(
        (status = 204, description = "Ready"),
        (status = 500, description = "Not ready: too few masters, or shutting down", body = DaprErrorBody),
    )
)]
pub(crate) async fn healthz(State(state): State<AppState>) -> Result<StatusCode, DaprError> {
    ready(&state)
}

/// What SDKs other than JavaScript's wait on before their first call: as `/v1.0/healthz`.
#[utoipa::path(
    get, path = "/v1.0/healthz/outbound", tag = "dapr", operation_id = "daprHealthzOutbound",
    summary = "Dapr: ready for calls",
    responses(
        (status = 204, description = "Ready"),
        (status = 500, description = "Not ready: too few masters, or shutting down", body = DaprErrorBody),
    )
)]
pub(crate) async fn outbound(State(state): State<AppState>) -> Result<StatusCode, DaprError> {
    ready(&state)
}

fn ready(state: &AppState) -> Result<StatusCode, DaprError> {
    let readiness = state.service.readiness();
    if readiness.ready {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(DaprError::NotReady(
            readiness.problem.unwrap_or_else(|| "not ready".to_owned()),
        ))
    }
}
