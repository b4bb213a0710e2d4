//! The lease service: what the HTTP handlers call. It mints lease ids, waits for held
//! locks, keeps grants safe against cancelled requests, and counts what it does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{FencingToken, LeaseId, LockName, NamePrefix, Owner, Waiters};
use crate::metrics::Metrics;
use crate::redlock::{EngineError, Holder, Leased, Redlock};

/// A lease as the service hands it to the HTTP layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: LockName,
    pub id: LeaseId,
    pub token: FencingToken,
    pub ttl: Duration,
    pub validity: Duration,
    pub remaining: Duration,
    pub owner: Option<String>,
}

impl Lease {
    fn new(name: LockName, id: LeaseId, leased: Leased) -> Self {
        Self {
            name,
            id,
            token: FencingToken(leased.token),
            ttl: leased.ttl,
            validity: leased.validity,
            remaining: leased.remaining,
            owner: leased.owner,
        }
    }
}

/// How long a grant may wait for a held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitPolicy {
    pub wait: Duration,
}

pub struct LeaseService {
    engine: Arc<Redlock>,
    waiters: Arc<Waiters>,
    metrics: Arc<Metrics>,
    /// Leases this process granted, with when each lapses unless renewed: the source of
    /// `redlockd_leases_active`.
    active: Mutex<HashMap<LeaseId, Instant>>,
    /// Fires when the process begins to shut down: waiting grants stop waiting.
    shutdown: CancellationToken,
}

impl LeaseService {
    pub fn new(
        engine: Arc<Redlock>,
        waiters: Arc<Waiters>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            waiters,
            metrics,
            active: Mutex::new(HashMap::new()),
            shutdown,
        })
    }

    pub fn engine(&self) -> &Arc<Redlock> {
        &self.engine
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseId, Instant>> {
        // Plain map of deadlines: nothing a panic elsewhere could leave half-done.
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, lease: &Lease) {
        let mut active = self.active();
        let now = Instant::now();
        // Leases that lapse without a word from their client are dropped here, so the map
        // stays as large as the live leases, amortised over grants.
        if active.len() >= 1024 && active.len().is_power_of_two() {
            active.retain(|_, lapses| *lapses > now);
        }
        active.insert(lease.id.clone(), now + lease.remaining);
    }

    /// Leases granted here that are neither revoked nor lapsed.
    pub fn active_leases(&self) -> usize {
        let now = Instant::now();
        let mut active = self.active();
        active.retain(|_, lapses| *lapses > now);
        active.len()
    }

    /// Grant `name`, waiting up to `policy.wait` while another lease holds it.
    pub async fn grant(
        &self,
        name: LockName,
        ttl: Duration,
        policy: WaitPolicy,
        owner: Option<Owner>,
    ) -> Result<Lease, EngineError> {
        let owner: Option<Arc<str>> = owner.map(|o| o.as_str().into());
        if policy.wait.is_zero() {
            let result = self.attempt(&name, ttl, owner).await;
            self.account(&name, &result, false);
            return result;
        }

        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + policy.wait;
        let mut contended = false;
        let mut ticket = self.waiters.join(name.as_str());
        // Queued behind another waiter, this grant has found its lock contended already.
        if !ticket.is_first() {
            contended = true;
            self.metrics.contended(name.class());
        }
        loop {
            ticket.mark_seen();
            let now = tokio::time::Instant::now();
            // At its deadline a waiter tries once more even if others are ahead of it, so
            // that its 409 carries the holder's real remaining TTL.
            let mut wake_at = deadline;
            if ticket.is_first() || now >= deadline {
                let result = self.attempt(&name, ttl, owner.clone()).await;
                match result {
                    Err(EngineError::Held { retry_after })
                        if tokio::time::Instant::now() < deadline =>
                    {
                        if !contended {
                            contended = true;
                            self.metrics.contended(name.class());
                        }
                        // The holder's lease lapses then, unless renewed: look again.
                        let lapse =
                            tokio::time::Instant::now() + retry_after.max(Duration::from_millis(1));
                        wake_at = deadline.min(lapse);
                    }
                    result => {
                        if contended {
                            self.metrics.waited(started.elapsed());
                        }
                        self.account(&name, &result, contended);
                        return result;
                    }
                }
            }
            tokio::select! {
                () = ticket.event() => {}
                () = tokio::time::sleep_until(wake_at) => {}
                () = self.shutdown.cancelled() => {
                    return Err(EngineError::Unavailable(
                        "redlockd is shutting down; retry the grant, on another replica if there is one".into(),
                    ));
                }
            }
        }
    }

    /// Count a finished grant: contention (once per grant) and the lease if one was granted.
    fn account(
        &self,
        name: &LockName,
        result: &Result<Lease, EngineError>,
        already_contended: bool,
    ) {
        match result {
            Ok(lease) => self.track(lease),
            Err(EngineError::Held { .. }) if !already_contended => {
                self.metrics.contended(name.class())
            }
            Err(_) => {}
        }
    }

    /// One Redlock grant attempt, in its own task: if the request that asked for it is
    /// dropped mid-way (the client went away), the attempt still finishes, and a lease it
    /// won is released instead of being left held until its TTL.
    async fn attempt(
        &self,
        name: &LockName,
        ttl: Duration,
        owner: Option<Arc<str>>,
    ) -> Result<Lease, EngineError> {
        let (tx, rx) = oneshot::channel();
        let engine = self.engine.clone();
        let waiters = self.waiters.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let id = LeaseId::generate();
            let result = engine
                .acquire(name.as_str(), id.as_str(), ttl, owner.as_deref())
                .await
                .map(|leased| Lease::new(name.clone(), id.clone(), leased));
            if let Err(Ok(_unwanted)) = tx.send(result) {
                tracing::info!(lock = %name, "client left before its grant completed; releasing it");
                let _ = engine.release(name.as_str(), id.as_str()).await;
                waiters.released(name.as_str());
            }
        });
        rx.await
            .unwrap_or_else(|_| Err(EngineError::Unavailable("the grant task failed".into())))
    }

    pub async fn renew(
        &self,
        name: LockName,
        id: LeaseId,
        ttl: Option<Duration>,
    ) -> Result<Lease, EngineError> {
        let leased = self.engine.renew(name.as_str(), id.as_str(), ttl).await?;
        let lease = Lease::new(name, id, leased);
        self.track(&lease);
        Ok(lease)
    }

    pub async fn revoke(&self, name: LockName, id: LeaseId) -> Result<(), EngineError> {
        let result = self.engine.release(name.as_str(), id.as_str()).await;
        if result.is_ok() {
            self.active().remove(&id);
            // Redis announces it to every replica; this covers this process at once, and
            // the embedded store, which has no pub/sub.
            self.waiters.released(name.as_str());
        }
        result
    }

    pub async fn check(&self, name: LockName, id: LeaseId) -> Result<Lease, EngineError> {
        let leased = self.engine.check(name.as_str(), id.as_str()).await?;
        Ok(Lease::new(name, id, leased))
    }

    pub async fn inspect(&self, name: &LockName) -> Result<Option<Holder>, EngineError> {
        self.engine.inspect(name.as_str()).await
    }

    pub async fn list(
        &self,
        prefix: &NamePrefix,
        limit: usize,
    ) -> Result<Vec<Holder>, EngineError> {
        self.engine.list(prefix.as_str(), limit).await
    }
}
