//! A lock's own operations (check a lease, list held locks, grant several at once), a
//! permit's check, and the operations routes;
//! the operations every kind shares are `kinds`. Each handler takes its input parsed (see
//! `extract`), calls the lease service, and answers. The request's op, outcome and latency are recorded once, by the middleware.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::{Fields, LeasePath, PermitPath};
use super::schema::{
    GraceMs, ListLimit, NameList, NoQuorum, Refusals, SessionIdParam, TtlMs, WaitMs,
};
use crate::auth::Caller;
use crate::model::{DEFAULT_LIST_LIMIT, LeaseId, LockName, MAX_LIST_LIMIT, NamePrefix};
use crate::model::{IdempotencyKey, MAX_GROUP_NAMES, Owner};
use crate::wire::{
    ErrorBody, GroupRequest, Health, LeaseBody, ListQuery, LockEntry, LockList, NoFields,
    PermitBody, Readiness, whole,
};
use axum::http::HeaderMap;

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
pub(crate) async fn check(
    State(state): State<AppState>,
    LeasePath(name, id): LeasePath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<LeaseBody>, ApiError> {
    let lease = state.service.check(name, id).await?;
    Ok(Json(LeaseBody::new(&lease, true)))
}

/// Check a permit: is it still held, and for how long. Its lease id names its slot.
#[utoipa::path(
    get, path = "/semaphores/{name}/leases/{lease_id}", tag = "semaphores", operation_id = "check_permit",
    params(("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Held: the permit body, with its `validity_ms` from now", body = PermitBody),
        (status = 404, description = "`lease_not_found`: released, expired, force-released, or not a permit of this semaphore", body = ErrorBody),
    )
)]
pub(crate) async fn check_permit(
    State(state): State<AppState>,
    PermitPath(name, id): PermitPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<PermitBody>, ApiError> {
    let permit = state.service.check(name, id).await?;
    Ok(Json(PermitBody::from(&permit)))
}

/// Grant several locks under one lease, all of them or none.
#[utoipa::path(
    post, path = "/locks", tag = "locks", operation_id = "grant_many",
    summary = "Grant several locks under one lease: all of them or none, in an order the server chooses.",
    params(
        ("names" = inline(Option<NameList>), Query, description = "as the body field: the names separated by commas (required in one or the other)"),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
        ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
        ("owner" = inline(Option<Owner>), Query, description = "as the body field"),
        ("session" = inline(Option<SessionIdParam>), Query, description = "as the body field"),
        ("kept" = inline(Option<bool>), Query, description = "as the body field"),
        ("grace_ms" = inline(Option<GraceMs>), Query, description = "as the body field: with `Accept: text/event-stream` only"),
        ("Idempotency-Key" = inline(Option<IdempotencyKey>), Header, nullable = false, description = "as for a lock's grant; the request is the names, ttl_ms and owner"),
    ),
    request_body(content = Option<GroupRequest>, description = "`names` is required (in the body or the query)"),
    responses(
        Refusals,
        (status = 201, description = "Granted: a lease body whose `names` lists every name (sorted) and whose one `fencing_token` is greater than every earlier token of each. Renew, check and revoke it through any of its names. (With `Accept: text/event-stream`, held while connected, as `POST /locks/{name}/hold`.)", body = LeaseBody,
            headers(("Location" = String, description = "/locks/{first name}/leases/{lease_id}"))),
        (status = 404, description = "`lease_not_found`: with an Idempotency-Key only, the lease it stands for was granted and has been revoked", body = ErrorBody),
        (status = 409, description = "`lock_held`: another lease holds one of the names (after `wait_ms`, if any)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "whole seconds, at least 1"))),
        (status = 422, description = "`idempotency_mismatch`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`, or `shutting_down`", body = ErrorBody),
    )
)]
pub(crate) async fn grant_many(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    Fields(req): Fields<GroupRequest>,
) -> Result<Response, ApiError> {
    if req.names.is_empty() || req.names.len() > MAX_GROUP_NAMES {
        return Err(ApiError::Invalid(format!(
            "names must list 1 to {MAX_GROUP_NAMES} lock names, got {}",
            req.names.len()
        )));
    }
    let mut names = Vec::with_capacity(req.names.len());
    for raw in &req.names {
        let name = LockName::parse(raw)?;
        if let Some(caller) = caller.as_deref()
            && !caller.covers(name.as_str())
        {
            return Err(ApiError::Forbidden(format!(
                "the token {:?} may not use {name}: it is outside the token's prefixes",
                &*caller.name
            )));
        }
        if names.contains(&name) {
            return Err(ApiError::Invalid(format!("names lists {name} twice")));
        }
        names.push(name);
    }
    let fields = req.holding();
    let caller = caller.as_deref();
    let target = fields.group(names, super::kinds::scope_of(caller))?;
    super::kinds::grant_target::<LeaseBody>(
        &state,
        target,
        fields,
        &headers,
        caller,
        std::convert::identity,
    )
    .await
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
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Fields(q): Fields<ListQuery>,
) -> Result<Json<LockList>, ApiError> {
    let prefix = NamePrefix::parse(q.prefix.as_deref().unwrap_or(""))?;
    let after = NamePrefix::parse(q.after.as_deref().unwrap_or(""))?;
    let limit = whole(q.limit).unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::Invalid(format!(
            "limit must be from 1 to {MAX_LIST_LIMIT}"
        )));
    }
    let (locks, next) = state.service.list(&prefix, &after, limit as usize).await?;
    // Only names the caller's token may see; the cursor still moves past the others.
    let visible = |name: &str| caller.as_ref().is_none_or(|c| c.covers(name));
    let policy = crate::lease::LeasePolicy::from(state.settings.leases);
    Ok(Json(LockList {
        locks: locks
            .into_iter()
            .filter(|l| visible(&l.name))
            .map(|h| LockEntry::new(h, &policy))
            .collect(),
        next,
    }))
}

/// Liveness: 200 while the process serves.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Serving", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
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
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
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
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    state
        .metrics
        .set_leases_active(state.service.active_leases());
    state
        .metrics
        .set_sessions_active(state.service.active_sessions());
    for (master, traffic) in state.service.master_traffic() {
        state
            .metrics
            .master_traffic(master, traffic.steps, traffic.calls);
    }
    let readiness = state.service.readiness();
    state.metrics.set_ready(readiness.ready);
    for master in &readiness.masters {
        state
            .metrics
            .master_health(&master.address, master.voting, master.quarantined_until);
        let jumps = match &master.cluster {
            Some(cluster) => cluster.shards.iter().fold([0, 0], |sum, shard| {
                [sum[0] + shard.clock_jumps[0], sum[1] + shard.clock_jumps[1]]
            }),
            None => master.clock_jumps,
        };
        state
            .metrics
            .master_clock(&master.address, master.clock_offset_s, jumps);
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
