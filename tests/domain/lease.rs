//! The lease service over in-process masters under `tokio::time::pause()`: the waiting
//! grant's control flow (first come first served, woken by a revoke or by the holder's
//! expiry, giving up at its deadline with the holder's remaining time, shutdown)
//! deterministically, without real masters or the wall clock.

use std::sync::Arc;
use std::time::Duration;

use redlockd::lease::{
    Events, Lease, LeaseError, LeasePolicy, LeaseService, StreamTerms, Ttl, WaitTime,
};
use redlockd::metrics::Metrics;
use redlockd::model::LockKey;
use redlockd::model::LockName;
use redlockd::redlock::{EngineConfig, Redlock};
use redlockd::store::memory::{Fault, MemoryNode};
use redlockd::store::node::LockNode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MAX: Duration = Duration::from_secs(60);

struct Bed {
    nodes: Vec<Arc<MemoryNode>>,
    service: Arc<LeaseService>,
    policy: LeasePolicy,
    shutdown: CancellationToken,
}

async fn bed() -> Bed {
    let memory: Vec<Arc<MemoryNode>> = (0..3)
        .map(|i| Arc::new(MemoryNode::new(format!("m{i}"))))
        .collect();
    let nodes: Vec<Arc<dyn LockNode>> = memory
        .iter()
        .map(|n| n.clone() as Arc<dyn LockNode>)
        .collect();
    let engine = Arc::new(Redlock::new(
        nodes.clone(),
        EngineConfig::new(Duration::from_millis(50), 0.01, MAX),
        Arc::new(Metrics::new()),
    ));
    engine.monitor().probe_round(&nodes).await;
    let shutdown = CancellationToken::new();
    let service = LeaseService::new(
        engine,
        Events::new(),
        Arc::new(Metrics::new()),
        shutdown.clone(),
    );
    Bed {
        nodes: memory,
        service,
        policy: LeasePolicy::new(Duration::from_secs(30), MAX, MAX),
        shutdown,
    }
}

impl Bed {
    fn ttl(&self, ms: u64) -> Ttl {
        self.policy.ttl(Some(ms)).unwrap()
    }

    fn wait(&self, ms: u64) -> WaitTime {
        self.policy.wait(Some(ms)).unwrap()
    }

    async fn grant(&self, name: &str, ttl_ms: u64, wait_ms: u64) -> Result<Lease, LeaseError> {
        self.service
            .grant(
                LockName::parse(name).unwrap(),
                self.ttl(ttl_ms),
                self.wait(wait_ms),
                None,
            )
            .await
    }

    /// A waiting grant in the background, started now (and so queued behind earlier ones).
    async fn waiter(
        &self,
        name: &str,
        wait_ms: u64,
    ) -> tokio::task::JoinHandle<(Result<Lease, LeaseError>, Instant)> {
        let (service, name) = (self.service.clone(), LockName::parse(name).unwrap());
        let (ttl, wait) = (self.ttl(30_000), self.wait(wait_ms));
        let handle = tokio::spawn(async move {
            let result = service.grant(name, ttl, wait, None).await;
            (result, Instant::now())
        });
        // Let it try once and join the queue before the next one starts.
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(1)).await;
        handle
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_first_come_first_served_on_each_revoke() {
    let bed = bed().await;
    let mut holder = bed.grant("q", 30_000, 0).await.expect("granted");
    let waiters = [
        bed.waiter("q", 10_000).await,
        bed.waiter("q", 10_000).await,
        bed.waiter("q", 10_000).await,
    ];
    let mut tokens = Vec::new();
    for waiter in waiters {
        bed.service
            .revoke(holder.name.clone(), holder.id.clone())
            .await
            .expect("revoked");
        let (result, _) = waiter.await.unwrap();
        holder = result.expect("the next in line got it");
        tokens.push(holder.token.get());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_its_deadline_with_the_holders_remaining_time() {
    let bed = bed().await;
    bed.grant("d", 30_000, 0).await.expect("granted");
    let started = Instant::now();
    match bed.grant("d", 30_000, 2_000).await {
        Err(LeaseError::Held { retry_after }) => {
            assert_eq!(started.elapsed(), Duration::from_secs(2));
            assert!(
                (Duration::from_secs(27)..=Duration::from_secs(28)).contains(&retry_after),
                "{retry_after:?}"
            );
        }
        other => panic!("expected held, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_when_the_holder_expires() {
    let bed = bed().await;
    bed.grant("e", 1_000, 0).await.expect("granted");
    let started = Instant::now();
    let lease = bed
        .grant("e", 30_000, 5_000)
        .await
        .expect("granted at expiry");
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(990)..Duration::from_millis(1_100)).contains(&took),
        "woken after {took:?}"
    );
    assert!(lease.token > 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_waiting_grants_at_once() {
    let bed = bed().await;
    bed.grant("s", 30_000, 0).await.expect("granted");
    let waiter = bed.waiter("s", 30_000).await;
    let stopped_at = Instant::now();
    bed.shutdown.cancel();
    let (result, answered) = waiter.await.unwrap();
    assert_eq!(result.unwrap_err(), LeaseError::ShuttingDown);
    assert_eq!(answered, stopped_at, "answered without waiting");
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_what_a_departed_client_won_before_it_returns() {
    let bed = bed().await;
    for node in &bed.nodes {
        node.set_fault(Fault::Slow(Duration::from_millis(20)));
    }
    let (service, name) = (bed.service.clone(), LockName::parse("gone").unwrap());
    let (ttl, wait) = (bed.ttl(30_000), bed.wait(0));
    let client = tokio::spawn(async move { service.grant(name, ttl, wait, None).await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The client leaves while its grant is on its way to the masters.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    bed.shutdown.cancel();
    assert!(
        bed.service
            .drain(Instant::now() + Duration::from_secs(1))
            .await,
        "the attempt finished within the grace"
    );

    // The process is gone: nothing it would still send reaches a master.
    for node in &bed.nodes {
        node.set_fault(Fault::Hang);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in &bed.nodes {
        node.set_fault(Fault::None);
        assert_eq!(
            node.read(&LockKey::mutex("gone")).await.expect("read"),
            [],
            "the departed client's lease was released before drain returned"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_whose_client_left_after_it_reached_the_masters_is_released() {
    let bed = bed().await;
    // Every master applies the acquire but its answer never comes: the grant is undecided
    // when its client leaves, and the lock is set everywhere.
    for node in &bed.nodes {
        node.set_fault(Fault::LoseReply);
    }
    let (service, name) = (bed.service.clone(), LockName::parse("left").unwrap());
    let (ttl, wait) = (bed.ttl(30_000), bed.wait(0));
    let client = tokio::spawn(async move { service.grant(name, ttl, wait, None).await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    for node in &bed.nodes {
        node.set_fault(Fault::None);
        let fence = node.probe().await.expect("probe").fence;
        assert_eq!(fence, 1, "the acquire reached every master");
    }
    // Paused time: a second here is a second of the lease's 30 s TTL, so only a release
    // (not its expiry) frees the lock in time.
    let deadline = Instant::now() + Duration::from_secs(1);
    while held_on_majority(&bed, "left").await {
        assert!(
            Instant::now() < deadline,
            "the departed client's lease is still held a second after it left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a majority of the in-process masters hold `name`.
async fn held_on_majority(bed: &Bed, name: &str) -> bool {
    let mut holding = 0;
    for node in &bed.nodes {
        if !node
            .read(&LockKey::mutex(name))
            .await
            .expect("read")
            .is_empty()
        {
            holding += 1;
        }
    }
    holding >= 2
}

#[tokio::test(start_paused = true)]
async fn a_held_stream_that_is_never_read_keeps_its_lease_and_a_bounded_buffer() {
    let bed = bed().await;
    let name = LockName::parse("unread").unwrap();
    let rx = bed
        .service
        .hold(
            name,
            bed.ttl(300),
            bed.wait(0),
            None,
            StreamTerms::default(),
        )
        .expect("hold");
    // Thirty TTLs later: renewed all along, a hundred heartbeats, and never more buffered
    // than the stream's small buffer.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(rx.len() <= 8, "{} events buffered", rx.len());
    assert!(
        held_on_majority(&bed, "unread").await,
        "renewed while unread"
    );
    drop(rx);
    // The client left: revoked at once, not at the TTL.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        !held_on_majority(&bed, "unread").await,
        "revoked when the reader left"
    );
}

#[tokio::test(start_paused = true)]
async fn a_held_stream_says_lost_when_a_majority_of_masters_stop_answering() {
    use redlockd::lease::{HoldEvent, LostReason};
    let bed = bed().await;
    let mut rx = bed
        .service
        .hold(
            LockName::parse("q").unwrap(),
            bed.ttl(1_000),
            bed.wait(0),
            None,
            StreamTerms::default(),
        )
        .expect("hold");
    let granted_at = match rx.recv().await {
        Some(HoldEvent::Granted(lease)) => lease.at,
        other => panic!("expected granted, got {other:?}"),
    };
    bed.nodes[0].set_fault(Fault::Hang);
    bed.nodes[1].set_fault(Fault::Hang);
    let mut warned = Vec::new();
    let lost = loop {
        match rx.recv().await {
            Some(HoldEvent::Renewed(_)) => {}
            Some(HoldEvent::Jeopardy { validity }) => warned.push(validity),
            Some(HoldEvent::Lost(reason)) => break reason,
            other => panic!("expected lost, got {other:?}"),
        }
    };
    assert_eq!(lost, LostReason::QuorumLost);
    // Warned once, while the renews hung, with less than a third of the TTL left.
    assert!(
        matches!(warned[..], [left] if left <= Duration::from_millis(334)),
        "{warned:?}"
    );
    assert!(
        granted_at.elapsed() <= Duration::from_secs(1),
        "told within the validity: {:?}",
        granted_at.elapsed()
    );
    assert!(rx.recv().await.is_none(), "nothing follows lost");
}

#[tokio::test(start_paused = true)]
async fn a_held_stream_queues_then_is_granted_when_the_holder_leaves() {
    use redlockd::lease::HoldEvent;
    let bed = bed().await;
    let first = bed
        .service
        .hold(
            LockName::parse("line").unwrap(),
            bed.ttl(30_000),
            bed.wait(0),
            None,
            StreamTerms::default(),
        )
        .expect("hold");
    let mut second = bed
        .service
        .hold(
            LockName::parse("line").unwrap(),
            bed.ttl(30_000),
            bed.wait(60_000),
            None,
            StreamTerms::default(),
        )
        .expect("hold");
    assert!(matches!(
        second.recv().await,
        Some(HoldEvent::Queued { position: 1 })
    ));
    let left = Instant::now();
    drop(first);
    match second.recv().await {
        Some(HoldEvent::Granted(_)) => {}
        other => panic!("expected granted, got {other:?}"),
    }
    assert!(
        left.elapsed() < Duration::from_millis(10),
        "handed over at once"
    );
}

#[tokio::test(start_paused = true)]
async fn waiting_grants_and_streams_past_their_caps_are_told_to_come_back() {
    use redlockd::config::Caps;
    let base = bed().await;
    let service = LeaseService::with_caps(
        base.service.engine().clone(),
        Events::new(),
        Arc::new(Metrics::new()),
        CancellationToken::new(),
        Caps {
            waiters_per_name: 2,
            waiters: 3,
            streams: 1,
        },
    );
    let grant = |name: &str, wait_ms: u64| {
        let (service, name) = (service.clone(), LockName::parse(name).unwrap());
        let (ttl, wait) = (base.ttl(30_000), base.wait(wait_ms));
        tokio::spawn(async move { service.grant(name, ttl, wait, None).await })
    };
    let holders = [grant("a", 0), grant("b", 0)];
    for h in holders {
        h.await.unwrap().expect("free");
    }
    let waiting: Vec<_> = ["a", "a", "b"].iter().map(|n| grant(n, 60_000)).collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    // A third on `a` is past the per-name cap; one on `c` past the total.
    let third = grant("a", 60_000).await.unwrap();
    assert!(
        matches!(third, Err(LeaseError::TooMany { .. })),
        "{third:?}"
    );
    let elsewhere = grant("c", 60_000).await.unwrap();
    assert!(
        matches!(elsewhere, Err(LeaseError::TooMany { .. })),
        "{elsewhere:?}"
    );
    // Not waiting costs nothing: a grant that does not wait is still answered.
    assert!(grant("c", 0).await.unwrap().is_ok());
    for w in &waiting {
        w.abort();
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The waiters left: there is room again.
    let again = grant("a", 100);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(again.await.unwrap(), Err(LeaseError::Held { .. })));

    let name = LockName::parse("s").unwrap();
    let open = service
        .hold(
            name.clone(),
            base.ttl(30_000),
            base.wait(0),
            None,
            StreamTerms::default(),
        )
        .expect("the first stream");
    let refused = service.hold(
        name.clone(),
        base.ttl(30_000),
        base.wait(0),
        None,
        StreamTerms::default(),
    );
    assert!(matches!(refused, Err(LeaseError::TooMany { .. })));
    drop(open);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        service
            .hold(
                name,
                base.ttl(30_000),
                base.wait(0),
                None,
                StreamTerms::default()
            )
            .is_ok()
    );
}
