//! Who may lock what: bearer tokens from REDLOCKD_AUTH_FILE, roles and name prefixes on
//! every route, the administrator's force-release, re-reading the file on SIGHUP, and no
//! token in any log line or metric.

use crate::common;

use common::SendJson as _;

use std::time::Duration;

use common::{RedisMaster, Server, TestApp, config, masters, wait_for, write_tokens as write};
use common::{Tokens, call_as as call, tokens};
use redlockd::auth::{Role, TokenEntry, new_token};
use serde_json::{Value, json};

async fn app(masters: &[RedisMaster], tokens: &Tokens) -> TestApp {
    let mut cfg = config(masters);
    cfg.auth_file = Some(tokens.file.path().to_str().unwrap().to_owned());
    TestApp::spawn(cfg).await
}

/// A held stream of `route` (a 30 s lease) opened with `token`.
async fn held_as(app: &TestApp, route: &str, token: &str) -> common::EventStream {
    let body = json!({"ttl_ms": 30_000});
    app.call("POST", route)
        .bearer(token)
        .json(&body)
        .stream()
        .await
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
    let mut stream = held_as(&app, "/locks/jobs:g", &t.client).await;
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
    let path = format!("/locks/jobs:f/leases/{id}");
    let (status, _) = call(&app, "PUT", &path, Some(&t.client)).await;
    assert_eq!(status, 404, "the removed holder's renew");
    let (status, next) =
        common::joined(waiter, "the waiter is woken, not left to its wait_ms").await;
    assert_eq!(status, 201, "{next}");
    assert!(next["fencing_token"].as_u64().unwrap() > token);

    // Through another replica: the stream's replica learns it from the masters, and says
    // which it was: force-released by an administrator, or revoked with its lease id.
    let other = TestApp::over(&masters, |cfg| {
        cfg.auth_file = Some(t.file.path().to_str().unwrap().to_owned())
    })
    .await;
    call(&other, "DELETE", "/locks/jobs:g", Some(&t.admin)).await;
    let lost = stream.expect("lost").await;
    assert_eq!(lost["reason"], "force_released", "{lost}");
    assert!(
        lost["message"].as_str().unwrap().contains("administrator"),
        "{lost}"
    );
    let mut revoked = held_as(&app, "/locks/jobs:h", &t.client).await;
    let granted = revoked.expect("granted").await;
    let lease = granted["lease_id"].as_str().unwrap();
    let path = format!("/locks/jobs:h/leases/{lease}");
    let (status, _) = call(&other, "DELETE", &path, Some(&t.client)).await;
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
    let http = common::http();
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
        .value()
        .await;
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
