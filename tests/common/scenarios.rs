//! Behaviours written once and run on every bed that serves them: the in-process app on
//! the embedded store (`tests/contract`) and replicas on real masters (`tests/masters`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::TestApp;

/// Revoke `lease` of the lock `name`, and assert that it was revoked.
pub async fn revoke(app: &TestApp, name: &str, lease: &Value) {
    let id = lease["lease_id"].as_str().expect("a lease");
    app.deleted(&format!("/locks/{name}/leases/{id}")).await;
}

/// A hold of `name` through `holder`, a grant of it waiting in line on `waiting` (its lock
/// class is `name`), then the hold's revoke: the waiting grant is woken by it, within
/// `bound`, with a greater token. The waiting grant's lease.
pub async fn revoke_wakes(
    holder: &TestApp,
    waiting: &TestApp,
    name: &str,
    bound: Duration,
) -> Value {
    let (lease, token) = holder.must_grant(name, json!({"ttl_ms": 30_000})).await;
    let waiter = waiting
        .grant_in_line(name, json!({"wait_ms": 20_000}), name, 1)
        .await;
    let released = Instant::now();
    assert_eq!(holder.revoke(name, &lease).await.0, 204);
    super::woken_within(waiter, released, bound, Some(token)).await
}

/// A hold taken and let go, as a worker's loop does: `POST path` with `body` (which must
/// be granted), held for `hold`, then revoked through the name `name`. Its lease, and the
/// moments it was surely held from and to (its grant answered, its revoke not yet sent).
pub async fn hold_then_revoke(
    app: &TestApp,
    path: &str,
    name: &str,
    body: Value,
    hold: Duration,
) -> (Value, Instant, Instant) {
    let lease = app.created(path, body).await;
    let from = Instant::now();
    tokio::time::sleep(hold).await;
    let to = Instant::now();
    revoke(app, name, &lease).await;
    (lease, from, to)
}

/// Holds through `session`, their names starting `prefix`: a lock (`<prefix>lock`), a permit
/// of the semaphore `<prefix>pool` of `limit`, and a shared lock (`<prefix>doc`); with
/// `more`, also a lease on `<prefix>a` and `<prefix>b` and a term of the election
/// `<prefix>lead`. Each must be granted; their leases.
pub async fn hold_through(
    app: &TestApp,
    session: &str,
    prefix: &str,
    limit: u32,
    more: bool,
) -> Vec<Value> {
    let mut holds = vec![
        (format!("/locks/{prefix}lock"), json!({})),
        (format!("/semaphores/{prefix}pool"), json!({"limit": limit})),
        (format!("/locks/{prefix}doc"), json!({"mode": "shared"})),
    ];
    if more {
        let names = [format!("{prefix}a"), format!("{prefix}b")];
        holds.push(("/locks".to_owned(), json!({"names": names})));
        holds.push((format!("/elections/{prefix}lead"), json!({"value": "me"})));
    }
    let mut held = Vec::new();
    for (path, mut body) in holds {
        body["session"] = json!(session);
        held.push(app.created(&path, body).await);
    }
    held
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

/// A hold through a session reports one TTL, the session's, whether checked or renewed by
/// its lease id (a renew asking for another TTL changes nothing: the session governs), with
/// the validity what is left of the session; and a grant through a session takes no
/// `ttl_ms` into account, not even to refuse it (a renew answered what was left as its TTL,
/// and an out-of-range `ttl_ms` was refused though unused).
pub async fn a_session_hold_reports_the_sessions_ttl_whether_checked_or_renewed(app: &TestApp) {
    let session = app.created("/sessions", json!({"ttl_ms": 15_000})).await;
    let id = session["session_id"].as_str().unwrap();
    let (status, held) = app
        .send(
            "POST",
            "/locks/s:ttl",
            Some(json!({"session": id, "ttl_ms": 999_999_999})),
        )
        .await;
    assert_eq!(status, 201, "an unused ttl_ms is not judged: {held}");
    assert_eq!(held["ttl_ms"], 15_000, "{held}");
    let path = format!("/locks/s:ttl/leases/{}", held["lease_id"].as_str().unwrap());
    let (status, checked) = app.send("GET", &path, None).await;
    assert_eq!(status, 200, "{checked}");
    let (status, renewed) = app
        .send("PUT", &path, Some(json!({"ttl_ms": 60_000})))
        .await;
    assert_eq!(status, 200, "{renewed}");
    for (what, body) in [("check", &checked), ("renew", &renewed)] {
        assert_eq!(body["ttl_ms"], 15_000, "{what}: {body}");
        assert!(
            body["validity_ms"].as_u64().unwrap() <= 15_000,
            "{what}: {body}"
        );
    }
    // The renew extended nothing: what it answers is no more than what the check found left
    // (a renew that took the 60 s it asked for would answer about 60 000).
    assert!(
        renewed["validity_ms"].as_u64() <= checked["ttl_remaining_ms"].as_u64(),
        "{checked} then {renewed}"
    );
}

/// Inspect shows a lock-delay while it refuses grants of a free name (a lease that lapsed;
/// an election term that lapsed), and none after a holder's own release: inspect said only
/// `held: false` while every grant was refused.
pub async fn inspect_shows_a_lock_delay_while_it_refuses_grants(app: &TestApp) {
    app.must_grant("ld:lapsed", json!({"ttl_ms": 200, "lock_delay_ms": 3_000}))
        .await;
    let body = super::wait_for("the lease to lapse", Duration::from_secs(5), async || {
        let (_, body) = app.inspect("ld:lapsed").await;
        (body["held"] == false).then_some(body)
    })
    .await;
    let left = body["lock_delay_remaining_ms"].as_u64().unwrap_or(0);
    assert!(left > 0 && left <= 3_000, "{body}");
    let (status, refused) = app.grant("ld:lapsed", json!({})).await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (409, Some("lock_delay"))
    );

    let (status, released) = app
        .grant(
            "ld:released",
            json!({"ttl_ms": 10_000, "lock_delay_ms": 3_000}),
        )
        .await;
    assert_eq!(status, 201, "{released}");
    revoke(app, "ld:released", &released).await;
    let (_, body) = app.inspect("ld:released").await;
    assert!(body.get("lock_delay_remaining_ms").is_none(), "{body}");

    app.created(
        "/elections/ld:lead",
        json!({"value": "a", "ttl_ms": 200, "lock_delay_ms": 3_000}),
    )
    .await;
    let body = super::wait_for("the term to lapse", Duration::from_secs(5), async || {
        let (_, body) = app.send("GET", "/elections/ld:lead", None).await;
        (body["vacant"] == true).then_some(body)
    })
    .await;
    let left = body["lock_delay_remaining_ms"].as_u64().unwrap_or(0);
    assert!(left > 0 && left <= 3_000, "{body}");
}

/// What a majority of masters deny is the contract's 404, whatever the others' state (one
/// quarantined, down, unverified): a renew of a made-up or a revoked lease, and `GET`,
/// `PUT` and `DELETE /sessions/{id}` and a grant through a session, of an ended session and
/// of a made-up one.
pub async fn what_a_majority_denies_is_404(app: &TestApp) {
    let not_found = |(status, body): (u16, Value), code: &str, what: &str| {
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some(code)),
            "{what}: {body}"
        );
    };
    let made_up = "AAAAAAAAAAAAAAAAAAAAAA";
    not_found(
        app.renew("x", made_up, json!({})).await,
        "lease_not_found",
        "a made-up lease's renew",
    );
    let (id, _) = app.must_grant("r", json!({"ttl_ms": 10_000})).await;
    assert_eq!(app.revoke("r", &id).await.0, 204);
    not_found(
        app.renew("r", &id, json!({})).await,
        "lease_not_found",
        "a revoked lease's renew",
    );
    let session = app.created("/sessions", json!({"ttl_ms": 10_000})).await;
    let ended = session["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    app.deleted(&format!("/sessions/{ended}")).await;
    for id in [ended.as_str(), made_up] {
        for method in ["GET", "PUT", "DELETE"] {
            let body = (method == "PUT").then(|| json!({}));
            let answer = app.send(method, &format!("/sessions/{id}"), body).await;
            not_found(
                answer,
                "session_not_found",
                &format!("{method} /sessions/{id}"),
            );
        }
        let path = format!("/locks/through?session={id}");
        let answer = app.send("POST", &path, Some(json!({}))).await;
        not_found(answer, "session_not_found", "a grant through it");
    }
}
