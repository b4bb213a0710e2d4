//! Whether this machine has `redis-server`, for the test tiers that run real masters.
//!
//! Without it, `cargo test` still runs every tier that needs no Redis (unit, domain,
//! contract, part of the process tier) and skips the others, saying so once, here; with
//! `REDLOCKD_REQUIRE_REDIS` set (scripts/test and so CI set it), a missing redis-server
//! fails the build instead, so that a tier is never skipped silently where it must run.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(redis_missing)");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=REDLOCKD_REQUIRE_REDIS");
    println!("cargo::rerun-if-changed=build.rs");
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let found = dirs
        .iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")].iter())
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file());
    match found {
        Some(path) => println!("cargo::rerun-if-changed={}", path.display()),
        None => {
            // Installed later, it appears in one of these: look again then.
            for dir in dirs.iter().filter(|d| d.is_dir()) {
                println!("cargo::rerun-if-changed={}", dir.display());
            }
            if std::env::var_os("REDLOCKD_REQUIRE_REDIS").is_some() {
                panic!(
                    "redis-server is not installed and REDLOCKD_REQUIRE_REDIS is set: the tiers \
                     on real Redis masters must run (scripts/test installs it)"
                );
            }
            println!("cargo::rustc-cfg=redis_missing");
            println!(
                "cargo::warning=redis-server not found: `cargo test` skips the tiers on real \
                 Redis masters (masters, fault_suite, most of process, the benchmark); \
                 scripts/test installs it and runs them all"
            );
        }
    }
}
