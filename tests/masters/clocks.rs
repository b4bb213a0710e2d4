//! Masters whose wall clock jumps, for real: Debian's redis-server with the clock shim
//! (`common/clockshim.c`) preloaded, its clock stepped while redlockd replicas use it.
//! Redis expires keys by its wall clock, so a forward jump drops every lock on it at once.

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisMaster, TestApp, config, master_in as master, wait_for};
use serde_json::{Value, json};

const TTL_MS: u64 = 8_000;

/// Three masters (the second with a movable clock) and two replicas over them, each step
/// given 200 ms; `trust` switches the watch off (the test that proves the test).
async fn deployment(trust: bool) -> (Vec<RedisMaster>, TestApp, TestApp) {
    let ms = vec![
        RedisMaster::start(),
        RedisMaster::start_with_movable_clock(&[]),
        RedisMaster::start(),
    ];
    let mut cfg = config(&ms);
    cfg.master_timeout_ms = 200;
    cfg.unsafe_trust_master_clocks = trust;
    let a = TestApp::spawn(cfg.clone()).await;
    let b = TestApp::spawn(cfg).await;
    (ms, a, b)
}

/// A lease on the first two masters only (the third's copy removed, as if its acquire
/// never arrived), granted on replica `a`: its validity's end, by this process's clock.
async fn lease_on_two(ms: &[RedisMaster], a: &TestApp) -> (String, Instant) {
    let asked = Instant::now();
    let (status, lease) = a.grant("jump", json!({"ttl_ms": TTL_MS})).await;
    assert_eq!(status, 201, "{lease}");
    let ends = asked + Duration::from_millis(lease["validity_ms"].as_u64().expect("validity"));
    // The grant was answered once a majority held it; the third master's acquire may still
    // be on its way on a loaded machine: wait for it to land, then remove it.
    let remove = ["DEL", "redlockd:lock:jump"];
    ms[2]
        .until("the lease's key on the third master", &remove, |n| n == 1)
        .await;
    (
        lease["lease_id"].as_str().expect("lease id").to_owned(),
        ends,
    )
}

/// Ask replica `b` for the name every 100 ms until `until`: every answer's status.
async fn contend(b: &TestApp, until: Instant) -> Vec<(Duration, u16, Value)> {
    let started = Instant::now();
    let mut answers = Vec::new();
    while Instant::now() < until {
        let (status, body) = b.grant("jump", json!({"ttl_ms": TTL_MS})).await;
        answers.push((started.elapsed(), status, body));
        if status == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answers
}

#[tokio::test]
async fn a_master_whose_clock_jumps_forward_never_lets_a_second_holder_in() {
    let (ms, a, b) = deployment(false).await;
    let (_lease, ends) = lease_on_two(&ms, &a).await;
    // The second master's clock jumps past the lease's TTL: its copy expires at once.
    ms[1].set_clock_offset(20_000);
    let answers = contend(&b, ends).await;
    assert!(!answers.is_empty());
    for (at, status, body) in &answers {
        assert!(
            *status == 409 || *status == 503,
            "answered {status} {at:?} after the jump, while the first lease's validity ran: {body}"
        );
    }
    // Both replicas say which master and how far, and count the jump.
    for app in [&a, &b] {
        let ready = wait_for(
            "/readyz to name the jump",
            Duration::from_secs(5),
            async || {
                let (_, ready) = app.get("/readyz").await;
                let m = master(&ready, &ms[1]).clone();
                let problem = m["problem"].as_str()?.to_owned();
                problem.starts_with("clock jumped +").then_some(m)
            },
        )
        .await;
        assert_eq!(ready["voting"], false, "{ready}");
        assert!(
            ready["clock_offset_ms"]
                .as_f64()
                .is_some_and(|o| o > 19_000.0),
            "{ready}"
        );
        let metrics = app.text("/metrics").await;
        let address = format!("redis://127.0.0.1:{}", ms[1].port);
        assert!(
            metrics.contains(&format!(
                "redlockd_master_clock_jumps_total{{direction=\"forward\",master=\"{address}\"}} 1"
            )),
            "{metrics}"
        );
    }
    // The master is quarantined as one that lost its data (its marker is gone), and the
    // other two still grant once the first lease's validity has ended.
    let marker: Option<String> = ms[1].cmd(&["GET", "redlockd:marker"]).await.expect("GET");
    assert_eq!(marker, None, "its marker is removed for every replica");
    tokio::time::sleep(ends.saturating_duration_since(Instant::now())).await;
    wait_for(
        "the name to be granted by the other two",
        Duration::from_secs(10),
        async || (b.grant("jump", json!({"ttl_ms": TTL_MS})).await.0 == 201).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn with_the_masters_clocks_trusted_the_same_jump_lets_a_second_holder_in() {
    // The test that proves the one above: the same deployment and steps, the watch told
    // to act on nothing. The contender is granted while the first lease's validity runs.
    let (ms, a, b) = deployment(true).await;
    let (_lease, ends) = lease_on_two(&ms, &a).await;
    ms[1].set_clock_offset(20_000);
    let answers = contend(&b, ends).await;
    let granted = answers.iter().find(|(_, status, _)| *status == 201);
    assert!(granted.is_some(), "the hazard did not show: {answers:?}");
    eprintln!(
        "trusting the clocks, a second holder was granted {:?} before the first lease's validity ended",
        ends.saturating_duration_since(Instant::now())
    );
}

#[tokio::test]
async fn a_jump_on_an_idle_master_is_caught_by_the_probe() {
    let (ms, a, _b) = deployment(false).await;
    a.must_grant("once", json!({"ttl_ms": 1000})).await;
    let marker = async || {
        ms[1]
            .cmd::<Option<String>>(&["GET", "redlockd:marker"])
            .await
            .unwrap()
    };
    let before = marker().await.expect("marked");
    ms[1].set_clock_offset(30_000);
    // No request touches the master: the probe (about once a second) reads its clock. The
    // jump is counted and the master quarantined (its marker removed); with no hold that
    // relied on it left on the others, it is restored under a new marker at once.
    let address = format!("redis://127.0.0.1:{}", ms[1].port);
    a.wait_for_metrics(
        "the probe to catch the jump",
        &format!(
            r#"redlockd_master_clock_jumps_total{{direction="forward",master="{address}"}} 1"#
        ),
    )
    .await;
    wait_for(
        "the master restored under a new marker",
        Duration::from_secs(5),
        async || marker().await.filter(|m| *m != before).map(drop),
    )
    .await;
}

#[tokio::test]
async fn a_backward_jump_is_counted_and_shown_and_the_master_keeps_voting() {
    let (ms, a, _b) = deployment(false).await;
    a.must_grant("once", json!({"ttl_ms": 1000})).await;
    ms[1].set_clock_offset(-30_000);
    let address = format!("redis://127.0.0.1:{}", ms[1].port);
    let counted = format!(
        r#"redlockd_master_clock_jumps_total{{direction="backward",master="{address}"}} 1"#
    );
    a.wait_for_metrics("the backward jump to be counted", &counted)
        .await;
    let (_, ready) = a.get("/readyz").await;
    assert_eq!(master(&ready, &ms[1])["voting"], true, "{ready}");
    assert!(
        master(&ready, &ms[1])["clock_offset_ms"]
            .as_f64()
            .is_some_and(|o| o < -29_000.0),
        "{ready}"
    );
}

#[tokio::test]
async fn a_clock_that_stood_off_while_watched_is_counted_at_once_by_a_new_replica_and_one_that_jumped_unwatched_is_not()
 {
    let ms = [
        RedisMaster::start(),
        RedisMaster::start_with_movable_clock(&[]),
        RedisMaster::start(),
    ];
    // The second master's clock stands 3 s ahead of the host's (an NTP gone wrong).
    ms[1].set_clock_offset(3_000);
    let mut cfg = config(&ms);
    cfg.master_timeout_ms = 200;
    // The first replica meets it with no one to vouch for it: it watches it for its whole
    // quarantine first (2 s here) before counting it.
    let mut short = cfg.clone();
    common::short_quarantine(&mut short);
    short.max_lock_delay_ms = 0;
    let a = TestApp::spawn(short).await;
    not_counted_when_first_met(&a, &ms[1]).await;
    wait_for(
        "the first replica to count it",
        Duration::from_secs(10),
        async || {
            let (_, ready) = a.get("/readyz").await;
            (master(&ready, &ms[1])["voting"] == true).then_some(())
        },
    )
    .await;
    // Counted, it records the offset it watched on the master (at its next probe).
    let records = ["HLEN", "redlockd:clocks"];
    ms[1]
        .until("the first replica's record", &records, |n| n > 0)
        .await;
    // A second replica, whose quarantine is an hour: it counts the master at once, since the
    // first one's fresh record agrees with what it reads.
    let b = TestApp::spawn(cfg.clone()).await;
    let (_, ready) = b.get("/readyz").await;
    assert_eq!(master(&ready, &ms[1])["voting"], true, "{ready}");
    // With no replica watching, the clock jumps 30 s more: a third replica's reading agrees
    // with no record, so it does not count the master.
    a.stop().await;
    b.stop().await;
    ms[1].set_clock_offset(33_000);
    let c = TestApp::spawn(cfg).await;
    not_counted_when_first_met(&c, &ms[1]).await;
}

/// `app`'s `/readyz` shows master `m` not voting, as a clock first met (not yet watched).
async fn not_counted_when_first_met(app: &TestApp, m: &RedisMaster) {
    let (_, ready) = app.get("/readyz").await;
    let met = master(&ready, m);
    assert_eq!(met["voting"], false, "{met}");
    assert!(
        met["problem"]
            .as_str()
            .is_some_and(|p| p.contains("first met")),
        "{met}"
    );
}
