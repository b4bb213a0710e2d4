//! The quorum engine against in-process nodes with a fault plan, under
//! `tokio::time::pause()`: deterministic proofs of the arithmetic and the fault handling
//! (down, slower than the timeout, reply lost after the write, restarted empty, clock fast).

use std::sync::Arc;
use std::time::Duration;

use redlockd::metrics::Metrics;
use redlockd::redlock::node::LockNode;
use redlockd::redlock::{EngineConfig, EngineError, Redlock};
use redlockd::store::memory::{Fault, MemoryNode};
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_millis(50);
const TTL: Duration = Duration::from_secs(10);

struct Bed {
    nodes: Vec<Arc<MemoryNode>>,
    engine: Redlock,
}

async fn bed(n: usize) -> Bed {
    bed_with(n, Duration::from_secs(60)).await
}

async fn bed_with(n: usize, max_ttl: Duration) -> Bed {
    let nodes: Vec<Arc<MemoryNode>> = (0..n)
        .map(|i| Arc::new(MemoryNode::new(format!("m{i}"))))
        .collect();
    let dyn_nodes: Vec<Arc<dyn LockNode>> = nodes
        .iter()
        .map(|n| n.clone() as Arc<dyn LockNode>)
        .collect();
    let engine = Redlock::new(
        dyn_nodes,
        EngineConfig {
            master_timeout: TIMEOUT,
            drift_factor: 0.01,
            max_ttl,
        },
        Arc::new(Metrics::new()),
    );
    let bed = Bed { nodes, engine };
    bed.probe().await;
    bed
}

impl Bed {
    async fn probe(&self) {
        let nodes = self.engine.nodes().to_vec();
        self.engine.monitor().probe_round(&nodes).await;
    }

    async fn grant(&self, name: &str, lease: &str) -> Result<u64, EngineError> {
        self.engine
            .acquire(name, lease, TTL, None)
            .await
            .map(|l| l.token)
    }
}

#[tokio::test(start_paused = true)]
async fn a_healthy_majority_never_waits_for_a_hung_master() {
    let bed = bed(3).await;
    bed.nodes[2].set_fault(Fault::Hang);
    let started = Instant::now();
    let leased = bed
        .engine
        .acquire("a", "L1", TTL, Some("me"))
        .await
        .expect("granted");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "decided on the two answers in hand"
    );
    assert_eq!(leased.token, 1);
    assert_eq!(leased.owner.as_deref(), Some("me"));
    // validity = 10 s - 0 elapsed - (1% of 10 s + 2 ms)
    assert_eq!(leased.validity, Duration::from_millis(9_898));
}

#[tokio::test(start_paused = true)]
async fn dead_masters_cost_no_more_than_the_timeout() {
    let bed = bed(3).await;
    bed.nodes[1].set_fault(Fault::Hang);
    bed.nodes[2].set_fault(Fault::Hang);
    let started = Instant::now();
    let err = bed.grant("a", "L1").await.unwrap_err();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
    // The grant round and the release round each wait one timeout, no more.
    assert_eq!(started.elapsed(), TIMEOUT * 2);
    assert!(
        !bed.nodes[0].holds("a", "L1"),
        "the failed grant was released"
    );

    bed.nodes[1].set_fault(Fault::Down);
    bed.nodes[2].set_fault(Fault::Down);
    let started = Instant::now();
    assert!(matches!(
        bed.grant("a", "L2").await,
        Err(EngineError::Unavailable(_))
    ));
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "refused connections fail at once"
    );
}

#[tokio::test(start_paused = true)]
async fn held_is_told_apart_from_unavailable() {
    let bed = bed(3).await;
    bed.grant("a", "L1").await.expect("first grant");
    tokio::time::advance(Duration::from_secs(4)).await;
    match bed.grant("a", "L2").await {
        Err(EngineError::Held { retry_after }) => assert_eq!(retry_after, Duration::from_secs(6)),
        other => panic!("expected held, got {other:?}"),
    }
    // Held on one master, the other two down: no majority could be had at all.
    bed.nodes[1].set_fault(Fault::Down);
    bed.nodes[2].set_fault(Fault::Down);
    assert!(matches!(
        bed.grant("a", "L3").await,
        Err(EngineError::Unavailable(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failed_grant_is_removed_even_where_the_reply_was_lost() {
    let bed = bed(3).await;
    bed.nodes[1].set_fault(Fault::LoseReply);
    bed.nodes[2].set_fault(Fault::Down);
    assert!(matches!(
        bed.grant("a", "L1").await,
        Err(EngineError::Unavailable(_))
    ));
    bed.nodes[1].set_fault(Fault::None);
    assert!(!bed.nodes[0].holds("a", "L1"));
    assert!(
        !bed.nodes[1].holds("a", "L1"),
        "the lost-reply master applied the grant, and the release"
    );
}

#[tokio::test(start_paused = true)]
async fn a_grant_without_validity_left_fails_and_is_released() {
    let bed = bed(3).await;
    for node in &bed.nodes {
        node.set_fault(Fault::Slow(Duration::from_millis(40)));
    }
    let engine = &bed.engine;
    // 100 ms TTL: 40 ms elapsed + 3 ms drift leaves 57 ms.
    let ok = engine
        .acquire("a", "L1", Duration::from_millis(100), None)
        .await
        .expect("granted");
    assert_eq!(ok.validity, Duration::from_millis(57));
    engine.release("a", "L1").await.expect("released");

    // 45 ms elapsed on a 47 ms TTL leaves nothing after the drift allowance.
    for node in &bed.nodes {
        node.set_fault(Fault::Slow(Duration::from_millis(45)));
    }
    let err = engine
        .acquire("b", "L2", Duration::from_millis(47), None)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
    for node in &bed.nodes {
        node.set_fault(Fault::None);
        assert!(!node.holds("b", "L2"));
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_rise_when_the_counters_diverge() {
    // The issue's scenario: ten grants on {A, B} while C is down; then {A, C}; then {B, C}.
    let bed = bed(3).await;
    let (a, b, c) = (&bed.nodes[0], &bed.nodes[1], &bed.nodes[2]);
    c.set_fault(Fault::Down);
    let mut last = 0;
    for i in 0..10 {
        let lease = format!("ab{i}");
        let token = bed.grant("x", &lease).await.expect("granted on A, B");
        assert!(token > last);
        last = token;
        bed.engine.release("x", &lease).await.expect("released");
    }
    assert_eq!((a.fence(), b.fence(), c.fence()), (10, 10, 0));

    c.set_fault(Fault::None);
    b.set_fault(Fault::Down);
    let token = bed.grant("x", "ac").await.expect("granted on A, C");
    assert_eq!(token, 11);
    assert_eq!(c.fence(), 11, "the chosen token was written back to C");
    bed.engine.release("x", "ac").await.expect("released");

    b.set_fault(Fault::None);
    a.set_fault(Fault::Down);
    let token = bed.grant("x", "bc").await.expect("granted on B, C");
    assert!(token > 11, "token {token} must exceed 11");
}

#[tokio::test(start_paused = true)]
async fn a_straggler_that_granted_late_gets_the_chosen_token() {
    let bed = bed(3).await;
    // C's counter is ahead; it answers after the timeout, so the grant is decided without it.
    bed.nodes[2]
        .confirm("none", "none", 40)
        .await
        .expect("raised");
    bed.nodes[2].set_fault(Fault::Slow(Duration::from_millis(30)));
    let token = bed.grant("s", "L1").await.expect("granted");
    assert_eq!(token, 1);
    // The straggler answers 30 ms in and is settled in the background. In paused time the
    // clock moves only when every task waits, so stepping it settles C deterministically.
    bed.nodes[2].set_fault(Fault::None);
    let mut settled = None;
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(1)).await;
        settled = bed.nodes[2]
            .read("s")
            .await
            .expect("read")
            .filter(|h| h.token == 1);
        if settled.is_some() {
            break;
        }
    }
    assert!(
        settled.is_some(),
        "C's own token 41 was replaced by the chosen one"
    );
    let checked = bed.engine.check("s", "L1").await.expect("check agrees");
    assert_eq!(checked.token, 1);
}

#[tokio::test(start_paused = true)]
async fn only_the_holder_renews_or_releases_and_renewing_keeps_the_token() {
    let bed = bed(3).await;
    let token = bed.grant("r", "L1").await.expect("granted");
    assert_eq!(
        bed.engine.renew("r", "other", None).await,
        Err(EngineError::NotFound)
    );
    assert_eq!(
        bed.engine.release("r", "other").await,
        Err(EngineError::NotFound)
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    let renewed = bed
        .engine
        .renew("r", "L1", Some(Duration::from_secs(20)))
        .await
        .expect("renewed");
    assert_eq!(renewed.token, token);
    assert_eq!(renewed.ttl, Duration::from_secs(20));
    // Past the original TTL, the renewed lease still holds.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        bed.engine.check("r", "L1").await.expect("held").token,
        token
    );
    // A renew without a TTL reuses the lease's own (20 s).
    let again = bed.engine.renew("r", "L1", None).await.expect("renewed");
    assert_eq!(again.ttl, Duration::from_secs(20));
    tokio::time::advance(Duration::from_secs(21)).await;
    assert_eq!(
        bed.engine.renew("r", "L1", None).await,
        Err(EngineError::NotFound)
    );
    assert!(bed.grant("r", "L2").await.expect("free after expiry") > token);
}

#[tokio::test(start_paused = true)]
async fn a_master_with_a_fast_clock_cannot_break_mutual_exclusion() {
    let bed = bed(3).await;
    bed.nodes[2].set_clock_rate(3.0);
    bed.grant("k", "L1").await.expect("granted");
    // C's key is gone after a third of the TTL; A and B still hold.
    tokio::time::advance(TTL / 2).await;
    assert!(!bed.nodes[2].holds("k", "L1"));
    assert!(matches!(
        bed.grant("k", "L2").await,
        Err(EngineError::Held { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_master_that_restarts_empty_is_quarantined_then_restored() {
    let max_ttl = Duration::from_secs(30);
    let bed = bed_with(3, max_ttl).await;
    let first = bed.grant("q", "L1").await.expect("granted");
    bed.nodes[2].restart_empty();
    bed.probe().await;
    let status = bed.engine.monitor().status();
    assert!(status[2].quarantined_until.is_some(), "{status:?}");
    assert!(
        bed.engine.monitor().ready(),
        "two voting masters are still a majority"
    );

    // While quarantined, C does not vote: one more failure and grants stop.
    bed.engine
        .release("q", "L1")
        .await
        .expect("released on A, B");
    bed.nodes[1].set_fault(Fault::Down);
    assert!(matches!(
        bed.grant("q", "L2").await,
        Err(EngineError::Unavailable(_))
    ));
    bed.nodes[1].set_fault(Fault::None);
    let second = bed.grant("q", "L3").await.expect("A and B vote");
    assert!(second > first);

    // Still quarantined before the largest TTL has passed.
    tokio::time::advance(max_ttl - Duration::from_secs(1)).await;
    bed.probe().await;
    assert!(bed.engine.monitor().status()[2].quarantined_until.is_some());

    tokio::time::advance(Duration::from_secs(2)).await;
    bed.probe().await;
    assert!(bed.engine.monitor().status()[2].quarantined_until.is_none());
    assert!(
        bed.nodes[2].fence() >= second,
        "C's counter was raised before it voted again"
    );

    // Now C votes: with A down, B and C still grant, and the token keeps rising.
    bed.nodes[0].set_fault(Fault::Down);
    let third = bed.grant("q2", "L4").await.expect("B and C vote");
    assert!(third > second);
}

#[tokio::test(start_paused = true)]
async fn reads_need_a_majority() {
    let bed = bed(3).await;
    let token = bed.grant("i", "L1").await.expect("granted");
    let holder = bed.engine.inspect("i").await.expect("read").expect("held");
    assert_eq!(holder.token, token);
    assert_eq!(bed.engine.inspect("free").await.expect("read"), None);
    bed.nodes[0].set_fault(Fault::Hang);
    bed.nodes[1].set_fault(Fault::Down);
    assert!(matches!(
        bed.engine.inspect("i").await,
        Err(EngineError::Unavailable(_))
    ));
    let listed = bed.engine.list("", 10).await;
    assert!(matches!(listed, Err(EngineError::Unavailable(_))));
}

#[tokio::test(start_paused = true)]
async fn list_merges_what_a_majority_hold() {
    let bed = bed(3).await;
    for name in ["inv:2", "inv:1", "mail:1"] {
        bed.grant(name, &format!("L-{name}"))
            .await
            .expect("granted");
    }
    // Held on one master only: not a lock.
    bed.nodes[0]
        .acquire("inv:3", "stray", 10_000, None)
        .await
        .expect("set");
    let names: Vec<String> = bed
        .engine
        .list("inv", 10)
        .await
        .expect("list")
        .into_iter()
        .map(|h| h.name)
        .collect();
    assert_eq!(names, ["inv:1", "inv:2"]);
    let first: Vec<String> = bed
        .engine
        .list("", 1)
        .await
        .expect("list")
        .into_iter()
        .map(|h| h.name)
        .collect();
    assert_eq!(first, ["inv:1"]);
}
