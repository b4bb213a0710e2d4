//! Grant latency and throughput over HTTP with three local redis-server masters.
//!
//! `cargo bench --bench grant` starts three masters on free loopback ports and redlockd in
//! process, then for each concurrency level runs a fixed number of grant + revoke pairs on
//! distinct names and prints throughput and grant latency percentiles. It also measures
//! contended grants (one name, many clients) and the engine alone, without HTTP.
//! Bounded in count: every request goes to 127.0.0.1.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestApp, config, masters};
use redlockd::metrics::Metrics;
use redlockd::redlock::node::LockNode;
use redlockd::redlock::{EngineConfig, Redlock};
use redlockd::store::redis::RedisNode;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn report(label: &str, mut latencies: Vec<Duration>, took: Duration, ops: usize) {
    latencies.sort_unstable();
    println!(
        "{label:<44} {:>9.0} ops/s   grant p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        ops as f64 / took.as_secs_f64(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

/// Run `clients` concurrent tasks, each `per_client` times calling `step(client, i)`, which
/// returns the grant latency it measured; `requests_per_step` counts the requests behind
/// one step for the throughput figure.
async fn measure<F, Fut>(
    label: String,
    clients: usize,
    per_client: usize,
    requests_per_step: usize,
    step: F,
) where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Duration> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let step = step.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    latencies.push(step(c, i).await);
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("client"));
    }
    report(
        &label,
        latencies,
        started.elapsed(),
        clients * per_client * requests_per_step,
    );
}

/// Grant then revoke distinct names: two requests per step.
async fn http_grants(app: &Arc<TestApp>, clients: usize, per_client: usize) {
    let app = app.clone();
    measure(
        format!("HTTP grant+revoke, {clients} clients"),
        clients,
        per_client,
        2,
        move |c, i| {
            let app = app.clone();
            async move {
                let name = format!("bench:{c}:{i}");
                let t = Instant::now();
                let (id, _) = app
                    .must_grant(&name, serde_json::json!({"ttl_ms": 10000}))
                    .await;
                let took = t.elapsed();
                assert_eq!(app.revoke(&name, &id).await.0, 204);
                took
            }
        },
    )
    .await;
}

/// Every client waits for the same lock; throughput counts grants.
async fn contended(app: &Arc<TestApp>, clients: usize, per_client: usize) {
    let app = app.clone();
    measure(
        format!("HTTP one hot lock, {clients} waiting clients"),
        clients,
        per_client,
        1,
        move |_, _| {
            let app = app.clone();
            async move {
                let t = Instant::now();
                let body = serde_json::json!({"ttl_ms": 10000, "wait_ms": 30000});
                let (id, _) = app.must_grant("bench:hot", body).await;
                let took = t.elapsed();
                app.revoke("bench:hot", &id).await;
                took
            }
        },
    )
    .await;
}

/// The engine alone, without HTTP: acquire then release.
async fn engine_grants(engine: &Arc<Redlock>, clients: usize, per_client: usize) {
    let engine = engine.clone();
    measure(
        format!("engine acquire+release, {clients} tasks"),
        clients,
        per_client,
        2,
        move |c, i| {
            let engine = engine.clone();
            async move {
                let name = redlockd::redlock::node::LockKey::mutex(format!("engine:{c}:{i}"));
                let t = Instant::now();
                engine
                    .acquire(&name, "lease", Duration::from_secs(10), None)
                    .await
                    .expect("granted");
                let took = t.elapsed();
                engine.release(&name, "lease").await.expect("released");
                took
            }
        },
    )
    .await;
}

#[tokio::main]
async fn main() {
    let ms = masters(3);
    let refs: Vec<_> = ms.iter().collect();
    let app = Arc::new(TestApp::spawn(config(&refs)).await);
    println!(
        "three redis-server masters on loopback, redlockd in process, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // Warm up connections and scripts.
    http_grants(&app, 4, 50).await;
    for clients in [1, 16, 64] {
        http_grants(&app, clients, 2000 / clients.min(20)).await;
    }
    contended(&app, 8, 50).await;

    let nodes: Vec<Arc<dyn LockNode>> = ms
        .iter()
        .map(|m| {
            Arc::new(
                RedisNode::new(
                    &redlockd::config::MasterUrl::parse(&m.url()).expect("url"),
                    "redlockd:",
                    Duration::from_millis(50),
                )
                .expect("node"),
            ) as Arc<dyn LockNode>
        })
        .collect();
    let engine = Arc::new(Redlock::new(
        nodes.clone(),
        EngineConfig::new(Duration::from_millis(50), 0.01, Duration::from_secs(3600)),
        Arc::new(Metrics::new()),
    ));
    engine.monitor().probe_round(&nodes).await;
    for clients in [1, 64] {
        engine_grants(&engine, clients, 4000 / clients.min(20)).await;
    }
}
