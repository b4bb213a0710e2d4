//! One master's steps in batches, on a real redis-server: concurrent steps share one script
//! call, each step is answered as its own script would answer it, and a lease's steps reach
//! the master in the order they were issued.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use redlockd::config::MasterUrl;
use redlockd::model::{LeaseId, LockKey, LockName};
use redlockd::store::node::{Acquired, Claim, Ending, LockNode, NodeError, Owned};
use redlockd::store::redis::RedisNode;

use crate::common::RedisMaster;

fn node(master: &RedisMaster) -> RedisNode {
    let url = MasterUrl::parse(&master.url()).expect("url");
    RedisNode::new(&url, "redlockd:", Duration::from_secs(2), 256).expect("node")
}

/// A node of a fresh master that has its marker and has run a step (the first step loads
/// the batch script: NOSCRIPT, SCRIPT LOAD, EVALSHA again), so that what a test counts
/// next is its own steps.
async fn warm_node() -> (RedisMaster, RedisNode) {
    let master = RedisMaster::start();
    let node = node(&master);
    node.restore(0, "batch-test", None).await.expect("marker");
    node.read(&key("warm-up")).await.expect("read");
    (master, node)
}

/// A lease id as a caller names one.
fn id(lease: &str) -> LeaseId {
    LeaseId::parse(lease).expect("a well-formed lease id")
}

fn key(name: &str) -> LockKey {
    LockName::parse(name).expect("name").key()
}

/// Script calls the master has served since `CONFIG RESETSTAT` (batches and single calls).
async fn script_calls(master: &RedisMaster) -> u64 {
    let info: String = master.cmd(&["INFO", "commandstats"]).await.expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

/// Poll `future` once: what a step does before its first await (queueing it) is done.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *future).poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

#[tokio::test]
async fn concurrent_steps_on_one_master_travel_as_one_script_call() {
    let (master, node) = warm_node().await;
    master.cmd::<()>(&["CONFIG", "RESETSTAT"]).await.unwrap();

    let keys: Vec<LockKey> = (0..64).map(|i| key(&format!("batch-{i}"))).collect();
    let leases: Vec<LeaseId> = (0..64).map(|i| id(&format!("lease-{i}"))).collect();
    // All queued before the worker runs (this runtime has one thread): one batch.
    let mut acquires: Vec<_> = keys
        .iter()
        .zip(&leases)
        .map(|(key, lease)| node.acquire(Claim::new(key, lease, 30_000)))
        .collect();
    for acquire in &mut acquires {
        poll_once(acquire).await;
    }
    let acquired = futures::future::join_all(acquires).await;
    let mut tokens: Vec<u64> = acquired
        .into_iter()
        .map(|a| match a.expect("answered") {
            Acquired::Granted { token } => token.get(),
            other => panic!("expected a grant, got {other:?}"),
        })
        .collect();
    assert_eq!(script_calls(&master).await, 1, "64 acquires in one call");
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 64, "each step took its own token");

    // Each step is answered as its own: a lock already held is refused with its holder.
    let again = node
        .acquire(Claim::new(&keys[3], &id("someone-else"), 30_000))
        .await
        .expect("answered");
    assert!(
        matches!(&again, Acquired::Held { lease, .. } if lease.as_str() == "lease-3"),
        "{again:?}"
    );
    let released = futures::future::join_all(
        keys.iter()
            .zip(&leases)
            .map(|(key, lease)| node.release(key, lease, &Ending::Revoke)),
    )
    .await;
    assert!(released.iter().all(|r| r == &Ok(Owned::Yes(()))));
    let left: Vec<String> = master.cmd(&["KEYS", "redlockd:lock:*"]).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_step_that_fails_fails_alone_in_its_batch() {
    let (master, node) = warm_node().await;
    // A key of the wrong type where the lock's hash belongs: its step's script fails.
    master
        .cmd::<()>(&["SET", "redlockd:lock:broken", "not a hash"])
        .await
        .unwrap();
    master.cmd::<()>(&["CONFIG", "RESETSTAT"]).await.unwrap();
    let (broken, fine) = (key("broken"), key("fine"));
    let (first, second) = (id("lease-1"), id("lease-2"));
    let mut failing = node.acquire(Claim::new(&broken, &first, 30_000));
    let mut granted = node.acquire(Claim::new(&fine, &second, 30_000));
    poll_once(&mut failing).await;
    poll_once(&mut granted).await;
    let (failing, granted) = tokio::join!(failing, granted);
    assert_eq!(script_calls(&master).await, 1, "both steps in one call");
    assert!(
        matches!(&failing, Err(NodeError::Script(e)) if e.contains("WRONGTYPE")),
        "{failing:?}"
    );
    assert!(
        matches!(granted, Ok(Acquired::Granted { .. })),
        "the other step of the batch: {granted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_issued_after_its_acquire_never_overtakes_it() {
    let master = RedisMaster::start();
    let node = std::sync::Arc::new(node(&master));
    node.restore(0, "batch-order", None).await.expect("marker");
    // Background traffic keeps batches forming while the pairs below are issued.
    let busy = {
        let node = node.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let key = key(&format!("busy-{}", i % 16));
                let _ = node.read(&key).await;
            }
        })
    };
    for i in 0..300 {
        let (key, lease) = (key(&format!("order-{i}")), id(&format!("lease-{i}")));
        // The acquire is issued (queued) before the release, neither yet answered: the
        // engine does this when a grant fails while an acquire is still on the wire.
        let mut acquire = pin!(node.acquire(Claim::new(&key, &lease, 30_000)));
        // Answered at its first poll (it never is over a socket, but a future must not be
        // polled again once done): the release then simply follows it.
        let first = poll_once(&mut acquire).await;
        let release = node.release(&key, &lease, &Ending::Undo { attempt: None });
        let (acquired, released) = match first {
            Some(acquired) => (acquired, release.await),
            None => tokio::join!(acquire, release),
        };
        assert!(
            matches!(acquired, Ok(Acquired::Granted { .. })),
            "{acquired:?}"
        );
        assert_eq!(released, Ok(Owned::Yes(())), "the release found the hold");
    }
    busy.abort();
    let left: Vec<String> = master
        .cmd(&["KEYS", "redlockd:lock:order-*"])
        .await
        .unwrap();
    assert!(left.is_empty(), "holds left behind: {left:?}");
}

/// Calls of `SCRIPT` (LOAD, EXISTS, FLUSH) and failed `EVALSHA`s (NOSCRIPT) the master has
/// seen since `CONFIG RESETSTAT`.
async fn loads_and_misses(master: &RedisMaster) -> (u64, u64) {
    let info: String = master.cmd(&["INFO", "commandstats"]).await.expect("info");
    let field = |line: &str, name: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |n| n.parse().expect("a count"))
    };
    let loads = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_script|load:"))
        .map_or(0, |l| field(l, "calls"));
    let misses = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .map_or(0, |l| field(l, "failed_calls"));
    (loads, misses)
}

/// Scripts the master keeps (`INFO memory`).
async fn cached_scripts(master: &RedisMaster) -> u64 {
    let info: String = master.cmd(&["INFO", "memory"]).await.expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

#[tokio::test]
async fn the_probe_gives_a_master_the_batch_script_before_the_first_grant_needs_it() {
    let master = RedisMaster::start();
    let node = node(&master);
    node.restore(0, "preload-test", None).await.expect("marker");
    // A master that has never seen the script, and one that lost it (a restart, a flush):
    // after a probe, the first grant is one EVALSHA, with no NOSCRIPT and no upload.
    for round in ["fresh", "flushed"] {
        if round == "flushed" {
            master.cmd::<()>(&["SCRIPT", "FLUSH"]).await.unwrap();
        }
        let before = cached_scripts(&master).await;
        node.probe().await.expect("probe");
        // The probe hands the upload to a task of its own.
        crate::common::wait_for(
            "the script on the master",
            Duration::from_secs(5),
            async || (cached_scripts(&master).await > before).then_some(()),
        )
        .await;
        master.cmd::<()>(&["CONFIG", "RESETSTAT"]).await.unwrap();
        let granted = node
            .acquire(Claim::new(
                &key(&format!("first-{round}")),
                &id(round),
                30_000,
            ))
            .await
            .expect("answered");
        assert!(matches!(granted, Acquired::Granted { .. }), "{granted:?}");
        assert_eq!(script_calls(&master).await, 1, "{round}: one call");
        assert_eq!(
            loads_and_misses(&master).await,
            (0, 0),
            "{round}: the grant neither missed the script nor loaded it"
        );
    }
}
