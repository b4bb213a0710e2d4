//! The redlockd binary as an operator runs it: configuration errors stop it with the
//! variable named, the embedded store serves with no Redis, secrets never reach the logs.

use crate::common;

use common::SendJson as _;

use std::io::Read as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{RedisMaster, Server, wait_for};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");

/// Run the binary to completion (it must exit by itself); returns (exit code, stderr).
fn run_to_exit(envs: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_clear()
        .env("REDLOCKD_LISTEN", "127.0.0.1:0")
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redlockd");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("redlockd did not exit with {envs:?}");
        }
        std::thread::sleep(common::POLL);
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (status.code().unwrap_or(-1), stderr)
}

#[test]
fn a_bad_configuration_stops_the_process_and_names_the_variable() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("REDLOCKD_DEFAULT_TTL_MS", "50")],
            "REDLOCKD_DEFAULT_TTL_MS",
        ),
        (
            &[
                ("REDLOCKD_DEFAULT_TTL_MS", "9000"),
                ("REDLOCKD_MAX_TTL_MS", "5000"),
            ],
            "REDLOCKD_DEFAULT_TTL_MS",
        ),
        (&[("REDLOCKD_MAX_WAIT_MS", "soon")], "REDLOCKD_MAX_WAIT_MS"),
        (
            &[("REDLOCKD_MAX_LOCK_DELAY_MS", "60001")],
            "REDLOCKD_MAX_LOCK_DELAY_MS",
        ),
        (&[("REDLOCKD_DRIFT_FACTOR", "-1")], "REDLOCKD_DRIFT_FACTOR"),
        (
            &[("REDLOCKD_REDIS_URLS", "http://127.0.0.1:1")],
            "REDLOCKD_REDIS_URLS",
        ),
        (
            &[("REDLOCKD_REDIS_URLS", "redis://:hunter2@[::1")],
            "REDLOCKD_REDIS_URLS",
        ),
        (
            &[
                (
                    "REDLOCKD_REDIS_URLS",
                    "redis://127.0.0.1:1,redis://127.0.0.1:2",
                ),
                ("REDLOCKD_REQUIRE_ODD", "true"),
            ],
            "REDLOCKD_REDIS_URLS",
        ),
        (&[("REDLOCKD_LISTEN", "not an address")], "REDLOCKD_LISTEN"),
    ];
    for (envs, variable) in cases {
        let (code, stderr) = run_to_exit(envs, &[]);
        assert_ne!(code, 0, "{envs:?} must stop the process");
        assert!(
            stderr.contains(variable),
            "{envs:?}: stderr does not name {variable}:\n{stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "a password reached stderr:\n{stderr}"
        );
    }
}

#[tokio::test]
async fn with_no_redis_it_serves_from_the_embedded_store() {
    let server = Server::start(&[]).await;
    let http = common::http();
    let resp = server.post("/locks/dev?ttl_ms=5000").await;
    assert_eq!(resp.status(), 201);
    let ready: serde_json::Value = http.get(format!("{}/readyz", server.base)).value().await;
    assert_eq!(ready["backend"], "embedded");
    assert!(
        server.logs().contains("embedded in-process store"),
        "the log announces the embedded store"
    );
}

#[tokio::test]
async fn redis_passwords_reach_no_log_line_and_no_readyz() {
    let password = "s3cret-Pa55word";
    let ms: Vec<RedisMaster> = (0..3)
        .map(|_| RedisMaster::start_with(Some(password), &[]))
        .collect();
    // The deployment is initialised while every master answers; then the third URL carries
    // a wrong password, so that authentication errors get logged too.
    let mut urls: Vec<String> = ms.iter().map(RedisMaster::url).collect();
    {
        let first = Server::start(&[("REDLOCKD_REDIS_URLS", &urls.join(","))]).await;
        first.wait_ready("the masters to be initialised").await;
    }
    urls[2] = urls[2].replace(password, "wr0ng-Pa55word");
    let server = Server::start(&[("REDLOCKD_REDIS_URLS", &urls.join(","))]).await;
    let http = common::http();
    let resp = http
        .post(format!("{}/locks/secret-test", server.base))
        .json(&json!({"owner": "me"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        201,
        "two masters with the right password are a majority"
    );
    let ready = server.text("/readyz").await;
    let metrics = server.text("/metrics").await;
    for text in [&ready, &metrics, &server.logs()] {
        assert!(!text.contains(password), "the password leaked:\n{text}");
        assert!(
            !text.contains("wr0ng-Pa55word"),
            "the wrong password leaked:\n{text}"
        );
    }
    assert!(
        ready.contains(&format!("redis://127.0.0.1:{}", ms[0].port)),
        "{ready}"
    );
}

#[tokio::test]
async fn access_logs_are_structured_and_never_carry_the_lease_id() {
    let server = Server::start(&[("REDLOCKD_LOG_FORMAT", "json")]).await;
    let http = common::http();
    let lease: serde_json::Value = http
        .post(format!("{}/locks/audit:1", server.base))
        .header("x-request-id", "req-under-test")
        .value()
        .await;
    let id = lease["lease_id"].as_str().unwrap().to_owned();
    let lease_url = format!("{}/locks/audit:1/leases/{id}", server.base);
    assert_eq!(http.put(&lease_url).send().await.unwrap().status(), 200);
    assert_eq!(http.get(&lease_url).send().await.unwrap().status(), 200);
    assert_eq!(http.delete(&lease_url).send().await.unwrap().status(), 204);
    assert_eq!(http.delete(&lease_url).send().await.unwrap().status(), 404);
    // A name sent percent-encoded is logged as the handler parsed it; a malformed one,
    // refused before any lock is touched, is logged under no name.
    let encoded = format!("{}/locks/audit%3A2", server.base);
    assert_eq!(http.post(&encoded).send().await.unwrap().status(), 201);
    let malformed = format!("{}/locks/audit%202", server.base);
    assert_eq!(http.post(&malformed).send().await.unwrap().status(), 400);

    let lines = wait_for("seven access lines", Duration::from_secs(5), async || {
        let access: Vec<serde_json::Value> = server
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["target"] == "redlockd::access")
            .filter(|l| l["route"].as_str().is_some_and(|r| r.starts_with("/locks")))
            .collect();
        (access.len() >= 7).then_some(access)
    })
    .await;
    let grant = &lines[0];
    assert_eq!(grant["request_id"], "req-under-test");
    assert_eq!(grant["method"], "POST");
    assert_eq!(grant["route"], "/locks/{name}");
    assert_eq!(grant["lock"], "audit:1");
    assert_eq!(grant["status"], 201);
    assert_eq!(grant["outcome"], "ok");
    assert!(grant["latency_ms"].as_f64().is_some());
    let revoke_again = &lines[4];
    assert_eq!(revoke_again["route"], "/locks/{name}/leases/{lease_id}");
    assert_eq!(revoke_again["outcome"], "lease_not_found");
    assert_eq!(lines[5]["lock"], "audit:2", "{}", lines[5]);
    assert_eq!(lines[6]["status"], 400);
    assert_eq!(lines[6]["lock"], "-", "{}", lines[6]);
    assert!(!server.logs().contains(&id), "the lease id reached the log");
}

#[tokio::test]
async fn sigterm_lets_requests_in_flight_finish_and_leaves_leases_held() {
    let ms: Vec<RedisMaster> = (0..3).map(|_| RedisMaster::start()).collect();
    let urls: Vec<String> = ms.iter().map(RedisMaster::url).collect();
    let mut server = Server::start(&[
        ("REDLOCKD_REDIS_URLS", &urls.join(",")),
        ("REDLOCKD_SHUTDOWN_GRACE_MS", "5000"),
    ])
    .await;
    let http = common::http();
    let held = server.post("/locks/drain").await;
    assert_eq!(held.status(), 201);
    let waiter = tokio::spawn({
        let http = http.clone();
        let url = format!("{}/locks/drain", server.base);
        async move {
            let resp = http
                .post(url)
                .json(&json!({"wait_ms": 30000}))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    });
    wait_for("the waiter to queue", Duration::from_secs(5), async || {
        let metrics = http
            .get(format!("{}/metrics", server.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        metrics
            .contains(r#"redlockd_contention_total{lock_class="drain"} 1"#)
            .then_some(())
    })
    .await;

    let signalled = std::time::Instant::now();
    common::signal(server.child.id(), "-TERM");
    let (status, body) = waiter.await.unwrap();
    assert_eq!(status, 503, "{body}");
    // Not "quorum_unavailable": the masters are fine, this replica is stopping.
    assert_eq!(body["error"], "shutting_down");
    assert!(
        body["message"].as_str().unwrap().contains("shutting down"),
        "{body}"
    );
    let exit = wait_for("the process to exit", Duration::from_secs(8), async || {
        server.child.try_wait().unwrap()
    })
    .await;
    assert!(exit.success(), "exit status {exit:?}");
    let took = signalled.elapsed();
    eprintln!("exited {took:?} after SIGTERM");
    assert!(
        took < Duration::from_millis(5000),
        "within the 5 s grace period: {took:?}"
    );
    assert!(server.logs().contains("shutting down"));
    // The lease belongs to its client: it is still held on the masters.
    let held: u32 = ms[0].cmd(&["EXISTS", "redlockd:lock:drain"]).await.unwrap();
    assert_eq!(held, 1);
}

#[tokio::test]
async fn healthcheck_exits_zero_only_when_the_server_answers() {
    let server = Server::start(&[]).await;
    let listen = server.base.trim_start_matches("http://").to_owned();
    let (code, stderr) = run_to_exit(&[("REDLOCKD_LISTEN", &listen)], &["healthcheck"]);
    assert_eq!(code, 0, "{stderr}");
    let wildcard = listen.replace("127.0.0.1", "0.0.0.0");
    let (code, _) = run_to_exit(&[("REDLOCKD_LISTEN", &wildcard)], &["healthcheck"]);
    assert_eq!(code, 0, "a wildcard address is asked on loopback");
    drop(server);
    let (code, stderr) = run_to_exit(&[("REDLOCKD_LISTEN", &listen)], &["healthcheck"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn openapi_subcommand_prints_the_document() {
    let out = Command::new(BIN)
        .arg("openapi")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        redlockd::http::openapi_json()
    );
}

/// Run a command that must succeed.
fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn rediss_masters_are_reached_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let path = |f: &str| dir.path().join(f).display().to_string();
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=redlockd test CA",
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.pem"),
        ]));
    run(Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .args(["-keyout", &path("server.key"), "-out", &path("server.csr")]));
    std::fs::write(path("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .args([
            "-in",
            &path("server.csr"),
            "-CA",
            &path("ca.pem"),
            "-CAkey",
            &path("ca.key"),
            "-out",
            &path("server.pem"),
            "-extfile",
            &path("ext.cnf"),
        ]));
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _redis = KillOnDrop(
        Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args([
                "--tls-cert-file",
                &path("server.pem"),
                "--tls-key-file",
                &path("server.key"),
            ])
            .args([
                "--tls-ca-cert-file",
                &path("ca.pem"),
                "--tls-auth-clients",
                "no",
                "--dir",
                &path(""),
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server with TLS"),
    );
    wait_for("the TLS port", Duration::from_secs(10), async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;

    let url = format!("rediss://127.0.0.1:{port}");
    let ca = path("ca.pem");
    let server = Server::start(&[("REDLOCKD_REDIS_URLS", &url), ("SSL_CERT_FILE", &ca)]).await;
    let resp = server.post("/locks/tls").await;
    assert_eq!(resp.status(), 201, "logs:\n{}", server.logs());
}

/// A child process ended when the test ends, however it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn recover_puts_masters_that_lost_their_data_back_with_rising_tokens() {
    let mut ms: Vec<RedisMaster> = (0..3).map(|_| RedisMaster::start()).collect();
    let urls: Vec<String> = ms.iter().map(RedisMaster::url).collect();
    let urls = urls.join(",");
    let first_token = {
        let server = Server::start(&[("REDLOCKD_REDIS_URLS", &urls)]).await;
        server.wait_ready("ready").await;
        let lease: serde_json::Value = server.post("/locks/r").await.json().await.unwrap();
        lease["fencing_token"].as_u64().expect("granted")
    };
    ms[1].restart_empty();
    ms[2].restart_empty();
    let recover = |force: bool| {
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("REDLOCKD_REDIS_URLS", &urls)
            .arg("recover");
        if force {
            cmd.arg("--force");
        }
        cmd.output().expect("run redlockd recover")
    };
    let refused = recover(false);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("REDLOCKD_MAX_TTL_MS"), "{why}");
    let done = recover(true);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(String::from_utf8_lossy(&done.stdout).contains("recovered"));

    let server = Server::start(&[("REDLOCKD_REDIS_URLS", &urls)]).await;
    server.wait_ready("ready after the recovery").await;
    let lease: serde_json::Value = server.post("/locks/r2").await.json().await.unwrap();
    let token = lease["fencing_token"].as_u64().expect("granted");
    assert!(token > first_token, "{token} after {first_token}");
}

#[test]
fn help_never_prints_a_password_from_the_environment() {
    let out = Command::new(BIN)
        .arg("--help")
        .env(
            "REDLOCKD_REDIS_URLS",
            "redis://:hunter2-Secret@10.0.0.5:6379",
        )
        .output()
        .expect("run redlockd --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("REDLOCKD_REDIS_URLS"), "{help}");
    assert!(
        !help.contains("hunter2"),
        "--help printed a password:\n{help}"
    );
}

#[tokio::test]
async fn an_administrators_release_of_a_fleetlock_slot_is_audited() {
    let server = Server::start(&[("REDLOCKD_LOG_FORMAT", "json")]).await;
    let http = common::http();
    let taken = http
        .post(format!("{}/fleetlock/v1/pre-reboot", server.base))
        .header("fleet-lock-protocol", "true")
        .json(&serde_json::json!({"client_params": {"id": "node-7", "group": "default"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 200);
    let release = format!("{}/fleetlock/v1/groups/default/nodes/node-7", server.base);
    for released in [true, false] {
        let answer: serde_json::Value = http.delete(&release).value().await;
        assert_eq!(answer["released"], released, "{answer}");
    }
    let audited = wait_for("two audit lines", Duration::from_secs(5), async || {
        let lines: Vec<serde_json::Value> = server
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|l| l["target"] == "redlockd::audit")
            .collect();
        (lines.len() >= 2).then_some(lines)
    })
    .await;
    for (line, released) in audited.iter().zip([true, false]) {
        assert_eq!(line["group"], "default", "{line}");
        assert_eq!(line["node"], "node-7", "{line}");
        assert_eq!(line["released"], released, "{line}");
        assert!(
            line["administrator"]
                .as_str()
                .is_some_and(|a| a.contains("anonymous")),
            "{line}"
        );
    }
}
