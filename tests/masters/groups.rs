//! Several names under one lease on real masters and two replicas: grants of the same names
//! listed in opposite orders never deadlock and never overlap, and a waiting several-name
//! grant is not starved by single-name grants that keep taking one of its names.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, masters};
use serde_json::{Value, json};

async fn revoke(app: &TestApp, name: &str, lease: &Value) {
    let id = lease["lease_id"].as_str().unwrap();
    let status = app
        .send("DELETE", &format!("/locks/{name}/leases/{id}"), None)
        .await
        .0;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn opposite_orders_on_two_replicas_never_deadlock_nor_overlap() {
    let masters = masters(3);
    let (a, b) = common::two_replicas(&masters).await;
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
                let (status, lease) = app.send("POST", "/locks", Some(body)).await;
                assert_eq!(status, 201, "{lease}");
                let from = Instant::now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let to = Instant::now();
                revoke(&app, names[1], &lease).await;
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
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every transfer finished: no deadlock");
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
    let masters = masters(3);
    let (a, b) = common::two_replicas(&masters).await;
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
                let (status, lease) = app.grant("hot", body).await;
                assert_eq!(status, 201, "{lease}");
                tokio::time::sleep(HOLD).await;
                revoke(&app, "hot", &lease).await;
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
    let masters = masters(3);
    let (a, _b) = common::two_replicas(&masters).await;
    let (_, holder) = a.grant("hot", json!({"ttl_ms": 10_000})).await;
    let mut singles = Vec::new();
    for i in 0..3 {
        let single = a.handle();
        singles.push(tokio::spawn(async move {
            single
                .grant("hot", json!({"ttl_ms": 10_000, "wait_ms": 10_000}))
                .await
        }));
        a.wait_for_contention("hot", i + 1).await;
    }
    let both = {
        let app = a.handle();
        tokio::spawn(async move {
            let body = json!({"names": ["hot", "cold"], "ttl_ms": 10_000, "wait_ms": 10_000});
            app.send("POST", "/locks", Some(body)).await
        })
    };
    a.wait_for_contention("cold", 1).await;
    revoke(&a, "hot", &holder).await;
    let (status, lease) = tokio::time::timeout(Duration::from_secs(2), both)
        .await
        .expect("the grant of both names is granted at the holder's release")
        .unwrap();
    assert_eq!(status, 201, "{lease}");
    assert!(
        singles.iter().all(|s| !s.is_finished()),
        "the singles wait behind it"
    );
    revoke(&a, "hot", &lease).await;
    singles.into_iter().for_each(|s| s.abort());
}
