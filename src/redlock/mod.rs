//! The Redlock engine: one step at a time, fanned out to every master concurrently, each
//! call bounded by the master timeout, decided as soon as the answers in hand decide it.
//!
//! On top of the classic algorithm (majority, validity = TTL - elapsed - drift, unlock
//! everywhere on failure) it keeps two promises of the contract:
//! - fencing tokens rise even when the masters' counters diverge: a grant's token is the
//!   largest counter among the granting majority, and it is written back to a majority
//!   (`confirm`) before the grant is answered, unless a majority already hold it;
//! - a master that lost its data does not vote until it is safe (see `health`).

pub mod backlog;
mod engine;
mod health;
mod quorum;

pub use engine::{EngineConfig, EngineError, Holder, Leased, Redlock, SessionLease, Sighting};
