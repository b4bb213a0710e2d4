//! The runnable examples under `examples/` and the ones README.md and the docs site show, run as a user
//! would, against redlockd on real masters: the cron job runs once on a fleet, the ordered
//! queue is processed exactly once in order across a leader's death, the standby takes
//! over from a primary; the cron line and the curl examples are taken from the Markdown
//! and run as written (only the servers' addresses and the lease ids they return put in).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::{RedisMaster, TestApp, config, masters, wait_for};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");

/// Three masters and a redlockd over them, each master step given 200 ms (as
/// `common::two_replicas`): the examples run several clients at once, and with the 50 ms
/// default a loaded CI machine turned a grant into a 503 the example does not retry.
async fn server() -> (Vec<RedisMaster>, TestApp) {
    let masters = masters(3);
    let app = TestApp::over(&masters, |cfg| cfg.master_timeout_ms = 200).await;
    (masters, app)
}

fn example(app: &TestApp, script: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(format!("{}/examples/{script}", env!("CARGO_MANIFEST_DIR")));
    cmd.args(args)
        .env("REDLOCKD_SERVER", &app.base)
        .env("REDLOCKD", BIN)
        // Its own process group, so that killing it takes its curl along, as a host dying would.
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// An example running in its own process group, all of which is killed on drop (its curl
/// and subshells too, which would otherwise keep a stream, and the test's pipes, open).
struct Running(Child);

impl Running {
    fn spawn(mut cmd: Command) -> Self {
        Self(cmd.spawn().expect("start the example"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            kill_group(pid);
        }
    }
}

fn kill_group(pid: u32) {
    use nix::sys::signal::{Signal, killpg};
    let pid = i32::try_from(pid).expect("a pid");
    // Never 0 or 1 (the caller's own group, every process): only a group of our making.
    assert!(pid > 1);
    let _ = killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
}

/// Run `examples/<script>` with a log file of its own, within a minute, and assert that it
/// succeeded: its log.
async fn run_example(app: &TestApp, script: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("example.log");
    let limit = std::time::Duration::from_secs(60);
    let out = tokio::time::timeout(
        limit,
        example(app, script, &[log.to_str().unwrap()]).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
    .unwrap();
    let lines = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "{script}: {lines}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
}

#[tokio::test]
async fn the_cron_job_runs_once_on_a_fleet_of_eight() {
    let (_masters, app) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let out = common::succeeds(&mut example(&app, "cron-once.sh", &[log.to_str().unwrap()])).await;
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("1 of 8 instances ran the job"));
}

#[tokio::test]
async fn the_connection_pool_lets_at_most_three_workers_use_a_connection_at_once() {
    let (_masters, app) = server().await;
    let runs = run_example(&app, "db-pool.sh").await;
    let used: Vec<&str> = runs
        .lines()
        .filter(|l| l.contains(" used connection "))
        .collect();
    assert_eq!(
        used.len(),
        8,
        "every worker had its turn, none refused or clashed:\n{runs}"
    );
    let mut most = 0;
    for line in &used {
        let slot: u32 = line.split("connection ").nth(1).unwrap()[..1]
            .parse()
            .unwrap();
        assert!(slot < 3, "{line}");
        let in_use: usize = line
            .rsplit(", ")
            .next()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        most = most.max(in_use);
    }
    assert!(most <= 3, "{most} connections in use at once:\n{runs}");
    assert!(most >= 2, "the workers overlapped:\n{runs}");
}

#[tokio::test]
async fn readers_read_together_and_the_writer_waits_for_them_and_writes_once() {
    let (_masters, app) = server().await;
    let lines = run_example(&app, "readers-writer.sh").await;
    // Nothing refused, nothing read during a write or written during a read.
    assert!(!lines.contains(':'), "{lines}");
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(lines.iter().filter(|l| l.contains(" wrote ")).count(), 1);
    for early in ["reader-1", "reader-2"] {
        assert!(
            lines.contains(&format!("{early} read version 0").as_str()),
            "{early} read before the writer, which waited for it: {lines:?}"
        );
    }
}

#[tokio::test]
async fn transfers_naming_two_accounts_in_opposite_orders_never_deadlock_and_add_up() {
    let (_masters, app) = server().await;
    // A deadlock would hold the example past the deadline.
    let lines = run_example(&app, "transfer.sh").await;
    assert_eq!(lines.matches(" moved ").count(), 8, "{lines}");
    assert!(!lines.contains("refused"), "{lines}");
    // Alice pays 2 + 4 + 6 + 8 and receives 1 + 3 + 5 + 7.
    assert!(lines.ends_with("balances: alice 96, bob 104\n"), "{lines}");
}

#[tokio::test]
async fn the_ordered_queue_is_processed_once_in_order_across_the_leaders_death() {
    let (_masters, app) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue");
    let done = dir.path().join("done");
    let items: Vec<String> = (1..=40).map(|i| format!("item-{i:02}")).collect();
    std::fs::write(&queue, items.join("\n") + "\n").unwrap();
    let (q, d) = (queue.to_str().unwrap(), done.to_str().unwrap());
    let mut workers: Vec<Running> = ["w1", "w2", "w3"]
        .into_iter()
        .map(|w| Running::spawn(example(&app, "queue-worker.sh", &[w, q, d])))
        .collect();
    // The first leader dies a few items in.
    wait_for("ten items done", Duration::from_secs(10), async || {
        let text = std::fs::read_to_string(&done).unwrap_or_default();
        (text.lines().count() >= 10).then_some(())
    })
    .await;
    let text = std::fs::read_to_string(&done).unwrap();
    let first = text
        .lines()
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .to_owned();
    let at = ["w1", "w2", "w3"].iter().position(|w| *w == first).unwrap();
    kill_group(workers[at].0.id().expect("running"));
    wait_for(
        "the queue to be done",
        Duration::from_secs(20),
        async || {
            let text = std::fs::read_to_string(&done).unwrap_or_default();
            (text.lines().count() >= items.len()).then_some(())
        },
    )
    .await;
    for w in &mut workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w.0.wait()).await;
    }
    let text = std::fs::read_to_string(&done).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    let processed: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(processed, items, "each item once, in order:\n{text}");
    let terms: Vec<u64> = rows.iter().map(|r| r[2].parse().unwrap()).collect();
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "terms never go back:\n{text}"
    );
    assert!(
        terms.first() < terms.last(),
        "another leader carried on:\n{text}"
    );
    assert!(
        rows.iter().skip(10).all(|r| r[1] != first),
        "the dead leader wrote on:\n{text}"
    );
}

#[tokio::test]
async fn the_standby_takes_over_when_the_primary_dies_and_clients_follow() {
    let (_masters, app) = server().await;
    let mut follower = Running::spawn(example(&app, "standby.sh", &["--follow"]));
    let primary = Running::spawn(example(&app, "standby.sh", &["10.0.0.1:5432"]));
    let mut follow = tokio::io::BufReader::new(follower.0.stdout.take().unwrap());
    let line = next_line(&mut follow).await;
    assert!(
        line.starts_with("vacant") || line.contains("10.0.0.1:5432"),
        "{line}"
    );
    if line.starts_with("vacant") {
        assert!(next_line(&mut follow).await.contains("10.0.0.1:5432"));
    }
    let _standby = Running::spawn(example(&app, "standby.sh", &["10.0.0.2:5432"]));
    kill_group(primary.0.id().expect("running"));
    let mut line = next_line(&mut follow).await;
    if line.starts_with("vacant") {
        line = next_line(&mut follow).await;
    }
    assert!(
        line.starts_with("elected") && line.contains("10.0.0.2:5432"),
        "{line}"
    );
}

async fn next_line(reader: &mut tokio::io::BufReader<tokio::process::ChildStdout>) -> String {
    use tokio::io::AsyncBufReadExt as _;
    let mut line = String::new();
    common::within(
        Duration::from_secs(10),
        reader.read_line(&mut line),
        "a line within 10 s",
    )
    .await
    .expect("read");
    line
}

/// The text of the first `sh` block under the heading `heading` of `page` (a path from
/// the repository's root: `README.md`, or a page of the docs site).
fn doc_block(page: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(format!("{}/{page}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{page}: {e}"));
    let text = format!("\n{text}");
    let section = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{page} has no {heading:?}"))
        .1;
    let block = section.split_once("```sh\n").expect("a sh block").1;
    block.split_once("```").expect("closed").0.to_owned()
}

/// The docs' cron line: the first command of "Run a command under a lock".
fn readme_cron_line() -> String {
    let block = doc_block("docs/cli.md", "# Run a command under a lock");
    let line = block
        .lines()
        .find(|l| l.starts_with("redlockd lock"))
        .expect("the cron line");
    assert!(
        line.contains("--hold-at-least 10m --held-exit-code 0"),
        "{line}"
    );
    line.to_owned()
}

/// Run `line` as a user's shell would, in `dir` (where `./send-report.sh` is), with the
/// binary on the PATH and `REDLOCKD_SERVER` pointing at `server`.
fn run_as_cron(line: &str, dir: &std::path::Path, server: &str) -> Command {
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("PATH", path)
        .env("REDLOCKD_SERVER", server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

fn send_report_script(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let runs = dir.join("runs.log");
    let script = dir.join("send-report.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"sent with $REDLOCKD_FENCING_TOKEN\" >>{}\nsleep 0.3\n",
            runs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    runs
}

#[tokio::test]
async fn the_readmes_cron_line_runs_the_job_once_and_the_skips_print_nothing() {
    let (_masters, app) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let runs = send_report_script(dir.path());
    let line = readme_cron_line();
    let fleet: Vec<_> = (0..8)
        .map(|_| run_as_cron(&line, dir.path(), &app.base).spawn().unwrap())
        .collect();
    for instance in fleet {
        let out = instance.wait_with_output().await.unwrap();
        assert!(out.status.success(), "exit {:?}", out.status);
        // cron mails any output: a skip, declared a success, says nothing.
        assert_eq!(
            (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            ("".into(), "".into())
        );
    }
    let ran = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(ran.lines().count(), 1, "{ran}");
    // The lock stays for the rest of the 10 minutes after the job.
    let (_, held) = app.inspect("nightly-report").await;
    assert_eq!(held["held"], true, "{held}");
    assert!(
        held["ttl_remaining_ms"].as_u64().unwrap() > 500_000,
        "{held}"
    );
}

#[tokio::test]
async fn the_readmes_cron_line_is_refused_before_the_job_when_the_server_cannot_hold_that_long() {
    let masters = masters(3);
    let app = TestApp::over(&masters, |cfg| cfg.max_ttl_ms = 300_000).await;
    let dir = tempfile::tempdir().unwrap();
    let runs = send_report_script(dir.path());
    let out = run_as_cron(&readme_cron_line(), dir.path(), &app.base)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--hold-at-least 10m") && said.contains("REDLOCKD_MAX_TTL_MS"),
        "{said}"
    );
    assert!(
        !runs.exists(),
        "the job ran although the lock could not be kept"
    );
    let (_, held) = app.inspect("nightly-report").await;
    assert_eq!(held["held"], false, "nothing is held: {held}");
}

/// One `curl` command of a documented block and what the page says it answers.
struct Documented {
    command: String,
    status: Option<u16>,
    /// The keys of the documented JSON body, when one is shown.
    keys: Option<Vec<String>>,
}

/// The commands of a documented `sh` block, in order, with the lines that set variables kept
/// in place, and each curl's documented answer (`# → 201 {...}`, which may go on over the
/// comment lines that follow).
fn documented(block: &str) -> (String, Vec<Documented>) {
    let mut script = String::new();
    let mut steps: Vec<Documented> = Vec::new();
    let mut answer: Option<String> = None;
    let close = |answer: &mut Option<String>, steps: &mut Vec<Documented>| {
        if let (Some(text), Some(step)) = (answer.take(), steps.last_mut()) {
            let (status, body) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
            step.status = Some(status.parse().expect("a status after →"));
            step.keys = serde_json::from_str::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()));
        }
    };
    let joined = block.replace("\\\n", " ");
    for line in joined.lines() {
        if let Some(rest) = line.strip_prefix("# → ") {
            close(&mut answer, &mut steps);
            answer = Some(rest.to_owned());
        } else if let (Some(text), Some(more)) = (answer.as_mut(), line.strip_prefix("#  ")) {
            text.push_str(more.trim());
        } else {
            close(&mut answer, &mut steps);
            if line.starts_with("curl ") {
                steps.push(Documented {
                    command: line.to_owned(),
                    status: None,
                    keys: None,
                });
                script.push_str(line);
                script.push('\n');
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                script.push_str(line);
                script.push('\n');
            }
        }
    }
    close(&mut answer, &mut steps);
    (script, steps)
}

/// Run a documented block's commands as one shell session against `replicas` (in place of
/// localhost:8080, :8081), the example lease id replaced by the first one a grant
/// returns, and hold each answer to what the page says of it.
async fn run_documented((page, heading): (&str, &str), replicas: &[&TestApp]) {
    let (script, steps) = documented(&doc_block(page, heading));
    assert!(steps.len() >= 2, "{heading}: {script}");
    let mut script = script
        .replace("q3JtZ0kPq6Nw2b1xVf8u4A", "$LEASE_ID")
        .replace("k2VdY1Qm0sJx9a7bTf4r3w", "$SESSION_ID");
    for (port, app) in [8080, 8081].iter().zip(replicas) {
        script = script.replace(
            &format!("localhost:{port}"),
            app.base.trim_start_matches("http://"),
        );
    }
    // Each answer followed by its status; the first lease id a grant returns is kept.
    let prelude = r#"
curl() {
  local out
  out=$(command curl -sS --max-time 15 -w '\n@@STATUS %{http_code}' "$@")
  printf '%s\n' "$out"
  if [ -z "${LEASE_ID:-}" ]; then
    LEASE_ID=$(printf '%s' "$out" | sed -n 's/.*"lease_id":"\([^"]*\)".*/\1/p' | head -n 1)
  fi
  if [ -z "${SESSION_ID:-}" ]; then
    SESSION_ID=$(printf '%s' "$out" | sed -n 's/.*"session_id":"\([^"]*\)".*/\1/p' | head -n 1)
  fi
}
"#;
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "body\n@@STATUS 201\nbody\n@@STATUS 409\n…": each part but the first opens with the
    // status of the body before it.
    let parts: Vec<&str> = text.split("@@STATUS ").collect();
    let answers: Vec<(String, u16)> = parts
        .windows(2)
        .enumerate()
        .map(|(i, pair)| {
            let body = if i == 0 {
                pair[0]
            } else {
                pair[0].split_once('\n').map_or("", |(_, b)| b)
            };
            let status = pair[1]
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .parse()
                .unwrap_or(0);
            (body.to_owned(), status)
        })
        .collect();
    assert_eq!(
        answers.len(),
        steps.len(),
        "{heading}: every command answered:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (step, (body, status)) in steps.iter().zip(&answers) {
        let expected = step.status.unwrap_or(200);
        assert_eq!(*status, expected, "{}\n→ {body}", step.command);
        if let Some(keys) = &step.keys {
            let got: serde_json::Value = serde_json::from_str(body.trim())
                .unwrap_or_else(|e| panic!("{}: {e}: {body}", step.command));
            let mut got: Vec<String> = got.as_object().unwrap().keys().cloned().collect();
            let mut keys = keys.clone();
            got.sort();
            keys.sort();
            assert_eq!(
                got, keys,
                "{}: the body's fields as the page shows them\n→ {body}",
                step.command
            );
        }
    }
}

#[tokio::test]
async fn the_curl_examples_of_readme_and_the_docs_answer_as_documented() {
    let masters = masters(3);
    // A second per master step: with the 50 ms default a loaded CI machine turned a grant
    // into a 503 (2026-11-27: two masters past it at once) that no page's example retries.
    // No example stops a master, so the timeout is never waited out.
    let mut cfg = config(&masters);
    cfg.master_timeout_ms = 1_000;
    let a = TestApp::spawn(cfg.clone()).await;
    let b = TestApp::spawn(cfg).await;
    for page in [
        ("README.md", "## A lock with curl"),
        ("docs/getting-started.md", "## Using it with curl"),
        ("docs/getting-started.md", "### Retrying a grant safely"),
        ("docs/semaphores.md", "# Semaphores: at most N holders"),
        (
            "docs/shared.md",
            "# Shared locks: many readers or one writer",
        ),
        ("docs/several-names.md", "# Several names at once"),
        (
            "docs/sessions.md",
            "# Sessions: one heartbeat for many locks",
        ),
        (
            "docs/lock-delay.md",
            "# Lock-delay: a pause after a holder fails",
        ),
    ] {
        run_documented(page, &[&a, &b]).await;
    }
}
