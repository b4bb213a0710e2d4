//! The redlockd binary as an operator runs it: configuration errors stop it with the
//! variable named, the embedded store serves with no Redis, secrets never reach the logs.

mod common;

use std::io::Read as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{RedisMaster, wait_for};
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
        std::thread::sleep(Duration::from_millis(10));
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

/// A redlockd process serving on a free port, killed on drop.
struct Server {
    child: Child,
    base: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    async fn start(envs: &[(&str, &str)]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(BIN)
            .env_clear()
            .env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "debug")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn redlockd");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            stderr,
        };
        let http = reqwest::Client::new();
        wait_for("redlockd to serve", Duration::from_secs(10), async || {
            http.get(format!("{}/healthz", server.base))
                .send()
                .await
                .ok()
                .map(drop)
        })
        .await;
        server
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn with_no_redis_it_serves_from_the_embedded_store() {
    let server = Server::start(&[]).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/locks/dev?ttl_ms=5000", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let ready: serde_json::Value = http
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    // The third URL carries a wrong password, so that authentication errors get logged too.
    let mut urls: Vec<String> = ms.iter().map(RedisMaster::url).collect();
    urls[2] = urls[2].replace(password, "wr0ng-Pa55word");
    let server = Server::start(&[("REDLOCKD_REDIS_URLS", &urls.join(","))]).await;
    let http = reqwest::Client::new();
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
    let ready = http
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let metrics = http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
