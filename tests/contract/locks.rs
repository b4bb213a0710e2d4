//! The locks table of the contract, in process over the embedded store: fields as query
//! parameters or bodies, bad input, a held lock, foreign and stale leases, waiting grants
//! (woken by a revoke, first come first served, giving up), listing. Against real masters
//! (`masters::api`) stay the rows the Lua scripts decide: a whole lease's life, racing
//! grants, expiry, tokens across restarts, paging.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, config};
use serde_json::json;

#[tokio::test]
async fn fields_may_be_query_parameters_and_bodies_may_be_empty() {
    let app = TestApp::embedded().await;
    let resp = app
        .call("POST", "/locks/q?ttl_ms=5000&owner=curl-user")
        .send()
        .await;
    assert_eq!(resp.status, 201);
    let lease: serde_json::Value = resp.json();
    assert_eq!(
        (lease["ttl_ms"].as_u64(), lease["owner"].as_str()),
        (Some(5000), Some("curl-user"))
    );
    let id = lease["lease_id"].as_str().unwrap();
    let resp = app
        .call("PUT", &format!("/locks/q/leases/{id}?ttl_ms=7000"))
        .send()
        .await;
    assert_eq!(resp.status, 200);
    let renewed: serde_json::Value = resp.json();
    assert_eq!(renewed["ttl_ms"], 7000);

    // No body, no query: the configured default TTL.
    let (status, lease) = app.grant("defaults", json!({})).await;
    assert_eq!((status, lease["ttl_ms"].as_u64()), (201, Some(30000)));
    assert!(lease.get("owner").is_none());
}

#[tokio::test]
async fn bad_input_is_a_clear_400_with_the_error_body() {
    let app = TestApp::embedded().await;
    let long = "x".repeat(257);
    let cases: Vec<(&str, String, serde_json::Value)> = vec![
        ("bad name", "/locks/a%20b".into(), json!({})),
        ("long name", format!("/locks/{long}"), json!({})),
        ("slash", "/locks/a%2Fb".into(), json!({})),
        ("ttl too small", "/locks/a".into(), json!({"ttl_ms": 99})),
        (
            "ttl too large",
            "/locks/a".into(),
            json!({"ttl_ms": 3_600_001}),
        ),
        (
            "wait too long",
            "/locks/a".into(),
            json!({"wait_ms": 60_001}),
        ),
        ("negative ttl", "/locks/a".into(), json!({"ttl_ms": -5})),
        ("typo", "/locks/a".into(), json!({"tll_ms": 5000})),
        (
            "owner too long",
            "/locks/a".into(),
            json!({"owner": "o".repeat(257)}),
        ),
        ("wrong type", "/locks/a".into(), json!({"owner": 5})),
    ];
    for (what, path, body) in cases {
        let resp = app.call("POST", &path).json(&body).send().await;
        assert_eq!(resp.status, 400, "{what}");
        let err: serde_json::Value = resp.json();
        assert_eq!(err["error"], "invalid_request", "{what}");
        assert!(!err["message"].as_str().unwrap().is_empty(), "{what}");
    }
    let resp = app.call("POST", "/locks/a").body("{not json").send().await;
    assert_eq!(resp.status, 400);
    let resp = app
        .call("POST", "/locks/a")
        .body("x".repeat(64 * 1024))
        .send()
        .await;
    assert_eq!(resp.status, 413);
    let err: serde_json::Value = resp.json();
    assert_eq!(err["error"], "invalid_request");
    let (status, err) = app.renew("a", "not%20an%20id", json!({})).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = app.get("/locks?limit=0").await;
    assert_eq!(status, 400);
    let (status, _) = app.get("/locks?prefix=a*").await;
    assert_eq!(status, 400);
    let (status, _) = app.get("/locks/a?unknown=1").await;
    assert_eq!(status, 400);
    // Nothing was granted by any of it.
    let (_, listed) = app.get("/locks").await;
    assert_eq!(listed["locks"], json!([]), "{listed}");
}

#[tokio::test]
async fn a_held_lock_is_409_with_retry_after() {
    let app = TestApp::embedded().await;
    app.must_grant("busy", json!({"ttl_ms": 20000})).await;
    let resp = app.call("POST", "/locks/busy").send().await;
    assert_eq!(resp.status, 409);
    let retry = resp.header("retry-after").unwrap().parse::<u64>().unwrap();
    assert!((19..=20).contains(&retry), "Retry-After {retry}");
    let body: serde_json::Value = resp.json();
    assert_eq!(body["error"], "lock_held");
    let after = body["retry_after_ms"].as_u64().unwrap();
    assert!(after > 18000 && after <= 20000, "retry_after_ms {after}");
}

#[tokio::test]
async fn foreign_and_stale_leases_can_neither_renew_nor_revoke() {
    let app = TestApp::embedded().await;
    let (mine, token) = app.must_grant("mine", json!({"ttl_ms": 30000})).await;
    let (other, _) = app.must_grant("other", json!({})).await;
    // Another lock's lease, a made-up id, and a lease for the right lock but revoked.
    for foreign in [other.as_str(), "AAAAAAAAAAAAAAAAAAAAAA"] {
        let (status, _) = app.renew("mine", foreign, json!({})).await;
        assert_eq!(status, 404);
        let (status, _) = app.revoke("mine", foreign).await;
        assert_eq!(status, 404);
        let (status, _) = app.check("mine", foreign).await;
        assert_eq!(status, 404);
    }
    let (status, lease) = app.check("mine", &mine).await;
    assert_eq!(
        (status, lease["fencing_token"].as_u64()),
        (200, Some(token))
    );

    app.revoke("mine", &mine).await;
    let (next, _) = app.must_grant("mine", json!({})).await;
    let (status, _) = app.renew("mine", &mine, json!({})).await;
    assert_eq!(
        status, 404,
        "the stale lease cannot renew the new holder's lock"
    );
    let (status, _) = app.revoke("mine", &mine).await;
    assert_eq!(status, 404);
    let (status, _) = app.check("mine", &next).await;
    assert_eq!(status, 200, "the new holder is untouched");
}

#[tokio::test]
async fn a_waiter_is_woken_by_a_revoke_not_by_the_ttl() {
    let app = TestApp::embedded().await;
    // Woken by the revoke, not at the 30 s TTL.
    common::scenarios::revoke_wakes(&app, &app, "queue", Duration::from_secs(5)).await;
}

#[tokio::test]
async fn waiters_are_served_first_come_first_served() {
    let app = TestApp::embedded().await;
    let (mut holder, _) = app.must_grant("fifo", json!({"ttl_ms": 30000})).await;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let body = json!({"wait_ms": 20000, "owner": format!("w{i}"), "ttl_ms": 30000});
        waiters.push(app.grant_in_background("fifo", body));
        // Each waiter must be in line before the next arrives.
        app.wait_for_contention("fifo", i + 1).await;
    }
    for (i, waiter) in waiters.into_iter().enumerate() {
        assert_eq!(app.revoke("fifo", &holder).await.0, 204);
        let (_, lease, _) = waiter.await.unwrap();
        assert_eq!(lease["owner"], format!("w{i}"), "served in arrival order");
        holder = lease["lease_id"].as_str().unwrap().to_owned();
    }
}

#[tokio::test]
async fn a_waiter_gives_up_with_409_when_wait_ms_runs_out() {
    let app = TestApp::embedded().await;
    app.must_grant("long", json!({"ttl_ms": 30000})).await;
    let started = Instant::now();
    let (status, body) = app.grant("long", json!({"wait_ms": 300})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("lock_held")));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(body["retry_after_ms"].as_u64().unwrap() > 20000);
}

#[tokio::test]
async fn list_filters_by_prefix_and_limit() {
    let app = TestApp::embedded().await;
    for name in ["job:b", "job:a", "job:c", "mail:1"] {
        app.must_grant(name, json!({"owner": name})).await;
    }
    let (_, listed) = app.get("/locks?prefix=job:&limit=2").await;
    let names = common::each(&listed["locks"], "name");
    assert_eq!(names, ["job:a", "job:b"]);
    let (_, all) = app.get("/locks").await;
    assert_eq!(all["locks"].as_array().unwrap().len(), 4);
    assert_eq!(all["locks"][0]["owner"], "job:a");
}

#[tokio::test]
async fn bad_keys_and_keys_on_streams_are_400() {
    let a = TestApp::embedded().await;
    for key in [String::new(), "a b".into(), "x".repeat(256)] {
        let answer = a
            .call("POST", "/locks/idem-4")
            .header("Idempotency-Key", &key)
            .send()
            .await;
        let (status, err) = (answer.status, answer.json());
        assert_eq!(status, 400, "{key:?}: {err}");
        assert_eq!(err["error"], "invalid_request");
    }
    let resp = a
        .call("POST", "/locks/idem-4")
        .header("Idempotency-Key", "k")
        .header("Accept", "text/event-stream")
        .send()
        .await;
    assert_eq!(resp.status, 400);
    assert_eq!(a.inspect("idem-4").await.1["held"], false);
}

#[tokio::test]
async fn a_waiting_grant_past_the_cap_is_429_with_retry_after_and_room_comes_back() {
    let mut cfg = config(&[]);
    cfg.max_waiters_per_name = 1;
    let app = TestApp::in_process(cfg).await;
    let (holder, _) = app.must_grant("capped", serde_json::json!({})).await;
    let first = app.grant_in_background("capped", serde_json::json!({"wait_ms": 10_000}));
    app.wait_for_contention("capped", 1).await;
    let resp = app.call("POST", "/locks/capped?wait_ms=10000").send().await;
    assert_eq!(resp.status, 429);
    assert_eq!(resp.header("retry-after"), Some("1"));
    let body: serde_json::Value = resp.json();
    assert_eq!(body["error"], "too_many_requests", "{body}");
    app.revoke("capped", &holder).await;
    let (status, _, _) = first.await.unwrap();
    assert_eq!(status, 201);
    // The line is empty again: a grant may wait.
    let (status, body) = app
        .grant("capped", serde_json::json!({"wait_ms": 100}))
        .await;
    assert_eq!(status, 409, "{body}");
    let metrics = app.text("/metrics").await;
    assert!(metrics.contains(
        r#"redlockd_requests_total{kind="lock",op="grant",outcome="too_many_requests"} 1"#
    ));
}

#[tokio::test]
async fn a_fencing_token_is_current_while_its_lease_holds_the_lock() {
    let app = TestApp::embedded().await;
    let fence = async |name: &str, token: &str| {
        let answer = app
            .call("GET", &format!("/locks/{name}/fences/{token}"))
            .send()
            .await;
        (answer.status, answer.json())
    };
    let (id, token) = app.must_grant("fenced", json!({"ttl_ms": 5000})).await;
    let (status, body) = fence("fenced", &token.to_string()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"name": "fenced", "fencing_token": token, "current": true})
    );
    // An older token, a later one, and another lock's: not current.
    for (name, other) in [
        ("fenced", token - 1),
        ("fenced", token + 1),
        ("other", token),
    ] {
        let (status, body) = fence(name, &other.to_string()).await;
        assert_eq!((status, &body["current"]), (200, &json!(false)), "{body}");
    }
    assert_eq!(app.revoke("fenced", &id).await.0, 204);
    let (status, body) = fence("fenced", &token.to_string()).await;
    assert_eq!((status, &body["current"]), (200, &json!(false)), "{body}");
    // The next holder's token is current, and only it.
    let (_, next) = app.must_grant("fenced", json!({})).await;
    assert!(next > token);
    assert_eq!(fence("fenced", &next.to_string()).await.1["current"], true);
    assert_eq!(
        fence("fenced", &token.to_string()).await.1["current"],
        false
    );

    for bad in ["0", "-1", "abc", "1.5", "%2B7", "18446744073709551616"] {
        let (status, body) = fence("fenced", bad).await;
        assert_eq!(
            (status, &body["error"]),
            (400, &json!("invalid_request")),
            "{bad}: {body}"
        );
    }
}
