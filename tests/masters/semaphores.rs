//! Semaphores on real masters and two replicas: at most `limit` permits held at once under
//! concurrency on both, each slot's tokens rising, and a waiting grant on one replica woken
//! by a release on the other (the slots' scripts announce every end).

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::scenarios::workers_on_two;
use serde_json::json;

/// One permit as a worker saw it: from the grant's answer to the release being sent.
struct Held {
    slot: u64,
    token: u64,
    from: Instant,
    to: Instant,
}

#[tokio::test]
async fn at_most_limit_permits_are_held_at_once_by_workers_on_two_replicas() {
    const LIMIT: usize = 3;
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let held = workers_on_two(&a, &b, 10, |_, app| async move {
        let mut held = Vec::new();
        for _ in 0..8 {
            let body = json!({"limit": LIMIT, "ttl_ms": 5000, "wait_ms": 20_000});
            let (status, permit) = app.send("POST", "/semaphores/pool", Some(body)).await;
            assert_eq!(status, 201, "{permit}");
            let from = Instant::now();
            // The work the permit guards.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let to = Instant::now();
            let id = permit["lease_id"].as_str().unwrap();
            let path = format!("/semaphores/pool/leases/{id}");
            app.deleted(&path).await;
            held.push(Held {
                slot: permit["slot"].as_u64().unwrap(),
                token: permit["fencing_token"].as_u64().unwrap(),
                from,
                to,
            });
        }
        held
    })
    .await;
    assert_eq!(held.len(), 80);

    // Never more than LIMIT at once: sweep the starts and ends in time order.
    let mut edges: Vec<(Instant, i32)> = held
        .iter()
        .flat_map(|h| [(h.from, 1), (h.to, -1)])
        .collect();
    edges.sort_by_key(|&(at, delta)| (at, delta));
    let (mut now, mut most) = (0, 0);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    assert!(most <= LIMIT as i32, "{most} permits held at once");
    assert!(most >= 2, "the workers did overlap ({most} at most)");

    // Each slot: one holder at a time, tokens rising in grant order.
    let mut by_slot: BTreeMap<u64, Vec<&Held>> = BTreeMap::new();
    for h in &held {
        assert!(h.slot < LIMIT as u64);
        by_slot.entry(h.slot).or_default().push(h);
    }
    for (slot, mut permits) in by_slot {
        permits.sort_by_key(|h| h.from);
        for pair in permits.windows(2) {
            assert!(pair[0].to <= pair[1].from, "slot {slot} held twice at once");
            assert!(pair[0].token < pair[1].token, "slot {slot}'s tokens rise");
        }
    }
}

#[tokio::test]
async fn a_waiting_permit_on_one_replica_is_granted_when_a_permit_is_released_on_the_other() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let body = json!({"limit": 1, "ttl_ms": 30_000});
    let (status, held) = a.send("POST", "/semaphores/one", Some(body)).await;
    assert_eq!(status, 201, "{held}");
    let waiter = {
        let b = b.handle();
        tokio::spawn(async move {
            let body = json!({"limit": 1, "ttl_ms": 30_000, "wait_ms": 20_000});
            b.send("POST", "/semaphores/one", Some(body)).await
        })
    };
    b.wait_for_contention("one", 1).await;
    let id = held["lease_id"].as_str().unwrap();
    let released = Instant::now();
    a.deleted(&format!("/semaphores/one/leases/{id}")).await;
    let (status, next) = common::joined_within(
        waiter,
        Duration::from_secs(5),
        "woken by the release, not at the holder's TTL",
    )
    .await;
    assert_eq!(status, 201, "{next}");
    assert!(next["fencing_token"].as_u64() > held["fencing_token"].as_u64());
    assert!(released.elapsed() < Duration::from_secs(5));
}
