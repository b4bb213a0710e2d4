//! The handlers: each parses its input into domain types, calls the lease service, and
//! records the request in the metrics whatever the outcome.

use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::middleware::Outcome;
use super::types::{
    GrantRequest, Health, LeaseBody, ListQuery, LockEntry, LockList, LockStatus, NoFields,
    Readiness, RenewRequest, parse_fields,
};
use crate::config::MIN_TTL_MS;
use crate::lease::{LeaseId, LockName, NamePrefix, Owner, WaitPolicy};
use crate::metrics::Op;

/// Largest `limit` of a list call, and the default.
pub const MAX_LIST_LIMIT: u64 = 1000;
pub const DEFAULT_LIST_LIMIT: u64 = 100;

fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge
        } else {
            ApiError::Invalid(e.body_text())
        }
    })
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(v)| v)
        .map_err(|e| ApiError::Invalid(e.body_text()))
}

/// Record the request's outcome and duration, then answer.
fn finish<T: IntoResponse>(
    state: &AppState,
    op: Op,
    started: Instant,
    result: Result<T, ApiError>,
) -> Response {
    let outcome = match &result {
        Ok(_) => "ok",
        Err(e) => e.code(),
    };
    state.metrics.request(op, outcome, started.elapsed());
    if let Err(ApiError::Unavailable(why)) = &result {
        tracing::warn!(op = op.as_str(), reason = %why, "request failed: quorum unavailable");
    }
    let mut response = result.into_response();
    response.extensions_mut().insert(Outcome(outcome));
    response
}

fn ttl(state: &AppState, ttl_ms: u64) -> Result<Duration, ApiError> {
    let max = state.config.max_ttl_ms;
    if (MIN_TTL_MS..=max).contains(&ttl_ms) {
        Ok(Duration::from_millis(ttl_ms))
    } else {
        Err(ApiError::Invalid(format!(
            "ttl_ms must be from {MIN_TTL_MS} to {max}, got {ttl_ms}"
        )))
    }
}

/// Grant a lease on a lock.
#[utoipa::path(
    post, path = "/locks/{name}", tag = "locks",
    params(
        ("name" = String, Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
        ("ttl_ms" = Option<u64>, Query, description = "as the body field"),
        ("wait_ms" = Option<u64>, Query, description = "as the body field"),
        ("owner" = Option<String>, Query, description = "as the body field"),
    ),
    request_body(content = Option<GrantRequest>, description = "May be empty: every field has a default"),
    responses(
        (status = 201, description = "Granted", body = LeaseBody,
            headers(("Location" = String, description = "/locks/{name}/leases/{lease_id}"))),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 409, description = "`lock_held`: held by another lease (after `wait_ms`, if any)", body = ErrorBody,
            headers(("Retry-After" = u64, description = "whole seconds, at least 1"))),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn grant(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let result = async {
        let name = LockName::parse(&path(name)?)?;
        let req: GrantRequest = parse_fields(query.as_deref(), &body(raw)?)?;
        let ttl = ttl(&state, req.ttl_ms.unwrap_or(state.config.default_ttl_ms))?;
        let wait = req.wait_ms.unwrap_or(0);
        if wait > state.config.max_wait_ms {
            return Err(ApiError::Invalid(format!(
                "wait_ms must be at most {}, got {wait}",
                state.config.max_wait_ms
            )));
        }
        let owner = req.owner.as_deref().map(Owner::parse).transpose()?;
        let policy = WaitPolicy {
            wait: Duration::from_millis(wait),
        };
        let lease = state.service.grant(name, ttl, policy, owner).await?;
        let location = format!("/locks/{}/leases/{}", lease.name, lease.id.as_str());
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&location) {
            headers.insert(header::LOCATION, value);
        }
        Ok((
            StatusCode::CREATED,
            headers,
            Json(LeaseBody::new(&lease, false)),
        ))
    }
    .await;
    finish(&state, Op::Grant, started, result)
}

/// Renew a lease: extend its TTL. The lease id and fencing token stay the same.
#[utoipa::path(
    put, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(
        ("name" = String, Path), ("lease_id" = String, Path),
        ("ttl_ms" = Option<u64>, Query, description = "as the body field"),
    ),
    request_body(content = Option<RenewRequest>, description = "May be empty"),
    responses(
        (status = 200, description = "Renewed", body = LeaseBody),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`: expired, revoked, or not this lock's", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn renew(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let result = async {
        let (name, id) = path(ids)?;
        let (name, id) = (LockName::parse(&name)?, LeaseId::parse(&id)?);
        let req: RenewRequest = parse_fields(query.as_deref(), &body(raw)?)?;
        let ttl = req.ttl_ms.map(|t| ttl(&state, t)).transpose()?;
        let lease = state.service.renew(name, id, ttl).await?;
        Ok(Json(LeaseBody::new(&lease, false)))
    }
    .await;
    finish(&state, Op::Renew, started, result)
}

/// Revoke a lease: free the lock now.
#[utoipa::path(
    delete, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(("name" = String, Path), ("lease_id" = String, Path)),
    responses(
        (status = 204, description = "Revoked; waiting grants are woken"),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn revoke(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let result = async {
        let (name, id) = path(ids)?;
        let (name, id) = (LockName::parse(&name)?, LeaseId::parse(&id)?);
        parse_fields::<NoFields>(query.as_deref(), &body(raw)?)?;
        state.service.revoke(name, id).await?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    finish(&state, Op::Revoke, started, result)
}

/// Check a lease: is it still held, and for how long.
#[utoipa::path(
    get, path = "/locks/{name}/leases/{lease_id}", tag = "locks",
    params(("name" = String, Path), ("lease_id" = String, Path)),
    responses(
        (status = 200, description = "Held, with `ttl_remaining_ms`", body = LeaseBody),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 404, description = "`lease_not_found`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn check(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let result = async {
        let (name, id) = path(ids)?;
        let (name, id) = (LockName::parse(&name)?, LeaseId::parse(&id)?);
        parse_fields::<NoFields>(query.as_deref(), b"")?;
        let lease = state.service.check(name, id).await?;
        Ok(Json(LeaseBody::new(&lease, true)))
    }
    .await;
    finish(&state, Op::Check, started, result)
}

/// Inspect a lock: who holds it, if anyone. Never shows a lease id.
#[utoipa::path(
    get, path = "/locks/{name}", tag = "locks",
    params(("name" = String, Path)),
    responses(
        (status = 200, description = "The lock's state", body = LockStatus),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn inspect(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Response {
    let started = Instant::now();
    let result = async {
        let name = LockName::parse(&path(name)?)?;
        parse_fields::<NoFields>(query.as_deref(), b"")?;
        let holder = state.service.inspect(&name).await?;
        Ok(Json(LockStatus::new(name.as_str(), holder)))
    }
    .await;
    finish(&state, Op::Inspect, started, result)
}

/// List held locks, sorted by name.
#[utoipa::path(
    get, path = "/locks", tag = "locks",
    params(
        ("prefix" = Option<String>, Query, description = "only names starting with this"),
        ("limit" = Option<u64>, Query, description = "at most this many (1 to 1000, default 100)"),
    ),
    responses(
        (status = 200, description = "Held locks", body = LockList),
        (status = 400, description = "`invalid_request`", body = ErrorBody),
        (status = 503, description = "`quorum_unavailable`", body = ErrorBody),
    )
)]
pub async fn list(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let started = Instant::now();
    let result = async {
        let q: ListQuery = parse_fields(query.as_deref(), b"")?;
        let prefix = NamePrefix::parse(q.prefix.as_deref().unwrap_or(""))?;
        let limit = q.limit.unwrap_or(DEFAULT_LIST_LIMIT);
        if !(1..=MAX_LIST_LIMIT).contains(&limit) {
            return Err(ApiError::Invalid(format!(
                "limit must be from 1 to {MAX_LIST_LIMIT}"
            )));
        }
        let locks = state.service.list(&prefix, limit as usize).await?;
        Ok(Json(LockList {
            locks: locks.into_iter().map(LockEntry::from).collect(),
        }))
    }
    .await;
    finish(&state, Op::List, started, result)
}

/// Liveness: 200 while the process serves.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Serving", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: 200 while a majority of masters answer and vote, else 503.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready: too few masters, or shutting down", body = Readiness),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let engine = state.service.engine();
    let ready = engine.monitor().ready() && !state.shutdown.is_cancelled();
    let body = Readiness {
        ready,
        backend: state.backend,
        masters: engine
            .monitor()
            .status()
            .into_iter()
            .map(Into::into)
            .collect(),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
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
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
