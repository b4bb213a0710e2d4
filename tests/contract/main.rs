//! The HTTP contract driven in process: each request goes through the whole router with
//! `oneshot` over the embedded store or memory nodes (no socket, no redis-server): routes,
//! validation and error bodies, the auth matrix, caps, the OpenAPI document and the
//! operations endpoints.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod conformance;
mod dapr;
mod elections;
mod events;
mod fleetlock;
mod groups;
mod kept;
mod lock_delay;
mod locks;
mod ops;
mod quorum;
mod router;
mod semaphores;
mod sessions;
mod shared;
mod streams;
