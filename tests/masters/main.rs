//! Real redis-server masters behind redlockd apps that listen on loopback: the wire, the
//! Lua scripts, faults (masters killed, paused, restarted empty), several replicas sharing
//! masters, streams whose client hangs up, connection limits.

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod api;
mod auth;
mod batch;
mod clocks;
mod clusters;
mod contention;
mod elections;
mod faults;
mod fences;
mod groups;
mod idempotency;
mod lock_delay;
mod ops;
mod semaphores;
mod sessions;
mod shared;
mod streams;
