//! Hand-off across replicas, deterministically: two replicas' lease services over the same
//! three memory nodes, each hearing the nodes' announcements as it would a Redis master's,
//! under `tokio::time::pause()`. A waiter on one replica is woken whenever what it waits
//! for ends on the other: a holder, or a claim whose owner was granted and let go.

use std::sync::Arc;
use std::time::Duration;

use redlockd::lease::{Events, Lease, LeaseError, LeasePolicy, LeaseService, Target};
use redlockd::metrics::Metrics;
use redlockd::model::LockName;
use redlockd::redlock::{EngineConfig, Redlock};
use redlockd::store::memory::MemoryNode;
use redlockd::store::node::LockNode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MAX: Duration = Duration::from_secs(60);

/// Two replicas over three shared memory nodes.
struct Pair {
    a: Arc<LeaseService>,
    b: Arc<LeaseService>,
    policy: LeasePolicy,
    _shutdown: CancellationToken,
}

async fn replica(nodes: &[Arc<dyn LockNode>], shutdown: &CancellationToken) -> Arc<LeaseService> {
    let engine = Arc::new(Redlock::new(
        nodes.to_vec(),
        EngineConfig::new(Duration::from_millis(50), 0.01, MAX),
        Arc::new(Metrics::new()),
    ));
    engine.monitor().probe_round(nodes).await;
    let events = Events::new();
    for node in nodes {
        node.listen(redlockd::app::listener(events.clone()), shutdown.clone());
    }
    LeaseService::new(engine, events, Arc::new(Metrics::new()), shutdown.clone())
}

async fn pair() -> Pair {
    let nodes: Vec<Arc<dyn LockNode>> = (0..3)
        .map(|i| Arc::new(MemoryNode::new(format!("m{i}"))) as Arc<dyn LockNode>)
        .collect();
    let shutdown = CancellationToken::new();
    Pair {
        a: replica(&nodes, &shutdown).await,
        b: replica(&nodes, &shutdown).await,
        policy: LeasePolicy::new(Duration::from_secs(30), MAX, MAX),
        _shutdown: shutdown,
    }
}

fn names(names: &[&str]) -> Target {
    Target::group(names.iter().map(|n| LockName::parse(n).unwrap()).collect()).unwrap()
}

fn one(name: &str) -> Target {
    LockName::parse(name).unwrap().into()
}

fn shared(name: &str) -> Target {
    Target::shared(LockName::parse(name).unwrap())
}

impl Pair {
    async fn grant(
        &self,
        on: &Arc<LeaseService>,
        target: Target,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Lease {
        let (ttl, wait) = (
            self.policy.ttl(Some(ttl_ms)).unwrap(),
            self.policy.wait(Some(wait_ms)).unwrap(),
        );
        on.grant(target, ttl, wait, None).await.expect("granted")
    }

    /// A waiting grant in the background; it has tried once (and waits) when this returns.
    async fn waiter(
        &self,
        on: &Arc<LeaseService>,
        target: Target,
        wait_ms: u64,
    ) -> tokio::task::JoinHandle<(Result<Lease, LeaseError>, Instant)> {
        let (ttl, wait) = (
            self.policy.ttl(Some(5_000)).unwrap(),
            self.policy.wait(Some(wait_ms)).unwrap(),
        );
        let service = on.clone();
        let handle = tokio::spawn(async move {
            let result = service.grant(target, ttl, wait, None).await;
            (result, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        handle
    }
}

async fn revoke(on: &Arc<LeaseService>, lease: &Lease) {
    on.revoke(lease.name.clone(), lease.id.clone())
        .await
        .expect("revoked");
}

/// The holder on replica a, a waiter on a that claims what it waits for, and a waiter on
/// replica b that meets that claim. The holder's lease lapses (1 s): the claimant, whose
/// timer it is, is granted then, while b's waiter sleeps until the claim would have
/// lapsed (a second later). When the claimant lets go, b's waiter is granted at once.
async fn a_waiter_behind_a_claim_is_served_when_the_claimant_lets_go(
    holder: Target,
    claimant: Target,
    waiter: Target,
) {
    let pair = pair().await;
    pair.grant(&pair.a, holder, 1_000, 0).await;
    let claiming = pair.waiter(&pair.a, claimant, 4_000).await;
    let behind = pair.waiter(&pair.b, waiter, 4_000).await;
    let (claimed, _) = claiming.await.unwrap();
    let claimed = claimed.expect("the claimant is granted at the holder's lapse");
    assert!(
        !behind.is_finished(),
        "b's waiter waits behind the claimant"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let let_go = Instant::now();
    revoke(&pair.a, &claimed).await;
    let (served, at) = behind.await.unwrap();
    let served = served.expect("the waiter behind the claim is granted");
    assert!(served.token > claimed.token);
    let after = at - let_go;
    assert!(
        after < Duration::from_millis(100),
        "granted {after:?} after the claimant let go"
    );
}

#[tokio::test(start_paused = true)]
async fn several_names_behind_another_several_name_grants_claim() {
    a_waiter_behind_a_claim_is_served_when_the_claimant_lets_go(
        names(&["p", "q"]),
        names(&["p", "q"]),
        names(&["q", "p"]),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn one_name_behind_a_several_name_grants_claim() {
    a_waiter_behind_a_claim_is_served_when_the_claimant_lets_go(
        shared("p"),
        names(&["p", "q"]),
        one("p"),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_shared_grant_behind_a_writers_claim() {
    a_waiter_behind_a_claim_is_served_when_the_claimant_lets_go(shared("p"), one("p"), shared("p"))
        .await;
}

/// A claimant that gives up leaves its claim for at most 100 ms more: the waiter behind it
/// then meets the holder itself, and is granted at the holder's revoke.
#[tokio::test(start_paused = true)]
async fn a_waiter_behind_a_claimant_that_gives_up_is_served_at_the_holders_revoke() {
    let pair = pair().await;
    let held = pair.grant(&pair.a, names(&["p", "q"]), 5_000, 0).await;
    let claiming = pair.waiter(&pair.a, names(&["p", "q"]), 1_000).await;
    let behind = pair.waiter(&pair.b, names(&["q", "p"]), 10_000).await;
    let (gave_up, _) = claiming.await.unwrap();
    assert!(
        matches!(gave_up, Err(LeaseError::Held { .. })),
        "{gave_up:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let let_go = Instant::now();
    revoke(&pair.a, &held).await;
    let (served, at) = behind.await.unwrap();
    served.expect("granted at the holder's revoke");
    let after = at - let_go;
    assert!(
        after < Duration::from_millis(100),
        "granted {after:?} after the holder let go"
    );
}

/// Opposite orders on two replicas, three clients handing the names round: no grant waits
/// for longer than the hand-offs ahead of it.
#[tokio::test(start_paused = true)]
async fn several_name_grants_in_opposite_orders_on_two_replicas_are_each_served() {
    let pair = Arc::new(pair().await);
    let clients = [
        (pair.a.clone(), ["p", "q"]),
        (pair.b.clone(), ["q", "p"]),
        (pair.a.clone(), ["q", "p"]),
    ];
    let mut workers = Vec::new();
    for (service, order) in clients {
        let pair = pair.clone();
        workers.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..60 {
                let asked = Instant::now();
                let lease = pair.grant(&service, names(&order), 5_000, 4_000).await;
                longest = longest.max(asked.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
                revoke(&service, &lease).await;
            }
            longest
        }));
    }
    for worker in workers {
        let longest = worker.await.unwrap();
        // Two others' 5 ms holds ahead of it, and the masters' steps: well under 100 ms.
        assert!(longest < Duration::from_millis(100), "waited {longest:?}");
    }
}

/// Grants of two names on one replica, cycling, and single grants of each name on the
/// other: neither kind starves the other. (A several-name grant claims a name only behind
/// a holder of another kind: behind another several-name lease it would renew the chain of
/// claims for ever, and single grants waiting there never got in.)
#[tokio::test(start_paused = true)]
async fn single_grants_are_not_starved_by_several_name_grants_cycling_on_another_replica() {
    let pair = Arc::new(pair().await);
    let mut clients: Vec<(Arc<LeaseService>, Target)> = Vec::new();
    for _ in 0..4 {
        clients.push((pair.a.clone(), names(&["p", "q"])));
    }
    clients.push((pair.b.clone(), one("p")));
    clients.push((pair.b.clone(), one("q")));
    let mut workers = Vec::new();
    for (service, target) in clients {
        let pair = pair.clone();
        workers.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..30 {
                let asked = Instant::now();
                let lease = pair.grant(&service, target.clone(), 5_000, 4_000).await;
                longest = longest.max(asked.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
                revoke(&service, &lease).await;
            }
            longest
        }));
    }
    let mut longest = Vec::new();
    for worker in workers {
        longest.push(worker.await.unwrap());
    }
    assert!(
        longest.iter().all(|l| *l < Duration::from_millis(500)),
        "longest waits (four clients of both names, then one of each): {longest:?}"
    );
}
