//! A master lost while another is cut off: round after round, one master is cut off from
//! every replica (a minority out of reach) and another restarts empty, so that fewer than
//! a majority vote until the cut heals. Workers grant, renew and revoke throughout.
//!
//! What is judged, beside the checker over the whole history: after each heal the master
//! that lost its data votes again within `BACK_WITHIN` on every live replica, plus the
//! longest hold that may have relied on it (one granted in the moment between the cut and
//! the restart), which the replicas' `/readyz` names when there is one. Before the read of
//! the others' holds, a replica that met the quarantine while too few masters answered kept
//! the longest bound (the kept maximum and the largest lock-delay) whatever the holds.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::Value;

use super::{
    Cluster, Fault, MASTERS, MAX_KEPT, MAX_LOCK_DELAY, assert_no_violations, calm, checker, common,
    every_name_is_granted_again, faults_text, keep_if_violated, start_workers,
};

/// How soon after the heal the lost master must vote again when no hold relied on it.
const BACK_WITHIN: Duration = Duration::from_secs(5);

/// What replica `base` says of the master on `port`: whether it votes, and its problem.
async fn seen(base: &str, port: u16) -> Option<(bool, Option<String>)> {
    let ready: Value = common::http()
        .get(format!("{base}/readyz"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let suffix = format!(":{port}");
    let master = ready["masters"]
        .as_array()?
        .iter()
        .find(|m| m["address"].as_str().is_some_and(|a| a.ends_with(&suffix)))?;
    Some((
        master["voting"] == true,
        master["problem"].as_str().map(str::to_owned),
    ))
}

/// How long after now master `m` votes on every live replica (`limit` at most), and
/// whether a replica said holds kept it out meanwhile.
async fn back(cluster: &Cluster, m: usize, limit: Duration) -> (Option<Duration>, bool) {
    let started = Instant::now();
    let port = cluster.masters[m].port;
    let mut held_out = false;
    while started.elapsed() < limit {
        let mut all = true;
        for replica in cluster.replicas.iter().flatten() {
            match seen(&replica.base, port).await {
                Some((true, _)) => {}
                Some((false, problem)) => {
                    all = false;
                    held_out |= problem.is_some_and(|p| p.contains("holds found on too few"));
                }
                None => all = false,
            }
        }
        if all {
            return (Some(started.elapsed()), held_out);
        }
        tokio::time::sleep(common::POLL).await;
    }
    (None, held_out)
}

pub async fn lost_while_cut_off(seed: u64, length: Duration) {
    common::init_test_logging();
    eprintln!("fault suite: seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    let (recorder, stop, workers) = start_workers(started, seed * 100 + 7, &cluster.bases);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut applied = Vec::new();
    let mut violations = Vec::new();
    let mut rounds = Vec::new();
    while started.elapsed() < length {
        // Each round begins with every master voting: one loss at a time.
        let deadline = Instant::now() + MAX_KEPT + MAX_LOCK_DELAY + Duration::from_secs(5);
        while !cluster.all_voting().await && Instant::now() < deadline {
            tokio::time::sleep(common::POLL).await;
        }
        let cut = rng.random_range(0..MASTERS);
        let lost = (cut + rng.random_range(1..MASTERS)) % MASTERS;
        let live: Vec<usize> = (0..cluster.replicas.len())
            .filter(|&r| cluster.replicas[r].is_some())
            .collect();
        for &r in &live {
            cluster.apply(Fault::Partition(cut, r)).await;
            applied.push((started.elapsed(), Fault::Partition(cut, r), None::<Fault>));
        }
        cluster.apply(Fault::KillEmpty(lost)).await;
        applied.push((started.elapsed(), Fault::KillEmpty(lost), None));
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        cluster.heal(Fault::KillEmpty(lost)).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
        for &r in &live {
            cluster.heal(Fault::Partition(cut, r)).await;
        }
        let healed = started.elapsed();
        let limit = BACK_WITHIN + MAX_KEPT + MAX_LOCK_DELAY;
        let (took, held_out) = back(&cluster, lost, limit).await;
        eprintln!(
            "fault suite: round at {healed:?}: master {lost} lost while {cut} was cut off; voting again {took:?} after the heal{}",
            if held_out { " (holds kept it out)" } else { "" }
        );
        match took {
            Some(took) if took <= BACK_WITHIN || held_out => rounds.push(took),
            Some(took) => violations.push(format!(
                "master {lost} voted again {took:?} after the heal at {healed:?}, past {BACK_WITHIN:?}, with no hold named that kept it out"
            )),
            None => violations.push(format!(
                "master {lost} did not vote again within {limit:?} of the heal at {healed:?}"
            )),
        }
    }
    cluster.firewall.clear();
    calm(&cluster, &recorder, started).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    violations.extend(every_name_is_granted_again(&cluster).await);
    let history = recorder.events.lock().unwrap().clone();
    violations.extend(checker::check(&history, &cluster.reach.outages));
    eprintln!(
        "fault suite: seed {seed}: {} operations, {} rounds, back after the heal in {:?} at the most",
        history.len(),
        rounds.len(),
        rounds.iter().max()
    );
    keep_if_violated(
        "lost_while_cut_off",
        seed,
        &history,
        &faults_text(&applied),
        &violations,
        &cluster.logs(),
    );
    assert!(
        rounds.len() >= 3,
        "too few rounds to judge: {}",
        rounds.len()
    );
    assert_no_violations("lost_while_cut_off", seed, &violations, &cluster.logs());
}
