//! The runnable examples under `examples/`, run as a user would, against redlockd on real
//! masters: the cron job runs once on a fleet, the ordered queue is processed exactly once
//! in order across a leader's death, the standby takes over from a primary.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{RedisMaster, TestApp, config, masters, wait_for};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_redlockd");

async fn server() -> (Vec<RedisMaster>, TestApp) {
    let masters = masters(3);
    let refs: Vec<&RedisMaster> = masters.iter().collect();
    let app = TestApp::spawn(config(&refs)).await;
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

#[tokio::test]
async fn the_cron_job_runs_once_on_a_fleet_of_eight() {
    let (_masters, app) = server().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let out = example(&app, "cron-once.sh", &[log.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs = std::fs::read_to_string(&log).unwrap();
    assert_eq!(runs.lines().count(), 1, "{runs}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("1 of 8 instances ran the job"));
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
    tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line))
        .await
        .expect("a line within 10 s")
        .expect("read");
    line
}
