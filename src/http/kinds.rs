//! The operations every kind of hold shares (grant, hold, renew, revoke, inspect, whether a
//! fencing token is current, and force-release), written once for all kinds. A kind brings three things: its bodies (in
//! `wire`, with how its requests read below), its words in `kinds.json` (the OpenAPI
//! document's operation ids and descriptions), and one `kind_routes!` line (its routes,
//! its bodies' types, the error words it uses). A new kind is those three, not a new set of
//! handlers; its own operations (a lock's check and list, an election's observe) live
//! beside them in `handlers` and `elections`.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use super::error::ApiError;
use super::stream;
use crate::auth::Caller;
use crate::lease::Target;
use crate::lease::{Lease, LeasePolicy, StreamTerms, Ttl};
use crate::model::{GrantKey, IdempotencyKey, LeaseId, LockName, Owner};
use crate::model::{Kind, Mode, PermitLimit, SessionId};
use crate::wire::{CampaignRequest, GrantRequest, ProclaimRequest, RenewRequest, flag, whole};
use crate::wire::{ForceReleased, GroupRequest, ResumeRequest, SemaphoreRequest};

// How each kind's request bodies read: a grant's `ttl_ms`, `wait_ms` and holder text (a
// lock's owner, a leader's value); a renew's `ttl_ms` and, where the holder may change its
// text, the new one.
impl GrantRequest {
    fn holding(&self) -> GrantFields<'_> {
        GrantFields {
            ttl_ms: whole(self.ttl_ms),
            wait_ms: whole(self.wait_ms),
            holder: self.owner.as_deref(),
            limit: None,
            mode: self.mode.map(Into::into),
            lock_delay_ms: whole(self.lock_delay_ms),
            session: self.session.as_deref(),
            grace_ms: whole(self.grace_ms),
            kept: flag(self.kept),
        }
    }
}

impl CampaignRequest {
    fn holding(&self) -> GrantFields<'_> {
        GrantFields {
            ttl_ms: whole(self.ttl_ms),
            wait_ms: whole(self.wait_ms),
            holder: self.value.as_deref(),
            limit: None,
            mode: None,
            lock_delay_ms: whole(self.lock_delay_ms),
            session: self.session.as_deref(),
            grace_ms: whole(self.grace_ms),
            kept: flag(self.kept),
        }
    }
}

impl GroupRequest {
    /// Its fields as every kind's grant reads them (the names apart).
    pub(super) fn holding(&self) -> GrantFields<'_> {
        GrantFields {
            ttl_ms: whole(self.ttl_ms),
            wait_ms: whole(self.wait_ms),
            holder: self.owner.as_deref(),
            limit: None,
            mode: self.mode.map(Into::into),
            lock_delay_ms: None,
            session: self.session.as_deref(),
            grace_ms: whole(self.grace_ms),
            kept: flag(self.kept),
        }
    }
}

impl SemaphoreRequest {
    fn holding(&self) -> GrantFields<'_> {
        GrantFields {
            ttl_ms: whole(self.ttl_ms),
            wait_ms: whole(self.wait_ms),
            holder: self.owner.as_deref(),
            limit: Some(whole(self.limit)),
            mode: None,
            lock_delay_ms: None,
            session: self.session.as_deref(),
            grace_ms: whole(self.grace_ms),
            kept: flag(self.kept),
        }
    }
}

impl RenewRequest {
    fn renewing(&self) -> (Option<u64>, Option<&str>) {
        (whole(self.ttl_ms), None)
    }
}

impl ProclaimRequest {
    fn renewing(&self) -> (Option<u64>, Option<&str>) {
        (whole(self.ttl_ms), self.value.as_deref())
    }
}

/// An error in a kind's words: a grant "held" elsewhere is "led" in an election.
type Refine = fn(ApiError) -> ApiError;

/// One operation's words in the document: its id, its summary, its request body's and its
/// own answers' descriptions (the answers every route shares are `schema`'s sets).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Words {
    id: String,
    summary: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    idempotency_key: String,
    answers: BTreeMap<String, String>,
}

impl Words {
    pub(super) fn id(&self) -> &str {
        &self.id
    }
    pub(super) fn summary(&self) -> &str {
        &self.summary
    }
    pub(super) fn body(&self) -> &str {
        &self.body
    }
    pub(super) fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
    pub(super) fn answer(&self, status: &str) -> &str {
        self.answers
            .get(status)
            .unwrap_or_else(|| panic!("kinds.json: {} has no answer {status}", self.id))
    }
}

/// A kind's words, by operation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KindWords {
    pub(super) grant: Words,
    pub(super) hold: Words,
    pub(super) renew: Words,
    pub(super) revoke: Words,
    pub(super) inspect: Words,
    pub(super) fence: Words,
    pub(super) force_release: Words,
    pub(super) resume: Words,
}

/// Every kind's words, by its routes' tag. Read when the document is built, which every
/// test that builds the router does: a missing or misspelt entry fails them all.
static WORDS: LazyLock<BTreeMap<String, KindWords>> = LazyLock::new(|| {
    serde_json::from_str(include_str!("kinds.json")).expect("kinds.json matches `KindWords`")
});

pub(super) fn words(tag: &str) -> &'static KindWords {
    WORDS
        .get(tag)
        .unwrap_or_else(|| panic!("kinds.json has no kind {tag}"))
}

/// A grant's fields, as every kind's request names them.
pub(super) struct GrantFields<'a> {
    ttl_ms: Option<u64>,
    wait_ms: Option<u64>,
    /// A lock's owner, a leader's value.
    holder: Option<&'a str>,
    /// A semaphore's `limit` (`Some(None)`: the field is missing); `None` for other kinds.
    limit: Option<Option<u64>>,
    /// A lock's `mode`.
    mode: Option<Mode>,
    /// An exclusive lock's or an election term's `lock_delay_ms`.
    lock_delay_ms: Option<u64>,
    /// The session to hold through.
    session: Option<&'a str>,
    /// A held stream's grace.
    grace_ms: Option<u64>,
    /// Kept by the server: no renews, until revoked or the kept maximum.
    kept: bool,
}

impl GrantFields<'_> {
    /// The TTL asked for. A hold through a session lives as long as the session, whose TTL
    /// it reports: its own `ttl_ms` is not used, so it is not judged either (it was refused
    /// when out of range, though the contract says it does not count).
    pub(super) fn ttl(&self, policy: &LeasePolicy) -> Result<Ttl, ApiError> {
        if self.kept {
            return match (self.ttl_ms, self.session) {
                (Some(_), _) => Err(ApiError::Invalid(
                    "a kept hold lives until revoked, at most REDLOCKD_MAX_KEPT_HOLD_MS: \
                     it takes no ttl_ms"
                        .into(),
                )),
                (_, Some(_)) => Err(ApiError::Invalid(
                    "a kept hold is kept by the server, not through a session".into(),
                )),
                _ => Ok(policy.kept_ttl()?),
            };
        }
        let asked = if self.session.is_some() {
            None
        } else {
            self.ttl_ms
        };
        Ok(policy.ttl(asked)?)
    }

    /// What a grant of several names takes: all of them under one lease, exclusive.
    pub(super) fn group(&self, names: Vec<LockName>, scope: &str) -> Result<Target, ApiError> {
        if self.mode == Some(Mode::Shared) {
            return Err(ApiError::Invalid(
                "a lease on several names is exclusive: mode shared is for one name".into(),
            ));
        }
        let target = Target::group(names)
            .ok_or_else(|| ApiError::Invalid("names must list 1 to 64 lock names".into()))?;
        self.through_session(target, scope)
    }

    /// `target`, held through the grant's session if it names one (as the token named
    /// `scope` knows it: a session belongs to the token that opened it).
    fn through_session(&self, target: Target, scope: &str) -> Result<Target, ApiError> {
        match self.session {
            Some(raw) => Ok(target.in_session(SessionId::parse(raw, scope)?)),
            None => Ok(target),
        }
    }

    /// What the grant takes: the name, or for a semaphore one of `limit` permits of it;
    /// with the lock-delay its lease leaves behind (`policy` bounds it).
    fn target(
        &self,
        name: LockName,
        policy: &LeasePolicy,
        scope: &str,
    ) -> Result<Target, ApiError> {
        let delay = policy.lock_delay(self.lock_delay_ms)?;
        if !delay.is_zero() && self.mode == Some(Mode::Shared) {
            return Err(ApiError::Invalid(
                "lock_delay_ms is for an exclusive lease: a shared one leaves no delay".into(),
            ));
        }
        self.through_session(self.kind_target(name)?.with_lock_delay(delay), scope)
    }

    fn kind_target(&self, name: LockName) -> Result<Target, ApiError> {
        match (name.kind(), self.limit) {
            (Kind::Semaphore, Some(Some(limit))) => {
                Ok(Target::permit(name, PermitLimit::parse(limit)?))
            }
            (Kind::Semaphore, _) => Err(ApiError::Invalid(
                "limit is required: how many permits of this name may be held at once (1 to 1000)"
                    .into(),
            )),
            _ if self.mode == Some(Mode::Shared) => Ok(Target::shared(name)),
            _ => Ok(name.into()),
        }
    }
}

/// The scope of the caller's sessions and keys: its token's name ("" without
/// authentication).
pub(super) fn scope_of(caller: Option<&Caller>) -> &str {
    caller.map_or("", |c| &c.name)
}

/// The request's `Idempotency-Key`, in its caller's scope (the token's name; one shared
/// scope without authentication).
fn idempotency_key(
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

/// Grant `name` and answer 201 with the kind's lease body and its `Location`, or, when the
/// client asked for a stream (`Accept: text/event-stream`), hold it while the connection
/// lives.
pub(super) async fn grant<B: serde::Serialize + for<'a> From<&'a Lease>>(
    state: &AppState,
    name: LockName,
    fields: GrantFields<'_>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
    refine: Refine,
) -> Result<Response, ApiError> {
    let policy = LeasePolicy::from(state.settings.leases);
    let target = fields.target(name, &policy, scope_of(caller))?;
    grant_target::<B>(state, target, fields, headers, caller, refine).await
}

/// Grant `target` (a name, a permit, several names) as `grant` answers it.
pub(super) async fn grant_target<B: serde::Serialize + for<'a> From<&'a Lease>>(
    state: &AppState,
    target: Target,
    fields: GrantFields<'_>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
    refine: Refine,
) -> Result<Response, ApiError> {
    if stream::wants_stream(headers) {
        return hold_target(state, target, fields, headers, caller, refine);
    }
    // `grace_ms` is judged but not used: a grant answered as JSON has no connection to
    // outlive. (It is not refused: one operation's schema serves both answers.)
    let policy = LeasePolicy::from(state.settings.leases);
    policy.grace(fields.grace_ms)?;
    let ttl = fields.ttl(&policy)?;
    let wait = policy.wait(fields.wait_ms)?;
    let owner = fields.holder.map(Owner::parse).transpose()?;
    let key = idempotency_key(headers, caller)?;
    let kept = fields.kept;
    let lease = state
        .service
        .grant_keyed(target, ttl, wait, owner, key)
        .await
        .map_err(|e| refine(e.into()))?;
    if kept {
        state.metrics.kept_granted(lease.name.kind().label());
    }
    let location = format!(
        "/{}/{}/leases/{}",
        lease.name.kind().route(),
        lease.name,
        lease.id.as_str()
    );
    let mut response = Json(B::from(&lease)).into_response();
    *response.status_mut() = StatusCode::CREATED;
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

/// Hold `name` while the connection lives, answering an event stream. A held stream takes
/// no Idempotency-Key: closing it revokes its lease, so there is nothing to retry.
pub(super) fn hold(
    state: &AppState,
    name: LockName,
    fields: GrantFields<'_>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
    refine: Refine,
) -> Result<Response, ApiError> {
    let policy = LeasePolicy::from(state.settings.leases);
    let target = fields.target(name, &policy, scope_of(caller))?;
    hold_target(state, target, fields, headers, caller, refine)
}

/// Hold `target` while the connection lives, as `hold` answers it.
fn hold_target(
    state: &AppState,
    target: Target,
    fields: GrantFields<'_>,
    headers: &HeaderMap,
    caller: Option<&Caller>,
    refine: Refine,
) -> Result<Response, ApiError> {
    if fields.kept {
        return Err(ApiError::Invalid(
            "a held stream renews its lease while connected: kept is for a grant answered as JSON"
                .into(),
        ));
    }
    let policy = LeasePolicy::from(state.settings.leases);
    let ttl = fields.ttl(&policy)?;
    let wait = policy.wait(fields.wait_ms)?;
    let grace = policy.grace(fields.grace_ms)?;
    let owner = fields.holder.map(Owner::parse).transpose()?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::Invalid(
            "Idempotency-Key does not apply to a held stream: closing the stream revokes its lease"
                .into(),
        ));
    }
    let kind = target.name.kind();
    let events = state
        .service
        .hold(target, ttl, wait, owner, stream_terms(grace, caller))
        .map_err(|e| refine(e.into()))?;
    Ok(stream::hold(kind, events).into_response())
}

/// What a held stream's holder asked of it: its grace, and the caller, who alone may resume
/// it.
fn stream_terms(grace: Duration, caller: Option<&Caller>) -> StreamTerms {
    StreamTerms {
        grace,
        opener: scope_of(caller).into(),
    }
}

/// Hold lease `id` of `name`, granted before, through a new stream (a resume): its events
/// start with `resumed` (or `failed`, when the lease is gone or its stream is another
/// token's) and go on as a held stream's.
pub(super) fn resume(
    state: &AppState,
    (name, id): (LockName, LeaseId),
    request: &ResumeRequest,
    caller: Option<&Caller>,
    refine: Refine,
) -> Result<Response, ApiError> {
    let policy = LeasePolicy::from(state.settings.leases);
    let grace = policy.grace(whole(request.grace_ms))?;
    let kind = name.kind();
    let events = state
        .service
        .resume(name, id, stream_terms(grace, caller))
        .map_err(|e| refine(e.into()))?;
    Ok(stream::hold(kind, events).into_response())
}

/// Renew a lease; with new holder text, proclaim it too.
pub(super) async fn renew<B: for<'a> From<&'a Lease>>(
    state: &AppState,
    (name, id): (LockName, crate::model::LeaseId),
    (ttl_ms, text): (Option<u64>, Option<&str>),
) -> Result<Json<B>, ApiError> {
    let ttl = LeasePolicy::from(state.settings.leases).renew_ttl(ttl_ms)?;
    let lease = match text.map(Owner::parse).transpose()? {
        Some(text) => state.service.proclaim(name, id, ttl, text).await?,
        None => state.service.renew(name, id, ttl).await?,
    };
    Ok(Json(B::from(&lease)))
}

/// Remove whoever holds `name`, with an audit line naming the administrator.
pub(super) async fn force_release(
    state: &AppState,
    caller: Option<&Caller>,
    name: LockName,
) -> Result<Json<ForceReleased>, ApiError> {
    let removed = state.service.force_release(&name).await?;
    let by = caller.map_or("anonymous (no REDLOCKD_AUTH_FILE)", |c| &*c.name);
    let tokens: Vec<u64> = removed.iter().map(|t| t.get()).collect();
    tracing::warn!(
        target: "redlockd::audit",
        administrator = by,
        lock = %name,
        kind = name.kind().route(),
        fencing_tokens = ?tokens,
        "force-release"
    );
    Ok(Json(ForceReleased {
        name: name.to_string(),
        released: !removed.is_empty(),
        fencing_token: removed.into_iter().max(),
    }))
}

/// A kind's shared routes: `kind_routes!(module in "tag", refined by fn, its four routes,
/// paths (NamePath, LeasePath, FencePath), holder "field" [renewed "field"], types (Grant,
/// Renew, Lease, Status, StreamData), ops "kind" (grant, renew, revoke, inspect))`. The paths, the
/// holder's field name and the types are what the OpenAPI document must read as written;
/// the words come from `kinds.json`; the ops and the kind are what each route counts as
/// in `redlockd_requests_total`. The module's `register` adds its routes to the registry with
/// their ops and what each needs of a token, so a kind is one line here and one in
/// `http::registry`.
macro_rules! kind_routes {
    (
        $module:ident in $tag:literal, refined by $refine:path,
        $route:literal, $hold_route:literal, $lease_route:literal, $resume_route:literal, $fence_route:literal,
        paths ($name_path:ident, $lease_path:ident, $fence_path:ident), holder $holder:literal $(renewed $renewed:literal)? $(counted $limit:literal)? $(delayed $delay:literal)?,
        types ($grant:ty, $renew:ty, $lease:ty, $status:ty, $stream:ty),
        ops $kind:literal ($grant_op:ident, $renew_op:ident, $revoke_op:ident, $inspect_op:ident)
    ) => {
        pub(super) mod $module {
            use axum::Extension;
            use axum::Json;
            use axum::extract::State;
            use axum::http::{HeaderMap, StatusCode};
            use axum::response::Response;

            use super::super::AppState;
            use super::super::error::ApiError;
            use super::super::extract::{Fields, $name_path, $lease_path, $fence_path};
                        use super::super::schema::{AdminOnly, FenceToken, NoQuorum, Refusals, TtlMs, WaitMs};
            use super::KindWords;
            use crate::auth::Caller;
            use crate::model::{IdempotencyKey, LeaseId, LockName, Owner};
            use crate::wire::{ErrorBody, FenceStatus, ForceReleased, NoFields};

            /// The error in this kind's words.
            const REFINE: super::Refine = $refine;

            fn words() -> &'static KindWords {
                super::words($tag)
            }

            /// This kind's routes, each with the op it counts as and what it needs of a
            /// token: holders grant, renew and revoke; readers inspect and read fences;
            /// administrators force-release.
            pub(in super::super) fn register(
                registry: super::super::Registry,
            ) -> super::super::Registry {
                use crate::auth::Need::{Admin, Hold, Read};
                use crate::metrics::Op;
                use super::super::middleware::Access::Token;
                use utoipa_axum::routes;
                registry
                    .add(routes!(grant), (Op::$grant_op, $kind), Token(Hold))
                    .add(routes!(hold), (Op::$grant_op, $kind), Token(Hold))
                    .add(routes!(renew), (Op::$renew_op, $kind), Token(Hold))
                    .add(routes!(resume), (Op::$renew_op, $kind), Token(Hold))
                    .add(routes!(revoke), (Op::$revoke_op, $kind), Token(Hold))
                    .add(routes!(inspect), (Op::$inspect_op, $kind), Token(Read))
                    .add(routes!(fence), (Op::Fence, $kind), Token(Read))
                    .add(routes!(force_release), (Op::ForceRelease, $kind), Token(Admin))
            }

            #[utoipa::path(
                post, path = $route, tag = $tag,
                operation_id = words().grant.id(), summary = words().grant.summary(),
                params(
                    ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
                    ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
                    ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
                    ($holder = inline(Option<Owner>), Query, description = "as the body field"),
                    $(($limit = inline(Option<super::super::schema::PermitLimitParam>), Query, description = "as the body field (required in one or the other)"),)?
                    $(($delay = inline(Option<super::super::schema::LockDelayMs>), Query, description = "as the body field"),)?
                    ("session" = inline(Option<super::super::schema::SessionIdParam>), Query, description = "as the body field"),
                    ("kept" = inline(Option<bool>), Query, description = "as the body field"),
                    ("Idempotency-Key" = inline(Option<IdempotencyKey>), Header, nullable = false, description = words().grant.idempotency_key()),
                ),
                request_body(content = Option<$grant>, description = words().grant.body()),
                responses(
                    Refusals,
                    (status = 201, description = words().grant.answer("201"), body = $lease,
                        headers(("Location" = String, description = $lease_route))),
                    (status = 404, description = words().grant.answer("404"), body = ErrorBody),
                    (status = 409, description = words().grant.answer("409"), body = ErrorBody,
                        headers(("Retry-After" = u64, description = "whole seconds, at least 1"))),
                    (status = 422, description = words().grant.answer("422"), body = ErrorBody),
                    (status = 503, description = words().grant.answer("503"), body = ErrorBody),
                )
            )]
            pub(crate) async fn grant(
                State(state): State<AppState>,
                $name_path(name): $name_path,
                caller: Option<Extension<Caller>>,
                headers: HeaderMap,
                Fields(req): Fields<$grant>,
            ) -> Result<Response, ApiError> {
                let caller = caller.as_deref();
                super::grant::<$lease>(&state, name, req.holding(), &headers, caller, REFINE).await
            }

            #[utoipa::path(
                post, path = $hold_route, tag = $tag,
                operation_id = words().hold.id(), summary = words().hold.summary(),
                params(
                    ("name" = inline(LockName), Path, description = "1 to 256 bytes of A-Z a-z 0-9 . _ : ~ -"),
                    ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field: the lease is renewed at a third of it while connected"),
                    ("wait_ms" = inline(Option<WaitMs>), Query, description = "as the body field"),
                    ($holder = inline(Option<Owner>), Query, description = "as the body field"),
                    $(($limit = inline(Option<super::super::schema::PermitLimitParam>), Query, description = "as the body field (required in one or the other)"),)?
                    $(($delay = inline(Option<super::super::schema::LockDelayMs>), Query, description = "as the body field"),)?
                    ("session" = inline(Option<super::super::schema::SessionIdParam>), Query, description = "as the body field"),
                    ("grace_ms" = inline(Option<super::super::schema::GraceMs>), Query, description = "as the body field"),
                ),
                request_body(content = Option<$grant>, description = words().hold.body()),
                responses(
                    Refusals,
                    (status = 200, content_type = "text/event-stream", body = $stream, description = words().hold.answer("200")),
                    (status = 400, description = words().hold.answer("400"), body = ErrorBody),
                    (status = 503, description = words().hold.answer("503"), body = ErrorBody),
                )
            )]
            pub(crate) async fn hold(
                State(state): State<AppState>,
                $name_path(name): $name_path,
                caller: Option<Extension<Caller>>,
                headers: HeaderMap,
                Fields(req): Fields<$grant>,
            ) -> Result<Response, ApiError> {
                super::hold(&state, name, req.holding(), &headers, caller.as_deref(), REFINE)
            }

            #[utoipa::path(
                put, path = $lease_route, tag = $tag,
                operation_id = words().renew.id(), summary = words().renew.summary(),
                params(
                    ("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path),
                    $(($renewed = inline(Option<Owner>), Query, description = "as the body field"),)?
                    ("ttl_ms" = inline(Option<TtlMs>), Query, description = "as the body field"),
                ),
                request_body(content = Option<$renew>, description = words().renew.body()),
                responses(
                    Refusals, NoQuorum,
                    (status = 200, description = words().renew.answer("200"), body = $lease),
                    (status = 404, description = words().renew.answer("404"), body = ErrorBody),
                )
            )]
            pub(crate) async fn renew(
                State(state): State<AppState>,
                $lease_path(name, id): $lease_path,
                Fields(req): Fields<$renew>,
            ) -> Result<Json<$lease>, ApiError> {
                super::renew(&state, (name, id), req.renewing()).await.map_err(REFINE)
            }

            #[utoipa::path(
                post, path = $resume_route, tag = $tag,
                operation_id = words().resume.id(), summary = words().resume.summary(),
                params(
                    ("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path),
                    ("grace_ms" = inline(Option<super::super::schema::GraceMs>), Query, description = "as the body field"),
                ),
                request_body(content = Option<crate::wire::ResumeRequest>, description = words().resume.body()),
                responses(
                    Refusals,
                    (status = 200, content_type = "text/event-stream", body = $stream, description = words().resume.answer("200")),
                    (status = 400, description = words().resume.answer("400"), body = ErrorBody),
                    (status = 503, description = words().resume.answer("503"), body = ErrorBody),
                )
            )]
            pub(crate) async fn resume(
                State(state): State<AppState>,
                $lease_path(name, id): $lease_path,
                caller: Option<Extension<Caller>>,
                Fields(req): Fields<crate::wire::ResumeRequest>,
            ) -> Result<Response, ApiError> {
                super::resume(&state, (name, id), &req, caller.as_deref(), REFINE)
            }

            #[utoipa::path(
                delete, path = $lease_route, tag = $tag,
                operation_id = words().revoke.id(), summary = words().revoke.summary(),
                params(("name" = inline(LockName), Path), ("lease_id" = inline(LeaseId), Path)),
                responses(
                    Refusals, NoQuorum,
                    (status = 204, description = words().revoke.answer("204")),
                    (status = 404, description = words().revoke.answer("404"), body = ErrorBody),
                )
            )]
            pub(crate) async fn revoke(
                State(state): State<AppState>,
                $lease_path(name, id): $lease_path,
                Fields(NoFields {}): Fields<NoFields>,
            ) -> Result<StatusCode, ApiError> {
                state.service.revoke(name, id).await.map_err(|e| REFINE(e.into()))?;
                Ok(StatusCode::NO_CONTENT)
            }

            #[utoipa::path(
                get, path = $route, tag = $tag,
                operation_id = words().inspect.id(), summary = words().inspect.summary(),
                params(("name" = inline(LockName), Path)),
                responses(
                    Refusals, NoQuorum,
                    (status = 200, description = words().inspect.answer("200"), body = $status),
                )
            )]
            pub(crate) async fn inspect(
                State(state): State<AppState>,
                $name_path(name): $name_path,
                Fields(NoFields {}): Fields<NoFields>,
            ) -> Result<Json<$status>, ApiError> {
                let holders = state.service.inspect(&name).await?;
                let delay = if holders.is_empty() {
                    state.service.lock_delay(&name).await?
                } else {
                    None
                };
                let policy = crate::lease::LeasePolicy::from(state.settings.leases);
                Ok(Json(<$status>::new(name.as_str(), holders, delay, &policy)))
            }

            #[utoipa::path(
                get, path = $fence_route, tag = $tag,
                operation_id = words().fence.id(), summary = words().fence.summary(),
                params(
                    ("name" = inline(LockName), Path),
                    ("fencing_token" = inline(FenceToken), Path, description = "the token to ask about"),
                ),
                responses(
                    Refusals, NoQuorum,
                    (status = 200, description = words().fence.answer("200"), body = FenceStatus),
                )
            )]
            pub(crate) async fn fence(
                State(state): State<AppState>,
                $fence_path(name, token): $fence_path,
                Fields(NoFields {}): Fields<NoFields>,
            ) -> Result<Json<FenceStatus>, ApiError> {
                let holders = state.service.inspect(&name).await?;
                Ok(Json(FenceStatus {
                    name: name.as_str().to_owned(),
                    fencing_token: token,
                    current: holders.iter().any(|h| h.token == token),
                }))
            }

            #[utoipa::path(
                delete, path = $route, tag = $tag,
                operation_id = words().force_release.id(), summary = words().force_release.summary(),
                params(("name" = inline(LockName), Path)),
                responses(
                    Refusals, NoQuorum, AdminOnly,
                    (status = 200, description = words().force_release.answer("200"), body = ForceReleased),
                )
            )]
            pub(crate) async fn force_release(
                State(state): State<AppState>,
                caller: Option<Extension<Caller>>,
                $name_path(name): $name_path,
                Fields(NoFields {}): Fields<NoFields>,
            ) -> Result<Json<ForceReleased>, ApiError> {
                super::force_release(&state, caller.as_deref(), name).await
            }
        }
    };
}

kind_routes!(locks in "locks", refined by std::convert::identity, "/locks/{name}", "/locks/{name}/hold", "/locks/{name}/leases/{lease_id}", "/locks/{name}/leases/{lease_id}/hold", "/locks/{name}/fences/{fencing_token}",
    paths (LockPath, LeasePath, FencePath), holder "owner" delayed "lock_delay_ms",
    types (crate::wire::GrantRequest, crate::wire::RenewRequest, crate::wire::LeaseBody, crate::wire::LockStatus, crate::wire::HoldStreamData),
    ops "lock" (Grant, Renew, Revoke, Inspect));
kind_routes!(elections in "elections", refined by ApiError::in_election, "/elections/{name}", "/elections/{name}/hold", "/elections/{name}/leases/{lease_id}", "/elections/{name}/leases/{lease_id}/hold", "/elections/{name}/fences/{fencing_token}",
    paths (ElectionPath, ElectionLeasePath, ElectionFencePath), holder "value" renewed "value" delayed "lock_delay_ms",
    types (crate::wire::CampaignRequest, crate::wire::ProclaimRequest, crate::wire::ElectionLease, crate::wire::Leader, crate::wire::CampaignStreamData),
    ops "election" (Campaign, Proclaim, Resign, Leader));
kind_routes!(semaphores in "semaphores", refined by ApiError::in_semaphore, "/semaphores/{name}", "/semaphores/{name}/hold", "/semaphores/{name}/leases/{lease_id}", "/semaphores/{name}/leases/{lease_id}/hold", "/semaphores/{name}/fences/{fencing_token}",
    paths (SemaphorePath, PermitPath, SemaphoreFencePath), holder "owner" counted "limit",
    types (crate::wire::SemaphoreRequest, crate::wire::RenewRequest, crate::wire::PermitBody, crate::wire::SemaphoreStatus, crate::wire::PermitStreamData),
    ops "semaphore" (Grant, Renew, Revoke, Inspect));
