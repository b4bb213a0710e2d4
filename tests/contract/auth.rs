//! Who may do what, in process: each route against each role and name prefix, listing
//! within prefixes, an administrator's depose, a token's request rate. Re-reading the
//! token file, force-release seen across replicas, and the client verbs' tokens stay in
//! `masters::auth`.

use crate::common;

use std::time::Duration;

use common::{TestApp, Tokens, call_as as call, config, tokens, wait_for};
use serde_json::{Value, json};

async fn app(tokens: &Tokens) -> TestApp {
    let mut cfg = config(&[]);
    cfg.auth_file = Some(tokens.file.path().to_str().unwrap().to_owned());
    TestApp::in_process(cfg).await
}

#[tokio::test]
async fn each_route_answers_each_role_and_prefix_as_the_contract_says() {
    let t = tokens();
    let app = app(&t).await;
    // A lease to renew, check and revoke, in scope and out of it.
    let grant = |name: &str, token: &str| {
        let (app, path, token) = (&app, format!("/locks/{name}"), token.to_owned());
        async move { call(app, "POST", &path, Some(&token)).await }
    };
    let (status, lease) = grant("jobs:a", &t.client).await;
    assert_eq!(status, 201, "{lease}");
    let id = lease["lease_id"].as_str().unwrap().to_owned();
    let (status, other) = grant("cron:a", &t.admin).await;
    assert_eq!(status, 201, "{other}");
    let other_id = other["lease_id"].as_str().unwrap().to_owned();

    let none: Option<&str> = None;
    let bad = Some("rlk_not-a-token");
    let (client, reader, admin) = (
        Some(t.client.as_str()),
        Some(t.reader.as_str()),
        Some(t.admin.as_str()),
    );
    let cases: Vec<(&str, String, Option<&str>, u16)> = vec![
        // No token, or an unknown one: 401, whatever the route.
        ("POST", "/locks/jobs:b".into(), none, 401),
        ("GET", "/locks/jobs:a".into(), bad, 401),
        ("GET", "/locks".into(), none, 401),
        ("POST", "/elections/jobs:e".into(), none, 401),
        // A client holds leases within its prefixes, and does nothing else.
        ("POST", "/locks/cron:b".into(), client, 403),
        ("PUT", format!("/locks/jobs:a/leases/{id}"), client, 200),
        ("GET", format!("/locks/jobs:a/leases/{id}"), client, 200),
        (
            "PUT",
            format!("/locks/cron:a/leases/{other_id}"),
            client,
            403,
        ),
        (
            "DELETE",
            format!("/locks/cron:a/leases/{other_id}"),
            client,
            403,
        ),
        ("GET", "/locks/jobs:a".into(), client, 403),
        ("GET", "/locks".into(), client, 403),
        ("DELETE", "/locks/jobs:a".into(), client, 403),
        ("DELETE", "/elections/jobs:e".into(), client, 403),
        ("POST", "/elections/jobs:e".into(), client, 201),
        ("POST", "/elections/cron:e".into(), client, 403),
        // A reader looks within its prefixes.
        ("GET", "/locks/jobs:a".into(), reader, 200),
        ("GET", "/locks/cron:a".into(), reader, 403),
        ("GET", "/locks".into(), reader, 200),
        ("GET", "/elections/jobs:e".into(), reader, 200),
        ("POST", "/locks/jobs:c".into(), reader, 403),
        ("PUT", format!("/locks/jobs:a/leases/{id}"), reader, 403),
        // An admin does everything, everywhere.
        ("GET", "/locks/cron:a".into(), admin, 200),
        ("POST", "/locks/anything".into(), admin, 201),
        // Probes and, by default, the operations routes stay open.
        ("GET", "/healthz".into(), none, 200),
        ("GET", "/readyz".into(), none, 200),
        ("GET", "/openapi.json".into(), none, 200),
        // Revoking needs the lease id and a token allowed on the name.
        ("DELETE", format!("/locks/jobs:a/leases/{id}"), client, 204),
    ];
    for (method, path, token, expected) in cases {
        let (status, body) = call(&app, method, &path, token).await;
        assert_eq!(status, expected, "{method} {path} with {token:?}: {body}");
        if status == 401 || status == 403 {
            let code = if status == 401 {
                "unauthorized"
            } else {
                "forbidden"
            };
            assert_eq!(body["error"], code, "{body}");
        }
    }
    let metrics = app.text("/metrics").await;
    assert!(
        metrics.contains(r#"redlockd_requests_total{kind="lock",op="grant",outcome="forbidden"}"#)
    );

    // No token and a token nobody knows are both 401, told apart, naming no token.
    let (_, missing) = call(&app, "GET", "/locks/jobs:a", none).await;
    assert!(
        missing["message"].as_str().unwrap().contains("is required"),
        "{missing}"
    );
    let (_, unknown) = call(&app, "GET", "/locks/jobs:a", bad).await;
    let unknown = unknown["message"].as_str().unwrap().to_owned();
    assert!(unknown.contains("not known"), "{unknown}");
    for name in ["ci-jobs", "grafana", "oncall"] {
        assert!(!unknown.contains(name), "{unknown}");
    }
    // Roles are named as the token file spells them.
    let (_, refused) = call(&app, "GET", "/locks", client).await;
    assert!(
        refused["message"].as_str().unwrap().contains("(client)"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_administrator_deposes_a_stuck_leader_and_the_next_candidate_leads() {
    let t = tokens();
    let app = app(&t).await;
    let (status, leader) = call(&app, "POST", "/elections/jobs:lead", Some(&t.client)).await;
    assert_eq!(status, 201, "{leader}");
    let term = leader["term"].as_u64().unwrap();
    // Refused while it leads, in the election's own words.
    let (status, refused) = call(&app, "POST", "/elections/jobs:lead", Some(&t.client)).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_held"))
    );
    assert_eq!(refused["message"], "another candidate leads this election");
    let candidate = {
        let (app, token) = (app.handle(), t.client.clone());
        tokio::spawn(async move {
            call(
                &app,
                "POST",
                "/elections/jobs:lead?wait_ms=10000&value=next",
                Some(&token),
            )
            .await
        })
    };
    app.wait_for_contention("jobs", 1).await;
    let (status, deposed) = call(&app, "DELETE", "/elections/jobs:lead", Some(&t.admin)).await;
    assert_eq!(status, 200, "{deposed}");
    assert_eq!(
        deposed,
        json!({"name": "jobs:lead", "released": true, "fencing_token": term})
    );
    let (status, next) = common::joined(candidate, "the next candidate is elected at once").await;
    assert_eq!(status, 201, "{next}");
    assert!(next["term"].as_u64().unwrap() > term);
    assert_eq!(next["value"], "next");
}

#[tokio::test]
async fn list_shows_only_the_names_the_token_may_see() {
    let t = tokens();
    let app = app(&t).await;
    for name in ["jobs:a", "cron:b", "jobs:c"] {
        let (status, _) = call(&app, "POST", &format!("/locks/{name}"), Some(&t.admin)).await;
        assert_eq!(status, 201);
    }
    let names = |body: Value| -> Vec<String> {
        body["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, seen) = call(&app, "GET", "/locks", Some(&t.reader)).await;
    assert_eq!(names(seen), ["jobs:a", "jobs:c"]);
    let (_, all) = call(&app, "GET", "/locks", Some(&t.admin)).await;
    assert_eq!(names(all), ["cron:b", "jobs:a", "jobs:c"]);
}

#[tokio::test]
async fn a_token_over_its_rate_is_429_and_others_are_not_slowed() {
    let t = tokens();
    let mut cfg = config(&[]);
    cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned());
    cfg.auth_rate = 2;
    let app = TestApp::in_process(cfg).await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(call(&app, "GET", "/locks/jobs:r", Some(&t.reader)).await.0);
    }
    assert_eq!(answers, [200, 200, 429], "a burst of two, then the rate");
    let resp = app
        .call("GET", "/locks/jobs:r")
        .bearer(&t.reader)
        .send()
        .await;
    assert_eq!(resp.status, 429);
    assert!(resp.header("retry-after").is_some());
    // Another token has its own allowance.
    assert_eq!(
        call(&app, "GET", "/locks/jobs:r", Some(&t.admin)).await.0,
        200
    );
    // And the first gets its back as time passes.
    wait_for(
        "the reader's allowance",
        Duration::from_secs(3),
        async || (call(&app, "GET", "/locks/jobs:r", Some(&t.reader)).await.0 == 200).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn every_documented_lock_and_election_operation_needs_a_token() {
    let t = tokens();
    let app = app(&t).await;
    let doc: Value = serde_json::from_str(&app.text("/openapi.json").await).unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !(path.starts_with("/locks") || path.starts_with("/elections")) {
            continue;
        }
        let uri = path
            .replace("{name}", "jobs:x")
            .replace("{lease_id}", "AAAAAAAAAAAAAAAAAAAAAA");
        for method in item.as_object().unwrap().keys() {
            let answer = app.call(&method.to_uppercase(), &uri).send_head().await;
            assert_eq!(answer.status, 401, "{method} {path} without a token");
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} operations");
}

#[tokio::test]
async fn a_grant_of_several_names_needs_every_name_within_the_tokens_prefixes() {
    let tokens = tokens();
    let app = app(&tokens).await;
    let client = Some(tokens.client.as_str());
    let (status, err) = call(&app, "POST", "/locks?names=jobs:a,other:b", client).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (403, Some("forbidden")),
        "{err}"
    );
    let reader = Some(tokens.reader.as_str());
    assert_eq!(
        call(&app, "GET", "/locks/jobs:a", reader).await.1["held"],
        false,
        "nothing taken"
    );
    let (status, lease) = call(&app, "POST", "/locks?names=jobs:a,jobs:b", client).await;
    assert_eq!(status, 201, "{lease}");
    assert_eq!(
        call(&app, "POST", "/locks?names=jobs:c", reader).await.0,
        403,
        "a reader may not hold"
    );
    assert_eq!(call(&app, "POST", "/locks?names=jobs:c", None).await.0, 401);
}

#[tokio::test]
async fn a_session_belongs_to_the_token_that_opened_it() {
    let t = tokens();
    let app = app(&t).await;
    let (status, session) = call(&app, "POST", "/sessions", Some(&t.client)).await;
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap();
    let path = format!("/sessions/{id}");
    assert_eq!(call(&app, "PUT", &path, Some(&t.client)).await.0, 200);
    // Another token (even an administrator's) finds no such session, and holds nothing
    // through it; a reader may not open one.
    for (method, path) in [
        ("PUT", path.clone()),
        ("GET", path.clone()),
        ("DELETE", path.clone()),
        ("POST", format!("/locks/jobs:s?session={id}")),
    ] {
        let (status, body) = call(&app, method, &path, Some(&t.admin)).await;
        assert_eq!(
            (status, &body["error"]),
            (404, &json!("session_not_found")),
            "{method} {path}: {body}"
        );
    }
    assert_eq!(
        call(&app, "POST", "/sessions", Some(&t.reader)).await.0,
        403
    );
    let through = format!("/locks/jobs:s?session={id}");
    let (status, held) = call(&app, "POST", &through, Some(&t.client)).await;
    assert_eq!(status, 201, "{held}");
    assert_eq!(call(&app, "DELETE", &path, Some(&t.client)).await.0, 204);
}

/// With REDLOCKD_AUTH_PROTECT_OPERATIONS, the operations routes (`/metrics`,
/// `/openapi.json`, `/docs`, and the docs site at `/book/`) need a reader token; probes stay
/// open. Without it they are open to anyone.
#[tokio::test]
async fn protected_operations_need_a_token_and_open_ones_do_not() {
    let t = tokens();
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.html"), "<h1>redlockd</h1>").unwrap();
    for protect in [true, false] {
        let mut cfg = config(&[]);
        cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned());
        cfg.auth_protect_operations = protect;
        cfg.book_dir = Some(site.path().to_owned());
        let app = TestApp::in_process(cfg).await;
        for path in ["/metrics", "/openapi.json", "/docs/", "/book/"] {
            let (status, body) = call(&app, "GET", path, None).await;
            let expected = if protect { 401 } else { 200 };
            assert_eq!(status, expected, "{path} (protected: {protect}): {body}");
            let (status, body) = call(&app, "GET", path, Some(&t.reader)).await;
            assert_eq!(status, 200, "{path} with a reader token: {body}");
        }
        for probe in ["/healthz", "/readyz"] {
            assert_eq!(call(&app, "GET", probe, None).await.0, 200, "{probe}");
        }
    }
}
