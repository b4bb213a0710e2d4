//! Lock-delay on three real masters and two replicas: the masters' clocks judge it, so a
//! lease granted through one replica that expires leaves its name refused with 409
//! `lock_delay` on the other until the delay ends, and granted right after; a holder's own
//! revoke leaves none; a waiting grant on the other replica waits it out; and a master that
//! restarted empty cannot shorten it.

use crate::common;

use std::time::{Duration, Instant};

use common::{masters, wait_for};
use serde_json::json;

#[tokio::test]
async fn an_expired_lease_is_refused_as_delayed_on_the_other_replica_then_granted_right_after() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (_, token) = a
        .must_grant("delayed", json!({"ttl_ms": 300, "lock_delay_ms": 800}))
        .await;
    let granted = Instant::now();

    // Until the delay ends, every answer is lock_held (the lease) then lock_delay.
    let (mut saw_delay, mut last_refused) = (false, granted);
    let (next, at) = wait_for("the delay to end", Duration::from_secs(5), async || {
        let (status, body) = b.grant("delayed", json!({"ttl_ms": 5000})).await;
        let now = Instant::now();
        match (status, body["error"].as_str()) {
            (201, _) => Some((body, now)),
            (409, Some("lock_held")) => {
                assert!(!saw_delay, "held again after the delay began: {body}");
                last_refused = now;
                None
            }
            (409, Some("lock_delay")) => {
                saw_delay = true;
                last_refused = now;
                None
            }
            _ => panic!("unexpected answer {status} {body}"),
        }
    })
    .await;
    assert!(saw_delay, "the delay was never seen");
    let after = at - granted;
    assert!(
        after >= Duration::from_millis(300 + 800 - 30),
        "granted {after:?} after the grant of a 300 ms lease with an 800 ms delay"
    );
    assert!(
        at - last_refused < Duration::from_millis(200),
        "granted right after the delay ended"
    );
    assert!(next["fencing_token"].as_u64().unwrap() > token);
}

#[tokio::test]
async fn a_holders_own_revoke_applies_no_delay_and_a_waiter_elsewhere_waits_an_eviction_out() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (lease, _) = a
        .must_grant("handover", json!({"ttl_ms": 30000, "lock_delay_ms": 60000}))
        .await;
    assert_eq!(a.revoke("handover", &lease).await.0, 204);
    let (status, body) = b
        .grant("handover", json!({"ttl_ms": 30000, "lock_delay_ms": 700}))
        .await;
    assert_eq!(status, 201, "no delay after the holder's revoke: {body}");

    let waiter = a
        .grant_in_line("handover", json!({"wait_ms": 10000}), "handover", 1)
        .await;
    let (status, released) = b.send("DELETE", "/locks/handover", None).await;
    assert_eq!((status, &released["released"]), (200, &json!(true)));
    let evicted = Instant::now();
    let (_, waited) = common::granted_since(waiter, evicted).await;
    assert!(
        waited >= Duration::from_millis(650) && waited < Duration::from_millis(2000),
        "the waiter was granted {waited:?} after an eviction with a 700 ms delay"
    );
}

#[tokio::test]
async fn a_master_restarted_empty_does_not_shorten_a_delay() {
    let mut masters = masters(3);
    let (a, b) = common::two_replicas(&masters).await;
    a.must_grant("amnesia", json!({"ttl_ms": 30000, "lock_delay_ms": 3000}))
        .await;
    let (status, _) = a.send("DELETE", "/locks/amnesia", None).await;
    assert_eq!(status, 200);
    // One master forgets the delay; the other two still refuse, so no majority grants.
    masters[0].restart_empty();
    let (status, body) = b.grant("amnesia", json!({})).await;
    common::assert_error(status, &body, 409, "lock_delay");
}

#[tokio::test]
async fn a_lapsed_sessions_hold_leaves_its_delay_on_real_masters() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (_, session) = a
        .send("POST", "/sessions", Some(json!({"ttl_ms": 300})))
        .await;
    let id = session["session_id"].as_str().unwrap();
    let (status, _) = a
        .grant("sdelay", json!({"session": id, "lock_delay_ms": 800}))
        .await;
    assert_eq!(status, 201);
    let (status, body) = wait_for("the session to lapse", Duration::from_secs(5), async || {
        let (status, body) = b.grant("sdelay", json!({})).await;
        (body["error"] != "lock_held").then_some((status, body))
    })
    .await;
    common::assert_error(status, &body, 409, "lock_delay");
}

#[tokio::test]
async fn inspect_shows_a_lock_delay_while_it_refuses_grants() {
    let (_masters, a, _b) = common::two_replicas_over_three().await;
    common::scenarios::inspect_shows_a_lock_delay_while_it_refuses_grants(&a).await;
}
