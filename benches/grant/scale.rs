//! The scale rows (`REDLOCKD_BENCH_ONLY=scale`): how each cost grows as the work does, so
//! that a regression in a growth curve shows up in a run. Held names (grant p99, memory per
//! name, a prefix listing), held streams, sessions, waiters on one name, an expiry storm and
//! replicas over the same masters. Each row starts fresh masters (and a redlockd) of its
//! own, is bounded in time, sends traffic on loopback only, runs the binary with the
//! allocator it ships with, and prints the machine line (`/proc/stat`) of its own span
//! beside its figures. `REDLOCKD_BENCH_SMOKE=1` runs every row at small sizes.

use super::*;

/// How large each row is.
pub(super) struct Scale {
    row: Duration,
    /// How long idle held streams are watched (a whole renew interval at the default TTL).
    idle: Duration,
    /// Held-name levels the grant row runs at, rising (each level adds to the last).
    names: [usize; 3],
    streams: [usize; 2],
    sessions: [usize; 2],
    waiters: [usize; 2],
    storm_leases: usize,
    storm_waiters: usize,
    replicas: [usize; 3],
}

impl Scale {
    pub(super) fn from_env() -> Self {
        if std::env::var_os("REDLOCKD_BENCH_SMOKE").is_some() {
            Self {
                row: Duration::from_millis(300),
                idle: Duration::from_secs(1),
                names: [0, 2_000, 10_000],
                streams: [50, 200],
                sessions: [100, 400],
                waiters: [50, 200],
                storm_leases: 1_000,
                storm_waiters: 50,
                replicas: [1, 2, 4],
            }
        } else {
            Self {
                row: Duration::from_secs(5),
                idle: Duration::from_secs(15),
                names: [0, 100_000, 1_000_000],
                streams: [1_000, 10_000],
                sessions: [10_000, 100_000],
                waiters: [1_000, 10_000],
                storm_leases: 100_000,
                storm_waiters: 1_000,
                replicas: [1, 2, 4],
            }
        }
    }
}

/// Every scale row, in turn; with `REDLOCKD_BENCH_SCALE_ROWS` (say `sessions,storm`: of
/// `names`, `streams`, `sessions`, `waiters`, `storm`, `replicas`), those alone.
pub(super) async fn scale(scale: &Scale) {
    let chosen = std::env::var("REDLOCKD_BENCH_SCALE_ROWS").unwrap_or_default();
    let runs = |row: &str| chosen.is_empty() || chosen.split(',').any(|r| r.trim() == row);
    if runs("names") {
        held_names(scale).await;
    }
    if runs("streams") {
        streams_only(scale).await;
    }
    if runs("sessions") {
        for n in scale.sessions {
            sessions(n, scale.row).await;
        }
    }
    if runs("waiters") {
        for n in scale.waiters {
            waiters(n).await;
        }
    }
    if runs("storm") {
        storm(scale.storm_leases, scale.storm_waiters).await;
    }
    if runs("replicas") {
        replicas(&scale.replicas, scale.row).await;
    }
}

/// The held-streams rows alone (`REDLOCKD_BENCH_ONLY=streams`).
pub(super) async fn streams_only(scale: &Scale) {
    for n in scale.streams {
        streams(n, scale.idle).await;
    }
}

/// Prints how the machine spent a row's span, under the row's figures.
fn machine_line(since: MachineTicks) {
    println!("  ({})", since.since(MachineTicks::now()));
}

/// Redis's own memory (`INFO memory`'s `used_memory`) of a master, in bytes.
async fn used_memory(m: &RedisMaster) -> u64 {
    let info: String = m.cmd(&["INFO", "memory"]).await.expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok())
        .unwrap_or(0)
}

/// Three fresh masters, marked as a redlockd would mark them (every script refuses to act
/// on a master without its marker).
async fn fresh_masters() -> Vec<RedisMaster> {
    let masters = start_masters(3);
    let redlock = engine(&masters);
    let nodes = redlock.nodes().to_vec();
    redlock.monitor().probe_round(&nodes).await;
    masters
}

fn per_each(total: Duration, n: usize) -> f64 {
    total.as_secs_f64() * 1e6 / n.max(1) as f64
}

/// Grant p99 (16 uncontended clients through redlockd) with 0, 10⁵ and 10⁶ other names held,
/// Redis memory per held name, and a 100-name prefix listing, in one run over the same
/// masters. The held names are set up through the project's scripts directly, 256 at a time
/// over each master's one connection (pipelined), within a bound.
async fn held_names(scale: &Scale) {
    println!("### Held names\n");
    let masters = fresh_masters().await;
    let limit = Limit::new(&masters);
    let server = Arc::new(Server::start(&masters).await);
    let (service, redis) = ([server.pid()], pids(&masters));
    let at = Setup {
        length: scale.row,
        service: &service,
        masters: &redis,
    };
    let empty = used_memory(&masters[0]).await;
    let mut held = 0;
    let mut lines = Vec::new();
    let mut p99_none = None;
    print_header();
    for n in scale.names {
        let machine = MachineTicks::now();
        let started = Instant::now();
        let l = limit.clone();
        let from = held;
        let refused = spread_over(256, n - from, move |w, i| {
            let limit = l.clone();
            async move {
                let key = LockKey::mutex(format!("held:{:07}", from + i));
                limit.acquire(&key, &lease_id(w, from + i), 3_600_000).await
            }
        })
        .await;
        let set_up = started.elapsed();
        held = n;
        let s = server.clone();
        let row = measure(
            "redlockd",
            format!("uncontended, 16 clients, {n} names held"),
            16,
            &at,
            None,
            move |i| http_cycle(s.clone(), i, 0),
        )
        .await;
        let p99 = pct(&row.tally.grants, 0.99);
        let none = *p99_none.get_or_insert(p99);
        let (listing, listed) = listing(&server, "held:00012").await;
        let memory = used_memory(&masters[0]).await.saturating_sub(empty);
        lines.push(format!(
            "- {n} names held (set up in {:.1} s, {refused} refused): grant p99 {:.2} ms, \
             {:.2}× the p99 with none held; Redis {} bytes per held name per master; \
             listing a prefix of {listed} names {:.2} ms (median of 20); redlockd resident \
             {:.1} MiB\n  ({})",
            set_up.as_secs_f64(),
            ms(p99),
            p99.as_secs_f64() / none.as_secs_f64().max(f64::MIN_POSITIVE),
            match n {
                0 => "—".to_owned(),
                n => format!("{:.0}", memory as f64 / n as f64),
            },
            ms(listing),
            rss_of(server.pid()) as f64 / f64::from(1 << 20),
            machine.since(MachineTicks::now()),
        ));
    }
    println!();
    for line in lines {
        println!("{line}");
    }
    println!();
}

/// The median of 20 listings of `prefix` (`GET /locks?prefix=…&limit=100`), and how many
/// names the listing answered.
async fn listing(server: &Server, prefix: &str) -> (Duration, usize) {
    let mut took = Vec::new();
    let mut listed = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let Ok(resp) = server
            .http
            .get(format!("{}/locks?prefix={prefix}&limit=100", server.base))
            .send()
            .await
        else {
            continue;
        };
        let Ok(body) = resp.json::<Value>().await else {
            continue;
        };
        took.push(t.elapsed());
        listed = body["locks"].as_array().map_or(0, Vec::len);
    }
    took.sort_unstable();
    (pct(&took, 0.5), listed)
}

/// What a set of held streams told: how many were granted, how many heartbeats (one a
/// renew) came, and the first refusal seen.
#[derive(Default)]
struct Told {
    granted: AtomicUsize,
    heartbeats: AtomicUsize,
    refused: std::sync::Mutex<Option<String>>,
}

impl Told {
    fn refused(&self, why: String) {
        self.refused.lock().expect("refused").get_or_insert(why);
    }
}

/// Open `count` held streams at `path(i)` on `server`, the `i`th no sooner than
/// `spread · i / count` from the start and at most 256 being granted at once (a fleet's
/// holders do not all start in the same millisecond; 10 000 grants at once meet the
/// masters' timeout), and wait (at most 2 minutes past the spread) for each to be granted
/// or refused: the streams' tasks, what they told and how long it took.
async fn open_streams(
    server: &Arc<Server>,
    count: usize,
    spread: Duration,
    path: impl Fn(usize) -> String,
) -> (Vec<tokio::task::JoinHandle<()>>, Arc<Told>, Duration) {
    let told = Arc::new(Told::default());
    let opening = Arc::new(tokio::sync::Semaphore::new(256));
    let mut holders = Vec::with_capacity(count);
    let start = Instant::now();
    for i in 0..count {
        let (server, told, url) = (server.clone(), told.clone(), path(i));
        let opening = opening.clone();
        let at = start + spread.mul_f64(i as f64 / count.max(1) as f64);
        holders.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let mut permit = Some(opening.acquire_owned().await.expect("open"));
            let mut resp = match server
                .http
                .post(format!("{}{url}", server.base))
                .header("accept", "text/event-stream")
                .timeout(Duration::from_secs(3600))
                .send()
                .await
            {
                Ok(resp) if resp.status() == 200 => resp,
                Ok(resp) => return told.refused(format!("{}", resp.status())),
                Err(e) => return told.refused(e.to_string()),
            };
            let mut granted = false;
            while let Ok(Some(chunk)) = resp.chunk().await {
                let text = String::from_utf8_lossy(&chunk);
                if !granted && text.contains("event: granted") {
                    granted = true;
                    told.granted.fetch_add(1, Ordering::Relaxed);
                    permit = None;
                }
                let beats = text.matches("event: heartbeat").count();
                told.heartbeats.fetch_add(beats, Ordering::Relaxed);
                if let Some(at) = text.find("event: failed") {
                    told.refused(text[at..].lines().take(2).collect::<Vec<_>>().join(" "));
                }
            }
            drop(permit);
        }));
    }
    let started = Instant::now();
    while told.granted.load(Ordering::Relaxed) < count
        && started.elapsed() < spread + Duration::from_secs(120)
        && !holders.iter().all(|h| h.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (holders, told, started.elapsed())
}

/// `count` leases held by streams on one replica at the default TTL (renewed by the
/// replica at a third of it), opened evenly over one renew interval (or `idle`, if
/// shorter) as a fleet's holders arrive (opened all at once, their renews would fall together and flatter the figure):
/// the replica's memory per stream, and over `idle` the share of a core the idle streams
/// cost the replica and the masters, the CPU per renew on each, and how many steps each
/// script call to a master carried. Then the floor: as many idle event streams held open by
/// the bare axum router, which does nothing behind them.
async fn streams(count: usize, idle: Duration) {
    let machine = MachineTicks::now();
    let masters = fresh_masters().await;
    let room = format!("REDLOCKD_MAX_CONNECTIONS={}", count + 1_000);
    let server = Arc::new(Server::start_with(&masters, &room).await);
    let before = rss_of(server.pid());
    let (holders, told, opened) = open_streams(&server, count, idle.min(STREAM_RENEW), |i| {
        format!("/locks/streamed:{i:05}/hold")
    })
    .await;
    let held = told.granted.load(Ordering::Relaxed);
    if let Some(why) = told.refused.lock().expect("refused").as_deref() {
        println!("  (a stream was refused: {why})");
    }
    let rss = rss_of(server.pid());
    let window = idle;
    let (ours, theirs) = (
        CpuMeter::start(&[server.pid()]),
        CpuMeter::start(&pids(&masters)),
    );
    let beats = told.heartbeats.load(Ordering::Relaxed);
    let traffic = master_traffic(&server).await;
    tokio::time::sleep(window).await;
    let renews = told.heartbeats.load(Ordering::Relaxed) - beats;
    let (ours, theirs) = (ours.used(), theirs.used());
    let (steps, calls) = master_traffic(&server).await;
    let per_call = (steps - traffic.0) as f64 / (calls - traffic.1).max(1) as f64;
    for h in holders {
        h.abort();
    }
    drop(server);
    let bare = Arc::new(Server::start_bare().await);
    let bare_before = rss_of(bare.pid());
    let (holders, bare_told, _) = open_streams(&bare, count, Duration::ZERO, |i| {
        format!("/streams/s{i:05}")
    })
    .await;
    let bare_held = bare_told.granted.load(Ordering::Relaxed);
    let bare_rss = rss_of(bare.pid());
    for h in holders {
        h.abort();
    }
    let per =
        |after: u64, before: u64, n: usize| after.saturating_sub(before) as f64 / n.max(1) as f64;
    println!(
        "- {held} of {count} leases held by streams on one replica (opened in {:.1} s; default \
         TTL, renewed at a third of it): redlockd memory {:.0} bytes ({:.1} KiB) per stream, \
         bare axum holding {bare_held} idle event streams {:.1} KiB per stream; idle over \
         {:.0} s, {:.1} % of a core on the replica, {:.1} % on the masters; {renews} renews, \
         CPU per renew {:.0} µs redlockd, {:.0} µs the masters, {per_call:.1} steps a script \
         call: held for good, a renew of each every 10 s costs {:.1} % of a core on the replica",
        opened.as_secs_f64(),
        per(rss, before, count),
        per(rss, before, count) / 1024.0,
        per(bare_rss, bare_before, count) / 1024.0,
        window.as_secs_f64(),
        100.0 * ours.as_secs_f64() / window.as_secs_f64(),
        100.0 * theirs.as_secs_f64() / window.as_secs_f64(),
        per_each(ours, renews),
        per_each(theirs, renews),
        100.0 * per_each(ours, renews) * 1e-6 * held as f64 / STREAM_RENEW.as_secs_f64(),
    );
    machine_line(machine);
}

/// The steps this replica has sent its masters and the script calls that carried them,
/// summed over the masters (`redlockd_master_steps_total`, `redlockd_master_calls_total`).
async fn master_traffic(server: &Server) -> (u64, u64) {
    let Ok(resp) = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await
    else {
        return (0, 0);
    };
    let text = resp.text().await.unwrap_or_default();
    let sum = |series: &str| {
        text.lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    (
        sum("redlockd_master_steps_total{"),
        sum("redlockd_master_calls_total{"),
    )
}

/// How often a held stream at the default TTL (30 s) is renewed: at a third of it.
const STREAM_RENEW: Duration = Duration::from_secs(10);

/// Run `work(k)` at `rate` a second for `length`, at most 128 at once: how many ran and how
/// many failed. A paced load, so that a cost per call is read below saturation.
async fn paced<F, Fut>(rate: f64, length: Duration, work: F) -> (usize, usize)
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let room = Arc::new(tokio::sync::Semaphore::new(128));
    let failed = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let mut k = 0;
    loop {
        let at = start + Duration::from_secs_f64(k as f64 / rate);
        if at > start + length {
            break;
        }
        tokio::time::sleep_until(at).await;
        let permit = room.clone().acquire_owned().await.expect("open");
        let (call, failed) = (work(k), failed.clone());
        tokio::spawn(async move {
            if !call.await {
                failed.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
        k += 1;
    }
    let _ = room.acquire_many(128).await;
    (k, failed.load(Ordering::Relaxed))
}

/// `count` sessions with 1 to 10 holds each, then 10 000 plain leases (at most as many as
/// sessions), renewed at 500 a second each in turn (below what one replica serves; the
/// rate 100 000 sessions renewed at a third of a 10-minute TTL need): the CPU per renew of
/// each, on the replica and on the masters. The TTL, 15 minutes, outlasts the set-up (about
/// 6 minutes for 100 000 sessions and their 550 000 holds, at 1 900 requests a second here).
async fn sessions(count: usize, row: Duration) {
    const SESSION_TTL_MS: u64 = 900_000;
    let machine = MachineTicks::now();
    let masters = fresh_masters().await;
    let server = Arc::new(Server::start(&masters).await);
    let redis = pids(&masters);
    let opened = Arc::new(std::sync::Mutex::new(vec![String::new(); count]));
    let started = Instant::now();
    let (s, o) = (server.clone(), opened.clone());
    let failed = spread_over(64, count, move |_, i| {
        let (server, opened) = (s.clone(), o.clone());
        async move {
            let Ok(resp) = server
                .http
                .post(format!("{}/sessions", server.base))
                .json(&json!({"ttl_ms": SESSION_TTL_MS}))
                .send()
                .await
            else {
                return false;
            };
            let Ok(body) = resp.json::<Value>().await else {
                return false;
            };
            let Some(id) = body["session_id"].as_str() else {
                return false;
            };
            for j in 0..=(i % 10) {
                let name = format!("sess:{i:06}:{j}");
                if server.grant(&name, json!({"session": id})).await.is_err() {
                    return false;
                }
            }
            opened.lock().expect("sessions")[i] = id.to_owned();
            true
        }
    })
    .await;
    let holds: usize = (0..count).map(|i| i % 10 + 1).sum();
    let set_up = started.elapsed();
    let memory = used_memory(&masters[0]).await;
    let leases = Arc::new(std::sync::Mutex::new(Vec::new()));
    let plain = count.min(10_000);
    let (s, l) = (server.clone(), leases.clone());
    spread_over(64, plain, move |_, i| {
        let (server, leases) = (s.clone(), l.clone());
        async move {
            let name = format!("plain:{i:06}");
            let Ok((id, _)) = server.grant(&name, json!({"ttl_ms": SESSION_TTL_MS})).await else {
                return false;
            };
            leases.lock().expect("leases").push((name, id));
            true
        }
    })
    .await;
    let rate = 500.0;
    let window = row.max(Duration::from_secs(2));
    let cost = async |session: bool| {
        let (ours, theirs) = (CpuMeter::start(&[server.pid()]), CpuMeter::start(&redis));
        let (s, o, l) = (server.clone(), opened.clone(), leases.clone());
        let (sent, failed) = paced(rate, window, move |k| {
            let server = s.clone();
            let target = match session {
                true => {
                    let o = o.lock().expect("sessions");
                    (String::new(), o[k % o.len()].clone())
                }
                false => {
                    let l = l.lock().expect("leases");
                    l[k % l.len().max(1)].clone()
                }
            };
            async move {
                match session {
                    true => {
                        let sent = server
                            .http
                            .put(format!("{}/sessions/{}", server.base, target.1))
                            .send()
                            .await;
                        expect_status("session renew", sent, 200).await
                    }
                    false => server.renew(&target.0, &target.1).await,
                }
            }
        })
        .await;
        (
            per_each(ours.used(), sent),
            per_each(theirs.used(), sent),
            failed,
        )
    };
    let (session_ours, session_theirs, session_failed) = cost(true).await;
    let (lease_ours, lease_theirs, lease_failed) = cost(false).await;
    println!(
        "- {count} sessions with {holds} holds (1 to 10 each; opened in {:.1} s, {failed} \
         failed; Redis {:.0} bytes per session per master, its holds included): renewed at \
         {rate:.0}/s for {:.0} s, CPU per session renew {session_ours:.0} µs redlockd, \
         {session_theirs:.0} µs the masters ({session_failed} failed); a plain lease's renew \
         at the same pace {lease_ours:.0} µs / {lease_theirs:.0} µs ({lease_failed} failed): \
         a session renew costs the masters {:.2}× a lease's",
        set_up.as_secs_f64(),
        memory as f64 / count.max(1) as f64,
        window.as_secs_f64(),
        session_theirs / lease_theirs.max(f64::MIN_POSITIVE),
    );
    machine_line(machine);
}

/// What one waiter's held stream told: when it was queued, and its lease once granted.
#[derive(Default)]
struct Waited {
    queued: AtomicUsize,
    granted: std::sync::Mutex<Vec<Instant>>,
}

/// Wait on `name` through a held stream (`wait_ms` `wait_ms`): counted in `waited` when
/// queued, and when granted (the time kept), then revoked at once.
async fn wait_on(server: Arc<Server>, name: String, wait_ms: u64, waited: Arc<Waited>) {
    let Ok(mut resp) = server
        .http
        .post(format!(
            "{}/locks/{name}/hold?ttl_ms=60000&wait_ms={wait_ms}",
            server.base
        ))
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(3600))
        .send()
        .await
    else {
        return;
    };
    if resp.status() != 200 {
        static SHOWN: AtomicUsize = AtomicUsize::new(0);
        if SHOWN.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!("bench: a waiter's stream answered {}", resp.status());
        }
        return;
    }
    let mut text = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if text.contains("event: queued") && !text.contains("event: granted") {
            waited.queued.fetch_add(1, Ordering::Relaxed);
            text.clear();
        }
        if let Some(at) = text.find("event: granted") {
            let got = Instant::now();
            waited.granted.lock().expect("granted").push(got);
            let data = text[at..]
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .and_then(|d| serde_json::from_str::<Value>(d).ok());
            if let Some(id) = data.as_ref().and_then(|d| d["lease_id"].as_str()) {
                server.revoke(&name, id).await;
            }
            return;
        }
    }
}

/// `count` grants waiting on one name (held streams, the waiter caps raised for the row),
/// served one after another as each revokes: the time to serve them all, hand-offs a
/// second, and the CPU per hand-off on the replica and the masters.
async fn waiters(count: usize) {
    let machine = MachineTicks::now();
    let masters = fresh_masters().await;
    let room = count + 1_000;
    let server = Arc::new(
        Server::start_with(
            &masters,
            &format!(
                "REDLOCKD_MAX_WAITERS_PER_NAME={room} REDLOCKD_MAX_WAITERS={room} \
                 REDLOCKD_MAX_STREAMS={room} REDLOCKD_MAX_CONNECTIONS={room} \
                 REDLOCKD_MAX_WAIT_MS=600000"
            ),
        )
        .await,
    );
    let name = format!("line-{count}");
    let Ok((holder, _)) = server.grant(&name, json!({"ttl_ms": 600000})).await else {
        println!("- {count} waiters on one name: the first holder was refused");
        return;
    };
    let waited = Arc::new(Waited::default());
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            tokio::spawn(wait_on(
                server.clone(),
                name.clone(),
                600_000,
                waited.clone(),
            ))
        })
        .collect();
    let started = Instant::now();
    // Until every waiter is queued, or gone (a refusal ends its task).
    while waited.queued.load(Ordering::Relaxed) < count
        && started.elapsed() < Duration::from_secs(120)
        && !tasks.iter().all(|t| t.is_finished())
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = waited.queued.load(Ordering::Relaxed);
    let rss = rss_of(server.pid());
    let (ours, theirs) = (
        CpuMeter::start(&[server.pid()]),
        CpuMeter::start(&pids(&masters)),
    );
    let released = Instant::now();
    server.revoke(&name, &holder).await;
    let served = || waited.granted.lock().expect("granted").len();
    while served() < queued && released.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = released.elapsed();
    let n = served();
    let (ours, theirs) = (ours.used(), theirs.used());
    for t in tasks {
        t.abort();
    }
    println!(
        "- {count} waiters on one name ({queued} queued in {:.1} s; redlockd resident {:.0} MiB): \
         {n} served in {:.2} s, {:.0} hand-offs a second; CPU per hand-off {:.0} µs redlockd, \
         {:.0} µs the masters",
        started.elapsed().as_secs_f64() - took.as_secs_f64(),
        rss as f64 / f64::from(1 << 20),
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        per_each(ours, n),
        per_each(theirs, n),
    );
    machine_line(machine);
}

/// An expiry storm: `leases` leases granted through redlockd, each with the TTL that ends
/// it at one instant, and a waiter on each of `waiting` of them: from that instant (when
/// the keys expire on every master) to each waiter's grant.
async fn storm(leases: usize, waiting: usize) {
    let machine = MachineTicks::now();
    let masters = fresh_masters().await;
    let room = waiting + 1_000;
    let server = Arc::new(
        Server::start_with(
            &masters,
            &format!("REDLOCKD_MAX_STREAMS={room} REDLOCKD_MAX_CONNECTIONS={room}"),
        )
        .await,
    );
    // Room enough to grant them all at a few thousand a second, and for the waiters to queue.
    let setup = Duration::from_millis(3_000 + leases as u64 / 2);
    let end = Instant::now() + setup;
    let late = Arc::new(AtomicUsize::new(0));
    let (s, l) = (server.clone(), late.clone());
    let refused = spread_over(64, leases, move |_, i| {
        let (server, late) = (s.clone(), l.clone());
        async move {
            let left = end.saturating_duration_since(Instant::now());
            if left < Duration::from_millis(1_500) {
                late.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            let name = format!("storm:{i:06}");
            let ttl = left.as_millis() as u64;
            server.grant(&name, json!({"ttl_ms": ttl})).await.is_ok()
        }
    })
    .await;
    let granted_by = end.saturating_duration_since(Instant::now());
    let waited = Arc::new(Waited::default());
    let step = (leases / waiting.max(1)).max(1);
    let tasks: Vec<_> = (0..waiting)
        .map(|k| {
            let name = format!("storm:{:06}", k * step);
            tokio::spawn(wait_on(server.clone(), name, 60_000, waited.clone()))
        })
        .collect();
    while waited.queued.load(Ordering::Relaxed) < waiting && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queued = waited.queued.load(Ordering::Relaxed);
    let deadline = end + Duration::from_secs(30);
    while waited.granted.lock().expect("granted").len() < queued && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut delays: Vec<Duration> = waited
        .granted
        .lock()
        .expect("granted")
        .iter()
        .map(|at| at.saturating_duration_since(end))
        .collect();
    delays.sort_unstable();
    for t in tasks {
        t.abort();
    }
    // The control: as many grants sent at one instant to names nobody holds. What a burst
    // of that many grants costs this replica with no storm at all.
    let start = Arc::new(tokio::sync::Barrier::new(waiting));
    let burst: Vec<_> = (0..waiting)
        .map(|k| {
            let (server, start) = (server.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let t = Instant::now();
                let name = format!("free:{k:06}");
                server.grant(&name, json!({"ttl_ms": 60000})).await.ok()?;
                Some(t.elapsed())
            })
        })
        .collect();
    let mut control = Vec::new();
    for b in burst {
        if let Ok(Some(took)) = b.await {
            control.push(took);
        }
    }
    control.sort_unstable();
    println!(
        "- an expiry storm: {leases} leases ending at one instant ({refused} refused, {} too \
         late to set up; all granted {:.1} s before it), {queued} of {waiting} waiters queued \
         on them: {} granted, from the keys' expiry to the grant p50 {:.1} ms, p99 {:.1} ms, \
         longest {:.1} ms; the control, {} grants sent at one instant to free names: p50 \
         {:.1} ms, p99 {:.1} ms",
        late.load(Ordering::Relaxed),
        granted_by.as_secs_f64(),
        delays.len(),
        ms(pct(&delays, 0.5)),
        ms(pct(&delays, 0.99)),
        ms(delays.last().copied().unwrap_or_default()),
        control.len(),
        ms(pct(&control, 0.5)),
        ms(pct(&control, 0.99)),
    );
    machine_line(machine);
}

/// 1, 2 and 4 replicas over the same masters, 16 clients spread over them contending for
/// one name: what one release costs each replica and the masters (announced once, woken
/// where its waiters are), and the hand-off.
async fn replicas(counts: &[usize], row: Duration) {
    let machine = MachineTicks::now();
    let masters = fresh_masters().await;
    let redis = pids(&masters);
    print_header();
    let mut lines = Vec::new();
    for &r in counts {
        let mut servers = Vec::new();
        for _ in 0..r {
            servers.push(Arc::new(Server::start(&masters).await));
        }
        let replica_pids: Vec<u32> = servers.iter().map(|s| s.pid()).collect();
        let each: Vec<CpuMeter> = replica_pids
            .iter()
            .map(|p| CpuMeter::start(&[*p]))
            .collect();
        let at = Setup {
            length: row,
            service: &replica_pids,
            masters: &redis,
        };
        let last = Arc::new(Mutex::new(LastRelease::default()));
        let servers = Arc::new(servers);
        let name_of = Arc::new(format!("hot-{r}"));
        let s = servers.clone();
        let mut measured = measure(
            "redlockd",
            format!("one name, 16 waiting clients over {r} replicas"),
            16,
            &at,
            None,
            move |c| {
                let (server, last) = (s[c % s.len()].clone(), last.clone());
                let name = name_of.clone();
                async move { contended_on(server, &name, &last, c).await }
            },
        )
        .await;
        measured.tally.handoffs.sort_unstable();
        let releases = measured.tally.cycles.max(1);
        let per_replica: Vec<String> = each
            .iter()
            .map(|m| format!("{:.0}", per_each(m.used(), releases)))
            .collect();
        lines.push(format!(
            "- {r} replica(s): CPU per release {} µs on each replica, {:.0} µs on the masters; \
             hand-off p99 {:.2} ms",
            per_replica.join(" / "),
            per_each(measured.masters_cpu, releases),
            ms(pct(&measured.tally.handoffs, 0.99)),
        ));
    }
    println!();
    for line in lines {
        println!("{line}");
    }
    machine_line(machine);
}
