//! The bodies of the operations routes: `/healthz` and `/readyz`, with each master's (and
//! each cluster shard's) report.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `/healthz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub(crate) struct Health {
    pub status: String,
}

/// One master in `/readyz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct MasterReport {
    /// The master's URL without credentials.
    pub address: String,
    pub up: bool,
    /// How long its last answer took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Whether its answers count towards a majority.
    pub voting: bool,
    /// Set while the master is quarantined after losing its data: when it votes again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined_until: Option<String>,
    /// A Redis Cluster master (`redis+cluster://`): each primary, as the cluster's slot map
    /// names it. A shard votes for the names in its slots only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardReport>>,
    /// Why the master does not vote, in words, when there is more to say than `up` and
    /// `quarantined_until`: its clock jumped (`clock jumped +20.3 s`), or was first met too
    /// far from this replica's; it keeps a data layout this release does not know (a later
    /// release's); for a Redis Cluster, why its slot map is not whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The master's clock (its `TIME`) against this replica's wall clock, as last read, in
    /// ms: positive when the master's is ahead. Absent for a Redis Cluster (each shard
    /// has its own) and before the first answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
    /// Whether this replica hears the master's announcements now (every channel
    /// subscribed). Until it does (just after start, or after a subscription dropped),
    /// waiting grants here are woken by releases on other replicas only when they look
    /// again (at the holder's remaining TTL). Absent for the embedded store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribed: Option<bool>,
}

/// One primary of a Redis Cluster master in `/readyz`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ShardReport {
    /// `host:port`, as the cluster names the node.
    pub address: String,
    pub up: bool,
    /// Whether it votes for the names in its slots (it answers and kept its data).
    pub voting: bool,
    /// How many of the 16384 hash slots it serves.
    pub slots: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// Set while the shard is quarantined after losing its data: when it votes again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined_until: Option<String>,
    /// While it does not vote: why (restarted empty, went back to an old snapshot, a
    /// replica took over its slots, its clock jumped, it keeps a data layout this release
    /// does not know), in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The shard's clock against this replica's wall clock, as last read, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
}

/// `/readyz`: ready while a majority of masters answer and vote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"ready": true, "backend": "redis", "masters": [
    {"address": "redis://10.0.0.5:6379", "up": true, "latency_ms": 0.21, "voting": true}
]}))]
pub(crate) struct Readiness {
    pub ready: bool,
    /// `redis`, or `embedded` for the in-process store (one process, not distributed).
    pub backend: String,
    /// When not ready for a reason beyond masters being down (a new deployment waiting for
    /// every master, a majority that lost its data): what is wrong and what to do, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub masters: Vec<MasterReport>,
}
