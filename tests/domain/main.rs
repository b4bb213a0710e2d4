//! The domain below HTTP, in process: the quorum engine over memory nodes (faults injected
//! deterministically, time paused where it matters), the lease service and its event bus,
//! and the layering rule the source keeps.

#[path = "../common/mod.rs"]
mod common;

mod engine;
mod handoff;
mod layers;
mod lease;
