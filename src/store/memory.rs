//! `LockNode` in process: the embedded store and the fault-injection node.
//!
//! With no Redis configured, redlockd serves from one of these (one process, not
//! distributed: for development and tests). The same node, given a fault plan, is the
//! deterministic target of the engine tests: it can be down, slower than the timeout,
//! lose its reply after applying the write, restart empty, or run its clock fast. Its
//! semantics mirror the Lua scripts in `scripts/` step for step, and its clock is tokio's,
//! so `tokio::time::pause()` drives expiry in tests.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::redlock::node::{Acquired, Holding, LockNode, NodeError, NodeResult, Owned, Probe};

/// How a memory node misbehaves.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Fault {
    #[default]
    None,
    /// Refuses every step at once, like a master whose port is closed.
    Down,
    /// Never answers, like a paused master; nothing is applied.
    Hang,
    /// Answers every step after this long; the step is applied when it answers.
    Slow(Duration),
    /// Applies every step, then never answers: the write lands but the reply is lost.
    LoseReply,
}

#[derive(Debug)]
struct Entry {
    lease: String,
    token: u64,
    ttl_ms: u64,
    owner: Option<String>,
    expires: Instant,
}

#[derive(Debug)]
struct Data {
    locks: HashMap<String, Entry>,
    fence: u64,
    marked: bool,
    run_id: u64,
    /// How fast this node's clock runs: 2.0 expires keys in half the real time.
    clock_rate: f64,
    /// Steps since the last sweep of expired keys.
    since_sweep: usize,
}

impl Data {
    fn live(&mut self, name: &str, now: Instant) -> Option<&mut Entry> {
        if self.locks.get(name).is_some_and(|e| e.expires <= now) {
            self.locks.remove(name);
        }
        self.locks.get_mut(name)
    }

    /// Expired keys nobody asks about again would pile up; sweep them now and then so the
    /// cost stays constant per step on average.
    fn sweep(&mut self, now: Instant) {
        self.since_sweep += 1;
        if self.since_sweep >= 1024.max(self.locks.len()) {
            self.locks.retain(|_, e| e.expires > now);
            self.since_sweep = 0;
        }
    }

    fn expiry(&self, now: Instant, ttl_ms: u64) -> Instant {
        now + Duration::from_millis(ttl_ms).div_f64(self.clock_rate)
    }

    fn pttl(&self, entry: &Entry, now: Instant) -> u64 {
        let left = entry
            .expires
            .saturating_duration_since(now)
            .mul_f64(self.clock_rate);
        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
    }

    fn holding(&self, entry: &Entry, now: Instant) -> Holding {
        Holding {
            lease: entry.lease.clone(),
            token: entry.token,
            ttl_ms: entry.ttl_ms,
            pttl_ms: self.pttl(entry, now),
            owner: entry.owner.clone(),
        }
    }

    fn check_marker(&self) -> NodeResult<()> {
        if self.marked {
            Ok(())
        } else {
            Err(NodeError::Amnesic)
        }
    }
}

pub struct MemoryNode {
    address: String,
    data: Mutex<Data>,
    fault: Mutex<Fault>,
    /// Source of run ids: each restart gets a new one, as a Redis restart does.
    restarts: AtomicU64,
}

impl MemoryNode {
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            data: Mutex::new(Data {
                locks: HashMap::new(),
                fence: 0,
                marked: false,
                run_id: 0,
                clock_rate: 1.0,
                since_sweep: 0,
            }),
            fault: Mutex::new(Fault::None),
            restarts: AtomicU64::new(0),
        }
    }

    // The data is plain values: a panic mid-step elsewhere cannot leave it half-written
    // in a way that matters more than refusing to serve would.
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_fault(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }

    /// Make the node's clock run `rate` times as fast as the process's: its keys expire early.
    pub fn set_clock_rate(&self, rate: f64) {
        self.data().clock_rate = rate;
    }

    /// Lose everything, as a master without persistence does when it restarts: locks,
    /// fencing counter and marker. The node gets a new run id.
    pub fn restart_empty(&self) {
        let mut data = self.data();
        data.locks.clear();
        data.fence = 0;
        data.marked = false;
        data.run_id = self.restarts.fetch_add(1, Ordering::Relaxed) + 1;
    }

    /// The node's fencing counter, for tests.
    pub fn fence(&self) -> u64 {
        self.data().fence
    }

    /// Whether the node holds `name` for `lease` now, for tests.
    pub fn holds(&self, name: &str, lease: &str) -> bool {
        self.data()
            .live(name, Instant::now())
            .is_some_and(|e| e.lease == lease)
    }

    /// Apply `step` under the fault plan, as one atomic step.
    async fn step<T>(
        &self,
        step: impl FnOnce(&mut Data, Instant) -> NodeResult<T>,
    ) -> NodeResult<T> {
        let fault = *self.fault.lock().unwrap_or_else(|e| e.into_inner());
        match fault {
            Fault::Down => {
                return Err(NodeError::Connection(format!(
                    "{} is down (injected)",
                    self.address
                )));
            }
            Fault::Hang => return std::future::pending().await,
            Fault::Slow(delay) => tokio::time::sleep(delay).await,
            Fault::None | Fault::LoseReply => {}
        }
        let result = {
            let mut data = self.data();
            let now = Instant::now();
            data.sweep(now);
            step(&mut data, now)
        };
        if fault == Fault::LoseReply {
            return std::future::pending().await;
        }
        result
    }
}

#[async_trait]
impl LockNode for MemoryNode {
    fn address(&self) -> &str {
        &self.address
    }

    async fn acquire(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: u64,
        owner: Option<&str>,
    ) -> NodeResult<Acquired> {
        self.step(|data, now| {
            data.check_marker()?;
            if data.live(name, now).is_some() {
                let pttl_ms = data.locks.get(name).map_or(0, |e| data.pttl(e, now));
                return Ok(Acquired::Held { pttl_ms });
            }
            data.fence += 1;
            let token = data.fence;
            let expires = data.expiry(now, ttl_ms);
            data.locks.insert(
                name.to_owned(),
                Entry {
                    lease: lease.to_owned(),
                    token,
                    ttl_ms,
                    owner: owner.filter(|o| !o.is_empty()).map(str::to_owned),
                    expires,
                },
            );
            Ok(Acquired::Granted { token })
        })
        .await
    }

    async fn confirm(&self, name: &str, lease: &str, token: u64) -> NodeResult<()> {
        self.step(|data, now| {
            data.check_marker()?;
            data.fence = data.fence.max(token);
            if let Some(entry) = data.live(name, now).filter(|e| e.lease == lease) {
                entry.token = token;
            }
            Ok(())
        })
        .await
    }

    async fn renew(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: Option<u64>,
    ) -> NodeResult<Owned<Holding>> {
        self.step(|data, now| {
            data.check_marker()?;
            let rate = data.clock_rate;
            let Some(entry) = data.live(name, now).filter(|e| e.lease == lease) else {
                return Ok(Owned::NotOwner);
            };
            let ttl_ms = ttl_ms.unwrap_or(entry.ttl_ms);
            entry.ttl_ms = ttl_ms;
            entry.expires = now + Duration::from_millis(ttl_ms).div_f64(rate);
            // The node's own clock says the full TTL is left.
            let holding = Holding {
                lease: entry.lease.clone(),
                token: entry.token,
                ttl_ms,
                pttl_ms: ttl_ms,
                owner: entry.owner.clone(),
            };
            Ok(Owned::Yes(holding))
        })
        .await
    }

    async fn release(&self, name: &str, lease: &str) -> NodeResult<Owned<()>> {
        self.step(|data, now| {
            data.check_marker()?;
            if data.live(name, now).is_some_and(|e| e.lease == lease) {
                data.locks.remove(name);
                Ok(Owned::Yes(()))
            } else {
                Ok(Owned::NotOwner)
            }
        })
        .await
    }

    async fn read(&self, name: &str) -> NodeResult<Option<Holding>> {
        self.step(|data, now| {
            data.check_marker()?;
            if data.live(name, now).is_none() {
                return Ok(None);
            }
            Ok(data.locks.get(name).map(|e| data.holding(e, now)))
        })
        .await
    }

    async fn list(&self, prefix: &str, cap: usize) -> NodeResult<Vec<(String, Holding)>> {
        self.step(|data, now| {
            data.check_marker()?;
            Ok(data
                .locks
                .iter()
                .filter(|(name, e)| name.starts_with(prefix) && e.expires > now)
                .take(cap)
                .map(|(name, e)| (name.clone(), data.holding(e, now)))
                .collect())
        })
        .await
    }

    async fn probe(&self) -> NodeResult<Probe> {
        self.step(|data, _| {
            Ok(Probe {
                run_id: format!("{}#{}", self.address, data.run_id),
                marked: data.marked,
                fence: data.fence,
            })
        })
        .await
    }

    async fn restore(&self, fence: u64) -> NodeResult<()> {
        self.step(|data, _| {
            data.fence = data.fence.max(fence);
            data.marked = true;
            Ok(())
        })
        .await
    }
}
