//! Leases held while a connection lives (`Accept: text/event-stream` on a grant), over
//! HTTP, on real masters and two replicas: granted, heartbeats, handed over the moment the
//! client disconnects, `lost` when the quorum is lost or the replica shuts down.

use crate::common;

use std::time::{Duration, Instant};

use common::{EventStream, RedisMaster, TestApp, config, masters};
use serde_json::json;

async fn replicas(masters: &[RedisMaster], timeout_ms: u64) -> (TestApp, TestApp) {
    let mut cfg = config(masters);
    cfg.master_timeout_ms = timeout_ms;
    (TestApp::spawn(cfg.clone()).await, TestApp::spawn(cfg).await)
}

fn hold(app: &TestApp, name: &str, body: serde_json::Value) -> reqwest::RequestBuilder {
    app.http
        .post(app.url(&format!("/locks/{name}")))
        .json(&body)
}

#[tokio::test]
async fn a_held_lease_is_renewed_while_connected_and_handed_over_the_moment_the_client_leaves() {
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    let request = hold(&a, "held", json!({"ttl_ms": 600})).header("accept-encoding", "gzip");
    let mut stream = EventStream::open(request).await;
    assert_eq!(stream.status, 200);
    assert_eq!(
        stream.encoding, None,
        "events are sent as they happen, uncompressed"
    );
    let granted = stream.expect("granted").await;
    let token = granted["fencing_token"].as_u64().unwrap();
    // Renewed past its TTL, with the same token.
    for _ in 0..4 {
        let beat = stream.expect("heartbeat").await;
        assert_eq!(beat["fencing_token"].as_u64(), Some(token));
        assert_eq!(beat["lease_id"], granted["lease_id"]);
    }
    let (_, status) = b.inspect("held").await;
    assert_eq!(status["fencing_token"].as_u64(), Some(token), "{status}");

    // A grant waiting on the other replica gets it as soon as the stream closes.
    b.woken_by_drop("held", stream, token, Duration::from_millis(500))
        .await;
}

#[tokio::test]
async fn lost_arrives_within_the_ttl_when_a_majority_of_masters_stop() {
    let masters = masters(3);
    let (a, _b) = replicas(&masters, 100).await;
    let mut stream = EventStream::open(hold(&a, "fragile", json!({"ttl_ms": 1000}))).await;
    stream.expect("granted").await;
    masters[0].pause();
    masters[1].pause();
    let paused = Instant::now();
    let mut jeopardy = None;
    let lost = loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some((name, data))) if name == "lost" => break data,
            Ok(Some((name, _))) if name == "heartbeat" => {}
            Ok(Some((name, data))) if name == "jeopardy" && jeopardy.is_none() => {
                jeopardy = Some(data);
            }
            other => panic!("expected lost, got {other:?}"),
        }
    };
    let took = paused.elapsed();
    masters[0].resume();
    masters[1].resume();
    assert_eq!(lost["reason"], "quorum_lost", "{lost}");
    // Warned before the end, with less than a third of the TTL left.
    let jeopardy = jeopardy.expect("jeopardy came before lost");
    let left = jeopardy["validity_ms"].as_u64().expect("validity_ms");
    assert!(left <= 334, "{jeopardy}");
    assert!(took < Duration::from_millis(1000), "told after {took:?}");
    assert!(stream.next().await.is_none(), "the stream ends after lost");
}

/// Renews that stop getting through are told before the lease ends (`jeopardy`, once), and
/// a renew that gets through again is told too (`safe`, then the heartbeat), the stream
/// going on as before.
#[tokio::test]
async fn jeopardy_comes_before_the_end_and_safe_when_a_renew_gets_through() {
    let masters = masters(3);
    let (a, _b) = replicas(&masters, 100).await;
    let mut stream = EventStream::open(hold(&a, "shaky", json!({"ttl_ms": 1500}))).await;
    let granted = stream.expect("granted").await;
    masters[0].pause();
    masters[1].pause();
    let jeopardy = loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some((name, data))) if name == "jeopardy" => break data,
            Ok(Some((name, _))) if name == "heartbeat" => {}
            other => {
                masters[0].resume();
                masters[1].resume();
                panic!("expected jeopardy, got {other:?}");
            }
        }
    };
    masters[0].resume();
    masters[1].resume();
    let left = jeopardy["validity_ms"].as_u64().expect("validity_ms");
    assert!(left > 0 && left <= 500, "{jeopardy}");
    let safe = stream.expect("safe").await;
    assert!(
        safe["validity_ms"].as_u64().is_some_and(|v| v > left),
        "{safe}"
    );
    let beat = stream.expect("heartbeat").await;
    assert_eq!(beat["fencing_token"], granted["fencing_token"], "{beat}");
    // Held as before: the next renew is a plain heartbeat.
    assert_eq!(
        stream.expect("heartbeat").await["lease_id"],
        granted["lease_id"]
    );
}

/// A replica's shutdown keeps the promise of the validity it answered: a lease held by a
/// stream on it is not revoked (before, it was, and the other replica granted the name to
/// another client 60 ms later); the holder is told how long it may rely on it (`closed`,
/// with `validity_ms`) and may renew it by its lease id through another replica.
#[tokio::test]
async fn shutdown_tells_the_holder_how_long_it_holds_and_never_revokes_under_it() {
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    let mut stream = EventStream::open(hold(&a, "stop", json!({"ttl_ms": 30_000}))).await;
    let granted = stream.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap().to_owned();
    let metrics = a.text("/metrics").await;
    assert!(
        metrics.contains(r#"redlockd_streams_active{kind="hold"} 1"#),
        "{metrics}"
    );
    let stopping = tokio::spawn(a.stop());
    let closed = stream.expect("closed").await;
    assert_eq!(closed["reason"], "shutting_down", "{closed}");
    assert!(closed["validity_ms"].as_u64().unwrap() > 20_000, "{closed}");
    assert!(stream.next().await.is_none());
    stopping.await.unwrap();
    let (_, status) = b.inspect("stop").await;
    assert_eq!(status["held"], json!(true), "{status}");
    let (code, other) = b.grant("stop", json!({"ttl_ms": 1000})).await;
    assert_eq!(
        code, 409,
        "the name went to another while its validity ran: {other}"
    );
    let (code, renewed) = b.renew("stop", &lease, json!({})).await;
    assert_eq!(
        code, 200,
        "the holder renews it through the other replica: {renewed}"
    );
}

/// The same for a session held by a stream: the session is not ended (its holds stay), the
/// holder is told how long it may rely on it, and renews it through another replica.
#[tokio::test]
async fn shutdown_leaves_a_streamed_session_and_its_holds_to_their_holder() {
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    let mut stream = a
        .call("POST", "/sessions")
        .json(&json!({"ttl_ms": 30_000}))
        .stream()
        .await;
    let opened = stream.expect("opened").await;
    let session = opened["session_id"].as_str().unwrap().to_owned();
    let (code, lease) = a
        .send("POST", "/locks/stop-s", Some(json!({"session": session})))
        .await;
    assert_eq!(code, 201, "{lease}");
    let stopping = tokio::spawn(a.stop());
    let closed = stream.expect("closed").await;
    assert_eq!(closed["reason"], "shutting_down", "{closed}");
    assert!(closed["validity_ms"].as_u64().unwrap() > 20_000, "{closed}");
    stopping.await.unwrap();
    let (code, other) = b.grant("stop-s", json!({"ttl_ms": 1000})).await;
    assert_eq!(
        code, 409,
        "the name went to another while its validity ran: {other}"
    );
    let (code, renewed) = b.send("PUT", &format!("/sessions/{session}"), None).await;
    assert_eq!(code, 200, "{renewed}");
    assert_eq!(renewed["kept"], json!([lease["lease_id"]]), "{renewed}");
}

#[tokio::test]
async fn an_observers_stream_is_told_when_its_replica_shuts_down() {
    let masters = masters(3);
    let (a, _b) = replicas(&masters, 200).await;
    let mut stream = EventStream::open(a.http.get(a.url("/elections/stop/observe"))).await;
    stream.expect("vacant").await;
    let stopping = tokio::spawn(a.stop());
    let closed = stream.expect("closed").await;
    assert_eq!(closed["reason"], "shutting_down", "{closed}");
    assert!(
        stream.next().await.is_none(),
        "the stream ends after closed"
    );
    stopping.await.unwrap();
}

/// A resume on real masters (renew.lua names the stream that keeps the lease, release.lua
/// heeds it): the first stream's end, after its holder resumed through the other replica,
/// revokes nothing; the resumed stream's end revokes the lease. For a lock and an election.
#[tokio::test]
async fn a_resume_through_another_replica_keeps_the_lease_from_the_old_streams_end() {
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    for (route, body, first) in [
        ("/locks/moved", json!({"ttl_ms": 30_000}), "granted"),
        (
            "/elections/moved",
            json!({"ttl_ms": 30_000, "value": "a"}),
            "elected",
        ),
    ] {
        let mut old = a.call("POST", route).json(&body).stream().await;
        let granted = old.expect(first).await;
        let lease = granted["lease_id"].as_str().unwrap().to_owned();
        let resume = async |app: &TestApp| app.resume_hold(route, &lease, json!({})).stream().await;
        let mut resumed = resume(&b).await;
        let body = resumed.expect("resumed").await;
        assert_eq!(body["fencing_token"], granted["fencing_token"], "{body}");
        drop(old);
        a.streams_done().await;
        let (code, other) = b.send("POST", route, Some(json!({"ttl_ms": 1000}))).await;
        assert_eq!(
            code, 409,
            "{route}: the old stream's end revoked it: {other}"
        );
        drop(resumed);
        b.streams_done().await;
        let (code, other) = b.send("POST", route, Some(json!({"ttl_ms": 1000}))).await;
        assert_eq!(
            code, 201,
            "{route}: the resumed stream's end revokes it: {other}"
        );
        let lease = other["lease_id"].as_str().unwrap();
        let path = format!("{route}/leases/{lease}");
        b.deleted(&path).await;
    }
}

/// A rolling deploy: the stopping replica tells its stream `closed` with `resume` and keeps
/// the lease renewed past its TTL, so a holder that takes longer than the validity to
/// reconnect still resumes it (same token) through the other replica; the resume then lets
/// the stopping replica finish well before its drain deadline (10 s).
#[tokio::test]
async fn a_stopping_replica_keeps_its_streams_leases_until_they_are_resumed() {
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    let ttl = Duration::from_millis(600);
    let mut stream = EventStream::open(hold(&a, "roll", json!({"ttl_ms": 600}))).await;
    let granted = stream.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap().to_owned();
    let stopping = tokio::spawn(a.stop());
    let closed = stream.expect("closed").await;
    assert_eq!(closed["resume"], true, "{closed}");
    // Longer than the lease would have lived on its last renew.
    tokio::time::sleep(ttl * 2).await;
    let mut resumed = b
        .resume_hold("/locks/roll", &lease, json!({}))
        .stream()
        .await;
    let body = resumed.expect("resumed").await;
    assert_eq!(body["fencing_token"], granted["fencing_token"], "{body}");
    common::joined_within(
        stopping,
        Duration::from_secs(5),
        "the stopping replica ends once its stream was resumed",
    )
    .await;
    resumed.expect("heartbeat").await;
    assert_eq!(b.grant("roll", json!({"ttl_ms": 1000})).await.0, 409);
}

/// The rolling deploy of issue 36: 50 held streams on one replica, which stops (SIGTERM's
/// path, as a deploy restarts it) while each stream's client fails over to the other and
/// resumes there: every lease resumed with its
/// original fencing token, none lost, and a client contending for the names through the
/// other replica granted none of them meanwhile.
#[tokio::test]
async fn fifty_streams_survive_their_replicas_stop_by_resuming_elsewhere() {
    const STREAMS: usize = 50;
    let masters = masters(3);
    let (a, b) = replicas(&masters, 200).await;
    let mut held = Vec::new();
    for i in 0..STREAMS {
        let name = format!("roll-{i}");
        let mut stream = EventStream::open(hold(&a, &name, json!({"ttl_ms": 2000}))).await;
        let granted = stream.expect("granted").await;
        held.push((name, granted, stream));
    }
    // A contender through the other replica, all along: it must never be granted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let contender = {
        let (b, stop) = (b.handle(), stop.clone());
        let names: Vec<String> = held.iter().map(|(n, _, _)| n.clone()).collect();
        tokio::spawn(async move {
            let mut granted = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for name in &names {
                    let (code, body) = b.grant(name, json!({"ttl_ms": 1000})).await;
                    if code == 201 {
                        granted.push((name.clone(), body));
                    }
                }
            }
            granted
        })
    };
    let stopping = tokio::spawn(a.stop());
    let resumes = held.into_iter().map(|(name, granted, mut stream)| {
        let b = b.handle();
        async move {
            let closed = stream.expect("closed").await;
            assert_eq!(closed["resume"], true, "{name}: {closed}");
            let lease = granted["lease_id"].as_str().unwrap();
            let mut resumed = b
                .resume_hold(&format!("/locks/{name}"), lease, json!({}))
                .stream()
                .await;
            let body = resumed.expect("resumed").await;
            assert_eq!(
                body["fencing_token"], granted["fencing_token"],
                "{name}: {body}"
            );
            resumed
        }
    });
    let mut resumed = futures::future::join_all(resumes).await;
    common::joined_within(
        stopping,
        Duration::from_secs(8),
        "the stopping replica ends once its streams were resumed",
    )
    .await;
    // Each resumed stream renews on: one heartbeat each, past the old leases' TTL.
    for stream in &mut resumed {
        stream.expect("heartbeat").await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let granted = contender.await.unwrap();
    assert!(granted.is_empty(), "granted meanwhile: {granted:?}");
}

/// Under authentication the masters themselves refuse a resume by a token other than the
/// stream's opener (renew.lua compares the openers in the streams' names): the other
/// token's stream fails `forbidden`, the opener's stream still keeps the lease, and its end
/// still revokes it at once. For a lock and an election.
#[tokio::test]
async fn a_resume_by_another_token_is_refused_by_the_masters() {
    use redlockd::auth::{Role, new_token};
    let masters = masters(3);
    let (opener, o) = new_token("ci-jobs", Role::Client, vec!["jobs:".into()]);
    let (other, t) = new_token("ci-other", Role::Client, vec!["jobs:".into()]);
    let file = tempfile::NamedTempFile::new().unwrap();
    common::write_tokens(file.path(), &[o, t]);
    let mut cfg = config(&masters);
    cfg.auth_file = Some(file.path().to_str().unwrap().to_owned());
    let (a, b) = (TestApp::spawn(cfg.clone()).await, TestApp::spawn(cfg).await);
    for (route, body, first) in [
        ("/locks/jobs:m", json!({"ttl_ms": 30_000}), "granted"),
        (
            "/elections/jobs:m",
            json!({"ttl_ms": 30_000, "value": "a"}),
            "elected",
        ),
    ] {
        let request = a
            .http
            .post(a.url(&format!("{route}/hold")))
            .bearer_auth(&opener)
            .json(&body);
        let mut held = EventStream::open(request).await;
        let granted = held.expect(first).await;
        let lease = granted["lease_id"].as_str().unwrap().to_owned();
        let mut taken = b
            .resume_hold(route, &lease, json!({}))
            .bearer(&other)
            .stream()
            .await;
        let failed = taken.expect("failed").await;
        assert_eq!(failed["error"], "forbidden", "{route}: {failed}");
        drop(held);
        a.streams_done().await;
        let granted = b
            .http
            .post(b.url(route))
            .bearer_auth(&other)
            .json(&json!({"ttl_ms": 1000}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            granted.status(),
            201,
            "{route}: the opener's stream no longer kept the lease after another token's resume"
        );
    }
}
