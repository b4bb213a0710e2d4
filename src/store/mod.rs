//! The two kinds of master the engine can talk to: real Redis masters, and the in-process
//! memory node (the embedded store, and the fault-injection target of engine tests).

pub mod memory;
pub mod redis;
