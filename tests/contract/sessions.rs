//! Sessions in process over the embedded store: holds of every kind made through one
//! session live as long as it does, renewing it renews them, ending it releases them all,
//! an expired session's holds are free, a grant through an unknown session holds nothing,
//! and a streamed session ends with its connection. The same on real masters and two
//! replicas is in `masters::sessions`.

use crate::common;

use std::time::Duration;

use common::{TestApp, wait_for};
use serde_json::json;

async fn open(app: &TestApp, ttl_ms: u64) -> String {
    let session = app
        .created("/sessions", json!({"ttl_ms": ttl_ms, "owner": "w1"}))
        .await;
    assert_eq!(session["owner"], "w1");
    assert_eq!(session["ttl_ms"], ttl_ms);
    assert!(session["validity_ms"].as_u64().unwrap() <= ttl_ms);
    session["session_id"].as_str().unwrap().to_owned()
}

async fn all_held(app: &TestApp) -> bool {
    let mut held = true;
    for path in [
        "/locks/s:lock",
        "/locks/s:doc",
        "/locks/s:a",
        "/locks/s:b",
        "/elections/s:lead",
    ] {
        let (_, status) = app.get(path).await;
        held &= status["held"] == true || status["vacant"] == false;
    }
    let (_, pool) = app.get("/semaphores/s:pool").await;
    held && pool["holders"].as_array().is_some_and(|p| !p.is_empty())
}

async fn none_held(app: &TestApp) -> bool {
    for path in ["/locks/s:lock", "/locks/s:doc", "/locks/s:a", "/locks/s:b"] {
        if app.get(path).await.1["held"] != false {
            return false;
        }
    }
    let (_, pool) = app.get("/semaphores/s:pool").await;
    let (_, lead) = app.get("/elections/s:lead").await;
    pool["holders"].as_array().is_none_or(|p| p.is_empty()) && lead["vacant"] == true
}

#[tokio::test]
async fn holds_of_every_kind_live_as_long_as_their_session_and_go_when_it_ends() {
    let app = TestApp::embedded().await;
    let session = open(&app, 400).await;
    let held = common::scenarios::hold_through(&app, &session, "s:", 2, true).await;
    // The holds' validity is the session's.
    for lease in &held {
        let ttl = lease["ttl_ms"].as_u64().unwrap();
        assert!(ttl <= 400, "{lease}");
        assert!(lease["validity_ms"].as_u64().unwrap() <= 400, "{lease}");
    }
    // Held for twice the session's TTL while only the session is renewed.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(800) {
        let (status, renewed) = app.send("PUT", &format!("/sessions/{session}"), None).await;
        assert_eq!(status, 200, "{renewed}");
        assert!(
            all_held(&app).await,
            "a hold lapsed while its session was renewed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A renew of one hold changes nothing: it answers what is left of the session.
    let lock = &held[0];
    let (status, renewed) = app
        .send(
            "PUT",
            &format!(
                "/locks/s:lock/leases/{}",
                lock["lease_id"].as_str().unwrap()
            ),
            Some(json!({"ttl_ms": 60000})),
        )
        .await;
    assert_eq!(status, 200, "{renewed}");
    assert!(renewed["ttl_ms"].as_u64().unwrap() <= 400, "{renewed}");

    let (status, read) = app.get(&format!("/sessions/{session}")).await;
    assert_eq!(status, 200);
    let holds = read["holds"].as_array().unwrap();
    assert_eq!(holds.len(), 5, "{read}");
    let kinds: Vec<&str> = holds.iter().map(|h| h["kind"].as_str().unwrap()).collect();
    for kind in ["lock", "semaphore", "election"] {
        assert!(kinds.contains(&kind), "{kinds:?}");
    }
    assert!(holds.iter().any(|h| h["mode"] == "shared"));
    assert!(holds.iter().any(|h| h["names"] == json!(["s:a", "s:b"])));
    assert!(holds.iter().any(|h| h["slot"].is_u64()));

    let path = format!("/sessions/{session}");
    app.deleted(&path).await;
    assert!(
        none_held(&app).await,
        "ending the session released every hold at once"
    );
    let (status, gone) = app.get(&path).await;
    assert_eq!((status, &gone["error"]), (404, &json!("session_not_found")));
    assert_eq!(app.send("PUT", &path, None).await.0, 404);
}

#[tokio::test]
async fn an_expired_sessions_holds_are_free() {
    let app = TestApp::embedded().await;
    let session = open(&app, 300).await;
    common::scenarios::hold_through(&app, &session, "s:", 2, true).await;
    wait_for(
        "the session to expire",
        Duration::from_secs(5),
        async || none_held(&app).await.then_some(()),
    )
    .await;
    let (status, body) = app.grant("s:lock", json!({})).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_grant_through_an_unknown_or_ended_session_is_404_and_holds_nothing() {
    let app = TestApp::embedded().await;
    let (status, body) = app
        .grant("u:lock", json!({"session": "AAAAAAAAAAAAAAAAAAAAAA"}))
        .await;
    assert_eq!((status, &body["error"]), (404, &json!("session_not_found")));
    assert_eq!(app.inspect("u:lock").await.1["held"], false);
    let session = open(&app, 5000).await;
    app.send("DELETE", &format!("/sessions/{session}"), None)
        .await;
    let (status, body) = app.grant("u:lock", json!({"session": session})).await;
    assert_eq!((status, &body["error"]), (404, &json!("session_not_found")));
    assert_eq!(app.grant("u:lock", json!({})).await.0, 201);
    let (status, _) = app.grant("u:x", json!({"session": "not a session"})).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_hold_revoked_by_its_own_lease_id_leaves_the_rest_of_the_session() {
    let app = TestApp::embedded().await;
    let session = open(&app, 5000).await;
    let (_, one) = app.grant("r:1", json!({"session": session})).await;
    let (_, _two) = app.grant("r:2", json!({"session": session})).await;
    let id = one["lease_id"].as_str().unwrap();
    assert_eq!(app.revoke("r:1", id).await.0, 204);
    let (_, read) = app.get(&format!("/sessions/{session}")).await;
    assert_eq!(app.inspect("r:2").await.1["held"], true);
    assert_eq!(app.inspect("r:1").await.1["held"], false);
    // The session's renew drops the hold that is gone.
    app.send("PUT", &format!("/sessions/{session}"), None).await;
    let (_, read_after) = app.get(&format!("/sessions/{session}")).await;
    assert!(
        read_after["holds"].as_array().unwrap().len() <= read["holds"].as_array().unwrap().len()
    );
    assert_eq!(
        read_after["holds"].as_array().unwrap().len(),
        1,
        "{read_after}"
    );
}

#[tokio::test]
async fn a_waiter_is_woken_when_a_session_ends() {
    let app = TestApp::embedded().await;
    let session = open(&app, 30000).await;
    app.grant("w:lock", json!({"session": session})).await;
    let waiter = app
        .grant_in_line("w:lock", json!({"wait_ms": 10000}), "w", 1)
        .await;
    let ended = std::time::Instant::now();
    app.send("DELETE", &format!("/sessions/{session}"), None)
        .await;
    common::woken_within(waiter, ended, Duration::from_millis(500), None).await;
}

#[tokio::test]
async fn a_streamed_session_ends_with_its_connection() {
    let app = TestApp::embedded().await;
    let (mut stream, session) = app.hold_session("ttl_ms=600").await;
    let (status, _) = app.grant("st:lock", json!({"session": session})).await;
    assert_eq!(status, 201);
    // Renewed by the stream: still held after twice the TTL.
    stream.expect("heartbeat").await;
    stream.expect("heartbeat").await;
    stream.expect("heartbeat").await;
    stream.expect("heartbeat").await;
    assert_eq!(app.inspect("st:lock").await.1["held"], true);
    drop(stream);
    wait_for("the lock to be freed", Duration::from_secs(1), async || {
        (app.inspect("st:lock").await.1["held"] == false).then_some(())
    })
    .await;
    let (status, _) = app.get(&format!("/sessions/{session}")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn sessions_are_counted_in_the_metrics() {
    let app = TestApp::embedded().await;
    let session = open(&app, 30000).await;
    app.grant("m:1", json!({"session": session})).await;
    app.send("PUT", &format!("/sessions/{session}"), None).await;
    let metrics = app.text("/metrics").await;
    assert!(metrics.contains("redlockd_sessions_active 1"), "{metrics}");
    assert!(
        metrics.contains(r#"redlockd_session_holds_bucket{le="1"} 1"#),
        "one renew carried one hold"
    );
    assert!(metrics.contains(r#"kind="session""#));
    app.send("DELETE", &format!("/sessions/{session}"), None)
        .await;
    assert!(
        app.text("/metrics")
            .await
            .contains("redlockd_sessions_active 0")
    );
}

#[tokio::test]
async fn a_leader_elected_through_a_session_proclaims_and_is_deposed_with_it() {
    let app = TestApp::embedded().await;
    let session = open(&app, 5000).await;
    let term = app
        .created(
            "/elections/e:lead",
            json!({"session": session, "value": "a"}),
        )
        .await;
    let lease = term["lease_id"].as_str().unwrap();
    let (status, proclaimed) = app
        .send(
            "PUT",
            &format!("/elections/e:lead/leases/{lease}"),
            Some(json!({"value": "b"})),
        )
        .await;
    assert_eq!(status, 200, "{proclaimed}");
    assert_eq!(app.get("/elections/e:lead").await.1["value"], "b");
    app.send("DELETE", &format!("/sessions/{session}"), None)
        .await;
    assert_eq!(app.get("/elections/e:lead").await.1["vacant"], true);
}

#[tokio::test]
async fn a_session_hold_reports_the_sessions_ttl_whether_checked_or_renewed() {
    let app = TestApp::embedded().await;
    common::scenarios::a_session_hold_reports_the_sessions_ttl_whether_checked_or_renewed(&app)
        .await;
}

/// Two replicas over the same in-process masters.
async fn replicas() -> (TestApp, TestApp) {
    TestApp::replicas_in_process(common::config(&[])).await
}

/// A blip: a session's stream with a grace drops, its holder resumes it through another
/// replica, and the first stream's grace then ends nothing: the session and its holds stay
/// (same fencing token) until the resumed stream's own end ends them. Without a grace the
/// drop ends the session at once, and a resume finds nothing.
#[tokio::test]
async fn a_sessions_held_stream_with_a_grace_survives_its_connection_for_a_resume() {
    let (a, b) = replicas().await;
    let (first, id) = a.hold_session("ttl_ms=30000&grace_ms=1500").await;
    let (status, lease) = a.grant("sr:lock", json!({"session": id})).await;
    assert_eq!(status, 201, "{lease}");
    drop(first);
    let mut resumed = b.resume_session(&id, json!({})).await;
    let body = resumed.expect_first("resumed").await;
    assert_eq!(body["session_id"], id.as_str(), "{body}");
    // The first stream's grace runs out meanwhile: it ends nothing then.
    a.session_streams_done().await;
    let (status, held) = b.inspect("sr:lock").await;
    assert_eq!(
        held["held"], true,
        "the old stream's grace ended the session"
    );
    assert_eq!(
        held["fencing_token"], lease["fencing_token"],
        "{status} {held}"
    );
    assert_eq!(b.get(&format!("/sessions/{id}")).await.0, 200);

    // The resumed stream is a held stream: its end (no grace) ends the session at once.
    drop(resumed);
    wait_for("the lock to be freed", Duration::from_secs(2), async || {
        (b.inspect("sr:lock").await.1["held"] == false).then_some(())
    })
    .await;
    let mut late = a.resume_session(&id, json!({})).await;
    assert_eq!(late.expect("failed").await["error"], "session_not_found");
}

/// A session's stream with a grace whose holder never comes back: the session (and its
/// holds) go at the grace's end, not before, and a waiter is granted then.
#[tokio::test]
async fn a_sessions_stream_abandoned_past_its_grace_ends_the_session() {
    let (a, b) = replicas().await;
    let (first, id) = a.hold_session("ttl_ms=30000&grace_ms=400").await;
    assert_eq!(a.grant("sg:lock", json!({"session": id})).await.0, 201);
    b.granted_after_grace("sg:lock", "sg", first, Duration::from_millis(400))
        .await;
    assert_eq!(b.get(&format!("/sessions/{id}")).await.0, 404);
}

/// A resume displaces the session's older stream while that one is still open: its next
/// renew finds another stream keeping the session, and it ends with `closed` (`resumed`),
/// ending nothing. Bad fields are refused before any stream.
#[tokio::test]
async fn a_session_resume_displaces_the_older_stream_still_open() {
    let (a, b) = replicas().await;
    let (mut old, id) = a.hold_session("ttl_ms=300").await;
    assert_eq!(a.grant("sd:lock", json!({"session": id})).await.0, 201);
    let mut resumed = b.resume_session(&id, json!({})).await;
    resumed.expect("resumed").await;
    old.displaced().await;
    a.session_streams_done().await;
    resumed.expect("heartbeat").await;
    assert_eq!(a.inspect("sd:lock").await.1["held"], true);

    for bad in [json!({"grace_ms": 3_600_001}), json!({"ttl_ms": 1000})] {
        let refused = b.resume_session(&id, bad.clone()).await;
        assert_eq!(refused.status, 400, "{bad}");
    }
    let refused = b.resume_session("not!a!session", json!({})).await;
    assert_eq!(refused.status, 400);
    let refused = b
        .call("POST", "/sessions?grace_ms=3600001")
        .header("accept", "text/event-stream")
        .send()
        .await;
    assert_eq!(refused.status, 400);
}
