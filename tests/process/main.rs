//! The binary as users run it: the `redlockd` process and its verbs, signals, TLS, the
//! README's examples run as written, and the deployment files (dashboard, alerts, chart).

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod deploy;
mod examples;
mod process;
mod tls;
