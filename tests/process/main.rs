//! The binary as users run it: the `redlockd` process and its verbs, signals, TLS, the
//! examples of README and the docs site run as written, the site's links, and the
//! deployment files (dashboard, alerts, chart). The modules on real masters are left out
//! where no redis-server is installed (build.rs).

#[path = "../common/mod.rs"]
mod common;

#[cfg(not(redis_missing))]
mod cli;
#[cfg(not(redis_missing))]
mod deploy;
#[cfg(not(redis_missing))]
mod examples;
#[cfg(not(redis_missing))]
mod process;
mod site;
mod tls;
