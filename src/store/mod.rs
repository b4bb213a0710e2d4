//! The masters: the contract every kind of master keeps (`node`: one atomic step per call),
//! and its two implementations, real Redis masters and the in-process memory node (the
//! embedded store, and the fault-injection target of engine tests). Nothing here knows the
//! engine above it.

mod batch;
pub mod clock;
pub(crate) mod cluster;
mod group;
pub mod layout;
pub mod memory;
pub mod node;
pub mod redis;

use std::time::SystemTime;

/// Microseconds since the Unix epoch: a fencing floor that only rises with time.
pub(crate) fn clock_floor() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
