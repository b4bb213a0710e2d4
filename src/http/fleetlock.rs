//! FleetLock, the reboot-coordination protocol of Fedora CoreOS's Zincati and Flatcar's
//! fleetlock client: `POST /fleetlock/v1/pre-reboot` takes a slot of the node's group
//! before it reboots, `POST /fleetlock/v1/steady-state` gives it back once the node is up
//! again. A group (REDLOCKD_FLEETLOCK_GROUPS) is the semaphore `fleetlock:<group>`, whose
//! permits are kept holds (a rebooting node cannot renew) held by the node's `id`
//! (`Target::held_by`, with the id as the permit's owner, so that inspect shows which
//! nodes hold the slots): a second pre-reboot by the same id answers its slot again, a
//! steady-state of a slot not held is a success. Errors are FleetLock's `{"kind","value"}`
//! with `kind` from a fixed set (clients use it as a metric label).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, Outcome};
use super::extract::in_scope;
use super::schema::{AdminOnly, FleetLockHeader, GroupName, Refusals};
use crate::lease::{HeldBy, LeaseError, LeasePolicy, OwnedRevoke, Target, WaitTime};
use crate::model::{Kind, LeaseId, LockName, Owner, PermitLimit};
use crate::wire::{FleetLockAnswer, FleetLockError, FleetLockRequest};

/// Why a FleetLock call failed, in FleetLock's error body.
#[derive(Debug)]
pub(crate) enum Failed {
    /// 400 `bad_request`: no `fleet-lock-protocol: true` header, or not the protocol's body.
    BadRequest(String),
    /// 404 `failed_unknown_group`: a group REDLOCKD_FLEETLOCK_GROUPS does not list.
    UnknownGroup(String),
    /// 423 `failed_lock_semaphore_full`: every slot of the group is held.
    Full(String),
    /// 503 `fleetlock_off`: FleetLock is off here (REDLOCKD_FLEETLOCK_GROUPS empty, or left
    /// unset with kept holds off: a slot must be kept while its node reboots).
    Off(&'static str),
    /// What the lease service could not do: 503 `quorum_unavailable` or `shutting_down`
    /// (past a cap, 429 in redlockd's own body).
    Service(LeaseError),
    /// A refusal in redlockd's own error body, as the middleware's are (a group outside
    /// the token's prefixes: 403 `forbidden`).
    Refused(ApiError),
}

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        let (status, kind, value) = match self {
            Failed::BadRequest(value) => (StatusCode::BAD_REQUEST, "bad_request", value),
            Failed::UnknownGroup(value) => (StatusCode::NOT_FOUND, "failed_unknown_group", value),
            Failed::Full(value) => (StatusCode::LOCKED, "failed_lock_semaphore_full", value),
            Failed::Off(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "fleetlock_off",
                why.to_owned(),
            ),
            Failed::Service(e) => {
                let value = e.to_string();
                let api = ApiError::from(e);
                let kind = match api.code() {
                    // Past a cap: a refusal as every route's, in redlockd's body.
                    "too_many_requests" => return api.into_response(),
                    "shutting_down" => "shutting_down",
                    _ => "quorum_unavailable",
                };
                let status = StatusCode::SERVICE_UNAVAILABLE;
                (status, kind, value)
            }
            Failed::Refused(refusal) => return refusal.into_response(),
        };
        let body = FleetLockError {
            kind: kind.to_owned(),
            value,
        };
        let mut response = (status, Json(body)).into_response();
        response.extensions_mut().insert(Outcome(kind));
        response
    }
}

/// A call's node, its group's semaphore and the group's slots, once the protocol's header
/// and body are checked.
struct Call {
    id: String,
    group: String,
    name: LockName,
    slots: u16,
}

impl Call {
    fn read(state: &AppState, parts: &Parts, bytes: &Bytes) -> Result<Self, Failed> {
        let intended = parts
            .headers
            .get("fleet-lock-protocol")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        if !intended {
            return Err(Failed::BadRequest(
                "the fleet-lock-protocol header must be `true`".into(),
            ));
        }
        let req: FleetLockRequest = serde_json::from_slice(bytes).map_err(|e| {
            Failed::BadRequest(format!("the body is not FleetLock's client_params: {e}"))
        })?;
        let id = req.client_params.id.unwrap_or_default();
        if id.is_empty() || Owner::parse(&id).is_err() {
            return Err(Failed::BadRequest(
                "client_params.id must be 1 to 256 bytes without control characters".into(),
            ));
        }
        let group = req
            .client_params
            .group
            .unwrap_or_else(|| "default".to_owned());
        let (name, slots) = group_of(state, &group)?;
        let name = in_scope(parts, name).map_err(Failed::Refused)?;
        Ok(Self {
            id,
            group,
            name,
            slots,
        })
    }

    /// A slot of the group, held by the node: the masters know it by its id alone,
    /// whichever token it calls with, so that an administrator can release it by the id.
    fn target(&self) -> Result<Target, Failed> {
        slot_of(&self.name, self.slots, &self.id)
    }
}

/// A slot of the group whose semaphore is `name`, held by node `id`.
fn slot_of(name: &LockName, slots: u16, id: &str) -> Result<Target, Failed> {
    let limit = PermitLimit::parse(u64::from(slots)).map_err(|e| Failed::BadRequest(e.0))?;
    let holder = LeaseId::of_holder("", name, id);
    Ok(Target::permit(name.clone(), limit).held_by(holder))
}

/// The semaphore of reboot group `group` and its slots: 400 for a name the protocol does
/// not allow, 404 for a group not served.
fn group_of(state: &AppState, group: &str) -> Result<(LockName, u16), Failed> {
    if !crate::config::is_fleetlock_group(group) {
        return Err(Failed::BadRequest(format!(
            "a group is 1 to 128 bytes of A-Z a-z 0-9 . - (^[a-zA-Z0-9.-]+$), got {group:?}"
        )));
    }
    let groups = match &state.settings.fleetlock {
        crate::config::FleetLock::Groups(groups) => groups,
        crate::config::FleetLock::Off(why) => return Err(Failed::Off(why)),
    };
    let Some(&slots) = groups.get(group) else {
        return Err(Failed::UnknownGroup(format!(
            "no reboot group {group:?} is served here (REDLOCKD_FLEETLOCK_GROUPS)"
        )));
    };
    let name =
        LockName::semaphore(&format!("fleetlock:{group}")).map_err(|e| Failed::BadRequest(e.0))?;
    Ok((name, slots))
}

/// Take a slot of the node's group before it reboots: 200 once it holds one (the same
/// slot again when it already did), 423 while every slot is held by other nodes.
#[utoipa::path(
    post, path = "/fleetlock/v1/pre-reboot", tag = "fleetlock", operation_id = "fleetlockPreReboot",
    summary = "FleetLock: take a reboot slot of the node's group",
    params(("fleet-lock-protocol" = inline(FleetLockHeader), Header, description = "must be `true`")),
    request_body(content = FleetLockRequest, content_type = "application/json"),
    responses(
        Refusals,
        (status = 200, description = "The node holds a slot, kept by the server until its steady-state, at most REDLOCKD_MAX_KEPT_HOLD_MS from this answer (a second pre-reboot keeps the same slot that long again)", body = FleetLockAnswer),
        (status = 400, description = "`bad_request`: no `fleet-lock-protocol: true`, or not the protocol's body", body = FleetLockError),
        (status = 404, description = "`failed_unknown_group`: a group REDLOCKD_FLEETLOCK_GROUPS does not list", body = FleetLockError),
        (status = 423, description = "`failed_lock_semaphore_full`: every slot is held by other nodes", body = FleetLockError),
        (status = 503, description = "`quorum_unavailable`, `shutting_down`, or `fleetlock_off`: FleetLock is off here (REDLOCKD_FLEETLOCK_GROUPS empty, or unset with kept holds off)", body = FleetLockError),
    )
)]
pub(crate) async fn pre_reboot(
    State(state): State<AppState>,
    parts: Parts,
    bytes: Bytes,
) -> Result<Json<FleetLockAnswer>, Failed> {
    let call = Call::read(&state, &parts, &bytes)?;
    let target = call.target()?;
    let answer = |lease: &LeaseId| FleetLockAnswer {
        group: call.group.clone(),
        slot: lease.slot().map(|s| s.index),
    };
    let policy = LeasePolicy::from(state.settings.leases);
    // Served only while kept holds are on (config::FleetLock): a refusal here is a bug.
    let ttl = policy
        .kept_ttl()
        .map_err(|_| Failed::Off(crate::config::FLEETLOCK_NEEDS_KEPT))?;
    // Recursive: a node that holds a slot already is answered with it, kept for the whole
    // maximum from now (its earlier pre-reboot's slot may be near its end).
    if let HeldBy::Holder(lease) = state
        .service
        .held_by(&target)
        .await
        .map_err(Failed::Service)?
    {
        match state
            .service
            .renew(call.name.clone(), lease.clone(), Some(ttl))
            .await
        {
            Ok(_) => return Ok(Json(answer(&lease))),
            // It ended meanwhile: take one as any node would.
            Err(LeaseError::NotFound) => {}
            Err(e) => return Err(Failed::Service(e)),
        }
    }
    let owner = Owner::parse(&call.id).map_err(|e| Failed::BadRequest(e.0))?;
    match state
        .service
        .grant(target, ttl, WaitTime::NONE, Some(owner))
        .await
    {
        Ok(lease) => {
            state.metrics.kept_granted(Kind::Semaphore.label());
            Ok(Json(answer(&lease.id)))
        }
        Err(LeaseError::Held { .. } | LeaseError::Delayed { .. }) => Err(Failed::Full(format!(
            "every slot of the group {} is held ({} of {})",
            call.group, call.slots, call.slots
        ))),
        Err(e) => Err(Failed::Service(e)),
    }
}

/// Give back the node's slot once it is up again: 200 whether it held one or not.
#[utoipa::path(
    post, path = "/fleetlock/v1/steady-state", tag = "fleetlock", operation_id = "fleetlockSteadyState",
    summary = "FleetLock: give back the node's reboot slot, if it holds one",
    params(("fleet-lock-protocol" = inline(FleetLockHeader), Header, description = "must be `true`")),
    request_body(content = FleetLockRequest, content_type = "application/json"),
    responses(
        Refusals,
        (status = 200, description = "The node holds no slot of its group (any it held is released)", body = FleetLockAnswer),
        (status = 400, description = "`bad_request`: no `fleet-lock-protocol: true`, or not the protocol's body", body = FleetLockError),
        (status = 404, description = "`failed_unknown_group`: a group REDLOCKD_FLEETLOCK_GROUPS does not list", body = FleetLockError),
        (status = 503, description = "`quorum_unavailable`, `shutting_down`, or `fleetlock_off`: FleetLock is off here (REDLOCKD_FLEETLOCK_GROUPS empty, or unset with kept holds off)", body = FleetLockError),
    )
)]
pub(crate) async fn steady_state(
    State(state): State<AppState>,
    parts: Parts,
    bytes: Bytes,
) -> Result<Json<FleetLockAnswer>, Failed> {
    let call = Call::read(&state, &parts, &bytes)?;
    release(&state, &call.target()?).await?;
    Ok(Json(FleetLockAnswer {
        group: call.group,
        slot: None,
    }))
}

/// An administrator's release of one node's slot, by the node's id (a node that will not
/// come back): `released` says whether it held one.
#[utoipa::path(
    delete, path = "/fleetlock/v1/groups/{group}/nodes/{id}", tag = "fleetlock", operation_id = "fleetlockRelease",
    summary = "FleetLock: release one node's slot (administrators)",
    params(
        ("group" = inline(GroupName), Path, description = "the reboot group"),
        ("id" = String, Path, description = "the node's id"),
    ),
    responses(
        Refusals, AdminOnly,
        (status = 200, description = "`{\"released\": true}` when the node held a slot", body = crate::wire::ForceReleased),
        (status = 400, description = "`bad_request`: no `fleet-lock-protocol: true`, or not the protocol's body", body = FleetLockError),
        (status = 404, description = "`failed_unknown_group`: a group REDLOCKD_FLEETLOCK_GROUPS does not list", body = FleetLockError),
        (status = 503, description = "`quorum_unavailable`, `shutting_down`, or `fleetlock_off`: FleetLock is off here (REDLOCKD_FLEETLOCK_GROUPS empty, or unset with kept holds off)", body = FleetLockError),
    )
)]
pub(crate) async fn release_node(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    Path((group, id)): Path<(String, String)>,
) -> Result<Json<crate::wire::ForceReleased>, Failed> {
    let (name, slots) = group_of(&state, &group)?;
    let released = release(&state, &slot_of(&name, slots, &id)?).await?;
    let by = caller
        .as_ref()
        .map_or("anonymous (no REDLOCKD_AUTH_FILE)", |c| &*c.name);
    // As every force-release is (docs/security.md): the administrator, what, and whether
    // anything was held.
    tracing::warn!(
        target: "redlockd::audit",
        administrator = by,
        group,
        node = id,
        released,
        "FleetLock slot release"
    );
    Ok(Json(crate::wire::ForceReleased {
        name: name.to_string(),
        released,
        fencing_token: None,
    }))
}

async fn release(state: &AppState, slot: &Target) -> Result<bool, Failed> {
    match state.service.revoke_held_by(slot).await {
        Ok(OwnedRevoke::Revoked) => Ok(true),
        Ok(OwnedRevoke::Free | OwnedRevoke::Others) => Ok(false),
        Err(e) => Err(Failed::Service(e)),
    }
}
