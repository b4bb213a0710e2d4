//! The side-by-side benchmark: in one run, on one machine, with one load generator, the
//! raw-Redis limit, the engine alone and redlockd over HTTP, and the ratios between them.
//!
//! `cargo bench --bench grant` (or `scripts/bench`) starts three redis-server masters on
//! free loopback ports and the redlockd binary as a process of its own, then runs each row
//! for a fixed time:
//!
//! - **plain Redlock**: what a team writes by hand: `SET key lease NX PX ttl` on every master
//!   at once through one multiplexed connection per master, a majority required, then the
//!   compare-and-delete script everywhere. No fencing token, no marker, no index: the floor
//!   every other row is divided by (`× plain`).
//! - **scripts**: the project's own Lua scripts called from Rust through one multiplexed
//!   connection per master (`RedisNode`), every master at once, a majority required; no
//!   health checks, no backlog, no HTTP. What the scripts cost over plain Redlock.
//! - **engine**: the Redlock engine in this process, without HTTP.
//! - **http**: redlockd over HTTP/1.1 keep-alive.
//! - **redlockd, embedded store**: the same requests to a redlockd with no masters, and
//!   **bare axum, canned answers**: this binary run again as an axum router with no
//!   middleware and no lease service (`REDLOCKD_BENCH_BARE`), answering the same requests
//!   with answers of the same shape: the least an HTTP/1.1 service costs on these cores
//!   beside this load generator, the ceiling the embedded store is read against.
//! - **plain Redlock behind bare axum**, and **fenced Redlock behind bare axum**: that bare
//!   router with plain Redlock's calls behind its grant and revoke (the fenced one adds a
//!   marker and a fencing counter, as one script a master): the least any Redlock service
//!   behind HTTP costs here, the floor redlockd's own row is read against.
//!
//! The look inside one master (`inside`) also runs a batch of the least steps a fenced
//! Redlock needs (marker, `SET NX PX`, a fencing counter; compare-and-delete): the floor
//! under any data layout of the project's, sent as its steps are.
//!
//! Workloads: uncontended grant → release cycles at 1, 16 and 64 clients (each its own
//! name); 16 clients on one name waiting for it (hand-off time, re-grants to the previous
//! holder, timeouts); 16 clients on two replicas contending for each kind (a lock, two
//! names in opposite orders, two names against single names, shared against exclusive,
//! permits with limit 1 and 4, campaigns: hand-off, longest wait, timeouts, grants served
//! while an earlier arrival still waited); renew-heavy (each grant renewed ten times); keep-alive (ten holds per
//! client kept alive by ten lease renews, or by one renew of their session). CPU comes from `/proc`
//! (redlockd's process and the masters', separately). Then scale: 5 and 7 masters, 10⁵
//! leases held through redlockd (its memory per lease), and the scale rows (`scale.rs`:
//! held names, held streams, sessions, waiters on one name, an expiry storm, replicas).
//! Figures are printed, never asserted: the cores are shared and noisy.
//!
//! The peer, **etcd 3.4's lock API** on three members (`etcd.rs`), runs in the uncontended
//! and contended tables beside plain Redlock and the floors.
//!
//! `REDLOCKD_BENCH_SMOKE=1` runs every row for a moment at small sizes: the test command
//! runs it that way (in the test profile) so that the benchmark keeps working.
//! `REDLOCKD_BENCH_ONLY=uncontended` (or `contended`: the waiting and renew-heavy rows,
//! the hand-off of every kind across two replicas and issue 33's loop; `scale`: the scale
//! rows, `REDLOCKD_BENCH_SCALE_ROWS=names,streams,...` some of them; `streams`: the
//! held-streams rows of those alone; `kinds`: the
//! hand-off rows alone; `opposite`: that loop alone, 20 runs; `clusters`: three Redis Clusters of three shards next to three single
//! masters; `inside`: the look inside one master alone, which full and uncontended runs also
//! print: a cycle's µs inside Redis sent each way, step scripts alone, batched, as a Redis
//! function, and with steps that do nothing)
//! runs only those rows, for quick comparisons while optimising; `REDLOCKD_BENCH_SERVER_ENV="K=V ..."` sets
//! variables for the redlockd process only (e.g. `RUST_LOG=warn`); and
//! `REDLOCKD_BENCH_AB="K=V ..."` compares redlockd with and without them, row against row
//! in one run, in four rounds with each side first in two, each round after a plain Redlock
//! row that its ratios are read against, then each side's means (with
//! `REDLOCKD_BENCH_AB_BIN=<path>`, B is another redlockd binary: a build of an earlier
//! commit, so that a change is measured against what came before; `""` compares the
//! binaries alone; `REDLOCKD_BENCH_AB_CLIENTS=N` runs its rows with N clients rather than
//! 16).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "grant/etcd.rs"]
mod etcd;
#[path = "grant/scale.rs"]
mod scale;

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::RedisMaster;
use futures::future::join_all;
use redlockd::metrics::Metrics;
use redlockd::model::{LeaseId, LockKey};
use redlockd::redlock::{EngineConfig, Redlock};
use redlockd::store::node::{Acquired, Claim, Ending, LockNode, Owned, Renewal};
use redlockd::store::redis::RedisNode;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");
const TIMEOUT: Duration = Duration::from_millis(500);

/// How long and how large: a full run, or a smoke run that only proves every row works.
#[derive(Clone, Copy)]
struct Plan {
    row: Duration,
    names_held_http: usize,
    /// Runs of issue 33's loop (two names in opposite orders on two replicas).
    runs: usize,
    /// SETs of the calibration before the rows.
    calibration: usize,
    /// Cycles a round and rounds of the look inside one master.
    inside_cycles: usize,
    inside_rounds: usize,
}

impl Plan {
    fn from_env() -> Self {
        if std::env::var_os("REDLOCKD_BENCH_SMOKE").is_some() {
            Self {
                row: Duration::from_millis(300),
                names_held_http: 500,
                runs: 1,
                calibration: 200,
                inside_cycles: 64,
                inside_rounds: 1,
            }
        } else {
            Self {
                row: Duration::from_secs(5),
                names_held_http: 100_000,
                runs: 20,
                calibration: 20_000,
                inside_cycles: 4_000,
                inside_rounds: 9,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// CPU and memory from /proc

/// User + system CPU time of a process, from `/proc/<pid>/stat` (in clock ticks of 10 ms:
/// USER_HZ is 100 on Linux).
fn cpu_of(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name may hold spaces; the fields after it do not.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name and state.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Context switches of a process's threads so far, voluntary and not, from
/// `/proc/<pid>/task/*/status`: a thread that parks for want of work, or is preempted.
/// Per cycle, they count the hand-offs between tasks on different threads that a request
/// costs (issue 38: "fewer wake-ups per grant"). Threads that ended during a row are not
/// counted.
fn switches_of(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// The machine's CPU time by state, from the `cpu` line of `/proc/stat` (in ticks): what a
/// run's figures are read against, since a busy or virtualised host (steal: time the
/// hypervisor gave another guest) slows every row at once.
#[derive(Debug, Clone, Copy, Default)]
struct MachineTicks {
    busy: u64,
    idle: u64,
    iowait: u64,
    steal: u64,
}

impl MachineTicks {
    fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
            return Self::default();
        };
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Self {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            idle: at(3),
            iowait: at(4),
            steal: at(7),
        }
    }

    /// The share of each state between `self` (earlier) and `later`, as a line to print.
    fn since(self, later: Self) -> String {
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64;
        let (busy, idle, iowait, steal) = (
            d(self.busy, later.busy),
            d(self.idle, later.idle),
            d(self.iowait, later.iowait),
            d(self.steal, later.steal),
        );
        let total = (busy + idle + iowait + steal).max(1.0);
        format!(
            "machine during the run (`/proc/stat`, all cores): busy {:.0} %, idle {:.0} %, \
             iowait {:.1} %, steal {:.1} %",
            100.0 * busy / total,
            100.0 * idle / total,
            100.0 * iowait / total,
            100.0 * steal / total
        )
    }
}

/// Prints how the machine spent the run when the run ends, whichever rows it ran.
struct Run {
    machine: MachineTicks,
}

impl Drop for Run {
    fn drop(&mut self) {
        println!("\n{}", self.machine.since(MachineTicks::now()));
    }
}

/// How fast this machine runs Redis itself, before any row: `n` SETs one after another on
/// one master, the round trip each took from here and the µs Redis spent inside each
/// (`INFO commandstats`). With plain Redlock's row, what tells a slow machine from a slow
/// change.
async fn calibration(master: &RedisMaster, n: usize) -> String {
    let _: redis::RedisResult<()> = master.cmd(&["CONFIG", "RESETSTAT"]).await;
    let Ok(mut conn) = master.client().get_multiplexed_async_connection().await else {
        return "calibration: cannot reach a master".into();
    };
    let started = Instant::now();
    for i in 0..n {
        let _: redis::RedisResult<()> = redis::cmd("SET")
            .arg("bench:calibration")
            .arg(i)
            .query_async(&mut conn)
            .await;
    }
    let round_trip = started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64;
    let info: String = master
        .cmd(&["INFO", "commandstats"])
        .await
        .unwrap_or_default();
    let inside = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_set:"))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("usec_per_call="))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(f64::NAN);
    let _: redis::RedisResult<()> = master.cmd(&["DEL", "bench:calibration"]).await;
    let _: redis::RedisResult<()> = master.cmd(&["CONFIG", "RESETSTAT"]).await;
    format!(
        "calibration: Redis {inside:.2} µs per SET inside, {round_trip:.0} µs per SET round \
         trip from here ({n} in a row, one connection); plain Redlock's rows below are the \
         other half"
    )
}

/// A step's keys and arguments.
type StepCall = (Vec<String>, Vec<String>);

/// One way of sending a grant's and a release's step to a master, for `inside_redis`.
#[derive(Clone, Copy)]
enum Inside {
    /// `SET NX PX`, then the compare-and-delete script.
    Plain,
    /// `acquire.lua` and `release.lua`, each an `EVALSHA` of its own.
    Alone,
    /// Each step as a cluster sends it: its own script with `single.lua` (its answer and the
    /// master's `TIME`), an `EVALSHA` of its own.
    Single,
    /// The batch script (`batch.lua` and the steps), `steps` steps a call.
    Batch { steps: usize },
    /// The batch as a Redis function, its steps defined once when the library is loaded.
    Function { steps: usize },
    /// The batch with steps that answer at once: what dealing steps out costs alone.
    Dealing { steps: usize },
    /// The batch with the least steps a fenced Redlock needs (see `MINIMAL_ACQUIRE`): the
    /// floor under any layout of ours, batched the same way.
    Minimal { steps: usize },
}

/// The least a grant step can do and keep README's guarantees for a plain lock: refuse on a
/// master that lost its data (the marker), set the lock only if free, for its TTL, and take
/// a fencing token from the master's counter. No hold record (so no inspect, no renew of
/// the lease's terms, no owner), no index of names, no waiters' marks, no claims, no
/// Idempotency-Key: everything else acquire.lua does is a feature on top of this.
const MINIMAL_ACQUIRE: &str = "if not marked(KEYS[2]) then return {-1} end\n\
    if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0} end\n\
    return {1, redis.call('INCR', KEYS[3])}";

/// The least a release step can do: on a master that kept its data, compare and delete.
const MINIMAL_RELEASE: &str = "if not marked(KEYS[2]) then return -1 end\n\
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n\
    return 0";

/// What a grant + release cycle costs inside one master, in µs (`INFO commandstats`: the
/// script calls, which include the commands they run, and plain Redlock's `SET`), for each
/// way of sending the steps, against plain Redlock's. Rounds alternate between the ways and
/// each way's least disturbed round is reported: a round's time is wall time inside Redis,
/// which a busy neighbour on the cores inflates, never deflates.
async fn inside_redis(master: &RedisMaster, cycles: usize, rounds: usize) {
    const P: &str = "benchinside:";
    let Ok(mut conn) = master.client().get_multiplexed_async_connection().await else {
        println!("inside Redis: cannot reach a master");
        return;
    };
    let _: redis::RedisResult<()> = master.cmd(&["SET", &format!("{P}marker"), "1"]).await;
    let (definitions, dispatch) = redlockd::store::redis::batch_script_parts(&[]);
    let batch = redis::Script::new(&(definitions.clone() + &dispatch));
    let (noop_definitions, _) = redlockd::store::redis::batch_script_parts(&[
        ("acquire", "return {1, 1}"),
        ("release", "return 1"),
    ]);
    let dealing = redis::Script::new(&(noop_definitions + &dispatch));
    let (minimal_definitions, _) = redlockd::store::redis::batch_script_parts(&[
        ("acquire", MINIMAL_ACQUIRE),
        ("release", MINIMAL_RELEASE),
    ]);
    let minimal = redis::Script::new(&(minimal_definitions + &dispatch));
    // A step calls the prelude's functions, and the prelude the layout's (both defined
    // before the steps in a batch): a script of its own defines them first.
    let prelude = concat!(
        include_str!("../src/store/scripts/layout.lua"),
        include_str!("../src/store/scripts/prelude.lua")
    );
    let acquire = redis::Script::new(
        &(prelude.to_owned() + include_str!("../src/store/scripts/acquire.lua")),
    );
    let release = redis::Script::new(
        &(prelude.to_owned() + include_str!("../src/store/scripts/release.lua")),
    );
    let single = |name: &str| {
        redis::Script::new(&redlockd::store::redis::single_script_text(name).unwrap_or_default())
    };
    let (single_acquire, single_release) = (single("acquire"), single("release"));
    let unlock = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
         return 0",
    );
    let library = format!(
        "#!lua name=redlockd_bench_inside\n{definitions}\n\
         redis.register_function('redlockd_batch', function(KEYS, ARGV)\n{dispatch}\nend)\n"
    );
    let functions = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&library)
        .query_async::<String>(&mut conn)
        .await
        .is_ok();
    for script in [
        &batch,
        &dealing,
        &minimal,
        &acquire,
        &release,
        &single_acquire,
        &single_release,
        &unlock,
    ] {
        let _: redis::RedisResult<String> = script.prepare_invoke().load_async(&mut conn).await;
    }
    // A step's keys and arguments as acquire.lua's and release.lua's headers list them.
    let acquire_step = |name: &str| -> StepCall {
        (
            vec![
                format!("{P}lock:{name}"),
                format!("{P}fence"),
                format!("{P}marker"),
                format!("{P}names"),
                format!("{P}shared:{name}"),
                format!("{P}claim:{name}"),
            ],
            vec![
                format!("lease-{name}"),
                "30000".into(),
                String::new(),
                name.into(),
                format!("{P}lock:"),
                String::new(),
                format!("{P}reader:{name}/"),
                "0".into(),
                "0".into(),
            ],
        )
    };
    let release_step = |name: &str| -> StepCall {
        (
            vec![
                format!("{P}lock:{name}"),
                format!("{P}marker"),
                format!("{P}claim:{name}"),
            ],
            vec![
                format!("lease-{name}"),
                format!("{P}released"),
                "1".into(),
                format!("{P}events"),
                name.into(),
                String::new(),
                String::new(),
            ],
        )
    };
    let packed = |head: redis::Cmd, steps: &[(&str, StepCall)]| {
        let mut call = head;
        call.arg(steps.iter().map(|(_, (k, _))| k.len()).sum::<usize>());
        for (_, (keys, _)) in steps {
            call.arg(keys);
        }
        for (step, (keys, args)) in steps {
            call.arg(step).arg(keys.len()).arg(args.len()).arg(args);
        }
        call
    };
    let evalsha = |script: &redis::Script| {
        let mut c = redis::cmd("EVALSHA");
        c.arg(script.get_hash());
        c
    };
    let mut ways = vec![
        (
            "plain Redlock (SET NX PX, compare-and-delete script)",
            Inside::Plain,
        ),
        ("the step scripts, a call each", Inside::Alone),
        ("the batch, one step a call", Inside::Batch { steps: 1 }),
        (
            "a step alone as a cluster sends it (single.lua)",
            Inside::Single,
        ),
        ("the batch, 8 steps a call", Inside::Batch { steps: 8 }),
        (
            "the batch, 8 steps a call, steps that do nothing (dealing out alone)",
            Inside::Dealing { steps: 8 },
        ),
        (
            "the batch, 8 steps a call, the least steps a fenced Redlock needs",
            Inside::Minimal { steps: 8 },
        ),
    ];
    if functions {
        ways.push((
            "the batch as a Redis function (FCALL), 8 steps a call",
            Inside::Function { steps: 8 },
        ));
    }
    let mut best = vec![f64::INFINITY; ways.len()];
    for _ in 0..rounds {
        for (w, (_, way)) in ways.iter().enumerate() {
            let _: redis::RedisResult<()> = master.cmd(&["CONFIG", "RESETSTAT"]).await;
            let per_call = match way {
                Inside::Plain | Inside::Alone | Inside::Single => 8,
                Inside::Batch { steps }
                | Inside::Function { steps }
                | Inside::Dealing { steps }
                | Inside::Minimal { steps } => *steps,
            };
            let mut done = 0;
            while done < cycles {
                let names: Vec<String> = (0..per_call).map(|j| format!("w{w}-{j}")).collect();
                let mut pipe = redis::pipe();
                match way {
                    Inside::Plain => {
                        for name in &names {
                            let key = format!("{P}plain:{name}");
                            pipe.cmd("SET")
                                .arg(&key)
                                .arg("L")
                                .arg("NX")
                                .arg("PX")
                                .arg(30_000);
                            pipe.add_command(evalsha(&unlock).arg(1).arg(&key).arg("L").clone());
                        }
                    }
                    Inside::Alone => {
                        for name in &names {
                            let (k, a) = acquire_step(name);
                            pipe.add_command(evalsha(&acquire).arg(k.len()).arg(k).arg(a).clone());
                            let (k, a) = release_step(name);
                            pipe.add_command(evalsha(&release).arg(k.len()).arg(k).arg(a).clone());
                        }
                    }
                    Inside::Single => {
                        for name in &names {
                            let (k, a) = acquire_step(name);
                            pipe.add_command(
                                evalsha(&single_acquire).arg(k.len()).arg(k).arg(a).clone(),
                            );
                            let (k, a) = release_step(name);
                            pipe.add_command(
                                evalsha(&single_release).arg(k.len()).arg(k).arg(a).clone(),
                            );
                        }
                    }
                    Inside::Batch { .. } | Inside::Dealing { .. } | Inside::Function { .. } => {
                        let head = || match way {
                            Inside::Batch { .. } => evalsha(&batch),
                            Inside::Dealing { .. } => evalsha(&dealing),
                            _ => {
                                let mut c = redis::cmd("FCALL");
                                c.arg("redlockd_batch");
                                c
                            }
                        };
                        let grants: Vec<_> =
                            names.iter().map(|n| ("acquire", acquire_step(n))).collect();
                        let releases: Vec<_> =
                            names.iter().map(|n| ("release", release_step(n))).collect();
                        pipe.add_command(packed(head(), &grants));
                        pipe.add_command(packed(head(), &releases));
                    }
                    Inside::Minimal { .. } => {
                        let keys = |name: &str, fence: bool| {
                            let mut keys = vec![format!("{P}min:{name}"), format!("{P}marker")];
                            keys.extend(fence.then(|| format!("{P}fence")));
                            keys
                        };
                        let grants: Vec<_> = names
                            .iter()
                            .map(|n| {
                                (
                                    "acquire",
                                    (keys(n, true), vec![format!("lease-{n}"), "30000".into()]),
                                )
                            })
                            .collect();
                        let releases: Vec<_> = names
                            .iter()
                            .map(|n| ("release", (keys(n, false), vec![format!("lease-{n}")])))
                            .collect();
                        pipe.add_command(packed(evalsha(&minimal), &grants));
                        pipe.add_command(packed(evalsha(&minimal), &releases));
                    }
                }
                let answers: redis::RedisResult<Vec<redis::Value>> =
                    pipe.query_async(&mut conn).await;
                let answers = match answers {
                    Ok(answers) => answers,
                    Err(e) => {
                        println!("inside Redis: a call failed: {e}");
                        return;
                    }
                };
                // The real steps must have granted: a refused grant costs less and would
                // flatter the figure.
                let first = match (way, answers.first()) {
                    (Inside::Alone, Some(answer)) => Some(answer),
                    (
                        Inside::Batch { .. }
                        | Inside::Function { .. }
                        | Inside::Single
                        | Inside::Minimal { .. },
                        Some(redis::Value::Array(a)),
                    ) => a.first(),
                    _ => None,
                };
                if let Some(answer) = first
                    && !matches!(answer, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(1)))
                {
                    println!("inside Redis: a grant was not granted: {answer:?}");
                    return;
                }
                done += per_call;
            }
            let (us, _) =
                commandstats_per_cycle(std::slice::from_ref(master), done, &["set"]).await;
            best[w] = best[w].min(us);
        }
    }
    let plain = best[0];
    println!(
        "| one master, per grant + release cycle | µs inside Redis | × plain Redlock |\n|---|---|---|"
    );
    for ((label, _), us) in ways.iter().zip(&best) {
        println!("| {label} | {us:.2} | {:.2} |", us / plain);
    }
    println!(
        "\n{cycles} cycles a round, {rounds} rounds alternating, each way's least disturbed \
         round; redis-server {}.\n",
        master
            .cmd::<String>(&["INFO", "server"])
            .await
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
    );
    let _: redis::RedisResult<()> = master
        .cmd(&["FUNCTION", "DELETE", "redlockd_bench_inside"])
        .await;
}

/// Resident memory of a process in bytes, from `/proc/<pid>/status`.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// CPU (and context switches) of a set of processes, read before and after a row.
struct CpuMeter {
    pids: Vec<u32>,
    start: Duration,
    switches: u64,
}

impl CpuMeter {
    fn start(pids: &[u32]) -> Self {
        Self {
            pids: pids.to_vec(),
            start: pids.iter().map(|p| cpu_of(*p)).sum(),
            switches: pids.iter().map(|p| switches_of(*p)).sum(),
        }
    }

    fn used(&self) -> Duration {
        let now: Duration = self.pids.iter().map(|p| cpu_of(*p)).sum();
        now.saturating_sub(self.start)
    }

    fn switched(&self) -> u64 {
        let now: u64 = self.pids.iter().map(|p| switches_of(*p)).sum();
        now.saturating_sub(self.switches)
    }
}

// ---------------------------------------------------------------------------------------
// Results

#[derive(Default)]
struct Tally {
    cycles: usize,
    grants: Vec<Duration>,
    handoffs: Vec<Duration>,
    regrants: usize,
    timeouts: usize,
    errors: usize,
}

impl Tally {
    /// One cycle that failed.
    fn error() -> Self {
        Self {
            errors: 1,
            ..Self::default()
        }
    }

    /// One cycle whose grant took `took`, with `errors` failed calls after it.
    fn cycle(took: Duration, errors: usize) -> Self {
        Self {
            cycles: 1,
            grants: vec![took],
            errors,
            ..Self::default()
        }
    }

    fn merge(&mut self, other: Tally) {
        self.cycles += other.cycles;
        self.grants.extend(other.grants);
        self.handoffs.extend(other.handoffs);
        self.regrants += other.regrants;
        self.timeouts += other.timeouts;
        self.errors += other.errors;
    }
}

struct Row {
    system: &'static str,
    workload: String,
    tally: Tally,
    took: Duration,
    /// CPU of the service (redlockd's process; this process for the limit and the engine).
    service_cpu: Duration,
    masters_cpu: Duration,
    /// Context switches of the service's threads.
    service_switches: u64,
}

impl Row {
    fn rate(&self) -> f64 {
        self.tally.cycles as f64 / self.took.as_secs_f64()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn print_header() {
    println!(
        "| system | workload | cycles/s | × plain Redlock (renew-heavy: × scripts) | grant p50 / p99 / max ms | hand-off p50 / p99 ms | to previous holder | timeouts / errors | CPU ms per 1000 cycles: service / masters | service context switches per cycle |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
}

fn print_row(row: &mut Row, limit: Option<f64>) {
    row.tally.grants.sort_unstable();
    row.tally.handoffs.sort_unstable();
    let t = &row.tally;
    let per_k = |cpu: Duration| {
        if t.cycles == 0 {
            0.0
        } else {
            ms(cpu) * 1000.0 / t.cycles as f64
        }
    };
    let ratio = limit.map_or("—".to_owned(), |l| format!("{:.2}", row.rate() / l));
    let handoff = if t.handoffs.is_empty() {
        "—".to_owned()
    } else {
        format!(
            "{:.2} / {:.2}",
            ms(pct(&t.handoffs, 0.5)),
            ms(pct(&t.handoffs, 0.99))
        )
    };
    let previous = if t.handoffs.is_empty() {
        "—".to_owned()
    } else {
        format!("{}/{}", t.regrants, t.handoffs.len() + t.regrants)
    };
    println!(
        "| {} | {} | {:.0} | {ratio} | {:.2} / {:.2} / {:.2} | {handoff} | {previous} | {} / {} | {:.0} / {:.0} | {:.1} |",
        row.system,
        row.workload,
        row.rate(),
        ms(pct(&t.grants, 0.5)),
        ms(pct(&t.grants, 0.99)),
        ms(t.grants.last().copied().unwrap_or_default()),
        t.timeouts,
        t.errors,
        per_k(row.service_cpu),
        per_k(row.masters_cpu),
        row.service_switches as f64 / t.cycles.max(1) as f64,
    );
}

/// Where a row runs: for how long, and whose CPU counts as the service's and the masters'.
struct Setup<'a> {
    length: Duration,
    service: &'a [u32],
    masters: &'a [u32],
}

/// Run `clients` loops of `cycle(client)` for the setup's length, with the CPU of the
/// service and the masters measured around them; print the row (with its ratio to
/// `limit`'s cycles/s, if given) and return it.
async fn measure<F, Fut>(
    system: &'static str,
    workload: String,
    clients: usize,
    at: &Setup<'_>,
    limit: Option<f64>,
    cycle: F,
) -> Row
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Tally> + Send,
{
    let service_cpu = CpuMeter::start(at.service);
    let masters_cpu = CpuMeter::start(at.masters);
    let started = Instant::now();
    let deadline = started + at.length;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < deadline {
                    tally.merge(cycle(c).await);
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await.expect("client"));
    }
    let mut row = Row {
        system,
        workload,
        tally,
        took: started.elapsed(),
        service_cpu: service_cpu.used(),
        service_switches: service_cpu.switched(),
        masters_cpu: masters_cpu.used(),
    };
    print_row(&mut row, limit);
    row
}

// ---------------------------------------------------------------------------------------
// The three systems

/// Plain Redlock: `SET NX PX` and a compare-and-delete script on every master at once, a
/// majority required.
struct Plain {
    masters: Vec<redis::aio::MultiplexedConnection>,
    unlock: redis::Script,
    /// With a fencing token (`Plain::fenced`): [`FENCED_GRANT`], run on each master in
    /// place of the `SET`.
    fence: Option<redis::Script>,
}

/// The fenced grant of plain Redlock behind bare axum: `MINIMAL_ACQUIRE`'s steps as a
/// script of its own (the marker, `SET NX PX`, the fencing counter).
const FENCED_GRANT: &str = "if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end\n\
    if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end\n\
    return redis.call('INCR', KEYS[3])";

/// The marker and the counter of [`FENCED_GRANT`], the bare server's own (never redlockd's).
const FENCED_KEYS: [&str; 2] = ["bare:marker", "bare:fence"];

impl Plain {
    async fn new(masters: &[RedisMaster]) -> Arc<Self> {
        let mut connections = Vec::new();
        for m in masters {
            connections.push(
                m.client()
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect"),
            );
        }
        Arc::new(Self::unfenced(connections))
    }

    fn unfenced(masters: Vec<redis::aio::MultiplexedConnection>) -> Self {
        Self {
            masters,
            unlock: redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
            ),
            fence: None,
        }
    }

    /// Plain Redlock with a fencing token and a marker ([`FENCED_GRANT`]); the release is
    /// the same compare-and-delete. Sets the marker on every master.
    async fn fenced(mut masters: Vec<redis::aio::MultiplexedConnection>) -> Arc<Self> {
        for conn in &mut masters {
            let _: () = redis::cmd("SET")
                .arg(FENCED_KEYS[0])
                .arg(1)
                .query_async(conn)
                .await
                .expect("set the marker");
        }
        Arc::new(Self {
            fence: Some(redis::Script::new(FENCED_GRANT)),
            ..Self::unfenced(masters)
        })
    }

    /// `SET key lease NX PX ttl` on every master at once (with a fence, [`FENCED_GRANT`]):
    /// how many granted it, and the highest fencing token among them (0 without a fence).
    async fn set_everywhere(&self, key: &str, lease: &str, ttl_ms: u64) -> (usize, u64) {
        let set = join_all(self.masters.iter().map(|conn| {
            let mut conn = conn.clone();
            async move {
                match &self.fence {
                    Some(fence) => fence
                        .key(key)
                        .key(FENCED_KEYS[0])
                        .key(FENCED_KEYS[1])
                        .arg(lease)
                        .arg(ttl_ms)
                        .invoke_async::<i64>(&mut conn)
                        .await
                        .map(|token| u64::try_from(token).ok().filter(|&t| t > 0)),
                    None => redis::cmd("SET")
                        .arg(key)
                        .arg(lease)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async::<Option<String>>(&mut conn)
                        .await
                        .map(|set| set.map(|_| 0)),
                }
            }
        }))
        .await;
        let tokens: Vec<u64> = set.into_iter().filter_map(|r| r.ok().flatten()).collect();
        (tokens.len(), tokens.into_iter().max().unwrap_or(0))
    }

    /// The compare-and-delete script on every master at once.
    async fn unlock_everywhere(&self, key: &str, lease: &str) {
        let unlock = &self.unlock;
        join_all(self.masters.iter().map(|conn| {
            let mut conn = conn.clone();
            async move {
                unlock
                    .key(key)
                    .arg(lease)
                    .invoke_async::<i64>(&mut conn)
                    .await
            }
        }))
        .await;
    }

    async fn cycle(&self, c: usize) -> Tally {
        static N: AtomicUsize = AtomicUsize::new(0);
        let key = format!("plain:{c}");
        let lease = lease_id(c, N.fetch_add(1, Ordering::Relaxed))
            .as_str()
            .to_owned();
        let t = Instant::now();
        let (won, _) = self.set_everywhere(&key, &lease, 10_000).await;
        let took = t.elapsed();
        self.unlock_everywhere(&key, &lease).await;
        if won > self.masters.len() / 2 {
            Tally::cycle(took, 0)
        } else {
            Tally::error()
        }
    }
}

/// What each Redis command cost the masters per cycle, from `INFO commandstats` (reset
/// before a row): calls and microseconds inside Redis.
async fn commandstats_reset<'a>(masters: impl IntoIterator<Item = &'a RedisMaster>) {
    for m in masters {
        let _: redis::RedisResult<()> = m.cmd(&["CONFIG", "RESETSTAT"]).await;
    }
}

/// Commands whose time includes the commands they run: a script's inner calls are counted
/// in its own `usec` and again under their own names.
const SCRIPT_CALLS: [&str; 6] = [
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
];

/// The masters' time per cycle (the script calls, which include their inner calls, and the
/// commands in `direct`, which the row's client sends outside any script), and every
/// command's calls and time per cycle.
async fn commandstats_per_cycle<'a>(
    masters: impl IntoIterator<Item = &'a RedisMaster>,
    cycles: usize,
    direct: &[&str],
) -> (f64, String) {
    let mut calls: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for m in masters {
        let info: String = m.cmd(&["INFO", "commandstats"]).await.unwrap_or_default();
        for line in info.lines() {
            let Some((name, stats)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |f: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            let entry = calls.entry(name.to_owned()).or_default();
            entry.0 += field("calls");
            entry.1 += field("usec");
        }
    }
    let cycles = cycles.max(1) as f64;
    let total: f64 = calls
        .iter()
        .filter(|(name, _)| {
            SCRIPT_CALLS.contains(&name.as_str()) || direct.contains(&name.as_str())
        })
        .map(|(_, (_, usec))| usec)
        .sum::<f64>()
        / cycles;
    let each: Vec<String> = calls
        .iter()
        .filter(|(name, (n, _))| {
            *n > 0.0 && !matches!(name.as_str(), "info" | "config|resetstat" | "ping")
        })
        .map(|(name, (n, usec))| format!("{name} {:.2}× {:.1} µs", n / cycles, usec / cycles))
        .collect();
    (total, each.join(", "))
}

/// The project's scripts on every master at once, a majority required.
struct Limit {
    nodes: Vec<Arc<RedisNode>>,
}

impl Limit {
    fn new(masters: &[RedisMaster]) -> Arc<Self> {
        Arc::new(Self {
            nodes: masters.iter().map(|m| Arc::new(node(m))).collect(),
        })
    }

    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    async fn acquire(&self, key: &LockKey, lease: &LeaseId, ttl_ms: u64) -> bool {
        let replies = join_all(
            self.nodes
                .iter()
                .map(|n| n.acquire(Claim::new(key, lease, ttl_ms))),
        )
        .await;
        let won = replies
            .iter()
            .filter(|r| matches!(r, Ok(Acquired::Granted { .. })))
            .count();
        won >= self.majority()
    }

    async fn renew(&self, key: &LockKey, lease: &LeaseId) -> bool {
        let replies = join_all(self.nodes.iter().map(|n| {
            n.renew(Renewal {
                key,
                lease,
                ttl_ms: None,
                owner: None,
                stream: None,
            })
        }))
        .await;
        replies
            .iter()
            .filter(|r| matches!(r, Ok(Owned::Yes(_))))
            .count()
            >= self.majority()
    }

    async fn release(&self, key: &LockKey, lease: &LeaseId) {
        join_all(
            self.nodes
                .iter()
                .map(|n| n.release(key, lease, &Ending::Revoke)),
        )
        .await;
    }
}

fn node(m: &RedisMaster) -> RedisNode {
    RedisNode::new(
        &redlockd::config::MasterUrl::parse(&m.url()).expect("url"),
        "redlockd:",
        TIMEOUT,
        256,
    )
    .expect("node")
}

fn engine(masters: &[RedisMaster]) -> Arc<Redlock> {
    let nodes: Vec<Arc<dyn LockNode>> = masters
        .iter()
        .map(|m| Arc::new(node(m)) as Arc<dyn LockNode>)
        .collect();
    Arc::new(Redlock::new(
        nodes,
        EngineConfig::new(TIMEOUT, 0.01, Duration::from_secs(3600)),
        Arc::new(Metrics::new()),
    ))
}

/// redlockd as a process of its own, so that its CPU and memory can be read apart from the
/// load generator's.
struct Server {
    child: Child,
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `REDLOCKD_BENCH_TOKEN`: a bearer token every HTTP request carries (to measure the cost
/// of authentication with `REDLOCKD_BENCH_AB="REDLOCKD_AUTH_FILE=…"`: the server without a
/// token file ignores it).
fn bench_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(token) = std::env::var("REDLOCKD_BENCH_TOKEN")
        && let Ok(value) = format!("Bearer {token}").parse()
    {
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    headers
}

impl Server {
    async fn start(masters: &[RedisMaster]) -> Self {
        let extra = std::env::var("REDLOCKD_BENCH_SERVER_ENV").unwrap_or_default();
        Self::start_with(masters, &extra).await
    }

    /// redlockd with `extra` ("K=V K=V") set in its environment.
    async fn start_with(masters: &[RedisMaster], extra: &str) -> Self {
        let urls: Vec<String> = masters.iter().map(RedisMaster::url).collect();
        Self::start_over(&urls, extra).await
    }

    /// redlockd over the masters at `urls` (none: the embedded store).
    async fn start_over(urls: &[String], extra: &str) -> Self {
        Self::start_binary(BIN, urls, extra).await
    }

    /// The redlockd binary at `bin` over the masters at `urls`.
    async fn start_binary(bin: &str, urls: &[String], extra: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir = tempfile::tempdir().expect("temp dir");
        let log = std::fs::File::create(dir.path().join("redlockd.log")).expect("log file");
        let mut cmd = Command::new(bin);
        cmd.env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"));
        // No masters: the embedded store (the HTTP path alone).
        if !urls.is_empty() {
            cmd.env("REDLOCKD_REDIS_URLS", urls.join(","));
        }
        cmd.env(
            "REDLOCKD_MASTER_TIMEOUT_MS",
            TIMEOUT.as_millis().to_string(),
        )
        .env("REDLOCKD_MAX_CONNECTIONS", "4096")
        .env("RUST_LOG", "info");
        for pair in extra.split_whitespace() {
            if let Some((k, v)) = pair.split_once('=') {
                cmd.env(k, v);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start redlockd");
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: common::http_builder()
                .pool_max_idle_per_host(1024)
                .timeout(Duration::from_secs(60))
                .default_headers(bench_headers())
                .build()
                .expect("client"),
            _dir: dir,
        };
        let ready = Instant::now();
        loop {
            if let Ok(r) = server
                .http
                .get(format!("{}/readyz", server.base))
                .send()
                .await
                && r.status() == 200
            {
                break;
            }
            assert!(
                ready.elapsed() < Duration::from_secs(20),
                "redlockd did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    /// The HTTP ceiling of these cores: this benchmark's binary run again as [`bare_server`].
    async fn start_bare() -> Self {
        Self::start_this(&[], "REDLOCKD_BENCH_BARE=1").await
    }

    /// Plain Redlock behind the same bare router, over `masters` ([`bare_redlock`]);
    /// `fenced`: with a marker and a fencing token.
    async fn start_bare_redlock(masters: &[RedisMaster], fenced: bool) -> Self {
        let urls: Vec<String> = masters.iter().map(RedisMaster::url).collect();
        let env = match fenced {
            true => "REDLOCKD_BENCH_BARE=1 REDLOCKD_BENCH_BARE_FENCED=1",
            false => "REDLOCKD_BENCH_BARE=1",
        };
        Self::start_this(&urls, env).await
    }

    /// This benchmark's own binary run again as a server, over `urls`, with `env`.
    async fn start_this(urls: &[String], env: &str) -> Self {
        let exe = std::env::current_exe().expect("this benchmark's binary");
        let exe = exe.to_str().expect("a UTF-8 path");
        Self::start_binary(exe, urls, env).await
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn grant(&self, name: &str, body: Value) -> Result<(String, u64), u16> {
        self.grant_in("locks", name, body).await
    }

    /// A grant of the kind whose routes are `/<route>/{name}`.
    async fn grant_in(&self, route: &str, name: &str, body: Value) -> Result<(String, u64), u16> {
        let url = match name {
            "" => format!("{}/{route}", self.base),
            name => format!("{}/{route}/{name}", self.base),
        };
        let resp = self
            .http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|_| 0u16)?;
        let status = resp.status().as_u16();
        if status != 201 {
            return Err(status);
        }
        let lease: Value = resp.json().await.map_err(|_| 0u16)?;
        Ok((
            lease["lease_id"].as_str().unwrap_or_default().to_owned(),
            lease["fencing_token"].as_u64().unwrap_or_default(),
        ))
    }

    async fn renew(&self, name: &str, id: &str) -> bool {
        let sent = self
            .http
            .put(format!("{}/locks/{name}/leases/{id}", self.base))
            .send()
            .await;
        expect_status("renew", sent, 200).await
    }

    async fn revoke(&self, name: &str, id: &str) -> bool {
        self.revoke_in("locks", name, id).await
    }

    async fn revoke_in(&self, route: &str, name: &str, id: &str) -> bool {
        let sent = self
            .http
            .delete(format!("{}/{route}/{name}/leases/{id}", self.base))
            .send()
            .await;
        expect_status("revoke", sent, 204).await
    }
}

/// A bare HTTP server on `REDLOCKD_LISTEN`: axum's router alone, no middleware, no lease
/// service, no store. A grant (`POST /locks/{name}`, its JSON body read) is answered 201 with
/// a lease of redlockd's shape and size and a `Location`, a revoke (`DELETE
/// /locks/{name}/leases/{id}`) 204: the same requests and answers as redlockd's, so the
/// least an HTTP/1.1 service can cost them on these cores, with this load generator on the
/// same cores. The row it makes is what the embedded store's is measured against.
///
/// With masters (`REDLOCKD_REDIS_URLS`, `Server::start_bare_redlock`) it is plain Redlock
/// behind that router: a grant is plain Redlock's `SET NX PX` on every master at once, a
/// majority required (a minority's holds are let go and the grant answered 409), a revoke
/// its compare-and-delete everywhere; with `REDLOCKD_BENCH_BARE_FENCED`, the grant is
/// [`FENCED_GRANT`] on every master (a marker and a fencing token). No record, log or
/// middleware: the least any Redlock service behind HTTP costs here, what redlockd's row is
/// read against.
async fn bare_server() {
    use axum::http::{StatusCode, header};
    use axum::routing::{delete, get, post};
    static TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    async fn grant(
        axum::extract::Path(name): axum::extract::Path<String>,
        axum::Json(body): axum::Json<Value>,
    ) -> impl axum::response::IntoResponse {
        let token = TOKENS.fetch_add(1, Ordering::Relaxed);
        let ttl = body["ttl_ms"].as_u64().unwrap_or(30_000);
        let lease = format!("{token:0>22}");
        let location = format!("/locks/{name}/leases/{lease}");
        let answer = json!({
            "name": name, "lease_id": lease, "fencing_token": token, "ttl_ms": ttl,
            "validity_ms": ttl.saturating_sub(100), "expires_at": "2026-11-28T12:57:39.931Z",
            "mode": "exclusive",
        });
        (
            StatusCode::CREATED,
            [(header::LOCATION, location)],
            axum::Json(answer),
        )
    }
    let app = match std::env::var("REDLOCKD_REDIS_URLS") {
        Ok(urls) => bare_redlock(&urls).await,
        Err(_) => axum::Router::new()
            .route("/locks/{name}", post(grant))
            .route(
                "/locks/{name}/leases/{id}",
                delete(|| async { StatusCode::NO_CONTENT }),
            ),
    }
    .route("/readyz", get(|| async { "ready" }))
    .route("/streams/{name}", post(held_stream));
    let listen = std::env::var("REDLOCKD_LISTEN").expect("REDLOCKD_LISTEN");
    let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
    // As redlockd's listener does (src/http/serve.rs).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await.expect("serve");
}

/// The bare router's held stream (`POST /streams/{name}`): an event stream that answers
/// `granted` and then stays open with nothing behind it, what an idle held stream costs
/// hyper, axum and tokio alone, the floor under a redlockd stream's memory.
async fn held_stream(
    axum::extract::Path(name): axum::extract::Path<String>,
) -> axum::response::sse::Sse<
    impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
> {
    let granted = axum::response::sse::Event::default()
        .event("granted")
        .data(json!({"name": name, "lease_id": format!("{:0>22}", 1)}).to_string());
    let events = futures::StreamExt::chain(
        futures::stream::once(async move { Ok(granted) }),
        futures::stream::pending(),
    );
    axum::response::sse::Sse::new(events)
}

/// [`bare_server`]'s routes over the masters at `urls` (comma-separated): plain Redlock
/// behind axum.
async fn bare_redlock(urls: &str) -> axum::Router {
    use axum::extract::{Path, State};
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use axum::routing::{delete, post};
    type Masters = Arc<Plain>;
    static LEASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    async fn grant(
        State(plain): State<Masters>,
        Path(name): Path<String>,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::response::Response {
        let ttl = body["ttl_ms"].as_u64().unwrap_or(30_000);
        let lease = format!("{:0>22}", LEASES.fetch_add(1, Ordering::Relaxed));
        let key = format!("bare:{name}");
        let started = Instant::now();
        let (won, token) = plain.set_everywhere(&key, &lease, ttl).await;
        if won <= plain.masters.len() / 2 {
            plain.unlock_everywhere(&key, &lease).await;
            return StatusCode::CONFLICT.into_response();
        }
        let validity = ttl.saturating_sub(started.elapsed().as_millis() as u64 + 10);
        let answer = json!({
            "name": name, "lease_id": lease, "fencing_token": token, "ttl_ms": ttl,
            "validity_ms": validity, "expires_at": "2026-11-28T12:57:39.931Z",
            "mode": "exclusive",
        });
        let location = format!("/locks/{name}/leases/{lease}");
        (
            StatusCode::CREATED,
            [(header::LOCATION, location)],
            axum::Json(answer),
        )
            .into_response()
    }
    async fn revoke(
        State(plain): State<Masters>,
        Path((name, lease)): Path<(String, String)>,
    ) -> StatusCode {
        plain
            .unlock_everywhere(&format!("bare:{name}"), &lease)
            .await;
        StatusCode::NO_CONTENT
    }
    let mut masters = Vec::new();
    for url in urls.split(',') {
        let client = redis::Client::open(url).expect("a master's URL");
        masters.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
    }
    let plain = if std::env::var_os("REDLOCKD_BENCH_BARE_FENCED").is_some() {
        Plain::fenced(masters).await
    } else {
        Arc::new(Plain::unfenced(masters))
    };
    axum::Router::new()
        .route("/locks/{name}", post(grant))
        .route("/locks/{name}/leases/{id}", delete(revoke))
        .with_state(plain)
}

/// Whether the answer has the expected status; the first few that do not are shown on
/// stderr, so that a row's errors can be told apart.
async fn expect_status(
    what: &str,
    sent: reqwest::Result<reqwest::Response>,
    expected: u16,
) -> bool {
    static SHOWN: AtomicUsize = AtomicUsize::new(0);
    let unexpected = match sent {
        Ok(r) if r.status().as_u16() == expected => return true,
        Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
        Err(e) => e.to_string(),
    };
    if SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
        eprintln!("bench: {what} answered {unexpected}");
    }
    false
}

fn lease_id(c: usize, i: usize) -> LeaseId {
    LeaseId::parse(&format!("bench-lease-{c}-{i}")).expect("a well-formed lease id")
}

// ---------------------------------------------------------------------------------------
// Workloads

/// One uncontended grant → release cycle, timed at the grant.
async fn limit_cycle(limit: Arc<Limit>, c: usize, renews: usize) -> Tally {
    static N: AtomicUsize = AtomicUsize::new(0);
    let key = LockKey::mutex(format!("limit:{c}"));
    let lease = lease_id(c, N.fetch_add(1, Ordering::Relaxed));
    let t = Instant::now();
    if !limit.acquire(&key, &lease, 10_000).await {
        limit.release(&key, &lease).await;
        return Tally::error();
    }
    let took = t.elapsed();
    let mut errors = 0;
    for _ in 0..renews {
        if !limit.renew(&key, &lease).await {
            errors += 1;
        }
    }
    limit.release(&key, &lease).await;
    Tally::cycle(took, errors)
}

async fn engine_cycle(engine: Arc<Redlock>, c: usize) -> Tally {
    static N: AtomicUsize = AtomicUsize::new(0);
    let key = LockKey::mutex(format!("engine:{c}"));
    let lease = lease_id(c, N.fetch_add(1, Ordering::Relaxed));
    let t = Instant::now();
    if engine
        .acquire(&key, &lease, Duration::from_secs(10), None)
        .await
        .is_err()
    {
        return Tally::error();
    }
    let took = t.elapsed();
    let _ = engine.release(&key, &lease).await;
    Tally::cycle(took, 0)
}

async fn http_cycle(server: Arc<Server>, c: usize, renews: usize) -> Tally {
    let name = format!("http:{c}");
    let t = Instant::now();
    let Ok((id, _)) = server.grant(&name, json!({"ttl_ms": 10000})).await else {
        return Tally::error();
    };
    let took = t.elapsed();
    let mut errors = 0;
    for _ in 0..renews {
        if !server.renew(&name, &id).await {
            errors += 1;
        }
    }
    if !server.revoke(&name, &id).await {
        errors += 1;
    }
    Tally::cycle(took, errors)
}

/// How many holds a keep-alive row keeps per client.
const KEPT: usize = 10;

/// Each client's holds in a keep-alive row: its lease ids (with their names), or its
/// session's id; taken on the client's first cycle and kept for the row.
struct Kept(Vec<tokio::sync::OnceCell<Result<Held, ()>>>);

/// (name, lease id) of each lease; with a session, its id alone (as the only lease id).
type Held = Vec<(String, String)>;

impl Kept {
    fn new(clients: usize) -> Self {
        Self((0..clients).map(|_| tokio::sync::OnceCell::new()).collect())
    }
}

/// One keep-alive round of client `c`'s `KEPT` holds: a renew of each lease, or (with
/// `session`) one renew of the session they were taken through, timed as a whole.
async fn keepalive_cycle(server: Arc<Server>, kept: Arc<Kept>, c: usize, session: bool) -> Tally {
    let held = kept.0[c]
        .get_or_init(|| async {
            let mut held = Vec::new();
            let mut body = json!({"ttl_ms": 60000});
            if session {
                let opened: Value = server
                    .http
                    .post(format!("{}/sessions", server.base))
                    .json(&body)
                    .send()
                    .await
                    .map_err(drop)?
                    .json()
                    .await
                    .map_err(drop)?;
                let id = opened["session_id"].as_str().ok_or(())?.to_owned();
                held.push((String::new(), id.clone()));
                body = json!({"session": id});
            }
            for i in 0..KEPT {
                let name = format!("kept:{}:{c}:{i}", u8::from(session));
                let (id, _) = server.grant(&name, body.clone()).await.map_err(drop)?;
                if !session {
                    held.push((name, id));
                }
            }
            Ok(held)
        })
        .await;
    let Ok(held) = held else {
        return Tally::error();
    };
    let t = Instant::now();
    let mut errors = 0;
    if session {
        let sent = server
            .http
            .put(format!("{}/sessions/{}", server.base, held[0].1))
            .send()
            .await;
        errors += usize::from(!expect_status("session renew", sent, 200).await);
    } else {
        for (name, id) in held {
            errors += usize::from(!server.renew(name, id).await);
        }
    }
    Tally::cycle(t.elapsed(), errors)
}

/// One uncontended take → release cycle of a semaphore's permit (limit 3, each client a
/// semaphore of its own), timed at the take: a lock's cycle plus the read of the slots.
async fn permit_cycle(server: Arc<Server>, c: usize) -> Tally {
    let name = format!("sem:{c}");
    let t = Instant::now();
    let body = json!({"ttl_ms": 10000, "limit": 3});
    let Ok((id, _)) = server.grant_in("semaphores", &name, body).await else {
        return Tally::error();
    };
    let took = t.elapsed();
    let errors = usize::from(!server.revoke_in("semaphores", &name, &id).await);
    Tally::cycle(took, errors)
}

/// One uncontended shared grant → revoke cycle of a lock (each client a lock of its own),
/// timed at the grant.
async fn shared_cycle(server: Arc<Server>, c: usize) -> Tally {
    let name = format!("shared:{c}");
    let t = Instant::now();
    let body = json!({"ttl_ms": 10000, "mode": "shared"});
    let Ok((id, _)) = server.grant(&name, body).await else {
        return Tally::error();
    };
    let took = t.elapsed();
    let errors = usize::from(!server.revoke(&name, &id).await);
    Tally::cycle(took, errors)
}

/// One uncontended grant → revoke cycle of a lease on two names (each client its own two),
/// timed at the grant.
async fn group_cycle(server: Arc<Server>, c: usize) -> Tally {
    let names = [format!("pair:{c}:a"), format!("pair:{c}:b")];
    let t = Instant::now();
    let body = json!({"ttl_ms": 10000, "names": names});
    let Ok((id, _)) = server.grant_in("locks", "", body).await else {
        return Tally::error();
    };
    let took = t.elapsed();
    let errors = usize::from(!server.revoke(&names[0], &id).await);
    Tally::cycle(took, errors)
}

/// Who released the contended lock last, and when (the hand-off starts there).
#[derive(Default)]
struct LastRelease {
    by: Option<usize>,
    at: Option<Instant>,
}

impl LastRelease {
    /// Counts client `c`'s grant at `got` in `tally`: a re-grant when `c` let go last, else
    /// a hand-off timed from that release.
    fn count(&self, c: usize, got: Instant, tally: &mut Tally) {
        if let Some(at) = self.at {
            if self.by == Some(c) {
                tally.regrants = 1;
            } else {
                tally.handoffs.push(got.saturating_duration_since(at));
            }
        }
    }

    /// Client `c` lets go now. Marked before the release is sent: the hand-off is the time
    /// from the holder's decision to let go until the next holder has its lease.
    fn mark(&mut self, c: usize) {
        self.by = Some(c);
        self.at = Some(Instant::now());
    }
}

/// One contended cycle: wait for the shared name, hold it for a moment, release it.
async fn contended_cycle(server: Arc<Server>, last: Arc<Mutex<LastRelease>>, c: usize) -> Tally {
    contended_on(server, "hot", &last, c).await
}

/// One contended cycle on `name`.
async fn contended_on(
    server: Arc<Server>,
    name: &str,
    last: &Mutex<LastRelease>,
    c: usize,
) -> Tally {
    let t = Instant::now();
    let granted = server
        .grant(name, json!({"ttl_ms": 10000, "wait_ms": 5000}))
        .await;
    let got = Instant::now();
    let (id, _) = match granted {
        Ok(lease) => lease,
        Err(409) => {
            return Tally {
                timeouts: 1,
                ..Tally::default()
            };
        }
        Err(_) => return Tally::error(),
    };
    let mut tally = Tally::cycle(got - t, 0);
    last.lock().await.count(c, got, &mut tally);
    last.lock().await.mark(c);
    if !server.revoke(name, &id).await {
        tally.errors += 1;
    }
    tally
}

// ---------------------------------------------------------------------------------------
// Hand-off for every kind, across two replicas

/// What one client of a contended row asks for: its route (`locks`, `semaphores`,
/// `elections`), the name in its path (empty for several names), its body, and the name
/// its lease is revoked through.
#[derive(Clone)]
struct Ask {
    route: &'static str,
    name: &'static str,
    body: Value,
    revoke: &'static str,
}

impl Ask {
    fn lock(name: &'static str) -> Self {
        Self {
            route: "locks",
            name,
            body: json!({}),
            revoke: name,
        }
    }

    fn shared(name: &'static str) -> Self {
        Self {
            body: json!({"mode": "shared"}),
            ..Self::lock(name)
        }
    }

    fn names(names: [&'static str; 2]) -> Self {
        Self {
            route: "locks",
            name: "",
            body: json!({"names": names}),
            revoke: names[0],
        }
    }

    fn permit(name: &'static str, limit: u16) -> Self {
        Self {
            route: "semaphores",
            body: json!({"limit": limit}),
            ..Self::lock(name)
        }
    }

    fn campaign(name: &'static str) -> Self {
        Self {
            route: "elections",
            body: json!({"value": "bench"}),
            ..Self::lock(name)
        }
    }
}

/// A contended row's shared state: who waits since when, and the last release.
#[derive(Default)]
struct Contest {
    /// Each waiting client's arrival.
    waiting: std::collections::HashMap<usize, Instant>,
    last: LastRelease,
    /// Grants made while a client that arrived earlier still waited.
    out_of_order: usize,
}

/// One cycle of a contended row: ask (waiting up to 5 s), hold 1 ms, revoke. The
/// hand-off is the time from the last release to this grant, for a grant that arrived
/// before that release (it was waiting for it).
async fn contest_cycle(
    servers: Arc<[Server; 2]>,
    asks: Arc<Vec<Ask>>,
    contest: Arc<Mutex<Contest>>,
    c: usize,
) -> Tally {
    let (server, ask) = (&servers[c % 2], &asks[c % asks.len()]);
    let mut body = ask.body.clone();
    body["ttl_ms"] = json!(10_000);
    body["wait_ms"] = json!(5_000);
    let arrived = Instant::now();
    contest.lock().await.waiting.insert(c, arrived);
    let granted = server.grant_in(ask.route, ask.name, body).await;
    let got = Instant::now();
    let mut tally = {
        let mut contest = contest.lock().await;
        contest.waiting.remove(&c);
        match granted {
            Ok(_) => {
                if contest.waiting.values().any(|a| *a < arrived) {
                    contest.out_of_order += 1;
                }
                let mut tally = Tally::cycle(got - arrived, 0);
                if let Some(at) = contest.last.at.filter(|at| *at > arrived) {
                    if contest.last.by == Some(c) {
                        tally.regrants = 1;
                    } else {
                        tally.handoffs.push(got.saturating_duration_since(at));
                    }
                }
                tally
            }
            Err(409) => {
                return Tally {
                    timeouts: 1,
                    grants: vec![got - arrived],
                    ..Tally::default()
                };
            }
            Err(_) => return Tally::error(),
        }
    };
    let Ok((id, _)) = granted else {
        unreachable!("answered above")
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    {
        let mut contest = contest.lock().await;
        contest.last.by = Some(c);
        contest.last.at = Some(Instant::now());
    }
    if !server.revoke_in(ask.route, ask.revoke, &id).await {
        tally.errors += 1;
    }
    tally
}

/// Contended rows for every kind, 16 clients split over two replicas (even clients on
/// the first, odd on the second): hand-off p50/p99, the longest wait, timeouts, and the
/// share of grants made while a client that arrived earlier still waited.
async fn handoff_per_kind(masters: &[RedisMaster], plan: Plan) {
    let servers = Arc::new([Server::start(masters).await, Server::start(masters).await]);
    println!(
        "| kind (16 clients, two replicas) | grants/s | hand-off p50 / p99 ms | longest wait ms | timeouts / errors | served out of arrival order |"
    );
    println!("|---|---|---|---|---|---|");
    let rows: Vec<(&str, Vec<Ask>)> = vec![
        ("one lock", vec![Ask::lock("k1")]),
        (
            "two names, opposite orders",
            vec![Ask::names(["k2a", "k2b"]), Ask::names(["k2b", "k2a"])],
        ),
        (
            "two names against single names",
            vec![
                Ask::names(["k3a", "k3b"]),
                Ask::lock("k3a"),
                Ask::names(["k3b", "k3a"]),
                Ask::lock("k3b"),
            ],
        ),
        (
            "shared against exclusive",
            vec![
                Ask::shared("k4"),
                Ask::shared("k4"),
                Ask::lock("k4"),
                Ask::lock("k4"),
            ],
        ),
        ("permits, limit 1", vec![Ask::permit("k5", 1)]),
        ("permits, limit 4", vec![Ask::permit("k6", 4)]),
        ("campaigns", vec![Ask::campaign("k7")]),
    ];
    for (label, asks) in rows {
        let contest = Arc::new(Mutex::new(Contest::default()));
        let (servers, asks) = (servers.clone(), Arc::new(asks));
        let c2 = contest.clone();
        let started = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|c| {
                let (servers, asks, contest) = (servers.clone(), asks.clone(), c2.clone());
                let deadline = started + plan.row;
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    while Instant::now() < deadline {
                        tally.merge(
                            contest_cycle(servers.clone(), asks.clone(), contest.clone(), c).await,
                        );
                    }
                    tally
                })
            })
            .collect();
        let mut tally = Tally::default();
        for t in tasks {
            tally.merge(t.await.expect("client"));
        }
        let took = started.elapsed();
        tally.grants.sort_unstable();
        tally.handoffs.sort_unstable();
        let out_of_order = contest.lock().await.out_of_order;
        println!(
            "| {label} | {:.0} | {:.2} / {:.2} | {:.0} | {} / {} | {:.1} % |",
            tally.cycles as f64 / took.as_secs_f64(),
            ms(pct(&tally.handoffs, 0.5)),
            ms(pct(&tally.handoffs, 0.99)),
            ms(tally.grants.last().copied().unwrap_or_default()),
            tally.timeouts,
            tally.errors,
            100.0 * out_of_order as f64 / tally.cycles.max(1) as f64,
        );
    }
}

/// Issue 33's loop, `runs` times over two replica processes: three clients, 60 grants each
/// of the same two names (`ttl_ms` 5000, `wait_ms` 4000), one listing them `[p, q]` on the
/// first replica, one `[q, p]` on the second, one `[q, p]` on the first; each holds 5 ms and
/// revokes. Prints each run's longest wait and refusals.
async fn opposite_orders(masters: &[RedisMaster], runs: usize) {
    let servers = Arc::new([Server::start(masters).await, Server::start(masters).await]);
    let mut worst = Duration::ZERO;
    let mut refused = 0;
    let mut waits = Vec::new();
    for run in 0..runs {
        let (p, q) = (format!("loop{run}:p"), format!("loop{run}:q"));
        let clients = [
            (0, [p.clone(), q.clone()]),
            (1, [q.clone(), p.clone()]),
            (0, [q.clone(), p.clone()]),
        ];
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|(on, names)| {
                let servers = servers.clone();
                tokio::spawn(async move {
                    let server = &servers[on];
                    let (mut waits, mut refused) = (Vec::new(), 0);
                    for _ in 0..60 {
                        let body = json!({"names": names, "ttl_ms": 5000, "wait_ms": 4000});
                        let asked = Instant::now();
                        let granted = server.grant_in("locks", "", body).await;
                        waits.push(asked.elapsed());
                        match granted {
                            Ok((id, _)) => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                server.revoke(&names[0], &id).await;
                            }
                            Err(_) => refused += 1,
                        }
                    }
                    (waits, refused)
                })
            })
            .collect();
        let mut longest = Duration::ZERO;
        let mut no = 0;
        for t in tasks {
            let (w, r) = t.await.expect("client");
            longest = longest.max(w.iter().copied().max().unwrap_or_default());
            waits.extend(w);
            no += r;
        }
        println!(
            "- run {}: longest wait {:.1} ms, {no} of 180 refused",
            run + 1,
            ms(longest)
        );
        worst = worst.max(longest);
        refused += no;
    }
    waits.sort_unstable();
    println!(
        "\n{runs} runs: longest wait {:.1} ms, wait p50 / p99 {:.2} / {:.2} ms, {refused} refused\n",
        ms(worst),
        ms(pct(&waits, 0.5)),
        ms(pct(&waits, 0.99)),
    );
}

// ---------------------------------------------------------------------------------------
// Scale

/// Run `work(worker, i)` for every `i` below `count`, over 64 concurrent workers; the
/// number of calls that returned false.
async fn spread<F, Fut>(count: usize, work: F) -> usize
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    spread_over(64, count, work).await
}

/// [`spread`] over `width` workers.
async fn spread_over<F, Fut>(width: usize, count: usize, work: F) -> usize
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..width)
        .map(|w| {
            let (work, next, failed) = (work.clone(), next.clone(), failed.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    if !work(w, i).await {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    failed.load(Ordering::Relaxed)
}

/// Hold `count` leases through redlockd and report its memory per lease.
async fn redlockd_memory_per_lease(masters: &[RedisMaster], count: usize) {
    let server = Arc::new(Server::start(masters).await);
    let before = rss_of(server.pid());
    let started = Instant::now();
    let s = server.clone();
    let failed = spread(count, move |_, i| {
        let server = s.clone();
        async move {
            let name = format!("kept:{i:07}");
            server.grant(&name, json!({"ttl_ms": 600000})).await.is_ok()
        }
    })
    .await;
    let after = rss_of(server.pid());
    println!(
        "- {count} leases held through redlockd (granted in {:.1} s{}): redlockd memory {:.0} bytes per lease ({:.1} MiB resident in all)",
        started.elapsed().as_secs_f64(),
        if failed > 0 {
            ", some grants failed"
        } else {
            ""
        },
        after.saturating_sub(before) as f64 / count as f64,
        after as f64 / (1 << 20) as f64,
    );
}

// ---------------------------------------------------------------------------------------

fn pids(masters: &[RedisMaster]) -> Vec<u32> {
    masters.iter().map(RedisMaster::pid).collect()
}

fn start_masters(n: usize) -> Vec<RedisMaster> {
    (0..n).map(|_| RedisMaster::start()).collect()
}

/// The uncontended rows of one master set: plain Redlock, the project's scripts, the engine
/// and redlockd over HTTP at each client count, each divided by plain Redlock. What each
/// cost inside Redis per cycle (16 clients) is returned, to print under the table.
async fn uncontended(
    masters: &[RedisMaster],
    clients: &[usize],
    plan: Plan,
    tag: &str,
) -> Vec<String> {
    let mut notes = Vec::new();
    let plain = Plain::new(masters).await;
    let limit = Limit::new(masters);
    let redlock = engine(masters);
    let nodes = redlock.nodes().to_vec();
    redlock.monitor().probe_round(&nodes).await;
    let server = Arc::new(Server::start(masters).await);
    let embedded = Arc::new(Server::start(&[]).await);
    let bare = Arc::new(Server::start_bare().await);
    let bare_redlock = [
        (
            "plain Redlock behind bare axum",
            Arc::new(Server::start_bare_redlock(masters, false).await),
        ),
        (
            "fenced Redlock behind bare axum",
            Arc::new(Server::start_bare_redlock(masters, true).await),
        ),
    ];
    let (peer_tmpfs, peer_disk, peer_alone) = match tag.is_empty() {
        true => (
            etcd::Etcd::start(3, false).await.map(Arc::new),
            etcd::Etcd::start(3, true).await.map(Arc::new),
            etcd::Etcd::start(1, false).await.map(Arc::new),
        ),
        false => (None, None, None),
    };
    let (me, redis) = ([std::process::id()], pids(masters));
    let mine = Setup {
        length: plan.row,
        service: &me,
        masters: &redis,
    };
    let theirs = Setup {
        service: &[server.pid()],
        ..mine
    };
    for &c in clients {
        let workload = format!("uncontended, {c} clients{tag}");
        let mut plain_us = None;
        let mut stats = async |row: &Row| {
            if c == 16 {
                // Plain Redlock's grant is a SET of its own; its release, a script.
                let direct: &[&str] = if plain_us.is_none() { &["set"] } else { &[] };
                let (us, each) = commandstats_per_cycle(masters, row.tally.cycles, direct).await;
                let ratio = match plain_us {
                    Some(plain) if plain > 0.0 => format!(", {:.1}× plain Redlock's", us / plain),
                    _ => String::new(),
                };
                plain_us.get_or_insert(us);
                notes.push(format!(
                    "- {} ({workload}): {us:.1} µs in Redis per cycle (all masters){ratio}; {each}",
                    row.system
                ));
            }
            commandstats_reset(masters).await;
        };
        commandstats_reset(masters).await;
        let p = plain.clone();
        let row = measure(
            "plain Redlock",
            workload.clone(),
            c,
            &mine,
            None,
            move |i| {
                let p = p.clone();
                async move { p.cycle(i).await }
            },
        )
        .await;
        let base = row.rate();
        stats(&row).await;
        let l = limit.clone();
        let row = measure(
            "scripts",
            workload.clone(),
            c,
            &mine,
            Some(base),
            move |i| limit_cycle(l.clone(), i, 0),
        )
        .await;
        stats(&row).await;
        let e = redlock.clone();
        let row = measure("engine", workload.clone(), c, &mine, Some(base), move |i| {
            engine_cycle(e.clone(), i)
        })
        .await;
        stats(&row).await;
        let s = server.clone();
        let row = measure(
            "redlockd",
            workload.clone(),
            c,
            &theirs,
            Some(base),
            move |i| http_cycle(s.clone(), i, 0),
        )
        .await;
        stats(&row).await;
        // Each kind's cost next to a lock's: a semaphore's permit, a shared lease and a lease
        // on two names, at 16 clients.
        if c == 16 {
            let s = server.clone();
            let row = measure(
                "redlockd, semaphore permit",
                workload.clone(),
                c,
                &theirs,
                Some(base),
                move |i| permit_cycle(s.clone(), i),
            )
            .await;
            stats(&row).await;
            let s = server.clone();
            let row = measure(
                "redlockd, shared lock",
                workload.clone(),
                c,
                &theirs,
                Some(base),
                move |i| shared_cycle(s.clone(), i),
            )
            .await;
            stats(&row).await;
            let s = server.clone();
            let row = measure(
                "redlockd, two names at once",
                workload.clone(),
                c,
                &theirs,
                Some(base),
                move |i| group_cycle(s.clone(), i),
            )
            .await;
            stats(&row).await;
        }
        // The same requests to a redlockd with no masters at all (its embedded store): what
        // the HTTP path, the lease service and this load generator cost by themselves on
        // these cores, the floor under the redlockd row (once: it has no masters to scale).
        if !tag.is_empty() {
            continue;
        }
        // And the HTTP ceiling: the same requests to a bare axum server (`bare_server`).
        for (label, floor) in [
            ("redlockd, embedded store", &embedded),
            ("bare axum, canned answers", &bare),
        ] {
            let s = floor.clone();
            let at = Setup {
                service: &[floor.pid()],
                masters: &[],
                ..mine
            };
            measure(label, workload.clone(), c, &at, Some(base), move |i| {
                http_cycle(s.clone(), i, 0)
            })
            .await;
        }
        // And the floors under redlockd's own row: plain Redlock behind that bare router,
        // then the same with a marker and a fencing token (what README's guarantees need).
        for (label, floor) in &bare_redlock {
            let s = floor.clone();
            let at = Setup {
                service: &[floor.pid()],
                ..mine
            };
            measure(label, workload.clone(), c, &at, Some(base), move |i| {
                http_cycle(s.clone(), i, 0)
            })
            .await;
        }
        // And the peer: etcd's lock API on three members (its data on tmpfs, as the masters
        // keep none on disk), and at 16 clients etcd as shipped, its data on disk, and one
        // member alone (no replication: what a single etcd costs).
        for (label, peer) in [
            ("etcd 3.4, 3 members", Some(&peer_tmpfs)),
            (
                "etcd 3.4, 3 members, data on disk",
                (c == 16).then_some(&peer_disk),
            ),
            ("etcd 3.4, 1 member", (c == 16).then_some(&peer_alone)),
        ] {
            let Some(Some(peer)) = peer else { continue };
            let pids = peer.pids();
            let at = Setup {
                service: &pids,
                masters: &[],
                ..mine
            };
            let e = peer.clone();
            measure(label, workload.clone(), c, &at, Some(base), move |i| {
                etcd::etcd_cycle(e.clone(), i)
            })
            .await;
        }
        commandstats_reset(masters).await;
    }
    notes
}

/// `REDLOCKD_BENCH_AB="K=V ..."`: the 16-client HTTP row (`REDLOCKD_BENCH_AB_CLIENTS=N`:
/// N clients) on two redlockd processes over the same masters, one as configured and one
/// with these variables, so that a change is compared within one run rather than across
/// noisy runs. With `REDLOCKD_BENCH_AB_BIN=<path>`, B is that redlockd binary (a build of an
/// earlier commit, say), so that a change is measured against what came before in one run.
///
/// Four rounds, each a plain Redlock row and then A and B, and each of A and B first in two
/// of them: the same two builds, measured with one first and then the other, differed by
/// 8 % one way and 4 % the other (docs/performance.md), so a fixed order can credit B with
/// what is only its place. The last lines are each side's means over its four rows.
async fn ab(masters: &[RedisMaster], b_env: &str, plan: Plan) {
    let a = Arc::new(Server::start_with(masters, "").await);
    let urls: Vec<String> = masters.iter().map(RedisMaster::url).collect();
    let b_bin = std::env::var("REDLOCKD_BENCH_AB_BIN").unwrap_or_else(|_| BIN.to_owned());
    let b = Arc::new(Server::start_binary(&b_bin, &urls, b_env).await);
    let redis = pids(masters);
    let clients = std::env::var("REDLOCKD_BENCH_AB_CLIENTS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(16);
    // Each round begins with plain Redlock, so that A's and B's ratios to it come from the
    // same minute of the machine as the rows themselves.
    let plain = Plain::new(masters).await;
    let me = [std::process::id()];
    let sides = [(&a, "A: as configured"), (&b, "B: with the variables")];
    let mut sums = [AbSum::default(), AbSum::default()];
    print_header();
    for round in 0..4 {
        let p = plain.clone();
        let base = measure(
            "plain Redlock",
            format!("uncontended, {clients} clients"),
            clients,
            &Setup {
                length: plan.row,
                service: &me,
                masters: &redis,
            },
            None,
            move |i| {
                let p = p.clone();
                async move { p.cycle(i).await }
            },
        )
        .await;
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (server, label) = sides[side];
            let at = Setup {
                length: plan.row,
                service: &[server.pid()],
                masters: &redis,
            };
            let s = server.clone();
            let workload = format!("uncontended, {clients} clients, {label}");
            let row = measure(
                "redlockd",
                workload,
                clients,
                &at,
                Some(base.rate()),
                move |i| http_cycle(s.clone(), i, 0),
            )
            .await;
            sums[side].add(&row, &base);
        }
    }
    println!();
    for ((_, label), sum) in sides.iter().zip(&sums) {
        println!("{label}: {}", sum.summary());
    }
    let (a_cpu, b_cpu) = (sums[0].cpu_per_cycle(), sums[1].cpu_per_cycle());
    if a_cpu > 0.0 {
        println!(
            "B against A: CPU per cycle {:+.1} %, cycles/s {:+.1} %",
            (b_cpu / a_cpu - 1.0) * 100.0,
            (sums[1].rate / sums[0].rate - 1.0) * 100.0,
        );
    }
}

/// One side of an A/B run, summed over its rows.
#[derive(Default)]
struct AbSum {
    rows: usize,
    rate: f64,
    ratio: f64,
    service_us: f64,
    masters_us: f64,
    cpu_ratio: f64,
}

impl AbSum {
    fn add(&mut self, row: &Row, plain: &Row) {
        let per_cycle = |r: &Row, d: Duration| d.as_secs_f64() * 1e6 / r.tally.cycles.max(1) as f64;
        let plain_cpu = per_cycle(plain, plain.service_cpu) + per_cycle(plain, plain.masters_cpu);
        let service = per_cycle(row, row.service_cpu);
        let masters = per_cycle(row, row.masters_cpu);
        self.rows += 1;
        self.rate += row.rate();
        self.ratio += row.rate() / plain.rate().max(f64::MIN_POSITIVE);
        self.service_us += service;
        self.masters_us += masters;
        self.cpu_ratio += (service + masters) / plain_cpu.max(f64::MIN_POSITIVE);
    }

    fn cpu_per_cycle(&self) -> f64 {
        (self.service_us + self.masters_us) / self.rows.max(1) as f64
    }

    fn summary(&self) -> String {
        let n = self.rows.max(1) as f64;
        format!(
            "mean of {} rows: {:.0} cycles/s ({:.2}× plain Redlock), CPU µs per cycle {:.0} service + {:.0} masters ({:.2}× plain Redlock's)",
            self.rows,
            self.rate / n,
            self.ratio / n,
            self.service_us / n,
            self.masters_us / n,
            self.cpu_ratio / n,
        )
    }
}

/// Three Redis Clusters of three shards as the masters, next to three single masters:
/// cycles/s of redlockd over each, and what each shard's process spent per cycle (the
/// point of a cluster: each shard carries a share of the work).
async fn clusters_next_to_masters(masters: &[RedisMaster], plan: Plan) {
    let clusters: Vec<common::RedisCluster> =
        (0..3).map(|_| common::RedisCluster::start(3)).collect();
    let urls: Vec<String> = clusters.iter().map(common::RedisCluster::url).collect();
    let extra = std::env::var("REDLOCKD_BENCH_SERVER_ENV").unwrap_or_default();
    let over_clusters = Arc::new(Server::start_over(&urls, &extra).await);
    let over_masters = Arc::new(Server::start(masters).await);
    let shard_pids: Vec<u32> = clusters
        .iter()
        .flat_map(|c| c.shards.iter().map(RedisMaster::pid))
        .collect();
    print_header();
    let single = Setup {
        length: plan.row,
        service: &[over_masters.pid()],
        masters: &pids(masters),
    };
    let s = over_masters.clone();
    commandstats_reset(masters).await;
    let single_row = measure(
        "redlockd, 3 single masters",
        "uncontended, 16 clients".into(),
        16,
        &single,
        None,
        move |c| http_cycle(s.clone(), c, 0),
    )
    .await;
    let base = single_row.rate();
    let (single_inside, single_each) =
        commandstats_per_cycle(masters, single_row.tally.cycles, &[]).await;
    let shards: Vec<&RedisMaster> = clusters.iter().flat_map(|c| c.shards.iter()).collect();
    // The replica subscribes to every slot's two shard channels (16 384 `SSUBSCRIBE`s a
    // cluster) when it starts; that burst is a start's cost, not a cycle's, so the row waits
    // for it to end.
    let everything = clusters.len() * 2 * 16_384;
    let subscribed = async || {
        let mut channels = 0;
        for shard in &shards {
            let names: Vec<String> = shard
                .cmd(&["PUBSUB", "SHARDCHANNELS"])
                .await
                .unwrap_or_default();
            channels += names.len();
        }
        channels
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut channels = subscribed().await;
    while channels < everything && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        channels = subscribed().await;
    }
    if channels < everything {
        println!(
            "(the replica's shard channels: {channels} of {everything} subscribed after 120 s)"
        );
    }
    commandstats_reset(shards.iter().copied()).await;
    let before: Vec<Duration> = shard_pids.iter().map(|p| cpu_of(*p)).collect();
    let clustered = Setup {
        length: plan.row,
        service: &[over_clusters.pid()],
        masters: &shard_pids,
    };
    let s = over_clusters.clone();
    let row = measure(
        "redlockd, 3 clusters × 3 shards",
        "uncontended, 16 clients (× the single masters)".into(),
        16,
        &clustered,
        Some(base),
        move |c| http_cycle(s.clone(), c, 0),
    )
    .await;
    let per_cycle: Vec<String> = shard_pids
        .iter()
        .zip(before)
        .map(|(pid, was)| {
            let used = cpu_of(*pid).saturating_sub(was);
            let us = used.as_secs_f64() * 1e6 / row.tally.cycles.max(1) as f64;
            format!("{us:.0}")
        })
        .collect();
    println!(
        "\nCPU of each shard per cycle over the clusters, µs (cluster by cluster, three shards each; 10 ms ticks): {}\n",
        per_cycle
            .chunks(3)
            .map(|c| c.join(" / "))
            .collect::<Vec<_>>()
            .join(" · ")
    );
    let (clustered_inside, clustered_each) =
        commandstats_per_cycle(shards.iter().copied(), row.tally.cycles, &[]).await;
    println!(
        "Inside Redis per cycle (`INFO commandstats`; `evalsha` includes the commands its \
         script calls): 3 single masters {single_inside:.1} µs ({single_each}); 3 clusters \
         {clustered_inside:.1} µs ({clustered_each}): {:.2}×\n",
        clustered_inside / single_inside.max(f64::MIN_POSITIVE)
    );
}

#[tokio::main]
async fn main() {
    if cfg!(redis_missing) {
        eprintln!("grant bench: skipped, no redis-server installed (build.rs)");
        return;
    }
    if std::env::var_os("REDLOCKD_BENCH_BARE").is_some() {
        bare_server().await;
        return;
    }
    let plan = Plan::from_env();
    if let Ok(b_env) = std::env::var("REDLOCKD_BENCH_AB") {
        let masters = start_masters(3);
        let redlock = engine(&masters);
        let nodes = redlock.nodes().to_vec();
        redlock.monitor().probe_round(&nodes).await;
        println!("# A/B: B runs with {b_env}\n");
        ab(&masters, &b_env, plan).await;
        return;
    }
    println!(
        "# redlockd side-by-side benchmark: {} cores, redis-server masters on loopback, {} s a row\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        plan.row.as_secs_f64()
    );
    let masters = start_masters(3);
    println!("{}\n", calibration(&masters[0], plan.calibration).await);
    let _run = Run {
        machine: MachineTicks::now(),
    };
    let redis = pids(&masters);
    let only = std::env::var("REDLOCKD_BENCH_ONLY").unwrap_or_default();
    if only == "streams" {
        scale::streams_only(&scale::Scale::from_env()).await;
        return;
    }
    if only == "scale" {
        scale::scale(&scale::Scale::from_env()).await;
        return;
    }
    if only == "clusters" {
        clusters_next_to_masters(&masters, plan).await;
        return;
    }
    if only == "kinds" {
        handoff_per_kind(&masters, plan).await;
        return;
    }
    if matches!(only.as_str(), "" | "uncontended" | "inside") {
        println!("Inside one master: what dealing steps out costs against what they do:\n");
        inside_redis(&masters[0], plan.inside_cycles, plan.inside_rounds).await;
        if only == "inside" {
            return;
        }
    }
    if only == "opposite" {
        println!("Two names in opposite orders on two replicas (issue 33's loop):\n");
        opposite_orders(&masters, plan.runs).await;
        return;
    }
    print_header();
    if only != "contended" {
        let notes = uncontended(&masters, &[1, 16, 64], plan, "").await;
        println!(
            "\nInside Redis, per grant + release cycle (`INFO commandstats`, three masters; a \
             script's time includes the calls it runs, listed after it by name):\n"
        );
        for note in notes {
            println!("{note}");
        }
        println!();
        if only == "uncontended" {
            return;
        }
        print_header();
    }

    let server = Arc::new(Server::start(&masters).await);
    let me = [std::process::id()];
    let mine = Setup {
        length: plan.row,
        service: &me,
        masters: &redis,
    };
    let theirs = Setup {
        service: &[server.pid()],
        ..mine
    };

    // 16 clients on one name, each waiting for it.
    let last = Arc::new(Mutex::new(LastRelease::default()));
    let s = server.clone();
    let mut contended = measure(
        "redlockd",
        "one name, 16 waiting clients".into(),
        16,
        &theirs,
        None,
        move |c| contended_cycle(s.clone(), last.clone(), c),
    )
    .await;
    contended.tally.handoffs.sort_unstable();
    let handoff_p50 = pct(&contended.tally.handoffs, 0.5);
    let contended_rate = contended.rate();
    // The peer on the same workload: etcd's lock API, three members.
    if let Some(peer) = etcd::Etcd::start(3, false).await.map(Arc::new) {
        let pids = peer.pids();
        let at = Setup {
            service: &pids,
            masters: &[],
            ..mine
        };
        let last = Arc::new(Mutex::new(LastRelease::default()));
        measure(
            "etcd 3.4, 3 members",
            "one name, 16 waiting clients".into(),
            16,
            &at,
            None,
            move |c| etcd::etcd_contended_cycle(peer.clone(), last.clone(), c),
        )
        .await;
    }

    // Renew-heavy: each grant renewed ten times.
    let workload = "grant, 10 renews, release; 16 clients";
    let limit = Limit::new(&masters);
    let base = measure("scripts", workload.into(), 16, &mine, None, move |c| {
        limit_cycle(limit.clone(), c, 10)
    })
    .await
    .rate();
    let s = server.clone();
    measure(
        "redlockd",
        workload.into(),
        16,
        &theirs,
        Some(base),
        move |c| http_cycle(s.clone(), c, 10),
    )
    .await;
    // Keeping many holds alive: each renewed on its own, or all through one session.
    let workload = format!("keep {KEPT} holds alive once; 16 clients");
    let s = server.clone();
    let leases = Arc::new(Kept::new(16));
    let base = measure(
        "redlockd, lease renews",
        workload.clone(),
        16,
        &theirs,
        None,
        move |c| keepalive_cycle(s.clone(), leases.clone(), c, false),
    )
    .await
    .rate();
    let s = server.clone();
    let sessions = Arc::new(Kept::new(16));
    measure(
        "redlockd, one session renew",
        workload,
        16,
        &theirs,
        Some(base),
        move |c| keepalive_cycle(s.clone(), sessions.clone(), c, true),
    )
    .await;
    drop(server);
    println!("\nHand-off for every kind, across two replicas:\n");
    handoff_per_kind(&masters, plan).await;
    println!("\nTwo names in opposite orders on two replicas (issue 33's loop):\n");
    opposite_orders(&masters, plan.runs).await;
    if only == "contended" {
        return;
    }

    println!();
    if !handoff_p50.is_zero() {
        println!(
            "Contended: {contended_rate:.0} cycles/s against 1 / hand-off p50 = {:.0}/s ({:.0} %).",
            1.0 / handoff_p50.as_secs_f64(),
            100.0 * contended_rate * handoff_p50.as_secs_f64()
        );
    }

    println!("\n## Redis Clusters as masters\n");
    clusters_next_to_masters(&masters, plan).await;

    println!("\n## Scale\n");
    print_header();
    for n in [5, 7] {
        let set = start_masters(n);
        uncontended(&set, &[16], plan, &format!(", {n} masters")).await;
    }
    println!();
    {
        let set = start_masters(3);
        redlockd_memory_per_lease(&set, plan.names_held_http).await;
    }
    println!();
    scale::scale(&scale::Scale::from_env()).await;
}
