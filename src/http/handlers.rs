//! The handlers: each takes its input parsed (see `extract`), calls the lease service, and
//! answers. The request's op, outcome and latency are recorded once, by the middleware.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::{Fields, LeasePath, LockPath};
use super::schema::{AdminOnly, ListLimit, NoQuorum, Refusals, TtlMs, WaitMs};
use super::stream;
use crate::auth::Caller;
use crate::lease::LeasePolicy;
use crate::model::{
    DEFAULT_LIST_LIMIT, GrantKey, IdempotencyKey, LeaseId, LockName, MAX_LIST_LIMIT, NamePrefix,
    Owner,
};
use crate::wire::ErrorBody;
use crate::wire::ForceReleased;
use crate::wire::{
    GrantRequest, Health, LeaseBody, ListQuery, LockEntry, LockList, LockStatus, NoFields,
    Readiness, RenewRequest,
};
use axum::Extension;

/// Grant a lease on a lock.
#[utoipa::path(
    post, path = "/locks/{name}", tag = "locks",
    params(
        ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
        ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
        ("owner" = inline(Option<Owner>), Query, description = "as the body field"),
        ("Idempotency-Key" = inline(Option<IdempotencyKey>), Header, nullable = false, description = "1 to 255 visible ASCII characters, new for each grant (a random UUID) and sent again with each retry of it. \
A retry with the same key and request (name, ttl_ms, owner) answers the lease the first attempt won, with the same lease_id and fencing_token, while it holds the lock; \
404 once that lease has been revoked (within the grant's TTL); 422 for another request. Keys are scoped to the caller's token. Not with a held stream."),
    ),
    request_body(content = Option<GrantRequest>, description = "May be empty: every field has a default"),
    responses(
        Refusals,
        (status = 201, description = "Granted. (A request with `Accept: text/event-stream` is answered as `POST /locks/{name}/hold`, for clients written before that operation.)", body = LeaseBody,
            headers(("Location" = String, description = "/locks/{name}/leases/{lease_id}"))),
        (status = 404, description = "`lease_not_found`: with an Idempotency-Key only, the lease it stands for was granted and has been revoked", body = ErrorBody),
        (status = 409, description = "`lock_held`: held by another lease (after `wait_ms`, if any)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "whole seconds, at least 1"))),
        (status = 422, description = "`idempotency_mismatch`: the Idempotency-Key was used for another request", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`, or `shutting_down` (a waiting grant on a replica that is stopping)", body = ErrorBody),
    )
)]
pub async fn grant(
    State(state): State<AppState>,
    LockPath(name): LockPath,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    Fields(req): Fields<GrantRequest>,
) -> Result<Response, ApiError> {
    let grant = (req.ttl_ms, req.wait_ms, req.owner.as_deref());
    grant_or_hold(&state, name, grant, &headers, caller.as_deref(), |lease| {
        Json(LeaseBody::new(lease, false)).into_response()
    })
    .await
}

/// Hold a lock while the connection stays open: a grant answered as an event stream.
#[utoipa::path(
    post, path = "/locks/{name}/hold", tag = "locks",
    params(
        ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field: the lease is renewed at a third of it while connected"),
        ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
        ("owner" = inline(Option<Owner>), Query, description = "as the body field"),
    ),
    request_body(content = Option<GrantRequest>, description = "May be empty: every field has a default"),
    responses(
        Refusals,
        (status = 200, content_type = "text/event-stream", body = crate::wire::HoldStreamData,
            description = "The lease is held while the connection stays open. \
Events: `queued` (`QueuedEvent`, while waiting), `granted` (`LeaseBody`), `heartbeat` (`LeaseBody`, after each renew at a third of the TTL), \
then `lost` (`LostEvent`) or `failed` (`ErrorBody`: held after `wait_ms`, no quorum), after which the stream ends. \
Closing the connection revokes the lease at once."),
        (status = 400, description = "`invalid_request`: a field, before any stream; an Idempotency-Key (closing the stream revokes its lease, so there is nothing to retry)", body = ErrorBody),
        (status = 503, description = "`shutting_down`: the replica is stopping", body = ErrorBody),
    )
)]
pub async fn hold(
    State(state): State<AppState>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    Fields(req): Fields<GrantRequest>,
) -> Result<Response, ApiError> {
    let grant = (req.ttl_ms, req.wait_ms, req.owner.as_deref());
    hold_stream(&state, name, grant, &headers)
}

/// A grant's fields: `ttl_ms`, `wait_ms`, and the owner text (a leader's value).
pub(super) type GrantFields<'a> = (Option<u64>, Option<u64>, Option<&'a str>);

/// The request's `Idempotency-Key`, in its caller's scope (the token's name; one shared
/// scope without authentication).
pub(super) fn idempotency_key(
    headers: &HeaderMap,
    caller: Option<&Caller>,
) -> Result<Option<GrantKey>, ApiError> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let raw = raw
        .to_str()
        .map_err(|_| ApiError::Invalid("Idempotency-Key must be visible ASCII".into()))?;
    let key = IdempotencyKey::parse(raw)?;
    let scope = caller.map_or_else(|| "".into(), |c| c.name.clone());
    Ok(Some(GrantKey::new(scope, key)))
}

/// Grant `name` and answer 201 with `body` of the lease and its `Location`, or, when the
/// client asked for a stream (`Accept: text/event-stream`), hold it while the connection
/// lives. Shared by locks and elections, which differ in the lease's body and the stream's
/// grant event.
pub(super) async fn grant_or_hold(
    state: &AppState,
    name: crate::model::LockName,
    fields: GrantFields<'_>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
    body: impl FnOnce(&crate::lease::Lease) -> Response,
) -> Result<Response, ApiError> {
    if stream::wants_stream(headers) {
        return hold_stream(state, name, fields, headers);
    }
    let (ttl_ms, wait_ms, owner) = fields;
    let policy = LeasePolicy::from(state.settings.leases);
    let ttl = policy.ttl(ttl_ms)?;
    let wait = policy.wait(wait_ms)?;
    let owner = owner.map(Owner::parse).transpose()?;
    let key = idempotency_key(headers, caller)?;
    let lease = state
        .service
        .grant_keyed(name, ttl, wait, owner, key)
        .await?;
    let location = format!(
        "/{}/{}/leases/{}",
        lease.name.kind().route(),
        lease.name,
        lease.id.as_str()
    );
    let mut response = body(&lease);
    *response.status_mut() = StatusCode::CREATED;
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

/// Hold `name` while the connection lives, answering an event stream. A held stream takes
/// no Idempotency-Key: closing it revokes its lease, so there is nothing to retry.
pub(super) fn hold_stream(
    state: &AppState,
    name: crate::model::LockName,
    (ttl_ms, wait_ms, owner): GrantFields<'_>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let policy = LeasePolicy::from(state.settings.leases);
    let ttl = policy.ttl(ttl_ms)?;
    let wait = policy.wait(wait_ms)?;
    let owner = owner.map(Owner::parse).transpose()?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::Invalid(
            "Idempotency-Key does not apply to a held stream: closing the stream revokes its lease"
                .into(),
        ));
    }
    let kind = name.kind();
    let events = state.service.hold(name, ttl, wait, owner)?;
    Ok(stream::hold(kind, events).into_response())
}

/// Renew a lease: extend its TTL. The lease id and fencing token stay the same.
#[utoipa::path(
    put, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(
        ("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<RenewRequest>, description = "May be empty"),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Renewed", body = LeaseBody),
        (status = 404, description = "`lease_not_found`: expired, revoked, or not this lock's", body = ErrorBody),
    )
)]
pub async fn renew(
    State(state): State<AppState>,
    LeasePath(name, id): LeasePath,
    Fields(req): Fields<RenewRequest>,
) -> Result<Json<LeaseBody>, ApiError> {
    let ttl = LeasePolicy::from(state.settings.leases).renew_ttl(req.ttl_ms)?;
    let lease = state.service.renew(name, id, ttl).await?;
    Ok(Json(LeaseBody::new(&lease, false)))
}

/// Revoke a lease: free the lock now.
#[utoipa::path(
    delete, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 204, description = "Revoked; waiting grants are woken"),
        (status = 404, description = "`lease_not_found`: not held on a majority (expired, revoked, or never granted)", body = ErrorBody),
    )
)]
pub async fn revoke(
    State(state): State<AppState>,
    LeasePath(name, id): LeasePath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<StatusCode, ApiError> {
    state.service.revoke(name, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Check a lease: is it still held, and for how long.
#[utoipa::path(
    get, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Held, with `ttl_remaining_ms`", body = LeaseBody),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
    )
)]
pub async fn check(
    State(state): State<AppState>,
    LeasePath(name, id): LeasePath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<LeaseBody>, ApiError> {
    let lease = state.service.check(name, id).await?;
    Ok(Json(LeaseBody::new(&lease, true)))
}

/// Inspect a lock: who holds it, if anyone. Never shows a lease id.
#[utoipa::path(
    get, path = "/locks/{name}", tag = "locks",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "The lock's state", body = LockStatus),
    )
)]
pub async fn inspect(
    State(state): State<AppState>,
    LockPath(name): LockPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<LockStatus>, ApiError> {
    let holder = state.service.inspect(&name).await?;
    Ok(Json(LockStatus::new(name.as_str(), holder)))
}

/// Force-release (administrators): remove whoever holds the lock, whatever its lease.
#[utoipa::path(
    delete, path = "/locks/{name}", tag = "locks",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals, NoQuorum, AdminOnly,
        (status = 200, description = "Removed (or nobody held it). The removed holder's renew answers 404, a stream holding it gets `lost` (`force_released`), waiters are woken, and every later grant's fencing token is greater", body = ForceReleased),
    )
)]
pub async fn force_release(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    LockPath(name): LockPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<ForceReleased>, ApiError> {
    remove_holder(&state, caller.as_deref(), name).await
}

/// Remove whoever holds `name` (a lock or an election), with an audit line naming the
/// administrator.
pub(super) async fn remove_holder(
    state: &AppState,
    caller: Option<&Caller>,
    name: crate::model::LockName,
) -> Result<Json<ForceReleased>, ApiError> {
    let removed = state.service.force_release(&name).await?;
    let by = caller.map_or("anonymous (no REDLOCKD_AUTH_FILE)", |c| &*c.name);
    tracing::warn!(
        target: "redlockd::audit",
        administrator = by,
        lock = %name,
        fencing_token = removed.map(|t| t.0),
        "force-release"
    );
    Ok(Json(ForceReleased {
        name: name.to_string(),
        released: removed.is_some(),
        fencing_token: removed,
    }))
}

/// List held locks, sorted by name, a page at a time.
#[utoipa::path(
    get, path = "/locks", tag = "locks",
    params(
        ("prefix" = inline(Option<NamePrefix>), Query, description = "only names starting with this"),
        ("after" = inline(Option<NamePrefix>), Query, description = "only names after this one: the `next` of the previous page"),
        ("limit" = inline(Option<ListLimit>), Query, description = "at most this many (1 to 1000, default 100)"),
    ),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Held locks", body = LockList),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Fields(q): Fields<ListQuery>,
) -> Result<Json<LockList>, ApiError> {
    let prefix = NamePrefix::parse(q.prefix.as_deref().unwrap_or(""))?;
    let after = NamePrefix::parse(q.after.as_deref().unwrap_or(""))?;
    let limit = q.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::Invalid(format!(
            "limit must be from 1 to {MAX_LIST_LIMIT}"
        )));
    }
    let (locks, next) = state.service.list(&prefix, &after, limit as usize).await?;
    // Only names the caller's token may see; the cursor still moves past the others.
    let visible = |name: &str| caller.as_ref().is_none_or(|c| c.covers(name));
    Ok(Json(LockList {
        locks: locks
            .into_iter()
            .filter(|l| visible(&l.name))
            .map(LockEntry::from)
            .collect(),
        next,
    }))
}

/// Liveness: 200 while the process serves.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Serving", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// Readiness: 200 while a majority of masters answer and vote, else 503.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready: too few masters, or shutting down", body = Readiness),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.service.readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready: readiness.ready,
        backend: state.settings.backend.kind().to_owned(),
        problem: readiness.problem,
        masters: readiness.masters.into_iter().map(Into::into).collect(),
    };
    (status, Json(body)).into_response()
}

/// Prometheus metrics in the text format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain; version=0.0.4")))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    state
        .metrics
        .set_leases_active(state.service.active_leases());
    let readiness = state.service.readiness();
    state.metrics.set_ready(readiness.ready);
    for master in &readiness.masters {
        state
            .metrics
            .master_health(&master.address, master.voting, master.quarantined_until);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
