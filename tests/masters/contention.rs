//! Contention on real masters: what a deployment meets when many grants want one name.
//! Floods of waiting grants leave no key behind, a waiter never spins, and simultaneous
//! grants of a free lock never all lose.

use crate::common;

use std::time::{Duration, Instant};

use common::{POLL, RedisMaster, TestApp, config, masters, wait_for};
use redlockd::config::Config;
use serde_json::json;

/// How many scripts master `m` has run since its statistics were last reset.
async fn scripts_run(m: &RedisMaster) -> u64 {
    let info: String = m.cmd(&["INFO", "commandstats"]).await.expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A replica for floods: the test's own load shares the cores with the server and its
/// masters, so a master's answer may wait for a thread longer than the default 50 ms.
fn patient(ms: &[RedisMaster]) -> Config {
    let mut cfg = config(ms);
    cfg.master_timeout_ms = 2000;
    cfg
}

async fn lock_keys(m: &RedisMaster) -> Vec<String> {
    m.cmd(&["KEYS", "redlockd:lock:*"]).await.expect("KEYS")
}

/// Wait until no master holds a lock key; if one stays, fail with what it holds (lease,
/// token, remaining TTL), which tells a late acquire from a lost release.
async fn no_key_left(ms: &[RedisMaster]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for m in ms {
        loop {
            let keys = lock_keys(m).await;
            if keys.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let mut left = Vec::new();
                for key in keys {
                    let held: Vec<String> = m.cmd(&["HGETALL", &key]).await.unwrap_or_default();
                    let ttl: i64 = m.cmd(&["PTTL", &key]).await.unwrap_or(-3);
                    left.push(format!("{key} {held:?} pttl={ttl}"));
                }
                panic!("master :{} still holds {left:?}", m.port);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[tokio::test]
async fn a_waiter_does_not_spin_while_a_bare_majority_holds_the_lock() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    app.must_grant("bare", json!({"ttl_ms": 5000})).await;
    // The lock is now held on exactly two masters: a waiter wins the third every time it
    // tries, and must release it without waking itself.
    let _: u64 = ms[2].cmd(&["DEL", "redlockd:lock:bare"]).await.unwrap();
    let _: String = ms[0].cmd(&["CONFIG", "RESETSTAT"]).await.unwrap();
    let (status, body) = app.grant("bare", json!({"wait_ms": 1000})).await;
    assert_eq!(status, 409, "{body}");
    let calls = scripts_run(&ms[0]).await;
    assert!(
        calls <= 10,
        "a waiter tried {calls} times in one second while nothing happened"
    );
    // Released, not left for its 30 s TTL: the release was handed to the master's
    // connection before the 409, but a revoke is answered on a majority's word, so this
    // master may take a moment more.
    wait_for(
        "the waiter's minority key to be released",
        Duration::from_secs(2),
        async || lock_keys(&ms[2]).await.is_empty().then_some(()),
    )
    .await;
}

/// Waiting grants in the flood: enough that, before releases were ordered behind their
/// acquires, keys were left behind.
const FLOOD: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_waiting_grants_leaves_no_key_behind() {
    let ms = masters(3);
    let a = TestApp::spawn(patient(&ms)).await;
    let b = TestApp::spawn(patient(&ms)).await;
    let mut workers = Vec::new();
    for i in 0..FLOOD {
        let app = if i % 2 == 0 { &a } else { &b };
        let app = app.handle();
        workers.push(tokio::spawn(async move {
            let body = json!({"ttl_ms": 60000, "wait_ms": 30000});
            let (lease, token) = app.must_grant("flood", body).await;
            assert_eq!(app.revoke("flood", &lease).await.0, 204);
            token
        }));
    }
    let mut tokens = Vec::new();
    for w in workers {
        tokens.push(w.await.expect("worker"));
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), FLOOD, "every grant got its own token");
    no_key_left(&ms).await;
    let (status, body) = a.grant("flood", json!({})).await;
    assert_eq!(status, 201, "the name is free at once: {body}");
}

#[tokio::test]
async fn simultaneous_grants_of_a_free_lock_never_all_lose() {
    // The cron-once pattern: eight instances fire at each tick, none waits.
    let ms = masters(3);
    let apps = [
        TestApp::spawn(patient(&ms)).await,
        TestApp::spawn(patient(&ms)).await,
    ];
    for tick in 0..60 {
        let name = format!("tick:{tick}");
        let grants: Vec<_> = (0..8)
            .map(|i| apps[i % 2].grant_in_background(&name, json!({"ttl_ms": 10000})))
            .collect();
        let mut won = Vec::new();
        for g in grants {
            let (status, body, _) = g.await.expect("grant");
            match status {
                201 => won.push(body),
                409 => assert!(body["retry_after_ms"].as_u64().is_some(), "{body}"),
                _ => panic!("tick {tick}: {status} {body}"),
            }
        }
        assert_eq!(won.len(), 1, "tick {tick}: {} winners", won.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_failed_grants_leaves_no_key_behind() {
    // Many clients try one name without waiting: most attempts fail, and each failed
    // attempt's release goes out while its acquire may still be on its way.
    let ms = masters(3);
    let app = TestApp::spawn(patient(&ms)).await;
    let mut clients = Vec::new();
    for _ in 0..64 {
        let app = app.handle();
        clients.push(tokio::spawn(async move {
            for _ in 0..40 {
                let (status, lease) = app.grant("storm", json!({"ttl_ms": 60000})).await;
                if status == 201 {
                    let id = lease["lease_id"].as_str().expect("lease id");
                    assert_eq!(app.revoke("storm", id).await.0, 204);
                }
            }
        }));
    }
    for c in clients {
        c.await.expect("client");
    }
    no_key_left(&ms).await;
    let (status, body) = app.grant("storm", json!({})).await;
    assert_eq!(status, 201, "the name is free at once: {body}");
}
