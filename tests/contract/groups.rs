//! Several names under one lease (`POST /locks` with `names`), in process over the
//! embedded store: all of them or none, one token above every earlier token of each, the
//! lease renewed, checked and revoked through any of its names, keyed retries, a waiting
//! grant woken by a release of its last held name, force-release of one name removing the
//! whole lease, and bad input. Opposite orders and starvation on real masters and two
//! replicas are in `masters::groups`.

use crate::common;

use common::{TestApp, scenarios};
use serde_json::{Value, json};

async fn grant_many(app: &TestApp, body: Value) -> (u16, Value) {
    app.send("POST", "/locks", Some(body)).await
}

#[tokio::test]
async fn several_names_are_granted_all_or_none_under_one_lease_and_token() {
    let app = TestApp::embedded().await;
    let (_, single) = app.grant("acct:2", json!({})).await;
    let (status, refused) = grant_many(&app, json!({"names": ["acct:2", "acct:1"]})).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_held")),
        "{refused}"
    );
    assert_eq!(
        app.inspect("acct:1").await.1["held"],
        false,
        "none of them was taken"
    );

    assert_eq!(
        app.lease_status("DELETE", "/locks/acct:2", &single).await,
        204
    );
    let (status, both) =
        grant_many(&app, json!({"names": ["acct:2", "acct:1"], "owner": "t"})).await;
    assert_eq!(status, 201, "{both}");
    assert_eq!(both["names"], json!(["acct:1", "acct:2"]), "sorted");
    assert_eq!(both["name"], "acct:1");
    let token = both["fencing_token"].as_u64().unwrap();
    assert!(token > single["fencing_token"].as_u64().unwrap());
    for name in ["acct:1", "acct:2"] {
        let (_, seen) = app.inspect(name).await;
        assert_eq!(
            (seen["fencing_token"].as_u64(), &seen["owner"]),
            (Some(token), &json!("t"))
        );
        assert_eq!(app.grant(name, json!({})).await.0, 409);
    }

    // Renewed and checked through either name, for both; revoked through the other.
    let renew_at = common::lease_path("/locks/acct:2", &both);
    let (status, renewed) = app
        .send("PUT", &renew_at, Some(json!({"ttl_ms": 9000})))
        .await;
    assert_eq!(
        (status, renewed["fencing_token"].as_u64()),
        (200, Some(token)),
        "{renewed}"
    );
    assert_eq!(renewed["names"], both["names"]);
    let (_, checked) = app
        .send("GET", &common::lease_path("/locks/acct:1", &both), None)
        .await;
    assert!(
        checked["ttl_remaining_ms"].as_u64().unwrap() > 8000,
        "{checked}"
    );
    assert_eq!(
        app.lease_status("DELETE", "/locks/acct:1", &both).await,
        204
    );
    for name in ["acct:1", "acct:2"] {
        assert_eq!(app.inspect(name).await.1["held"], false);
    }
    // A lease id that names no lease on that name is not found.
    assert_eq!(app.lease_status("PUT", "/locks/acct:3", &both).await, 404);
}

#[tokio::test]
async fn a_waiting_grant_of_several_names_is_woken_when_the_last_one_is_freed() {
    let app = TestApp::embedded().await;
    let (_, a) = app.grant("w:a", json!({})).await;
    let (_, b) = app.grant("w:b", json!({})).await;
    let waiter = {
        let app = app.handle();
        tokio::spawn(async move {
            grant_many(&app, json!({"names": ["w:b", "w:a"], "wait_ms": 10_000})).await
        })
    };
    app.wait_for_contention("w", 1).await;
    assert_eq!(app.lease_status("DELETE", "/locks/w:a", &a).await, 204);
    assert!(!waiter.is_finished(), "w:b is still held");
    assert_eq!(app.lease_status("DELETE", "/locks/w:b", &b).await, 204);
    let (status, both) = common::joined(
        waiter,
        "granted once both are free, not at the end of its wait",
    )
    .await;
    assert_eq!(status, 201, "{both}");
}

#[tokio::test]
async fn force_release_of_one_name_removes_the_whole_lease() {
    let app = TestApp::embedded().await;
    let (_, both) = grant_many(&app, json!({"names": ["f:1", "f:2"]})).await;
    let (status, removed) = app.send("DELETE", "/locks/f:2", None).await;
    assert_eq!(
        (status, &removed["released"]),
        (200, &json!(true)),
        "{removed}"
    );
    for name in ["f:1", "f:2"] {
        assert_eq!(app.inspect(name).await.1["held"], false, "{name}");
    }
    assert_eq!(app.lease_status("PUT", "/locks/f:1", &both).await, 404);
}

#[tokio::test]
async fn a_keyed_retry_answers_the_same_lease_and_other_names_are_another_request() {
    let app = TestApp::embedded().await;
    let keyed = |body: Value| app.keyed("/locks", "5d1f-group", body);
    let first = keyed(json!({"names": ["k:1", "k:2"], "ttl_ms": 5000})).await;
    assert_eq!(first.status, 201);
    let first = first.json();
    let retry = keyed(json!({"names": ["k:2", "k:1"], "ttl_ms": 5000})).await;
    assert_eq!(
        retry.status, 201,
        "the same names in another order are the same request"
    );
    assert_eq!(retry.json()["lease_id"], first["lease_id"]);
    let other = keyed(json!({"names": ["k:1", "k:3"], "ttl_ms": 5000})).await;
    assert_eq!(other.status, 422);
}

#[tokio::test]
async fn bad_names_are_a_clear_400() {
    let app = TestApp::embedded().await;
    let many: Vec<String> = (0..65).map(|i| format!("n:{i}")).collect();
    for body in [
        json!({}),
        json!({"names": []}),
        json!({"names": many}),
        json!({"names": ["a", "a"]}),
        json!({"names": ["a b"]}),
        json!({"names": ["a"], "mode": "shared"}),
        json!({"names": "a,,b"}),
        json!({"names": 7}),
        json!({"names": ["a"], "limit": 2}),
    ] {
        let (status, err) = grant_many(&app, body.clone()).await;
        assert_eq!(
            (status, err["error"].as_str()),
            (400, Some("invalid_request")),
            "{body}: {err}"
        );
    }
    assert_eq!(app.inspect("a").await.1["held"], false);
    let sixty_four: Vec<String> = (0..64).map(|i| format!("n:{i}")).collect();
    assert_eq!(grant_many(&app, json!({"names": sixty_four})).await.0, 201);
    // As a query parameter, the names are separated by commas.
    let (status, lease) = app
        .send("POST", "/locks?names=q:2,q:1&ttl_ms=5000", None)
        .await;
    assert_eq!(
        (status, &lease["names"]),
        (201, &json!(["q:1", "q:2"])),
        "{lease}"
    );
}

#[tokio::test]
async fn single_grants_queued_first_wait_behind_a_waiting_grant_of_several_names() {
    let app = TestApp::embedded().await;
    scenarios::singles_queued_first_wait_behind_a_waiting_grant_of_several_names(&app).await;
}
