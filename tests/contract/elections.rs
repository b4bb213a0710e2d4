//! The elections table of the contract, in process over the embedded store: campaign,
//! leader, proclaim, resign and depose on one replica, their refusals, and bad input.
//! Candidates and observers on two replicas stay in `masters::elections`.

use crate::common;

use common::TestApp;
use serde_json::{Value, json};

#[tokio::test]
async fn campaign_leader_proclaim_and_resign_on_one_replica() {
    let app = TestApp::embedded().await;
    let (status, vacant) = app.send("GET", "/elections/e", None).await;
    assert_eq!((status, &vacant["vacant"]), (200, &json!(true)), "{vacant}");
    let body = json!({"value": "10.0.0.7:9000", "ttl_ms": 5000});
    let (status, lease) = app.send("POST", "/elections/e", Some(body)).await;
    assert_eq!(status, 201, "{lease}");
    let (term, id) = (lease["term"].as_u64().unwrap(), lease["lease_id"].clone());
    assert_eq!(lease["value"], "10.0.0.7:9000");
    assert!(
        lease.get("fencing_token").is_none(),
        "an election says term"
    );

    let (status, leader) = app.send("GET", "/elections/e", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&leader["vacant"], leader["term"].as_u64(), &leader["value"]),
        (&json!(false), Some(term), &json!("10.0.0.7:9000"))
    );
    let (status, refused) = app.send("POST", "/elections/e", Some(json!({}))).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_held"))
    );
    assert_eq!(refused["message"], "another candidate leads this election");

    let lease_path = format!("/elections/e/leases/{}", id.as_str().unwrap());
    let (status, proclaimed) = app
        .send("PUT", &lease_path, Some(json!({"value": "10.0.0.8:9000"})))
        .await;
    assert_eq!(status, 200, "{proclaimed}");
    assert_eq!(
        (proclaimed["term"].as_u64(), &proclaimed["value"]),
        (Some(term), &json!("10.0.0.8:9000"))
    );
    app.deleted(&lease_path).await;
    assert_eq!(app.send("DELETE", &lease_path, None).await.0, 404);
    assert_eq!(
        app.send("GET", "/elections/e", None).await.1["vacant"],
        true
    );
    let (status, next) = app.send("POST", "/elections/e", Some(json!({}))).await;
    assert_eq!(status, 201);
    assert!(next["term"].as_u64().unwrap() > term, "terms rise");
}

#[tokio::test]
async fn a_waiting_candidate_is_elected_the_moment_the_leader_resigns() {
    let app = TestApp::embedded().await;
    let (_, leader) = app
        .send("POST", "/elections/w", Some(json!({"value": "a"})))
        .await;
    let candidate = {
        let app = app.handle();
        tokio::spawn(async move {
            let body = json!({"value": "b", "wait_ms": 10_000});
            app.send("POST", "/elections/w", Some(body)).await
        })
    };
    app.wait_for_contention("w", 1).await;
    let id = leader["lease_id"].as_str().unwrap();
    let path = format!("/elections/w/leases/{id}");
    app.deleted(&path).await;
    let (status, next) =
        common::joined(candidate, "elected at once, not at the end of its wait").await;
    assert_eq!(status, 201, "{next}");
    assert_eq!(next["value"], "b");
    assert!(next["term"].as_u64() > leader["term"].as_u64());
}

#[tokio::test]
async fn bad_election_input_is_a_clear_400() {
    let app = TestApp::embedded().await;
    let long = "v".repeat(257);
    let cases: Vec<(&str, String, Option<Value>)> = vec![
        ("POST", "/elections/a%20b".into(), None),
        ("GET", "/elections/a%2Fb".into(), None),
        ("GET", "/elections/a*/observe".into(), None),
        ("POST", "/elections/ok".into(), Some(json!({"value": long}))),
        ("POST", "/elections/ok".into(), Some(json!({"ttl_ms": 99}))),
        (
            "POST",
            "/elections/ok".into(),
            Some(json!({"wait_ms": 60_001})),
        ),
        ("POST", "/elections/ok".into(), Some(json!({"owner": "x"}))),
        ("PUT", "/elections/ok/leases/not%20an%20id".into(), None),
        ("DELETE", "/elections/ok/leases/not%20an%20id".into(), None),
        (
            "DELETE",
            "/elections/a%20b/leases/AAAAAAAAAAAAAAAAAAAAAA".into(),
            None,
        ),
    ];
    for (method, path, body) in cases {
        let (status, err) = app.send(method, &path, body.clone()).await;
        assert_eq!(status, 400, "{method} {path} {body:?}: {err}");
        assert_eq!(err["error"], "invalid_request", "{err}");
    }
    assert_eq!(
        app.send("GET", "/elections/ok", None).await.1["vacant"],
        true,
        "nothing was elected by any of it"
    );
}

#[tokio::test]
async fn a_term_is_current_while_its_leader_leads() {
    let app = TestApp::embedded().await;
    let body = json!({"value": "a", "ttl_ms": 5000});
    let (status, lease) = app.send("POST", "/elections/t", Some(body)).await;
    assert_eq!(status, 201, "{lease}");
    let (term, id) = (
        lease["term"].as_u64().unwrap(),
        lease["lease_id"].as_str().unwrap().to_owned(),
    );
    let (status, now) = app
        .send("GET", &format!("/elections/t/fences/{term}"), None)
        .await;
    assert_eq!(status, 200, "{now}");
    assert_eq!(
        now,
        json!({"name": "t", "fencing_token": term, "current": true})
    );
    // A lock of the same name is another thing: its token space says nothing of the term.
    let (_, lock) = app
        .send("GET", &format!("/locks/t/fences/{term}"), None)
        .await;
    assert_eq!(lock["current"], false);
    app.deleted(&format!("/elections/t/leases/{id}")).await;
    let (_, after) = app
        .send("GET", &format!("/elections/t/fences/{term}"), None)
        .await;
    assert_eq!(after["current"], false, "a resigned term is over");
}
