//! HTTP under abuse: clients that trickle their headers or bodies, and more connections
//! than the service allows. Every answer from our own layers has the contract's error body.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, config, masters};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);

async fn app(max_connections: usize) -> (Vec<common::RedisMaster>, TestApp) {
    let ms = masters(1);
    let mut cfg = config(&ms[..1]);
    cfg.client_timeout_ms = CLIENT_TIMEOUT.as_millis() as u64;
    cfg.max_connections = max_connections;
    let app = TestApp::spawn(cfg).await;
    (ms, app)
}

fn addr(app: &TestApp) -> String {
    app.base.trim_start_matches("http://").to_owned()
}

/// Read until the peer closes or `deadline` passes; what was read.
async fn read_all(stream: &mut TcpStream, deadline: Duration) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(deadline, stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_not_503() {
    let (_ms, app) = app(100).await;
    let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
    stream
        .write_all(
            b"POST /locks/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"ttl",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let answer = read_all(&mut stream, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""error":"request_timeout""#), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // Nothing was granted for the slow request.
    let (_, status) = app.inspect("slow").await;
    assert_eq!(status["held"], false);
}

#[tokio::test]
async fn headers_that_do_not_arrive_in_time_close_the_connection() {
    let (_ms, app) = app(100).await;
    let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let started = Instant::now();
    let _ = read_all(&mut stream, Duration::from_secs(5)).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "an unfinished header block held the connection for {took:?}"
    );
}

#[tokio::test]
async fn connections_past_the_cap_wait_for_one_to_close() {
    let (_ms, app) = app(2).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr(&app)).await.unwrap();
        // A complete keep-alive request: the connection stays open afterwards.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.unwrap();
        idle.push(s);
    }
    // The third is accepted by the kernel but not served while two are open.
    let third = tokio::spawn({
        let http = app.http.clone();
        let url = app.url("/healthz");
        async move { http.get(url).send().await.map(|r| r.status().as_u16()) }
    });
    tokio::time::sleep(CLIENT_TIMEOUT / 3).await;
    assert!(!third.is_finished(), "served past the connection cap");
    drop(idle.pop());
    let status = common::joined_within(
        third,
        Duration::from_secs(5),
        "served once a connection closed",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
}
