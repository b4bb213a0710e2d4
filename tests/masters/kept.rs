//! Kept holds on real masters: no one renews them, so a kept hold outlives the replica that
//! granted it and a master's restart with nothing in it, and ends at its maximum as an
//! expired lease does. FleetLock's reboot slots are kept holds, and do the same.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, config, masters, wait_for};
use serde_json::json;

#[tokio::test]
async fn a_kept_hold_outlives_its_replica_and_a_master_restart_and_ends_at_its_maximum() {
    let mut ms = masters(3);
    let mut cfg = config(&ms);
    cfg.master_timeout_ms = 200;
    cfg.default_ttl_ms = 300;
    cfg.max_ttl_ms = 500;
    cfg.max_kept_hold_ms = Some(4_000);
    let a = TestApp::spawn(cfg.clone()).await;
    let b = TestApp::spawn(cfg).await;
    let granted = Instant::now();
    let (status, lease) = a
        .grant("kept", json!({"kept": true, "owner": "node-7"}))
        .await;
    assert_eq!(status, 201, "{lease}");
    let token = lease["fencing_token"].clone();
    // The replica that granted it is gone, and one master comes back empty; past any TTL a
    // client may ask, with no renew sent, the hold is still there.
    a.stop().await;
    ms[1].restart_empty();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let (status, seen) = b.inspect("kept").await;
    assert_eq!((status, &seen["fencing_token"]), (200, &token), "{seen}");
    assert!(seen["kept_until"].is_string(), "{seen}");
    let (status, body) = b.grant("kept", json!({})).await;
    common::assert_error(status, &body, 409, "lock_held");
    // Free again at its maximum, not before.
    let (taken, _) = wait_for("the kept hold's end", Duration::from_secs(10), async || {
        let (status, body) = b.grant("kept", json!({})).await;
        (status == 201).then_some((Instant::now(), body))
    })
    .await;
    let held = taken - granted;
    assert!(
        held >= Duration::from_millis(3_900),
        "granted again {held:?} after a kept hold of 4 s"
    );
}

/// `op` (`pre-reboot` or `steady-state`) for node `id` of the default group, as Zincati
/// sends it: the status and FleetLock's `kind`, if any.
async fn fleet(app: &TestApp, op: &str, id: &str) -> (u16, Option<String>) {
    let answer = app
        .call("POST", &format!("/fleetlock/v1/{op}"))
        .header("fleet-lock-protocol", "true")
        .json(&json!({"client_params": {"id": id, "group": "default"}}))
        .send()
        .await;
    let kind = answer.json()["kind"].as_str().map(str::to_owned);
    (answer.status, kind)
}

#[tokio::test]
async fn a_nodes_reboot_slot_outlives_the_replica_it_took_it_through_and_a_master_restart() {
    let mut ms = masters(3);
    let mut cfg = config(&ms);
    cfg.master_timeout_ms = 200;
    let a = TestApp::spawn(cfg.clone()).await;
    let b = TestApp::spawn(cfg).await;
    assert_eq!(fleet(&a, "pre-reboot", "node-a").await.0, 200);
    a.stop().await;
    ms[0].restart_empty();
    // Through the other replica: the slot is node-a's still, whoever asks.
    assert_eq!(
        fleet(&b, "pre-reboot", "node-b").await,
        (423, Some("failed_lock_semaphore_full".to_owned()))
    );
    assert_eq!(
        fleet(&b, "pre-reboot", "node-a").await.0,
        200,
        "node-a's own slot again"
    );
    assert_eq!(fleet(&b, "steady-state", "node-b").await.0, 200);
    assert_eq!(fleet(&b, "steady-state", "node-a").await.0, 200);
    assert_eq!(fleet(&b, "pre-reboot", "node-b").await.0, 200);
}
