//! Dapr's distributed lock API, in process: the rules Dapr's own lock conformance cases
//! pin (a lock is not reentrant, an unlock names its owner, a lock is free again once it
//! expires), the name a lock takes, Dapr's error bodies, Dapr's token header, and quorum
//! loss. The real JavaScript SDK runs against the binary in `clients/compat/dapr`.

use crate::common;

use std::time::Duration;

use common::{TestApp, config, tokens};
use redlockd::store::memory::Fault;
use serde_json::{Value, json};

async fn lock(app: &TestApp, store: &str, body: Value) -> (u16, Value) {
    app.send("POST", &format!("/v1.0-alpha1/lock/{store}"), Some(body))
        .await
}

async fn unlock(app: &TestApp, store: &str, body: Value) -> (u16, Value) {
    app.send("POST", &format!("/v1.0-alpha1/unlock/{store}"), Some(body))
        .await
}

/// Whether `owner` takes `resource` in the store `s` for `secs`.
async fn took(app: &TestApp, resource: &str, owner: &str, secs: i64) -> bool {
    let body = json!({"resourceId": resource, "lockOwner": owner, "expiryInSeconds": secs});
    let (status, answer) = lock(app, "s", body).await;
    assert_eq!(status, 200, "{answer}");
    answer["success"].as_bool().expect("success")
}

/// The status an unlock of `resource` by `owner` answers.
async fn unlocked(app: &TestApp, resource: &str, owner: &str) -> u64 {
    let body = json!({"resourceId": resource, "lockOwner": owner});
    let (status, answer) = unlock(app, "s", body).await;
    assert_eq!(status, 200, "{answer}");
    answer["status"].as_u64().expect("status")
}

fn dapr_error(status: u16, body: &Value, want: u16, code: &str) {
    assert_eq!(
        (status, body["errorCode"].as_str()),
        (want, Some(code)),
        "{body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lock_is_not_reentrant_an_unlock_names_its_owner_and_an_expired_lock_is_free() {
    let app = TestApp::in_process(config(&[])).await;
    assert!(took(&app, "r", "a", 10).await);
    // Not reentrant: its own owner is refused as anyone else is.
    assert!(!took(&app, "r", "a", 10).await);
    assert!(!took(&app, "r", "b", 10).await);
    // Refused locks count as refused grants do.
    let metrics = app.text("/metrics").await;
    assert!(
        metrics
            .contains(r#"redlockd_requests_total{kind="lock",op="grant",outcome="lock_held"} 2"#),
        "{metrics}"
    );
    // Another owner's unlock leaves it held; an unlock of a lock nobody holds says so.
    assert_eq!(unlocked(&app, "r", "b").await, 2);
    assert_eq!(app.inspect("s:r").await.1["held"], true);
    assert_eq!(unlocked(&app, "other", "a").await, 1);
    assert_eq!(unlocked(&app, "r", "a").await, 0);
    assert_eq!(unlocked(&app, "r", "a").await, 1);
    assert!(took(&app, "r", "b", 1).await);
    // Held for its whole expiry, and free once it has passed.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!took(&app, "r", "a", 10).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(took(&app, "r", "a", 10).await);
}

#[tokio::test]
async fn a_stores_locks_are_the_names_store_colon_resource_that_other_clients_share() {
    let app = TestApp::in_process(config(&[])).await;
    assert!(took(&app, "job-7", "a", 30).await);
    let (status, seen) = app.inspect("s:job-7").await;
    assert_eq!((status, &seen["held"]), (200, &json!(true)), "{seen}");
    // The holder's identity is a capability: never shown.
    assert!(seen.get("owner").is_none(), "{seen}");
    // A lease granted through the lock API holds the same name against Dapr's callers, who
    // cannot unlock it, whatever owner they name...
    let (lease, _) = app.must_grant("s:job-8", json!({"owner": "a"})).await;
    assert!(!took(&app, "job-8", "a", 30).await);
    assert_eq!(unlocked(&app, "job-8", "a").await, 2);
    assert_eq!(app.revoke("s:job-8", &lease).await.0, 204);
    assert!(took(&app, "job-8", "a", 30).await);
    // ...and each store is a namespace of its own.
    let body = json!({"resourceId": "job-7", "lockOwner": "b", "expiryInSeconds": 30});
    let (status, answer) = lock(&app, "t", body).await;
    assert_eq!(
        (status, &answer["success"]),
        (200, &json!(true)),
        "{answer}"
    );
}

#[tokio::test]
async fn bad_calls_are_400s_in_daprs_error_body() {
    let app = TestApp::in_process(config(&[])).await;
    let bad = [
        json!({"resourceId": "r", "lockOwner": "a"}),
        json!({"resourceId": "r", "lockOwner": "a", "expiryInSeconds": 0}),
        json!({"resourceId": "r", "lockOwner": "a", "expiryInSeconds": -5}),
        json!({"resourceId": "r", "lockOwner": "a", "expiryInSeconds": 3601}),
        json!({"resourceId": "r", "lockOwner": "a", "expiryInSeconds": "10"}),
        json!({"resourceId": "r", "lockOwner": "", "expiryInSeconds": 10}),
        json!({"resourceId": "", "lockOwner": "a", "expiryInSeconds": 10}),
        json!({"resourceId": "a/b", "lockOwner": "a", "expiryInSeconds": 10}),
        json!({"resourceId": "x".repeat(300), "lockOwner": "a", "expiryInSeconds": 10}),
        json!({"resourceId": "r", "lockOwner": "x".repeat(300), "expiryInSeconds": 10}),
        Value::Null,
    ];
    for body in bad {
        let (status, answer) = lock(&app, "s", body.clone()).await;
        dapr_error(status, &answer, 400, "ERR_MALFORMED_REQUEST");
    }
    let (status, answer) = unlock(&app, "s", json!({"resourceId": "r"})).await;
    dapr_error(status, &answer, 400, "ERR_MALFORMED_REQUEST");
    let answer = app
        .call("POST", "/v1.0-alpha1/lock/s")
        .body("not json")
        .send()
        .await;
    dapr_error(answer.status, &answer.json(), 400, "ERR_MALFORMED_REQUEST");
    // Nothing was taken by any of them.
    assert_eq!(app.inspect("s:r").await.1["held"], false);
}

#[tokio::test]
async fn an_sdk_finds_the_sidecar_started_and_ready() {
    let app = TestApp::in_process(config(&[])).await;
    let (status, meta) = app.get("/v1.0/metadata").await;
    assert_eq!((status, &meta["id"]), (200, &json!("redlockd")), "{meta}");
    for path in ["/v1.0/healthz", "/v1.0/healthz/outbound"] {
        assert_eq!(app.call("GET", path).send().await.status, 204, "{path}");
    }
}

#[tokio::test]
async fn under_authentication_daprs_token_header_is_read_and_a_tokens_prefixes_hold() {
    let t = tokens();
    let mut cfg = config(&[]);
    cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned());
    let app = TestApp::in_process(cfg).await;
    let body = json!({"resourceId": "nightly", "lockOwner": "a", "expiryInSeconds": 30});
    let call = |store: &str, token: Option<&str>| {
        let mut call = app
            .call("POST", &format!("/v1.0-alpha1/lock/{store}"))
            .json(&body);
        if let Some(token) = token {
            call = call.header("dapr-api-token", token);
        }
        call.send()
    };
    // The client token's prefix is `jobs:`: the store `jobs` is its, `cron` is not.
    let answer = call("jobs", Some(&t.client)).await;
    assert_eq!(
        (answer.status, &answer.json()["success"]),
        (200, &json!(true))
    );
    // Refusals before the call is read are redlockd's own error body, as on every route.
    let answer = call("cron", Some(&t.client)).await;
    common::assert_error(answer.status, &answer.json(), 403, "forbidden");
    assert_eq!(call("jobs", None).await.status, 401);
    assert_eq!(call("jobs", Some("rlk_not-a-token")).await.status, 401);
    assert_eq!(
        call("jobs", Some(&t.reader)).await.status,
        403,
        "a reader holds nothing"
    );
    // A holder is its lockOwner under its token: the administrator naming the same owner
    // is another holder.
    let unlock_as = |token: &str| {
        app.call("POST", "/v1.0-alpha1/unlock/jobs")
            .json(&json!({"resourceId": "nightly", "lockOwner": "a"}))
            .bearer(token)
            .send()
    };
    assert_eq!(unlock_as(&t.admin).await.json()["status"], 2);
    assert_eq!(unlock_as(&t.client).await.json()["status"], 0);
    // Dapr's header is read on Dapr's routes only.
    let native = app
        .call("POST", "/locks/jobs:native")
        .header("dapr-api-token", &t.client)
        .send()
        .await;
    assert_eq!(native.status, 401);
    // What an SDK reads before its first call is open.
    assert_eq!(app.get("/v1.0/metadata").await.0, 200);
}

#[tokio::test(start_paused = true)]
async fn without_a_majority_a_lock_and_an_unlock_are_500s_and_nothing_is_left_held() {
    let (app, nodes) = TestApp::over_three_nodes(config(&[])).await;
    assert!(took(&app, "held", "a", 30).await);
    for node in &nodes[1..] {
        node.set_fault(Fault::Down);
    }
    let body = json!({"resourceId": "q", "lockOwner": "a", "expiryInSeconds": 30});
    let (status, answer) = lock(&app, "s", body).await;
    dapr_error(status, &answer, 500, "ERR_TRY_LOCK");
    let (status, answer) = unlock(&app, "s", json!({"resourceId": "held", "lockOwner": "a"})).await;
    dapr_error(status, &answer, 500, "ERR_UNLOCK");
    common::wait_for("readiness down", Duration::from_secs(30), async || {
        let answer = app.call("GET", "/v1.0/healthz").send().await;
        (answer.status == 500).then(|| answer.json())
    })
    .await;
    for node in &nodes {
        node.set_fault(Fault::None);
    }
    app.until_ready().await;
    // The failed lock left nothing behind; the failed unlock left its lock held.
    assert!(took(&app, "q", "b", 30).await);
    assert_eq!(unlocked(&app, "held", "a").await, 0);
}

#[tokio::test]
async fn with_a_largest_ttl_below_a_second_dapr_locks_are_off_and_say_why() {
    // Dapr asks for whole seconds: below 1000 ms no expiry fits, whatever the caller asks.
    let mut cfg = config(&[]);
    cfg.max_ttl_ms = 500;
    cfg.default_ttl_ms = 400;
    let app = TestApp::in_process(cfg).await;
    let body = json!({"resourceId": "r", "lockOwner": "a", "expiryInSeconds": 1});
    let (status, answer) = lock(&app, "s", body).await;
    dapr_error(status, &answer, 500, "ERR_LOCK_STORE_NOT_CONFIGURED");
    let why = answer["message"].as_str().unwrap_or_default();
    assert!(why.contains("REDLOCKD_MAX_TTL_MS"), "{why}");
    // An unlock has nothing to release, and says so as Dapr's unlock does.
    assert_eq!(unlocked(&app, "r", "a").await, 1);
}
