//! A lock's own operations (check a lease, list held locks) and the operations routes;
//! the operations every kind shares are `kinds`. Each handler takes its input parsed (see
//! `extract`), calls the lease service, and answers. The request's op, outcome and latency are recorded once, by the middleware.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::{Fields, LeasePath};
use super::schema::{ListLimit, NoQuorum, Refusals};
use crate::auth::Caller;
use crate::model::{DEFAULT_LIST_LIMIT, LeaseId, LockName, MAX_LIST_LIMIT, NamePrefix};
use crate::wire::{
    ErrorBody, Health, LeaseBody, ListQuery, LockEntry, LockList, NoFields, Readiness, whole,
};

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
    let limit = whole(q.limit).unwrap_or(DEFAULT_LIST_LIMIT);
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
