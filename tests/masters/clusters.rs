//! Redis Clusters as the quorum's masters: three real clusters of three primaries each on
//! loopback (`redis+cluster://`), two redlockd replicas over them. The promises of single
//! masters, kind by kind, plus what a cluster adds: names spread over every shard, no shard
//! taking most of a cluster's fencing increments, sharded announcements, and one shard's
//! data loss stopping only the names in its slots.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{RedisCluster, TestApp, shard_in, wait_for};
use redlockd::store::layout;
use serde_json::{Value, json};

fn clusters(n: usize) -> Vec<RedisCluster> {
    (0..n).map(|_| RedisCluster::start(3)).collect()
}

fn config(clusters: &[RedisCluster]) -> redlockd::config::Config {
    let mut config = redlockd::config::Config::from_env().expect("default config");
    config.listen = "127.0.0.1:0".into();
    config.redis_urls = clusters.iter().map(RedisCluster::url).collect();
    config.master_timeout_ms = 500;
    config
}

async fn replicas(clusters: &[RedisCluster]) -> (TestApp, TestApp) {
    common::init_test_logging();
    let cfg = config(clusters);
    let (a, b) = (TestApp::spawn(cfg.clone()).await, TestApp::spawn(cfg).await);
    for app in [&a, &b] {
        every_shard_votes(app).await;
    }
    (a, b)
}

/// Two replicas whose quarantine is short (2 s TTLs, no lock-delay), so that a shard's
/// return is seen within a test.
async fn replicas_with_short_quarantine(clusters: &[RedisCluster]) -> (TestApp, TestApp) {
    let mut cfg = config(clusters);
    common::short_quarantine(&mut cfg);
    cfg.max_lock_delay_ms = 0;
    let (a, b) = (TestApp::spawn(cfg.clone()).await, TestApp::spawn(cfg).await);
    for app in [&a, &b] {
        every_shard_votes(app).await;
    }
    (a, b)
}

/// Wait until `/readyz` shows every shard of every cluster voting.
async fn every_shard_votes(app: &TestApp) {
    let started = Instant::now();
    loop {
        let (status, ready) = app.get("/readyz").await;
        // And hears every cluster's announcements: until then a waiter here is woken by a
        // release elsewhere only when it looks again.
        let all = ready["masters"].as_array().is_some_and(|masters| {
            masters.iter().all(|m| {
                m["subscribed"] == true
                    && m["shards"]
                        .as_array()
                        .is_some_and(|s| !s.is_empty() && s.iter().all(|s| s["voting"] == true))
            })
        });
        if status == 200 && all {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not every shard votes after 30 s: {ready}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// `cmdstat_<name>:calls=N` of one node (commands run inside scripts count).
async fn calls(node: &common::RedisMaster, command: &str) -> u64 {
    let info: String = node.cmd(&["INFO", "commandstats"]).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn three_hundred_names_spread_over_every_shard_of_three_clusters() {
    let cs = clusters(3);
    let (a, b) = replicas(&cs).await;
    for c in &cs {
        for shard in &c.shards {
            let _: String = shard.cmd(&["CONFIG", "RESETSTAT"]).await.expect("reset");
        }
    }
    let names: Vec<String> = (0..300).map(|i| format!("job:{i:03}")).collect();
    let mut leases = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let app = if i % 2 == 0 { &a } else { &b };
        let (lease, token) = app.must_grant(name, json!({"ttl_ms": 30000})).await;
        leases.insert(name.clone(), (lease, token));
    }
    // Every shard of every cluster carries some of them.
    for (c, cluster) in cs.iter().enumerate() {
        for (s, shard) in cluster.shards.iter().enumerate() {
            let keys: Vec<String> = shard
                .cmd(&["KEYS", "redlockd:lock:{*"])
                .await
                .expect("KEYS");
            assert!(
                keys.len() >= 30,
                "cluster {c} shard {s} holds {} of 300 locks",
                keys.len()
            );
        }
        // No shard takes most of the cluster's fencing increments.
        let mut incrs = Vec::new();
        for shard in &cluster.shards {
            incrs.push(calls(shard, "incr").await);
        }
        let total: u64 = incrs.iter().sum();
        assert!(total >= 150, "cluster {c}: {incrs:?} increments");
        for (s, n) in incrs.iter().enumerate() {
            assert!(
                *n * 2 < total,
                "cluster {c} shard {s} took {n} of {total} increments: {incrs:?}"
            );
        }
    }
    // Renewed on the other replica, same tokens.
    for (i, name) in names.iter().enumerate() {
        let app = if i % 2 == 0 { &b } else { &a };
        let (lease, token) = &leases[name];
        let (status, body) = app.renew(name, lease, json!({"ttl_ms": 30000})).await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(body["fencing_token"].as_u64(), Some(*token));
    }
    // Listed, page by page, in name order, across shards.
    let mut listed = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = a
            .get(&format!("/locks?prefix=job:&limit=64&after={after}"))
            .await;
        assert_eq!(status, 200, "{page}");
        for lock in page["locks"].as_array().expect("locks") {
            let name = lock["name"].as_str().expect("name").to_owned();
            assert_eq!(lock["fencing_token"].as_u64(), Some(leases[&name].1));
            listed.push(name);
        }
        match page["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => break,
        }
    }
    assert_eq!(listed, names, "every name once, in order");
    // Revoked; then free everywhere.
    for name in &names {
        let (lease, _) = &leases[name];
        assert_eq!(b.revoke(name, lease).await.0, 204, "{name}");
    }
    let (status, page) = a.get("/locks?prefix=job:&limit=1000").await;
    assert_eq!(status, 200);
    assert_eq!(page["locks"].as_array().map(Vec::len), Some(0), "{page}");

    let (status, ready) = a.get("/readyz").await;
    assert_eq!(status, 200);
    for master in ready["masters"].as_array().expect("masters") {
        let shards = master["shards"]
            .as_array()
            .expect("a cluster lists its shards");
        assert_eq!(shards.len(), 3, "{master}");
        let slots: u64 = shards.iter().map(|s| s["slots"].as_u64().unwrap()).sum();
        assert_eq!(slots, 16384, "{master}");
        assert!(shards.iter().all(|s| s["voting"] == true), "{master}");
    }
}

#[tokio::test]
async fn a_waiting_grant_on_the_other_replica_is_woken_by_a_release() {
    let cs = clusters(3);
    let (a, b) = replicas(&cs).await;
    for round in 0..3 {
        let name = format!("wake:{round}");
        let (lease, token) = a.must_grant(&name, json!({"ttl_ms": 20000})).await;
        let waiter = b
            .grant_in_line(
                &name,
                json!({"ttl_ms": 5000, "wait_ms": 10000}),
                "wake",
                round + 1,
            )
            .await;
        let released = Instant::now();
        assert_eq!(a.revoke(&name, &lease).await.0, 204);
        // Announced, not polled.
        common::woken_within(waiter, released, Duration::from_millis(500), Some(token)).await;
    }
}

/// The ids of the connections subscribed to a shard's channels (`CLIENT LIST`, `ssub` > 0).
async fn subscribers(node: &common::RedisMaster) -> Vec<String> {
    let list: String = node.cmd(&["CLIENT", "LIST"]).await.expect("CLIENT LIST");
    let mut ids: Vec<String> = list
        .lines()
        .filter(|l| {
            l.split(' ')
                .any(|f| f.starts_with("ssub=") && f != "ssub=0")
        })
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect();
    ids.sort();
    ids
}

/// A replica keeps one subscription per shard while the shard is up, quiet or not: one made
/// again costs the shard two `SSUBSCRIBE`s per slot it serves, and an announcement that
/// arrives after a quiet spell must still reach the waiters (it once went to redis-rs's
/// count of late replies to skip, and the quiet subscription was re-made every 5.5 s).
#[tokio::test]
async fn a_quiet_subscription_stays_up_and_its_announcements_still_wake_waiters() {
    let cs = clusters(1);
    let (a, b) = replicas(&cs).await;
    let before: Vec<Vec<String>> = {
        let mut all = Vec::new();
        for shard in &cs[0].shards {
            let ids = subscribers(shard).await;
            assert_eq!(ids.len(), 2, "one subscription per replica");
            all.push(ids);
        }
        all
    };
    // The quiet spell is the subject: longer than a subscription waits for an answer to
    // its liveness check (5 s), with nothing published meanwhile.
    tokio::time::sleep(Duration::from_secs(7)).await;
    for (shard, ids) in cs[0].shards.iter().zip(&before) {
        assert_eq!(
            &subscribers(shard).await,
            ids,
            "a quiet subscription was made again"
        );
    }
    common::scenarios::revoke_wakes(&a, &b, "quiet", Duration::from_millis(500)).await;
}

#[tokio::test]
async fn every_kind_of_lock_works_on_clusters() {
    let cs = clusters(3);
    let (a, b) = replicas(&cs).await;
    // Shared locks: two readers, then a writer waits for both.
    let (s1, r1) = a
        .send(
            "POST",
            "/locks/doc",
            Some(json!({"mode": "shared", "ttl_ms": 10000})),
        )
        .await;
    assert_eq!(s1, 201, "{r1}");
    let (s2, r2) = b
        .send(
            "POST",
            "/locks/doc",
            Some(json!({"mode": "shared", "ttl_ms": 10000})),
        )
        .await;
    assert_eq!(s2, 201, "{r2}");
    let (held, body) = b.grant("doc", json!({"ttl_ms": 5000})).await;
    assert_eq!((held, body["error"].as_str()), (409, Some("lock_held")));
    for r in [&r1, &r2] {
        assert_eq!(
            a.revoke("doc", r["lease_id"].as_str().unwrap()).await.0,
            204
        );
    }
    b.must_grant("doc", json!({"ttl_ms": 5000})).await;

    // Semaphores: a pool of two.
    let permit = |app: &TestApp| {
        let app = app.handle();
        async move {
            app.send(
                "POST",
                "/semaphores/pool",
                Some(json!({"limit": 2, "ttl_ms": 10000})),
            )
            .await
        }
    };
    assert_eq!(permit(&a).await.0, 201);
    assert_eq!(permit(&b).await.0, 201);
    let (full, body) = permit(&a).await;
    assert_eq!(full, 409, "{body}");

    // Several names at once, whose names live in different slots (and shards).
    let names = ["acct:1", "acct:2", "acct:3", "acct:4"];
    let slots: Vec<u16> = names
        .iter()
        .map(|n| layout::slot_of(&format!("redlockd:lock:{{{n}}}")))
        .collect();
    assert!(slots.windows(2).any(|w| w[0] != w[1]), "{slots:?}");
    // One name's slot counter runs ahead of the others'.
    for _ in 0..5 {
        let (lease, _) = a.must_grant("acct:1", json!({})).await;
        assert_eq!(a.revoke("acct:1", &lease).await.0, 204);
    }
    let group = a
        .created("/locks", json!({"names": names, "ttl_ms": 10000}))
        .await;
    let group_token = group["fencing_token"].as_u64().unwrap();
    let (held, body) = b.grant("acct:3", json!({})).await;
    assert_eq!(
        (held, body["error"].as_str()),
        (409, Some("lock_held")),
        "{body}"
    );
    let lease = group["lease_id"].as_str().unwrap();
    assert_eq!(b.renew("acct:1", lease, json!({})).await.0, 200);
    assert_eq!(b.revoke("acct:1", lease).await.0, 204);
    // Every name's token rises past the several-name lease's, whichever slot it is in.
    for name in names {
        let (_, token) = b.must_grant(name, json!({"ttl_ms": 5000})).await;
        assert!(token > group_token, "{name}: {token} after {group_token}");
    }
    // A several-name grant that meets a held name takes none of them.
    let (status, body) = a
        .send(
            "POST",
            "/locks",
            Some(json!({"names": ["free:1", "free:2", "acct:2"]})),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    a.must_grant("free:1", json!({})).await;
    a.must_grant("free:2", json!({})).await;

    // An election: one leader.
    a.created("/elections/primary", json!({"ttl_ms": 10000, "value": "a"}))
        .await;
    let (status, leader) = b.get("/elections/primary").await;
    assert_eq!(status, 200);
    assert_eq!(leader["value"], "a", "{leader}");

    // A session carries holds in several slots; ending it frees them.
    let session = a.created("/sessions", json!({"ttl_ms": 1000})).await;
    let id = session["session_id"].as_str().unwrap().to_owned();
    for name in ["s:1", "s:2", "s:3"] {
        let (status, body) = a.grant(name, json!({"session": id})).await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, read) = b.get(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["holds"].as_array().map(Vec::len), Some(3), "{read}");
    // Renewed by the session alone, the holds outlive their own TTL.
    let until = Instant::now() + Duration::from_millis(2000);
    while Instant::now() < until {
        let (status, body) = b
            .send("PUT", &format!("/sessions/{id}"), Some(json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (held, _) = b.grant("s:2", json!({})).await;
    assert_eq!(
        held, 409,
        "a session's hold outlives its TTL while the session is renewed"
    );
    a.deleted(&format!("/sessions/{id}")).await;
    for name in ["s:1", "s:2", "s:3"] {
        b.must_grant(name, json!({"ttl_ms": 5000})).await;
    }

    // A session's held stream resumed through the other replica: the home record keeps
    // which stream holds it, so the first stream's end (after its grace) ends nothing, and
    // the resumed stream's end frees the holds in every slot.
    let (first, id) = a.hold_session("ttl_ms=5000&grace_ms=300").await;
    for name in ["t:1", "t:2", "t:3"] {
        let (status, body) = a.grant(name, json!({"session": id})).await;
        assert_eq!(status, 201, "{body}");
    }
    drop(first);
    let mut resumed = b.resume_session(&id, json!({})).await;
    resumed.expect("resumed").await;
    a.session_streams_done().await;
    for name in ["t:1", "t:2", "t:3"] {
        let (status, body) = b.grant(name, json!({})).await;
        assert_eq!(
            status, 409,
            "{name}: the first stream's end ended the session: {body}"
        );
    }
    drop(resumed);
    b.session_streams_done().await;
    for name in ["t:1", "t:2", "t:3"] {
        b.must_grant(name, json!({"ttl_ms": 5000})).await;
    }

    // Lock-delay and Idempotency-Key.
    let (status, delayed) = a
        .grant("delayed", json!({"ttl_ms": 300, "lock_delay_ms": 800}))
        .await;
    assert_eq!(status, 201, "{delayed}");
    let (status, body) = wait_for("the lease to lapse", Duration::from_secs(3), async || {
        let (status, body) = b.grant("delayed", json!({})).await;
        (status != 409 || body["error"] == "lock_delay").then_some((status, body))
    })
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("lock_delay")),
        "{body}"
    );
    let keyed = |app: &TestApp| {
        let app = app.handle();
        async move {
            app.call("POST", "/locks/keyed")
                .header("Idempotency-Key", "k-1")
                .json(&json!({"ttl_ms": 10000}))
                .send()
                .await
                .json()
        }
    };
    let first = keyed(&a).await;
    let again = keyed(&b).await;
    assert_eq!(first["lease_id"], again["lease_id"], "{first} {again}");
    assert_eq!(first["fencing_token"], again["fencing_token"]);
}

#[tokio::test]
async fn one_shard_restarted_empty_stops_only_its_names_and_tokens_keep_rising() {
    let mut cs = clusters(3);
    let (a, b) = replicas_with_short_quarantine(&cs).await;
    let names: Vec<String> = (0..60).map(|i| format!("t:{i}")).collect();
    let mut tokens: HashMap<String, u64> = HashMap::new();
    for name in &names {
        let (lease, token) = a.must_grant(name, json!({"ttl_ms": 1000})).await;
        assert_eq!(a.revoke(name, &lease).await.0, 204);
        tokens.insert(name.clone(), token);
    }
    // The first cluster's second shard loses its data.
    cs[0].shards[1].restart_empty();
    let lost: Vec<&String> = names
        .iter()
        .filter(|n| cs[0].shard_of_slot(layout::slot_of(&format!("redlockd:lock:{{{n}}}"))) == 1)
        .collect();
    assert!(!lost.is_empty());
    // Grants still succeed, on either replica, and every name's token keeps rising. (They
    // may wait: an attempt that met the restart can leave a hold on one cluster until its
    // release arrives, which with the shard out is enough to refuse the next attempt.)
    for round in 0..2 {
        for (i, name) in names.iter().enumerate() {
            let app = if (i + round) % 2 == 0 { &a } else { &b };
            let (lease, token) = app
                .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
                .await;
            assert!(
                token > tokens[name],
                "{name}: token {token} after {}",
                tokens[name]
            );
            tokens.insert(name.clone(), token);
            assert_eq!(app.revoke(name, &lease).await.0, 204);
        }
    }
    // /readyz shows the shard out, the cluster still a voting master.
    let (status, ready) = a.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    let address = format!("127.0.0.1:{}", cs[0].shards[1].port);
    let shard = |ready: &Value| shard_in(ready, &address);
    assert_eq!(shard(&ready)["voting"], false, "{ready}");
    // Once a probe has seen it without its markers, /readyz says why it is out.
    wait_for(
        "/readyz to say why the shard is out",
        Duration::from_secs(10),
        async || {
            let (_, ready) = a.get("/readyz").await;
            shard(&ready)["problem"]
                .as_str()
                .is_some_and(|p| p.contains("markers are gone"))
                .then_some(())
        },
    )
    .await;
    assert_eq!(ready["masters"][0]["voting"], true, "{ready}");
    // After the quarantine the shard is restored and votes again; tokens still rise.
    wait_for(
        "the shard to vote again",
        Duration::from_secs(15),
        async || {
            let (_, ready) = a.get("/readyz").await;
            (shard(&ready)["voting"] == true).then_some(())
        },
    )
    .await;
    let marker: Option<String> = cs[0].shards[1]
        .cmd(&[
            "GET",
            &format!(
                "redlockd:marker{{{}}}",
                layout::slot_tag(layout::slot_of(&format!("redlockd:lock:{{{}}}", lost[0])))
            ),
        ])
        .await
        .expect("GET");
    assert!(
        marker.is_some(),
        "the restored shard's slots carry markers again"
    );
    for name in &lost {
        let (lease, token) = b
            .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
            .await;
        assert!(token > tokens[*name]);
        assert_eq!(b.revoke(name, &lease).await.0, 204);
    }
}

#[tokio::test]
async fn a_shard_back_from_an_old_snapshot_is_caught_and_tokens_keep_rising() {
    let mut cs = clusters(3);
    let (a, b) = replicas_with_short_quarantine(&cs).await;
    // Names served by the first cluster's second shard.
    let names: Vec<String> = (0..200)
        .map(|i| format!("snap:{i}"))
        .filter(|n| cs[0].shard_of_slot(layout::slot_of(&format!("redlockd:lock:{{{n}}}"))) == 1)
        .take(20)
        .collect();
    let cycle = async |app: &TestApp, tokens: &mut HashMap<String, u64>| {
        for name in &names {
            let (lease, token) = app
                .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
                .await;
            if let Some(before) = tokens.get(name) {
                assert!(token > *before, "{name}: token {token} after {before}");
            }
            tokens.insert(name.clone(), token);
            assert_eq!(app.revoke(name, &lease).await.0, 204);
        }
    };
    let mut tokens = HashMap::new();
    cycle(&a, &mut tokens).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("old.rdb");
    cs[0].shards[1].snapshot(&snapshot).await;
    // Granted after the snapshot: the shard's counters move on, then go back.
    cycle(&a, &mut tokens).await;
    cycle(&b, &mut tokens).await;
    cs[0].shards[1].restart_from(&snapshot).await;
    let address = format!("127.0.0.1:{}", cs[0].shards[1].port);
    // The replicas that saw those tokens catch the shard: it is out (quarantined), and
    // every grant meanwhile still gets a token above every earlier one.
    let why = wait_for(
        "the shard to be quarantined",
        Duration::from_secs(10),
        async || {
            let (_, ready) = a.get("/readyz").await;
            let shard = ready["masters"][0]["shards"]
                .as_array()?
                .iter()
                .find(|s| s["address"] == address.as_str())?
                .clone();
            shard.get("quarantined_until")?;
            Some(shard["problem"].as_str()?.to_owned())
        },
    )
    .await;
    // Caught by this replica (restarted from a snapshot, so without `appendfsync always`;
    // or, had its run been judged first, "went back in time"), or by the other, which
    // removed its markers first.
    assert!(
        why.contains("went back in time")
            || why.contains("markers are gone")
            || why.contains("appendfsync always"),
        "{why}"
    );
    cycle(&b, &mut tokens).await;
    cycle(&a, &mut tokens).await;
    // After the quarantine it votes again, and tokens still rise.
    every_shard_votes(&a).await;
    cycle(&a, &mut tokens).await;
}

/// `CLUSTER MYID` of a node.
async fn node_id(node: &common::RedisMaster) -> String {
    node.cmd(&["CLUSTER", "MYID"]).await.expect("CLUSTER MYID")
}

/// Move hash slot `slot` of `cluster` from shard `from` to shard `to` as `redis-cli
/// --cluster reshard` does: mark it importing and migrating, migrate its keys, then give it
/// to the new owner on every node.
async fn move_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let (source, target) = (&cluster.shards[from], &cluster.shards[to]);
    let (source_id, target_id) = (node_id(source).await, node_id(target).await);
    let slot_text = slot.to_string();
    let _: String = target
        .cmd(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &source_id])
        .await
        .expect("importing");
    let _: String = source
        .cmd(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &target_id])
        .await
        .expect("migrating");
    loop {
        let keys: Vec<String> = source
            .cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_text, "100"])
            .await
            .expect("keys in slot");
        if keys.is_empty() {
            break;
        }
        let port = target.port.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let _: String = source.cmd(&args).await.expect("MIGRATE");
    }
    for node in &cluster.shards {
        let _: String = node
            .cmd(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &target_id])
            .await
            .expect("setslot node");
    }
}

#[tokio::test]
async fn a_slot_moved_between_primaries_is_followed_with_its_counter_and_marker() {
    let cs = clusters(3);
    let (a, b) = replicas(&cs).await;
    let name = "moving";
    let lock = format!("redlockd:lock:{{{name}}}");
    let slot = layout::slot_of(&lock);
    let from = cs[0].shard_of_slot(slot);
    let to = (from + 1) % 3;
    let (lease, token) = a.must_grant(name, json!({"ttl_ms": 20000})).await;
    move_slot(&cs[0], slot, from, to).await;
    assert_eq!(cs[0].shard_of_slot(slot), to);
    // The lock, the slot's counter and its marker moved with the slot.
    let marker = format!("redlockd:marker{{{}}}", layout::slot_tag(slot));
    for key in [lock.as_str(), marker.as_str()] {
        let there: i64 = cs[0].shards[to]
            .cmd(&["EXISTS", key])
            .await
            .expect("EXISTS");
        assert_eq!(there, 1, "{key} moved to the new owner");
    }
    // Both replicas follow the move (MOVED, then the new slot map): the lease is renewed
    // and revoked there, and the next grant's token is above it.
    let (status, renewed) = b.renew(name, &lease, json!({})).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["fencing_token"].as_u64(), Some(token));
    assert_eq!(a.revoke(name, &lease).await.0, 204);
    // The revoke reached cluster 0 at the slot's new owner too (perhaps after it answered).
    let held = ["EXISTS", lock.as_str()];
    cs[0].shards[to]
        .until("the release at the new owner", &held, |n| n == 0)
        .await;
    let (lease, next) = b.must_grant(name, json!({"ttl_ms": 20000})).await;
    assert!(next > token, "{next} after {token}");
    // Cluster 0 took the grant at the new owner (its answer may come after the grant was
    // decided on the other two, as it follows the move).
    wait_for(
        "the lock at the slot's new owner",
        Duration::from_secs(3),
        async || {
            let held: Option<String> =
                cs[0].shards[to].cmd(&["HGET", &lock, "lease"]).await.ok()?;
            (held.as_deref() == Some(lease.as_str())).then_some(())
        },
    )
    .await;
    let (_, ready) = a.get("/readyz").await;
    let slots: Vec<u64> = ready["masters"][0]["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| s["slots"].as_u64().unwrap())
        .collect();
    assert_eq!(slots.iter().sum::<u64>(), 16384, "{ready}");
    every_shard_votes(&a).await;
}

#[tokio::test]
async fn a_failover_to_a_replica_is_refused_as_data_loss() {
    let cs = vec![
        RedisCluster::start_with_replicas(3, 1),
        RedisCluster::start(3),
        RedisCluster::start(3),
    ];
    let (a, b) = replicas_with_short_quarantine(&cs).await;
    let name = "primary";
    let slot = layout::slot_of(&format!("redlockd:lock:{{{name}}}"));
    let owner = cs[0].shard_of_slot(slot);
    let (lease, token) = a.must_grant(name, json!({"ttl_ms": 1000})).await;
    assert_eq!(a.revoke(name, &lease).await.0, 204);
    // The owner's replica takes over its slots.
    let id = node_id(&cs[0].shards[owner]).await;
    let replicas: Vec<String> =
        wait_for("the owner's replica", Duration::from_secs(10), async || {
            let replicas: Vec<String> = cs[0].shards[owner]
                .cmd(&["CLUSTER", "REPLICAS", &id])
                .await
                .ok()?;
            (!replicas.is_empty()).then_some(replicas)
        })
        .await;
    let port: u16 = replicas[0]
        .split(' ')
        .nth(1)
        .and_then(|a| a.split(['@', ':']).nth(1))
        .and_then(|p| p.parse().ok())
        .expect("the replica's port");
    let replica = cs[0]
        .shards
        .iter()
        .position(|s| s.port == port)
        .expect("a node of the cluster");
    wait_for(
        "the replica to be in sync",
        Duration::from_secs(10),
        async || {
            let info: String = cs[0].shards[replica]
                .cmd(&["INFO", "replication"])
                .await
                .ok()?;
            info.contains("master_link_status:up").then_some(())
        },
    )
    .await;
    cs[0].fail_over(replica, slot).await;
    // What redlockd also reads to tell a failover it did not see coming: the promoted node
    // says it has a second replication history; a primary that never was a replica does not.
    let second = |info: String| {
        info.lines().find_map(|l| {
            l.trim()
                .strip_prefix("second_repl_offset:")
                .map(str::to_owned)
        })
    };
    let info: String = cs[0].shards[replica]
        .cmd(&["INFO", "replication"])
        .await
        .unwrap();
    assert_ne!(second(info.clone()).as_deref(), Some("-1"), "{info}");
    let other = (0..cs[1].shards.len()).next().unwrap();
    let info: String = cs[1].shards[other]
        .cmd(&["INFO", "replication"])
        .await
        .unwrap();
    assert_eq!(second(info.clone()).as_deref(), Some("-1"), "{info}");
    // A replica that sees the new slot map refuses the new primary as a shard that lost its
    // data, and says why (the other may see only its markers gone).
    refused_as_failed_over(&[&a, &b], &format!("127.0.0.1:{port}")).await;
    // Meanwhile the name is granted by the other clusters, and its token keeps rising;
    // after the quarantine the new primary votes again.
    let (lease, next) = b
        .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
        .await;
    assert!(next > token, "{next} after {token}");
    assert_eq!(b.revoke(name, &lease).await.0, 204);
    every_shard_votes(&b).await;
    let (_, last) = a
        .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
        .await;
    assert!(last > next, "{last} after {next}");
}

/// Wait until one of `apps` shows the shard at `address` quarantined as a failover; if
/// none does in time, fail with what each last showed of the first cluster.
async fn refused_as_failed_over(apps: &[&TestApp], address: &str) {
    let started = Instant::now();
    loop {
        let mut seen = Vec::new();
        for app in apps {
            let (_, ready) = app.get("/readyz").await;
            let shards = ready["masters"][0]["shards"].clone();
            let said = shards.as_array().and_then(|shards| {
                shards
                    .iter()
                    .find(|s| s["address"] == address)?
                    .get("problem")?
                    .as_str()
                    .map(str::to_owned)
            });
            if said.is_some_and(|why| why.contains("a replica took over its slots")) {
                return;
            }
            seen.push(shards);
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no replica refused {address} as a failover within 10 s; their shards: {seen:#?}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

#[tokio::test]
async fn a_replica_attached_after_the_replicas_started_and_promoted_is_refused_too() {
    // The replica joins after redlockd last read the cluster's node list: it is known as a
    // replica only from a later read (each probe reads the list again).
    let mut cs = vec![
        RedisCluster::start(3),
        RedisCluster::start(3),
        RedisCluster::start(3),
    ];
    let (a, b) = replicas_with_short_quarantine(&cs).await;
    let name = "late";
    let slot = layout::slot_of(&format!("redlockd:lock:{{{name}}}"));
    let owner = cs[0].shard_of_slot(slot);
    let (lease, token) = a.must_grant(name, json!({"ttl_ms": 1000})).await;
    assert_eq!(a.revoke(name, &lease).await.0, 204);
    let replica = cs[0].attach_replica(owner).await;
    cs[0].fail_over(replica, slot).await;
    let address = format!("127.0.0.1:{}", cs[0].shards[replica].port);
    refused_as_failed_over(&[&a, &b], &address).await;
    let (lease, next) = b
        .must_grant(name, json!({"ttl_ms": 1000, "wait_ms": 3000}))
        .await;
    assert!(next > token, "{next} after {token}");
    assert_eq!(b.revoke(name, &lease).await.0, 204);
}

#[tokio::test]
async fn a_shard_whose_clock_jumps_is_quarantined_alone_and_lets_no_second_holder_in() {
    let cs = vec![
        RedisCluster::start_with_movable_clocks(3),
        RedisCluster::start(3),
        RedisCluster::start(3),
    ];
    let (a, b) = replicas_with_short_quarantine(&cs).await;
    // A name in the first cluster's second shard, and one elsewhere in that cluster.
    let key = |n: &str| format!("redlockd:lock:{{{n}}}");
    let shard_of = |c: usize, n: &str| cs[c].shard_of_slot(layout::slot_of(&key(n)));
    let name = (0..)
        .map(|i| format!("c:{i}"))
        .find(|n| shard_of(0, n) == 1)
        .expect("a name in shard 1");
    let other = (0..)
        .map(|i| format!("o:{i}"))
        .find(|n| shard_of(0, n) != 1)
        .expect("a name in another shard");
    // A lease on the first two clusters only (the third's copy removed).
    let asked = Instant::now();
    let (status, lease) = a.grant(&name, json!({"ttl_ms": 2000})).await;
    assert_eq!(status, 201, "{lease}");
    let ends = asked + Duration::from_millis(lease["validity_ms"].as_u64().expect("validity"));
    // The third cluster's acquire may land after the answer: wait for it, then remove it.
    let holder = &cs[2].shards[shard_of(2, &name)];
    let remove = ["DEL", &key(&name)];
    holder
        .until("the lease's key on the third cluster", &remove, |n| n == 1)
        .await;
    // The shard's clock jumps past the TTL: its copy expires at once.
    cs[0].shards[1].set_clock_offset(20_000);
    while Instant::now() < ends {
        let (status, body) = b.grant(&name, json!({"ttl_ms": 2000})).await;
        assert!(
            status == 409 || status == 503,
            "{status} while the first lease's validity ran: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // That shard alone is out, and says why; the cluster still votes for its other names.
    let address = format!("127.0.0.1:{}", cs[0].shards[1].port);
    // The first cluster's shard at `address`, as `/readyz` on `b` shows it.
    let shard = async || -> Option<Value> {
        let (_, ready) = b.get("/readyz").await;
        ready["masters"][0]["shards"]
            .as_array()?
            .iter()
            .find(|s| s["address"] == address.as_str())
            .cloned()
    };
    wait_for(
        "/readyz to name the shard's jump",
        Duration::from_secs(5),
        async || {
            let shard = shard().await?;
            (shard["voting"] == false && shard["problem"].as_str()?.contains("clock jumped"))
                .then_some(())
        },
    )
    .await;
    let (lease, _) = b.must_grant(&other, json!({"ttl_ms": 1000})).await;
    assert_eq!(b.revoke(&other, &lease).await.0, 204);
    // After its quarantine (2 s here) the shard votes again.
    wait_for(
        "the shard to vote again",
        Duration::from_secs(15),
        async || (shard().await?["voting"] == true).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn a_shard_in_a_layout_this_release_does_not_know_is_shown_and_refused() {
    let cs = clusters(3);
    let (a, _b) = replicas(&cs).await;
    // A later release's layout on every slot of the first cluster's second shard.
    let shard = &cs[0].shards[1];
    let markers: Vec<String> = shard
        .cmd(&["KEYS", "redlockd:marker*"])
        .await
        .expect("the shard's markers");
    let mark = async |layout: Option<&str>| {
        let mut conn = shard
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("a connection to the shard");
        let mut pipe = redis::pipe();
        for marker in &markers {
            let key = format!("{marker}:layout");
            match layout {
                Some(layout) => pipe.cmd("SET").arg(key).arg(layout).ignore(),
                None => pipe.cmd("DEL").arg(key).ignore(),
            };
        }
        let _: () = pipe.query_async(&mut conn).await.expect("mark the layout");
    };
    assert!(!markers.is_empty(), "the shard has its markers");
    mark(Some("2")).await;
    let address = format!("127.0.0.1:{}", shard.port);
    let shown = wait_for(
        "readyz to name the shard's layout",
        Duration::from_secs(5),
        async || {
            let (_, ready) = a.get("/readyz").await;
            let shown = ready["masters"][0]["shards"]
                .as_array()?
                .iter()
                .find(|s| s["address"] == address.as_str())?
                .clone();
            common::problem_says(shown, "data layout 2")
        },
    )
    .await;
    assert_eq!(shown["voting"], false, "{shown}");
    // A name in that shard: its steps there are refused, the other two clusters grant it.
    let name = (0..)
        .map(|i| format!("lay:{i}"))
        .find(|n| cs[0].shard_of_slot(layout::slot_of(&format!("redlockd:lock:{{{n}}}"))) == 1)
        .expect("a name in the shard");
    a.must_grant(&name, json!({})).await;
    // Counted when its answer comes, which the grant (decided by the other two) may not
    // have waited for.
    wait_for(
        "the shard's refusal to be counted",
        Duration::from_secs(5),
        async || {
            let metrics = a.text("/metrics").await;
            metrics
                .lines()
                .any(|l| {
                    l.starts_with(r#"redlockd_master_errors_total{kind="layout""#)
                        && !l.ends_with(" 0")
                })
                .then_some(())
        },
    )
    .await;
    // Rolled back: the shard votes again.
    mark(None).await;
    every_shard_votes(&a).await;
}

#[tokio::test]
async fn a_shard_restarted_on_appendfsync_everysec_is_taken_to_have_lost_its_data() {
    // Every shard on `appendfsync everysec`: a restart keeps its markers and counters (its
    // files are whole here), but a crash could have taken its last writes, so it is out.
    let everysec = ["--appendonly", "yes", "--appendfsync", "everysec"];
    let mut cs: Vec<RedisCluster> = (0..3)
        .map(|_| RedisCluster::start_with_args(3, &everysec))
        .collect();
    let (a, _b) = replicas_with_short_quarantine(&cs).await;
    a.must_grant("t:0", json!({"ttl_ms": 1000})).await;
    let address = format!("127.0.0.1:{}", cs[0].shards[1].port);
    let shard = |ready: &Value| shard_in(ready, &address);
    cs[0].shards[1].stop();
    cs[0].shards[1].start_again();
    wait_for(
        "/readyz to say the shard is out",
        Duration::from_secs(10),
        async || {
            let (_, ready) = a.get("/readyz").await;
            let shard = shard(&ready);
            // Caught by this replica, or by the other, which removed its markers first.
            (shard["voting"] == false
                && shard["problem"].as_str().is_some_and(|p| {
                    p.contains("appendfsync always") || p.contains("markers are gone")
                }))
            .then_some(())
        },
    )
    .await;
    // After its quarantine it votes again, its run recorded.
    wait_for(
        "the shard to vote again",
        Duration::from_secs(15),
        async || {
            let (_, ready) = a.get("/readyz").await;
            (shard(&ready)["voting"] == true).then_some(())
        },
    )
    .await;
}
