//! `Idempotency-Key` on grants, over HTTP against three real redis-server masters and two
//! replicas: a retried grant answers the lease it won (on any replica), a key bound to its
//! request, a lease that has let go never locked again, and a grant whose client vanished
//! before the answer found by its retry.

use crate::common;

use std::time::Duration;

use common::{RedisMaster, TestApp, config, masters, wait_for};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

async fn replicas() -> (Vec<RedisMaster>, TestApp, TestApp) {
    let ms = masters(3);
    let a = TestApp::spawn(config(&ms)).await;
    let b = TestApp::spawn(config(&ms)).await;
    (ms, a, b)
}

async fn keyed(app: &TestApp, name: &str, key: &str, body: Value) -> (u16, Value) {
    let resp = app
        .http
        .post(app.url(&format!("/locks/{name}")))
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("grant");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_retry_on_another_replica_answers_the_same_lease_and_token() {
    let (_ms, a, b) = replicas().await;
    let body = json!({"ttl_ms": 30000, "owner": "w1"});
    let (status, first) = keyed(&a, "idem-1", "k-1", body.clone()).await;
    assert_eq!(status, 201, "{first}");
    let (status, again) = keyed(&b, "idem-1", "k-1", body.clone()).await;
    assert_eq!(status, 201, "{again}");
    assert_eq!(again["lease_id"], first["lease_id"]);
    assert_eq!(again["fencing_token"], first["fencing_token"]);
    // A retry that waits is answered at once too: the lock is its own.
    let (status, waited) = keyed(
        &a,
        "idem-1",
        "k-1",
        json!({"ttl_ms": 30000, "owner": "w1", "wait_ms": 5000}),
    )
    .await;
    assert_eq!((status, &waited["lease_id"]), (201, &first["lease_id"]));
    // Held once: anyone else is refused, and the lease renews through either replica.
    assert_eq!(a.grant("idem-1", json!({})).await.0, 409);
    let id = first["lease_id"].as_str().unwrap();
    let (status, renewed) = b.renew("idem-1", id, json!({})).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["fencing_token"], first["fencing_token"]);
    // Another key is another grant.
    assert_eq!(
        keyed(&b, "idem-1", "k-2", json!({"ttl_ms": 30000})).await.0,
        409
    );
}

#[tokio::test]
async fn a_key_is_bound_to_its_request() {
    let (_ms, a, b) = replicas().await;
    let (status, first) = keyed(&a, "idem-2", "k", json!({"ttl_ms": 30000})).await;
    assert_eq!(status, 201, "{first}");
    for (name, body) in [
        ("idem-2", json!({"ttl_ms": 20000})),
        ("idem-2", json!({"ttl_ms": 30000, "owner": "someone"})),
        ("idem-other", json!({"ttl_ms": 30000})),
    ] {
        let (status, err) = keyed(&b, name, "k", body.clone()).await;
        assert_eq!(status, 422, "{name} {body}: {err}");
        assert_eq!(err["error"], "idempotency_mismatch");
    }
    // The first lease is untouched by the refused requests, and the other name is free.
    let id = first["lease_id"].as_str().unwrap();
    assert_eq!(a.check("idem-2", id).await.0, 200);
    assert_eq!(a.inspect("idem-other").await.1["held"], false);
    // wait_ms is not part of the request's identity: a retry may wait less.
    assert_eq!(
        keyed(&a, "idem-2", "k", json!({"ttl_ms": 30000, "wait_ms": 10}))
            .await
            .0,
        201
    );
}

#[tokio::test]
async fn a_retry_after_the_lease_was_revoked_does_not_lock_again() {
    let (_ms, a, b) = replicas().await;
    let (status, first) = keyed(&a, "idem-3", "k", json!({"ttl_ms": 30000})).await;
    assert_eq!(status, 201);
    let id = first["lease_id"].as_str().unwrap();
    assert_eq!(a.revoke("idem-3", id).await.0, 204);
    let (status, err) = keyed(&b, "idem-3", "k", json!({"ttl_ms": 30000})).await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"], "lease_not_found");
    assert_eq!(
        b.inspect("idem-3").await.1["held"],
        false,
        "nobody holds it"
    );
    // A new key locks as usual, with a greater token.
    let (status, next) = keyed(&b, "idem-3", "k2", json!({"ttl_ms": 30000})).await;
    assert_eq!(status, 201);
    assert!(next["fencing_token"].as_u64() > first["fencing_token"].as_u64());
}

/// Send a grant and close the connection before reading a byte of the answer: the answer
/// is lost, whether the grant was decided before or after the close.
async fn grant_and_hang_up(app: &TestApp, name: &str, key: Option<&str>) {
    let addr = app.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = r#"{"ttl_ms":30000}"#;
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST /locks/{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{key}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    drop(conn);
}

#[tokio::test]
async fn a_grant_whose_answer_was_lost_is_found_by_its_retry() {
    let (_ms, a, b) = replicas().await;
    grant_and_hang_up(&a, "idem-5", Some("lost-answer")).await;
    // The retry may reach the masters before the first attempt or after it: either way
    // it answers the one lease, and the lock holds no other.
    let (status, retried) = keyed(&b, "idem-5", "lost-answer", json!({"ttl_ms": 30000})).await;
    assert_eq!(status, 201, "{retried}");
    let token = retried["fencing_token"].as_u64();
    // Once the first attempt has surely finished, the lock is still the retry's lease.
    wait_for(
        "the first attempt to settle",
        Duration::from_secs(5),
        async || {
            let (_, held) = a.inspect("idem-5").await;
            (held["fencing_token"].as_u64() == token).then_some(())
        },
    )
    .await;
    let id = retried["lease_id"].as_str().unwrap();
    assert_eq!(a.check("idem-5", id).await.0, 200);
    assert_eq!(a.grant("idem-5", json!({})).await.0, 409);
    assert_eq!(a.revoke("idem-5", id).await.0, 204);
    assert_eq!(
        a.inspect("idem-5").await.1["held"],
        false,
        "one revoke frees it"
    );
}

/// A keyed retry that finds its own earlier hold promises no more than the masters keep:
/// retried half a TTL later, the validity it answers (counted from the retry) is covered
/// by the hold's keys, so no other client is granted the name before it ends. For an
/// exclusive lock, a shared hold against a writer, and a lease on several names. (Before,
/// the retry answered a full validity from the retry while the keys kept the first
/// attempt's expiry: another client got the name half a TTL early.)
#[tokio::test]
async fn a_late_keyed_retry_answers_no_more_validity_than_the_keys_keep() {
    let (_ms, a, b) = replicas().await;
    let cases = [
        ("/locks/late-x", json!({"ttl_ms": 1500}), "/locks/late-x"),
        (
            "/locks/late-s",
            json!({"ttl_ms": 1500, "mode": "shared"}),
            "/locks/late-s",
        ),
        (
            "/locks",
            json!({"ttl_ms": 1500, "names": ["late-g1", "late-g2"]}),
            "/locks/late-g2",
        ),
    ];
    for (path, body, contended) in cases {
        let send = async |app: &TestApp| {
            let resp = app
                .http
                .post(app.url(path))
                .header("Idempotency-Key", format!("late-{path}"))
                .json(&body)
                .send()
                .await
                .expect("grant");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        };
        let (status, first) = send(&a).await;
        assert_eq!(status, 201, "{path}: {first}");
        tokio::time::sleep(Duration::from_millis(750)).await;
        let sent = std::time::Instant::now();
        let (status, again) = send(&b).await;
        assert_eq!(status, 201, "{path}: {again}");
        assert_eq!(again["lease_id"], first["lease_id"]);
        let validity = Duration::from_millis(again["validity_ms"].as_u64().unwrap());
        let deadline = sent + validity;
        while std::time::Instant::now() + Duration::from_millis(100) < deadline {
            let (status, other) = a
                .send("POST", contended, Some(json!({"ttl_ms": 1000})))
                .await;
            assert_ne!(
                status,
                201,
                "{path}: another client was granted {contended} {:?} before the retry's validity ended: {other}",
                deadline - std::time::Instant::now()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
