//! Kept holds, in process under paused time: a grant with `kept: true` needs no renew, is
//! held until revoked or its maximum (REDLOCKD_MAX_KEPT_HOLD_MS), shows `kept_until` in
//! inspect and list, and ends at its maximum as an expiry does (a lock-delay applies). A
//! kept hold on real masters, through a replica's death and a master's restart, is
//! `masters::kept`'s.

use crate::common;

use std::time::Duration;

use common::{TestApp, assert_error, config};
use serde_json::{Value, json};

/// TTLs of at most 1 s for clients, kept holds of 3 s.
async fn app() -> TestApp {
    let mut cfg = config(&[]);
    cfg.default_ttl_ms = 500;
    cfg.max_ttl_ms = 1_000;
    cfg.max_kept_hold_ms = Some(3_000);
    TestApp::in_process(cfg).await
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_hold_needs_no_renew_and_ends_at_its_maximum() {
    let app = app().await;
    let (status, lease) = app.grant("k", json!({"kept": true})).await;
    assert_eq!(status, 201, "{lease}");
    assert_eq!(
        lease["ttl_ms"], 3_000,
        "its TTL is the kept maximum: {lease}"
    );
    let (_, seen) = app.inspect("k").await;
    assert!(seen["kept_until"].is_string(), "{seen}");
    let metrics = app.text("/metrics").await;
    assert!(
        metrics.contains(r#"redlockd_kept_holds_granted_total{kind="lock"} 1"#),
        "{metrics}"
    );
    // Past any TTL a client may ask, no renew sent: still held.
    sleep_ms(2_900).await;
    assert_error(
        app.grant("k", json!({})).await.0,
        &app.grant("k", json!({})).await.1,
        409,
        "lock_held",
    );
    sleep_ms(200).await;
    assert_eq!(
        app.grant("k", json!({})).await.0,
        201,
        "free once its maximum passed"
    );
    // A lease its holder renews shows no kept_until.
    let (_, seen) = app.inspect("k").await;
    assert!(seen.get("kept_until").is_none(), "{seen}");
}

#[tokio::test(start_paused = true)]
async fn a_kept_hold_that_reaches_its_maximum_leaves_its_lock_delay() {
    let app = app().await;
    let (status, lease) = app
        .grant("d", json!({"kept": true, "lock_delay_ms": 1_000}))
        .await;
    assert_eq!(status, 201, "{lease}");
    sleep_ms(3_100).await;
    let (status, body) = app.grant("d", json!({})).await;
    assert_error(status, &body, 409, "lock_delay");
    sleep_ms(1_000).await;
    assert_eq!(app.grant("d", json!({})).await.0, 201);
}

#[tokio::test(start_paused = true)]
async fn a_kept_hold_is_revoked_and_force_released_as_any_lease() {
    let app = app().await;
    let (id, token) = app.must_grant("r", json!({"kept": true})).await;
    let (status, renewed) = app.renew("r", &id, json!({})).await;
    assert_eq!(
        (status, &renewed["fencing_token"]),
        (200, &json!(token)),
        "{renewed}"
    );
    assert_eq!(
        renewed["ttl_ms"], 3_000,
        "a renew without ttl_ms keeps it kept: {renewed}"
    );
    assert_eq!(app.revoke("r", &id).await.0, 204);
    assert_eq!(app.grant("r", json!({})).await.0, 201);

    app.must_grant("f", json!({"kept": true})).await;
    let (status, body) = app.send("DELETE", "/locks/f", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(app.grant("f", json!({})).await.0, 201);
}

#[tokio::test(start_paused = true)]
async fn every_kind_of_hold_may_be_kept_and_says_so_in_inspect_and_list() {
    let app = app().await;
    let kept = |v: &Value| v["kept_until"].is_string();
    app.created("/semaphores/pool", json!({"limit": 2, "kept": true}))
        .await;
    let (_, seen) = app.get("/semaphores/pool").await;
    assert!(kept(&seen["holders"][0]), "{seen}");
    app.created("/elections/lead", json!({"value": "a", "kept": true}))
        .await;
    let (_, seen) = app.get("/elections/lead").await;
    assert!(kept(&seen), "{seen}");
    app.created("/locks", json!({"names": ["g1", "g2"], "kept": true}))
        .await;
    let (status, body) = app
        .send("POST", "/locks/s?mode=shared&kept=true", None)
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, seen) = app.inspect("s").await;
    assert!(kept(&seen["holders"][0]), "{seen}");
    // The list shows exclusive holds.
    let (_, list) = app.get("/locks").await;
    let names: Vec<&str> = list["locks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| kept(l))
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["g1", "g2"], "{list}");
}

#[tokio::test]
async fn kept_is_refused_with_what_says_how_long_a_hold_lives_and_when_off() {
    let app = app().await;
    for (body, words) in [
        (json!({"kept": true, "ttl_ms": 500}), "ttl_ms"),
        (
            json!({"kept": true, "session": "AAAAAAAAAAAAAAAAAAAAAA"}),
            "session",
        ),
        (json!({"kept": "yes"}), "true or false"),
    ] {
        let (status, answer) = app.grant("x", body.clone()).await;
        assert_error(status, &answer, 400, "invalid_request");
        assert!(
            answer["message"].as_str().unwrap().contains(words),
            "{body}: {answer}"
        );
    }
    let stream = app
        .call("POST", "/locks/x?kept=true")
        .header("accept", "text/event-stream")
        .send()
        .await;
    assert_error(stream.status, &stream.json(), 400, "invalid_request");
    assert_eq!(app.inspect("x").await.1["held"], false);

    // Off when the kept maximum is not more than the largest TTL.
    let mut cfg = config(&[]);
    cfg.max_kept_hold_ms = Some(cfg.max_ttl_ms);
    let off = TestApp::in_process(cfg).await;
    let (status, answer) = off.grant("x", json!({"kept": true})).await;
    assert_error(status, &answer, 400, "invalid_request");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("REDLOCKD_MAX_KEPT_HOLD_MS"),
        "{answer}"
    );
}
