//! Leader election over HTTP on real masters and two replicas: candidates campaign as
//! held streams, the leader's end (disconnect, resign, crash) elects the next with a
//! higher term, observers on either replica see every change in order, and an election
//! never collides with a lock of the same name.

use crate::common;

use std::time::{Duration, Instant};

use common::{EventStream, TestApp};
use serde_json::{Value, json};

fn campaign(app: &TestApp, name: &str, body: Value) -> reqwest::RequestBuilder {
    app.http
        .post(app.url(&format!("/elections/{name}")))
        .json(&body)
}

fn observe(app: &TestApp, name: &str) -> reqwest::RequestBuilder {
    app.http.get(app.url(&format!("/elections/{name}/observe")))
}

/// POST `path` with `body`; the status and the JSON answer.
async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let resp = app
        .http
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn four_candidates_on_two_replicas_hand_over_with_rising_terms_and_observers_see_it_in_order()
{
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let mut watcher = EventStream::open(observe(&b, "leader")).await;
    assert_eq!(watcher.expect("vacant").await, json!({"name": "leader"}));

    // Each candidate's stream forwards its events here, tagged with the candidate.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for (i, app) in [&a, &b, &a, &b].into_iter().enumerate() {
        let body = json!({"value": format!("candidate-{i}"), "ttl_ms": 1000, "wait_ms": 30_000});
        let mut stream = EventStream::open(campaign(app, "leader", body)).await;
        let tx = tx.clone();
        candidates.push(tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let _ = tx.send((i, event, Instant::now()));
            }
        }));
    }
    let mut terms = Vec::new();
    let mut takeovers = Vec::new();
    let mut gone_at = None;
    while terms.len() < 4 {
        let (i, (event, data), at) =
            common::within(Duration::from_secs(10), rx.recv(), "a candidate's event")
                .await
                .unwrap();
        match event.as_str() {
            "queued" | "heartbeat" => continue,
            "elected" => {}
            other => panic!("candidate {i}: unexpected {other}: {data}"),
        }
        let term = data["term"].as_u64().unwrap();
        assert_eq!(data["value"], format!("candidate-{i}"));
        if let Some(gone) = gone_at.take() {
            takeovers.push(at.duration_since(gone));
        }
        // The observer on the other replica says the same, after at most a vacancy.
        let seen = loop {
            let (event, data) = watcher.next().await.expect("observer event");
            match event.as_str() {
                "vacant" => continue,
                "elected" => break data,
                other => panic!("observer: unexpected {other}: {data}"),
            }
        };
        assert_eq!(seen["term"].as_u64(), Some(term), "{seen}");
        terms.push(term);
        // Across a few renews, nobody else is elected while it leads.
        let settle = Instant::now() + Duration::from_millis(400);
        while let Ok(Some((j, (event, _), _))) =
            tokio::time::timeout_at(settle.into(), rx.recv()).await
        {
            assert_ne!(
                event, "elected",
                "candidate {j} elected while candidate {i} leads"
            );
        }
        // The leader's connection dies: the next leads at once, not at the TTL.
        candidates[i].abort();
        gone_at = Some(Instant::now());
    }
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms rise: {terms:?}"
    );
    for took in &takeovers {
        assert!(*took < Duration::from_millis(500), "takeover took {took:?}");
    }
    eprintln!("takeover after the leader's connection closed: {takeovers:?}");
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_within_its_ttl_and_a_resign_at_once() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    // A leader that stops renewing (its process died): a plain campaign, never renewed.
    let (status, crashed) = post(
        &a,
        "/elections/crash",
        json!({"value": "old", "ttl_ms": 1000}),
    )
    .await;
    assert_eq!(status, 201, "{crashed}");
    let crashed_at = Instant::now();
    let body = json!({"value": "new", "ttl_ms": 30_000, "wait_ms": 10_000});
    let (status, next) = post(&b, "/elections/crash", body).await;
    let took = crashed_at.elapsed();
    assert_eq!(status, 201, "{next}");
    assert!(next["term"].as_u64() > crashed["term"].as_u64());
    assert!(
        took < Duration::from_millis(1200),
        "took {took:?} after a 1 s TTL"
    );
    eprintln!("takeover after a crash (TTL 1 s): {took:?}");

    // A graceful resign hands over at once, to a candidate waiting on the other replica.
    let waiting = {
        let (app_url, http) = (a.url("/elections/crash"), a.http.clone());
        tokio::spawn(async move {
            let body = json!({"value": "third", "wait_ms": 10_000});
            let resp = http.post(app_url).json(&body).send().await.unwrap();
            (
                resp.status().as_u16(),
                resp.json::<Value>().await.unwrap(),
                Instant::now(),
            )
        })
    };
    a.wait_for_contention("crash", 1).await;
    let id = next["lease_id"].as_str().unwrap();
    let resigned = Instant::now();
    let resp = b
        .http
        .delete(b.url(&format!("/elections/crash/leases/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let (status, third, at) = waiting.await.unwrap();
    assert_eq!(status, 201, "{third}");
    assert!(third["term"].as_u64() > next["term"].as_u64());
    let took = at - resigned;
    assert!(took < Duration::from_millis(500), "took {took:?}");
    eprintln!("takeover after a resign: {took:?}");
}

#[tokio::test]
async fn proclaim_keeps_the_term_and_reaches_observers_on_the_other_replica() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (status, lease) = post(&a, "/elections/p", json!({"value": "v1", "ttl_ms": 30_000})).await;
    assert_eq!(status, 201);
    let id = lease["lease_id"].as_str().unwrap();
    let term = lease["term"].as_u64().unwrap();
    let mut watcher = EventStream::open(observe(&b, "p")).await;
    assert_eq!(watcher.expect("elected").await["value"], "v1");
    let resp = a
        .http
        .put(a.url(&format!("/elections/p/leases/{id}")))
        .json(&json!({"value": "v2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let renewed: Value = resp.json().await.unwrap();
    assert_eq!(
        (renewed["term"].as_u64(), renewed["value"].as_str()),
        (Some(term), Some("v2"))
    );
    let told = watcher.expect("proclaimed").await;
    assert_eq!(told, json!({"name": "p", "term": term, "value": "v2"}));
    let (_, now) = b.get("/elections/p").await;
    assert_eq!(now["value"], "v2");

    // The election and a lock of the same name are different things.
    let (lock, _) = a.must_grant("p", json!({})).await;
    assert!(!lock.is_empty());
    let (_, still) = b.get("/elections/p").await;
    assert_eq!(still["term"].as_u64(), Some(term));
}
