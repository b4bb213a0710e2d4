//! Several names under one lease on real masters and two replicas: grants of the same names
//! listed in opposite orders never deadlock and never overlap, and a waiting several-name
//! grant is not starved by single-name grants that keep taking one of its names.

use crate::common;

use std::time::{Duration, Instant};

use common::TestApp;
use common::scenarios::{self, revoke};
use serde_json::{Value, json};

#[tokio::test]
async fn opposite_orders_on_two_replicas_never_deadlock_nor_overlap() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { a.handle() } else { b.handle() };
        // Half list the accounts one way, half the other.
        let names = if i % 2 == 0 {
            ["acct:from", "acct:to"]
        } else {
            ["acct:to", "acct:from"]
        };
        let tx = tx.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..8 {
                let body = json!({"names": names, "ttl_ms": 5000, "wait_ms": 20_000});
                let hold = Duration::from_millis(5);
                let (lease, from, to) =
                    scenarios::hold_then_revoke(&app, "/locks", names[1], body, hold).await;
                let _ = tx.send((from, to, lease["fencing_token"].as_u64().unwrap()));
            }
        }));
    }
    drop(tx);
    let all = async {
        for worker in workers {
            worker.await.unwrap();
        }
    };
    common::within(
        Duration::from_secs(60),
        all,
        "every transfer finished: no deadlock",
    )
    .await;
    let mut held = Vec::new();
    while let Some(h) = rx.recv().await {
        held.push(h);
    }
    assert_eq!(held.len(), 48);
    held.sort();
    for pair in held.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "two leases held the accounts at once"
        );
        assert!(pair[0].2 < pair[1].2, "tokens rise");
    }
}

#[tokio::test]
async fn a_waiting_grant_of_several_names_is_not_starved_by_single_grants_of_one_of_them() {
    const HOLD: Duration = Duration::from_millis(200);
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Single grants of `hot` on replica a, each taking it again as soon as it is free: a
    // release there wakes the next of them at once, while the grant of both names, on
    // replica b, hears of it through the masters.
    let mut singles = Vec::new();
    for _ in 0..4 {
        let app = a.handle();
        let stop = stop.clone();
        singles.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = json!({"ttl_ms": 5000, "wait_ms": 20_000});
                scenarios::hold_then_revoke(&app, "/locks/hot", "hot", body, HOLD).await;
            }
        }));
    }
    common::wait_for(
        "the singles to take hot",
        Duration::from_secs(5),
        async || (a.inspect("hot").await.1["held"] == json!(true)).then_some(()),
    )
    .await;
    let asked = Instant::now();
    let body = json!({"names": ["hot", "cold"], "ttl_ms": 5000, "wait_ms": 20_000});
    let (status, both) = b.send("POST", "/locks", Some(body)).await;
    let waited = asked.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(status, 201, "{both}");
    revoke(&b, "cold", &both).await;
    for single in singles {
        single.await.unwrap();
    }
    assert!(
        waited < HOLD * 4,
        "the grant of both waited {waited:?} behind singles that each hold {HOLD:?}"
    );
}

#[tokio::test]
async fn single_grants_queued_first_wait_behind_a_waiting_grant_of_several_names() {
    let (_masters, a, _b) = common::two_replicas_over_three().await;
    scenarios::singles_queued_first_wait_behind_a_waiting_grant_of_several_names(&a).await;
}

/// Issue 33's loop: three clients, 60 grants of the same two names each, one listing them
/// `[p, q]` on replica a, one `[q, p]` on replica b, one `[q, p]` on replica a; each holds
/// 5 ms and revokes. Every grant is served while the names keep being handed over: none
/// sits out its wait (the stall was a grant meeting another waiter's claim and never told
/// when that claim's owner, granted meanwhile, let go). On two threads, as two replicas
/// and their clients are: on one, the replicas' hand-offs queue behind each other.
#[tokio::test(flavor = "multi_thread")]
async fn several_name_waiters_in_opposite_orders_across_replicas_are_each_served() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let clients = [
        (a.handle(), ["p", "q"]),
        (b.handle(), ["q", "p"]),
        (a.handle(), ["q", "p"]),
    ];
    let mut workers = Vec::new();
    for (app, names) in clients {
        workers.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..60 {
                let body = json!({"names": names, "ttl_ms": 5000, "wait_ms": 4000});
                let asked = Instant::now();
                let (status, lease) = app.send("POST", "/locks", Some(body)).await;
                let waited = asked.elapsed();
                assert_eq!(status, 201, "after {waited:?}: {lease}");
                longest = longest.max(waited);
                tokio::time::sleep(Duration::from_millis(5)).await;
                revoke(&app, names[0], &lease).await;
            }
            longest
        }));
    }
    let mut longest = Duration::ZERO;
    for worker in workers {
        longest = longest.max(worker.await.unwrap());
    }
    eprintln!("longest wait of 180 grants: {longest:?}");
    // Handed over in milliseconds when served; a stall sits out the claim (up to the wait).
    assert!(
        longest < Duration::from_secs(2),
        "a grant waited {longest:?} while the names were handed over"
    );
}

/// A waiter on replica b that meets a claim of a waiter on replica a is granted as soon as
/// that claimant, granted meanwhile, lets go, for each kind of waiter and claimant (the
/// scripts mark a claim a waiting grant meets, see acquire.lua). The holder lapses (1 s):
/// the claimant is granted by its own timer while b's waiter sleeps until the claim would
/// have lapsed, a second later.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_that_met_a_claim_on_another_replica_is_served_when_the_claimant_lets_go() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    // (what holds, what claims, what waits behind the claim): a request's path and body.
    let both = |p: &str, q: &str| ("/locks".to_owned(), json!({"names": [p, q]}));
    let one = |name: &str| (format!("/locks/{name}"), json!({}));
    let shared = |name: &str| (format!("/locks/{name}"), json!({"mode": "shared"}));
    let cases = [
        (both("p1", "q1"), both("p1", "q1"), both("q1", "p1")),
        (shared("p2"), both("p2", "q2"), one("p2")),
        (shared("p3"), one("p3"), shared("p3")),
    ];
    for (holder, claimant, waiter) in cases {
        let grant = |app: &TestApp, (path, body): &(String, Value), ttl_ms: u64, wait_ms: u64| {
            let mut body = body.clone();
            body["ttl_ms"] = json!(ttl_ms);
            body["wait_ms"] = json!(wait_ms);
            let (app, path) = (app.handle(), path.clone());
            async move { app.send("POST", &path, Some(body)).await }
        };
        // The class the contention metric counts a request's grant under: its first name.
        let first = |(path, body): &(String, Value)| match body["names"].as_array() {
            Some(names) => names
                .iter()
                .map(|n| n.as_str().unwrap().to_owned())
                .min()
                .unwrap(),
            None => path.trim_start_matches("/locks/").to_owned(),
        };
        let (status, held) = grant(&a, &holder, 1_000, 0).await;
        assert_eq!(status, 201, "{held}");
        let claiming = tokio::spawn(grant(&a, &claimant, 10_000, 10_000));
        a.wait_for_contention(&first(&claimant), 1).await;
        let behind = tokio::spawn(grant(&b, &waiter, 10_000, 10_000));
        b.wait_for_contention(&first(&waiter), 1).await;
        let (status, claimed) = claiming.await.unwrap();
        assert_eq!(status, 201, "{claimed}");
        assert!(
            !behind.is_finished(),
            "b's waiter waits behind the claimant"
        );
        let let_go = Instant::now();
        revoke(&a, &first(&claimant), &claimed).await;
        let (status, served) = behind.await.unwrap();
        let after = let_go.elapsed();
        assert_eq!(status, 201, "{served}");
        assert!(
            after < Duration::from_millis(700),
            "{waiter:?}: granted {after:?} after the claimant let go (the claim lapsed about 1 s after it was granted)"
        );
        revoke(&b, &first(&waiter), &served).await;
    }
}

/// Grants of two names cycling on replica a, single grants of each name on replica b:
/// the single grants are served too. (Each several-name grant claimed the names while the
/// last one held them, so single grants waiting on another replica never got in and sat
/// out their wait; now a several-name lease that a single grant waited for leaves the
/// name's turn to single grants when it is revoked.)
#[tokio::test(flavor = "multi_thread")]
async fn single_grants_on_one_replica_are_served_beside_several_name_grants_cycling_on_another() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The several-name grants cycle until the single grants are done (or for 8 s).
    let mut groups = Vec::new();
    for order in [["r", "s"], ["s", "r"], ["r", "s"]] {
        let (app, stop) = (a.handle(), stop.clone());
        groups.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(8);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                let body = json!({"names": order, "ttl_ms": 5000, "wait_ms": 4000});
                let hold = Duration::from_millis(5);
                scenarios::hold_then_revoke(&app, "/locks", "r", body, hold).await;
            }
        }));
    }
    let mut singles = Vec::new();
    for name in ["r", "s"] {
        let app = b.handle();
        singles.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..20 {
                let body = json!({"ttl_ms": 5000, "wait_ms": 4000});
                let asked = Instant::now();
                let (status, lease) = app.grant(name, body).await;
                let waited = asked.elapsed();
                assert_eq!(status, 201, "{name} after {waited:?}: {lease}");
                longest = longest.max(waited);
                tokio::time::sleep(Duration::from_millis(5)).await;
                revoke(&app, name, &lease).await;
            }
            longest
        }));
    }
    let mut longest = Vec::new();
    for single in singles {
        longest.push(single.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for group in groups {
        group.await.unwrap();
    }
    eprintln!("the single grants' longest waits: {longest:?}");
    assert!(
        longest.iter().all(|l| *l < Duration::from_secs(2)),
        "a single grant waited {longest:?} beside the several-name grants"
    );
}
