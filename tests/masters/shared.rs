//! Shared locks on real masters and two replicas: readers and writers on both replicas
//! never overlap a writer, readers do overlap each other, tokens rise across both modes, and
//! a writer waiting behind a stream of overlapping readers is granted within about one
//! reader's hold (the readers that come after it, on either replica, wait behind it).

use crate::common;

use std::time::{Duration, Instant};

use common::scenarios::{self, revoke, workers_on_two};
use serde_json::json;

/// One hold as its client saw it: from the grant's answer to the revoke being sent.
struct Held {
    shared: bool,
    token: u64,
    invoked: Instant,
    from: Instant,
    to: Instant,
}

#[tokio::test]
async fn writers_never_overlap_anyone_and_readers_overlap_each_other_on_two_replicas() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let held = workers_on_two(&a, &b, 8, |i, app| async move {
        let shared = i >= 2;
        let mut held = Vec::new();
        for _ in 0..6 {
            let mut body = json!({"ttl_ms": 5000, "wait_ms": 20_000});
            if shared {
                body["mode"] = json!("shared");
            }
            let invoked = Instant::now();
            let hold = Duration::from_millis(10);
            let (lease, from, to) =
                scenarios::hold_then_revoke(&app, "/locks/file", "file", body, hold).await;
            held.push(Held {
                shared,
                token: lease["fencing_token"].as_u64().unwrap(),
                invoked,
                from,
                to,
            });
        }
        held
    })
    .await;
    assert_eq!(held.len(), 48);
    let mut readers_overlapped = false;
    for (i, x) in held.iter().enumerate() {
        for y in &held[i + 1..] {
            let overlap = x.from < y.to && y.from < x.to;
            if overlap && (!x.shared || !y.shared) {
                panic!("a writer overlapped another hold");
            }
            readers_overlapped |= overlap;
            // A grant asked after another was answered has a greater token, either mode.
            if y.invoked > x.from {
                assert!(y.token > x.token, "tokens rise across modes");
            }
            if x.invoked > y.from {
                assert!(x.token > y.token, "tokens rise across modes");
            }
        }
    }
    assert!(readers_overlapped, "shared holders held the name together");
}

#[tokio::test]
async fn a_writer_behind_a_stream_of_overlapping_readers_is_granted_within_about_one_hold() {
    const HOLD: Duration = Duration::from_millis(300);
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Readers on both replicas, each taking the name again as soon as it let go, so that
    // at every moment some reader holds it.
    let mut readers = Vec::new();
    for i in 0..6 {
        let app = if i % 2 == 0 { a.handle() } else { b.handle() };
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(HOLD / 6 * i).await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = json!({"mode": "shared", "ttl_ms": 5000, "wait_ms": 20_000});
                scenarios::hold_then_revoke(&app, "/locks/stream", "stream", body, HOLD).await;
            }
        }));
    }
    // Readers hold it, in overlapping turns.
    common::wait_for(
        "readers to hold the name",
        Duration::from_secs(5),
        async || {
            let (_, seen) = a.inspect("stream").await;
            (seen["holders"].as_array().map_or(0, Vec::len) >= 3).then_some(())
        },
    )
    .await;
    let asked = Instant::now();
    let (status, writer) = b
        .grant("stream", json!({"ttl_ms": 5000, "wait_ms": 20_000}))
        .await;
    let waited = asked.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (status, &writer["mode"]),
        (201, &json!("exclusive")),
        "{writer}"
    );
    revoke(&b, "stream", &writer).await;
    for reader in readers {
        reader.await.unwrap();
    }
    // The readers that held it when the writer came let go within one hold; those after
    // the writer waited behind it.
    assert!(
        waited < HOLD * 3,
        "the writer waited {waited:?} behind readers that each hold {HOLD:?}"
    );
}
