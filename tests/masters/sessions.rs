//! Sessions on three real masters and two replicas: a lock, a permit and a shared lock held
//! through one session opened on one replica stay held for twice its TTL while only the
//! session is renewed (on the other replica), ending it frees them all at once and wakes a
//! waiter on the other replica, an expired session's holds are free, a streamed session's
//! holds are freed within a second of its connection closing, and a renew of a session with
//! 100 holds is one call per master. A hold through a session carried by exactly two masters
//! stays its holder's, unconfirmed, when one of them is killed or paused, until the validity
//! answered before has run out; a hold revoked or force-released is named lost by the next
//! renew and no longer listed.

use crate::common;

use std::time::{Duration, Instant};

use common::{TestApp, masters, wait_for};
use serde_json::{Value, json};

async fn open(app: &TestApp, ttl_ms: u64) -> String {
    let session = app.created("/sessions", json!({"ttl_ms": ttl_ms})).await;
    session["session_id"].as_str().unwrap().to_owned()
}

/// How many of the three nobody holds, as inspect on `app` sees them.
async fn free_count(app: &TestApp) -> usize {
    let (_, lock) = app.inspect("m:lock").await;
    let (_, doc) = app.inspect("m:doc").await;
    let (_, pool) = app.get("/semaphores/m:pool").await;
    usize::from(lock["held"] == false)
        + usize::from(doc["held"] == false)
        + usize::from(pool["holders"].as_array().is_some_and(Vec::is_empty))
}

#[tokio::test]
async fn holds_live_while_only_their_session_is_renewed_on_another_replica_and_end_with_it() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let session = open(&a, 500).await;
    common::scenarios::hold_through(&a, &session, "m:", 1, false).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1000) {
        let (status, renewed) = b.send("PUT", &format!("/sessions/{session}"), None).await;
        assert_eq!(status, 200, "{renewed}");
        let (_, lock) = b.inspect("m:lock").await;
        assert_eq!(lock["held"], true, "held at {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(
        free_count(&b).await,
        0,
        "all three still held after twice the TTL"
    );
    let (_, read) = b.get(&format!("/sessions/{session}")).await;
    assert_eq!(read["holds"].as_array().unwrap().len(), 3, "{read}");

    let waiter = b
        .grant_in_line("m:lock", json!({"wait_ms": 10000, "ttl_ms": 200}), "m", 1)
        .await;
    let ended = Instant::now();
    a.deleted(&format!("/sessions/{session}")).await;
    common::woken_within(waiter, ended, Duration::from_millis(500), None).await;
    wait_for(
        "the other holds to be free",
        Duration::from_secs(1),
        async || (free_count(&b).await >= 2).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn an_expired_sessions_holds_are_free_on_every_replica() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let session = open(&a, 300).await;
    common::scenarios::hold_through(&a, &session, "m:", 1, false).await;
    assert_eq!(free_count(&b).await, 0);
    wait_for(
        "the session's holds to lapse",
        Duration::from_secs(3),
        async || (free_count(&b).await == 3).then_some(()),
    )
    .await;
    let (status, body) = b.get(&format!("/sessions/{session}")).await;
    assert_eq!((status, &body["error"]), (404, &json!("session_not_found")));
    let (status, body) = b.grant("m:late", json!({"session": session})).await;
    assert_eq!((status, &body["error"]), (404, &json!("session_not_found")));
}

#[tokio::test]
async fn a_streamed_sessions_holds_are_freed_within_a_second_of_its_connection_closing() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (stream, session) = a.hold_session("ttl_ms=5000").await;
    common::scenarios::hold_through(&b, &session, "m:", 1, false).await;
    drop(stream);
    let closed = Instant::now();
    wait_for("the holds to be free", Duration::from_secs(1), async || {
        (free_count(&b).await == 3).then_some(())
    })
    .await;
    eprintln!("freed {:?} after the stream closed", closed.elapsed());
}

/// What `redlockd_master_calls_total` says of each master.
async fn calls(app: &TestApp) -> Vec<u64> {
    let metrics = app.text("/metrics").await;
    metrics
        .lines()
        .filter(|l| l.starts_with("redlockd_master_calls_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

#[tokio::test]
async fn a_renew_of_a_session_with_100_holds_is_one_call_per_master() {
    let (_masters, a, _b) = common::two_replicas_over_three().await;
    let session = open(&a, 30000).await;
    for i in 0..100 {
        let (status, lease) = a
            .grant(&format!("h:{i}"), json!({"session": session}))
            .await;
        assert_eq!(status, 201, "{lease}");
    }
    // Late answers of the grants (a straggler's settling, say) travel after them: measure
    // once every master's calls have stopped moving.
    let mut last = calls(&a).await;
    let before = wait_for(
        "the grants' calls to settle",
        Duration::from_secs(5),
        async || {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = calls(&a).await;
            let steady = now == last;
            last = now.clone();
            steady.then_some(now)
        },
    )
    .await;
    let (status, renewed) = a.send("PUT", &format!("/sessions/{session}"), None).await;
    assert_eq!(status, 200, "{renewed}");
    let after = calls(&a).await;
    let per_master: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("a renew of a session with 100 holds: {per_master:?} calls per master");
    assert_eq!(per_master, vec![1, 1, 1], "one call per master");
    let (_, read) = a.get(&format!("/sessions/{session}")).await;
    assert_eq!(read["holds"].as_array().map(Vec::len), Some(100));
    let holds: &Vec<Value> = read["holds"].as_array().unwrap();
    assert!(holds.iter().all(|h| h["kind"] == "lock"));
}

/// The promise a session renew keeps on real masters: a hold carried by exactly two of three
/// (its key gone from C), one of which is then SIGKILLed or SIGSTOPped, is not released by
/// the next session renew (it is `unconfirmed`, not `lost`, and not `kept`), and no other
/// client, on either replica, is granted its name before the validity the last renew that
/// kept it answered has ended. (Before, the renew released it, and the other replica
/// granted the name about 5.5 s early.)
#[tokio::test]
async fn a_session_hold_whose_carrier_dies_is_kept_until_its_validity_ends() {
    for kill in [true, false] {
        let mut ms = masters(3);
        let (a, b) = common::two_replicas(&ms).await;
        let session = open(&a, 2000).await;
        let lease = a
            .created("/locks/m:lock", json!({"session": session}))
            .await;
        let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
        // The hold's key is gone from C: only A and B carry it.
        let deleted: u64 = ms[2].cmd(&["DEL", "redlockd:lock:m:lock"]).await.unwrap();
        assert_eq!(deleted, 1);
        let sent = Instant::now();
        let (status, renewed) = a.send("PUT", &format!("/sessions/{session}"), None).await;
        assert_eq!(status, 200, "{renewed}");
        assert_eq!(renewed["kept"], json!([lease_id]), "{renewed}");
        let deadline = sent + Duration::from_millis(renewed["validity_ms"].as_u64().unwrap());

        if kill {
            ms[1].stop();
        } else {
            ms[1].pause();
        }
        let (status, renewed) = a.send("PUT", &format!("/sessions/{session}"), None).await;
        assert_eq!(status, 200, "{renewed}");
        // Nobody, on either replica, gets the name while the answered validity runs.
        while Instant::now() + Duration::from_millis(250) < deadline {
            for app in [&a, &b] {
                let (status, body) = app
                    .send("POST", "/locks/m:lock", Some(json!({"ttl_ms": 1000})))
                    .await;
                assert_ne!(
                    status,
                    201,
                    "granted {:?} before the holder's validity ended (kill: {kill}): {body}",
                    deadline - Instant::now()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(renewed["unconfirmed"], json!([lease_id]), "{renewed}");
        assert!(renewed.get("lost").is_none(), "{renewed}");
        assert_eq!(renewed["kept"], json!([]), "{renewed}");
        if !kill {
            ms[1].resume();
        }
    }
}

/// A hold revoked by its lease id or force-released by an administrator is not listed by
/// `GET /sessions/{id}`, and the next renew names a force-released one `lost` (not kept).
#[tokio::test]
async fn a_session_names_holds_that_ended_lost_and_lists_only_live_ones() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let session = open(&a, 5000).await;
    let mut ids = Vec::new();
    for name in ["m:one", "m:two"] {
        let lease = a
            .created(&format!("/locks/{name}"), json!({"session": session}))
            .await;
        ids.push(lease["lease_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(a.revoke("m:one", &ids[0]).await.0, 204);
    assert_eq!(b.send("DELETE", "/locks/m:two", None).await.0, 200);
    let (_, read) = b.get(&format!("/sessions/{session}")).await;
    assert_eq!(read["holds"], json!([]), "{read}");
    let (status, renewed) = b.send("PUT", &format!("/sessions/{session}"), None).await;
    assert_eq!(status, 200, "{renewed}");
    let lost = renewed["lost"].as_array().cloned().unwrap_or_default();
    assert!(lost.contains(&json!(ids[1])), "{renewed}");
    assert_eq!(renewed["kept"], json!([]), "{renewed}");
}

#[tokio::test]
async fn a_session_hold_reports_the_sessions_ttl_whether_checked_or_renewed() {
    let (_masters, a, _b) = common::two_replicas_over_three().await;
    common::scenarios::a_session_hold_reports_the_sessions_ttl_whether_checked_or_renewed(&a).await;
}

/// A session's held stream on real masters (session.lua keeps which stream holds the
/// session, and a stream's end ends only a session it keeps): a blip with a grace, resumed
/// through the other replica, keeps the session and its holds after the first stream's
/// grace is up; a replica that stops tells its session stream `closed` with `resume` and
/// keeps the session renewed past its TTL until the holder resumes it elsewhere; the resumed
/// stream's own end frees the holds.
#[tokio::test]
async fn a_sessions_held_stream_resumes_through_the_other_replica() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (first, session) = a.hold_session("ttl_ms=600&grace_ms=500").await;
    common::scenarios::hold_through(&b, &session, "m:", 1, false).await;
    drop(first);
    let mut resumed = b.resume_session(&session, json!({})).await;
    resumed.expect("resumed").await;
    a.session_streams_done().await;
    // Past the first stream's grace and the session's TTL: held by the resumed stream.
    resumed.expect("heartbeat").await;
    resumed.expect("heartbeat").await;
    assert_eq!(
        free_count(&a).await,
        0,
        "the first stream's grace ended the session"
    );

    // A rolling deploy: the replica holding the stream stops, and the holder takes longer
    // than the session's TTL to come back; the stopping replica kept it renewed meanwhile.
    let stopping = tokio::spawn(b.stop());
    let closed = resumed.expect("closed").await;
    assert_eq!(closed["resume"], true, "{closed}");
    // Longer than the session would have lived on its last renew.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut again = a.resume_session(&session, json!({})).await;
    again.expect("resumed").await;
    assert_eq!(
        free_count(&a).await,
        0,
        "the session lapsed during the deploy"
    );
    common::joined_within(
        stopping,
        Duration::from_secs(5),
        "the stopping replica ends once its session stream was resumed",
    )
    .await;
    drop(again);
    wait_for("the holds to be free", Duration::from_secs(2), async || {
        (free_count(&a).await == 3).then_some(())
    })
    .await;
}

/// A waiter is there when a dropped session stream's grace ends, after its holder resumed
/// it through the other replica: that end frees nothing, so the waiter is not granted
/// while the resumed stream keeps the session.
#[tokio::test]
async fn a_dropped_session_streams_grace_end_frees_nothing_the_resume_holds() {
    let (_masters, a, b) = common::two_replicas_over_three().await;
    let (mut first, id) = a.hold_session("ttl_ms=900&grace_ms=1100").await;
    assert_eq!(a.grant("w:lock", json!({"session": id})).await.0, 201);
    first.expect("heartbeat").await;
    let dropped = Instant::now();
    drop(first);
    let mut resumed = b.resume_session(&id, json!({})).await;
    resumed.expect("resumed").await;
    let (status, body) = a
        .grant("w:lock", json!({"ttl_ms": 1000, "wait_ms": 1500}))
        .await;
    assert_eq!(
        status,
        409,
        "a waiter was granted {:?} after the first stream dropped: {body}",
        dropped.elapsed()
    );
    resumed.expect("heartbeat").await;
}
