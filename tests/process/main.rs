//! The binary as users run it: the `redlockd` process and its verbs, signals, TLS, the
//! examples of README and the docs site run as written, the site's links, and the
//! deployment files (dashboard, alerts, chart).

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod deploy;
mod examples;
mod process;
mod site;
mod tls;
