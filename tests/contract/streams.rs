//! Leases held while the client's stream lives, and observers, in process: the response
//! body is the connection, and dropping it is the client leaving. Held streams across
//! replicas and masters that stop stay in `masters::streams`.

use crate::common;

use std::time::Duration;

use common::{EventStream, TestApp};
use std::sync::Arc;

use redlockd::store::memory::MemoryNode;
use serde_json::{Value, json};

async fn hold(app: &TestApp, name: &str, body: Value) -> EventStream {
    app.call("POST", &format!("/locks/{name}"))
        .json(&body)
        .stream()
        .await
}

#[tokio::test]
async fn a_waiting_stream_says_queued_then_granted() {
    let a = TestApp::embedded().await;
    let (lease, _) = a.must_grant("line", json!({"ttl_ms": 30_000})).await;
    let mut stream = hold(&a, "line", json!({"ttl_ms": 30_000, "wait_ms": 10_000})).await;
    assert_eq!(stream.expect("queued").await, json!({"position": 1}));
    a.revoke("line", &lease).await;
    stream.expect("granted").await;

    // Held after wait_ms: `failed` with the contract's error body, then the end.
    let mut late = hold(&a, "line", json!({"wait_ms": 200})).await;
    assert_eq!(late.expect("queued").await["position"], 1);
    let failed = late.expect("failed").await;
    assert_eq!(failed["error"], "lock_held");
    assert!(failed["retry_after_ms"].as_u64().is_some());
    assert!(late.next().await.is_none(), "the stream ends");

    // Bad fields are refused before any stream.
    let bad = hold(&a, "line", json!({"ttl_ms": 1})).await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn a_held_lease_is_renewed_while_its_body_is_read_and_handed_over_when_dropped() {
    let app = TestApp::embedded().await;
    let mut stream = hold(&app, "held", json!({"ttl_ms": 300})).await;
    let granted = stream.expect_first("granted").await;
    let token = granted["fencing_token"].as_u64().unwrap();
    for _ in 0..3 {
        let beat = stream.expect("heartbeat").await;
        assert_eq!(beat["fencing_token"].as_u64(), Some(token));
    }
    app.woken_by_drop("held", stream, token, Duration::from_millis(250))
        .await;
}

#[tokio::test]
async fn a_revoke_with_the_lease_id_ends_the_stream_with_released() {
    let app = TestApp::embedded().await;
    let mut stream = hold(&app, "mine", json!({"ttl_ms": 30_000})).await;
    let granted = stream.expect("granted").await;
    let id = granted["lease_id"].as_str().unwrap();
    assert_eq!(app.revoke("mine", id).await.0, 204);
    let lost = stream.expect("lost").await;
    assert_eq!(lost["reason"], "released", "{lost}");
    assert!(stream.next().await.is_none(), "the stream ends after lost");
}

#[tokio::test]
async fn an_observer_sees_an_election_change_hands_in_order() {
    let app = TestApp::embedded().await;
    let mut watcher = app.call("GET", "/elections/o/observe").stream().await;
    assert_eq!(watcher.expect_first("vacant").await, json!({"name": "o"}));
    let first = app
        .call("POST", "/elections/o")
        .json(&json!({"value": "a", "ttl_ms": 30_000}))
        .send()
        .await
        .json();
    let term = first["term"].as_u64().unwrap();
    assert_eq!(watcher.expect("elected").await["term"].as_u64(), Some(term));
    let id = first["lease_id"].as_str().unwrap();
    let path = format!("/elections/o/leases/{id}");
    let answer = app
        .call("PUT", &path)
        .json(&json!({"value": "b"}))
        .send()
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(
        watcher.expect("proclaimed").await,
        json!({"name": "o", "term": term, "value": "b"})
    );
    assert_eq!(app.call("DELETE", &path).send().await.status, 204);
    let next = watcher.expect("vacant").await;
    assert_eq!(next["name"], "o", "{next}");
}

/// Announcements between replicas are best effort: an observer that never hears of a new
/// term still learns of it. Two replicas over the same in-process masters hear nothing
/// from each other (those nodes announce nothing), as when every announcement is lost.
#[tokio::test(start_paused = true)]
async fn an_observer_of_a_vacant_election_learns_a_leader_it_never_heard_announced() {
    let nodes: Vec<Arc<MemoryNode>> = (0..3)
        .map(|i| Arc::new(MemoryNode::new(format!("m{i}"))))
        .collect();
    let a = TestApp::with_nodes(common::config(&[]), &nodes).await;
    let b = TestApp::with_nodes(common::config(&[]), &nodes).await;
    let mut watcher = b.call("GET", "/elections/quiet/observe").stream().await;
    assert_eq!(watcher.expect("vacant").await, json!({"name": "quiet"}));
    let elected = a
        .call("POST", "/elections/quiet")
        .json(&json!({"value": "a", "ttl_ms": 600_000}))
        .send()
        .await;
    assert_eq!(elected.status, 201, "{}", elected.text);
    let term = elected.json()["term"].as_u64();
    let seen = watcher.expect("elected").await;
    assert_eq!(seen["term"].as_u64(), term, "{seen}");
}

#[tokio::test]
async fn stopping_tells_holders_and_observers() {
    let app = TestApp::embedded().await;
    let mut held = hold(&app, "stop", json!({"ttl_ms": 30_000})).await;
    held.expect("granted").await;
    let mut watcher = app.call("GET", "/elections/stop/observe").stream().await;
    watcher.expect("vacant").await;
    app.stop().await;
    // Told how long it may still rely on the lease, which is not revoked (issue 31: a
    // validity once answered is kept).
    let closed = held.expect("closed").await;
    assert_eq!(closed["reason"], "shutting_down", "{closed}");
    assert!(closed["validity_ms"].as_u64().unwrap() > 20_000, "{closed}");
    assert!(held.next().await.is_none());
    assert_eq!(watcher.expect("closed").await["reason"], "shutting_down");
    assert!(watcher.next().await.is_none());
}

#[tokio::test]
async fn the_hold_operations_stream_without_an_accept_header() {
    let app = TestApp::embedded().await;
    let mut held = app
        .call("POST", "/locks/h/hold")
        .json(&json!({"ttl_ms": 30_000, "owner": "w"}))
        .send_stream()
        .await;
    let granted = held.expect_first("granted").await;
    assert_eq!(granted["owner"], "w");
    assert_eq!(app.inspect("h").await.1["held"], true);
    let mut leading = app
        .call("POST", "/elections/h/hold?value=me")
        .send_stream()
        .await;
    let elected = leading.expect_first("elected").await;
    assert_eq!(elected["value"], "me");
    assert!(elected["term"].as_u64().is_some(), "{elected}");
    drop(held);
    drop(leading);
    // Nothing to retry on a stream: a key is refused, before anything is held.
    for path in ["/locks/k/hold", "/elections/k/hold"] {
        let refused = app
            .call("POST", path)
            .header("Idempotency-Key", "k-1")
            .send()
            .await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.text);
        assert_eq!(refused.json()["error"], "invalid_request");
    }
    assert_eq!(app.inspect("k").await.1["held"], false);
    assert_eq!(app.get("/elections/k").await.1["vacant"], true);
}

/// Replicas over the same in-process masters.
async fn replicas() -> (TestApp, TestApp) {
    TestApp::replicas_in_process(common::config(&[])).await
}

async fn resume(app: &TestApp, name: &str, lease: &str, body: Value) -> EventStream {
    app.resume_hold(&format!("/locks/{name}"), lease, body)
        .stream()
        .await
}

#[tokio::test]
async fn a_stream_closed_by_its_replica_stopping_is_resumed_through_another() {
    let (a, b) = replicas().await;
    let mut held = hold(&a, "deploy", json!({"ttl_ms": 30_000})).await;
    let granted = held.expect("granted").await;
    let (lease, token) = (
        granted["lease_id"].as_str().unwrap(),
        &granted["fencing_token"],
    );
    a.stop().await;
    let closed = held.expect("closed").await;
    assert_eq!(closed["resume"], true, "{closed}");

    let mut resumed = resume(&b, "deploy", lease, json!({})).await;
    let body = resumed.expect_first("resumed").await;
    assert_eq!(&body["fencing_token"], token, "{body}");
    assert_eq!(body["lease_id"], lease, "{body}");
    let (status, _) = b.grant("deploy", json!({})).await;
    assert_eq!(status, 409, "still held through the resumed stream");

    // The resumed stream is a held stream: closing it revokes the lease.
    drop(resumed);
    b.streams_done().await;
    let (status, _) = b.grant("deploy", json!({})).await;
    assert_eq!(status, 201);
}

/// A holder that resumed its lease elsewhere while its first connection still looked open
/// to its first replica: that connection's end, seen later, must not revoke the lease the
/// new stream keeps (and promised a validity for).
#[tokio::test]
async fn an_old_stream_that_closes_after_a_resume_revokes_nothing() {
    let (a, b) = replicas().await;
    let mut old = hold(&a, "moved", json!({"ttl_ms": 30_000})).await;
    let lease = old.expect("granted").await["lease_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut resumed = resume(&b, "moved", &lease, json!({})).await;
    resumed.expect("resumed").await;
    drop(old);
    a.streams_done().await;
    let (status, body) = b.grant("moved", json!({})).await;
    assert_eq!(
        status, 409,
        "the old stream's end revoked the resumed lease: {body}"
    );

    // The newest stream keeps it: a second resume takes it over again, and the first
    // resumed stream's end leaves it too.
    let mut again = resume(&a, "moved", &lease, json!({})).await;
    again.expect("resumed").await;
    drop(resumed);
    b.streams_done().await;
    assert_eq!(b.grant("moved", json!({})).await.0, 409);
    drop(again);
    a.streams_done().await;
    assert_eq!(b.grant("moved", json!({})).await.0, 201);
}

#[tokio::test]
async fn a_resume_with_a_grace_keeps_the_lease_past_its_connection_and_no_longer() {
    let (a, b) = replicas().await;
    let (lease, _) = a.must_grant("blip", json!({"ttl_ms": 30_000})).await;
    let mut first = resume(&a, "blip", &lease, json!({"grace_ms": 400})).await;
    first.expect("resumed").await;
    b.granted_after_grace("blip", "blip", first, Duration::from_millis(400))
        .await;

    // Within its grace, a resume takes it over: the grace's end then revokes nothing.
    let (lease, _) = a.must_grant("blip2", json!({"ttl_ms": 3_000})).await;
    let mut first = resume(&a, "blip2", &lease, json!({"grace_ms": 300})).await;
    first.expect("resumed").await;
    drop(first);
    let mut second = resume(&b, "blip2", &lease, json!({})).await;
    second.expect("resumed").await;
    a.streams_done().await;
    assert_eq!(a.grant("blip2", json!({})).await.0, 409);
    second.expect("heartbeat").await;
}

#[tokio::test]
async fn a_resume_of_a_lease_that_is_gone_fails_and_bad_fields_are_refused() {
    let app = TestApp::embedded().await;
    let (lease, _) = app.must_grant("gone", json!({"ttl_ms": 30_000})).await;
    app.revoke("gone", &lease).await;
    let mut stream = resume(&app, "gone", &lease, json!({})).await;
    assert_eq!(
        stream.expect_first("failed").await["error"],
        "lease_not_found"
    );
    assert!(stream.next().await.is_none(), "the stream ends");

    let bad = resume(&app, "gone", &lease, json!({"grace_ms": 3_600_001})).await;
    assert_eq!(bad.status, 400);
    let bad = resume(&app, "gone", &lease, json!({"ttl_ms": 1000})).await;
    assert_eq!(bad.status, 400, "a resume keeps the lease's TTL");
    let bad = resume(&app, "gone", "not!a!lease", json!({})).await;
    assert_eq!(bad.status, 400);
}

/// A blip: the holder's connection drops (no `closed`), and with a grace the holder resumes
/// through another replica; without one, the drop revokes at once (what a crashed holder
/// needs for a fast hand-off).
#[tokio::test]
async fn a_held_stream_with_a_grace_survives_its_connection_for_a_resume() {
    let (a, b) = replicas().await;
    let mut held = hold(&a, "blip", json!({"ttl_ms": 30_000, "grace_ms": 1_500})).await;
    let granted = held.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap().to_owned();
    drop(held);
    let mut resumed = resume(&b, "blip", &lease, json!({})).await;
    let body = resumed.expect("resumed").await;
    assert_eq!(body["fencing_token"], granted["fencing_token"], "{body}");
    // The first stream's grace runs out meanwhile: it revokes nothing then.
    a.streams_done().await;
    assert_eq!(a.grant("blip", json!({})).await.0, 409);

    let mut plain = hold(&a, "crash", json!({"ttl_ms": 30_000})).await;
    let lease = plain.expect("granted").await["lease_id"]
        .as_str()
        .unwrap()
        .to_owned();
    drop(plain);
    a.streams_done().await;
    let mut late = resume(&b, "crash", &lease, json!({})).await;
    assert_eq!(late.expect("failed").await["error"], "lease_not_found");

    let bad = hold(&a, "plain", json!({"grace_ms": 3_600_001})).await;
    assert_eq!(bad.status, 400);
}

/// A resume displaces the lease's older stream while that one is still open: its next renew
/// finds another stream keeping the lease, and it ends with `closed` (`resumed`), revoking
/// nothing.
#[tokio::test]
async fn a_resume_displaces_the_older_stream_still_open() {
    let (a, b) = replicas().await;
    let mut old = hold(&a, "twice", json!({"ttl_ms": 300})).await;
    let lease = old.expect("granted").await["lease_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut resumed = resume(&b, "twice", &lease, json!({})).await;
    resumed.expect("resumed").await;
    old.displaced().await;
    resumed.expect("heartbeat").await;
    assert_eq!(a.grant("twice", json!({})).await.0, 409);
}

/// Under authentication, only the token that opened a held stream may resume it: a lease
/// id that leaked (a log line, a shared dashboard) does not let another client, or an
/// administrator, take the stream over; they are told `forbidden` and the lease stays its
/// opener's. A lease granted as JSON had no stream to open: its id is the capability, as
/// for a renew, and any token that may hold the name resumes it.
#[tokio::test]
async fn only_the_token_that_opened_a_held_stream_may_resume_it() {
    use redlockd::auth::{Role, new_token};
    let (opener, o) = new_token("ci-jobs", Role::Client, vec!["jobs:".into()]);
    let (other, t) = new_token("ci-other", Role::Client, vec!["jobs:".into()]);
    let (admin, a) = new_token("oncall", Role::Admin, vec![]);
    let file = tempfile::NamedTempFile::new().unwrap();
    common::write_tokens(file.path(), &[o, t, a]);
    let mut cfg = common::config(&[]);
    cfg.auth_file = Some(file.path().to_str().unwrap().to_owned());
    let (a, b) = TestApp::replicas_in_process(cfg).await;
    async fn resume_as(app: &TestApp, lease: &str, token: &str) -> EventStream {
        app.resume_hold("/locks/jobs:x", lease, json!({}))
            .bearer(token)
            .stream()
            .await
    }

    let mut held = a
        .call("POST", "/locks/jobs:x/hold")
        .bearer(&opener)
        .json(&json!({"ttl_ms": 1_500, "grace_ms": 20_000}))
        .stream()
        .await;
    let granted = held.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap().to_owned();
    for (token, who) in [(&other, "another client"), (&admin, "an administrator")] {
        let mut taken = resume_as(&b, &lease, token).await;
        let failed = taken.expect_first("failed").await;
        assert_eq!(failed["error"], "forbidden", "{who}: {failed}");
        assert!(taken.next().await.is_none(), "{who}'s stream ends");
    }
    // The opener's stream still keeps the lease (its next renew finds it its own, not
    // displaced), and its end (a blip, with a grace) leaves it for the opener to resume
    // through the other replica.
    held.expect("heartbeat").await;
    drop(held);
    let mut resumed = resume_as(&b, &lease, &opener).await;
    let body = resumed.expect("resumed").await;
    assert_eq!(body["fencing_token"], granted["fencing_token"], "{body}");
    let mut again = resume_as(&a, &lease, &other).await;
    assert_eq!(again.expect("failed").await["error"], "forbidden");
    resumed.expect("heartbeat").await;

    // A permit's stream is its opener's alike.
    let mut permit = a
        .call("POST", "/semaphores/jobs:s/hold")
        .bearer(&opener)
        .json(&json!({"limit": 2, "ttl_ms": 30_000}))
        .stream()
        .await;
    let id = permit.expect("granted").await["lease_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut taken = b
        .resume_hold("/semaphores/jobs:s", &id, json!({}))
        .bearer(&other)
        .stream()
        .await;
    assert_eq!(taken.expect("failed").await["error"], "forbidden");
    drop(permit);

    // A lease granted as JSON: any token that may hold the name resumes it, and from then
    // on that token alone.
    let (status, json) = common::call_as(&a, "POST", "/locks/jobs:y", Some(&opener)).await;
    assert_eq!(status, 201, "{json}");
    let lease = json["lease_id"].as_str().unwrap().to_owned();
    let path = format!("/locks/jobs:y/leases/{lease}/hold");
    let mut taken = b
        .call("POST", &path)
        .bearer(&other)
        .json(&json!({}))
        .stream()
        .await;
    taken.expect("resumed").await;
    let mut back = a
        .call("POST", &path)
        .bearer(&opener)
        .json(&json!({}))
        .stream()
        .await;
    assert_eq!(back.expect("failed").await["error"], "forbidden");
}
