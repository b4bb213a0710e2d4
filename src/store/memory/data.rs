//! A memory node's data: the locks, claims, records and sessions a master keeps, and the
//! rules the Lua scripts apply to them, step for step (`scripts/`), that every step of the
//! node (`super`) is made of.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) lease: LeaseId,
    pub(super) token: u64,
    pub(super) ttl_ms: u64,
    pub(super) owner: Option<Owner>,
    pub(super) expires: Instant,
    /// The Idempotency-Key record this lease was granted with, if any, the attempt that
    /// made the hold and the one that last answered for it.
    pub(super) record: Option<String>,
    pub(super) made: Option<String>,
    pub(super) seen: Option<String>,
    /// A several-name lease's names, sorted, separated by spaces (see acquire_many.lua).
    pub(super) group: Option<String>,
    /// The lease's lock-delay in ms (0: none; see acquire.lua).
    pub(super) delay_ms: u64,
    /// The session the lease is held through, if any (see session.lua).
    pub(super) session: Option<String>,
    /// A waiting grant met this hold (or the claim it ended): its release is announced to
    /// every replica's waiters (acquire.lua's 'waited').
    pub(super) waited: bool,
    /// A waiting grant of this one name met this hold (acquire.lua's 'single'): a
    /// several-name lease's revoke then leaves the name's turn to such grants.
    pub(super) single: bool,
    /// The held stream that took the lease over by a resume, if any (renew.lua's
    /// 'stream'): a stream's end revokes only while it keeps the lease.
    pub(super) stream: Option<String>,
}

/// A session as a master keeps it (see session.lua).
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub(super) ttl_ms: u64,
    pub(super) owner: Option<Owner>,
    pub(super) expires: Instant,
    pub(super) holds: Vec<SessionHold>,
    /// The held stream that keeps the session since a resume (session.lua's 'stream').
    pub(super) stream: Option<String>,
}

impl Entry {
    /// The hold a grant makes: `lease` with `token` until `expires`, noting the
    /// Idempotency-Key's record and attempt when there is one.
    pub(super) fn granted(
        lease: &LeaseId,
        token: u64,
        ttl_ms: u64,
        owner: Option<&Owner>,
        expires: Instant,
        idem: Option<&Idem>,
    ) -> Self {
        Self {
            lease: lease.clone(),
            token,
            ttl_ms,
            owner: owner.filter(|o| !o.is_empty()).cloned(),
            expires,
            record: idem.map(|i| i.record.clone()),
            made: idem.map(|i| i.attempt.clone()),
            seen: idem.map(|i| i.attempt.clone()),
            group: None,
            delay_ms: 0,
            session: None,
            waited: false,
            single: false,
            stream: None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Data {
    pub(super) locks: HashMap<LockKey, Entry>,
    /// Idempotency-Key records: fingerprint and expiry, by record name.
    pub(super) records: HashMap<String, (String, Instant)>,
    pub(super) fence: u64,
    /// The marker's value (the node's identity), `None` once it lost its data.
    pub(super) marker: Option<String>,
    pub(super) watermarks: HashMap<String, u64>,
    /// The run id under which the marker was written or the data verified (restore.lua's
    /// and verified.lua's `<marker>:run`).
    pub(super) run_record: Option<String>,
    pub(super) run_id: u64,
    pub(super) started: Instant,
    /// How fast this node's clock runs: 2.0 expires keys in half the real time.
    pub(super) clock_rate: f64,
    /// How far this node's clock was moved from the process's (a jump: keys whose time
    /// it passes expire at once, as a Redis master's do when its wall clock jumps).
    pub(super) clock_offset: Duration,
    /// Steps since the last sweep of expired keys.
    pub(super) since_sweep: usize,
    /// Each lock's shared holds (their keys in `locks`), by lock name: what an exclusive
    /// grant looks at (as acquire.lua reads the set of shared holders). Rebuilt from
    /// `locks` on a restart.
    pub(super) shared: HashMap<String, std::collections::HashSet<LockKey>>,
    /// Each lock's claim by a waiting exclusive grant: its lease and when the claim lapses
    /// (see acquire.lua). Lost on a restart, as a claim is only about who goes first.
    pub(super) claims: HashMap<String, (String, Instant)>,
    /// The claims (by lock name) another waiting grant met: acquire.lua's ' w' mark.
    pub(super) met: std::collections::HashSet<String>,
    /// Each lock's lock-delay: the lease it follows and when it lapses (acquire.lua's 'd:'
    /// claim; a separate map here because `claims` is by mutex name only).
    pub(super) delays: HashMap<LockKey, (String, Instant)>,
    pub(super) sessions: HashMap<String, Session>,
}

impl Data {
    pub(super) fn live(&mut self, key: &LockKey, now: Instant) -> Option<&mut Entry> {
        if self.locks.get(key).is_some_and(|e| e.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    /// Expired keys nobody asks about again would pile up; sweep them now and then so the
    /// cost stays constant per step on average.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.since_sweep += 1;
        if self.since_sweep >= 1024.max(self.locks.len()) {
            self.locks.retain(|_, e| e.expires > now);
            self.records.retain(|_, (_, expires)| *expires > now);
            let locks = &self.locks;
            self.shared.retain(|_, readers| {
                readers.retain(|r| locks.contains_key(r));
                !readers.is_empty()
            });
            self.claims.retain(|_, (_, until)| *until > now);
            let claims = &self.claims;
            self.met.retain(|name| claims.contains_key(name));
            self.delays.retain(|_, (_, until)| *until > now);
            self.sessions.retain(|_, s| s.expires > now);
            self.since_sweep = 0;
        }
    }

    pub(super) fn expiry(&self, now: Instant, ttl_ms: u64) -> Instant {
        now + Duration::from_millis(ttl_ms).div_f64(self.clock_rate)
    }

    pub(super) fn pttl(&self, entry: &Entry, now: Instant) -> u64 {
        let left = entry
            .expires
            .saturating_duration_since(now)
            .mul_f64(self.clock_rate);
        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a shared grant of `key`'s lock must wait: an exclusive holder, or a
    /// waiting exclusive grant's claim (see share.lua), which a waiting grant marks.
    pub(super) fn share_refused(
        &mut self,
        key: &LockKey,
        waiting: bool,
        now: Instant,
    ) -> Option<Acquired> {
        let lock = LockKey::mutex(key.owner_name());
        if let Some(entry) = self.live(&lock, now) {
            entry.waited |= waiting;
            entry.single |= waiting;
            let entry = entry.clone();
            return Some(Acquired::Held {
                pttl_ms: self.pttl(&entry, now),
                lease: entry.lease,
            });
        }
        let refused = match self.claims.get(key.owner_name()) {
            // A turn left to grants of one name is this one's too (share.lua).
            Some((claimant, until)) if *until > now && !claimant.starts_with("t:") => {
                Some(Acquired::Held {
                    pttl_ms: u64::try_from(until.duration_since(now).as_millis())
                        .unwrap_or(u64::MAX),
                    lease: LeaseId::stored(claimant.as_str()),
                })
            }
            _ => None,
        };
        if refused.is_some() && waiting {
            self.meet_claim(key.owner_name(), now);
        }
        refused
    }

    /// Whether `name` has a claim that lives at `now`.
    pub(super) fn claimed(&self, name: &str, now: Instant) -> bool {
        self.claims.get(name).is_some_and(|(_, until)| *until > now)
    }

    /// A waiting grant met `name`'s claim: mark it, so that the grant that ends it wakes
    /// that one on its release (acquire.lua's ' w').
    pub(super) fn meet_claim(&mut self, name: &str, now: Instant) {
        if self.claimed(name, now) {
            self.met.insert(name.to_owned());
        }
    }

    /// Claim `name` for `by` until `until`, unless a claim lasts longer already; a live
    /// claim's mark stays with it, a lapsed one's goes.
    pub(super) fn claim(&mut self, name: &str, by: &str, until: Instant, now: Instant) {
        if !self.claimed(name, now) {
            self.met.remove(name);
        }
        let claim = self
            .claims
            .entry(name.to_owned())
            .or_insert_with(|| (by.to_owned(), until));
        if claim.1 < until {
            *claim = (by.to_owned(), until);
        }
    }

    /// A grant ends `name`'s claim: whether a waiting grant had met it.
    pub(super) fn end_claim(&mut self, name: &str, now: Instant) -> bool {
        let live = self.claimed(name, now);
        self.claims.remove(name);
        self.met.remove(name) && live
    }

    /// The fingerprint an Idempotency-Key's record holds, if it lives; `Mismatch` as the
    /// answer when it holds another request's (as acquire.lua checks first).
    pub(super) fn record(
        &self,
        idem: Option<&Idem>,
        now: Instant,
    ) -> Result<Option<String>, Acquired> {
        let Some(idem) = idem else {
            return Ok(None);
        };
        match self.records.get(&idem.record) {
            Some((fingerprint, expires)) if *expires > now => {
                if *fingerprint == idem.fingerprint {
                    Ok(Some(fingerprint.clone()))
                } else {
                    Err(Acquired::Mismatch)
                }
            }
            _ => Ok(None),
        }
    }

    /// A waiting several-name grant's claim on mutex `key` that is not `claimant`'s
    /// (acquire_many.lua's 'g:...'), as the refusal it makes; a waiting grant marks it.
    pub(super) fn group_claim(
        &mut self,
        key: &LockKey,
        claimant: Option<&str>,
        waiting: bool,
        now: Instant,
    ) -> Option<Acquired> {
        if key.kind != Kind::Mutex {
            return None;
        }
        let (by, until) = self.claims.get(&*key.name)?;
        // A several-name grant also waits behind a turn left to single grants.
        let turn = by.starts_with("t:") && claimant.is_some();
        let claimed = by.starts_with("g:") && Some(by.as_str()) != claimant;
        let refused = ((claimed || turn) && *until > now).then(|| Acquired::Held {
            pttl_ms: u64::try_from(until.duration_since(now).as_millis()).unwrap_or(u64::MAX),
            lease: LeaseId::stored(by.as_str()),
        });
        if refused.is_some() && waiting {
            self.meet_claim(&key.name, now);
        }
        refused
    }

    /// Whether the shared holders of lock `key` refuse an exclusive grant (see acquire.lua):
    /// then the longest of their remaining TTLs; a waiting grant claims the name meanwhile.
    /// `marks`: a waiting grant marks each shared hold (its release then wakes the grant);
    /// `waiting`: how much longer a waiting grant that claims will wait (its claim lasts
    /// no longer).
    pub(super) fn readers_refuse(
        &mut self,
        key: &LockKey,
        lease: &LeaseId,
        marks: bool,
        waiting: Option<u64>,
        now: Instant,
    ) -> Option<u64> {
        if key.kind != Kind::Mutex {
            return None;
        }
        let name = key.name.to_string();
        let readers: Vec<LockKey> = self.shared.get(&name)?.iter().cloned().collect();
        let mut longest = None;
        for reader in readers {
            let live = self.live(&reader, now).map(|entry| {
                entry.waited |= marks;
                entry.clone()
            });
            match live {
                Some(entry) => {
                    let pttl = self.pttl(&entry, now);
                    longest = Some(longest.map_or(pttl, |l: u64| l.max(pttl)));
                }
                None => {
                    if let Some(set) = self.shared.get_mut(&name) {
                        set.remove(&reader);
                    }
                }
            }
        }
        if self.shared.get(&name).is_some_and(|s| s.is_empty()) {
            self.shared.remove(&name);
        }
        let longest = longest?;
        if let Some(patience_ms) = waiting {
            let until = now + Duration::from_millis((longest + 1000).min(patience_ms + 100));
            self.claim(&name, lease.as_str(), until, now);
        }
        Some(longest)
    }

    /// The lock-delay that refuses a grant of lock `key` (a shared hold's: its lock's)
    /// while the lock is free, as acquire.lua's 'd:' claim does.
    pub(super) fn delayed(&self, key: &LockKey, now: Instant) -> Option<Acquired> {
        let lock = match key.kind {
            Kind::Reader => LockKey::mutex(key.owner_name()),
            _ => key.clone(),
        };
        let (_, until) = self.delays.get(&lock).filter(|(_, until)| *until > now)?;
        let left = until.duration_since(now).mul_f64(self.clock_rate);
        Some(Acquired::Delayed {
            pttl_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Start (or move) `entry`'s lock-delay: it lapses `delay_ms` after `end`.
    pub(super) fn delay_after(&mut self, key: &LockKey, lease: &str, delay_ms: u64, end: Instant) {
        let until = end + Duration::from_millis(delay_ms).div_f64(self.clock_rate);
        self.delays.insert(key.clone(), (lease.to_owned(), until));
    }

    /// A keyed retry that found its own hold on `key` is answered a validity counted from
    /// now: the hold, its lock-delay and the key's record last `ttl_ms` from now here, as a
    /// renew would make them (acquire.lua). A hold through a session lives as its session.
    pub(super) fn refresh(&mut self, key: &LockKey, idem: &Idem, ttl_ms: u64, now: Instant) {
        let expires = self.expiry(now, ttl_ms);
        let Some(entry) = self.locks.get_mut(key) else {
            return;
        };
        if entry.session.is_some() || entry.expires >= expires {
            return;
        }
        entry.expires = expires;
        let (lease, delay_ms) = (entry.lease.clone(), entry.delay_ms);
        if delay_ms > 0 {
            self.delay_after(key, lease.as_str(), delay_ms, expires);
        }
        if let Some(record) = self.records.get_mut(&idem.record) {
            record.1 = record.1.max(expires);
        }
    }

    /// Make every key of `hold` that its lease still holds expire at `expires` (with its
    /// session), its lock-delay moving along; false when none is left.
    pub(super) fn carry(
        &mut self,
        hold: &SessionHold,
        expires: Instant,
        session: Option<&str>,
        now: Instant,
    ) -> bool {
        let keys = match hold.key.kind {
            Kind::Group => hold.key.members(),
            _ => vec![hold.key.clone()],
        };
        let mut live = false;
        for key in keys {
            let Some(entry) = self.live(&key, now).filter(|e| e.lease == hold.lease) else {
                continue;
            };
            live = true;
            entry.expires = expires;
            if let Some(session) = session {
                entry.session = Some(session.to_owned());
            }
            let delay_ms = entry.delay_ms;
            if delay_ms > 0 {
                self.delay_after(&key, hold.lease.as_str(), delay_ms, expires);
            }
        }
        live
    }

    /// Whether any key of `hold` is still its own here (session.lua's test of a live hold).
    pub(super) fn carries(&mut self, hold: &SessionHold, now: Instant) -> bool {
        let keys = match hold.key.kind {
            Kind::Group => hold.key.members(),
            _ => vec![hold.key.clone()],
        };
        keys.iter()
            .any(|key| self.live(key, now).is_some_and(|e| e.lease == hold.lease))
    }

    pub(super) fn session_state(
        &self,
        session: &Session,
        now: Instant,
        holds: bool,
    ) -> SessionState {
        let left = session
            .expires
            .saturating_duration_since(now)
            .mul_f64(self.clock_rate);
        SessionState {
            ttl_ms: session.ttl_ms,
            pttl_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            owner: session.owner.clone(),
            holds: if holds {
                session.holds.clone()
            } else {
                Vec::new()
            },
            carried: Vec::new(),
            dropped: Vec::new(),
            attached: false,
            stream: None,
        }
    }

    pub(super) fn holding(&self, entry: &Entry, now: Instant) -> Holding {
        Holding {
            lease: entry.lease.clone(),
            token: FencingToken::new(entry.token),
            ttl_ms: entry.ttl_ms,
            pttl_ms: self.pttl(entry, now),
            owner: entry.owner.clone(),
            stream: None,
        }
    }

    pub(super) fn check_marker(&self) -> NodeResult<()> {
        if self.marker.is_some() {
            Ok(())
        } else {
            Err(NodeError::Amnesic)
        }
    }
}
