//! `redlockd lock -- cmd`, `inspect` and `list`, as cron and an operator run them: the
//! binary in client mode against two replicas on three real masters.

use crate::common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{RedisMaster, TestApp, config, masters, wait_for};
use serde_json::json;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");

/// Exit statuses of `redlockd lock` (docs/cli.md).
const USAGE: i32 = 64;
const HELD: i32 = 75;
const LOST: i32 = 76;

struct Bed {
    masters: Vec<RedisMaster>,
    replicas: Vec<TestApp>,
    dir: tempfile::TempDir,
}

impl Bed {
    async fn start() -> Self {
        let masters = masters(3);
        let mut cfg = config(&masters);
        // Pausing masters must make renews fail fast, not hang.
        cfg.master_timeout_ms = 100;
        let mut replicas = Vec::new();
        for _ in 0..2 {
            replicas.push(TestApp::spawn(cfg.clone()).await);
        }
        Self {
            masters,
            replicas,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// `redlockd <args>` with both replicas as servers, a dead address first so that every
    /// call fails over at least once.
    fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "REDLOCKD_SERVER",
                format!(
                    "http://127.0.0.1:{},{},{}",
                    closed_port(),
                    self.replicas[0].base,
                    self.replicas[1].base
                ),
            )
            .current_dir(self.dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    async fn run(&self, args: &[&str]) -> Output {
        common::within(
            Duration::from_secs(30),
            self.cli(args).output(),
            "redlockd exits",
        )
        .await
        .expect("run redlockd")
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }

    async fn appears(&self, file: &str) {
        let path = self.path(file);
        wait_for(
            &format!("{file} to appear"),
            Duration::from_secs(10),
            async || path.exists().then_some(()),
        )
        .await;
    }

    /// The process id a command wrote to `file` (`echo $! > file`), once it is all there:
    /// the shell creates the file before `echo` writes to it, so its mere existence is not
    /// enough (an empty id reads as a process that never dies).
    async fn pid_in(&self, file: &str) -> String {
        let path = self.path(file);
        wait_for(
            &format!("a process id in {file}"),
            Duration::from_secs(10),
            async || {
                let text = std::fs::read_to_string(&path).ok()?;
                let line = text.strip_suffix('\n')?;
                line.parse::<u32>().ok().map(|_| line.to_owned())
            },
        )
        .await
    }

    /// Renews answered ok, on every replica.
    async fn renews(&self) -> u64 {
        let line = r#"redlockd_requests_total{kind="lock",op="renew",outcome="ok"} "#;
        let mut total = 0;
        for replica in &self.replicas {
            let metrics = replica.text("/metrics").await;
            total += metrics
                .lines()
                .find_map(|l| l.strip_prefix(line)?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        total
    }

    /// Whether a majority says the lock is held, asked of the last replica.
    async fn held(&self, name: &str) -> bool {
        let (status, body) = self.replicas.last().expect("a replica").inspect(name).await;
        assert_eq!(status, 200, "{body}");
        body["held"] == json!(true)
    }
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not signalled")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn alive(pid: &str) -> bool {
    Path::new(&format!("/proc/{}", pid.trim())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn the_command_runs_with_the_lease_in_its_environment_and_its_exit_releases_the_lock() {
    let bed = Bed::start().await;
    let out = bed
        .run(&[
            "lock",
            "--ttl",
            "2s",
            "jobs:a",
            "--",
            "sh",
            "-c",
            r#"echo "$REDLOCKD_LOCK_NAME $REDLOCKD_FENCING_TOKEN $REDLOCKD_LEASE_ID"; exit 7"#,
        ])
        .await;
    assert_eq!(code(&out), 7, "the command's own status: {}", stderr(&out));
    let seen = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{seen}");
    assert_eq!(fields[0], "jobs:a");
    let token: u64 = fields[1].parse().expect("a token");
    assert!(token > 0);
    assert_eq!(fields[2].len(), 22, "a lease id");
    assert!(
        !bed.held("jobs:a").await,
        "released when the command exited"
    );

    // The next run gets a greater token.
    let out = bed
        .run(&[
            "lock",
            "jobs:a",
            "--",
            "sh",
            "-c",
            "echo $REDLOCKD_FENCING_TOKEN",
        ])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let next: u64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > token);
    assert!(!bed.held("jobs:a").await);
}

#[tokio::test]
async fn a_lock_delay_is_reported_as_one_that_ends_when_it_says() {
    let bed = Bed::start().await;
    bed.replicas[0]
        .must_grant("jobs:d", json!({"ttl_ms": 200, "lock_delay_ms": 30000}))
        .await;
    // The lease lapses (no renew): its lock-delay starts, and no renew can shorten or
    // lengthen it.
    let out = common::wait_for(
        "the lease to lapse into its lock-delay",
        Duration::from_secs(10),
        async || {
            let out = bed.run(&["lock", "jobs:d", "--", "true"]).await;
            stderr(&out).contains("lock-delay").then_some(out)
        },
    )
    .await;
    assert_eq!(code(&out), HELD, "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("free in about"), "{said}");
    assert!(
        !said.contains("unless renewed"),
        "a lock-delay cannot be renewed: {said}"
    );
    // Inspect says the name is free and that a lock-delay refuses it meanwhile.
    let shown = String::from_utf8(bed.run(&["inspect", "jobs:d"]).await.stdout).unwrap();
    assert!(
        shown.starts_with("jobs:d is free, but a lock-delay refuses grants of it for "),
        "{shown}"
    );
}

#[tokio::test]
async fn a_held_lock_exits_held_or_waits_and_signals_reach_the_command() {
    let bed = Bed::start().await;
    // The first holder leaves on SIGTERM, which reaches it through redlockd lock.
    let mut first = bed
        .cli(&[
            "lock",
            "--ttl",
            "1s",
            "jobs:b",
            "--",
            "sh",
            "-c",
            r#"trap 'echo term > got-term; exit 0' TERM; touch started; while :; do sleep 0.05; done"#,
        ])
        .spawn()
        .unwrap();
    bed.appears("started").await;

    let out = bed.run(&["lock", "jobs:b", "--", "touch", "ran"]).await;
    assert_eq!(code(&out), HELD, "{}", stderr(&out));
    assert!(stderr(&out).contains("held by another lease"));
    let out = bed
        .run(&[
            "lock",
            "--held-exit-code",
            "0",
            "jobs:b",
            "--",
            "touch",
            "ran",
        ])
        .await;
    assert_eq!(code(&out), 0, "cron may treat held as success");
    assert!(
        !bed.path("ran").exists(),
        "the command ran without the lock"
    );

    // Held across several renews (a third of the 1 s TTL), then handed over on exit.
    let waiter = bed
        .cli(&["lock", "--wait", "20s", "jobs:b", "--", "touch", "ran"])
        .spawn()
        .unwrap();
    // Queued (the two refused runs above were the first contended grants), and then past
    // three more renews of the first holder's 1 s lease: longer than its TTL.
    bed.replicas[0].wait_for_contention("jobs", 3).await;
    let renewed = bed.renews().await;
    wait_for("three more renews", Duration::from_secs(5), async || {
        (bed.renews().await >= renewed + 3).then_some(())
    })
    .await;
    assert!(
        !bed.path("ran").exists(),
        "the waiter ran while the first held the lock"
    );
    common::signal(first.id().expect("running"), "-TERM");
    let status = common::within(Duration::from_secs(10), first.wait(), "first exits")
        .await
        .unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "the command's own status after its trap"
    );
    assert!(bed.path("got-term").exists(), "SIGTERM was forwarded");
    let out = common::within(
        Duration::from_secs(10),
        waiter.wait_with_output(),
        "the waiter exits",
    )
    .await
    .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(bed.path("ran").exists());
    assert!(!bed.held("jobs:b").await, "no lease left after any exit");
}

#[tokio::test]
async fn a_lease_lost_when_a_majority_of_masters_stop_ends_the_command_within_the_ttl() {
    let bed = Bed::start().await;
    let ttl = Duration::from_secs(1);
    let child = bed
        .cli(&[
            "lock",
            "--ttl",
            "1s",
            "--grace",
            "500ms",
            "jobs:c",
            "--",
            "sh",
            "-c",
            // A grandchild that ignores SIGTERM: the group must get SIGKILL after --grace.
            r#"sh -c 'trap "" TERM; while :; do sleep 0.05; done' & echo $! > grandchild; wait"#,
        ])
        .spawn()
        .unwrap();
    let grandchild = bed.pid_in("grandchild").await;
    assert!(alive(&grandchild));
    bed.masters[0].pause();
    bed.masters[1].pause();
    let paused = Instant::now();
    let out = match tokio::time::timeout(Duration::from_secs(10), child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let ps = std::process::Command::new("ps")
                .args(["-eo", "pid,pgid,stat,args"])
                .output()
                .unwrap();
            panic!(
                "redlockd lock did not exit:\n{}",
                String::from_utf8_lossy(&ps.stdout)
            );
        }
    };
    let took = paused.elapsed();
    bed.masters[0].resume();
    bed.masters[1].resume();
    assert_eq!(code(&out), LOST, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lost the lock on jobs:c"),
        "{}",
        stderr(&out)
    );
    // The lease's validity ends within one TTL of the last renew; then SIGTERM, and SIGKILL
    // after the grace.
    assert!(
        took < ttl + Duration::from_millis(500) + Duration::from_secs(1),
        "{took:?}"
    );
    wait_for(
        "the grandchild to die",
        Duration::from_secs(5),
        async || (!alive(&grandchild)).then_some(()),
    )
    .await;
}

/// Renews that stop getting through are told to the command before the lease ends
/// (`--jeopardy-signal`, once), and a renew that gets through again too (`--safe-signal`);
/// the command runs on.
#[tokio::test]
async fn jeopardy_and_safe_reach_the_command_as_the_signals_it_asked_for() {
    let bed = Bed::start().await;
    let mut child = bed
        .cli(&[
            "lock",
            "--ttl",
            "1500ms",
            "--jeopardy-signal",
            "USR1",
            "--safe-signal",
            "sigusr2",
            "jobs:j",
            "--",
            "sh",
            "-c",
            r#"trap 'echo jeopardy >> told' USR1; trap 'echo safe >> told' USR2; touch started; while :; do sleep 0.05; done"#,
        ])
        .spawn()
        .unwrap();
    bed.appears("started").await;
    let told = || std::fs::read_to_string(bed.path("told")).unwrap_or_default();
    bed.masters[0].pause();
    bed.masters[1].pause();
    wait_for("jeopardy", Duration::from_secs(5), async || {
        (!told().is_empty()).then_some(())
    })
    .await;
    bed.masters[0].resume();
    bed.masters[1].resume();
    wait_for("safe", Duration::from_secs(5), async || {
        told().contains("safe").then_some(())
    })
    .await;
    assert_eq!(told(), "jeopardy\nsafe\n", "each told once, in order");
    assert!(
        bed.held("jobs:j").await,
        "held on after a renew got through"
    );
    common::signal(child.id().expect("running"), "-TERM");
    let out = common::within(Duration::from_secs(10), child.wait(), "the run exits")
        .await
        .unwrap();
    assert!(out.code().is_some(), "{out:?}");
}

#[tokio::test]
async fn hold_at_least_makes_a_second_run_within_the_window_skip() {
    let bed = Bed::start().await;
    let out = bed
        .run(&["lock", "--hold-at-least", "3s", "cron:tick", "--", "true"])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = bed.run(&["lock", "cron:tick", "--", "touch", "ran"]).await;
    assert_eq!(code(&out), HELD, "a second instance skips the tick");
    assert!(!bed.path("ran").exists());
    let (_, body) = bed.replicas[0].inspect("cron:tick").await;
    assert!(body["ttl_remaining_ms"].as_u64().unwrap() <= 3000, "{body}");
    wait_for("the window to end", Duration::from_secs(6), async || {
        (!bed.held("cron:tick").await).then_some(())
    })
    .await;
    let out = bed.run(&["lock", "cron:tick", "--", "touch", "ran"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(bed.path("ran").exists());
}

#[tokio::test]
async fn bad_usage_exits_64_and_a_missing_command_releases_the_lock() {
    let bed = Bed::start().await;
    for args in [
        &["lock", "jobs:d"][..],
        &["lock", "--ttl", "soon", "jobs:d", "--", "true"],
        &["lock", "bad name", "--", "true"],
        &["lock", "--ttl", "10ms", "jobs:d", "--", "true"],
        // A server's flag is not the client's: refused, not ignored.
        &["lock", "--listen", "127.0.0.1:7580", "jobs:d", "--", "true"],
        &["list", "--max-ttl-ms", "5"],
    ] {
        let out = bed.run(args).await;
        assert_eq!(code(&out), USAGE, "{args:?}: {}", stderr(&out));
        assert!(!bed.held("jobs:d").await, "{args:?} took the lock");
    }
    // Nor does a server's variable trouble a client verb.
    common::succeeds(
        bed.cli(&["list", "jobs:"])
            .env("REDLOCKD_MAX_TTL_MS", "abc"),
    )
    .await;
    let out = bed.run(&["lock", "jobs:d", "--", "/no/such/command"]).await;
    assert_eq!(code(&out), 127, "{}", stderr(&out));
    assert!(
        !bed.held("jobs:d").await,
        "released after the command failed to start"
    );
}

#[tokio::test]
async fn inspect_and_list_print_a_table_or_json() {
    let bed = Bed::start().await;
    bed.replicas[0]
        .must_grant("report:1", json!({"ttl_ms": 60000, "owner": "worker-1"}))
        .await;
    bed.replicas[0]
        .must_grant("report:2", json!({"ttl_ms": 60000}))
        .await;
    let out = bed.run(&["inspect", "report:1"]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("NAME"), "{text}");
    assert!(
        text.contains("report:1") && text.contains("worker-1"),
        "{text}"
    );
    let out = bed.run(&["inspect", "report:3"]).await;
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "report:3 is free\n");

    let out = bed.run(&["list", "report:", "--json"]).await;
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names = common::each(&all["locks"], "name");
    assert_eq!(names, ["report:1", "report:2"]);
    let out = bed.run(&["list"]).await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");

    // Each kind as it is held: a shared lock's every holder, a semaphore's permits by
    // slot (a semaphore is apart from the lock of its name), an election's leader.
    for reader in ["reader-1", "reader-2"] {
        bed.replicas[0]
            .must_grant("queue", json!({"mode": "shared", "owner": reader}))
            .await;
    }
    let text = String::from_utf8(bed.run(&["inspect", "queue"]).await.stdout).unwrap();
    let shared: Vec<&str> = text.lines().filter(|l| l.contains(" shared ")).collect();
    assert_eq!(shared.len(), 2, "{text}");
    assert!(
        text.contains("reader-1") && text.contains("reader-2"),
        "{text}"
    );
    let text = String::from_utf8(bed.run(&["list", "queue"]).await.stdout).unwrap();
    assert!(
        text.starts_with("no lock held exclusively under \"queue\"") && text.contains("inspect"),
        "readers hold it: the list says what it does not show: {text}"
    );
    let (status, _) = bed.replicas[0]
        .send(
            "POST",
            "/semaphores/db-pool",
            Some(json!({"limit": 2, "owner": "w-1"})),
        )
        .await;
    assert_eq!(status, 201);
    let text = String::from_utf8(bed.run(&["inspect", "db-pool"]).await.stdout).unwrap();
    assert_eq!(
        text,
        "db-pool is free as a lock; its semaphore has 1 permit held \
         (redlockd inspect --semaphore db-pool)\n",
        "the lock of that name, and the semaphore that is held"
    );
    let text =
        String::from_utf8(bed.run(&["inspect", "--semaphore", "db-pool"]).await.stdout).unwrap();
    assert!(
        text.starts_with("NAME") && text.contains("SLOT") && text.contains("w-1"),
        "{text}"
    );
    let (status, _) = bed.replicas[0]
        .send(
            "POST",
            "/elections/primary",
            Some(json!({"value": "10.0.0.7:9000"})),
        )
        .await;
    assert_eq!(status, 201);
    let text =
        String::from_utf8(bed.run(&["inspect", "--election", "primary"]).await.stdout).unwrap();
    assert!(
        text.contains("TERM") && text.contains("10.0.0.7:9000"),
        "{text}"
    );
    let out = bed
        .run(&["inspect", "--semaphore", "--election", "x"])
        .await;
    assert_eq!(code(&out), 64, "one kind at a time: {}", stderr(&out));
}

#[tokio::test]
async fn renews_fail_over_to_the_other_replica_when_one_stops() {
    let mut bed = Bed::start().await;
    let child = bed
        .cli(&[
            "lock",
            "--ttl",
            "600ms",
            "jobs:e",
            "--",
            "sh",
            "-c",
            "touch started; sleep 2; echo $REDLOCKD_FENCING_TOKEN",
        ])
        .spawn()
        .unwrap();
    bed.appears("started").await;
    // The first replica stops while the command runs (several TTLs more): renews, and the
    // release at the end, move to the second with the same lease id.
    let first = bed.replicas.remove(0);
    first.stop().await;
    let out = common::within(
        Duration::from_secs(10),
        child.wait_with_output(),
        "redlockd lock exits",
    )
    .await
    .unwrap();
    assert_eq!(
        code(&out),
        0,
        "held through the replica's stop: {}",
        stderr(&out)
    );
    assert!(
        !bed.held("jobs:e").await,
        "released through the other replica"
    );
}

/// A server in front of `upstream` that forwards each request and drops the answer: the
/// grant is made, and its client never hears of it.
async fn losing_proxy(upstream: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // A client's grant is small: headers and body arrive before it waits.
                loop {
                    let n = client.read(&mut buf).await.unwrap_or(0);
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request);
                    let Some(end) = text.find("\r\n\r\n") else {
                        if n == 0 {
                            return;
                        }
                        continue;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length || n == 0 {
                        break;
                    }
                }
                let mut up = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                up.write_all(&request).await.unwrap();
                let _ = up.read(&mut buf).await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_grant_whose_answer_is_lost_fails_over_with_its_idempotency_key() {
    let bed = Bed::start().await;
    let proxy = losing_proxy(&bed.replicas[0].base).await;
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        bed.cli(&[
            "lock",
            "jobs:k",
            "--",
            "sh",
            "-c",
            "echo $REDLOCKD_FENCING_TOKEN",
        ])
        .env(
            "REDLOCKD_SERVER",
            format!("{proxy},{}", bed.replicas[1].base),
        )
        .output(),
    )
    .await
    .expect("redlockd lock exits")
    .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    // The first attempt was granted through the proxy; the retry got that very lease (a
    // second lock would have been refused 409, or left held after the command's release).
    assert!(token > 0);
    assert!(!bed.held("jobs:k").await, "one release freed it: one lease");
}

#[tokio::test]
async fn with_limit_at_most_n_commands_run_at_once_each_on_its_own_slot() {
    let bed = Bed::start().await;
    // Two permits of two held by commands that wait for a file; a third run is refused.
    let mut running = Vec::new();
    for i in 0..2 {
        let script = format!(
            r#"echo "$REDLOCKD_SLOT $REDLOCKD_FENCING_TOKEN" > slot-{i}; while [ ! -e done ]; do sleep 0.05; done"#
        );
        running.push(
            bed.cli(&[
                "lock", "--limit", "2", "--ttl", "2s", "pool", "--", "sh", "-c", &script,
            ])
            .spawn()
            .unwrap(),
        );
        bed.appears(&format!("slot-{i}")).await;
    }
    let third = bed
        .run(&["lock", "--limit", "2", "pool", "--", "true"])
        .await;
    assert_eq!(code(&third), HELD, "{}", stderr(&third));
    assert!(
        stderr(&third).contains("every one of the 2 permits of pool is taken"),
        "{}",
        stderr(&third)
    );
    // The lock of the same name is another thing: free.
    let lock = bed.run(&["lock", "pool", "--", "true"]).await;
    assert_eq!(code(&lock), 0, "{}", stderr(&lock));
    let mut slots = Vec::new();
    for i in 0..2 {
        let seen = std::fs::read_to_string(bed.path(&format!("slot-{i}"))).unwrap();
        let (slot, token) = seen.trim().split_once(' ').expect("slot and token");
        assert!(token.parse::<u64>().unwrap() > 0);
        slots.push(slot.to_owned());
    }
    slots.sort();
    assert_eq!(slots, ["0", "1"]);
    std::fs::write(bed.path("done"), "").unwrap();
    for mut child in running {
        let status = common::within(Duration::from_secs(10), child.wait(), "exits")
            .await
            .unwrap();
        assert!(status.success());
    }
    let (status, seen) = bed.replicas[0].get("/semaphores/pool").await;
    assert_eq!(
        (status, &seen["holders"]),
        (200, &json!([])),
        "released when they exited"
    );
    let bad = bed
        .run(&["lock", "--limit", "0", "pool", "--", "true"])
        .await;
    assert_eq!(code(&bad), USAGE);
}

#[tokio::test]
async fn with_shared_commands_run_together_and_an_exclusive_run_waits_for_them() {
    let bed = Bed::start().await;
    let mut readers = Vec::new();
    for i in 0..2 {
        let script = format!(r#"touch reading-{i}; while [ ! -e done ]; do sleep 0.05; done"#);
        readers.push(
            bed.cli(&[
                "lock", "--shared", "--ttl", "2s", "report", "--", "sh", "-c", &script,
            ])
            .spawn()
            .unwrap(),
        );
    }
    bed.appears("reading-0").await;
    bed.appears("reading-1").await;
    let writer = bed.run(&["lock", "report", "--", "true"]).await;
    assert_eq!(code(&writer), HELD, "{}", stderr(&writer));
    let (_, seen) = bed.replicas[0].inspect("report").await;
    assert_eq!(seen["mode"], "shared");
    assert_eq!(seen["holders"].as_array().map(Vec::len), Some(2), "{seen}");
    // A writer that waits is granted once both readers are done.
    let waiting = bed
        .cli(&[
            "lock",
            "--wait",
            "20s",
            "report",
            "--",
            "sh",
            "-c",
            "echo $REDLOCKD_FENCING_TOKEN",
        ])
        .output();
    let waiting = tokio::spawn(waiting);
    std::fs::write(bed.path("done"), "").unwrap();
    for mut reader in readers {
        let status = common::within(Duration::from_secs(10), reader.wait(), "exits")
            .await
            .unwrap();
        assert!(status.success());
    }
    let out = common::within(Duration::from_secs(10), waiting, "the writer runs")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let both = bed
        .run(&["lock", "--shared", "--limit", "2", "report", "--", "true"])
        .await;
    assert_eq!(
        code(&both),
        USAGE,
        "--shared and --limit do not go together"
    );
}

#[tokio::test]
async fn several_names_are_one_lease_for_the_command_in_any_order() {
    let bed = Bed::start().await;
    let out = bed
        .run(&[
            "lock",
            "acct:2",
            "acct:1",
            "--",
            "sh",
            "-c",
            r#"echo "$REDLOCKD_LOCK_NAME $REDLOCKD_FENCING_TOKEN""#,
        ])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let seen = String::from_utf8(out.stdout).unwrap();
    let (names, token) = seen.trim().split_once(' ').unwrap();
    assert_eq!(names, "acct:2,acct:1");
    assert!(token.parse::<u64>().unwrap() > 0);
    assert!(
        !bed.held("acct:1").await && !bed.held("acct:2").await,
        "released"
    );
    // One of them held elsewhere: the command does not run.
    let (_, other) = bed.replicas[0]
        .grant("acct:1", json!({"ttl_ms": 30_000}))
        .await;
    let out = bed
        .run(&["lock", "acct:1", "acct:2", "--", "touch", "ran"])
        .await;
    assert_eq!(code(&out), HELD, "{}", stderr(&out));
    assert!(!bed.path("ran").exists());
    assert!(!bed.held("acct:2").await, "nothing was taken");
    let id = other["lease_id"].as_str().unwrap();
    bed.replicas[0].revoke("acct:1", id).await;
    let both = bed.run(&["lock", "--shared", "a", "b", "--", "true"]).await;
    assert_eq!(code(&both), USAGE);
}

#[tokio::test]
async fn with_lock_delay_a_run_that_dies_leaves_the_name_refused_and_one_that_ends_does_not() {
    let bed = Bed::start().await;
    // A run that ends lets go at once: the next run is not delayed.
    let out = bed
        .run(&["lock", "--lock-delay", "30s", "ld:job", "--", "true"])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = bed.run(&["lock", "ld:job", "--", "true"]).await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    // A run killed outright (no revoke) leaves its lease to lapse, then the delay.
    let mut dying = bed
        .cli(&[
            "lock",
            "--lock-delay",
            "2s",
            "--ttl",
            "600ms",
            "ld:job",
            "--",
            "sh",
            "-c",
            "echo $$ > job.pid; sleep 30",
        ])
        .spawn()
        .expect("spawn redlockd lock");
    let job = bed.pid_in("job.pid").await;
    let lock_pid = dying.id().expect("running").to_string();
    common::signal(lock_pid.parse().unwrap(), "-KILL");
    let _ = dying.wait().await;
    common::signal(job.trim().parse().unwrap(), "-KILL");
    wait_for("the lease to lapse", Duration::from_secs(5), async || {
        (!bed.held("ld:job").await).then_some(())
    })
    .await;
    let out = bed.run(&["lock", "ld:job", "--", "touch", "ran"]).await;
    assert_eq!(code(&out), HELD, "{}", stderr(&out));
    assert!(stderr(&out).contains("lock-delay"), "{}", stderr(&out));
    assert!(!bed.path("ran").exists());
    let out = bed
        .run(&["lock", "--wait", "5s", "ld:job", "--", "touch", "ran"])
        .await;
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(bed.path("ran").exists());
}

/// An administrator's force-release stops the command at once, not at the next renew: with
/// the default 30 s TTL that renew is 10 s away, and the command ran on meanwhile without
/// its lock (a user saw it run about 10 s).
#[tokio::test]
async fn a_force_released_lock_stops_the_command_before_the_next_renew() {
    let bed = Bed::start().await;
    let child = bed
        .cli(&[
            "lock",
            "--ttl",
            "30s",
            "--grace",
            "500ms",
            "jobs:forced",
            "--",
            "sh",
            "-c",
            "touch started; sleep 60",
        ])
        .spawn()
        .unwrap();
    bed.appears("started").await;
    let (status, body) = bed.replicas[0]
        .send("DELETE", "/locks/jobs:forced", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["released"], true, "{body}");
    let released = Instant::now();
    // The next renew would come 10 s after the grant: the command must end well before.
    let out = tokio::time::timeout(Duration::from_secs(5), child.wait_with_output())
        .await
        .expect("the command still ran 5 s after the force-release")
        .unwrap();
    assert_eq!(code(&out), LOST, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lost the lock on jobs:forced"),
        "{}",
        stderr(&out)
    );
    assert!(released.elapsed() < Duration::from_secs(5));
}
