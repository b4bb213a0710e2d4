//! The bodies of Dapr's distributed lock API (v1.0-alpha1), as Dapr's SDKs send and read
//! them: camelCase fields, a `{"errorCode","message"}` error body.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The longest store name and resource id: together, with the `:` between them, a lock
/// name's 256 bytes.
pub(crate) const MAX_STORE_BYTES: usize = 128;
pub(crate) const MAX_RESOURCE_BYTES: usize = 127;

/// `POST /v1.0-alpha1/lock/{store}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"resourceId": "order-17", "lockOwner": "worker-3", "expiryInSeconds": 60}))]
pub(crate) struct DaprLockRequest {
    /// What to lock, 1 to 127 bytes of A-Z a-z 0-9 . _ : ~ -: the lock's name is
    /// `{store}:{resourceId}`.
    #[schema(
        min_length = 1,
        max_length = 127,
        pattern = "^[A-Za-z0-9._:~-]{1,127}$"
    )]
    pub resource_id: String,
    /// Who takes it (1 to 256 bytes), which its unlock must name: whoever sends it
    /// unlocks, so it is never shown (the lock's display `owner` stays empty).
    #[schema(min_length = 1, max_length = 256)]
    pub lock_owner: String,
    /// How long the lock lives unless unlocked, in whole seconds: from 1 to the largest TTL.
    #[schema(minimum = 1)]
    pub expiry_in_seconds: i64,
}

/// `POST /v1.0-alpha1/unlock/{store}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"resourceId": "order-17", "lockOwner": "worker-3"}))]
pub(crate) struct DaprUnlockRequest {
    #[schema(
        min_length = 1,
        max_length = 127,
        pattern = "^[A-Za-z0-9._:~-]{1,127}$"
    )]
    pub resource_id: String,
    #[schema(min_length = 1, max_length = 256)]
    pub lock_owner: String,
}

/// What a lock answers: whether it was taken (`false` while anyone holds it, its owner too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct DaprLockResponse {
    pub success: bool,
}

/// What an unlock answers: `0` unlocked, `1` no such lock, `2` the lock belongs to another
/// owner. (Dapr's `3`, an internal error, is answered as a 500 with an error body.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct DaprUnlockResponse {
    #[schema(minimum = 0, maximum = 3)]
    pub status: u8,
}

/// Dapr's error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"errorCode": "ERR_MALFORMED_REQUEST", "message": "lockOwner must not be empty"}))]
pub(crate) struct DaprErrorBody {
    /// `ERR_MALFORMED_REQUEST` (400), `ERR_TRY_LOCK` or `ERR_UNLOCK` (500: too few
    /// masters answered), `ERR_HEALTH_NOT_READY` (500).
    pub error_code: String,
    pub message: String,
}

/// `GET /v1.0/metadata`: enough of Dapr's answer for an SDK to see a sidecar started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({"id": "redlockd", "runtimeVersion": "redlockd 0.1.0", "components": []}))]
pub(crate) struct DaprMetadata {
    pub id: String,
    pub runtime_version: String,
    /// Empty: no store is configured, every store's name is served (each is a namespace
    /// of lock names).
    pub components: Vec<DaprComponent>,
}

/// A component in Dapr's metadata (none is listed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct DaprComponent {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub version: String,
}
