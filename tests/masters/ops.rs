//! The operations surface: the OpenAPI document (committed, served, current), the offline
//! docs, metrics an SRE can trust, request ids.

use crate::common;

use common::SendJson as _;

use std::time::Duration;

use common::{TestApp, config, masters, wait_for};
use serde_json::json;

#[tokio::test]
async fn the_docs_render_their_operations_in_headless_chromium() {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("chromium is not installed: run scripts/test (it installs it), or apt-get install chromium");
    let ms = masters(1);
    let app = TestApp::spawn(config(&ms[..1])).await;
    let profile = tempfile::tempdir().unwrap();
    // Without the slash: the page's relative assets must still load.
    let url = app.url("/docs");
    let dom = tokio::task::spawn_blocking({
        let chromium = chromium.to_owned();
        let profile = profile.path().to_owned();
        move || {
            std::process::Command::new(chromium)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                    "--virtual-time-budget=15000",
                    "--dump-dom",
                ])
                .arg(format!("--user-data-dir={}", profile.display()))
                .arg(url)
                .output()
                .expect("run chromium")
        }
    })
    .await
    .unwrap();
    let html = String::from_utf8_lossy(&dom.stdout);
    for expected in [
        "/locks/{name}/leases/{lease_id}",
        "/locks/{name}",
        "/readyz",
        "opblock-summary",
    ] {
        assert!(
            html.contains(expected),
            "the rendered docs lack {expected}; stderr: {}",
            String::from_utf8_lossy(&dom.stderr)
        );
    }
}

#[tokio::test]
async fn master_health_is_exported_per_master_and_follows_a_paused_one() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    app.must_grant("invoice:1", json!({})).await;
    let metrics = app.text("/metrics").await;
    assert!(
        metrics.contains("redlockd_master_request_duration_seconds_bucket"),
        "{metrics}"
    );
    let up = |m: &common::RedisMaster, v: u8| {
        format!(
            r#"redlockd_master_up{{master="redis://127.0.0.1:{}"}} {v}"#,
            m.port
        )
    };
    assert!(metrics.contains(&up(&ms[1], 1)), "{metrics}");
    // Every master's error series exists from the start, at 0, so that `rate()` works.
    for kind in ["timeout", "connection", "script", "amnesic", "other"] {
        let zero = format!(
            r#"redlockd_master_errors_total{{kind="{kind}",master="redis://127.0.0.1:{}"}} 0"#,
            ms[1].port
        );
        assert!(metrics.contains(&zero), "missing {zero}");
    }
    ms[1].pause();
    app.wait_for_metrics("master_up to fall to 0", &up(&ms[1], 0))
        .await;
    let errors = format!(
        r#"redlockd_master_errors_total{{kind="timeout",master="redis://127.0.0.1:{}"}}"#,
        ms[1].port
    );
    assert!(app.text("/metrics").await.contains(&errors));
    ms[1].resume();
    app.wait_for_metrics("master_up to return to 1", &up(&ms[1], 1))
        .await;
}
/// An OTLP/HTTP receiver of our own: every JSON body POSTed to `/v1/traces`, kept.
async fn otlp_receiver() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use axum::routing::post;
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                kept.lock().unwrap().push(json);
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), bodies)
}

/// A span as the receiver got it.
#[derive(Debug)]
struct Sent {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: serde_json::Map<String, serde_json::Value>,
}

/// Every span the receiver got.
fn spans(bodies: &[serde_json::Value]) -> Vec<Sent> {
    let mut all = Vec::new();
    for body in bodies {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let attributes = span["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| {
                            let value = a["value"]
                                .as_object()
                                .and_then(|v| v.values().next().cloned());
                            (
                                a["key"].as_str().unwrap_or("").to_owned(),
                                value.unwrap_or_default(),
                            )
                        })
                        .collect();
                    let text = |k: &str| span[k].as_str().unwrap_or("").to_owned();
                    all.push(Sent {
                        name: text("name"),
                        trace: text("traceId"),
                        id: text("spanId"),
                        parent: text("parentSpanId"),
                        attributes,
                    });
                }
            }
        }
    }
    all
}

#[tokio::test]
async fn a_traced_grant_shows_one_span_per_master_step_under_the_clients_trace() {
    let ms = masters(3);
    let (endpoint, bodies) = otlp_receiver().await;
    let urls: Vec<String> = ms.iter().map(|m| m.url()).collect();
    let urls = urls.join(",");
    let server = common::Server::start(&[
        ("REDLOCKD_REDIS_URLS", &urls),
        ("REDLOCKD_OTLP_ENDPOINT", &endpoint),
    ])
    .await;
    server.wait_ready("the replica to be ready").await;
    // The client's trace: W3C traceparent (version, trace id, parent span id, flags).
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let granted: serde_json::Value = common::http()
        .post(format!("{}/locks/traced:1", server.base))
        .header("traceparent", format!("00-{trace_id}-{client_span}-01"))
        .value()
        .await;
    let lease_id = granted["lease_id"].as_str().expect("granted").to_owned();
    // Stopping sends what is still batched.
    common::signal(server.child.id(), "-TERM");
    // The request's span and its three acquire spans (the third master's may end after the
    // grant was answered, and travel in a later batch).
    wait_for(
        "the grant's spans to arrive",
        Duration::from_secs(10),
        async || {
            let got = spans(&bodies.lock().unwrap());
            let request = got.iter().find(|s| s.name == "POST /locks/{name}")?;
            let acquires = got
                .iter()
                .filter(|s| s.parent == request.id)
                .filter(|s| s.attributes.get("step").is_some_and(|v| v == "acquire"))
                .count();
            (acquires >= 3).then_some(())
        },
    )
    .await;
    let got = spans(&bodies.lock().unwrap());
    let requests: Vec<_> = got
        .iter()
        .filter(|s| s.name == "POST /locks/{name}")
        .collect();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let request = requests[0];
    assert_eq!(
        request.trace, trace_id,
        "the request joins the client's trace"
    );
    assert_eq!(
        request.parent, client_span,
        "as a child of the client's span"
    );
    assert_eq!(request.attributes["lock.name"], "traced:1");
    assert_eq!(request.attributes["lock.kind"], "lock");
    assert_eq!(request.attributes["http.route"], "/locks/{name}");
    let steps: Vec<_> = got
        .iter()
        .filter(|s| {
            s.parent == request.id && s.attributes.get("step").is_some_and(|v| v == "acquire")
        })
        .collect();
    assert_eq!(steps.len(), 3, "one acquire span per master: {got:#?}");
    let mut masters: Vec<&str> = steps
        .iter()
        .map(|s| s.attributes["master"].as_str().unwrap())
        .collect();
    masters.sort();
    let mut expected: Vec<String> = ms
        .iter()
        .map(|m| format!("redis://127.0.0.1:{}", m.port))
        .collect();
    expected.sort();
    assert_eq!(masters, expected);
    assert!(
        steps.iter().all(|s| s.attributes["outcome"] == "ok"),
        "{steps:#?}"
    );
    // Never a lease id, anywhere in what was sent.
    let sent = serde_json::to_string(&*bodies.lock().unwrap()).unwrap();
    assert!(!sent.contains(&lease_id), "a lease id reached the traces");
}
