//! The fault suite: real redis-server masters and real redlockd replica processes, driven by
//! workers that grant, renew, check and revoke while a seeded schedule injects the events a
//! deployment meets in its first weeks: masters killed and restarted with and without their
//! data or from an old snapshot, paused, cut off from one replica, their replies lost;
//! replicas crashed and restarted, a new replica joining during a fault, a new deployment
//! whose masters boot apart. The checker then reads the whole history (see `checker`).
//!
//! Each scenario runs in a network namespace of its own (see `net`), so firewall rules and
//! ports vanish with it. A scenario prints its seed; `REDLOCKD_FAULT_SEED=<seed>` replays
//! the random ones.
//!
//! Skipped (the crate is empty) where no redis-server is installed: build.rs says so once,
//! and fails the build instead under REDLOCKD_REQUIRE_REDIS (scripts/test).
#![cfg(not(redis_missing))]

#[path = "fault_suite/checker.rs"]
mod checker;
mod common;
#[path = "fault_suite/cutoff.rs"]
mod cutoff;
#[path = "fault_suite/fenced.rs"]
mod fenced;
#[path = "fault_suite/fleet.rs"]
mod fleet;
#[path = "fault_suite/net.rs"]
mod net;
#[path = "fault_suite/streamed.rs"]
mod streamed;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use checker::{Event, Kind, Outage};
use common::{RedisMaster, wait_for};
use net::{Cut, Firewall, replica_host};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");
const MASTERS: usize = 3;
/// Replicas 0 and 1 run throughout (bar crashes); 2 joins during a fault.
const REPLICAS: usize = 3;
/// The largest TTL.
const MAX_TTL: Duration = Duration::from_millis(3000);
/// How long a kept hold lives (and so a master that lost its data sits out, with the
/// largest lock-delay).
pub(crate) const MAX_KEPT: Duration = Duration::from_millis(4000);
/// The largest lock-delay: a master that lost its data is quarantined for this and the
/// largest TTL.
const MAX_LOCK_DELAY: Duration = Duration::from_millis(1000);
/// The lock-delay three in four of the workers' grants of `job:d` carry.
const LOCK_DELAY_MS: u64 = 300;
/// A long-waiting grant's wait: past `checker::LIVENESS_BOUND`, within the workers' 4 s
/// request timeout.
const LONG_WAIT_MS: u64 = 3000;
/// How long the workers go on once every fault has healed, their waiting grants judged by
/// `checker::waiters_are_served`.
const CALM: Duration = Duration::from_secs(6);
/// The names the workers use; `@job:a` is the election `job:a` (its own kind of key: it
/// must never collide with the lock `job:a`), whose renews now and then proclaim a value;
/// `%job:a` is the semaphore `job:a`, whose permits allow `POOL_LIMIT` holders (a permit's
/// steps are recorded under its slot's name, `%job:a/<slot>`); `^job:b` is a shared grant of
/// the lock `job:b` (recorded as `job:b`, shared), which exclusive grants also take;
/// `+job:a+job:c` is one lease on both `job:a` and `job:c` (`POST /locks`), recorded as a
/// lease on each of them; three in four grants of `job:d` carry a lock-delay.
const NAMES: [&str; 8] = [
    "job:a", "job:b", "job:c", "job:d", "@job:a", "%job:a", "^job:b", GROUP,
];
/// The several-name lease of `NAMES`.
const GROUP: &str = "+job:a+job:c";

/// The names of a lease on several names (`+a+b`), or `None`.
fn group_names(name: &str) -> Option<Vec<&str>> {
    name.starts_with('+')
        .then(|| name.split('+').filter(|n| !n.is_empty()).collect())
}
const POOL_LIMIT: u64 = 2;

/// The route of a name: `/locks/<name>`, `/elections/<name>` for `@<name>`, and
/// `/semaphores/<name>` for `%<name>` (or one of its slots, `%<name>/<slot>`), and
/// `/locks/<name>` again for a shared grant, `^<name>`.
fn route(name: &str) -> String {
    if let Some(names) = group_names(name) {
        return format!("locks/{}", names[0]);
    }
    if let Some(election) = name.strip_prefix('@') {
        return format!("elections/{election}");
    }
    if let Some(lock) = name.strip_prefix('^') {
        return format!("locks/{lock}");
    }
    match name.strip_prefix('%') {
        Some(semaphore) => format!("semaphores/{}", semaphore.split('/').next().unwrap()),
        None => format!("locks/{name}"),
    }
}

/// A grant's fields: a semaphore's carry its limit, a shared grant its mode.
fn grant_body(name: &str, mut body: Value) -> Value {
    if name.starts_with('%') {
        body["limit"] = json!(POOL_LIMIT);
    }
    if name.starts_with('^') {
        body["mode"] = json!("shared");
    }
    if let Some(names) = group_names(name) {
        body["names"] = json!(names);
    }
    body
}

/// The name a granted lease's later steps are recorded under: a permit's slot's.
fn held_name(name: &str, granted: &Value) -> String {
    match granted["slot"].as_u64() {
        Some(slot) => format!("{name}/{slot}"),
        None => name.to_owned(),
    }
}

/// A master that every replica can reach, each through an address of its own; with
/// `movable`, its wall clock can be stepped (`Fault::ClockJump`).
fn start_master(movable: bool) -> RedisMaster {
    let mut args = vec![
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        // No rewrite of the append-only file mid-run: a cut tail copies the files as they
        // stand (`Fault::CutTail`).
        "--auto-aof-rewrite-percentage",
        "0",
        "--bind",
        "127.0.0.1",
    ];
    let hosts: Vec<String> = (0..REPLICAS).map(replica_host).collect();
    args.extend(hosts.iter().map(String::as_str));
    if movable {
        RedisMaster::start_with_movable_clock(&args)
    } else {
        RedisMaster::start_with(None, &args)
    }
}

/// A redlockd process, killed on drop.
struct Replica {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Replica {
    async fn start(
        index: usize,
        masters: &[RedisMaster],
        logs: &Path,
        extra: &[(&str, &str)],
    ) -> Self {
        Self::start_binary(BIN, index, masters, logs, extra).await
    }

    /// A replica of the redlockd binary at `bin` (another release's, in a rolling deploy).
    async fn start_binary(
        bin: &str,
        index: usize,
        masters: &[RedisMaster],
        logs: &Path,
        extra: &[(&str, &str)],
    ) -> Self {
        let urls: Vec<String> = masters
            .iter()
            .map(|m| format!("redis://{}:{}", replica_host(index), m.port))
            .collect();
        Self::start_over_with(bin, index, &urls, logs, extra).await
    }

    /// A replica over the masters at `urls`.
    async fn start_over(
        index: usize,
        urls: &[String],
        logs: &Path,
        extra: &[(&str, &str)],
    ) -> Self {
        Self::start_over_with(BIN, index, urls, logs, extra).await
    }

    /// A replica of the binary at `bin` over the masters at `urls`.
    async fn start_over_with(
        bin: &str,
        index: usize,
        urls: &[String],
        logs: &Path,
        extra: &[(&str, &str)],
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = logs.join(format!("replica-{index}-{port}.log"));
        let child = Command::new(bin)
            .env_clear()
            .env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"))
            .env("REDLOCKD_REDIS_URLS", urls.join(","))
            .env("REDLOCKD_MAX_TTL_MS", MAX_TTL.as_millis().to_string())
            .env(
                "REDLOCKD_MAX_KEPT_HOLD_MS",
                MAX_KEPT.as_millis().to_string(),
            )
            .env(
                "REDLOCKD_FLEETLOCK_GROUPS",
                fleet::GROUPS
                    .iter()
                    .map(|(group, slots)| format!("{group}={slots}"))
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .env(
                "REDLOCKD_MAX_LOCK_DELAY_MS",
                MAX_LOCK_DELAY.as_millis().to_string(),
            )
            .env("REDLOCKD_DEFAULT_TTL_MS", "1000")
            .env("REDLOCKD_MAX_WAIT_MS", LONG_WAIT_MS.to_string())
            // A debug build on two shared cores: room for a busy moment, still small
            // next to the TTLs.
            .env("REDLOCKD_MASTER_TIMEOUT_MS", "200")
            .env("REDLOCKD_LOG_FORMAT", "text")
            .env("RUST_LOG", "warn")
            .envs(extra.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn redlockd");
        let replica = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        common::serving(&replica.base, "the replica to serve").await;
        replica
    }

    fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stop it as a deploy does: SIGTERM, then wait for it to drain and exit (killed if it
    /// has not within `drain`).
    async fn terminate(mut self, drain: Duration) {
        common::signal(self.child.id(), "-TERM");
        let deadline = Instant::now() + drain;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(common::POLL).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which masters each replica cannot reach now, and the stretches in which that was a
/// majority: a grant answered 201 inside one would break promise 6.
struct Reach {
    started: Instant,
    cut: [[u32; MASTERS]; REPLICAS],
    open: [Option<Duration>; REPLICAS],
    outages: Vec<Outage>,
}

impl Reach {
    fn new(started: Instant) -> Self {
        Self {
            started,
            cut: [[0; MASTERS]; REPLICAS],
            open: [None; REPLICAS],
            outages: Vec::new(),
        }
    }

    fn change(&mut self, replicas: &[usize], master: usize, cut: bool) {
        let now = self.started.elapsed();
        let majority = MASTERS / 2 + 1;
        for &r in replicas {
            if cut {
                self.cut[r][master] += 1;
            } else {
                self.cut[r][master] -= 1;
            }
            let unreachable = self.cut[r].iter().filter(|c| **c > 0).count();
            match (unreachable >= majority, self.open[r]) {
                (true, None) => self.open[r] = Some(now),
                (false, Some(from)) => {
                    self.open[r] = None;
                    self.outages.push(Outage {
                        replica: r,
                        from,
                        until: now,
                    });
                }
                _ => {}
            }
        }
    }

    /// Cut (or restore) master `m` for every replica: killed, paused.
    fn all(&mut self, m: usize, cut: bool) {
        self.change(&(0..REPLICAS).collect::<Vec<_>>(), m, cut);
    }
}

/// Where the workers send requests: the live replicas' base URLs, by replica index.
type Bases = Arc<RwLock<Vec<Option<String>>>>;

struct Recorder {
    started: Instant,
    /// The wall clock at `started`: where a held stream's `expires_at` falls on the run's
    /// timeline.
    started_wall: std::time::SystemTime,
    events: Mutex<Vec<Event>>,
    /// Lease ids already revoked, for workers that try to use someone else's.
    stale: Mutex<Vec<(String, String)>>,
    /// Grants won by a retry with the first attempt's Idempotency-Key.
    retried: std::sync::atomic::AtomicUsize,
    /// Kept holds granted (`kept: true`: renewed by no one).
    kept: std::sync::atomic::AtomicUsize,
    /// Rounds of a worker holding a name through a session.
    sessions: std::sync::atomic::AtomicUsize,
    /// Rounds of a worker holding a name through a held stream, and the `jeopardy` events
    /// those streams were told.
    streams: std::sync::atomic::AtomicUsize,
    jeopardies: std::sync::atomic::AtomicUsize,
    /// Held streams resumed through another replica (after `closed`, or a blip), and the
    /// blips: connections of streams held with a grace, dropped without a revoke.
    resumes: std::sync::atomic::AtomicUsize,
    blips: std::sync::atomic::AtomicUsize,
    /// Holds won through a session's held stream, and of the resumes, those of such a
    /// stream.
    session_streams: std::sync::atomic::AtomicUsize,
    session_resumes: std::sync::atomic::AtomicUsize,
}

fn ms(v: &Value, field: &str) -> Option<Duration> {
    v[field].as_u64().map(Duration::from_millis)
}

impl Recorder {
    /// An empty history, its times counted from `started`.
    fn new(started: Instant) -> Arc<Self> {
        Arc::new(Self {
            started,
            started_wall: std::time::SystemTime::now() - started.elapsed(),
            events: Mutex::new(Vec::new()),
            stale: Mutex::new(Vec::new()),
            retried: Default::default(),
            kept: Default::default(),
            sessions: Default::default(),
            streams: Default::default(),
            resumes: Default::default(),
            blips: Default::default(),
            session_streams: Default::default(),
            session_resumes: Default::default(),
            jeopardies: Default::default(),
        })
    }

    /// Grant `name` through session `id` (waiting a little), recorded: the lease id won.
    async fn grant_through(
        &self,
        http: &reqwest::Client,
        replica: usize,
        base: &str,
        name: &str,
        id: &str,
        ttl: Duration,
    ) -> Option<String> {
        let body = json!({"session": id, "wait_ms": 300});
        let (status, lease) = self.grant(http, (replica, base), name, body, ttl).await;
        let won = lease["lease_id"].as_str().filter(|_| status == 201);
        won.map(str::to_owned)
    }

    /// Add `event` to the history as it is.
    fn record(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }

    /// A grant of `name` with `body` (its TTL `ttl`, no Idempotency-Key) on replica `at`
    /// (index, base URL).
    async fn grant(
        &self,
        http: &reqwest::Client,
        at: (usize, &str),
        name: &str,
        body: Value,
        ttl: Duration,
    ) -> (u16, Value) {
        self.call(http, at, Kind::Grant, name, None, body, ttl, None)
            .await
    }

    /// A worker's grant (as `grant`): the lease when granted, or `None` after a pause.
    async fn granted(
        &self,
        http: &reqwest::Client,
        at: (usize, &str),
        grant: (&str, Value),
        ttl: Duration,
        rng: &mut StdRng,
    ) -> Option<Value> {
        let (name, body) = grant;
        match self.grant(http, at, name, body, ttl).await {
            (201, lease) => Some(lease),
            _ => {
                back_off(rng).await;
                None
            }
        }
    }

    /// A renew or revoke of lease `id` of `name`, with no body, on replica `at` (index,
    /// base URL).
    async fn on_lease(
        &self,
        http: &reqwest::Client,
        at: (usize, &str),
        kind: Kind,
        name: &str,
        id: &str,
        ttl: Duration,
    ) -> (u16, Value) {
        self.call(http, at, kind, name, Some(id), json!({}), ttl, None)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        http: &reqwest::Client,
        at: (usize, &str),
        kind: Kind,
        name: &str,
        lease: Option<&str>,
        body: Value,
        ttl: Duration,
        idempotency_key: Option<&str>,
    ) -> (u16, Value) {
        let (replica, base) = at;
        let path = route(name);
        let request = match (kind, lease) {
            (Kind::Grant, _) => {
                let post = match group_names(name) {
                    Some(_) => http.post(format!("{base}/locks")),
                    None => http.post(format!("{base}/{path}")),
                };
                match idempotency_key {
                    Some(key) => post.header("Idempotency-Key", key),
                    None => post,
                }
            }
            (Kind::Renew, Some(l)) => http.put(format!("{base}/{path}/leases/{l}")),
            (Kind::Revoke, Some(l)) => http.delete(format!("{base}/{path}/leases/{l}")),
            _ => unreachable!("renew and revoke name a lease"),
        };
        let invoked = self.started.elapsed();
        let answer = request.json(&body).send().await;
        let (status, value) = match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let value = resp.json::<Value>().await.unwrap_or(Value::Null);
                (status, value)
            }
            Err(_) => (0, Value::Null),
        };
        let answered = self.started.elapsed();
        let granted = value["lease_id"].as_str().map(str::to_owned);
        let name = match (kind, status) {
            (Kind::Grant, 201) => held_name(name, &value),
            _ => name.to_owned(),
        };
        let shared = name.starts_with('^');
        let lock_delay = body["lock_delay_ms"].as_u64().map(Duration::from_millis);
        // A lease on several names is a lease on each of them.
        let names = group_names(&name)
            .map(|names| names.into_iter().map(str::to_owned).collect())
            .unwrap_or_else(|| vec![name.trim_start_matches('^').to_owned()]);
        let mut events = self.events.lock().unwrap();
        for name in names {
            events.push(Event {
                kind,
                replica,
                limit: value["limit"].as_u64(),
                shared,
                name,
                lease: lease.map(str::to_owned).or(granted.clone()),
                invoked,
                answered,
                status,
                // An election's term is its lease's fencing token.
                token: value["fencing_token"]
                    .as_u64()
                    .or_else(|| value["term"].as_u64()),
                validity: ms(&value, "validity_ms"),
                ttl: ms(&value, "ttl_ms").unwrap_or(ttl),
                message: value["message"].as_str().map(str::to_owned),
                lock_delay,
                wait: body["wait_ms"]
                    .as_u64()
                    .map_or(Duration::ZERO, Duration::from_millis),
            });
        }
        drop(events);
        (status, value)
    }
}

/// The HTTP client a worker sends with: a request that gets no answer in 4 s is recorded
/// as unanswered.
fn worker_client() -> reqwest::Client {
    common::http_builder()
        .timeout(Duration::from_secs(4))
        .build()
        .unwrap()
}

/// The replicas running now, with their base URLs.
fn live_replicas(bases: &Bases) -> Vec<(usize, String)> {
    bases
        .read()
        .unwrap()
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.clone().map(|b| (i, b)))
        .collect()
}

/// A live replica drawn at random, or none (after a pause, so that a worker waiting for
/// one does not spin) while every replica is down.
/// A worker's short random pause after a refusal, so that it does not spin.
async fn back_off(rng: &mut StdRng) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
}

async fn pick_live(bases: &Bases, rng: &mut StdRng) -> Option<(usize, String)> {
    let live = live_replicas(bases);
    if live.is_empty() {
        tokio::time::sleep(common::POLL).await;
        return None;
    }
    Some(live[rng.random_range(0..live.len())].clone())
}

/// One worker: grant a name, hold it for a while with renews, revoke it (or let it lapse);
/// now and then try to renew or revoke a lease that is not its own.
async fn worker(
    seed: u64,
    bases: Bases,
    recorder: Arc<Recorder>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = worker_client();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let live = live_replicas(&bases);
        if live.is_empty() {
            tokio::time::sleep(common::POLL).await;
            continue;
        }
        let (replica, base) = live[rng.random_range(0..live.len())].clone();
        // The several-name lease needs two names free at once, where every other kind needs
        // one: it is drawn twice as often, so that each run has enough of them to judge.
        let name = match rng.random_range(0..NAMES.len() + 1) {
            i if i < NAMES.len() => NAMES[i],
            _ => GROUP,
        };
        if rng.random_ratio(1, 20) {
            // Someone else's lease, revoked long ago, or one nobody was ever given.
            let stolen = recorder.stale.lock().unwrap().last().cloned();
            let (name, lease) =
                stolen.unwrap_or_else(|| (name.to_owned(), "bm9ib2R5LWV2ZXItZ290LWl0".to_owned()));
            let kind = if rng.random_bool(0.5) {
                Kind::Renew
            } else {
                Kind::Revoke
            };
            recorder
                .call(
                    &http,
                    (replica, &base),
                    kind,
                    &name,
                    Some(&lease),
                    json!({}),
                    Duration::ZERO,
                    None,
                )
                .await;
            continue;
        }
        // A third of the rounds on job:b hold it through a session (job:a is left to the
        // several-name grants, which need it free beside job:c).
        if rng.random_ratio(1, 3) && name == "job:b" {
            session_round(&mut rng, &http, replica, &base, name, &recorder).await;
            continue;
        }
        let ttl = Duration::from_millis(rng.random_range(400..1500));
        // A sixth of the grants wait long, past the checker's liveness bound: once every
        // fault has healed, each must be served as soon as all it asked for is free.
        let wait = match rng.random_range(0..6) {
            0 | 1 => 300,
            2 => LONG_WAIT_MS,
            _ => 0,
        };
        // Half the grants carry an Idempotency-Key and, when no answer comes (or a 503),
        // are sent again with it, to another replica if one is up: the retry must answer
        // the lease the first attempt may have won, never a second one.
        let key = rng
            .random_bool(0.5)
            .then(|| format!("{seed}-{:x}", rng.random::<u64>()));
        // Three in four grants of job:d leave a lock-delay when they lapse; the checker
        // holds every later grant of job:d to it. (Held streams take job:d too: at one in
        // two, a slow run judged as few as 5 delayed leases.)
        let delayed = name == "job:d" && rng.random_ratio(3, 4);
        // One grant in eight is kept by the server: no renew needed, held until revoked or
        // its maximum (a fifth are never revoked, and end there, leaving their delay).
        let kept = rng.random_ratio(1, 8);
        let mut tries = if key.is_some() { 3 } else { 1 };
        let mut replica = replica;
        let mut base = base;
        let (status, lease) = loop {
            let (status, lease) = recorder
                .call(
                    &http,
                    (replica, &base),
                    Kind::Grant,
                    name,
                    None,
                    grant_body(name, {
                        let mut body = json!({"ttl_ms": ttl.as_millis() as u64, "wait_ms": wait});
                        if delayed {
                            body["lock_delay_ms"] = json!(LOCK_DELAY_MS);
                        }
                        if kept {
                            body["kept"] = json!(true);
                            body.as_object_mut().map(|b| b.remove("ttl_ms"));
                        }
                        body
                    }),
                    ttl,
                    key.as_deref(),
                )
                .await;
            tries -= 1;
            if tries == 0 || !matches!(status, 0 | 503) {
                if status == 201 && tries < 2 {
                    recorder
                        .retried
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                break (status, lease);
            }
            if let Some((r, b)) = live
                .iter()
                .find(|(r, _)| *r != replica)
                .or_else(|| live.first())
            {
                (replica, base) = (*r, b.clone());
            }
            back_off(&mut rng).await;
        };
        if status != 201 {
            back_off(&mut rng).await;
            continue;
        }
        if kept {
            recorder
                .kept
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let id = lease["lease_id"].as_str().unwrap_or_default().to_owned();
        let name = held_name(name, &lease);
        let name = name.as_str();
        for round in 0..rng.random_range(0..3) {
            tokio::time::sleep(ttl / 3).await;
            // A leader proclaims a new value now and then: the term must not change.
            let body = if name.starts_with('@') && rng.random_bool(0.5) {
                json!({"value": format!("worker-{seed}-{round}")})
            } else {
                json!({})
            };
            let (status, _) = recorder
                .call(
                    &http,
                    (replica, &base),
                    Kind::Renew,
                    name,
                    Some(&id),
                    body,
                    ttl,
                    None,
                )
                .await;
            if status != 200 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        if rng.random_ratio(4, 5) {
            let (status, _) = recorder
                .on_lease(&http, (replica, &base), Kind::Revoke, name, &id, ttl)
                .await;
            if status == 204 {
                recorder.stale.lock().unwrap().push((name.to_owned(), id));
            }
        }
    }
}

/// What a session renew's answer `value` (a 200) says of the hold `lease`, as the status of
/// a renew of it. A renew extends the hold only when it lists it in `kept`, as the clients
/// read it: one it could not confirm (`unconfirmed`) is a renew that failed (its earlier
/// validity stands, as after a lease's 503), and any other has ended (as a renew's 404
/// says). Only a kept hold's renew counts as the holder's.
fn session_renew_status(value: &Value, lease: Option<&str>) -> u16 {
    let listed = |field: &str| {
        value[field]
            .as_array()
            .is_some_and(|l| l.iter().any(|id| id.as_str() == lease))
    };
    if listed("kept") {
        200
    } else if listed("unconfirmed") {
        503
    } else {
        404
    }
}

/// One round of a worker that holds `name` through a session: open a session, grant the
/// name through it, renew only the session for a while, then end the session (or revoke
/// the hold first, or let the session lapse). The hold is recorded as a lease whose renews
/// are the session's (its validity is the session's), and the session's end as its revoke.
async fn session_round(
    rng: &mut StdRng,
    http: &reqwest::Client,
    replica: usize,
    base: &str,
    name: &str,
    recorder: &Recorder,
) {
    let ttl = Duration::from_millis(rng.random_range(400..1500));
    let opened = http
        .post(format!("{base}/sessions"))
        .json(&json!({"ttl_ms": ttl.as_millis() as u64}))
        .send()
        .await;
    // A session that cannot be opened (no majority): pause as a failed grant does.
    let pause = Duration::from_millis(rng.random_range(5..40));
    let Ok(opened) = opened else {
        tokio::time::sleep(pause).await;
        return;
    };
    if opened.status() != 201 {
        tokio::time::sleep(pause).await;
        return;
    }
    let session: Value = opened.json().await.unwrap_or_default();
    let Some(id) = session["session_id"].as_str().map(str::to_owned) else {
        return;
    };
    let held = recorder
        .grant_through(http, replica, base, name, &id, ttl)
        .await;
    // A step of the session, recorded as that step of the hold (when there is one).
    let step = async |method: reqwest::Method, kind: Kind| {
        let invoked = recorder.started.elapsed();
        let answer = http
            .request(method, format!("{base}/sessions/{id}"))
            .send()
            .await;
        let (status, value) = match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        };
        let status = match (kind, status) {
            (Kind::Renew, 200) => session_renew_status(&value, held.as_deref()),
            (_, status) => status,
        };
        if let Some(lease) = &held {
            recorder.events.lock().unwrap().push(Event {
                kind,
                replica,
                name: name.to_owned(),
                lease: Some(lease.clone()),
                invoked,
                answered: recorder.started.elapsed(),
                status,
                token: None,
                validity: ms(&value, "validity_ms"),
                ttl: ms(&value, "ttl_ms").unwrap_or(ttl),
                message: value["message"].as_str().map(str::to_owned),
                limit: None,
                shared: false,
                lock_delay: None,
                wait: Duration::ZERO,
            });
        }
        status
    };
    for _ in 0..rng.random_range(1..4) {
        tokio::time::sleep(ttl / 3).await;
        if step(reqwest::Method::PUT, Kind::Renew).await != 200 {
            break;
        }
    }
    match rng.random_range(0..5) {
        // The session lapses, and its hold with it.
        0 => {}
        // The hold is revoked by its own lease id, then the session ends.
        1 if held.is_some() => {
            let lease = held.as_deref().unwrap_or_default();
            recorder
                .call(
                    http,
                    (replica, base),
                    Kind::Revoke,
                    name,
                    Some(lease),
                    json!({}),
                    ttl,
                    None,
                )
                .await;
            let _ = http.delete(format!("{base}/sessions/{id}")).send().await;
        }
        _ => {
            step(reqwest::Method::DELETE, Kind::Revoke).await;
        }
    }
    recorder
        .sessions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Masters, replicas, firewall and the record of what could reach what.
struct Cluster {
    masters: Vec<RedisMaster>,
    replicas: Vec<Option<Replica>>,
    bases: Bases,
    firewall: Firewall,
    reach: Reach,
    logs: tempfile::TempDir,
    snapshots: Vec<Option<PathBuf>>,
    /// How far each master's wall clock has been stepped, in ms (masters started with a
    /// movable clock only).
    clock_offsets: Vec<i64>,
    /// The redlockd binary each replica runs (another release's in a rolling deploy).
    bins: Vec<String>,
}

impl Cluster {
    async fn start(started: Instant) -> Self {
        Self::start_with(started, false).await
    }

    /// With `movable`, every master's wall clock can be stepped.
    async fn start_with(started: Instant, movable: bool) -> Self {
        Self::start_on(started, movable, BIN).await
    }

    /// With replicas 0 and 1 running the redlockd binary at `bin`.
    async fn start_on(started: Instant, movable: bool, bin: &str) -> Self {
        let masters: Vec<RedisMaster> = (0..MASTERS).map(|_| start_master(movable)).collect();
        let mut cluster = Self {
            masters,
            replicas: (0..REPLICAS).map(|_| None).collect(),
            bases: Arc::new(RwLock::new(vec![None; REPLICAS])),
            firewall: Firewall::default(),
            reach: Reach::new(started),
            logs: tempfile::tempdir().unwrap(),
            snapshots: vec![None; MASTERS],
            clock_offsets: vec![0; MASTERS],
            bins: vec![bin.to_owned(); REPLICAS],
        };
        cluster.firewall.clear();
        for r in 0..2 {
            cluster.start_replica(r, &[]).await;
        }
        cluster
    }

    async fn start_replica(&mut self, r: usize, extra: &[(&str, &str)]) {
        let replica =
            Replica::start_binary(&self.bins[r], r, &self.masters, self.logs.path(), extra).await;
        self.bases.write().unwrap()[r] = Some(replica.base.clone());
        self.replicas[r] = Some(replica);
    }

    /// Replica `r` stopped (as a deploy does, or killed) and started again on the binary
    /// at `bin`.
    async fn replace_replica(&mut self, r: usize, bin: &str, graceful: bool) {
        self.bases.write().unwrap()[r] = None;
        if let Some(replica) = self.replicas[r].take() {
            if graceful {
                replica.terminate(Duration::from_secs(10)).await;
            } else {
                replica.crash();
            }
        }
        bin.clone_into(&mut self.bins[r]);
        self.start_replica(r, &[]).await;
    }

    fn crash_replica(&mut self, r: usize) {
        self.bases.write().unwrap()[r] = None;
        if let Some(replica) = self.replicas[r].take() {
            replica.crash();
        }
    }

    /// The readiness of the first live replica.
    async fn readyz(&self) -> Option<Value> {
        let base = self.replicas.iter().flatten().next()?.base.clone();
        common::http()
            .get(format!("{base}/readyz"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()
    }

    /// Whether every master votes (none is quarantined), so that one more may lose its
    /// data without a majority having lost theirs.
    async fn all_voting(&self) -> bool {
        self.readyz().await.is_some_and(|r| {
            r["masters"]
                .as_array()
                .is_some_and(|ms| ms.iter().all(|m| m["voting"] == true))
        })
    }

    /// Where master `m`'s append-only files are copied when its tail is to be cut.
    fn tail_cut_at(&self, m: usize) -> PathBuf {
        self.logs.path().join(format!("aof-{m}"))
    }

    fn logs(&self) -> String {
        self.replicas
            .iter()
            .flatten()
            .map(|r| format!("--- {}\n{}", r.log.display(), r.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One fault, applied for a while and then healed.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Pause(usize),
    KillWithData(usize),
    KillEmpty(usize),
    Rollback(usize),
    /// The master runs on for a while, then crashes and comes back on `appendfsync
    /// everysec` with the tail of its append-only file cut: every write it answered since
    /// the fault began is lost, its marker and counter kept.
    CutTail(usize),
    Partition(usize, usize),
    LoseReplies(usize, usize),
    CrashReplica(usize),
    /// The master's wall clock steps forward by this many ms (its keys expire early);
    /// nothing heals it but the quarantine it earns.
    ClockJump(usize, i64),
}

impl Cluster {
    async fn apply(&mut self, fault: Fault) {
        match fault {
            Fault::Pause(m) => {
                self.masters[m].pause();
                self.reach.all(m, true);
            }
            Fault::KillWithData(m) | Fault::KillEmpty(m) => {
                self.masters[m].stop();
                self.reach.all(m, true);
            }
            Fault::Rollback(m) => {
                let snapshot = self.snapshots[m].clone().expect("a snapshot was taken");
                self.reach.all(m, true);
                self.masters[m].restart_from(&snapshot).await;
                self.reach.all(m, false);
            }
            Fault::CutTail(m) => self.masters[m].copy_aof(&self.tail_cut_at(m)),
            Fault::Partition(m, r) => {
                self.firewall.add(Cut::Partition {
                    replica: r,
                    port: self.masters[m].port,
                });
                self.reach.change(&[r], m, true);
            }
            Fault::LoseReplies(m, r) => {
                self.firewall.add(Cut::LoseReplies {
                    replica: r,
                    port: self.masters[m].port,
                });
                self.reach.change(&[r], m, true);
            }
            Fault::CrashReplica(r) => self.crash_replica(r),
            Fault::ClockJump(m, by) => {
                self.clock_offsets[m] += by;
                self.masters[m].set_clock_offset(self.clock_offsets[m]);
            }
        }
    }

    async fn heal(&mut self, fault: Fault) {
        match fault {
            Fault::Pause(m) => {
                self.reach.all(m, false);
                self.masters[m].resume();
            }
            Fault::KillWithData(m) => {
                self.masters[m].start_again();
                self.reach.all(m, false);
            }
            Fault::KillEmpty(m) => {
                self.masters[m].start_wiped();
                self.reach.all(m, false);
            }
            Fault::Rollback(_) => {}
            Fault::CutTail(m) => {
                self.reach.all(m, true);
                let copy = self.tail_cut_at(m);
                self.masters[m].restart_with_aof_as(&copy, &["--appendfsync", "everysec"]);
                self.reach.all(m, false);
                // Its operator puts it back on `appendfsync always` once the replicas have
                // judged its restart (they remove its marker), so that a later crash with
                // its data is one (bounded: the control run never removes it).
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while self.masters[m]
                        .cmd::<Option<String>>(&["GET", "redlockd:marker"])
                        .await
                        .map_or(true, |marker| marker.is_some())
                    {
                        tokio::time::sleep(common::POLL).await;
                    }
                })
                .await;
                let _ = self.masters[m]
                    .cmd::<String>(&["CONFIG", "SET", "appendfsync", "always"])
                    .await;
            }
            Fault::Partition(m, r) => {
                self.reach.change(&[r], m, false);
                self.firewall.remove(&Cut::Partition {
                    replica: r,
                    port: self.masters[m].port,
                });
            }
            Fault::LoseReplies(m, r) => {
                self.reach.change(&[r], m, false);
                self.firewall.remove(&Cut::LoseReplies {
                    replica: r,
                    port: self.masters[m].port,
                });
            }
            Fault::CrashReplica(r) => self.start_replica(r, &[]).await,
            Fault::ClockJump(..) => {}
        }
    }
}

/// Grant every name once more after all faults healed: within TTL + quarantine + 1 s each
/// must be granted, or a name was left blocked.
async fn every_name_is_granted_again(cluster: &Cluster) -> Vec<String> {
    every_name_is_granted_again_on_names(cluster, &NAMES).await
}

/// `every_name_is_granted_again`, for `names`.
async fn every_name_is_granted_again_on_names(cluster: &Cluster, names: &[&str]) -> Vec<String> {
    let base = cluster.replicas[0]
        .as_ref()
        .expect("replica 0 runs")
        .base
        .clone();
    every_name_is_granted_again_on(&base, names).await
}

/// `every_name_is_granted_again`, through the replica at `base`, for `names`.
async fn every_name_is_granted_again_on(base: &str, names: &[&str]) -> Vec<String> {
    let http = common::http();
    let deadline = Duration::from_millis(1500) + MAX_TTL + MAX_LOCK_DELAY + Duration::from_secs(1);
    let mut blocked = Vec::new();
    for &name in names {
        let started = Instant::now();
        let mut last = Value::Null;
        let mut granted = false;
        while started.elapsed() < deadline {
            let resp = http
                .post(match group_names(name) {
                    Some(_) => format!("{base}/locks"),
                    None => format!("{base}/{}", route(name)),
                })
                .json(&grant_body(name, json!({"ttl_ms": 1000, "wait_ms": 500})))
                .send()
                .await;
            if let Ok(resp) = resp {
                let status = resp.status().as_u16();
                last = resp.json().await.unwrap_or(Value::Null);
                if status == 201 {
                    granted = true;
                    break;
                }
            }
            tokio::time::sleep(common::POLL).await;
        }
        if !granted {
            blocked.push(format!(
                "{name} was not granted within {deadline:?} after every fault healed: {last}"
            ));
        }
    }
    blocked
}

/// Six workers (seeded from `seed`) against the replicas in `bases`, recording into one
/// history until the returned flag is set.
#[allow(clippy::type_complexity)]
fn start_workers(
    started: Instant,
    seed: u64,
    bases: &Bases,
) -> (
    Arc<Recorder>,
    Arc<std::sync::atomic::AtomicBool>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let recorder = Recorder::new(started);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers: Vec<_> = (0..6)
        .map(|w| {
            tokio::spawn(worker(
                seed + w,
                bases.clone(),
                recorder.clone(),
                stop.clone(),
            ))
        })
        .collect();
    workers.extend((6..8).map(|w| {
        tokio::spawn(streamed::stream_worker(
            seed + w,
            bases.clone(),
            recorder.clone(),
            stop.clone(),
        ))
    }));
    (recorder, stop, workers)
}

fn seed(default: u64) -> u64 {
    std::env::var("REDLOCKD_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The seeds `REDLOCKD_FAULT_SEEDS` lists: numbers and ranges, comma-separated
/// (`1-40`, `3,7,11`, `1-10,99`).
fn seeds_listed(text: &str) -> Result<Vec<u64>, String> {
    let mut seeds = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("REDLOCKD_FAULT_SEEDS: {part:?} is not a seed or a range a-b");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.trim().parse().map_err(|_| bad())?,
                    b.trim().parse().map_err(|_| bad())?,
                );
                if a > b {
                    return Err(bad());
                }
                seeds.extend(a..=b);
            }
            None => seeds.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(seeds)
}

/// Run scenario `name` (an ignored test of this binary) once per seed that
/// `REDLOCKD_FAULT_SEEDS` lists, each in a network namespace and process of its own, one
/// after another; a failing seed keeps its history (see `keep_history`) and the others
/// still run. Fails naming every failing seed.
fn many_seeds(name: &str) {
    let listed = std::env::var("REDLOCKD_FAULT_SEEDS").unwrap_or_default();
    let seeds = seeds_listed(&listed).expect("a list of seeds");
    assert!(
        !seeds.is_empty(),
        "set REDLOCKD_FAULT_SEEDS (for example 1-40) to run {name}"
    );
    let mut failed = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        let started = Instant::now();
        let status = net::run_inside(name, &[("REDLOCKD_FAULT_SEED", seed.to_string())]);
        if !status.success() {
            failed.push(*seed);
        }
        eprintln!(
            "fault suite: {name}: seed {seed} {} in {:?} ({} of {}, {} failed so far)",
            if status.success() { "passed" } else { "FAILED" },
            started.elapsed(),
            i + 1,
            seeds.len(),
            failed.len()
        );
    }
    eprintln!(
        "fault suite: {name}: {} passed, {} failed",
        seeds.len() - failed.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{name}: seeds {failed:?} failed");
}

/// Keep the whole record of a run whose checker found violations: every operation, the
/// faults, the violations and the replicas' logs, in a file under the target folder, so that
/// a failure is read in full rather than rerun in hope. Nothing is written for a clean run.
fn keep_if_violated(
    scenario: &str,
    seed: u64,
    history: &[Event],
    faults: &str,
    violations: &[String],
    logs: &str,
) {
    if violations.is_empty() {
        return;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("fault-suite");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{scenario}-seed-{seed}.txt"));
    let mut text = format!(
        "{scenario}, seed {seed} (replay: REDLOCKD_FAULT_SEED={seed})\n\n{} violations:\n{}\n\nfaults:\n{faults}\n\nhistory ({} operations):\n",
        violations.len(),
        violations.join("\n"),
        history.len()
    );
    for e in history {
        text.push_str(&format!("{e:?}\n"));
    }
    text.push_str("\nreplica logs:\n");
    text.push_str(logs);
    match std::fs::write(&path, text) {
        Ok(()) => eprintln!(
            "fault suite: the history of seed {seed} is kept in {}",
            path.display()
        ),
        Err(e) => eprintln!(
            "fault suite: could not keep the history in {}: {e}",
            path.display()
        ),
    }
}

/// The faults a run applied, one a line, for its kept history.
fn faults_text<A: std::fmt::Debug, B: std::fmt::Debug, C: std::fmt::Debug>(
    applied: &[(A, B, C)],
) -> String {
    applied
        .iter()
        .map(|(at, fault, second)| format!("  {at:?}: {fault:?} {second:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The verdict of a run: no violation, or every one of them with the replicas' logs.
fn assert_no_violations(scenario: &str, seed: u64, violations: &[String], logs: &str) {
    assert!(
        violations.is_empty(),
        "{scenario}, seed {seed}: {} violations:\n{}\n\nreplica logs:\n{logs}",
        violations.len(),
        violations.join("\n"),
    );
}

/// The faults a deployment meets, drawn from `seed` one after another until `length` has
/// passed since `started`, each held a while and healed: masters paused, killed with and
/// without their data, rolled back, cut off from a replica, their replies lost, a replica
/// crashed, now and then a second master paused too, and a new replica joining half-way.
/// With `jumps`, that master's wall clock also steps forward now and then. Returns what was
/// applied, when.
async fn inject_faults(
    cluster: &mut Cluster,
    seed: u64,
    started: Instant,
    length: Duration,
    jumps: Option<usize>,
) -> Vec<(Duration, Fault, Option<Fault>)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut applied = Vec::new();
    let mut last_data_loss: Option<Instant> = None;
    let mut joined = false;
    while started.elapsed() < length {
        let m = rng.random_range(0..MASTERS);
        if rng.random_ratio(1, 4) {
            cluster.masters[m]
                .snapshot(&cluster.logs.path().join(format!("snap-{m}.rdb")))
                .await;
            cluster.snapshots[m] = Some(cluster.logs.path().join(format!("snap-{m}.rdb")));
        }
        let r = rng.random_range(0..2);
        // A kept hold is the longest lease: a master that lost its data sits out as long.
        let quarantine = MAX_KEPT + MAX_LOCK_DELAY;
        let data_ok = last_data_loss
            .is_none_or(|t| t.elapsed() > quarantine + Duration::from_secs(1))
            && cluster.all_voting().await;
        let kinds = if jumps.is_some() { 12 } else { 8 };
        let fault = match rng.random_range(0..kinds) {
            0 => Fault::Pause(m),
            1 => Fault::KillWithData(m),
            2 if data_ok => Fault::KillEmpty(m),
            3 if data_ok && cluster.snapshots[m].is_some() => Fault::Rollback(m),
            7 if data_ok => Fault::CutTail(m),
            4 => Fault::Partition(m, r),
            5 => Fault::LoseReplies(m, r),
            6 => Fault::CrashReplica(r),
            8..=11 if data_ok => match jumps {
                Some(j) => Fault::ClockJump(j, rng.random_range(4_000..15_000)),
                None => unreachable!("drawn only with jumps"),
            },
            8..=11 => Fault::Pause(m),
            _ => Fault::Partition(m, 1 - r),
        };
        if matches!(
            fault,
            Fault::KillEmpty(_) | Fault::Rollback(_) | Fault::CutTail(_) | Fault::ClockJump(..)
        ) {
            last_data_loss = Some(Instant::now());
        }
        // Now and then a second master is paused too: a majority is out of reach.
        let second = rng
            .random_ratio(1, 4)
            .then(|| Fault::Pause((m + 1) % MASTERS));
        let hold = Duration::from_millis(rng.random_range(300..2000));
        cluster.apply(fault).await;
        if let Some(second) = second {
            cluster.apply(second).await;
        }
        applied.push((started.elapsed(), fault, second));
        if !joined && started.elapsed() > length / 2 {
            // A new replica joins while a fault is in force.
            cluster.start_replica(2, &[]).await;
            joined = true;
        }
        tokio::time::sleep(hold).await;
        if let Some(second) = second {
            cluster.heal(second).await;
        }
        cluster.heal(fault).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..800))).await;
    }
    applied
}

/// Once every fault has healed: when every master votes again (or 10 s have passed), the
/// moment from which the workers' waiting grants are judged for liveness; the workers go
/// on for `CALM` after it, beside rounds of waiters behind another's claim.
async fn calm(cluster: &Cluster, recorder: &Recorder, started: Instant) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.all_voting().await && Instant::now() < deadline {
        tokio::time::sleep(common::POLL).await;
    }
    let calm_from = started.elapsed();
    let rounds = async {
        for _ in 0..2 {
            behind_a_claim(&cluster.bases, recorder).await;
        }
    };
    tokio::join!(tokio::time::sleep(CALM), rounds);
    calm_from
}

/// The names of `behind_a_claim`'s rounds, which the workers leave alone.
const CLAIMED: &str = "+hand:p+hand:q";

/// One round of a waiter behind another's claim, across replicas (issue 33): a lease on
/// both names held for 1 s and left to lapse; a grant of them waiting on replica 0 (it
/// claims them until a second after the lapse); a grant of them waiting on replica 1,
/// which meets that claim and sleeps until it would end. At the lapse the claimant is
/// granted by its own timer, holds a moment and revokes: the last waiter must be granted
/// then, as the names sit free until it is (`checker::waiters_are_served`). Before the fix
/// nothing woke it, and it slept the second out.
async fn behind_a_claim(bases: &Bases, recorder: &Recorder) {
    let http = worker_client();
    let live = live_replicas(bases);
    let (Some((r0, b0)), Some((r1, b1))) = (
        live.iter().find(|(r, _)| *r == 0).cloned(),
        live.iter().find(|(r, _)| *r == 1).cloned(),
    ) else {
        return;
    };
    let ttl = Duration::from_millis(LONG_WAIT_MS);
    let body = |wait: u64| grant_body(CLAIMED, json!({"ttl_ms": LONG_WAIT_MS, "wait_ms": wait}));
    let grant = |r: usize, base: String, wait: u64| {
        let http = http.clone();
        async move {
            let (status, lease) = recorder
                .grant(&http, (r, &base), CLAIMED, body(wait), ttl)
                .await;
            (status == 201).then(|| lease["lease_id"].as_str().unwrap_or_default().to_owned())
        }
    };
    let revoke = |r: usize, base: String, id: String| {
        let http = http.clone();
        async move {
            recorder
                .on_lease(&http, (r, &base), Kind::Revoke, CLAIMED, &id, ttl)
                .await;
        }
    };
    let held = recorder
        .grant(
            &http,
            (r1, &b1),
            CLAIMED,
            grant_body(CLAIMED, json!({"ttl_ms": 1000})),
            Duration::from_secs(1),
        )
        .await;
    if held.0 != 201 {
        return;
    }
    let claimant = async {
        let id = grant(r0, b0.clone(), LONG_WAIT_MS).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        revoke(r0, b0.clone(), id).await;
        Some(())
    };
    let behind = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        grant(r1, b1.clone(), LONG_WAIT_MS).await
    };
    let (_, behind) = tokio::join!(claimant, behind);
    if let Some(id) = behind {
        revoke(r1, b1.clone(), id).await;
    }
}

/// Workers against two (then three) replicas while a seeded schedule injects faults for
/// `length`; then every fault heals and the workers go on for a while, every waiting grant
/// from then on served as soon as all it asked for is free; every name must be granted
/// again, and the history must keep every promise.
async fn random_faults(seed: u64, length: Duration) {
    common::init_test_logging();
    eprintln!("fault suite: seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    let (recorder, stop, workers) = start_workers(started, seed * 100, &cluster.bases);

    let applied = inject_faults(&mut cluster, seed, started, length, None).await;
    cluster.firewall.clear();
    let calm_from = calm(&cluster, &recorder, started).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let blocked = every_name_is_granted_again(&cluster).await;
    let (steps, calls) = master_traffic(&cluster).await;
    eprintln!("fault suite: {steps} master steps sent in {calls} calls by the live replicas");

    let history = recorder.events.lock().unwrap().clone();
    let mut counts = std::collections::BTreeMap::new();
    let mut messages = std::collections::BTreeMap::new();
    for e in &history {
        *counts
            .entry((format!("{:?}", e.kind), e.status))
            .or_insert(0) += 1;
        if let Some(m) = &e.message {
            *messages.entry(m.clone()).or_insert(0) += 1;
        }
    }
    eprintln!("fault suite: error messages {messages:#?}");
    eprintln!(
        "fault suite: seed {seed}: {} operations in {:?}, {} faults, {} majority outages; outcomes {counts:?}",
        history.len(),
        started.elapsed(),
        applied.len(),
        cluster.reach.outages.len()
    );
    for (at, fault, second) in &applied {
        eprintln!("  {at:?}: {fault:?} {second:?}");
    }
    let mut violations = checker::check(&history, &cluster.reach.outages);
    violations.extend(blocked);
    let judged = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.invoked >= calm_from)
        .filter(|e| e.wait == Duration::from_millis(LONG_WAIT_MS) && matches!(e.status, 201 | 409))
        .count();
    eprintln!(
        "fault suite: {judged} long-waiting grants (per name) after every fault healed at {calm_from:?}"
    );
    violations.extend(checker::waiters_are_served(
        &history,
        calm_from,
        checker::LIVENESS_BOUND,
    ));
    keep_if_violated(
        "random_faults",
        seed,
        &history,
        &faults_text(&applied),
        &violations,
        &cluster.logs(),
    );
    assert!(
        history
            .iter()
            .filter(|e| e.kind == Kind::Grant && e.status == 201)
            .count()
            > 50,
        "too few grants to judge anything; replica logs:\n{}",
        cluster.logs()
    );
    let terms = history
        .iter()
        .filter(|e| e.name.starts_with('@') && e.kind == Kind::Grant && e.status == 201)
        .count();
    let proclaimed = history
        .iter()
        .filter(|e| e.name.starts_with('@') && e.kind == Kind::Renew && e.status == 200)
        .count();
    eprintln!("fault suite: {terms} election terms won, {proclaimed} leader renews");
    let permits = history
        .iter()
        .filter(|e| e.limit.is_some() && e.kind == Kind::Grant && e.status == 201)
        .count();
    eprintln!("fault suite: {permits} semaphore permits granted (limit {POOL_LIMIT})");
    let shared = history
        .iter()
        .filter(|e| e.shared && e.kind == Kind::Grant && e.status == 201)
        .count();
    eprintln!("fault suite: {shared} shared grants of a lock that exclusive grants also take");
    let groups = history
        .iter()
        .filter(|e| e.name == "job:c" && e.kind == Kind::Grant && e.status == 201)
        .filter(|e| e.lease.as_deref().is_some_and(|l| l.ends_with("_m")))
        .count();
    eprintln!("fault suite: {groups} leases on job:a and job:c at once");
    let delayed = history
        .iter()
        .filter(|e| e.lock_delay.is_some() && e.kind == Kind::Grant && e.status == 201)
        .count();
    let refused = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 409)
        .filter(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.contains("lock-delay"))
        })
        .count();
    eprintln!(
        "fault suite: {delayed} leases of job:d with a {LOCK_DELAY_MS} ms lock-delay, {refused} grants refused during one"
    );
    assert!(
        delayed > 5,
        "too few leases with a lock-delay to judge them"
    );
    let sessions = recorder.sessions.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("fault suite: {sessions} rounds of a worker holding a name through a session");
    assert!(sessions > 5, "too few session rounds to judge sessions");
    let streams = recorder.streams.load(std::sync::atomic::Ordering::Relaxed);
    let jeopardies = recorder
        .jeopardies
        .load(std::sync::atomic::Ordering::Relaxed);
    let heartbeats = history
        .iter()
        .filter(|e| e.kind == Kind::Renew && e.status == 200 && e.invoked == e.answered)
        .count();
    eprintln!(
        "fault suite: {streams} holds through a held stream, {heartbeats} heartbeats, {jeopardies} jeopardy warnings"
    );
    let resumes = recorder.resumes.load(std::sync::atomic::Ordering::Relaxed);
    let blips = recorder.blips.load(std::sync::atomic::Ordering::Relaxed);
    let session_resumes = recorder
        .session_resumes
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fault suite: {blips} dropped connections of streams held with a grace, {resumes} resumes ({session_resumes} of a session's stream)"
    );
    let session_streams = recorder
        .session_streams
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("fault suite: {session_streams} holds through a session's held stream");
    assert!(blips > 2, "too few blips to judge resumes");
    assert!(streams > 5, "too few held streams to judge them");
    assert!(groups > 5, "too few leases on several names to judge them");
    assert!(shared > 5, "too few shared grants to judge shared locks");
    assert!(permits > 5, "too few permits to judge the semaphore");
    let retried = recorder.retried.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fault suite: {retried} grants won by a retry with the first attempt's Idempotency-Key"
    );
    let kept = recorder.kept.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("fault suite: {kept} kept holds granted");
    assert!(kept > 5, "too few kept holds to judge them");
    assert!(terms > 5, "too few election terms to judge the elections");
    // The steps ran in batches under these faults: some call carried several.
    assert!(
        steps > calls,
        "no call to a master carried more than one step ({steps} steps, {calls} calls)"
    );
    assert_no_violations("random_faults", seed, &violations, &cluster.logs());
}

/// A seeded scenario's tests: the first two run seeds 1 and 2 in the test command; the
/// third runs every seed `REDLOCKD_FAULT_SEEDS` lists, one after another, by hand:
/// `REDLOCKD_FAULT_SEEDS=1-40 cargo nextest run --test fault_suite --run-ignored only -E 'test(random_faults_many_seeds)' --no-capture`.
macro_rules! seeded {
    ($scenario:ident for $length:expr => $one:ident, $two:ident, $many:ident) => {
        #[test]
        fn $one() {
            if net::enter(stringify!($one)) {
                runtime().block_on($scenario(seed(1), $length));
            }
        }

        #[test]
        fn $two() {
            if net::enter(stringify!($two)) {
                runtime().block_on($scenario(seed(2), $length));
            }
        }

        #[test]
        #[ignore = "runs the seeds REDLOCKD_FAULT_SEEDS lists (minutes each); see `seeded!`"]
        fn $many() {
            if net::inside() {
                runtime().block_on($scenario(seed(0), $length));
            } else {
                many_seeds(stringify!($many));
            }
        }
    };
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

seeded!(random_faults for Duration::from_secs(40) =>
    random_faults_seed_1, random_faults_seed_2, random_faults_many_seeds);

#[test]
fn the_seeds_listed_are_numbers_and_ranges() {
    assert_eq!(seeds_listed("1-3,7, 9-9"), Ok(vec![1, 2, 3, 7, 9]));
    assert_eq!(seeds_listed(""), Ok(vec![]));
    assert!(seeds_listed("3-1").is_err());
    assert!(seeds_listed("x").is_err());
}

/// The names the session scenario's workers hold through sessions and contend for.
const SESSION_NAMES: [&str; 2] = ["ses:a", "ses:b"];

/// A worker of the session scenario: holds one of `SESSION_NAMES` through a session (when
/// `sessions`), or contends for it with plain grants that it holds briefly and revokes.
async fn session_worker(
    seed: u64,
    sessions: bool,
    bases: Bases,
    recorder: Arc<Recorder>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = worker_client();
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let Some((replica, base)) = pick_live(&bases, &mut rng).await else {
            continue;
        };
        let name = SESSION_NAMES[rng.random_range(0..SESSION_NAMES.len())];
        if sessions {
            session_round(&mut rng, &http, replica, &base, name, &recorder).await;
            continue;
        }
        let ttl = Duration::from_millis(rng.random_range(400..1500));
        let body = json!({"ttl_ms": ttl.as_millis() as u64, "wait_ms": 300});
        let at = (replica, base.as_str());
        let Some(lease) = recorder
            .granted(&http, at, (name, body), ttl, &mut rng)
            .await
        else {
            continue;
        };
        let id = lease["lease_id"].as_str().unwrap_or_default().to_owned();
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        recorder
            .on_lease(&http, (replica, &base), Kind::Revoke, name, &id, ttl)
            .await;
    }
}

/// Holds through sessions whose grant reached exactly a majority, then lost a carrier: a
/// seeded schedule cuts one master off from both replicas (grants made meanwhile land on the
/// other two only), heals it, then pauses or kills (with its data) one of those two while
/// sessions are renewed. Session workers hold `SESSION_NAMES` through sessions; contenders
/// ask for the same names with plain grants. The checker must find no overlap: a renew that
/// cannot reach a carrier must neither release the hold nor extend it.
async fn session_carriers(seed: u64, length: Duration) {
    common::init_test_logging();
    eprintln!(
        "fault suite: session carriers, seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})"
    );
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    let recorder = Recorder::new(started);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|w| {
            tokio::spawn(session_worker(
                seed * 100 + w,
                w < 4,
                cluster.bases.clone(),
                recorder.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut applied = Vec::new();
    while started.elapsed() < length {
        // Grants made now reach every master but `missed`.
        let missed = rng.random_range(0..MASTERS);
        let cut = [Fault::Partition(missed, 0), Fault::Partition(missed, 1)];
        for fault in cut {
            cluster.apply(fault).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        for fault in cut {
            cluster.heal(fault).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
        // Then one of the two carriers fails while the sessions are renewed.
        let carrier = (missed + rng.random_range(1..MASTERS)) % MASTERS;
        let fault = if rng.random_bool(0.5) {
            Fault::Pause(carrier)
        } else {
            Fault::KillWithData(carrier)
        };
        cluster.apply(fault).await;
        applied.push((started.elapsed(), missed, fault));
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2000))).await;
        cluster.heal(fault).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
    }
    cluster.firewall.clear();
    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let blocked = every_name_is_granted_again(&cluster).await;
    let history = recorder.events.lock().unwrap().clone();
    let count = |kind: Kind, status: u16| {
        history
            .iter()
            .filter(|e| e.kind == kind && e.status == status)
            .count()
    };
    let sessions = recorder.sessions.load(std::sync::atomic::Ordering::Relaxed);
    let (kept, unconfirmed, ended) = (
        count(Kind::Renew, 200),
        count(Kind::Renew, 503),
        count(Kind::Renew, 404),
    );
    eprintln!(
        "fault suite: session carriers, seed {seed}: {} operations in {:?}, {} carrier faults, {sessions} session rounds, {} grants; session renews kept {kept}, unconfirmed {unconfirmed}, ended {ended}",
        history.len(),
        started.elapsed(),
        applied.len(),
        count(Kind::Grant, 201),
    );
    let mut violations = checker::check(&history, &cluster.reach.outages);
    violations.extend(blocked);
    keep_if_violated(
        "session_carriers",
        seed,
        &history,
        &faults_text(&applied),
        &violations,
        &cluster.logs(),
    );
    assert!(sessions > 10, "too few session rounds to judge them");
    assert_no_violations("session_carriers", seed, &violations, &cluster.logs());
}

seeded!(session_carriers for Duration::from_secs(25) =>
    session_carriers_fail_seed_1, session_carriers_fail_seed_2, session_carriers_many_seeds);

/// The fenced-set workload (`fenced`) under the random faults, plus forward steps of one
/// master's wall clock: workers append to a register that refuses stale fencing tokens
/// while they hold one lock; the register and the checker judge the run.
async fn fenced_set(seed: u64, length: Duration) {
    common::init_test_logging();
    eprintln!("fault suite: fenced set, seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let started = Instant::now();
    let mut cluster = Cluster::start_with(started, true).await;
    let recorder = Recorder::new(started);
    let shared = fenced::Shared::new();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..5)
        .map(|w| {
            tokio::spawn(fenced::worker(
                seed * 100 + w,
                cluster.bases.clone(),
                recorder.clone(),
                shared.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let jumper = (seed % MASTERS as u64) as usize;
    let applied = inject_faults(&mut cluster, seed, started, length, Some(jumper)).await;
    cluster.firewall.clear();
    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let blocked = every_name_is_granted_again_on_names(&cluster, &[fenced::NAME]).await;
    let history = recorder.events.lock().unwrap().clone();
    let acknowledged = shared.acknowledged.lock().unwrap().clone();
    let (accepted, stale, mut violations) = shared.register.lock().unwrap().judge(&acknowledged);
    let jumps = applied
        .iter()
        .filter(|(_, f, _)| matches!(f, Fault::ClockJump(..)))
        .count();
    let grants = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 201)
        .count();
    let seen = forward_jumps_seen(&cluster);
    eprintln!(
        "fault suite: fenced set, seed {seed}: {} operations in {:?}, {} faults ({jumps} clock jumps on master {jumper}, seen {seen} times by the replicas), {grants} grants; {accepted} appends accepted, {stale} stale writes refused, {} violations by the register",
        history.len(),
        started.elapsed(),
        applied.len(),
        violations.len()
    );
    violations.extend(checker::check(&history, &cluster.reach.outages));
    violations.extend(blocked);
    keep_if_violated(
        "fenced_set",
        seed,
        &history,
        &faults_text(&applied),
        &violations,
        &cluster.logs(),
    );
    assert!(accepted > 50, "too few appends to judge the register");
    assert!(
        jumps == 0 || seen > 0,
        "{jumps} forward steps of master {jumper}'s clock, and no replica saw one"
    );
    assert_no_violations("fenced_set", seed, &violations, &cluster.logs());
}

/// FleetLock nodes (`fleet`) rebooting under the random faults: no group may ever have
/// more nodes rebooting than slots, though the slots are kept holds no one renews.
async fn fleetlock_nodes(seed: u64, length: Duration) {
    common::init_test_logging();
    eprintln!("fault suite: FleetLock nodes, seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    let shared = Arc::new(fleet::Shared::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let nodes: Vec<_> = (0..6)
        .map(|n| {
            let (group, _) = fleet::GROUPS[n % fleet::GROUPS.len()];
            tokio::spawn(fleet::node(
                seed * 100 + n as u64,
                group,
                cluster.bases.clone(),
                shared.clone(),
                started,
                stop.clone(),
            ))
        })
        .collect();
    let applied = inject_faults(&mut cluster, seed, started, length, None).await;
    cluster.firewall.clear();
    stop.store(true, std::sync::atomic::Ordering::Release);
    for n in nodes {
        n.await.expect("node");
    }
    let reboots = shared.reboots.lock().unwrap().clone();
    let violations = fleet::judge(&reboots);
    eprintln!(
        "fault suite: FleetLock nodes, seed {seed}: {} reboots in {:?}, {} faults, {} violations",
        reboots.len(),
        started.elapsed(),
        applied.len(),
        violations.len()
    );
    // The reboots are this scenario's history: kept with the faults.
    let calls = shared.calls.lock().unwrap().clone();
    let faults = format!(
        "{}\n\nreboots:\n{reboots:#?}\n\ncalls:\n{}",
        faults_text(&applied),
        calls.iter().map(|c| format!("{c}\n")).collect::<String>()
    );
    keep_if_violated(
        "fleetlock_nodes",
        seed,
        &[],
        &faults,
        &violations,
        &cluster.logs(),
    );
    assert!(reboots.len() > 10, "too few reboots to judge the groups");
    assert_no_violations("fleetlock_nodes", seed, &violations, &cluster.logs());
}

seeded!(fleetlock_nodes for Duration::from_secs(25) =>
    fleetlock_nodes_seed_1, fleetlock_nodes_seed_2, fleetlock_nodes_many_seeds);

/// The forward clock jumps the replicas saw, from every replica process's log (crashed
/// ones included: a replica restarted after a jump meets the master afresh).
fn forward_jumps_seen(cluster: &Cluster) -> usize {
    let Ok(entries) = std::fs::read_dir(cluster.logs.path()) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("replica-"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|log| {
            log.lines()
                .filter(|l| l.contains("a master's clock jumped forward"))
                .count()
        })
        .sum()
}

use cutoff::lost_while_cut_off;
seeded!(lost_while_cut_off for Duration::from_secs(15) =>
    lost_while_cut_off_seed_1, lost_while_cut_off_seed_2, lost_while_cut_off_many_seeds);

seeded!(fenced_set for Duration::from_secs(30) =>
    fenced_set_seed_1, fenced_set_seed_2, fenced_set_many_seeds);

/// The previous release's redlockd binary (the tag `wave-3`), built once by
/// `scripts/previous-release`. Called outside the scenario's network namespace first: the
/// build may fetch crates the previous release's lock file names.
fn previous_release() -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/previous-release"
    ))
    .stderr(Stdio::inherit())
    .output()
    .expect("scripts/previous-release runs");
    assert!(
        out.status.success(),
        "scripts/previous-release could not build the previous release"
    );
    String::from_utf8(out.stdout)
        .expect("a path")
        .trim()
        .to_owned()
}

/// The names `hand_offs_across` uses, which the workers leave alone: a lock, a lease on
/// two names, an election.
const ACROSS: [&str; 3] = ["roll:a", "+roll:b+roll:c", "@roll:d"];

/// Grants of `ACROSS`'s names that met a holder on the replica at `base`, so far.
async fn contended(http: &reqwest::Client, base: &str) -> u64 {
    let Ok(resp) = http.get(format!("{base}/metrics")).send().await else {
        return 0;
    };
    resp.text()
        .await
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(r#"redlockd_contention_total{lock_class="roll"} "#))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Each way between replicas 0 and 1 (in a rolling deploy, the two releases): a holder on
/// one lets go of each of `ACROSS` while a grant of it waits on the other, which must then
/// be granted within `checker::LIVENESS_BOUND`, as it would be were both replicas one
/// release (a waiter nobody woke would sit until the holder's TTL, past its wait). Says
/// what was not.
async fn hand_offs_across(cluster: &Cluster) -> Vec<String> {
    let http = worker_client();
    let base = |r: usize| {
        cluster.replicas[r]
            .as_ref()
            .expect("both replicas run")
            .base
            .clone()
    };
    let grant_url = |base: &str, name: &str| match group_names(name) {
        Some(_) => format!("{base}/locks"),
        None => format!("{base}/{}", route(name)),
    };
    let mut slow = Vec::new();
    for (from, to) in [(0, 1), (1, 0)] {
        let (holder, waiter) = (base(from), base(to));
        for name in ACROSS {
            let held = http
                .post(grant_url(&holder, name))
                .json(&grant_body(
                    name,
                    json!({"ttl_ms": MAX_TTL.as_millis() as u64, "wait_ms": 2000}),
                ))
                .send()
                .await;
            let Ok(held) = held else {
                slow.push(format!("{name}: replica {from} did not answer a grant"));
                continue;
            };
            let (status, held) = (
                held.status(),
                held.json::<Value>().await.unwrap_or_default(),
            );
            if status != 201 {
                slow.push(format!(
                    "{name}: replica {from} refused a grant of a free name: {status} {held}"
                ));
                continue;
            }
            let before = contended(&http, &waiter).await;
            let waiting = tokio::spawn({
                let (http, url) = (http.clone(), grant_url(&waiter, name));
                let body = grant_body(name, json!({"ttl_ms": 1000, "wait_ms": 2500}));
                async move {
                    let resp = http.post(url).json(&body).send().await.ok()?;
                    Some((
                        resp.status().as_u16(),
                        Instant::now(),
                        resp.json::<Value>().await.ok()?,
                    ))
                }
            });
            // Let go only once the waiter's grant is waiting on its replica.
            wait_for("the grant to wait", Duration::from_secs(5), async || {
                (contended(&http, &waiter).await > before).then_some(())
            })
            .await;
            let lease = held["lease_id"].as_str().unwrap_or_default();
            let revoked = http
                .delete(format!("{holder}/{}/leases/{lease}", route(name)))
                .send()
                .await
                .map(|r| r.status().as_u16());
            let let_go = Instant::now();
            match waiting.await.ok().flatten() {
                Some((201, at, granted)) => {
                    let took = at.saturating_duration_since(let_go);
                    if took > checker::LIVENESS_BOUND {
                        slow.push(format!(
                            "{name}: a grant waiting on replica {to} was served {took:?} after replica {from}'s holder let go"
                        ));
                    }
                    let lease = granted["lease_id"].as_str().unwrap_or_default();
                    let _ = http
                        .delete(format!("{waiter}/{}/leases/{lease}", route(name)))
                        .send()
                        .await;
                }
                other => slow.push(format!(
                    "{name}: a grant waiting on replica {to} was not served after replica {from}'s holder let go (revoke {revoked:?}): {other:?}"
                )),
            }
        }
    }
    slow
}

/// A rolling deploy on the same masters, both ways: from this release back to the
/// previous one (the tag `wave-3`, the last commit before this wave changed what the
/// masters keep) and forward again. Each step stops one replica (SIGTERM as a deploy
/// does, now and then a kill) and starts it on the other release while the workers go on
/// through both; after each, waiting grants are handed across the two releases both ways
/// (`hand_offs_across`). The checker reads the whole history: no overlap, no token out of
/// order, no grant the releases refused that either would have made alone (the hand-offs,
/// every name granted again at the end, and the waiters served once this release runs
/// alone again).
async fn rolling_deploy(seed: u64, _length: Duration) {
    common::init_test_logging();
    eprintln!("fault suite: rolling deploy, seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let previous = previous_release();
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    let (recorder, stop, workers) = start_workers(started, seed * 100, &cluster.bases);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rolled = Vec::new();
    let mut refused = Vec::new();
    for (bin, release) in [(previous.as_str(), "wave-3"), (BIN, "this release")] {
        let first = rng.random_range(0..2);
        for r in [first, 1 - first] {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
            let graceful = rng.random_ratio(3, 4);
            cluster.replace_replica(r, bin, graceful).await;
            let how = if graceful { "SIGTERM" } else { "killed" };
            rolled.push((started.elapsed(), format!("replica {r} on {release}"), how));
            refused.extend(hand_offs_across(&cluster).await);
        }
    }
    let calm_from = calm(&cluster, &recorder, started).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let blocked = every_name_is_granted_again(&cluster).await;
    let history = recorder.events.lock().unwrap().clone();
    let grants = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 201)
        .count();
    eprintln!(
        "fault suite: rolling deploy, seed {seed}: {} operations in {:?}, {grants} grants, {} replicas replaced",
        history.len(),
        started.elapsed(),
        rolled.len()
    );
    for (at, step, how) in &rolled {
        eprintln!("  {at:?}: {step} ({how})");
    }
    let mut violations = checker::check(&history, &cluster.reach.outages);
    violations.extend(refused);
    violations.extend(blocked);
    violations.extend(checker::waiters_are_served(
        &history,
        calm_from,
        checker::LIVENESS_BOUND,
    ));
    keep_if_violated(
        "rolling_deploy",
        seed,
        &history,
        &faults_text(&rolled),
        &violations,
        &cluster.logs(),
    );
    assert!(grants > 50, "too few grants to judge anything");
    let streams = recorder.streams.load(std::sync::atomic::Ordering::Relaxed);
    let resumes = recorder.resumes.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fault suite: {streams} holds through a held stream, across the roll, {resumes} resumed through another replica (after `closed` or a blip)"
    );
    assert!(
        streams > 5,
        "too few held streams to judge them across the roll"
    );
    assert_no_violations("rolling_deploy", seed, &violations, &cluster.logs());
}

#[test]
fn rolling_deploy_seed_1() {
    previous_release();
    if net::enter("rolling_deploy_seed_1") {
        runtime().block_on(rolling_deploy(seed(1), Duration::ZERO));
    }
}

#[test]
fn rolling_deploy_seed_2() {
    previous_release();
    if net::enter("rolling_deploy_seed_2") {
        runtime().block_on(rolling_deploy(seed(2), Duration::ZERO));
    }
}

#[test]
#[ignore = "runs the seeds REDLOCKD_FAULT_SEEDS lists (a minute each); see `seeded!`"]
fn rolling_deploy_many_seeds() {
    previous_release();
    if net::inside() {
        runtime().block_on(rolling_deploy(seed(0), Duration::ZERO));
    } else {
        many_seeds("rolling_deploy_many_seeds");
    }
}

/// The steps the live replicas sent to the masters and the calls that carried them, from
/// their metrics (a replica restarted by a fault counts from its restart).
async fn master_traffic(cluster: &Cluster) -> (u64, u64) {
    let http = common::http();
    let bases: Vec<String> = cluster
        .bases
        .read()
        .unwrap()
        .iter()
        .flatten()
        .cloned()
        .collect();
    let (mut steps, mut calls) = (0, 0);
    for base in bases {
        let Ok(response) = http.get(format!("{base}/metrics")).send().await else {
            continue;
        };
        let text = response.text().await.unwrap_or_default();
        for line in text.lines() {
            let total = |family: &str| {
                line.strip_prefix(family)
                    .filter(|rest| rest.starts_with('{'))
                    .and_then(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            };
            if let Some(n) = total("redlockd_master_steps_total") {
                steps += n as u64;
            } else if let Some(n) = total("redlockd_master_calls_total") {
                calls += n as u64;
            }
        }
    }
    (steps, calls)
}

/// L1 is held on two masters of three; one of them restarts empty; a second grant then
/// finds the other free and the empty one voting. The run keeps the history of both grants
/// and hands it to the checker.
async fn restart_empty_under_a_live_lease(unsafe_switch: bool) -> Vec<String> {
    let started = Instant::now();
    let mut cluster = Cluster::start(started).await;
    if unsafe_switch {
        for r in 0..2 {
            cluster.crash_replica(r);
            cluster
                .start_replica(r, &[("REDLOCKD_UNSAFE_SKIP_QUARANTINE", "true")])
                .await;
        }
    }
    let recorder = Recorder::new(started);
    let http = common::http();
    let bases: Vec<String> = (0..2)
        .map(|r| cluster.replicas[r].as_ref().unwrap().base.clone())
        .collect();
    let base = |r: usize| bases[r].clone();
    // Master 0 is held by a short-lived other lease for a moment: L1 lands on masters 1 and
    // 2 only.
    let key = "redlockd:lock:x";
    let _: i64 = cluster.masters[0]
        .cmd(&[
            "HSET", key, "lease", "other", "token", "0", "ttl", "300", "owner", "",
        ])
        .await
        .unwrap();
    let _: i64 = cluster.masters[0]
        .cmd(&["PEXPIRE", key, "300"])
        .await
        .unwrap();
    let ttl = MAX_TTL;
    let l1_invoked = started.elapsed();
    let (status, l1) = recorder
        .grant(
            &http,
            (0, &base(0)),
            "x",
            json!({"ttl_ms": MAX_TTL.as_millis() as u64}),
            ttl,
        )
        .await;
    assert_eq!(status, 201, "{l1}");
    wait_for(
        "the other lease to expire on master 0",
        Duration::from_secs(2),
        async || {
            let held: i64 = cluster.masters[0].cmd(&["EXISTS", key]).await.ok()?;
            (held == 0).then_some(())
        },
    )
    .await;
    cluster.apply(Fault::KillEmpty(2)).await;
    cluster.heal(Fault::KillEmpty(2)).await;
    // Replica 1 tries for the lock for as long as L1 is valid: safely it is refused
    // throughout (the empty master is quarantined for longer than any TTL); with the
    // switch, the empty master votes again within a probe or two and it gets it.
    let valid_until = l1_invoked + Duration::from_millis(l1["validity_ms"].as_u64().unwrap_or(0));
    let mut second = (0, Value::Null);
    while started.elapsed() < valid_until && second.0 != 201 {
        second = recorder
            .grant(&http, (1, &base(1)), "x", json!({"ttl_ms": 2500}), ttl)
            .await;
        tokio::time::sleep(common::POLL).await;
    }
    eprintln!(
        "last grant while the first was valid: {} {}",
        second.0, second.1
    );
    let history = recorder.events.lock().unwrap().clone();
    checker::check(&history, &cluster.reach.outages)
}

#[test]
fn the_checker_catches_the_double_grant_that_skipping_quarantine_causes() {
    if net::enter("the_checker_catches_the_double_grant_that_skipping_quarantine_causes") {
        runtime().block_on(async {
            let unsafe_run = restart_empty_under_a_live_lease(true).await;
            assert!(
                unsafe_run
                    .iter()
                    .any(|v| v.contains("two leases held at once")),
                "with quarantine skipped the checker must flag a double grant: {unsafe_run:?}"
            );
            let safe_run = restart_empty_under_a_live_lease(false).await;
            assert!(safe_run.is_empty(), "{safe_run:?}");
        });
    }
}

#[test]
fn a_new_deployment_whose_masters_boot_apart_is_ready_within_seconds() {
    if !net::enter("a_new_deployment_whose_masters_boot_apart_is_ready_within_seconds") {
        return;
    }
    runtime().block_on(async {
        let mut masters: Vec<RedisMaster> = (0..MASTERS).map(|_| start_master(false)).collect();
        // Masters 1 and 2 are not up yet when the replicas start.
        masters[1].stop();
        masters[2].stop();
        let logs = tempfile::tempdir().unwrap();
        let a = Replica::start(0, &masters, logs.path(), &[]).await;
        let b = Replica::start(1, &masters, logs.path(), &[]).await;
        let ready = async |r: &Replica| -> Value {
            common::http()
                .get(format!("{}/readyz", r.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        };
        let before = ready(&a).await;
        assert_eq!(before["ready"], false);
        assert!(
            before["problem"]
                .as_str()
                .is_some_and(|p| p.contains("every configured master")),
            "{before}"
        );
        masters[1].start_again();
        // The replicas see the second master before the third boots.
        let address = format!("redis://{}:{}", replica_host(0), masters[1].port);
        wait_for(
            "the second master to be seen",
            Duration::from_secs(5),
            async || {
                let r = ready(&a).await;
                let seen = r["masters"]
                    .as_array()?
                    .iter()
                    .any(|m| m["address"] == address.as_str() && m["up"] == true);
                seen.then_some(())
            },
        )
        .await;
        assert_eq!(
            ready(&a).await["ready"],
            false,
            "two of three unmarked masters are no deployment yet"
        );
        masters[2].start_again();
        let up = Instant::now();
        for r in [&a, &b] {
            wait_for(
                "ready after the last master booted",
                Duration::from_secs(5),
                async || (ready(r).await["ready"] == true).then_some(()),
            )
            .await;
        }
        eprintln!("ready {:?} after the last master booted", up.elapsed());
        // Ready means a majority votes; a master whose connection broke while it was down
        // votes again once a probe has verified it (a few hundred ms). No master of a new
        // deployment is quarantined: every one votes in both replicas well before a
        // quarantine (MAX_TTL) could have ended.
        for r in [&a, &b] {
            wait_for("every master to vote", MAX_TTL / 2, async || {
                let now = ready(r).await;
                now["masters"]
                    .as_array()?
                    .iter()
                    .all(|m| m["voting"] == true)
                    .then_some(())
            })
            .await;
        }
        let after = ready(&a).await;
        assert!(
            after["masters"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["quarantined_until"].is_null()),
            "no master of a new deployment is quarantined: {after}"
        );
        let resp = common::http()
            .post(format!("{}/locks/first", b.base))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let lease: Value = resp.json().await.unwrap();
        assert_eq!(
            status,
            201,
            "{lease}; replica b: {}; its log:\n{}",
            ready(&b).await,
            b.log_tail()
        );
        assert_eq!(lease["fencing_token"], 1, "tokens start at 1");
    });
}

/// Three Redis Clusters of three primaries as the masters, two replicas, the workers of the
/// random scenarios, and faults of single shards: one shard of one cluster restarts empty
/// (its names lose that cluster's vote while it is quarantined, then it is restored), one
/// shard of another restarts from an old snapshot (the replicas that saw its newer tokens
/// catch it), another shard is paused a while. Every fault hits the shard that serves a
/// name the workers use. The history goes to the same checker.
async fn shard_faults(seed: u64) {
    common::init_test_logging();
    eprintln!("fault suite: shard faults, seed {seed} (replay with REDLOCKD_FAULT_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut clusters: Vec<common::RedisCluster> = (0..MASTERS)
        .map(|_| common::RedisCluster::start(3))
        .collect();
    let urls: Vec<String> = clusters.iter().map(common::RedisCluster::url).collect();
    let logs = tempfile::tempdir().unwrap();
    let bases: Bases = Arc::new(RwLock::new(vec![None; REPLICAS]));
    let mut replicas = Vec::new();
    for r in 0..2 {
        let replica = Replica::start_over(r, &urls, logs.path(), &[]).await;
        bases.write().unwrap()[r] = Some(replica.base.clone());
        replicas.push(replica);
    }
    let http = common::http();
    let every_shard_votes = async || {
        let ready: Value = http
            .get(format!("{}/readyz", replicas[0].base))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        ready["masters"]
            .as_array()?
            .iter()
            .all(|m| {
                m["shards"]
                    .as_array()
                    .is_some_and(|s| s.iter().all(|s| s["voting"] == true))
            })
            .then_some(())
    };
    wait_for(
        "every shard to vote",
        Duration::from_secs(30),
        every_shard_votes,
    )
    .await;
    let (recorder, stop, workers) = start_workers(started, seed * 100 + 50, &bases);
    // The shard of each cluster that serves `name`.
    let shard_of = |cluster: &common::RedisCluster, name: &str| {
        cluster.shard_of_slot(redlockd::store::layout::slot_of(&format!(
            "redlockd:lock:{{{name}}}"
        )))
    };
    let quarantine = MAX_TTL + MAX_LOCK_DELAY;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Which names' shards the faults hit, and in which clusters, is the seed's.
    let pick = |rng: &mut StdRng| ["job:a", "job:b", "job:c", "job:d"][rng.random_range(0..4)];
    let empty_at = rng.random_range(0..MASTERS);
    let (rolled_at, paused_at) = ((empty_at + 1) % MASTERS, (empty_at + 2) % MASTERS);
    let rolled = shard_of(&clusters[rolled_at], pick(&mut rng));
    let snapshot = logs.path().join("shard.rdb");
    clusters[rolled_at].shards[rolled].snapshot(&snapshot).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let emptied = shard_of(&clusters[empty_at], pick(&mut rng));
    eprintln!("fault suite: cluster {empty_at} shard {emptied} restarts empty");
    clusters[empty_at].shards[emptied].restart_empty();
    tokio::time::sleep(quarantine + Duration::from_secs(2)).await;

    eprintln!("fault suite: cluster {rolled_at} shard {rolled} restarts from an old snapshot");
    clusters[rolled_at].shards[rolled]
        .restart_from(&snapshot)
        .await;
    tokio::time::sleep(quarantine + Duration::from_secs(2)).await;

    let paused = shard_of(&clusters[paused_at], pick(&mut rng));
    eprintln!("fault suite: cluster {paused_at} shard {paused} pauses");
    clusters[paused_at].shards[paused].pause();
    tokio::time::sleep(Duration::from_millis(rng.random_range(500..2000))).await;
    clusters[paused_at].shards[paused].resume();
    tokio::time::sleep(Duration::from_secs(3)).await;

    stop.store(true, std::sync::atomic::Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let mut violations = every_name_is_granted_again_on(&replicas[0].base, &NAMES).await;
    wait_for(
        "every shard to vote again after the faults",
        quarantine + Duration::from_secs(10),
        every_shard_votes,
    )
    .await;
    let history = recorder.events.lock().unwrap().clone();
    let grants = history
        .iter()
        .filter(|e| e.kind == Kind::Grant && e.status == 201)
        .count();
    let mut counts = std::collections::BTreeMap::new();
    for e in &history {
        *counts
            .entry((format!("{:?}", e.kind), e.status))
            .or_insert(0) += 1;
    }
    let sessions = recorder.sessions.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "fault suite: shard faults: {} operations in {:?}, {sessions} session rounds; outcomes {counts:?}",
        history.len(),
        started.elapsed()
    );
    let logs_text = replicas
        .iter()
        .map(|r| format!("--- {}\n{}", r.log.display(), r.log_tail()))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        grants > 50,
        "too few grants to judge anything:\n{logs_text}"
    );
    let full: String = replicas
        .iter()
        .map(|r| std::fs::read_to_string(&r.log).unwrap_or_default())
        .collect();
    let lost = full
        .matches("a shard of this cluster has lost its data")
        .count();
    let rolled_back = full.matches("a shard went back in time").count();
    eprintln!(
        "fault suite: shard faults: {lost} shard quarantines, {rolled_back} rollbacks caught (a rollback is caught when a replica saw a token the snapshot lacks)"
    );
    assert!(
        lost > 0,
        "the shard restarted empty was never quarantined:\n{logs_text}"
    );
    violations.extend(checker::check(&history, &[]));
    keep_if_violated(
        "shard_faults",
        seed,
        &history,
        "(see the test's output)",
        &violations,
        &logs_text,
    );
    assert_no_violations("shard_faults", seed, &violations, &logs_text);
    for log in replicas.iter().map(|r| r.log_tail()) {
        assert!(!log.contains("panicked"), "a replica panicked:\n{log}");
    }
}

#[test]
fn shard_faults_on_redis_clusters_seed_1() {
    if net::enter("shard_faults_on_redis_clusters_seed_1") {
        runtime().block_on(shard_faults(seed(1)));
    }
}

#[test]
fn shard_faults_on_redis_clusters_seed_2() {
    if net::enter("shard_faults_on_redis_clusters_seed_2") {
        runtime().block_on(shard_faults(seed(2)));
    }
}

/// Every seed `REDLOCKD_FAULT_SEEDS` lists, on Redis Clusters (see `random_faults_many_seeds`).
#[test]
#[ignore = "runs the seeds REDLOCKD_FAULT_SEEDS lists (minutes each); see its doc"]
fn shard_faults_many_seeds() {
    if net::inside() {
        runtime().block_on(shard_faults(seed(0)));
    } else {
        many_seeds("shard_faults_many_seeds");
    }
}
