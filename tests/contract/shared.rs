//! Shared locks (`mode: shared`) in process over the embedded store: shared holders hold a
//! name together, an exclusive grant excludes them and is excluded by them, a waiting
//! exclusive grant is not overtaken by shared grants that come after it, tokens rise across
//! both modes, and every lease route works on a shared lease. The same on real masters and
//! two replicas is in `masters::shared`.

use crate::common;

use std::time::Duration;

use common::TestApp;
use serde_json::{Value, json};

#[tokio::test]
async fn shared_holders_hold_a_name_together_and_exclude_an_exclusive_grant() {
    let app = TestApp::embedded().await;
    let (status, r1) = app
        .grant("doc", json!({"mode": "shared", "owner": "r1"}))
        .await;
    assert_eq!((status, &r1["mode"]), (201, &json!("shared")), "{r1}");
    let (status, r2) = app
        .grant("doc", json!({"mode": "shared", "owner": "r2"}))
        .await;
    assert_eq!(status, 201, "{r2}");
    assert!(r2["fencing_token"].as_u64() > r1["fencing_token"].as_u64());
    let (status, refused) = app.grant("doc", json!({})).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_held")),
        "{refused}"
    );

    let (_, seen) = app.inspect("doc").await;
    assert_eq!(
        (&seen["held"], &seen["mode"]),
        (&json!(true), &json!("shared")),
        "{seen}"
    );
    assert_eq!(
        seen["fencing_token"], r2["fencing_token"],
        "the highest holder's"
    );
    let holders = seen["holders"].as_array().unwrap();
    assert_eq!(
        holders
            .iter()
            .map(|h| h["owner"].clone())
            .collect::<Vec<_>>(),
        [json!("r1"), json!("r2")]
    );
    assert!(holders.iter().all(|h| h.get("lease_id").is_none()));

    // Every lease route works on a shared lease, and a renew keeps its token.
    let (status, renewed) = app
        .send("PUT", &common::lease_path("/locks/doc", &r1), None)
        .await;
    assert_eq!(
        (status, &renewed["fencing_token"]),
        (200, &r1["fencing_token"])
    );
    assert_eq!(renewed["mode"], "shared");
    let (status, checked) = app
        .send("GET", &common::lease_path("/locks/doc", &r1), None)
        .await;
    assert_eq!(
        (status, &checked["mode"]),
        (200, &json!("shared")),
        "{checked}"
    );
    let token = r1["fencing_token"].as_u64().unwrap();
    let (_, fence) = app
        .send("GET", &format!("/locks/doc/fences/{token}"), None)
        .await;
    assert_eq!(fence["current"], true);

    for r in [&r1, &r2] {
        assert_eq!(app.lease_status("DELETE", "/locks/doc", r).await, 204);
    }
    assert_eq!(app.lease_status("DELETE", "/locks/doc", &r1).await, 404);
    let (status, writer) = app.grant("doc", json!({})).await;
    assert_eq!(
        (status, &writer["mode"]),
        (201, &json!("exclusive")),
        "{writer}"
    );
    assert!(writer["fencing_token"].as_u64() > r2["fencing_token"].as_u64());
    // Held exclusive: a shared grant is refused, and inspect says exclusive.
    assert_eq!(app.grant("doc", json!({"mode": "shared"})).await.0, 409);
    let (_, seen) = app.inspect("doc").await;
    assert_eq!(seen["mode"], "exclusive");
    assert!(seen.get("holders").is_none());
}

#[tokio::test]
async fn a_waiting_exclusive_grant_is_not_overtaken_by_shared_grants_after_it() {
    let app = TestApp::embedded().await;
    let (_, reader) = app
        .grant("queue", json!({"mode": "shared", "ttl_ms": 10_000}))
        .await;
    let writer = {
        let app = app.handle();
        tokio::spawn(async move { app.grant("queue", json!({"wait_ms": 10_000})).await })
    };
    app.wait_for_contention("queue", 1).await;
    // A shared grant that comes after the waiting writer waits behind it.
    let (status, refused) = app.grant("queue", json!({"mode": "shared"})).await;
    assert_eq!(status, 409, "{refused}");
    let late = {
        let app = app.handle();
        tokio::spawn(async move {
            app.grant("queue", json!({"mode": "shared", "wait_ms": 10_000}))
                .await
        })
    };
    app.wait_for_contention("queue", 3).await;
    // The reader leaves: the writer, first in line, has the lock at once.
    assert_eq!(
        app.lease_status("DELETE", "/locks/queue", &reader).await,
        204
    );
    let (status, w) =
        common::joined(writer, "the writer is granted when the last reader leaves").await;
    assert_eq!((status, &w["mode"]), (201, &json!("exclusive")), "{w}");
    assert!(!late.is_finished(), "the later reader waits for the writer");
    assert_eq!(app.lease_status("DELETE", "/locks/queue", &w).await, 204);
    let (status, r) =
        common::joined(late, "the later reader is granted when the writer leaves").await;
    assert_eq!((status, &r["mode"]), (201, &json!("shared")), "{r}");
    assert!(r["fencing_token"].as_u64() > w["fencing_token"].as_u64());
}

#[tokio::test]
async fn force_release_removes_every_shared_holder() {
    let app = TestApp::embedded().await;
    let (_, a) = app.grant("evict", json!({"mode": "shared"})).await;
    let (_, b) = app.grant("evict", json!({"mode": "shared"})).await;
    let (status, removed) = app.send("DELETE", "/locks/evict", None).await;
    assert_eq!(
        (status, &removed["released"]),
        (200, &json!(true)),
        "{removed}"
    );
    assert_eq!(
        removed["fencing_token"], b["fencing_token"],
        "the highest removed"
    );
    assert_eq!(app.lease_status("PUT", "/locks/evict", &a).await, 404);
    assert_eq!(app.lease_status("PUT", "/locks/evict", &b).await, 404);
    assert_eq!(app.inspect("evict").await.1["held"], false);
}

#[tokio::test]
async fn a_keyed_shared_retry_answers_the_same_lease_and_the_mode_is_part_of_the_request() {
    let app = TestApp::embedded().await;
    let keyed = |body: Value| app.keyed("/locks/k", "4b8e-shared", body);
    let first = keyed(json!({"mode": "shared", "ttl_ms": 5000})).await;
    assert_eq!(first.status, 201);
    let first = first.json();
    let retry = keyed(json!({"mode": "shared", "ttl_ms": 5000}))
        .await
        .json();
    assert_eq!(
        (&retry["lease_id"], &retry["fencing_token"]),
        (&first["lease_id"], &first["fencing_token"])
    );
    assert_eq!(
        keyed(json!({"ttl_ms": 5000})).await.status,
        422,
        "exclusive is another request"
    );
}

#[tokio::test]
async fn a_shared_hold_streams_and_ends_with_its_connection() {
    let app = TestApp::embedded().await;
    let mut stream = app
        .call("POST", "/locks/held?mode=shared&ttl_ms=3000")
        .stream()
        .await;
    let granted = stream.expect("granted").await;
    assert_eq!(granted["mode"], "shared");
    assert_eq!(app.grant("held", json!({"mode": "shared"})).await.0, 201);
    drop(stream);
    common::wait_for(
        "the stream's shared hold released when it closed",
        Duration::from_secs(5),
        async || {
            let (_, seen) = app.inspect("held").await;
            (seen["holders"].as_array().map(Vec::len) == Some(1)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_bad_mode_is_a_clear_400() {
    let app = TestApp::embedded().await;
    for body in [
        json!({"mode": "read"}),
        json!({"mode": 1}),
        json!({"mode": null, "x": 1}),
    ] {
        let (status, err) = app.grant("m", body.clone()).await;
        assert_eq!(
            (status, err["error"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
    }
    let (status, err) = app.send("POST", "/locks/m?mode=writer", None).await;
    assert_eq!(status, 400, "{err}");
    // A shared lease's id on another name, or with its tail cut off, holds nothing.
    let (_, r) = app.grant("m", json!({"mode": "shared"})).await;
    let id = r["lease_id"].as_str().unwrap();
    let cut = &id[..22];
    for path in [
        format!("/locks/other/leases/{id}"),
        format!("/locks/m/leases/{cut}"),
    ] {
        assert_eq!(app.send("PUT", &path, None).await.0, 404, "{path}");
    }
}

#[tokio::test]
async fn a_writer_that_gave_up_holds_later_readers_up_no_longer_than_it_waited() {
    let app = TestApp::embedded().await;
    let (_, _reader) = app
        .grant("gave-up", json!({"mode": "shared", "ttl_ms": 10_000}))
        .await;
    let (status, _) = app.grant("gave-up", json!({"wait_ms": 200})).await;
    assert_eq!(status, 409, "the writer gave up");
    // Its claim on the name lasted no longer than its wait: readers come in again at once,
    // not when the reader it waited for would lapse (10 s).
    common::wait_for(
        "a reader to be granted after the writer gave up",
        Duration::from_secs(2),
        async || (app.grant("gave-up", json!({"mode": "shared"})).await.0 == 201).then_some(()),
    )
    .await;
}
