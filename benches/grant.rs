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

async fn http_grants(app: &Arc<TestApp>, clients: usize, per_client: usize) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    let name = format!("bench:{c}:{i}");
                    let t = Instant::now();
                    let (id, _) = app
                        .must_grant(&name, serde_json::json!({"ttl_ms": 10000}))
                        .await;
                    latencies.push(t.elapsed());
                    let (status, _) = app.revoke(&name, &id).await;
                    assert_eq!(status, 204);
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("client"));
    }
    // Each pair is a grant and a revoke: two requests.
    report(
        &format!("HTTP grant+revoke, {clients} clients"),
        latencies,
        started.elapsed(),
        clients * per_client * 2,
    );
}

async fn contended(app: &Arc<TestApp>, clients: usize, per_client: usize) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for _ in 0..per_client {
                    let t = Instant::now();
                    let (id, _) = app
                        .must_grant(
                            "bench:hot",
                            serde_json::json!({"ttl_ms": 10000, "wait_ms": 30000}),
                        )
                        .await;
                    latencies.push(t.elapsed());
                    app.revoke("bench:hot", &id).await;
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
        &format!("HTTP one hot lock, {clients} waiting clients"),
        latencies,
        started.elapsed(),
        clients * per_client,
    );
}

async fn engine_grants(engine: &Arc<Redlock>, clients: usize, per_client: usize) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    let name = format!("engine:{c}:{i}");
                    let t = Instant::now();
                    engine
                        .acquire(&name, "lease", Duration::from_secs(10), None)
                        .await
                        .expect("granted");
                    latencies.push(t.elapsed());
                    engine.release(&name, "lease").await.expect("released");
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
        &format!("engine acquire+release, {clients} tasks"),
        latencies,
        started.elapsed(),
        clients * per_client * 2,
    );
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
                RedisNode::new(&m.url(), "redlockd:", Duration::from_millis(50)).expect("node"),
            ) as Arc<dyn LockNode>
        })
        .collect();
    let engine = Arc::new(Redlock::new(
        nodes.clone(),
        EngineConfig {
            master_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            max_ttl: Duration::from_secs(3600),
        },
        Arc::new(Metrics::new()),
    ));
    engine.monitor().probe_round(&nodes).await;
    for clients in [1, 64] {
        engine_grants(&engine, clients, 4000 / clients.min(20)).await;
    }
}
