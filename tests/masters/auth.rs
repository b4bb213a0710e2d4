//! Who may lock what: bearer tokens from REDLOCKD_AUTH_FILE, roles and name prefixes on
//! every route, the administrator's force-release, re-reading the file on SIGHUP, and no
//! token in any log line or metric.

use crate::common;

use std::time::Duration;

use common::{RedisMaster, Server, TestApp, config, masters, wait_for};
use redlockd::auth::{Role, TokenEntry, new_token};
use serde_json::{Value, json};

struct Tokens {
    client: String,
    reader: String,
    admin: String,
    file: tempfile::NamedTempFile,
}

fn write(file: &std::path::Path, entries: &[TokenEntry]) {
    std::fs::write(file, json!({ "tokens": entries }).to_string()).unwrap();
}

fn tokens() -> Tokens {
    let (client, c) = new_token("ci-jobs", Role::Client, vec!["jobs:".into()]);
    let (reader, r) = new_token("grafana", Role::Reader, vec!["jobs:".into()]);
    let (admin, a) = new_token("oncall", Role::Admin, vec![]);
    let file = tempfile::NamedTempFile::new().unwrap();
    write(file.path(), &[c, r, a]);
    Tokens {
        client,
        reader,
        admin,
        file,
    }
}

async fn app(masters: &[RedisMaster], tokens: &Tokens) -> TestApp {
    let refs: Vec<&RedisMaster> = masters.iter().collect();
    let mut cfg = config(&refs);
    cfg.auth_file = Some(tokens.file.path().to_str().unwrap().to_owned());
    TestApp::spawn(cfg).await
}

/// `method path` with `token` (if any); the status and the JSON body.
async fn call(app: &TestApp, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = app.http.request(method, app.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    if status == 401 {
        assert_eq!(
            resp.headers()["www-authenticate"].to_str().unwrap(),
            "Bearer realm=\"redlockd\""
        );
    }
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn each_route_answers_each_role_and_prefix_as_the_contract_says() {
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
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
    assert!(metrics.contains(r#"redlockd_requests_total{op="grant",outcome="forbidden"}"#));

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
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
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
        let (http, url, token) = (
            app.http.clone(),
            app.url("/elections/jobs:lead?wait_ms=10000&value=next"),
            t.client.clone(),
        );
        tokio::spawn(async move {
            let resp = http.post(url).bearer_auth(token).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        })
    };
    app.wait_for_contention("jobs", 1).await;
    let (status, deposed) = call(&app, "DELETE", "/elections/jobs:lead", Some(&t.admin)).await;
    assert_eq!(status, 200, "{deposed}");
    assert_eq!(
        deposed,
        json!({"name": "jobs:lead", "released": true, "fencing_token": term})
    );
    let (status, next) = tokio::time::timeout(Duration::from_secs(2), candidate)
        .await
        .expect("the next candidate is elected at once")
        .unwrap();
    assert_eq!(status, 201, "{next}");
    assert!(next["term"].as_u64().unwrap() > term);
    assert_eq!(next["value"], "next");
}

#[tokio::test]
async fn list_shows_only_the_names_the_token_may_see() {
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
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
async fn force_release_removes_the_holder_and_the_next_grant_gets_a_greater_token() {
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
    let (_, held) = call(&app, "POST", "/locks/jobs:f", Some(&t.client)).await;
    let (id, token) = (
        held["lease_id"].as_str().unwrap().to_owned(),
        held["fencing_token"].as_u64().unwrap(),
    );
    // A stream holding a lease is told it was released.
    let mut stream = common::EventStream::open(
        app.http
            .post(app.url("/locks/jobs:g"))
            .bearer_auth(&t.client)
            .json(&json!({"ttl_ms": 30_000})),
    )
    .await;
    stream.expect("granted").await;

    // A grant waiting for it is woken when it is removed.
    let waiter = {
        let (http, url, token) = (
            app.http.clone(),
            app.url("/locks/jobs:f?wait_ms=10000"),
            t.client.clone(),
        );
        tokio::spawn(async move {
            let resp = http.post(url).bearer_auth(token).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        })
    };
    app.wait_for_contention("jobs", 1).await;
    let (status, removed) = call(&app, "DELETE", "/locks/jobs:f", Some(&t.admin)).await;
    assert_eq!(status, 200, "{removed}");
    assert_eq!(
        removed,
        json!({"name": "jobs:f", "released": true, "fencing_token": token})
    );
    let (status, _) = call(
        &app,
        "PUT",
        &format!("/locks/jobs:f/leases/{id}"),
        Some(&t.client),
    )
    .await;
    assert_eq!(status, 404, "the removed holder's renew");
    let (status, next) = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter is woken, not left to its wait_ms")
        .unwrap();
    assert_eq!(status, 201, "{next}");
    assert!(next["fencing_token"].as_u64().unwrap() > token);

    // Through another replica: the stream's replica learns it from the masters, and says
    // which it was: force-released by an administrator, or revoked with its lease id.
    let refs: Vec<&RedisMaster> = masters.iter().collect();
    let mut cfg = config(&refs);
    cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned());
    let other = TestApp::spawn(cfg).await;
    call(&other, "DELETE", "/locks/jobs:g", Some(&t.admin)).await;
    let lost = stream.expect("lost").await;
    assert_eq!(lost["reason"], "force_released", "{lost}");
    assert!(
        lost["message"].as_str().unwrap().contains("administrator"),
        "{lost}"
    );
    let mut revoked = common::EventStream::open(
        app.http
            .post(app.url("/locks/jobs:h"))
            .bearer_auth(&t.client)
            .json(&json!({"ttl_ms": 30_000})),
    )
    .await;
    let granted = revoked.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap();
    let (status, _) = call(
        &other,
        "DELETE",
        &format!("/locks/jobs:h/leases/{lease}"),
        Some(&t.client),
    )
    .await;
    assert_eq!(status, 204);
    let lost = revoked.expect("lost").await;
    assert_eq!(lost["reason"], "released", "{lost}");
    assert!(
        lost["message"].as_str().unwrap().contains("lease id"),
        "{lost}"
    );
    assert!(
        !lost["message"].as_str().unwrap().contains("administrator"),
        "{lost}"
    );

    let (_, nobody) = call(&app, "DELETE", "/locks/jobs:none", Some(&t.admin)).await;
    assert_eq!(nobody, json!({"name": "jobs:none", "released": false}));
}

#[tokio::test]
async fn sighup_rereads_the_token_file_and_a_malformed_one_keeps_the_old_tokens() {
    let (first, a) = new_token("first", Role::Client, vec!["".into()]);
    let (second, b) = new_token("second", Role::Client, vec!["".into()]);
    // In both versions of the file: its requests run on through every reload.
    let (steady, s) = new_token("steady", Role::Client, vec!["steady:".into()]);
    let file = tempfile::NamedTempFile::new().unwrap();
    write(file.path(), &[a.clone(), s.clone()]);
    let path = file.path().to_str().unwrap().to_owned();
    let server = Server::start(&[
        ("REDLOCKD_AUTH_FILE", &path),
        ("RUST_LOG", "trace"),
        ("REDLOCKD_LOG_FORMAT", "json"),
    ])
    .await;
    let http = reqwest::Client::new();
    let grant = |token: String, name: &'static str| {
        let (http, url) = (http.clone(), format!("{}/locks/{name}", server.base));
        async move {
            http.post(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(grant(first.clone(), "a").await, 201);
    assert_eq!(grant(second.clone(), "b").await, 401);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (http, base, stop) = (http.clone(), server.base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let resp = http
                    .post(format!("{base}/locks/steady:x?ttl_ms=1000"))
                    .bearer_auth(&steady)
                    .send()
                    .await
                    .unwrap();
                answers.push(resp.status().as_u16());
                if let Ok(lease) = resp.json::<Value>().await
                    && let Some(id) = lease["lease_id"].as_str()
                {
                    let url = format!("{base}/locks/steady:x/leases/{id}");
                    answers.push(
                        http.delete(url)
                            .bearer_auth(&steady)
                            .send()
                            .await
                            .unwrap()
                            .status()
                            .as_u16(),
                    );
                }
            }
            answers
        })
    };
    // A lease held across the reload: its renew goes on working.
    let held: Value = http
        .post(format!("{}/locks/kept?ttl_ms=60000", server.base))
        .bearer_auth(&first)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let renew = format!(
        "{}/locks/kept/leases/{}",
        server.base,
        held["lease_id"].as_str().unwrap()
    );

    // The second replaces the first.
    write(file.path(), &[b.clone(), s.clone()]);
    hangup(&server);
    wait_for("the new token", Duration::from_secs(5), async || {
        (grant(second.clone(), "c").await == 201).then_some(())
    })
    .await;
    assert_eq!(grant(first.clone(), "d").await, 401, "the removed token");
    let renewed = http.put(&renew).bearer_auth(&second).send().await.unwrap();
    assert_eq!(renewed.status(), 200, "leases outlive a reload");

    // A malformed file is refused; the tokens in force stay.
    std::fs::write(file.path(), "{\"tokens\": [{\"name\": \"x\"}]}").unwrap();
    hangup(&server);
    wait_for(
        "the refusal in the log",
        Duration::from_secs(5),
        async || server.logs().contains("token file refused").then_some(()),
    )
    .await;
    assert_eq!(grant(second.clone(), "e").await, 201);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = load.await.unwrap();
    assert!(
        answers.len() >= 4,
        "requests ran through the reloads: {answers:?}"
    );
    assert!(
        answers.iter().all(|s| *s == 201 || *s == 204),
        "a token kept through the reloads was refused: {answers:?}"
    );

    // No token, and no hash of one, reaches a log line or a metric.
    let metrics = server.text("/metrics").await;
    let logs = server.logs();
    for secret in [&first, &second, &a.sha256, &b.sha256] {
        assert!(!logs.contains(secret.as_str()), "a secret reached the log");
        assert!(
            !metrics.contains(secret.as_str()),
            "a secret reached /metrics"
        );
    }
    assert!(
        logs.contains(r#""caller":"second""#),
        "the token's name is logged"
    );
}

fn hangup(server: &Server) {
    common::signal(server.child.id(), "-HUP");
}

#[test]
fn a_malformed_token_file_stops_the_process_and_names_the_variable() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "not json").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
        .env_clear()
        .env("REDLOCKD_LISTEN", "127.0.0.1:0")
        .env("REDLOCKD_AUTH_FILE", file.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("REDLOCKD_AUTH_FILE"), "{stderr}");
}

#[test]
fn token_new_prints_a_token_and_the_line_for_the_file() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
        .args([
            "token", "new", "--name", "ci", "--role", "client", "--prefix", "jobs:",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let token = text
        .lines()
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .to_owned();
    let entry: TokenEntry = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!((entry.name.as_str(), entry.role), ("ci", Role::Client));
    assert!(!text.lines().last().unwrap().contains(&token));
    let tokens = redlockd::auth::Tokens::parse(&json!({ "tokens": [entry] }).to_string()).unwrap();
    assert!(tokens.authenticate(&token).is_some());
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_redlockd"))
        .args(["token", "new", "--name", "ci", "--role", "client"])
        .output()
        .unwrap();
    assert_eq!(
        usage.status.code(),
        Some(64),
        "a client token needs a prefix"
    );
}

#[tokio::test]
async fn the_client_verbs_send_the_token_from_redlockd_token() {
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
    let lock = |token: Option<&str>, name: &str| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlockd"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("REDLOCKD_SERVER", &app.base)
            .args(["lock", name, "--", "true"]);
        if let Some(token) = token {
            cmd.env("REDLOCKD_TOKEN", token);
        }
        cmd.output()
    };
    let out = lock(Some(&t.client), "jobs:cli").await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lock(None, "jobs:cli").await.unwrap();
    assert_eq!(out.status.code(), Some(64), "refused without a token");
    let out = lock(Some(&t.client), "cron:cli").await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "refused outside the token's prefixes"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the token's prefixes"));
}

#[tokio::test]
async fn a_token_over_its_rate_is_429_and_others_are_not_slowed() {
    let masters = masters(3);
    let t = tokens();
    let refs: Vec<&RedisMaster> = masters.iter().collect();
    let mut cfg = config(&refs);
    cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned());
    cfg.auth_rate = 2;
    let app = TestApp::spawn(cfg).await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(call(&app, "GET", "/locks/jobs:r", Some(&t.reader)).await.0);
    }
    assert_eq!(answers, [200, 200, 429], "a burst of two, then the rate");
    let resp = app
        .http
        .get(app.url("/locks/jobs:r"))
        .bearer_auth(&t.reader)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
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
async fn a_token_file_that_changes_is_read_again_without_a_signal() {
    let masters = masters(3);
    let t = tokens();
    let app = app(&masters, &t).await;
    let (fresh, entry) = new_token("rolled", Role::Reader, vec!["".into()]);
    assert_eq!(call(&app, "GET", "/locks/x", Some(&fresh)).await.0, 401);
    // As a Kubernetes Secret volume is updated: the file changes, nobody sends SIGHUP.
    write(t.file.path(), &[entry]);
    wait_for(
        "the changed file to be read",
        Duration::from_secs(10),
        async || (call(&app, "GET", "/locks/x", Some(&fresh)).await.0 == 200).then_some(()),
    )
    .await;
    assert_eq!(
        call(&app, "GET", "/locks/jobs:x", Some(&t.reader)).await.0,
        401
    );
}
