//! FleetLock nodes under the random faults: each node takes a reboot slot of its group
//! (`pre-reboot`, asked again until it answers 200), "reboots" for a while, and gives the
//! slot back (`steady-state`, asked again until it answers 200). The slots are kept holds,
//! renewed by no one.
//!
//! What is judged: no group ever has more nodes in their reboot than it has slots. A node
//! is counted from its pre-reboot's 200 to the first time it asks for its steady-state (it
//! has stopped relying on the slot then; its slot may be given to the next node before the
//! steady-state's answer reaches it), and never past what a kept hold promises: the
//! kept maximum from when it asked for the slot, less the drift allowance.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;

use super::{Bases, MAX_KEPT, pick_live, worker_client};

/// The groups the replicas serve (REDLOCKD_FLEETLOCK_GROUPS) and their slots.
pub const GROUPS: &[(&str, usize)] = &[("default", 1), ("workers", 2)];

/// One node's reboot, as the node saw it: from the pre-reboot's answer to the end.
#[derive(Debug, Clone)]
pub struct Reboot {
    pub group: &'static str,
    pub node: String,
    pub from: Duration,
    pub until: Duration,
}

/// One call a node made, for the kept history.
#[derive(Debug, Clone)]
pub struct Asked {
    pub node: String,
    pub op: &'static str,
    pub base: String,
    pub invoked: Duration,
    pub answered: Duration,
    /// 0: no answer.
    pub status: u16,
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} via {} {:?}..{:?}: {}",
            self.node, self.op, self.base, self.invoked, self.answered, self.status
        )
    }
}

#[derive(Default)]
pub struct Shared {
    pub reboots: Mutex<Vec<Reboot>>,
    pub calls: Mutex<Vec<Asked>>,
}

/// Ask `op` for `node` of `group` until a replica answers 200 or `stop` is set: when the
/// first ask was sent, and whether one answered 200 (then when).
async fn until_done(
    (http, bases, shared): (&reqwest::Client, &Bases, &Shared),
    rng: &mut StdRng,
    op: &'static str,
    (node, group): (&str, &str),
    started: Instant,
    stop: &std::sync::atomic::AtomicBool,
) -> (Duration, Option<Duration>) {
    let first = started.elapsed();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let Some((_, base)) = pick_live(bases, rng).await else {
            continue;
        };
        let invoked = started.elapsed();
        let answer = http
            .post(format!("{base}/fleetlock/v1/{op}"))
            .header("fleet-lock-protocol", "true")
            .json(&json!({"client_params": {"id": node, "group": group}}))
            .send()
            .await;
        let status = answer.as_ref().map_or(0, |a| a.status().as_u16());
        shared.calls.lock().unwrap().push(Asked {
            node: node.to_owned(),
            op,
            base,
            invoked,
            answered: started.elapsed(),
            status,
        });
        if status == 200 {
            return (first, Some(started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
    }
    (first, None)
}

/// A node of `group` rebooting again and again until `stop`.
pub async fn node(
    seed: u64,
    group: &'static str,
    bases: Bases,
    shared: Arc<Shared>,
    started: Instant,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = worker_client();
    let node = format!("node-{seed}");
    // What a kept hold promises from the moment its grant was asked for.
    let promised = MAX_KEPT - MAX_KEPT / 100 - Duration::from_millis(2);
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let ids = (node.as_str(), group);
        let with = (&http, &bases, &*shared);
        let (asked, taken) = until_done(with, &mut rng, "pre-reboot", ids, started, &stop).await;
        let Some(taken) = taken else { break };
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..1500))).await;
        let (leaving, _) = until_done(with, &mut rng, "steady-state", ids, started, &stop).await;
        shared.reboots.lock().unwrap().push(Reboot {
            group,
            node: node.clone(),
            from: taken,
            until: leaving.min(asked + promised),
        });
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
    }
}

/// Every instant a group had more nodes in their reboot than slots.
pub fn judge(reboots: &[Reboot]) -> Vec<String> {
    let mut violations = Vec::new();
    for &(group, slots) in GROUPS {
        let mut edges: Vec<(Duration, i32, &Reboot)> = reboots
            .iter()
            .filter(|r| r.group == group && r.from < r.until)
            .flat_map(|r| [(r.from, 1, r), (r.until, -1, r)])
            .collect();
        // An end before a start at the same instant: touching is not overlapping.
        edges.sort_by_key(|(at, step, _)| (*at, *step));
        let mut inside: Vec<&Reboot> = Vec::new();
        for (at, step, reboot) in edges {
            if step < 0 {
                inside.retain(|r| !std::ptr::eq(*r, reboot));
                continue;
            }
            inside.push(reboot);
            if inside.len() > slots {
                violations.push(format!(
                    "group {group} ({slots} slots) had {} nodes rebooting at {at:?}: {:?}",
                    inside.len(),
                    inside
                        .iter()
                        .map(|r| format!("{} {:?}..{:?}", r.node, r.from, r.until))
                        .collect::<Vec<_>>()
                ));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reboot(group: &'static str, node: &str, from: u64, until: u64) -> Reboot {
        Reboot {
            group,
            node: node.into(),
            from: Duration::from_millis(from),
            until: Duration::from_millis(until),
        }
    }

    #[test]
    fn the_judge_counts_nodes_against_their_groups_slots() {
        let one_after_another = [
            reboot("default", "a", 0, 10),
            reboot("default", "b", 10, 20),
        ];
        assert!(judge(&one_after_another).is_empty());
        let two_in_one_slot = [reboot("default", "a", 0, 10), reboot("default", "b", 5, 20)];
        assert_eq!(judge(&two_in_one_slot).len(), 1);
        let two_of_two = [reboot("workers", "a", 0, 10), reboot("workers", "b", 5, 20)];
        assert!(judge(&two_of_two).is_empty());
        let three_of_two = [
            reboot("workers", "a", 0, 10),
            reboot("workers", "b", 5, 20),
            reboot("workers", "c", 8, 9),
        ];
        assert_eq!(judge(&three_of_two).len(), 1);
    }
}
