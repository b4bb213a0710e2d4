//! The semaphores table of the contract, in process over the embedded store: permits taken,
//! renewed, released, inspected and force-released on one replica, limits shared between
//! grants, keyed retries, held streams and bad input. At most `limit` permits under
//! concurrency on two replicas over real masters is in `masters::semaphores`.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::TestApp;
use serde_json::{Value, json};

async fn take(app: &TestApp, name: &str, body: Value) -> (u16, Value) {
    app.send("POST", &format!("/semaphores/{name}"), Some(body))
        .await
}

#[tokio::test]
async fn at_most_limit_permits_each_on_its_own_slot_with_a_rising_token() {
    let app = TestApp::embedded().await;
    let mut slots = BTreeSet::new();
    let mut permits = Vec::new();
    for i in 0..3 {
        let (status, permit) =
            take(&app, "pool", json!({"limit": 3, "owner": format!("w{i}")})).await;
        assert_eq!(status, 201, "{permit}");
        assert_eq!(permit["limit"], 3);
        assert!(slots.insert(permit["slot"].as_u64().unwrap()), "{permit}");
        permits.push(permit);
    }
    assert_eq!(slots, BTreeSet::from([0, 1, 2]));
    let (status, full) = take(&app, "pool", json!({"limit": 3})).await;
    assert_eq!(
        (status, full["error"].as_str()),
        (409, Some("lock_held")),
        "{full}"
    );
    assert_eq!(full["message"], "every permit of this semaphore is taken");
    assert!(full["retry_after_ms"].as_u64().unwrap() > 0, "{full}");

    let (status, seen) = app.send("GET", "/semaphores/pool", None).await;
    assert_eq!(status, 200);
    let holders = seen["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 3, "{seen}");
    assert!(
        holders.iter().all(|h| h.get("lease_id").is_none()),
        "inspect never shows a lease id: {seen}"
    );
    assert_eq!(
        holders
            .iter()
            .map(|h| h["slot"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2],
        "by slot"
    );

    // Released: its slot is taken again, with a greater token than the slot's last.
    let freed = &permits[1];
    assert_eq!(
        app.lease_status("DELETE", "/semaphores/pool", freed).await,
        204
    );
    assert_eq!(
        app.lease_status("DELETE", "/semaphores/pool", freed).await,
        404
    );
    let (status, again) = take(&app, "pool", json!({"limit": 3})).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["slot"], freed["slot"]);
    assert!(again["fencing_token"].as_u64() > freed["fencing_token"].as_u64());

    // A renew keeps the lease id, the slot and the token.
    let renew_at = common::lease_path("/semaphores/pool", &again);
    let (status, renewed) = app
        .send("PUT", &renew_at, Some(json!({"ttl_ms": 9000})))
        .await;
    assert_eq!(status, 200, "{renewed}");
    for field in ["lease_id", "slot", "limit", "fencing_token"] {
        assert_eq!(renewed[field], again[field], "{field}");
    }
    assert_eq!(renewed["ttl_ms"], 9000);
}

#[tokio::test]
async fn a_semaphore_never_collides_with_a_lock_or_an_election_of_its_name() {
    let app = TestApp::embedded().await;
    let (status, _) = take(&app, "same", json!({"limit": 1})).await;
    assert_eq!(status, 201);
    assert_eq!(app.grant("same", json!({})).await.0, 201);
    assert_eq!(app.send("POST", "/elections/same", None).await.0, 201);
    assert_eq!(take(&app, "same", json!({"limit": 1})).await.0, 409);
}

#[tokio::test]
async fn grants_with_different_limits_share_the_slots() {
    let app = TestApp::embedded().await;
    let (_, wide) = take(&app, "mixed", json!({"limit": 2})).await;
    let (_, other) = take(&app, "mixed", json!({"limit": 2})).await;
    assert_eq!(
        BTreeSet::from([wide["slot"].as_u64(), other["slot"].as_u64()]),
        BTreeSet::from([Some(0), Some(1)])
    );
    // A grant with limit 1 may use slot 0 only: taken.
    assert_eq!(take(&app, "mixed", json!({"limit": 1})).await.0, 409);
    let zero = if wide["slot"] == 0 { &wide } else { &other };
    assert_eq!(
        app.lease_status("DELETE", "/semaphores/mixed", zero).await,
        204
    );
    let (status, narrow) = take(&app, "mixed", json!({"limit": 1})).await;
    assert_eq!(
        (status, narrow["slot"].as_u64()),
        (201, Some(0)),
        "{narrow}"
    );
    // Two holders remain (slot 1 from limit 2): a limit of 3 still has one slot.
    let (status, third) = take(&app, "mixed", json!({"limit": 3})).await;
    assert_eq!((status, third["slot"].as_u64()), (201, Some(2)), "{third}");
}

#[tokio::test]
async fn a_waiting_grant_takes_the_first_slot_freed() {
    let app = TestApp::embedded().await;
    let (_, only) = take(&app, "one", json!({"limit": 1})).await;
    let waiter = {
        let app = app.handle();
        tokio::spawn(async move { take(&app, "one", json!({"limit": 1, "wait_ms": 10_000})).await })
    };
    app.wait_for_contention("one", 1).await;
    assert_eq!(
        app.lease_status("DELETE", "/semaphores/one", &only).await,
        204
    );
    let (status, next) =
        common::joined(waiter, "granted at once, not at the end of its wait").await;
    assert_eq!((status, next["slot"].as_u64()), (201, Some(0)), "{next}");
}

#[tokio::test]
async fn a_permits_token_is_current_while_it_holds_its_slot() {
    let app = TestApp::embedded().await;
    let (_, permit) = take(&app, "f", json!({"limit": 2})).await;
    let token = permit["fencing_token"].as_u64().unwrap();
    let fence = |t: u64| format!("/semaphores/f/fences/{t}");
    let (status, body) = app.send("GET", &fence(token), None).await;
    assert_eq!((status, &body["current"]), (200, &json!(true)), "{body}");
    assert_eq!(
        app.send("GET", &fence(token + 1), None).await.1["current"],
        false
    );
    assert_eq!(
        app.send("GET", &format!("/locks/f/fences/{token}"), None)
            .await
            .1["current"],
        false,
        "not the lock's"
    );
    app.send(
        "DELETE",
        &common::lease_path("/semaphores/f", &permit),
        None,
    )
    .await;
    assert_eq!(
        app.send("GET", &fence(token), None).await.1["current"],
        false
    );
}

#[tokio::test]
async fn force_release_removes_every_permit() {
    let app = TestApp::embedded().await;
    let (_, a) = take(&app, "evict", json!({"limit": 2})).await;
    let (_, b) = take(&app, "evict", json!({"limit": 2})).await;
    let (status, removed) = app.send("DELETE", "/semaphores/evict", None).await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(removed["released"], true);
    let highest = a["fencing_token"].as_u64().max(b["fencing_token"].as_u64());
    assert_eq!(removed["fencing_token"].as_u64(), highest);
    assert_eq!(app.lease_status("PUT", "/semaphores/evict", &a).await, 404);
    assert_eq!(app.lease_status("PUT", "/semaphores/evict", &b).await, 404);
    let (_, seen) = app.send("GET", "/semaphores/evict", None).await;
    assert_eq!(seen["holders"], json!([]));
    let (_, again) = app.send("DELETE", "/semaphores/evict", None).await;
    assert_eq!(again["released"], false);
}

#[tokio::test]
async fn a_keyed_retry_answers_the_permit_its_first_attempt_won() {
    let app = TestApp::embedded().await;
    let keyed = |body: Value| app.keyed("/semaphores/k", "7d1c0f6e-permit", body);
    let first = keyed(json!({"limit": 3, "ttl_ms": 5000})).await;
    assert_eq!(first.status, 201);
    let first = first.json();
    // Another permit taken meanwhile changes which slots are free; the retry still finds
    // its own.
    take(&app, "k", json!({"limit": 3})).await;
    let retry = keyed(json!({"limit": 3, "ttl_ms": 5000})).await;
    assert_eq!(retry.status, 201);
    let retry = retry.json();
    for field in ["lease_id", "slot", "fencing_token"] {
        assert_eq!(retry[field], first[field], "{field}");
    }
    // Another limit is another request, whether or not a slot below it is free (with
    // limit 1, slot 0 may be this key's own permit, the other one, or free).
    for limit in [2, 1] {
        let other = keyed(json!({"limit": limit, "ttl_ms": 5000})).await;
        assert_eq!(other.status, 422, "limit {limit} is another request");
    }
    app.send("DELETE", &common::lease_path("/semaphores/k", &first), None)
        .await;
    let ended = keyed(json!({"limit": 3, "ttl_ms": 5000})).await;
    assert_eq!(ended.status, 404, "{:?}", ended.json());
}

#[tokio::test]
async fn a_held_permit_streams_its_slot_and_frees_it_when_the_client_leaves() {
    let app = TestApp::embedded().await;
    let mut stream = app
        .call("POST", "/semaphores/held?limit=1&ttl_ms=3000")
        .stream()
        .await;
    let granted = stream.expect_first("granted").await;
    assert_eq!(
        (granted["slot"].as_u64(), granted["limit"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(take(&app, "held", json!({"limit": 1})).await.0, 409);
    drop(stream);
    common::wait_for(
        "the permit released when its stream closed",
        Duration::from_secs(5),
        async || (take(&app, "held", json!({"limit": 1})).await.0 == 201).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn bad_semaphore_input_is_a_clear_400() {
    let app = TestApp::embedded().await;
    let cases: Vec<(&str, &str, Option<Value>)> = vec![
        ("POST", "/semaphores/s", None),
        ("POST", "/semaphores/s", Some(json!({}))),
        ("POST", "/semaphores/s", Some(json!({"limit": 0}))),
        ("POST", "/semaphores/s", Some(json!({"limit": 1001}))),
        ("POST", "/semaphores/s", Some(json!({"limit": -1}))),
        (
            "POST",
            "/semaphores/s",
            Some(json!({"limit": 2, "value": "x"})),
        ),
        ("POST", "/semaphores/s?limit=abc", None),
        ("POST", "/semaphores/a%20b", Some(json!({"limit": 2}))),
        ("PUT", "/semaphores/s/leases/not%20an%20id", None),
        ("GET", "/semaphores/s/fences/0", None),
    ];
    for (method, path, body) in cases {
        let (status, err) = app.send(method, path, body.clone()).await;
        assert_eq!(status, 400, "{method} {path} {body:?}: {err}");
        assert_eq!(err["error"], "invalid_request", "{err}");
    }
    // A lock's lease id, or a permit id whose slot was altered, is no permit.
    let (_, lock) = app.grant("s", json!({})).await;
    let id = lock["lease_id"].as_str().unwrap();
    assert_eq!(
        app.send("PUT", &format!("/semaphores/s/leases/{id}"), None)
            .await
            .0,
        404
    );
    let (_, permit) = take(&app, "s", json!({"limit": 2})).await;
    let id = permit["lease_id"].as_str().unwrap();
    let (base, _) = id.split_at(22);
    let other = if permit["slot"] == 0 { 1 } else { 0 };
    let forged = format!("/semaphores/s/leases/{base}_{other}_2");
    assert_eq!(app.send("PUT", &forged, None).await.0, 404);
    assert_eq!(app.send("DELETE", &forged, None).await.0, 404);
}

#[tokio::test]
async fn a_permit_is_checked_straight_through_its_lease_id() {
    let app = TestApp::embedded().await;
    take(&app, "pool", json!({"limit": 3})).await;
    let (status, permit) = take(&app, "pool", json!({"limit": 3, "owner": "w1"})).await;
    assert_eq!(status, 201, "{permit}");
    let path = common::lease_path("/semaphores/pool", &permit);
    let (status, checked) = app.get(&path).await;
    assert_eq!(status, 200, "{checked}");
    for field in [
        "name",
        "lease_id",
        "fencing_token",
        "slot",
        "limit",
        "owner",
    ] {
        assert_eq!(checked[field], permit[field], "{field}");
    }
    assert!(
        checked["validity_ms"].as_u64().is_some_and(|v| v > 0),
        "{checked}"
    );

    // Not a permit of this semaphore: another semaphore's name, a lock's lease id.
    let (status, body) = app
        .get(&common::lease_path("/semaphores/other", &permit))
        .await;
    common::assert_error(status, &body, 404, "lease_not_found");
    let (_, lock) = app.grant("pool", json!({})).await;
    let (status, body) = app
        .get(&common::lease_path("/semaphores/pool", &lock))
        .await;
    common::assert_error(status, &body, 404, "lease_not_found");
    let (status, body) = app.get("/semaphores/pool/leases/not%20an%20id").await;
    common::assert_error(status, &body, 400, "invalid_request");

    // Released: gone.
    assert_eq!(
        app.lease_status("DELETE", "/semaphores/pool", &permit)
            .await,
        204
    );
    let (status, body) = app.get(&path).await;
    common::assert_error(status, &body, 404, "lease_not_found");
}
