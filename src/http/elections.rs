//! The election routes (`/elections/{name}`): campaign, leader, observe, renew or
//! proclaim, resign. An election is a lock of its own kind: the same lease machinery, with
//! the fencing token as the term and the owner text as the leader's value.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::{ElectionLeasePath, ElectionPath, Fields};
use super::handlers::{grant_or_hold, hold_stream, remove_holder};
use super::schema::{AdminOnly, NoQuorum, Refusals, TtlMs, WaitMs};
use super::stream;
use crate::auth::Caller;
use crate::lease::LeasePolicy;
use crate::model::{IdempotencyKey, LeaseId, LockName, Owner};
use crate::wire::ErrorBody;
use crate::wire::ForceReleased;
use crate::wire::{CampaignRequest, ElectionLease, Leader, NoFields, ProclaimRequest};
use axum::Extension;

/// Campaign: become the leader with a value, waiting like a grant.
#[utoipa::path(
    post, path = "/elections/{name}", tag = "elections",
    params(
        ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
        ("value" = inline(Option<Owner>), Query, description = "as the body field"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
        ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
        ("Idempotency-Key" = inline(Option<IdempotencyKey>), Header, nullable = false, description = "as for a lock's grant"),
    ),
    request_body(content = Option<CampaignRequest>, description = "May be empty"),
    responses(
        Refusals,
        (status = 201, description = "Elected: this candidate leads for the term in the body. (A request with `Accept: text/event-stream` is answered as `POST /elections/{name}/hold`.)", body = ElectionLease,
            headers(("Location" = String, description = "/elections/{name}/leases/{lease_id}"))),
        (status = 404, description = "`lease_not_found`: with an Idempotency-Key only, its lease has resigned", body = ErrorBody),
        (status = 409, description = "`lock_held`: another candidate leads (after `wait_ms`, if any)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "whole seconds, at least 1"))),
        (status = 422, description = "`idempotency_mismatch`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`, or `shutting_down` (a waiting campaign on a replica that is stopping)", body = ErrorBody),
    )
)]
pub async fn campaign(
    State(state): State<AppState>,
    ElectionPath(name): ElectionPath,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    Fields(req): Fields<CampaignRequest>,
) -> Result<Response, ApiError> {
    let grant = (req.ttl_ms, req.wait_ms, req.value.as_deref());
    grant_or_hold(&state, name, grant, &headers, caller.as_deref(), |lease| {
        Json(ElectionLease::new(lease)).into_response()
    })
    .await
    .map_err(ApiError::in_election)
}

/// Campaign and lead while the connection stays open: a campaign answered as an event
/// stream.
#[utoipa::path(
    post, path = "/elections/{name}/hold", tag = "elections",
    params(
        ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
        ("value" = inline(Option<Owner>), Query, description = "as the body field"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field: the lease is renewed at a third of it while connected"),
        ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<CampaignRequest>, description = "May be empty"),
    responses(
        Refusals,
        (status = 200, content_type = "text/event-stream", body = crate::wire::CampaignStreamData,
            description = "Leads while the connection stays open. Events as a held lock's stream (`POST /locks/{name}/hold`), \
with `elected` (`ElectionLease`) for `granted` and `heartbeat` carrying an `ElectionLease`."),
        (status = 400, description = "`invalid_request`: a field, before any stream; an Idempotency-Key", body = ErrorBody),
        (status = 503, description = "`shutting_down`: the replica is stopping", body = ErrorBody),
    )
)]
pub async fn campaign_held(
    State(state): State<AppState>,
    ElectionPath(name): ElectionPath,
    headers: HeaderMap,
    Fields(req): Fields<CampaignRequest>,
) -> Result<Response, ApiError> {
    let grant = (req.ttl_ms, req.wait_ms, req.value.as_deref());
    hold_stream(&state, name, grant, &headers).map_err(ApiError::in_election)
}

/// Who leads now: value, term and remaining TTL, or vacant.
#[utoipa::path(
    get, path = "/elections/{name}", tag = "elections",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "The election's state", body = Leader),
    )
)]
pub async fn leader(
    State(state): State<AppState>,
    ElectionPath(name): ElectionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<Leader>, ApiError> {
    let holder = state.service.inspect(&name).await?;
    Ok(Json(Leader::new(name.as_str(), holder)))
}

/// Observe: a stream of leadership changes, starting with the current state.
#[utoipa::path(
    get, path = "/elections/{name}/observe", tag = "elections",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals,
        (status = 200, content_type = "text/event-stream", body = crate::wire::ObserveStreamData,
            description = "First the current state, then each change, as `LeaderEvent`s: `elected` (a new term, with its value), \
`proclaimed` (the leader's new value, same term), `vacant` (`term` is the last leader's). Terms never go back. \
An observer more than 16 events behind is disconnected; on reconnecting it is told the current state. \
When the replica stops, the stream ends with `closed` (a `LostEvent`, reason `shutting_down`): reconnect, to another replica."),
    )
)]
pub async fn observe(
    State(state): State<AppState>,
    ElectionPath(name): ElectionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Response, ApiError> {
    let shown = name.as_str().to_owned();
    let changes = state.service.observe(name)?;
    Ok(stream::observe(shown, changes).into_response())
}

/// Renew the leader's term; with `value`, proclaim a new value in the same term.
#[utoipa::path(
    put, path = "/elections/{name}/leases/{lease_id}", tag = "elections",
    params(
        ("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path),
        ("value" = inline(Option<Owner>), Query, description = "as the body field"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<ProclaimRequest>, description = "May be empty"),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Renewed (and proclaimed)", body = ElectionLease),
        (status = 404, description = "`lease_not_found`: no longer the leader", body = ErrorBody),
    )
)]
pub async fn proclaim(
    State(state): State<AppState>,
    ElectionLeasePath(name, id): ElectionLeasePath,
    Fields(req): Fields<ProclaimRequest>,
) -> Result<Json<ElectionLease>, ApiError> {
    let ttl = LeasePolicy::from(state.settings.leases).renew_ttl(req.ttl_ms)?;
    let lease = match req.value.as_deref().map(Owner::parse).transpose()? {
        Some(value) => state.service.proclaim(name, id, ttl, value).await?,
        None => state.service.renew(name, id, ttl).await?,
    };
    Ok(Json(ElectionLease::new(&lease)))
}

/// Resign: step down now; the next candidate is woken at once.
#[utoipa::path(
    delete, path = "/elections/{name}/leases/{lease_id}", tag = "elections",
    params(("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 204, description = "Resigned"),
        (status = 404, description = "`lease_not_found`: not the leader", body = ErrorBody),
    )
)]
pub async fn resign(
    State(state): State<AppState>,
    ElectionLeasePath(name, id): ElectionLeasePath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<StatusCode, ApiError> {
    state.service.revoke(name, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Depose (administrators): remove the leader, whatever its lease, so that the next
/// candidate is elected.
#[utoipa::path(
    delete, path = "/elections/{name}", tag = "elections",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals, NoQuorum, AdminOnly,
        (status = 200, description = "Removed (or nobody led). The deposed leader's renew answers 404, a stream holding the leadership gets `lost` (`force_released`), the next candidate is elected, and every later term is greater", body = ForceReleased),
    )
)]
pub async fn depose(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    ElectionPath(name): ElectionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<ForceReleased>, ApiError> {
    remove_holder(&state, caller.as_deref(), name).await
}
