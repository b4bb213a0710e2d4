//! Behaviours written once and run on every bed that serves them: the in-process app on
//! the embedded store (`tests/contract`) and replicas on real masters (`tests/masters`).

use serde_json::{Value, json};

use super::TestApp;

/// Revoke `lease` of the lock `name`, and assert that it was revoked.
pub async fn revoke(app: &TestApp, name: &str, lease: &Value) {
    let id = lease["lease_id"].as_str().expect("a lease");
    let (status, body) = app
        .send("DELETE", &format!("/locks/{name}/leases/{id}"), None)
        .await;
    assert_eq!(status, 204, "{body}");
}

/// Three single grants of `hot` wait behind a holder, then a grant of `hot` and `cold`.
/// When the holder leaves, the grant of both has claimed `hot`: the singles ahead of it in
/// this replica's line find it claimed, it takes both names, and the singles go on after.
pub async fn singles_queued_first_wait_behind_a_waiting_grant_of_several_names(app: &TestApp) {
    let (_, holder) = app.grant("hot", json!({"ttl_ms": 10_000})).await;
    let mut singles = Vec::new();
    for i in 0..3 {
        let single = app.handle();
        singles.push(tokio::spawn(async move {
            single
                .grant("hot", json!({"ttl_ms": 10_000, "wait_ms": 10_000}))
                .await
        }));
        app.wait_for_contention("hot", i + 1).await;
    }
    let both = {
        let app = app.handle();
        tokio::spawn(async move {
            let body = json!({"names": ["hot", "cold"], "ttl_ms": 10_000, "wait_ms": 10_000});
            app.send("POST", "/locks", Some(body)).await
        })
    };
    // (A grant of several names counts its contention under its first name's class.)
    app.wait_for_contention("cold", 1).await;
    revoke(app, "hot", &holder).await;
    let (status, lease) = super::joined(
        both,
        "the grant of both names is granted at the holder's release",
    )
    .await;
    assert_eq!(status, 201, "{lease}");
    assert!(
        singles.iter().all(|s| !s.is_finished()),
        "the singles wait behind it"
    );
    revoke(app, "hot", &lease).await;
    let mut singles = singles.into_iter();
    let first = singles.next().unwrap();
    let (status, _) = super::joined(
        first,
        "the first single is granted when the grant of both lets go",
    )
    .await;
    assert_eq!(status, 201);
    singles.for_each(|s| s.abort());
}

/// `n` workers, alternately on replica `a` and replica `b`, each running `work(i, app)`:
/// everything they saw, once every one has finished (a worker's panic fails the test).
pub async fn workers_on_two<T, F, Fut>(a: &TestApp, b: &TestApp, n: usize, work: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, TestApp) -> Fut,
    Fut: std::future::Future<Output = Vec<T>> + Send + 'static,
{
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let app = if i % 2 == 0 { a.handle() } else { b.handle() };
            tokio::spawn(work(i, app))
        })
        .collect();
    let mut seen = Vec::new();
    for worker in workers {
        seen.extend(worker.await.expect("a worker"));
    }
    seen
}
