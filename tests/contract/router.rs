//! The router driven in process with `oneshot`, over the embedded store: every layer a
//! request passes (extractors, error bodies, the request metrics) without a socket.

use crate::common;

use common::TestApp;
use serde_json::Value;

async fn call(app: &TestApp, method: &str, uri: &str, body: &str) -> (u16, Value) {
    let answer = app
        .call(method, uri)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    (answer.status, answer.json())
}

#[tokio::test]
async fn rejections_are_the_contracts_errors_and_are_counted() {
    let app = TestApp::embedded().await;
    let (status, body) = call(&app, "POST", "/locks/bad%20name", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = call(&app, "POST", "/locks/ok", r#"{"ttl": 5}"#).await;
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("unknown field"),
        "{body}"
    );
    let (status, body) = call(&app, "PUT", "/locks/ok/leases/not%20an%20id", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = call(&app, "GET", "/nowhere", "").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, body) = call(&app, "PATCH", "/locks/ok", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (405, Some("method_not_allowed"))
    );
    assert_eq!(
        body["message"], "method not allowed on this route",
        "{body}"
    );
    // Sessions have no `/hold` route as the kinds do: the answer says what to send.
    let (status, body) = call(&app, "POST", "/sessions/hold", "").await;
    common::assert_error(status, &body, 405, "method_not_allowed");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("POST /sessions") && m.contains("text/event-stream")),
        "{body}"
    );
    let text = app.text("/metrics").await;
    assert!(
        text.contains(
            r#"redlockd_requests_total{kind="lock",op="grant",outcome="invalid_request"} 2"#
        ),
        "{text}"
    );
    assert!(text.contains(
        r#"redlockd_requests_total{kind="lock",op="renew",outcome="invalid_request"} 1"#
    ));
}

#[tokio::test]
async fn a_grant_renew_and_revoke_round_trip() {
    let app = TestApp::embedded().await;
    let (status, lease) = call(&app, "POST", "/locks/r?ttl_ms=5000", "").await;
    assert_eq!(status, 201, "{lease}");
    let id = lease["lease_id"].as_str().unwrap();
    let (status, again) = call(&app, "POST", "/locks/r", "").await;
    assert_eq!((status, again["error"].as_str()), (409, Some("lock_held")));
    let (status, renewed) = call(
        &app,
        "PUT",
        &format!("/locks/r/leases/{id}"),
        r#"{"ttl_ms": 9000}"#,
    )
    .await;
    assert_eq!((status, renewed["ttl_ms"].as_u64()), (200, Some(9000)));
    let (status, _) = call(&app, "DELETE", &format!("/locks/r/leases/{id}"), "").await;
    assert_eq!(status, 204);
    let (status, _) = call(&app, "DELETE", &format!("/locks/r/leases/{id}"), "").await;
    assert_eq!(status, 404);
    assert!(app.text("/metrics").await.contains(
        r#"redlockd_requests_total{kind="lock",op="revoke",outcome="lease_not_found"} 1"#
    ));
}
