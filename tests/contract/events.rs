//! Every event a stream sends is one its route's documented `text/event-stream` schema
//! allows, checked by a JSON Schema validator against the document the app serves: held
//! locks, permits and campaigns (granted, queued, heartbeat, lost, failed), their resumes
//! (resumed, failed), sessions' held streams (opened, resumed, failed) and observers.

use crate::common;

use std::time::Duration;

use common::{EventStream, TestApp};
use serde_json::{Value, json};

/// The validator of the events of `method path` (a route as the document names it).
fn documented(doc: &Value, path: &str, method: &str) -> jsonschema::Validator {
    let schema =
        &doc["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} documents no event stream"
    );
    let reference = schema["$ref"]
        .as_str()
        .expect("a reference to the events' schema");
    of(doc, reference)
}

/// The validator of the schema at `reference` (`#/components/schemas/...`) in `doc`.
fn of(doc: &Value, reference: &str) -> jsonschema::Validator {
    // The whole document is the root, so that the schema's references resolve in it.
    let mut root = doc.clone();
    root["$ref"] = json!(reference);
    let validator = jsonschema::validator_for(&root).expect("the document's schemas compile");
    // The check that the check can fail: no event's data is an empty object.
    assert!(
        !validator.is_valid(&json!({})),
        "{reference} allows anything"
    );
    validator
}

/// Read `stream` until it ends or `until` is seen (or `limit` passes), checking every
/// event's data with `validator`; the events' names, in order.
async fn checked(
    stream: &mut EventStream,
    validator: &jsonschema::Validator,
    route: &str,
    until: &[&str],
    limit: Duration,
) -> Vec<String> {
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        while let Some((name, data)) = stream.next().await {
            let errors: Vec<String> = validator
                .iter_errors(&data)
                .map(|e| e.to_string())
                .collect();
            assert!(
                errors.is_empty(),
                "{route}: the `{name}` event {data} is not what the document allows: {errors:?}"
            );
            seen.push(name.clone());
            if until.contains(&name.as_str()) {
                break;
            }
        }
    })
    .await;
    seen
}

#[tokio::test]
async fn every_stream_event_is_one_the_served_document_allows() {
    let app = TestApp::embedded().await;
    let doc: Value = serde_json::from_str(&app.text("/openapi.json").await).unwrap();
    let limit = Duration::from_secs(10);
    let mut told = std::collections::BTreeSet::new();

    for kind in ["locks", "semaphores", "elections"] {
        let hold = format!("/{kind}/{{name}}/hold");
        let resume = format!("/{kind}/{{name}}/leases/{{lease_id}}/hold");
        let (on_hold, on_resume) = (
            documented(&doc, &hold, "post"),
            documented(&doc, &resume, "post"),
        );
        let body = match kind {
            "semaphores" => json!({"limit": 1, "ttl_ms": 1000}),
            _ => json!({"ttl_ms": 1000}),
        };
        // Granted, renewed, then waited for by a second stream, released by its lease id.
        let path = format!("/{kind}/ev-{kind}/hold");
        let mut first = app.call("POST", &path).json(&body).send_stream().await;
        assert_eq!(first.status, 200, "{path}");
        let seen = checked(&mut first, &on_hold, &hold, &["heartbeat"], limit).await;
        told.extend(seen.iter().map(|e| format!("{kind} {e}")));
        let mut second_body = body.clone();
        second_body["wait_ms"] = json!(200);
        let mut second = app
            .call("POST", &path)
            .json(&second_body)
            .send_stream()
            .await;
        let seen = checked(&mut second, &on_hold, &hold, &["failed"], limit).await;
        told.extend(seen.iter().map(|e| format!("{kind} {e}")));
        drop(first);
        // A resume of a lease that is not held: failed.
        let made_up = format!("/{kind}/ev-{kind}/leases/AAAAAAAAAAAAAAAAAAAAAA/hold");
        let mut gone = app
            .call("POST", &made_up)
            .json(&json!({}))
            .send_stream()
            .await;
        let seen = checked(&mut gone, &on_resume, &resume, &["failed"], limit).await;
        told.extend(seen.iter().map(|e| format!("{kind} resume {e}")));
    }

    // A session's held stream (`POST /sessions` asking for `text/event-stream`, whose events
    // the session's hold route documents), and a resume of one that is gone.
    let opened = of(&doc, "#/components/schemas/SessionStreamData");
    let mut session = app
        .call("POST", "/sessions?ttl_ms=1000")
        .header("accept", "text/event-stream")
        .send_stream()
        .await;
    let seen = checked(&mut session, &opened, "/sessions", &["heartbeat"], limit).await;
    told.extend(seen.iter().map(|e| format!("session {e}")));
    let resume = documented(&doc, "/sessions/{session_id}/hold", "post");
    let mut gone = app
        .call("POST", "/sessions/AAAAAAAAAAAAAAAAAAAAAA/hold")
        .json(&json!({}))
        .send_stream()
        .await;
    let seen = checked(
        &mut gone,
        &resume,
        "/sessions/{session_id}/hold",
        &["failed"],
        limit,
    )
    .await;
    told.extend(seen.iter().map(|e| format!("session resume {e}")));

    // An observer of an election: vacant, then elected.
    let observe = documented(&doc, "/elections/{name}/observe", "get");
    let mut watcher = app
        .call("GET", "/elections/ev-watched/observe")
        .send_stream()
        .await;
    let seen = checked(
        &mut watcher,
        &observe,
        "/elections/{name}/observe",
        &["vacant"],
        limit,
    )
    .await;
    told.extend(seen.iter().map(|e| format!("observe {e}")));
    let _leader = app
        .call("POST", "/elections/ev-watched/hold")
        .json(&json!({"ttl_ms": 1000}))
        .send_stream()
        .await;
    let seen = checked(
        &mut watcher,
        &observe,
        "/elections/{name}/observe",
        &["elected"],
        limit,
    )
    .await;
    told.extend(seen.iter().map(|e| format!("observe {e}")));

    for event in [
        "observe vacant",
        "observe elected",
        "locks granted",
        "locks heartbeat",
        "locks queued",
        "locks failed",
        "locks resume failed",
        "semaphores granted",
        "semaphores resume failed",
        "elections resume failed",
        "session opened",
        "session resume failed",
    ] {
        assert!(
            told.contains(event),
            "no `{event}` event was checked: {told:?}"
        );
    }
}
