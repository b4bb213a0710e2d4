//! The fault suite's checker: reads a whole recorded history of lock operations and the
//! faults injected meanwhile, and lists every way the contract's promises were broken.
//!
//! Windows are taken conservatively, so that a reported violation is a real one: a lease is
//! relied on from the moment its grant (or renew) response arrived until its invocation
//! time plus the validity the server gave, and no later than the moment its holder asked to
//! revoke it. Two leases of one name whose windows overlap broke mutual exclusion.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

/// What a worker asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Grant,
    Renew,
    Revoke,
}

/// One operation as a client saw it. Times are since the start of the run.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: Kind,
    pub replica: usize,
    pub name: String,
    /// The lease operated on (renew, revoke) or granted (grant, on success).
    pub lease: Option<String>,
    pub invoked: Duration,
    pub answered: Duration,
    /// The HTTP status, or 0 when no answer came (the outcome is unknown).
    pub status: u16,
    pub token: Option<u64>,
    pub validity: Option<Duration>,
    pub ttl: Duration,
    /// The error body's message, for the run's summary.
    pub message: Option<String>,
    /// A semaphore's permit: the limit it was granted with. Its `name` is then the slot's,
    /// `<semaphore>/<slot>`, so that every per-name promise above is checked per slot.
    pub limit: Option<u64>,
    /// A shared lease of a lock (`mode: shared`): it may overlap other shared leases of the
    /// name, never an exclusive one.
    pub shared: bool,
    /// The lock-delay the grant asked for: once its lease ends other than by its holder's
    /// revoke, the name is granted to nobody until that long after.
    pub lock_delay: Option<Duration>,
    /// How long a grant asked to wait for what it asked for (zero: not at all).
    pub wait: Duration,
}

/// A stretch of time during which replica `replica` could reach fewer than a majority of
/// masters (from the fault schedule: killed, paused, partitioned, replies dropped).
#[derive(Debug, Clone)]
pub struct Outage {
    pub replica: usize,
    pub from: Duration,
    pub until: Duration,
}

/// Slack for the last step of a lease's keys: a renew may land at any moment before its
/// answer, and master clocks round expiries to the millisecond.
const EXPIRY_SLACK: Duration = Duration::from_millis(50);

/// Every violation in `history`, in words (empty when the run kept every promise).
pub fn check(history: &[Event], outages: &[Outage]) -> Vec<String> {
    let mut violations = Vec::new();
    let grants: Vec<&Event> = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 201)
        .collect();
    tokens_are_unique(&grants, &mut violations);
    tokens_rise(&grants, &mut violations);
    windows_never_overlap(history, &mut violations);
    only_the_holder(history, &mut violations);
    no_grant_without_a_majority(&grants, outages, &mut violations);
    permits_within_their_limit(history, &mut violations);
    delays_are_kept(history, &grants, &mut violations);
    violations
}

/// A lease with a lock-delay that its holder never asked to revoke ends no sooner than its
/// last grant or renew was sent plus its TTL (the masters set the expiry after that): no
/// later grant of its name may be answered before that end plus the delay.
fn delays_are_kept(history: &[Event], grants: &[&Event], violations: &mut Vec<String>) {
    let revoked: HashSet<(&str, &str)> = history
        .iter()
        .filter(|e| e.kind == Kind::Revoke)
        .filter_map(|e| Some((e.name.as_str(), e.lease.as_deref()?)))
        .collect();
    for g in grants {
        let (Some(delay), Some(lease), Some(token)) = (g.lock_delay, g.lease.as_deref(), g.token)
        else {
            continue;
        };
        if delay.is_zero() || revoked.contains(&(g.name.as_str(), lease)) {
            continue;
        }
        let ends = history
            .iter()
            .filter(|e| e.name == g.name && e.lease.as_deref() == Some(lease))
            .filter(|e| matches!((e.kind, e.status), (Kind::Grant, 201) | (Kind::Renew, 200)))
            .map(|e| e.invoked + e.ttl)
            .max()
            .unwrap_or(g.invoked + g.ttl);
        let free = (ends + delay).saturating_sub(EXPIRY_SLACK);
        for other in grants {
            if other.name == g.name
                && other.lease.as_deref() != Some(lease)
                && other.token.is_some_and(|t| t > token)
                && other.answered < free
            {
                violations.push(format!(
                    "{}: granted at {:?} inside the lock-delay of the lease with token {token}, which ended no sooner than {ends:?} and left the name refused until {:?}",
                    g.name, other.answered, ends + delay
                ));
            }
        }
    }
}

/// A semaphore's permits: never more valid at once than the largest limit among them, and
/// each on a slot below its own limit. (Each slot is checked as a name of its own above.)
fn permits_within_their_limit(history: &[Event], violations: &mut Vec<String>) {
    let mut limits: HashMap<&str, u64> = HashMap::new();
    for e in history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 201)
    {
        let (Some(limit), Some((semaphore, slot))) = (e.limit, e.name.rsplit_once('/')) else {
            continue;
        };
        if slot.parse::<u64>().map_or(true, |s| s >= limit) {
            violations.push(format!(
                "{}: a permit of limit {limit} was granted slot {slot} at {:?}",
                semaphore, e.answered
            ));
        }
        let most = limits.entry(semaphore).or_default();
        *most = (*most).max(limit);
    }
    // Each lease's windows merged into the stretches it was relied on, by semaphore.
    let mut edges: BTreeMap<&str, Vec<(Duration, i64)>> = BTreeMap::new();
    for ((name, _), mut ws) in windows(history) {
        let Some((semaphore, _)) = name.rsplit_once('/') else {
            continue;
        };
        if !limits.contains_key(semaphore) {
            continue;
        }
        ws.sort();
        let mut merged: Vec<(Duration, Duration)> = Vec::new();
        for (from, until) in ws {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(until),
                _ => merged.push((from, until)),
            }
        }
        let list = edges.entry(semaphore).or_default();
        for (from, until) in merged {
            list.push((from, 1));
            list.push((until, -1));
        }
    }
    for (semaphore, mut list) in edges {
        // Ends before starts at the same instant: a window is open up to its end.
        list.sort();
        let limit = limits[semaphore];
        let mut held = 0;
        for (at, delta) in list {
            held += delta;
            if held > limit as i64 {
                violations.push(format!(
                    "{semaphore}: {held} permits relied on at once at {at:?}, above the limit {limit}"
                ));
                break;
            }
        }
    }
}

/// No token is granted to two leases of one name. (A grant retried with its
/// Idempotency-Key answers the lease it won before: the same lease, the same token.)
/// Two shared leases granted at once may share a token (each is the highest counter of the
/// majority it reached); an exclusive lease's token is its own.
fn tokens_are_unique(grants: &[&Event], violations: &mut Vec<String>) {
    let mut seen: HashMap<(&str, u64), (Option<&str>, bool)> = HashMap::new();
    for g in grants {
        if let Some(token) = g.token
            && let Some((lease, shared)) =
                seen.insert((g.name.as_str(), token), (g.lease.as_deref(), g.shared))
            && lease != g.lease.as_deref()
            && !(shared && g.shared)
        {
            violations.push(format!(
                "token {token} of {} was granted twice (again at {:?})",
                g.name, g.answered
            ));
        }
    }
}

/// A grant that began after another lease's grant of the same name was answered must carry
/// a greater token. (A retry of the same lease with its Idempotency-Key is that grant.)
fn tokens_rise(grants: &[&Event], violations: &mut Vec<String>) {
    let mut by_name: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for g in grants {
        by_name.entry(&g.name).or_default().push(g);
    }
    for (name, mut gs) in by_name {
        let mut by_answer = gs.clone();
        by_answer.sort_by_key(|g| g.answered);
        gs.sort_by_key(|g| g.invoked);
        let mut done = 0;
        let mut highest: Option<&Event> = None;
        for g in gs {
            while done < by_answer.len() && by_answer[done].answered < g.invoked {
                let candidate = by_answer[done];
                if highest.is_none_or(|h| candidate.token > h.token) {
                    highest = Some(candidate);
                }
                done += 1;
            }
            if let Some(h) = highest
                && g.token <= h.token
                && !(g.lease == h.lease && g.token == h.token)
            {
                violations.push(format!(
                    "{name}: token {:?} granted at {:?} is not above token {:?} granted at {:?} before it began",
                    g.token, g.answered, h.token, h.answered
                ));
            }
        }
    }
}

/// Per lease, the stretches its holder may rely on it.
fn windows(history: &[Event]) -> HashMap<(&str, &str), Vec<(Duration, Duration)>> {
    let mut out: HashMap<(&str, &str), Vec<(Duration, Duration)>> = HashMap::new();
    let mut revoked: HashMap<(&str, &str), Duration> = HashMap::new();
    for e in history {
        let Some(lease) = e.lease.as_deref() else {
            continue;
        };
        if e.kind == Kind::Revoke {
            let at = revoked.entry((&e.name, lease)).or_insert(e.invoked);
            *at = (*at).min(e.invoked);
        }
    }
    for e in history {
        let ok = matches!((e.kind, e.status), (Kind::Grant, 201) | (Kind::Renew, 200));
        let (Some(lease), Some(validity), true) = (e.lease.as_deref(), e.validity, ok) else {
            continue;
        };
        let mut end = e.invoked + validity;
        if let Some(revoke) = revoked.get(&(e.name.as_str(), lease)) {
            end = end.min(*revoke);
        }
        if end > e.answered {
            out.entry((&e.name, lease))
                .or_default()
                .push((e.answered, end));
        }
    }
    out
}

/// No exclusive lease's window overlaps another lease's (shared leases may overlap each
/// other).
fn windows_never_overlap(history: &[Event], violations: &mut Vec<String>) {
    let shared: HashSet<(&str, &str)> = history
        .iter()
        .filter(|e| e.shared)
        .filter_map(|e| Some((e.name.as_str(), e.lease.as_deref()?)))
        .collect();
    let mut by_name: BTreeMap<&str, Vec<(Duration, Duration, &str)>> = BTreeMap::new();
    for ((name, lease), ws) in windows(history) {
        for (from, until) in ws {
            by_name.entry(name).or_default().push((from, until, lease));
        }
    }
    for (name, mut ws) in by_name {
        ws.sort();
        let is_shared = |lease: &str| shared.contains(&(name, lease));
        // Sweep in start order, remembering the window reaching furthest so far: of every
        // lease, and of the exclusive ones.
        let mut reach: Option<(Duration, &str, Duration)> = None;
        let mut exclusive: Option<(Duration, &str, Duration)> = None;
        for (from, until, lease) in ws {
            // An exclusive window meets any window before it; a shared one, exclusive ones.
            let before = if is_shared(lease) { exclusive } else { reach };
            if let Some((end, other, other_from)) = before
                && other != lease
                && from < end
            {
                violations.push(format!(
                    "{name}: two leases held at once: one relied on from {other_from:?} to {end:?}, another from {from:?} to {until:?}"
                ));
            }
            if reach.is_none_or(|(end, _, _)| until > end) {
                reach = Some((until, lease, from));
            }
            if !is_shared(lease) && exclusive.is_none_or(|(end, _, _)| until > end) {
                exclusive = Some((until, lease, from));
            }
        }
    }
}

/// A renew or revoke succeeds only for the lease that holds the lock: never for a lease id
/// nobody was granted, never after the lease was revoked, never once its keys have expired.
fn only_the_holder(history: &[Event], violations: &mut Vec<String>) {
    let mut granted: HashSet<(&str, &str)> = HashSet::new();
    let mut steps_of: HashMap<(&str, &str), Vec<&Event>> = HashMap::new();
    let mut revoked_at: HashMap<(&str, &str), Duration> = HashMap::new();
    for e in history {
        let Some(lease) = e.lease.as_deref() else {
            continue;
        };
        match (e.kind, e.status) {
            (Kind::Grant, 201) => {
                granted.insert((&e.name, lease));
                steps_of.entry((&e.name, lease)).or_default().push(e)
            }
            (Kind::Renew, 200) => steps_of.entry((&e.name, lease)).or_default().push(e),
            (Kind::Revoke, 204) => {
                let at = revoked_at.entry((&e.name, lease)).or_insert(e.answered);
                *at = (*at).min(e.answered);
            }
            _ => {}
        }
    }
    for e in history {
        let succeeded = matches!((e.kind, e.status), (Kind::Renew, 200) | (Kind::Revoke, 204));
        let Some(lease) = e.lease.as_deref().filter(|_| succeeded) else {
            continue;
        };
        let key = (e.name.as_str(), lease);
        let (true, Some(steps)) = (granted.contains(&key), steps_of.get(&key)) else {
            violations.push(format!(
                "{}: a {:?} succeeded at {:?} for a lease id that was never granted",
                e.name, e.kind, e.answered
            ));
            continue;
        };
        if let Some(at) = revoked_at.get(&key)
            && *at < e.invoked
            && e.kind == Kind::Renew
        {
            violations.push(format!(
                "{}: a renew succeeded at {:?} for a lease revoked at {at:?}",
                e.name, e.answered
            ));
        }
        // Once a lease's keys have surely expired on a majority, it holds nothing to renew
        // or revoke. A step that succeeded was applied by a majority before its answer, so
        // its keys expire a TTL after that at the latest (a straggler that applied it later
        // is a minority). A renew whose outcome is unknown (no answer, 5xx) may have been
        // applied at any time since, even after the client gave up (a partition's packets
        // are retransmitted once it heals): then nothing can be said.
        let unknown = history.iter().any(|r| {
            r.kind == Kind::Renew
                && r.name == e.name
                && r.lease.as_deref() == Some(lease)
                && r.invoked < e.invoked
                && !matches!(r.status, 200 | 404)
        });
        let alive_until = steps
            .iter()
            .filter(|s| s.answered < e.invoked)
            .map(|s| s.answered + s.ttl)
            .max();
        if let Some(until) = alive_until
            && !unknown
            && e.invoked > until + EXPIRY_SLACK
            && !steps
                .iter()
                .any(|s| s.invoked < e.invoked && s.answered >= e.invoked)
        {
            violations.push(format!(
                "{}: a {:?} invoked at {:?} succeeded for a lease whose keys had expired at {until:?}",
                e.name, e.kind, e.invoked
            ));
        }
    }
}

fn no_grant_without_a_majority(
    grants: &[&Event],
    outages: &[Outage],
    violations: &mut Vec<String>,
) {
    for g in grants {
        if let Some(o) = outages
            .iter()
            .find(|o| o.replica == g.replica && o.from <= g.invoked && g.answered <= o.until)
        {
            violations.push(format!(
                "{}: granted by replica {} at {:?} while it reached fewer than a majority of masters ({:?} to {:?})",
                g.name, g.replica, g.answered, o.from, o.until
            ));
        }
    }
}

/// How long a waiting grant may go unserved while the history shows everything it asked
/// for free, once every fault has healed. A waiter is woken by a release on any replica
/// and by its own timer at a lapse, then tries once (hand-off p99 a few ms in the
/// benchmark; a master step may take 200 ms in the suite before it counts as a failure):
/// 750 ms is room for a loaded two-core machine, and under the shortest stall it must
/// catch (a waiter asleep until another's claim lapses, a second after the lapse it
/// waited for). Faults stretch hand-offs further, so only the calm after them is judged.
pub const LIVENESS_BOUND: Duration = Duration::from_millis(750);

/// How long a claim may outlast the waiting grant that made it (acquire.lua: the grant's
/// remaining wait and 100 ms).
const CLAIM_OUTLIVES: Duration = Duration::from_millis(100);

/// Every waiting grant made from `calm_from` on (every fault healed) that went unserved for
/// `bound` while all it asked for was free. "Free" is what the history can show, counted
/// generously: no other lease held it (from its grant's invocation until its holder's
/// answered revoke, or until the last answered grant or renew that may have reached the
/// masters plus its TTL and slack, and its lock-delay after that when it was not revoked;
/// a grant whose outcome is unknown holds from its invocation until its TTL after the
/// timeout), no other grant of it was in flight (a waiting one may claim it, until 100 ms
/// after it gave up), and, for a semaphore, fewer of its slots were held than its limit.
/// A shared grant is kept waiting only by exclusive holders and waiters.
pub fn waiters_are_served(history: &[Event], calm_from: Duration, bound: Duration) -> Vec<String> {
    let mut violations = Vec::new();
    // One call per grant request: a several-name grant is recorded once per name.
    let mut calls: BTreeMap<Call, Vec<&Event>> = BTreeMap::new();
    for e in history.iter().filter(|e| e.kind == Kind::Grant) {
        calls
            .entry((e.invoked, e.answered, e.replica))
            .or_default()
            .push(e);
    }
    let busy = Busy::from_history(history, &calls);
    for ((invoked, answered, _), events) in &calls {
        let first = events[0];
        if first.wait.is_zero() || *invoked < calm_from || !matches!(first.status, 201 | 409) {
            continue;
        }
        let names: BTreeSet<&str> = events.iter().map(|e| base_name(&e.name)).collect();
        let mut stretches: Vec<(Duration, Duration)> = Vec::new();
        for name in &names {
            stretches.extend(busy.of(name, first, *invoked, *answered));
        }
        stretches.sort();
        let mut free_from = *invoked;
        let mut gap = None;
        for (from, until) in stretches {
            if from >= free_from + bound {
                break;
            }
            free_from = free_from.max(until);
        }
        if free_from + bound <= *answered {
            gap = Some(free_from);
        }
        if let Some(from) = gap {
            let outcome = if first.status == 201 {
                "granted"
            } else {
                "refused"
            };
            let names: Vec<&str> = names.into_iter().collect();
            violations.push(format!(
                "{}: a grant waiting up to {:?} from {invoked:?} was {outcome} at {answered:?}, though all it asked for was free from {from:?}",
                names.join("+"),
                first.wait,
            ));
        }
    }
    violations
}

/// A semaphore's permits are recorded by slot (`%pool/1`); a waiter waits for the pool.
fn base_name(name: &str) -> &str {
    match name.strip_prefix('%').and(name.rsplit_once('/')) {
        Some((pool, _)) => pool,
        None => name,
    }
}

/// A grant request: its invocation, its answer and its replica.
type Call = (Duration, Duration, usize);

/// One name taken for a while: as a waiter asks for it, from, until, by which call, and
/// whether shared.
type Taken<'a> = (&'a str, Duration, Duration, Call, bool);

/// When each name was taken, by whom, as far as the history shows.
struct Busy<'a> {
    stretches: Vec<Taken<'a>>,
    /// A semaphore's largest limit seen.
    limits: HashMap<&'a str, u64>,
}

impl<'a> Busy<'a> {
    fn from_history(history: &'a [Event], calls: &BTreeMap<Call, Vec<&'a Event>>) -> Self {
        // Per lease: how long it may live, and whether its holder revoked it.
        let mut lives: HashMap<(&str, &str), Duration> = HashMap::new();
        let mut revoked: HashMap<(&str, &str), Duration> = HashMap::new();
        for e in history {
            let Some(lease) = e.lease.as_deref() else {
                continue;
            };
            let key = (e.name.as_str(), lease);
            match (e.kind, e.status) {
                (Kind::Revoke, 204) => {
                    let at = revoked.entry(key).or_insert(e.answered);
                    *at = (*at).min(e.answered);
                }
                (Kind::Revoke, _) | (Kind::Renew, 404) => {}
                // A grant or a renew, answered or not: its keys may live a TTL after it.
                (Kind::Grant | Kind::Renew, _) => {
                    let slack = EXPIRY_SLACK + e.ttl / 50;
                    let end = lives.entry(key).or_default();
                    *end = (*end).max(e.answered + e.ttl + slack);
                }
            }
        }
        let mut stretches = Vec::new();
        let mut limits: HashMap<&str, u64> = HashMap::new();
        for (call, events) in calls {
            for e in events {
                let name = base_name(&e.name);
                if let Some(limit) = e.limit {
                    let most = limits.entry(name).or_default();
                    *most = (*most).max(limit);
                }
                let end = match (e.status, e.lease.as_deref()) {
                    (201, Some(lease)) => {
                        let key = (e.name.as_str(), lease);
                        match revoked.get(&key) {
                            Some(at) => *at,
                            None => {
                                lives.get(&key).copied().unwrap_or(e.answered + e.ttl)
                                    + e.lock_delay.unwrap_or_default()
                            }
                        }
                    }
                    // A waiting grant that gave up may leave its claim a moment.
                    (409, _) if !e.wait.is_zero() => e.answered + CLAIM_OUTLIVES,
                    (400..=499, _) => e.answered,
                    // No answer, or a 5xx: it may hold what it asked for, for its TTL.
                    _ => e.answered + e.ttl + EXPIRY_SLACK,
                };
                stretches.push((name, e.invoked, end, *call, e.shared));
            }
        }
        Self { stretches, limits }
    }

    /// The stretches within `[from, until]` during which `name` was not free for `waiter`
    /// (its own call aside).
    fn of(
        &self,
        name: &str,
        waiter: &Event,
        from: Duration,
        until: Duration,
    ) -> Vec<(Duration, Duration)> {
        let me = (waiter.invoked, waiter.answered, waiter.replica);
        let others = self
            .stretches
            .iter()
            .filter(|(n, start, end, call, shared)| {
                *n == name
                    && *call != me
                    && *start < until
                    && *end > from
                    && !(waiter.shared && *shared)
            });
        let Some(limit) = self
            .limits
            .get(name)
            .copied()
            .filter(|_| name.starts_with('%'))
        else {
            return others.map(|(_, start, end, ..)| (*start, *end)).collect();
        };
        // A semaphore is taken while `limit` of its permits are.
        let mut edges: Vec<(Duration, i64)> = others
            .flat_map(|(_, start, end, ..)| [(*start, 1), (*end, -1)])
            .collect();
        edges.sort();
        let (mut held, mut full_from, mut out) = (0, None, Vec::new());
        for (at, delta) in edges {
            held += delta;
            match (held >= limit as i64, full_from) {
                (true, None) => full_from = Some(at),
                (false, Some(start)) => {
                    out.push((start, at));
                    full_from = None;
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn grant(lease: &str, token: u64, invoked: u64, answered: u64, validity: u64) -> Event {
        Event {
            kind: Kind::Grant,
            replica: 0,
            name: "x".into(),
            lease: Some(lease.into()),
            invoked: ms(invoked),
            answered: ms(answered),
            status: 201,
            token: Some(token),
            validity: Some(ms(validity)),
            ttl: ms(validity + 20),
            message: None,
            limit: None,
            shared: false,
            lock_delay: None,
            wait: Duration::ZERO,
        }
    }

    fn step(kind: Kind, lease: &str, invoked: u64, answered: u64, status: u16) -> Event {
        Event {
            kind,
            replica: 0,
            name: "x".into(),
            lease: Some(lease.into()),
            invoked: ms(invoked),
            answered: ms(answered),
            status,
            token: None,
            validity: (kind == Kind::Renew).then(|| ms(1000)),
            ttl: ms(1020),
            message: None,
            limit: None,
            shared: false,
            lock_delay: None,
            wait: Duration::ZERO,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let history = [
            grant("A", 1, 0, 5, 1000),
            step(Kind::Renew, "A", 400, 405, 200),
            step(Kind::Revoke, "A", 900, 905, 204),
            grant("B", 2, 906, 910, 1000),
        ];
        assert_eq!(check(&history, &[]), Vec::<String>::new());
    }

    #[test]
    fn overlapping_leases_are_caught() {
        let history = [grant("A", 1, 0, 5, 1000), grant("B", 2, 500, 505, 1000)];
        let found = check(&history, &[]);
        assert!(found.iter().any(|v| v.contains("two leases")), "{found:?}");
    }

    #[test]
    fn falling_and_repeated_tokens_are_caught() {
        let history = [
            grant("A", 5, 0, 5, 10),
            grant("B", 5, 100, 105, 10),
            grant("C", 3, 200, 205, 10),
        ];
        let found = check(&history, &[]);
        assert!(found.iter().any(|v| v.contains("twice")), "{found:?}");
        assert!(found.iter().any(|v| v.contains("not above")), "{found:?}");
    }

    #[test]
    fn a_retried_grant_of_the_same_lease_is_the_same_grant() {
        let retried = [grant("A", 5, 0, 5, 10), grant("A", 5, 100, 105, 10)];
        assert_eq!(check(&retried, &[]), Vec::<String>::new());
        let another = [grant("A", 5, 0, 5, 10), grant("B", 5, 100, 105, 10)];
        assert!(check(&another, &[]).iter().any(|v| v.contains("twice")));
        let lower = [grant("A", 6, 0, 5, 10), grant("A", 5, 100, 105, 10)];
        assert!(check(&lower, &[]).iter().any(|v| v.contains("not above")));
    }

    #[test]
    fn a_renew_of_a_revoked_expired_or_unknown_lease_is_caught() {
        let history = [
            grant("A", 1, 0, 5, 100),
            step(Kind::Revoke, "A", 50, 55, 204),
            step(Kind::Renew, "A", 60, 65, 200),
            step(Kind::Renew, "nobody", 70, 75, 200),
            grant("B", 2, 100, 105, 100),
            step(Kind::Renew, "B", 900, 905, 200),
        ];
        let found = check(&history, &[]);
        assert!(found.iter().any(|v| v.contains("revoked")), "{found:?}");
        assert!(
            found.iter().any(|v| v.contains("never granted")),
            "{found:?}"
        );
        assert!(found.iter().any(|v| v.contains("expired")), "{found:?}");
    }

    #[test]
    fn shared_leases_may_overlap_each_other_but_never_an_exclusive_one() {
        let shared = |lease: &str, token: u64, invoked: u64| Event {
            shared: true,
            ..grant(lease, token, invoked, invoked + 5, 1000)
        };
        let readers = [shared("A", 1, 0), shared("B", 2, 100), shared("C", 2, 100)];
        assert_eq!(
            check(&readers, &[]),
            Vec::<String>::new(),
            "equal tokens at once too"
        );
        let writer_after = [shared("A", 1, 0), grant("W", 2, 500, 505, 1000)];
        let found = check(&writer_after, &[]);
        assert!(found.iter().any(|v| v.contains("two leases")), "{found:?}");
        let reader_after = [grant("W", 1, 0, 5, 1000), shared("A", 2, 500)];
        let found = check(&reader_after, &[]);
        assert!(found.iter().any(|v| v.contains("two leases")), "{found:?}");
        // A reader whose window started before a long one ended, behind a short writer.
        let tucked = [
            shared("A", 1, 0),
            grant("W", 2, 200, 205, 10),
            shared("B", 3, 300),
        ];
        let found = check(&tucked, &[]);
        assert!(found.iter().any(|v| v.contains("two leases")), "{found:?}");
    }

    #[test]
    fn more_permits_than_the_limit_are_caught() {
        let permit = |slot: u64, lease: &str, token: u64, limit: u64| Event {
            name: format!("%pool/{slot}"),
            limit: Some(limit),
            ..grant(lease, token, 0, 5, 1000)
        };
        let within = [permit(0, "A", 1, 2), permit(1, "B", 2, 2)];
        assert_eq!(check(&within, &[]), Vec::<String>::new());
        // Three slots at once: one of them is outside its limit of 2, and three are held.
        let above = [
            permit(0, "A", 1, 2),
            permit(1, "B", 2, 2),
            permit(2, "C", 3, 2),
        ];
        let found = check(&above, &[]);
        assert!(found.iter().any(|v| v.contains("slot 2")), "{found:?}");
        assert!(found.iter().any(|v| v.contains("3 permits")), "{found:?}");
        // Two on one slot is a slot held twice.
        let twice = [permit(0, "A", 1, 2), permit(0, "B", 2, 2)];
        let found = check(&twice, &[]);
        assert!(found.iter().any(|v| v.contains("two leases")), "{found:?}");
    }

    #[test]
    fn a_grant_during_an_outage_is_caught() {
        let history = [grant("A", 1, 100, 105, 1000)];
        let outage = Outage {
            replica: 0,
            from: ms(50),
            until: ms(200),
        };
        assert_eq!(check(&history, std::slice::from_ref(&outage)).len(), 1);
        let other = Outage {
            replica: 1,
            ..outage
        };
        assert!(check(&history, &[other]).is_empty());
    }

    #[test]
    fn a_grant_inside_a_lapsed_leases_lock_delay_is_caught() {
        let delayed = |mut e: Event| {
            e.lock_delay = Some(ms(300));
            e
        };
        // L1 (TTL 520 from 0, delay 300) lapses: free from 820 on (770 with the slack).
        let lapsed = [
            delayed(grant("L1", 1, 0, 10, 500)),
            grant("L2", 2, 650, 700, 500),
        ];
        let violations = check(&lapsed, &[]);
        assert!(
            violations.iter().any(|v| v.contains("lock-delay")),
            "{violations:?}"
        );
        let after = [
            delayed(grant("L1", 1, 0, 10, 500)),
            grant("L2", 2, 800, 830, 500),
        ];
        assert_eq!(check(&after, &[]), Vec::<String>::new());
        // A renew moves the end; a revoke leaves no delay to keep.
        let renewed = [
            delayed(grant("L1", 1, 0, 10, 500)),
            step(Kind::Renew, "L1", 300, 310, 200),
            grant("L2", 2, 1350, 1400, 500),
        ];
        let violations = check(&renewed, &[]);
        assert!(
            violations.len() == 1 && violations[0].contains("lock-delay"),
            "{violations:?}"
        );
        let revoked = [
            delayed(grant("L1", 1, 0, 10, 500)),
            step(Kind::Revoke, "L1", 100, 110, 204),
            grant("L2", 2, 120, 130, 500),
        ];
        assert_eq!(check(&revoked, &[]), Vec::<String>::new());
    }

    /// A waiting grant of `names` (a several-name grant is one event per name), answered
    /// `status` at `answered`.
    fn waiter(names: &[&str], invoked: u64, answered: u64, status: u16) -> Vec<Event> {
        names
            .iter()
            .map(|name| Event {
                name: (*name).into(),
                replica: 1,
                status,
                lease: (status == 201).then(|| "W".into()),
                token: (status == 201).then_some(9),
                wait: ms(4000),
                ..grant("W", 9, invoked, answered, 1000)
            })
            .collect()
    }

    fn on(name: &str, e: Event) -> Event {
        Event {
            name: name.into(),
            ..e
        }
    }

    fn served(history: &[Event]) -> Vec<String> {
        waiters_are_served(history, ms(0), LIVENESS_BOUND)
    }

    #[test]
    fn a_waiter_left_waiting_while_its_name_is_free_is_caught() {
        // Held until its revoke at 1 000; the waiter sat until its deadline at 4 000.
        let mut history = vec![
            grant("A", 1, 0, 5, 10_000),
            step(Kind::Revoke, "A", 995, 1000, 204),
        ];
        history.extend(waiter(&["x"], 100, 4100, 409));
        let found = served(&history);
        assert!(
            found.iter().any(|v| v.contains("free from 1s")),
            "{found:?}"
        );
        // Granted late is as bad as refused.
        history.truncate(2);
        history.extend(waiter(&["x"], 100, 3000, 201));
        assert_eq!(served(&history).len(), 1);
        // Granted at the revoke: served.
        history.truncate(2);
        history.extend(waiter(&["x"], 100, 1010, 201));
        assert_eq!(served(&history), Vec::<String>::new());
        // Before the faults healed, nothing is judged.
        history.truncate(2);
        history.extend(waiter(&["x"], 100, 4100, 409));
        assert_eq!(
            waiters_are_served(&history, ms(200), LIVENESS_BOUND),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_waiter_behind_a_lease_that_lapses_or_others_in_line_is_not_blamed() {
        // Never revoked: it may live until its grant's answer plus its TTL (and slack).
        let mut history = vec![grant("A", 1, 0, 5, 2000)];
        history.extend(waiter(&["x"], 100, 2100, 201));
        assert_eq!(served(&history), Vec::<String>::new());
        // A lock-delay after it, when it lapsed.
        history[0].lock_delay = Some(ms(2000));
        history.pop();
        history.extend(waiter(&["x"], 100, 4100, 201));
        assert_eq!(served(&history), Vec::<String>::new());
        // Revoked, but another waiter went first and held it until the deadline.
        let mut history = vec![
            grant("A", 1, 0, 5, 10_000),
            step(Kind::Revoke, "A", 995, 1000, 204),
            on("x", grant("B", 2, 50, 1005, 10_000)),
            step(Kind::Revoke, "B", 3995, 4000, 204),
        ];
        history.extend(waiter(&["x"], 100, 4100, 409));
        assert_eq!(served(&history), Vec::<String>::new());
        // Or a grant whose outcome is unknown, which may hold it.
        let mut history = vec![Event {
            status: 0,
            lease: None,
            ..grant("A", 1, 0, 3000, 2000)
        }];
        history.extend(waiter(&["x"], 100, 4100, 409));
        assert_eq!(served(&history), Vec::<String>::new());
    }

    #[test]
    fn a_several_name_waiter_waits_only_while_one_of_its_names_is_held() {
        let mut history = vec![
            on("y", grant("A", 1, 0, 5, 10_000)),
            Event {
                name: "y".into(),
                ..step(Kind::Revoke, "A", 3995, 4000, 204)
            },
        ];
        history.extend(waiter(&["x", "y"], 100, 4010, 201));
        assert_eq!(served(&history), Vec::<String>::new());
        history[1].invoked = ms(995);
        history[1].answered = ms(1000);
        let found = served(&history);
        assert!(found.iter().any(|v| v.starts_with("x+y")), "{found:?}");
    }

    #[test]
    fn a_semaphore_waiter_waits_only_while_every_permit_is_held() {
        let permit = |slot: u64, lease: &str| Event {
            name: format!("%pool/{slot}"),
            limit: Some(2),
            ..grant(lease, 1, 0, 5, 10_000)
        };
        let mut history = vec![permit(0, "A"), permit(1, "B")];
        history.extend(waiter(&["%pool"], 100, 4100, 409));
        assert_eq!(served(&history), Vec::<String>::new());
        history.remove(1);
        let found = served(&history);
        assert!(found.iter().any(|v| v.starts_with("%pool")), "{found:?}");
    }

    #[test]
    fn a_shared_waiter_waits_only_for_exclusive_holders() {
        let reader = Event {
            shared: true,
            ..grant("A", 1, 0, 5, 10_000)
        };
        let shared_waiter = |status| {
            waiter(&["x"], 100, 4100, status)
                .into_iter()
                .map(|e| Event { shared: true, ..e })
                .collect::<Vec<_>>()
        };
        let mut history = vec![reader.clone()];
        history.extend(shared_waiter(409));
        assert_eq!(
            served(&history).len(),
            1,
            "a reader does not keep a reader out"
        );
        let mut history = vec![grant("A", 1, 0, 5, 10_000)];
        history.extend(shared_waiter(409));
        assert_eq!(served(&history), Vec::<String>::new());
        // An exclusive waiter waits for readers.
        let mut history = vec![reader];
        history.extend(waiter(&["x"], 100, 4100, 409));
        assert_eq!(served(&history), Vec::<String>::new());
    }
}
