//! Faults on real masters: paused (SIGSTOP), killed, restarted with and without their
//! data, connections dropped. Waits poll a condition with a deadline.

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisMaster, TestApp, config, master_in as master, masters, wait_for};
use serde_json::{Value, json};

async fn readiness(app: &TestApp) -> (u16, Value) {
    app.get("/readyz").await
}

/// When `app`'s `/readyz` says master `m` is quarantined until, once it says so (5 s at
/// most).
async fn quarantined_until(app: &TestApp, m: &RedisMaster) -> String {
    wait_for(
        "the master to be quarantined",
        Duration::from_secs(5),
        async || {
            let (_, ready) = readiness(app).await;
            master(&ready, m)["quarantined_until"]
                .as_str()
                .map(str::to_owned)
        },
    )
    .await
}

/// Grant `name` with `body` while master `away` is down (a paused one would take the grant
/// late, when it resumes), then start it again empty: the hold is on the other two only, so
/// that when one of them loses its data the hold is left on too few masters for its
/// quarantine to skip it (it waits for the hold to end). Returns once `away` is restored
/// and votes (its own quarantine waits for nothing: every hold is on both others).
async fn grant_without(
    app: &TestApp,
    ms: &mut [RedisMaster],
    away: usize,
    name: &str,
    body: Value,
) -> (String, u64) {
    ms[away].stop();
    let granted = app.must_grant(name, body).await;
    ms[away].start_wiped();
    let back = &ms[away];
    wait_for(
        "the wiped master to vote",
        Duration::from_secs(10),
        async || {
            back.cmd::<Option<String>>(&["GET", "redlockd:marker"])
                .await
                .ok()??;
            let (_, ready) = readiness(app).await;
            (master(&ready, back)["voting"] == true).then_some(())
        },
    )
    .await;
    granted
}

#[tokio::test]
async fn one_paused_master_is_tolerated_two_are_503() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    let (id, token) = app.must_grant("p", json!({"ttl_ms": 30000})).await;

    ms[2].pause();
    let started = Instant::now();
    let (status, lease) = app.grant("p1", json!({"ttl_ms": 30000})).await;
    eprintln!("grant with one master paused took {:?}", started.elapsed());
    assert_eq!(status, 201, "{lease}");
    assert_eq!(app.renew("p", &id, json!({})).await.0, 200);
    assert_eq!(app.check("p", &id).await.0, 200);

    ms[1].pause();
    let (status, body) = app.grant("p2", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("quorum_unavailable")),
        "{body}"
    );
    // The 503 says which masters failed and how.
    let failed: Vec<(&str, &str)> = body["masters"]
        .as_array()
        .expect("the masters that failed")
        .iter()
        .map(|m| (m["address"].as_str().unwrap(), m["error"].as_str().unwrap()))
        .collect();
    for m in [&ms[1], &ms[2]] {
        let address = format!("redis://127.0.0.1:{}", m.port);
        assert!(
            failed.contains(&(address.as_str(), "timeout")),
            "{address} missing from {body}"
        );
    }
    let (status, body) = app.renew("p", &id, json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("quorum_unavailable"))
    );
    wait_for("readyz to fail", Duration::from_secs(5), async || {
        (readiness(&app).await.0 == 503).then_some(())
    })
    .await;

    ms[1].resume();
    ms[2].resume();
    // The paused masters now run the commands queued for them, the failed grant's
    // release among them; the lease that was renewed on a majority is intact.
    wait_for("readyz to recover", Duration::from_secs(5), async || {
        (readiness(&app).await.0 == 200).then_some(())
    })
    .await;
    let (status, checked) = app.check("p", &id).await;
    assert_eq!(
        (status, checked["fencing_token"].as_u64()),
        (200, Some(token))
    );
    let (status, _) = app.grant("p2", json!({})).await;
    assert_eq!(status, 201, "the failed grant left nothing behind");
}

/// How much work the app's backlog holds for master `m`, from `/metrics`.
async fn backlog(app: &TestApp, m: &RedisMaster) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let series = format!("redlockd_master_backlog{{master=\"{}\"}} ", m.url());
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn tokens_rise_when_real_masters_counters_diverge() {
    // Persistent masters: a killed master refuses connections (nothing queues for it) and
    // comes back with its data, so its counter really falls behind the others'.
    let persistent = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut ms: Vec<RedisMaster> = (0..3)
        .map(|_| RedisMaster::start_with(None, &persistent))
        .collect();
    // Every write is fsynced: while the machine's disk is busy (seen while Chromium started
    // cold beside this test) that took a master past a second, and this test is about
    // tokens, not latency.
    let app = TestApp::over(&ms, |cfg| cfg.master_timeout_ms = 2000).await;
    let fence = async |m: &RedisMaster| {
        m.cmd::<Option<u64>>(&["GET", "redlockd:fence"])
            .await
            .unwrap()
            .unwrap_or(0)
    };
    let voting = async |app: &TestApp, m: &RedisMaster| {
        let (_, ready) = readiness(app).await;
        master(&ready, m)["voting"] == true
    };

    ms[2].stop();
    let mut last = 0;
    for i in 0..10 {
        let (id, token) = app
            .must_grant("d", json!({"owner": format!("ab{i}")}))
            .await;
        assert!(token > last);
        last = token;
        assert_eq!(app.revoke("d", &id).await.0, 204);
    }

    // Each grant C missed left it work: settling the acquire (which writes the chosen
    // token to C if it answers in time) and repeating the release until C answers. Bring C
    // back once only the releases are left, so that its counter really stays behind.
    wait_for(
        "C's backlog to hold only the releases it owes",
        Duration::from_secs(20),
        async || (backlog(&app, &ms[2]).await == 10).then_some(()),
    )
    .await;
    ms[2].start_again();
    wait_for(
        "C to vote again (it kept its marker)",
        Duration::from_secs(10),
        async || voting(&app, &ms[2]).await.then_some(()),
    )
    .await;
    let (c, a) = (fence(&ms[2]).await, fence(&ms[0]).await);
    assert!(c < a, "the counters diverged: C {c}, A {a}");
    ms[1].stop();
    let (id, token) = app.must_grant("d", json!({"owner": "ac"})).await;
    assert!(token > last);
    last = token;
    assert_eq!(
        fence(&ms[2]).await,
        token,
        "the chosen token was written back to C"
    );
    assert_eq!(app.revoke("d", &id).await.0, 204);

    ms[1].start_again();
    wait_for("B to vote again", Duration::from_secs(10), async || {
        voting(&app, &ms[1]).await.then_some(())
    })
    .await;
    ms[0].stop();
    let (_, token) = app.must_grant("d", json!({"owner": "bc"})).await;
    assert!(token > last, "token {token} must exceed {last}");
}

#[tokio::test]
async fn a_master_that_restarts_empty_is_quarantined_for_the_largest_ttl() {
    let mut ms = masters(3);
    let app = TestApp::over(&ms, |cfg| {
        common::short_quarantine(cfg);
        // No lock-delays here: the quarantine is the largest TTL alone (a delay would add its
        // largest; see domain::engine).
        cfg.max_lock_delay_ms = 0;
    })
    .await;
    // Held on A and C for the largest TTL: once C loses it, it waits for it.
    let (_, first) = grant_without(&app, &mut ms, 1, "q", json!({"ttl_ms": 2000})).await;

    ms[2].restart_empty();
    let until = quarantined_until(&app, &ms[2]).await;
    eprintln!("quarantined until {until}");
    let (status, ready) = readiness(&app).await;
    assert_eq!(status, 200, "A and B are a majority: {ready}");
    assert_eq!(master(&ready, &ms[2])["voting"], false);

    let (id, second) = app.must_grant("q2", json!({})).await;
    assert!(second > first);
    app.revoke("q2", &id).await;

    let restored_after = Instant::now();
    wait_for("C to vote again", Duration::from_secs(10), async || {
        let (_, ready) = readiness(&app).await;
        (master(&ready, &ms[2])["voting"] == true).then_some(())
    })
    .await;
    eprintln!(
        "C voted again {:?} after the quarantine was seen",
        restored_after.elapsed()
    );
    let fence: u64 = ms[2].cmd(&["GET", "redlockd:fence"]).await.unwrap();
    assert!(
        fence >= second,
        "C's counter {fence} was raised to at least {second}"
    );

    // C votes: with A gone, B and C grant, and tokens keep rising.
    ms[0].stop();
    let (_, third) = app.must_grant("q3", json!({})).await;
    assert!(third > second);
}

#[tokio::test]
async fn a_master_that_drops_its_connections_is_reconnected() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    app.must_grant("before", json!({})).await;
    for m in &ms {
        let _: redis::Value = m.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).await.unwrap();
        let _: redis::Value = m.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).await.unwrap();
    }
    wait_for("grants to work again", Duration::from_secs(5), async || {
        (app.grant("after", json!({})).await.0 == 201).then_some(())
    })
    .await;
    // And the release subscription came back too: a waiter is woken by a revoke.
    let (holder, _) = app.must_grant("sub", json!({"ttl_ms": 30000})).await;
    let other = TestApp::spawn(config(&ms)).await;
    let started = Instant::now();
    let waiter = app
        .grant_in_line("sub", json!({"wait_ms": 20000}), "sub", 1)
        .await;
    assert_eq!(other.revoke("sub", &holder).await.0, 204);
    assert_eq!(waiter.await.unwrap().0, 201);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn scripts_are_reloaded_after_a_script_flush() {
    let ms = masters(3);
    let app = TestApp::spawn(config(&ms)).await;
    let (id, _) = app.must_grant("s", json!({})).await;
    for m in &ms {
        let _: String = m.cmd(&["SCRIPT", "FLUSH"]).await.unwrap();
    }
    // EVALSHA now answers NOSCRIPT on every master; the node loads the script and retries.
    assert_eq!(app.renew("s", &id, json!({})).await.0, 200);
    assert_eq!(app.revoke("s", &id).await.0, 204);
    app.must_grant("s", json!({})).await;
}

#[tokio::test]
async fn a_renew_decided_without_a_master_still_reaches_it() {
    let ms = masters(3);
    // Redis lifts a client pause on its next cron tick (up to 100 ms): a master timeout
    // well above that.
    let app = TestApp::over(&ms, |cfg| cfg.master_timeout_ms = 1000).await;
    let (id, _) = app.must_grant("late", json!({"ttl_ms": 60000})).await;
    // The third master lost its scripts, and holds every command for a moment (within the master timeout): the renew is
    // decided on the other two, and its call to the third still has to go on past NOSCRIPT
    // (SCRIPT LOAD, EVALSHA again) once the master answers.
    let _: String = ms[2].cmd(&["SCRIPT", "FLUSH"]).await.unwrap();
    let _: String = ms[2].cmd(&["CLIENT", "PAUSE", "20", "ALL"]).await.unwrap();
    let (status, _) = app.renew("late", &id, json!({"ttl_ms": 90000})).await;
    assert_eq!(status, 200);
    // Room for a loaded machine (the cluster tests run beside this one): `until` waits 5 s.
    let pttl = ["PTTL", "redlockd:lock:late"];
    ms[2]
        .until("the renew to reach the third master too", &pttl, |left| {
            left > 80_000
        })
        .await;
}

/// Seconds from now to an RFC 3339 `quarantined_until`.
fn seconds_until(rfc3339: &str) -> f64 {
    let until = humantime::parse_rfc3339(rfc3339).expect("an RFC 3339 time");
    match until.duration_since(std::time::SystemTime::now()) {
        Ok(left) => left.as_secs_f64(),
        Err(past) => -past.duration().as_secs_f64(),
    }
}

#[tokio::test]
async fn with_no_lock_delay_in_force_empty_restarts_cost_the_largest_ttl_not_the_largest_delay() {
    // The matrix: 2 s TTLs, the default largest lock-delay (60 s), four empty
    // restarts of single masters in a row. Before, each sat out 62 s and the deployment was
    // left with no majority; now each sits out the largest TTL, as none has a delay.
    let mut ms = masters(3);
    let app = TestApp::over(&ms, common::short_quarantine).await;
    assert_eq!(config(&ms).max_lock_delay_ms, 60_000, "the default");
    for round in 0..4 {
        let m = round % 3;
        // Held without the next master: once m loses it, m waits for it.
        let name = format!("r{round}");
        grant_without(&app, &mut ms, (m + 1) % 3, &name, json!({"ttl_ms": 2000})).await;
        ms[m].restart_empty();
        let until = quarantined_until(&app, &ms[m]).await;
        let left = seconds_until(&until);
        assert!(
            left < 2.5,
            "quarantined for {left:.1} s: the largest TTL is 2 s"
        );
        wait_for(
            "the master to vote again",
            Duration::from_secs(10),
            async || {
                let (status, ready) = readiness(&app).await;
                (status == 200 && master(&ready, &ms[m])["voting"] == true).then_some(())
            },
        )
        .await;
    }
}

#[tokio::test]
async fn an_empty_restart_sits_out_the_lock_delay_in_force_on_the_others() {
    let mut ms = masters(3);
    let app = TestApp::over(&ms, common::short_quarantine).await;
    // A 1 s lease with a 5 s lock-delay: its claim runs about 6 s, on A and B only.
    let body = json!({"ttl_ms": 1000, "lock_delay_ms": 5000});
    grant_without(&app, &mut ms, 2, "d", body).await;
    ms[1].restart_empty();
    let until = quarantined_until(&app, &ms[1]).await;
    let left = seconds_until(&until);
    assert!(
        (4.0..7.0).contains(&left),
        "the delay in force (about 6 s), not the largest TTL (2 s) nor the largest allowed (62 s): {left:.1} s"
    );
}
