//! Lock-delay in process over the embedded store: a lease that ends other than by its
//! holder's revoke (it expired, or was force-released) leaves its name refused with 409
//! `lock_delay` for its `lock_delay_ms`, a waiting grant waits the delay out, a renew moves
//! the delay with the TTL, and a holder's own revoke leaves none. The same on real masters
//! and two replicas is in `masters::lock_delay`.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, wait_for};
use serde_json::{Value, json};

/// Poll grants of `name` until one is not `lock_held` (the lease has lapsed): that answer.
async fn first_answer_after_the_lease(app: &TestApp, name: &str) -> (u16, Value, Instant) {
    wait_for("the lease to lapse", Duration::from_secs(5), async || {
        let (status, body) = app.grant(name, json!({"ttl_ms": 1000})).await;
        (body["error"] != "lock_held").then(|| (status, body, Instant::now()))
    })
    .await
}

#[tokio::test]
async fn an_expired_lease_leaves_its_name_refused_for_its_lock_delay_then_free() {
    let app = TestApp::embedded().await;
    let granted = Instant::now();
    let (_, token) = app
        .must_grant("mailer", json!({"ttl_ms": 200, "lock_delay_ms": 600}))
        .await;

    let (status, refused, seen) = first_answer_after_the_lease(&app, "mailer").await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_delay")),
        "{refused}"
    );
    let retry = refused["retry_after_ms"].as_u64().unwrap();
    assert!(retry > 0 && retry <= 600, "{refused}");
    // Inspect says nobody holds it: the delay is not a holder.
    assert_eq!(app.inspect("mailer").await.1["held"], false);

    let answer = app
        .call("POST", "/locks/mailer")
        .json(&json!({}))
        .send()
        .await;
    if answer.status == 409 {
        assert_eq!(answer.header("retry-after"), Some("1"), "{}", answer.text);
    }

    let (_, next) = wait_for("the delay to end", Duration::from_secs(5), async || {
        let (status, body) = app.grant("mailer", json!({})).await;
        if status == 409 {
            assert_eq!(body["error"], "lock_delay", "never lock_held: {body}");
            return None;
        }
        Some((status, body))
    })
    .await;
    assert!(
        granted.elapsed() >= Duration::from_millis(200 + 600 - 20),
        "granted {:?} after the first grant, inside TTL + delay",
        granted.elapsed()
    );
    assert!(seen.elapsed() <= Duration::from_millis(retry + 500));
    assert!(next["fencing_token"].as_u64().unwrap() > token, "{next}");
}

#[tokio::test]
async fn a_holders_own_revoke_leaves_no_delay() {
    let app = TestApp::embedded().await;
    let (lease, _) = app
        .must_grant("cache", json!({"ttl_ms": 5000, "lock_delay_ms": 60000}))
        .await;
    assert_eq!(app.revoke("cache", &lease).await.0, 204);
    let (status, body) = app.grant("cache", json!({})).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_force_release_starts_the_delay() {
    let app = TestApp::embedded().await;
    app.must_grant("stuck", json!({"ttl_ms": 60000, "lock_delay_ms": 400}))
        .await;
    let (status, released) = app.send("DELETE", "/locks/stuck", None).await;
    assert_eq!((status, &released["released"]), (200, &json!(true)));
    let (status, refused) = app.grant("stuck", json!({})).await;
    assert_eq!((status, &refused["error"]), (409, &json!("lock_delay")));
    assert!(refused["retry_after_ms"].as_u64().unwrap() <= 400);
}

#[tokio::test]
async fn a_waiting_grant_waits_the_delay_out_and_is_granted_when_it_ends() {
    let app = TestApp::embedded().await;
    let (lease, _) = app
        .must_grant("feed", json!({"ttl_ms": 60000, "lock_delay_ms": 500}))
        .await;
    app.send("DELETE", "/locks/feed", None).await;
    let evicted = Instant::now();
    let waiter = app.grant_in_background("feed", json!({"wait_ms": 5000}));
    let (_, waited) = common::granted_since(waiter, evicted).await;
    assert!(
        waited >= Duration::from_millis(480) && waited < Duration::from_millis(1500),
        "granted {waited:?} after the eviction of a lease with a 500 ms delay"
    );
    // The evicted holder's lease is gone: its revoke is 404, and takes no delay with it.
    assert_eq!(app.revoke("feed", &lease).await.0, 404);
}

#[tokio::test]
async fn a_renew_moves_the_delay_with_the_ttl() {
    let app = TestApp::embedded().await;
    let (lease, _) = app
        .must_grant("job", json!({"ttl_ms": 200, "lock_delay_ms": 300}))
        .await;
    // Past the first TTL and its delay, the renewed lease still ends with its delay.
    let (status, _) = app.renew("job", &lease, json!({"ttl_ms": 900})).await;
    assert_eq!(status, 200);
    let (status, body, _) = first_answer_after_the_lease(&app, "job").await;
    common::assert_error(status, &body, 409, "lock_delay");
}

#[tokio::test]
async fn shared_and_several_name_grants_are_refused_during_a_delay() {
    let app = TestApp::embedded().await;
    app.must_grant("doc", json!({"ttl_ms": 60000, "lock_delay_ms": 5000}))
        .await;
    app.send("DELETE", "/locks/doc", None).await;
    let (status, body) = app.grant("doc", json!({"mode": "shared"})).await;
    common::assert_error(status, &body, 409, "lock_delay");
    let (status, body) = app
        .send("POST", "/locks", Some(json!({"names": ["doc", "other"]})))
        .await;
    common::assert_error(status, &body, 409, "lock_delay");
    // The other name was not taken by the refused grant.
    assert_eq!(app.grant("other", json!({})).await.0, 201);
}

#[tokio::test]
async fn an_elections_term_may_carry_a_lock_delay() {
    let app = TestApp::embedded().await;
    app.created(
        "/elections/primary",
        json!({"ttl_ms": 60000, "lock_delay_ms": 5000, "value": "a"}),
    )
    .await;
    app.send("DELETE", "/elections/primary", None).await;
    let (status, body) = app
        .send("POST", "/elections/primary", Some(json!({"value": "b"})))
        .await;
    common::assert_error(status, &body, 409, "lock_delay");
}

#[tokio::test]
async fn a_lock_delay_out_of_bounds_or_on_a_shared_grant_is_400() {
    let app = TestApp::embedded().await;
    for body in [
        json!({"lock_delay_ms": 60001}),
        json!({"lock_delay_ms": -1}),
        json!({"lock_delay_ms": 100, "mode": "shared"}),
    ] {
        let (status, answer) = app.grant("x", body.clone()).await;
        assert_eq!(
            (status, &answer["error"]),
            (400, &json!("invalid_request")),
            "{body}: {answer}"
        );
    }
    let (status, _) = app
        .send(
            "POST",
            "/semaphores/pool",
            Some(json!({"limit": 2, "lock_delay_ms": 100})),
        )
        .await;
    assert_eq!(status, 400);
    // The free name was never held by a refused request.
    assert_eq!(app.inspect("x").await.1["held"], false);
}

#[tokio::test]
async fn a_session_that_expires_leaves_its_holds_delays_and_one_ended_leaves_none() {
    let app = TestApp::embedded().await;
    let open = async |ttl_ms: u64| {
        let (_, session) = app
            .send("POST", "/sessions", Some(json!({"ttl_ms": ttl_ms})))
            .await;
        session["session_id"].as_str().unwrap().to_owned()
    };
    let lapsing = open(300).await;
    let (status, _) = app
        .grant("sd:1", json!({"session": lapsing, "lock_delay_ms": 600}))
        .await;
    assert_eq!(status, 201);
    let (status, body, _) = first_answer_after_the_lease(&app, "sd:1").await;
    common::assert_error(status, &body, 409, "lock_delay");

    let ended = open(30000).await;
    app.grant("sd:2", json!({"session": ended, "lock_delay_ms": 60000}))
        .await;
    app.send("DELETE", &format!("/sessions/{ended}"), None)
        .await;
    let (status, body) = app.grant("sd:2", json!({})).await;
    assert_eq!(
        status, 201,
        "ending the session is its holder's own release: {body}"
    );
}

#[tokio::test]
async fn inspect_shows_a_lock_delay_while_it_refuses_grants() {
    let app = TestApp::embedded().await;
    common::scenarios::inspect_shows_a_lock_delay_while_it_refuses_grants(&app).await;
}
