//! The bodies of FleetLock, the reboot-coordination protocol of Fedora CoreOS's Zincati and
//! Flatcar's fleetlock client (coreos/zincati `docs/development/fleetlock/protocol.md`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /fleetlock/v1/pre-reboot` and `/v1/steady-state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"client_params": {"id": "c988d2509fdf4cdcbed39037c56406fb", "group": "default"}}))]
pub(crate) struct FleetLockRequest {
    pub client_params: ClientParams,
}

/// Who asks, and for which group's slots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ClientParams {
    /// The node's identifier (1 to 256 bytes): the holder of its slot, and what its
    /// steady-state must name. Older Zincati sent it as `node_uuid`.
    #[serde(default, alias = "node_uuid")]
    #[schema(min_length = 1, max_length = 256)]
    pub id: Option<String>,
    /// The node's reboot group, `^[a-zA-Z0-9.-]+$` (default `default`).
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9.-]+$")]
    pub group: Option<String>,
}

/// What a successful call answers (FleetLock clients read only the status).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct FleetLockAnswer {
    pub group: String,
    /// The slot the node holds (pre-reboot), absent after a steady-state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u16>,
}

/// FleetLock's error body: `kind` is one of a fixed set, `value` says what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"kind": "failed_lock_semaphore_full", "value": "every slot of the group default is held (1 of 1)"}))]
pub(crate) struct FleetLockError {
    /// `bad_request` (400), `failed_unknown_group` (404), `failed_lock_semaphore_full`
    /// (423), `too_many_requests` (429), `quorum_unavailable`, `shutting_down` or
    /// `fleetlock_off` (503).
    pub kind: String,
    pub value: String,
}
