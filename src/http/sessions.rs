//! Sessions: open (or hold by a stream), renew, read and end; one heartbeat for every lock,
//! permit and election term held through the session.

use std::convert::Infallible;
use std::time::SystemTime;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::Stream;

use super::AppState;
use super::error::ApiError;
use super::extract::Fields;
use super::kinds::scope_of;
use super::schema::{GraceMs, NoQuorum, Refusals, SessionIdParam, TtlMs};
use super::stream;
use super::types::rfc3339;
use crate::auth::Caller;
use crate::lease::{HeldThrough, LeasePolicy, Session, SessionEvent, SessionLost};
use crate::model::{Kind, LeaseId, Owner, SessionId};
use crate::wire::{
    ErrorBody, LockMode, NoFields, RenewRequest, ResumeRequest, SessionBody, SessionHoldBody,
    SessionRequest, SessionStreamData, whole,
};

/// The `{session_id}` of a session's route, parsed.
pub(crate) struct SessionPath(pub SessionId);

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Invalid("malformed session id".into()))?;
        // A session belongs to the token that opened it: another token finds none.
        let caller = parts.extensions.get::<Caller>();
        Ok(Self(SessionId::parse(&raw, scope_of(caller))?))
    }
}

impl From<&Session> for SessionBody {
    fn from(session: &Session) -> Self {
        Self {
            session_id: session.id.as_str().to_owned(),
            ttl_ms: crate::model::millis(session.ttl),
            validity_ms: crate::model::millis(session.validity_now()),
            expires_at: rfc3339(
                SystemTime::now() + session.remaining.saturating_sub(session.at.elapsed()),
            ),
            owner: session.owner.as_deref().map(str::to_owned),
            holds: None,
            kept: session.kept.as_deref().map(ids),
            unconfirmed: (!session.unconfirmed.is_empty()).then(|| ids(&session.unconfirmed)),
            lost: (!session.lost.is_empty()).then(|| ids(&session.lost)),
        }
    }
}

/// Lease ids as the session's holder is shown them.
fn ids(leases: &[LeaseId]) -> Vec<String> {
    leases.iter().map(|l| l.as_str().to_owned()).collect()
}

impl From<&HeldThrough> for SessionHoldBody {
    fn from(hold: &HeldThrough) -> Self {
        Self {
            kind: hold.kind.label().to_owned(),
            name: hold.name.clone(),
            lease_id: hold.lease.as_str().to_owned(),
            fencing_token: hold.token,
            names: (!hold.names.is_empty()).then(|| hold.names.clone()),
            slot: hold.slot,
            mode: (hold.kind == Kind::Mutex).then_some(if hold.shared {
                LockMode::Shared
            } else {
                LockMode::Exclusive
            }),
        }
    }
}

/// Open a session.
#[utoipa::path(
    post, path = "/sessions", tag = "sessions", operation_id = "open_session",
    summary = "Open a session: one heartbeat for every lock, permit and election term held through it.",
    params(
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
        ("owner" = inline(Option<crate::model::Owner>), Query, description = "as the body field"),
        ("grace_ms" = inline(Option<GraceMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<SessionRequest>, description = "May be empty: every field has a default"),
    responses(
        Refusals, NoQuorum,
        (status = 201, description = "Opened. Grants that name it (`\"session\": \"<session_id>\"`) are held for as long as it is. With `Accept: text/event-stream`, the session lives while the connection does: events `opened` (`SessionBody`), `heartbeat` (`SessionBody`, after each renew at a third of the TTL), `jeopardy` (`JeopardyEvent`: renews are not getting through and less than a third of the TTL is left; told once) and `safe` (`JeopardyEvent`: one got through again), then `lost` (`LostEvent`: it could not be renewed) or `closed` (`LostEvent`: `shutting_down`, with `validity_ms` and `resume`, or `resumed`: another stream took it over) and the stream ends; closing the connection ends the session and releases what is held through it, at once or after `grace_ms` (renewed no further meanwhile) if no resume took it over by then.", body = SessionBody,
            headers(("Location" = String, description = "/sessions/{session_id}"))),
    )
)]
pub(crate) async fn open(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    Fields(req): Fields<SessionRequest>,
) -> Result<Response, ApiError> {
    let policy = LeasePolicy::from(state.settings.leases);
    let ttl = policy.ttl(whole(req.ttl_ms))?;
    let owner = req.owner.as_deref().map(Owner::parse).transpose()?;
    let grace = policy.grace(whole(req.grace_ms))?;
    let scope = scope_of(caller.as_deref());
    if stream::wants_stream(&headers) {
        let events = state
            .service
            .hold_session(ttl, owner, scope.into(), grace)?;
        return Ok(held(events).into_response());
    }
    let session = state.service.open_session(ttl, owner, scope).await?;
    let mut response = Json(SessionBody::from(&session)).into_response();
    *response.status_mut() = StatusCode::CREATED;
    if let Ok(value) = HeaderValue::from_str(&format!("/sessions/{}", session.id.as_str())) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

/// Renew a session, and with it every hold made through it.
#[utoipa::path(
    put, path = "/sessions/{session_id}", tag = "sessions", operation_id = "renew_session",
    summary = "Renew a session: every lock, permit and term held through it is renewed with it, in one call per master.",
    params(
        ("session_id" = inline(SessionIdParam), Path),
        ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<RenewRequest>, description = "May be empty: the session's own TTL"),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "Renewed", body = SessionBody),
        (status = 404, description = "`session_not_found`: expired, ended, or never opened", body = ErrorBody),
    )
)]
pub(crate) async fn renew(
    State(state): State<AppState>,
    SessionPath(id): SessionPath,
    Fields(req): Fields<RenewRequest>,
) -> Result<Json<SessionBody>, ApiError> {
    let ttl = LeasePolicy::from(state.settings.leases).renew_ttl(whole(req.ttl_ms))?;
    let session = state.service.renew_session(&id, ttl).await?;
    Ok(Json(SessionBody::from(&session)))
}

/// Hold a session, opened before, through a new stream (a resume).
#[utoipa::path(
    post, path = "/sessions/{session_id}/hold", tag = "sessions", operation_id = "resume_session",
    summary = "Resume a session's held stream: hold the session through this stream from now on.",
    params(
        ("session_id" = inline(SessionIdParam), Path),
        ("grace_ms" = inline(Option<GraceMs>), Query, description = "as the body field"),
    ),
    request_body(content = Option<ResumeRequest>, description = "May be empty: no grace"),
    responses(
        Refusals,
        (status = 200, content_type = "text/event-stream", body = SessionStreamData, description = "The stream holds the session opened before: `resumed` (`SessionBody`, after a renew made at once), then as a session's held stream goes on (`heartbeat`, `jeopardy`, `safe`, `lost`, `closed`), or `failed` (`ErrorBody`: `session_not_found` when it expired or was ended, `quorum_unavailable`) and the end. From the resume on, only this stream's end ends the session: an older stream of it that closes later ends nothing, and one still open is told `closed` (`resumed`) at its next renew. Closing the connection ends the session at once, or after `grace_ms` (renewed no further meanwhile) if no resume took it over by then."),
        (status = 400, description = "`invalid_request`: a malformed session id or a bad `grace_ms`", body = ErrorBody),
        (status = 503, description = "`shutting_down`", body = ErrorBody),
    )
)]
pub(crate) async fn resume(
    State(state): State<AppState>,
    SessionPath(id): SessionPath,
    Fields(req): Fields<ResumeRequest>,
) -> Result<Response, ApiError> {
    let grace = LeasePolicy::from(state.settings.leases).grace(whole(req.grace_ms))?;
    let events = state.service.resume_session(id, grace)?;
    Ok(held(events).into_response())
}

/// End a session: release everything held through it.
#[utoipa::path(
    delete, path = "/sessions/{session_id}", tag = "sessions", operation_id = "end_session",
    summary = "End a session: every lock, permit and election term held through it is released at once.",
    params(("session_id" = inline(SessionIdParam), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 204, description = "Ended; waiting grants on every replica are woken"),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    )
)]
pub(crate) async fn end(
    State(state): State<AppState>,
    SessionPath(id): SessionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<StatusCode, ApiError> {
    state.service.end_session(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A session and what is held through it.
#[utoipa::path(
    get, path = "/sessions/{session_id}", tag = "sessions", operation_id = "read_session",
    summary = "Read a session: its TTL, what is left of it, and every hold made through it.",
    params(("session_id" = inline(SessionIdParam), Path)),
    responses(
        Refusals, NoQuorum,
        (status = 200, description = "The session body with `holds`", body = SessionBody),
        (status = 404, description = "`session_not_found`", body = ErrorBody),
    )
)]
pub(crate) async fn read(
    State(state): State<AppState>,
    SessionPath(id): SessionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Json<SessionBody>, ApiError> {
    let session = state.service.session(&id).await?;
    let mut body = SessionBody::from(&session);
    body.holds = Some(session.holds.iter().map(SessionHoldBody::from).collect());
    Ok(Json(body))
}

fn event<T: serde::Serialize>(name: &'static str, data: &T) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name))
}

/// The SSE response of a session held by a stream.
fn held(
    rx: tokio::sync::mpsc::Receiver<SessionEvent>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static> {
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let next = match rx.recv().await? {
            SessionEvent::Opened(s) => event("opened", &SessionBody::from(&s)),
            SessionEvent::Resumed(s) => event("resumed", &SessionBody::from(&s)),
            SessionEvent::Heartbeat(s) => event("heartbeat", &SessionBody::from(&s)),
            SessionEvent::Jeopardy { validity } => stream::jeopardy(validity),
            SessionEvent::Safe { validity } => stream::safe(validity),
            SessionEvent::Lost(reason) => stream::ended("lost", reason.code(), reason.message()),
            SessionEvent::Closed { validity } => stream::closed(
                "this replica is shutting down; the session was not ended: rely on it (and its holds) for validity_ms, and resume it through another replica to keep it",
                validity,
            ),
            SessionEvent::Displaced => stream::ended(
                "closed",
                SessionLost::Resumed.code(),
                SessionLost::Resumed.message(),
            ),
            SessionEvent::Failed(e) => event("failed", &ApiError::from(e).body()),
        };
        Some((Ok(next), rx))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(stream::KEEP_ALIVE))
}
