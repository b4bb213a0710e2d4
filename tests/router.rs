//! The router driven in process with `oneshot`, over the embedded store: every layer a
//! request passes (extractors, error bodies, the request metrics) without a socket.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use redlockd::config::Config;
use redlockd::http::{AppState, router};
use redlockd::lease::{Events, LeaseService};
use redlockd::metrics::Metrics;
use redlockd::redlock::node::LockNode;
use redlockd::redlock::{EngineConfig, Redlock};
use redlockd::store::memory::MemoryNode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

async fn app() -> (axum::Router, Arc<Metrics>) {
    let settings = Config::from_env().unwrap().settings().unwrap();
    let nodes: Vec<Arc<dyn LockNode>> = vec![Arc::new(MemoryNode::embedded())];
    let metrics = Arc::new(Metrics::new());
    let engine = Arc::new(Redlock::new(
        nodes.clone(),
        EngineConfig::new(
            settings.master_timeout,
            settings.drift_factor,
            settings.leases.max_ttl,
        ),
        metrics.clone(),
    ));
    engine.monitor().probe_round(&nodes).await;
    let shutdown = CancellationToken::new();
    let service = LeaseService::new(engine, Events::new(), metrics.clone(), shutdown.clone());
    let state = AppState {
        service,
        metrics: metrics.clone(),
        settings: Arc::new(settings),
        shutdown,
        auth: None,
    };
    (router(state), metrics)
}

async fn call(app: &axum::Router, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn rejections_are_the_contracts_errors_and_are_counted() {
    let (app, metrics) = app().await;
    let (status, body) = call(&app, "POST", "/locks/bad%20name", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (status, body) = call(&app, "POST", "/locks/ok", r#"{"ttl": 5}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["message"].as_str().unwrap().contains("unknown field"),
        "{body}"
    );
    let (status, body) = call(&app, "PUT", "/locks/ok/leases/not%20an%20id", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (status, body) = call(&app, "GET", "/nowhere", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = call(&app, "PATCH", "/locks/ok", "").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"))
    );
    let text = metrics.render();
    assert!(
        text.contains(r#"redlockd_requests_total{op="grant",outcome="invalid_request"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"redlockd_requests_total{op="renew",outcome="invalid_request"} 1"#));
}

#[tokio::test]
async fn a_grant_renew_and_revoke_round_trip() {
    let (app, metrics) = app().await;
    let (status, lease) = call(&app, "POST", "/locks/r?ttl_ms=5000", "").await;
    assert_eq!(status, StatusCode::CREATED, "{lease}");
    let id = lease["lease_id"].as_str().unwrap();
    let (status, again) = call(&app, "POST", "/locks/r", "").await;
    assert_eq!(
        (status, again["error"].as_str()),
        (StatusCode::CONFLICT, Some("lock_held"))
    );
    let (status, renewed) = call(
        &app,
        "PUT",
        &format!("/locks/r/leases/{id}"),
        r#"{"ttl_ms": 9000}"#,
    )
    .await;
    assert_eq!(
        (status, renewed["ttl_ms"].as_u64()),
        (StatusCode::OK, Some(9000))
    );
    let (status, _) = call(&app, "DELETE", &format!("/locks/r/leases/{id}"), "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(&app, "DELETE", &format!("/locks/r/leases/{id}"), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        metrics
            .render()
            .contains(r#"redlockd_requests_total{op="revoke",outcome="lease_not_found"} 1"#)
    );
}
