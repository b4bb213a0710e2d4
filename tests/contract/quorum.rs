//! Quorum loss through the router, in process: three memory nodes stand in for the
//! masters, two of them fail, and each route answers as the contract says (503
//! `quorum_unavailable` naming the masters, readiness down, nothing left held, a held
//! stream told `quorum_lost`), under paused time. Against real masters, killed and paused
//! for real, the same promises are `masters::faults`' to keep.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestApp, config};
use redlockd::store::memory::{Fault, MemoryNode};
use serde_json::{Value, json};

/// An app over three memory nodes, their first probe done.
async fn three() -> (TestApp, Vec<Arc<MemoryNode>>) {
    TestApp::over_three_nodes(config(&[])).await
}

fn fail(nodes: &[Arc<MemoryNode>], fault: Fault) {
    for node in &nodes[1..] {
        node.set_fault(fault);
    }
}

/// Heal every node and wait until the app grants again (a master whose connection failed
/// votes again once a probe has checked it).
async fn heal(app: &TestApp, nodes: &[Arc<MemoryNode>]) {
    for node in nodes {
        node.set_fault(Fault::None);
    }
    app.until_ready().await;
}

/// The masters a 503 body names, as `address kind`.
fn named(body: &Value) -> Vec<String> {
    body["masters"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|m| format!("{} {}", m["address"].as_str().unwrap_or("?"), m["kind"]))
        .collect()
}

fn unavailable(status: u16, body: &Value) {
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "quorum_unavailable", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_without_a_majority_is_a_503_naming_the_masters_and_leaves_nothing_held() {
    let (app, nodes) = three().await;
    fail(&nodes, Fault::Down);
    let (status, body) = app.grant("q", json!({"ttl_ms": 10_000})).await;
    unavailable(status, &body);
    let masters = named(&body);
    assert!(
        masters.iter().any(|m| m.starts_with("m1 "))
            && masters.iter().any(|m| m.starts_with("m2 "))
            && !masters.iter().any(|m| m.starts_with("m0 ")),
        "{body}"
    );
    // The one master that granted was undone: once the others are back, the name is free.
    heal(&app, &nodes).await;
    let (status, seen) = app.get("/locks/q").await;
    assert_eq!((status, &seen["held"]), (200, &json!(false)), "{seen}");
    assert_eq!(app.grant("q", json!({})).await.0, 201);
}

#[tokio::test(start_paused = true)]
async fn readiness_is_503_naming_the_masters_down_and_200_once_they_are_back() {
    let (app, nodes) = three().await;
    fail(&nodes, Fault::Down);
    // The monitor finds them down at its next probe.
    let mut answer = app.get("/readyz").await;
    for _ in 0..50 {
        if answer.0 == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = app.get("/readyz").await;
    }
    let (status, body) = answer;
    assert_eq!(status, 503, "{body}");
    let down: Vec<&str> = body["masters"]
        .as_array()
        .expect("masters")
        .iter()
        .filter(|m| m["up"] == false && m["voting"] == false)
        .filter_map(|m| m["address"].as_str())
        .collect();
    assert_eq!(down, ["m1", "m2"], "{body}");
    heal(&app, &nodes).await;
}

#[tokio::test(start_paused = true)]
async fn a_renew_without_a_majority_is_a_503_and_the_lease_holds_on_once_it_is_back() {
    let (app, nodes) = three().await;
    let (status, lease) = app.grant("r", json!({"ttl_ms": 10_000})).await;
    assert_eq!(status, 201, "{lease}");
    let id = lease["lease_id"].as_str().expect("lease id");
    fail(&nodes, Fault::Hang);
    let (status, body) = app.renew("r", id, json!({})).await;
    unavailable(status, &body);
    heal(&app, &nodes).await;
    let (status, renewed) = app.renew("r", id, json!({})).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["fencing_token"], lease["fencing_token"]);
}

#[tokio::test(start_paused = true)]
async fn a_revoke_without_a_majority_is_a_503_and_is_repeated_once_the_masters_are_back() {
    let (app, nodes) = three().await;
    let (_, lease) = app.grant("v", json!({"ttl_ms": 10_000})).await;
    let id = lease["lease_id"].as_str().expect("lease id");
    let path = format!("/locks/v/leases/{id}");
    fail(&nodes, Fault::Down);
    // The holder cannot be told it let go: a majority did not confirm it.
    let (status, body) = app.send("DELETE", &path, None).await;
    unavailable(status, &body);
    // The release is owed to the masters that missed it, and repeated once they are back:
    // the name is free without waiting for the lease's TTL.
    heal(&app, &nodes).await;
    let mut granted = app.grant("v", json!({})).await;
    for _ in 0..50 {
        if granted.0 == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        granted = app.grant("v", json!({})).await;
    }
    assert_eq!(granted.0, 201, "{}", granted.1);
    assert_eq!(app.get(&path).await.0, 404);
}

#[tokio::test(start_paused = true)]
async fn inspect_list_and_fences_without_a_majority_are_503_never_a_guess() {
    let (app, nodes) = three().await;
    let (_, lease) = app.grant("i", json!({"ttl_ms": 10_000})).await;
    let token = lease["fencing_token"].as_u64().expect("token");
    fail(&nodes, Fault::Down);
    for path in [
        "/locks/i".to_owned(),
        "/locks?prefix=i".to_owned(),
        format!("/locks/i/fences/{token}"),
    ] {
        let (status, body) = app.get(&path).await;
        unavailable(status, &body);
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_stream_is_told_quorum_lost_before_its_validity_ends() {
    let (app, nodes) = three().await;
    let mut stream = app
        .call("POST", "/locks/s/hold")
        .json(&json!({"ttl_ms": 3_000}))
        .stream()
        .await;
    assert_eq!(stream.status, 200);
    let (event, granted) = stream.next().await.expect("granted");
    assert_eq!(event, "granted", "{granted}");
    let validity = Duration::from_millis(granted["validity_ms"].as_u64().expect("validity"));
    let started = tokio::time::Instant::now();
    fail(&nodes, Fault::Down);
    let mut warned = None;
    loop {
        let (event, data) = stream
            .next()
            .await
            .expect("an event before the stream ends");
        if event == "heartbeat" {
            continue;
        }
        if event == "jeopardy" && warned.is_none() {
            warned = Some(data);
            continue;
        }
        assert_eq!(event, "lost", "{data}");
        assert_eq!(data["reason"], "quorum_lost", "{data}");
        break;
    }
    // Warned first, once, with less than a third of the TTL left.
    let warned = warned.expect("jeopardy before lost");
    assert!(
        warned["validity_ms"].as_u64().is_some_and(|v| v <= 1_000),
        "{warned}"
    );
    assert!(
        started.elapsed() <= validity,
        "told {:?} after the faults, validity {validity:?}",
        started.elapsed()
    );
}

/// A session held by a stream is warned as a held lease is: `jeopardy` once its renews stop
/// getting through with less than a third of its TTL left, then `lost`.
#[tokio::test(start_paused = true)]
async fn a_streamed_session_is_warned_before_it_is_lost() {
    let (app, nodes) = three().await;
    let mut stream = app.call("POST", "/sessions?ttl_ms=3000").stream().await;
    assert_eq!(stream.status, 200);
    let (event, opened) = stream.next().await.expect("opened");
    assert_eq!(event, "opened", "{opened}");
    fail(&nodes, Fault::Down);
    let mut told = Vec::new();
    while let Some((event, data)) = stream.next().await {
        if event != "heartbeat" {
            told.push((event, data));
        }
    }
    let names: Vec<&str> = told.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["jeopardy", "lost"], "{told:?}");
    assert!(
        told[0].1["validity_ms"]
            .as_u64()
            .is_some_and(|v| v <= 1_000),
        "{told:?}"
    );
}

/// A 503 names the masters that failed, and how; a healthy master whose answer the step
/// did not need to wait for (the majority was already out of reach) did not fail, and is
/// not named (it was named `no_answer`, which read as one more master down).
#[tokio::test(start_paused = true)]
async fn a_503_names_only_the_masters_that_failed_not_one_it_did_not_wait_for() {
    let (app, nodes) = three().await;
    fail(&nodes, Fault::Down);
    nodes[0].set_fault(Fault::Slow(Duration::from_millis(30)));
    let (status, body) = app.grant("q-slow", json!({"ttl_ms": 10_000})).await;
    unavailable(status, &body);
    let mut masters = named(&body);
    masters.sort();
    assert_eq!(masters.len(), 2, "{body}");
    assert!(
        masters[0].starts_with("m1 ") && masters[1].starts_with("m2 "),
        "{body}"
    );
    assert!(!body.to_string().contains("no_answer"), "{body}");
}

/// An app over three memory nodes whose third lost its data and sits out a quarantine: a
/// hold ("kept-out") is on it and the first only, so the quarantine waits for it.
async fn one_quarantined() -> (TestApp, Vec<Arc<MemoryNode>>) {
    let (app, nodes) = three().await;
    nodes[1].set_fault(Fault::Down);
    let (status, body) = app.grant("kept-out", json!({"ttl_ms": 60_000})).await;
    assert_eq!(status, 201, "{body}");
    heal(&app, &nodes).await;
    common::wait_for(
        "the second master to vote",
        Duration::from_secs(30),
        async || {
            let (_, ready) = app.get("/readyz").await;
            (ready["masters"][1]["voting"] == true).then_some(())
        },
    )
    .await;
    nodes[2].restart_empty();
    common::wait_for(
        "the third master quarantined",
        Duration::from_secs(30),
        async || {
            let (_, ready) = app.get("/readyz").await;
            ready["masters"][2]["quarantined_until"].as_str().map(drop)
        },
    )
    .await;
    (app, nodes)
}

#[tokio::test(start_paused = true)]
async fn with_a_master_quarantined_what_a_majority_denies_is_404() {
    let (app, nodes) = one_quarantined().await;
    // The quarantined master refuses at once; the others' answers come a moment later, as
    // a real master's do over the wire.
    for node in &nodes[..2] {
        node.set_fault(Fault::SlowReply(Duration::from_millis(5)));
    }
    common::scenarios::what_a_majority_denies_is_404(&app).await;
    // And a renew of a lease that expired.
    let (id, _) = app.must_grant("e", json!({"ttl_ms": 1000})).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let (status, body) = app.renew("e", &id, json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("lease_not_found")),
        "an expired lease: {body}"
    );
}
