//! redlockd: named locks with leases and fencing tokens, for any program that speaks HTTP.
//!
//! A request flows down through four layers:
//! - `http`: routes, handlers, request and response types, the OpenAPI document;
//! - `lease`: the domain (names, lease ids, tokens parsed at the edge), the per-name
//!   event bus (waiting grants, observers), and the lease service the handlers call;
//! - `redlock`: the quorum engine: fan-out to every master, majority, validity, fencing
//!   tokens confirmed on a majority, and the health monitor that quarantines masters that
//!   lost their data;
//! - `store`: the masters' contract (`LockNode`, keys with a kind) and its two
//!   implementations: Redis (Lua scripts) and the in-process memory node (the embedded
//!   store and the fault-injection target).
//!
//! Under them all, `model` is the vocabulary every layer names as it is: lock names and
//! keys (kind + name), lease ids, fencing tokens, owners, Idempotency-Key records, and the
//! reports about masters; no layer re-exports another's items.
//!
//! Each layer names only the ones below it (`tests/domain/layers.rs` holds them to it). `wire`
//! holds the contract's bodies, shared by the server and Rust clients; `config` is the one
//! typed configuration of the server and `cli` the command line's grammar; `client` is the client side of the contract (the
//! binary's `lock`, `inspect` and `list` verbs), which knows only `wire`, `config` and `trust` (which servers redlockd's own HTTP clients trust); `metrics` owns the Prometheus registry; `logging` writes the JSON
//! log line; `telemetry` sends traces over OTLP when asked to; `app` builds and runs it all,
//! and holds the binary's body (`app::main`).
//!
//! Visibility says what may be touched: items are `pub(crate)` unless code outside the
//! crate (the integration tests, the benchmark, an embedder) needs them, so a `pub` item
//! is a promise to that code.

pub mod app;
pub mod auth;
pub mod cli;
pub(crate) mod client;
pub mod config;
pub mod http;
pub mod lease;
pub(crate) mod logging;
pub mod metrics;
pub mod model;
pub mod redlock;
pub mod store;
pub(crate) mod telemetry;
pub(crate) mod trust;
pub(crate) mod wire;
