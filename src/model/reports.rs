//! The reports about masters that reach `/readyz`, metrics and 503 bodies: what each
//! master is, and why a step could not be done on a majority.

use std::time::{Duration, SystemTime};

/// Why a step could not be done on a majority: in words, and what each master that did not
/// take part said (classified, never collapsed), down to the 503 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailability {
    pub reason: String,
    pub masters: Vec<MasterFailure>,
}

impl Unavailability {}

/// One master that failed a step, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterFailure {
    /// The master's address, without credentials.
    pub address: String,
    /// `timeout`, `connection`, `script`, `amnesic` (lost its data, not voting),
    /// `unverified` (reconnected, not voting until checked), `clock`, or `other`.
    pub kind: &'static str,
}

/// A master as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MasterStatus {
    pub address: String,
    pub up: bool,
    pub latency: Option<Duration>,
    /// Whether its answers count towards a majority: it answers and is not quarantined.
    pub voting: bool,
    /// Set while the master is quarantined: when it will vote again at the earliest.
    pub quarantined_until: Option<SystemTime>,
    /// A Redis Cluster's primaries (each votes for the names in its slots), and why its
    /// slot map is not whole when it is not.
    pub cluster: Option<ClusterStatus>,
    /// Whether this replica hears the master's announcements now (`None`: the embedded
    /// store, which needs none).
    pub subscribed: Option<bool>,
    /// Why it does not vote, when the monitor can say more than `up` and
    /// `quarantined_until` (its clock jumped).
    pub problem: Option<String>,
    /// Its clock against this replica's wall clock, as last read, in seconds (`None` for a
    /// cluster: each shard has its own).
    pub clock_offset_s: Option<f64>,
    /// The jumps of its clock (a cluster's: of its shards' clocks) this replica saw,
    /// forward and backward.
    pub clock_jumps: [u64; 2],
}

/// A Redis Cluster master as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterStatus {
    pub shards: Vec<ShardStatus>,
    pub problem: Option<String>,
}

/// One primary of a Redis Cluster master.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardStatus {
    /// `host:port`, as the cluster names it.
    pub address: String,
    pub up: bool,
    /// Whether it votes for the names in its slots: it answers, keeps its markers, and is
    /// neither quarantined nor unverified.
    pub voting: bool,
    /// How many hash slots it serves.
    pub slots: usize,
    pub latency: Option<Duration>,
    pub quarantined_until: Option<SystemTime>,
    /// Why it is quarantined, in words.
    pub problem: Option<String>,
    /// Its clock against this replica's wall clock, as last read, in seconds.
    pub clock_offset_s: Option<f64>,
    /// The jumps of its clock this replica saw, forward and backward.
    pub clock_jumps: [u64; 2],
}

/// How one master's steps travelled: how many steps were sent and in how many calls (a
/// batch is one call). `steps / calls` is the batches' mean size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    pub steps: u64,
    pub calls: u64,
}
