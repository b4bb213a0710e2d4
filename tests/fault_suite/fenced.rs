//! The fenced-set workload, after Jepsen's etcd `lock-etcd-set`: workers that append to a
//! shared register only while they hold one lock, and a register that, like a storage
//! system that honours fencing tokens, accepts a write only with a token at least the
//! highest it has seen.
//!
//! What it proves beyond the checker's reading of the history: the tokens are what a
//! resource would rely on. A write made while its writer's validity still runs must never
//! be refused (a refusal means another lease, with a higher token, wrote first: two holders
//! at once); two leases must never present the same token; every acknowledged append is in
//! the register at the end. Writes made on purpose after the writer's validity ended (a
//! holder paused past its lease) may be refused: that is fencing doing its work, counted as
//! rejected stale writes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;

use super::checker::Kind;
use super::{Bases, Recorder, pick_live, worker_client};

/// The lock every fenced worker takes.
pub const NAME: &str = "fenced:set";

/// One append as the register judged it.
#[derive(Debug, Clone)]
pub struct Append {
    pub lease: String,
    pub token: u64,
    pub value: u64,
    /// Whether the writer's validity still ran when it wrote (by the worker's clock, from
    /// when its grant or renew was sent: never later than the server's).
    pub within_validity: bool,
    pub accepted: bool,
}

/// The register: the highest token seen, the lease that presented it, what was appended.
#[derive(Debug, Default)]
pub struct Register {
    highest: u64,
    holder: Option<String>,
    pub values: Vec<u64>,
    pub appends: Vec<Append>,
}

impl Register {
    /// Append `value` for `lease` with `token`, if the token is not stale; `deadline` is
    /// when the writer's validity ends, judged now, under the register's lock.
    fn write(&mut self, lease: &str, token: u64, value: u64, deadline: Instant) -> bool {
        let within_validity = Instant::now() < deadline;
        let accepted = token > self.highest
            || (token == self.highest && self.holder.as_deref() == Some(lease));
        if accepted {
            self.highest = token;
            self.holder = Some(lease.to_owned());
            self.values.push(value);
        }
        self.appends.push(Append {
            lease: lease.to_owned(),
            token,
            value,
            within_validity,
            accepted,
        });
        accepted
    }

    /// What the run shows: appends accepted, stale writes refused, and every violation.
    pub fn judge(&self, acknowledged: &[u64]) -> (usize, usize, Vec<String>) {
        let mut violations = Vec::new();
        let mut by_token: std::collections::HashMap<u64, &str> = Default::default();
        for a in &self.appends {
            if let Some(other) = by_token.insert(a.token, &a.lease)
                && other != a.lease
            {
                violations.push(format!(
                    "token {} presented by two leases: {other} and {}",
                    a.token, a.lease
                ));
            }
            if a.within_validity && !a.accepted {
                violations.push(format!(
                    "lease {} (token {}) was refused append {} while its validity ran: a lease with a higher token wrote first",
                    a.lease, a.token, a.value
                ));
            }
        }
        for value in acknowledged {
            if !self.values.contains(value) {
                violations.push(format!("acknowledged append {value} is missing"));
            }
        }
        let accepted = self.appends.iter().filter(|a| a.accepted).count();
        let stale = self.appends.iter().filter(|a| !a.accepted).count();
        (accepted, stale, violations)
    }
}

/// What every fenced worker shares.
pub struct Shared {
    pub register: Mutex<Register>,
    pub acknowledged: Mutex<Vec<u64>>,
    next: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            register: Mutex::new(Register::default()),
            acknowledged: Mutex::new(Vec::new()),
            next: Default::default(),
        })
    }
}

/// One fenced worker: take the lock (waiting a while for it), append to the register a few
/// times while holding it (renewing now and then), and let go; now and then it stalls
/// past its validity before a write, as a paused holder would.
pub async fn worker(
    seed: u64,
    bases: Bases,
    recorder: Arc<Recorder>,
    shared: Arc<Shared>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = worker_client();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let Some((replica, base)) = pick_live(&bases, &mut rng).await else {
            continue;
        };
        let ttl = Duration::from_millis(rng.random_range(300..1200));
        let asked = Instant::now();
        let body = json!({"ttl_ms": ttl.as_millis() as u64, "wait_ms": 500});
        let at = (replica, base.as_str());
        let Some(lease) = recorder
            .granted(&http, at, (NAME, body), ttl, &mut rng)
            .await
        else {
            continue;
        };
        let (Some(id), Some(token), Some(validity)) = (
            lease["lease_id"].as_str().map(str::to_owned),
            lease["fencing_token"].as_u64(),
            lease["validity_ms"].as_u64(),
        ) else {
            continue;
        };
        let mut deadline = asked + Duration::from_millis(validity);
        for _ in 0..rng.random_range(1..4) {
            if rng.random_ratio(1, 3) {
                let asked = Instant::now();
                let (status, renewed) = recorder
                    .on_lease(&http, (replica, &base), Kind::Renew, NAME, &id, ttl)
                    .await;
                match renewed["validity_ms"].as_u64() {
                    Some(v) if status == 200 => deadline = asked + Duration::from_millis(v),
                    _ => break,
                }
            }
            let late = rng.random_ratio(1, 8);
            if late {
                // A holder paused past its lease: its write must be fenced off if anyone
                // wrote since.
                let past = Duration::from_millis(rng.random_range(50..400));
                tokio::time::sleep(deadline.saturating_duration_since(Instant::now()) + past).await;
            } else {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
            }
            let value = shared
                .next
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let accepted = shared
                .register
                .lock()
                .unwrap()
                .write(&id, token, value, deadline);
            if accepted {
                shared.acknowledged.lock().unwrap().push(value);
            }
            if late {
                break;
            }
        }
        if rng.random_ratio(4, 5) {
            recorder
                .on_lease(&http, (replica, &base), Kind::Revoke, NAME, &id, ttl)
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_refuses_stale_tokens_and_the_judge_tells_fencing_from_overlap() {
        let later = Instant::now() + Duration::from_secs(60);
        let gone = Instant::now() - Duration::from_millis(1);
        let mut r = Register::default();
        assert!(r.write("L1", 5, 1, later));
        assert!(r.write("L1", 5, 2, later));
        assert!(r.write("L2", 7, 3, later));
        // L1 paused past its lease: fenced off, and no violation.
        assert!(!r.write("L1", 5, 4, gone));
        let (accepted, stale, violations) = r.judge(&[1, 2, 3]);
        assert_eq!((accepted, stale), (3, 1));
        assert!(violations.is_empty(), "{violations:?}");
        // L1 refused while its validity ran: two holders at once.
        assert!(!r.write("L1", 5, 5, later));
        // Another lease with the same token.
        assert!(!r.write("L3", 7, 6, later));
        // An acknowledged append that is not there.
        let (_, _, violations) = r.judge(&[1, 2, 3, 99]);
        assert_eq!(violations.len(), 4, "{violations:?}");
    }
}
