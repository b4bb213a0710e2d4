//! Shared test bed: real redis-server masters on free loopback ports (each in its own
//! temporary directory, stopped on drop), and redlockd apps spawned in process on port 0
//! with typed request helpers. Waits poll a condition with a deadline; nothing sleeps
//! and hopes.
#![allow(dead_code)]

pub mod scenarios;

use std::io::Read as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlockd::app::App;
use redlockd::auth::{Role, TokenEntry, new_token};
use redlockd::config::Config;
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// How often a wait polls its condition.
pub const POLL: Duration = Duration::from_millis(10);

/// An HTTP client builder for the tests. reqwest's TLS runs on rustls' process-wide crypto
/// provider, which the binary installs (ring) at start and a test process must install too.
pub fn http_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A plain HTTP client for the tests (see [`http_builder`]).
pub fn http() -> reqwest::Client {
    http_builder().build().expect("an HTTP client")
}

/// Poll `check` until it returns `Some`, or panic with `what` after `deadline`.
pub async fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            started.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// What `future` gives, or a panic naming `what` after `deadline`.
pub async fn within<F: std::future::Future>(
    deadline: Duration,
    future: F,
    what: &str,
) -> F::Output {
    tokio::time::timeout(deadline, future)
        .await
        .unwrap_or_else(|_| panic!("not within {deadline:?}: {what}"))
}

/// What a spawned waiter gives: at once (within 2 s), not at the end of a wait it was
/// meant to be woken from; a panic naming `what` otherwise.
pub async fn joined<T>(waiter: tokio::task::JoinHandle<T>, what: &str) -> T {
    joined_within(waiter, Duration::from_secs(2), what).await
}

/// What a spawned task gives, within `limit`; a panic naming `what` otherwise.
pub async fn joined_within<T>(task: tokio::task::JoinHandle<T>, limit: Duration, what: &str) -> T {
    within(limit, task, what)
        .await
        .expect("the task did not panic")
}

/// Runs a command to its end, which must be a success: what it wrote to stderr is the
/// failure's message.
pub async fn succeeds(cmd: &mut tokio::process::Command) -> std::process::Output {
    let out = cmd.output().await.expect("the command starts");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Wait (10 s at most) until the redlockd at `base` answers `/healthz`.
pub async fn serving(base: &str, what: &str) {
    let http = http();
    wait_for(what, Duration::from_secs(10), async || {
        let answer = http.get(format!("{base}/healthz")).send().await;
        answer.ok().map(drop)
    })
    .await;
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn redis_server() -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let path = PathBuf::from(dir).join("redis-server");
        if path.exists() {
            return path;
        }
    }
    panic!(
        "redis-server is not installed: run scripts/test (it installs it), \
         or apt-get update && apt-get install -y redis-server"
    );
}

/// One real Redis master.
pub struct RedisMaster {
    pub port: u16,
    password: Option<String>,
    extra: Vec<String>,
    /// Environment the server runs with (the clock shim's, for a master whose clock jumps).
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisMaster {
    pub fn start() -> Self {
        Self::start_with(None, &[])
    }

    /// A master whose wall clock the test moves: `jump_clock` steps it at once, as an
    /// operator or NTP stepping the host's clock does (`clockshim.c`, preloaded).
    pub fn start_with_movable_clock(extra: &[&str]) -> Self {
        Self::start_on(free_port, None, extra, true)
    }

    /// Move the master's wall clock to `offset_ms` from the host's (it started at 0).
    pub fn set_clock_offset(&self, offset_ms: i64) {
        let file = self.dir.path().join("clock-offset-ms");
        assert!(
            file.exists(),
            "this master was not started with a movable clock"
        );
        // Written whole, then renamed: the shim never reads half a number.
        let tmp = self.dir.path().join("clock-offset-ms.new");
        std::fs::write(&tmp, offset_ms.to_string()).expect("write the clock offset");
        std::fs::rename(&tmp, &file).expect("move the clock offset in place");
    }

    /// A master that requires `password`, or runs with extra redis-server arguments.
    pub fn start_with(password: Option<&str>, extra: &[&str]) -> Self {
        Self::start_on(free_port, password, extra, false)
    }

    /// A master on a port `port` picks; with `movable`, its clock can be moved.
    fn start_on(port: fn() -> u16, password: Option<&str>, extra: &[&str], movable: bool) -> Self {
        let mut master = Self {
            port: 0,
            password: password.map(str::to_owned),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        };
        if movable {
            let offset = master.dir.path().join("clock-offset-ms");
            std::fs::write(&offset, "0").expect("write the clock offset");
            master.env = vec![
                ("LD_PRELOAD".into(), clock_shim().display().to_string()),
                ("CLOCKSHIM_FILE".into(), offset.display().to_string()),
            ];
        }
        // A free port can be taken between our probe and redis' bind: try a few.
        for _ in 0..5 {
            master.port = port();
            if master.spawn() {
                return master;
            }
        }
        panic!("could not start redis-server on a free port");
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_server());
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--daemonize", "no", "--dir"])
        .arg(self.dir.path())
        .args(["--logfile", "redis.log"])
        .args(&self.extra)
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(pw) = &self.password {
            cmd.args(["--requirepass", pw]);
        }
        let mut child = cmd.spawn().expect("spawn redis-server");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if self.ping() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(POLL);
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("client")
    }

    /// A blocking PING, for start-up: true once the master answers.
    fn ping(&self) -> bool {
        let Ok(mut conn) = self
            .client()
            .get_connection_with_timeout(Duration::from_millis(200))
        else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// SIGSTOP: the master stops answering; the kernel still accepts connections, so
    /// commands queue up and run when it resumes.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kill the master (SIGKILL) and start it again on the same port, empty: persistence
    /// is off, so its locks, fencing counter and marker are gone.
    pub fn restart_empty(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// Start a stopped master again on the same port and directory: with persistence on,
    /// it comes back with its data.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "still running");
        assert!(
            self.spawn(),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start a stopped master again with nothing on disk: it comes back empty.
    pub fn start_wiped(&mut self) {
        assert!(self.child.is_none(), "still running");
        for entry in std::fs::read_dir(self.dir.path())
            .expect("master dir")
            .flatten()
        {
            // The log, and the clock shim's offset (a host's clock outlives its data).
            if !matches!(
                entry.file_name().to_str(),
                Some("redis.log" | "clock-offset-ms")
            ) {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        assert!(
            self.spawn(),
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// Write an RDB snapshot of the master's data now and keep a copy of it at `to`.
    ///
    /// `SAVE` writes and syncs the file before it answers, which on a busy disk took longer
    /// than the 500 ms [`Self::cmd`] waits (seen: fault suite, FleetLock nodes, seed 23,
    /// whose replays passed): it gets 30 s.
    pub async fn snapshot(&self, to: &std::path::Path) {
        let _: String = self
            .cmd_within(&["SAVE"], Duration::from_secs(30))
            .await
            .expect("SAVE");
        std::fs::copy(self.dir.path().join("dump.rdb"), to).expect("copy the snapshot");
    }

    /// Kill the master and start it from `snapshot` alone: whatever happened since the
    /// snapshot is lost, as after a restart from an old RDB file. Persistence is turned back
    /// on (from the loaded data) once it runs.
    pub async fn restart_from(&mut self, snapshot: &std::path::Path) {
        self.stop();
        let _ = std::fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        std::fs::copy(snapshot, self.dir.path().join("dump.rdb")).expect("restore the snapshot");
        self.extra
            .extend(["--appendonly".to_owned(), "no".to_owned()]);
        let spawned = self.spawn();
        self.extra.truncate(self.extra.len() - 2);
        assert!(
            spawned,
            "redis-server did not come back on port {}",
            self.port
        );
        let _: String = self
            .cmd(&["CONFIG", "SET", "appendonly", "yes"])
            .await
            .expect("persistence back on");
    }

    /// Copy the master's append-only files (its `appendonlydir`) to `to` as they stand:
    /// every write it has answered is in them (Redis writes the file before it replies),
    /// fsynced or not. What a crash would leave on disk with `appendfsync everysec`, had it
    /// come now.
    pub fn copy_aof(&self, to: &std::path::Path) {
        let from = self.dir.path().join("appendonlydir");
        std::fs::create_dir_all(to).expect("the copy's folder");
        for entry in std::fs::read_dir(&from).expect("appendonlydir (is appendonly on?)") {
            let entry = entry.expect("an append-only file");
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy it");
        }
    }

    /// Kill the master and start it again from the append-only files copied at `from`
    /// (`copy_aof`): the writes it answered since the copy are lost and the rest kept, as
    /// after a crash that took the last second of an `appendfsync everysec` master.
    pub fn restart_with_aof(&mut self, from: &std::path::Path) {
        self.restart_with_aof_as(from, &[]);
    }

    /// [`Self::restart_with_aof`], the restarted process given `extra` arguments too (its
    /// later restarts are not).
    pub fn restart_with_aof_as(&mut self, from: &std::path::Path, extra: &[&str]) {
        self.stop();
        let dir = self.dir.path().join("appendonlydir");
        std::fs::remove_dir_all(&dir).expect("remove the append-only files");
        std::fs::create_dir_all(&dir).expect("appendonlydir");
        for entry in std::fs::read_dir(from).expect("the copy") {
            let entry = entry.expect("a copied file");
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("put it back");
        }
        let kept = self.extra.len();
        self.extra.extend(extra.iter().map(|s| s.to_string()));
        let spawned = self.spawn();
        self.extra.truncate(kept);
        assert!(
            spawned,
            "redis-server did not come back on port {}",
            self.port
        );
    }

    /// Sends the command `args` until its answer, read as a number, passes `ok` (5 s at
    /// most; a panic naming `what` otherwise).
    pub async fn until(&self, what: &str, args: &[&str], ok: impl Fn(i64) -> bool) {
        wait_for(what, Duration::from_secs(5), async || {
            ok(self.cmd::<i64>(args).await.ok()?).then_some(())
        })
        .await;
    }

    /// A command on this master, with a short timeout: its answer within 500 ms (redis-rs's
    /// default), so that a paused master fails it fast.
    pub async fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        self.cmd_within(args, Duration::from_millis(500)).await
    }

    /// [`Self::cmd`], with `reply` for the answer to arrive in.
    pub async fn cmd_within<T: redis::FromRedisValue>(
        &self,
        args: &[&str],
        reply: Duration,
    ) -> redis::RedisResult<T> {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(reply));
        let mut conn = tokio::time::timeout(
            Duration::from_secs(2),
            self.client()
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await
    }
}

impl Drop for RedisMaster {
    fn drop(&mut self) {
        // SIGKILL ends a paused (SIGSTOPped) master too.
        self.stop();
    }
}

/// A free port whose cluster bus port (10000 above it) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55000 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A real Redis Cluster on loopback: `n` primaries, no replicas, each a `RedisMaster` (its
/// own directory and port; killing and starting one again keeps its slots, as
/// `nodes.conf` stays). A shard that is down does not stop the others
/// (`cluster-require-full-coverage no`), and a brief restart is not a failure.
pub struct RedisCluster {
    pub shards: Vec<RedisMaster>,
}

impl RedisCluster {
    pub fn start(n: usize) -> Self {
        Self::start_with_replicas(n, 0)
    }

    /// `n` primaries with `replicas` replicas each (`shards` holds the primaries first, as
    /// `redis-cli --cluster create` deals the roles: the first `n` nodes are primaries).
    pub fn start_with_replicas(n: usize, replicas: usize) -> Self {
        Self::start_all(n, replicas, false)
    }

    /// `n` primaries whose clocks can be moved (`RedisMaster::set_clock_offset`).
    pub fn start_with_movable_clocks(n: usize) -> Self {
        Self::start_all(n, 0, true)
    }

    /// `n` primaries started with `extra` redis-server arguments too (a persistence).
    pub fn start_with_args(n: usize, extra: &[&str]) -> Self {
        Self::start_all_with(n, 0, false, extra)
    }

    /// The flags every node of a test cluster starts with.
    const NODE_FLAGS: [&str; 8] = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "30000",
        "--cluster-require-full-coverage",
        "no",
    ];

    fn start_all(n: usize, replicas: usize, movable: bool) -> Self {
        Self::start_all_with(n, replicas, movable, &[])
    }

    fn start_all_with(n: usize, replicas: usize, movable: bool, extra: &[&str]) -> Self {
        let n = n * (1 + replicas);
        let flags: Vec<&str> = Self::NODE_FLAGS.iter().chain(extra).copied().collect();
        let shards: Vec<RedisMaster> = (0..n)
            .map(|_| RedisMaster::start_on(free_cluster_port, None, &flags, movable))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(shards.iter().map(|s| format!("127.0.0.1:{}", s.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli (installed with redis-server)");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Self { shards };
        let started = Instant::now();
        while !cluster.ok() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(POLL);
        }
        cluster
    }

    /// A new node joined to the cluster as a replica of shard `of`, in sync with it: its
    /// index in `shards`.
    pub async fn attach_replica(&mut self, of: usize) -> usize {
        let node = RedisMaster::start_on(free_cluster_port, None, &Self::NODE_FLAGS, false);
        let port = self.shards[of].port.to_string();
        let _: String = node
            .cmd(&["CLUSTER", "MEET", "127.0.0.1", &port])
            .await
            .expect("CLUSTER MEET");
        let id: String = self.shards[of]
            .cmd(&["CLUSTER", "MYID"])
            .await
            .expect("CLUSTER MYID");
        // REPLICATE needs the primary known to the new node: the handshake is gossip.
        wait_for(
            "the new node to know its primary",
            Duration::from_secs(10),
            async || {
                let _: String = node.cmd(&["CLUSTER", "REPLICATE", &id]).await.ok()?;
                Some(())
            },
        )
        .await;
        wait_for(
            "the new replica to be in sync",
            Duration::from_secs(10),
            async || {
                let info: String = node.cmd(&["INFO", "replication"]).await.ok()?;
                info.contains("master_link_status:up").then_some(())
            },
        )
        .await;
        self.shards.push(node);
        self.shards.len() - 1
    }

    /// Fail shard `from` over to its replica `to` (`CLUSTER FAILOVER`, coordinated with the
    /// primary, so that nothing acknowledged is lost), done once the cluster's slot map (as
    /// its first node reads it) has `to` serve `slot`. A manual failover the cluster gives up on (after five seconds, on
    /// a loaded machine) is asked for again.
    pub async fn fail_over(&self, to: usize, slot: u16) {
        let started = Instant::now();
        loop {
            let _: String = self.shards[to]
                .cmd(&["CLUSTER", "FAILOVER"])
                .await
                .expect("CLUSTER FAILOVER");
            let asked = Instant::now();
            while asked.elapsed() < Duration::from_secs(6) {
                if self.shard_of_slot(slot) == to {
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the cluster did not fail over to its replica"
            );
            eprintln!(
                "the cluster gave up a manual failover after {:?}; asking again",
                asked.elapsed()
            );
        }
    }

    /// Whether every node says `cluster_state:ok` and knows every other.
    fn ok(&self) -> bool {
        self.shards.iter().all(|s| {
            let Ok(mut conn) = s
                .client()
                .get_connection_with_timeout(Duration::from_millis(200))
            else {
                return false;
            };
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query::<String>(&mut conn)
                .is_ok_and(|info| {
                    info.contains("cluster_state:ok")
                        && info.contains(&format!("cluster_known_nodes:{}", self.shards.len()))
                })
        })
    }

    /// The URL redlockd is given: the first node as the seed.
    pub fn url(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", self.shards[0].port)
    }

    /// The index of the shard that serves `slot`, by the cluster's own slot map.
    pub fn shard_of_slot(&self, slot: u16) -> usize {
        let mut conn = self.shards[0]
            .client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("a cluster node");
        let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("CLUSTER SLOTS");
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(start)),
                Some(redis::Value::Int(end)),
                Some(redis::Value::Array(node)),
            ) = (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            let Some(redis::Value::Int(port)) = node.get(1) else {
                continue;
            };
            if (*start..=*end).contains(&i64::from(slot)) {
                return self
                    .shards
                    .iter()
                    .position(|s| i64::from(s.port) == *port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no shard serves slot {slot}");
    }
}

/// Assert that an answer is the contract's error `code`, with `status`.
pub fn assert_error(got: u16, body: &Value, status: u16, code: &str) {
    assert_eq!((got, &body["error"]), (status, &json!(code)), "{body}");
}

/// The path of a lease granted on `route` (`/locks/doc`, `/semaphores/pool`): where it is
/// renewed, checked and revoked.
pub fn lease_path(route: &str, lease: &Value) -> String {
    let id = lease["lease_id"].as_str().expect("a lease");
    format!("{route}/leases/{id}")
}

/// A request sent and its answer's body read as JSON, whatever the status (a transport
/// error or a body that is not JSON fails the test).
pub trait SendJson {
    fn value(self) -> impl std::future::Future<Output = Value> + Send;
}

impl SendJson for reqwest::RequestBuilder {
    async fn value(self) -> Value {
        self.send().await.unwrap().json().await.unwrap()
    }
}

/// `shown` (a master or a shard as `/readyz` lists it) when its `problem` says `words`.
pub fn problem_says(shown: Value, words: &str) -> Option<Value> {
    shown["problem"]
        .as_str()
        .is_some_and(|p| p.contains(words))
        .then_some(shown)
}

/// A grant sent in the background (`TestApp::grant_in_background`), which must be granted:
/// its lease, and how long after `since` it was answered.
pub async fn granted_since(
    waiter: tokio::task::JoinHandle<(u16, Value, Instant)>,
    since: Instant,
) -> (Value, Duration) {
    let (status, lease, at) = waiter.await.expect("the waiting grant");
    assert_eq!(status, 201, "{lease}");
    (lease, at.saturating_duration_since(since))
}

/// A waiting grant woken by what happened at `since` (a release, a stream's end): granted
/// within `bound` of it (an announcement, not a poll or a TTL), with a token above
/// `above` when given. Its lease.
pub async fn woken_within(
    waiter: tokio::task::JoinHandle<(u16, Value, Instant)>,
    since: Instant,
    bound: Duration,
    above: Option<u64>,
) -> Value {
    let (lease, took) = granted_since(waiter, since).await;
    eprintln!("granted {took:?} after what was to wake it");
    assert!(
        took < bound,
        "granted {took:?} after what was to wake it: not woken by it (polled, or at a TTL)"
    );
    if let Some(above) = above {
        assert!(lease["fencing_token"].as_u64().unwrap() > above, "{lease}");
    }
    lease
}

/// The `field` of each item of the array `list` (a listing's names, `/readyz`'s addresses).
pub fn each<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .expect("an array")
        .iter()
        .map(|item| item[field].as_str().expect("a string"))
        .collect()
}

/// What the first master's (cluster's) `/readyz` entry says of its shard at `address`.
pub fn shard_in(ready: &Value, address: &str) -> Value {
    ready["masters"][0]["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .find(|s| s["address"] == address)
        .cloned()
        .expect("the shard is listed")
}

/// Master `m` as `/readyz` (`ready`) lists it.
pub fn master_in<'a>(ready: &'a Value, m: &RedisMaster) -> &'a Value {
    let address = format!("redis://127.0.0.1:{}", m.port);
    ready["masters"]
        .as_array()
        .expect("masters")
        .iter()
        .find(|x| x["address"] == address.as_str())
        .expect("master listed")
}

/// The clock shim (`clockshim.c`), built once per test process with gcc into the target
/// directory's scratch space.
pub fn clock_shim() -> PathBuf {
    static SHIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        let code = include_str!("clockshim.c");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        // Named by its source, so test processes share one build; each builds under its
        // own name and renames, so none loads a half-written library.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(code, &mut hasher);
        let shim = dir.join(format!(
            "clockshim-{:016x}.so",
            std::hash::Hasher::finish(&hasher)
        ));
        if shim.exists() {
            return shim;
        }
        let source = dir.join(format!("clockshim-{}.c", std::process::id()));
        let built = dir.join(format!("clockshim-{}.so", std::process::id()));
        std::fs::write(&source, code).expect("write clockshim.c");
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&built)
            .arg(&source)
            .status()
            .expect("gcc builds the clock shim (apt-get install -y gcc)");
        assert!(status.success(), "gcc could not build the clock shim");
        std::fs::rename(&built, &shim).expect("move the clock shim in place");
        let _ = std::fs::remove_file(&source);
        shim
    })
    .clone()
}

/// `n` fresh masters.
pub fn masters(n: usize) -> Vec<RedisMaster> {
    (0..n).map(|_| RedisMaster::start()).collect()
}

/// Two redlockd replicas in process over `masters`, each master step given 200 ms (so that
/// a loaded machine does not make a test's grants fail).
pub async fn two_replicas(masters: &[RedisMaster]) -> (TestApp, TestApp) {
    let mut cfg = config(masters);
    cfg.master_timeout_ms = 200;
    (TestApp::spawn(cfg.clone()).await, TestApp::spawn(cfg).await)
}

/// Three fresh masters and two replicas over them (as `two_replicas`): the masters are
/// returned so that the caller keeps them running for as long as it needs them.
pub async fn two_replicas_over_three() -> (Vec<RedisMaster>, TestApp, TestApp) {
    let masters = masters(3);
    let (a, b) = two_replicas(&masters).await;
    (masters, a, b)
}

/// Settings under which a master restarted empty sits out about two seconds, so that a
/// test sees its return: the largest TTL a client may ask is 2 s (1 s by default) and kept
/// holds are off (the quarantine is then the largest TTL, and the largest lock-delay in
/// force, which a test that wants the TTL alone turns off with `max_lock_delay_ms`). A
/// master step is given 200 ms, as `two_replicas` gives it, so that a loaded machine does
/// not make the test's grants fail.
pub fn short_quarantine(cfg: &mut Config) {
    cfg.master_timeout_ms = 200;
    cfg.max_ttl_ms = 2000;
    cfg.max_kept_hold_ms = Some(0);
    cfg.default_ttl_ms = 1000;
}

/// A configuration for tests: port 0, the given masters (none: the embedded store),
/// everything else as the contract's defaults.
pub fn config<'a>(masters: impl IntoIterator<Item = &'a RedisMaster>) -> Config {
    let mut config = Config::from_env().expect("default config");
    config.listen = "127.0.0.1:0".into();
    config.redis_urls = masters.into_iter().map(RedisMaster::url).collect();
    config
}

/// A redlockd app running in this process: behind a real listener (`spawn`: the wire, the
/// connection limits, streams whose client hangs up) or driven through its router with
/// `oneshot` (`in_process`: no socket, for the contract, validation, auth and ops tests).
/// The request helpers are the same for both.
pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    /// The app's event bus, to observe locks as an embedding program would.
    pub events: std::sync::Arc<redlockd::lease::Events>,
    router: Option<axum::Router>,
    app: Option<App>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn init_test_logging() {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A request to a `TestApp`, over either transport.
pub struct Call<'a> {
    app: &'a TestApp,
    method: reqwest::Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// What a `Call` answered.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

impl Answer {
    /// The body as JSON: `null` when empty, `{"raw": …}` when not JSON.
    pub fn json(&self) -> Value {
        if self.text.is_empty() {
            json!(null)
        } else {
            serde_json::from_str(&self.text).unwrap_or_else(|_| json!({ "raw": self.text }))
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Call<'_> {
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    pub fn json(mut self, body: &Value) -> Self {
        self.body = serde_json::to_vec(body).expect("JSON body");
        self.header("content-type", "application/json")
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The status and headers only: the body is dropped unread (an event stream that would
    /// not end).
    pub async fn send_head(self) -> Answer {
        self.exchange(false).await
    }

    pub async fn send(self) -> Answer {
        self.exchange(true).await
    }

    /// Send over whichever transport the app has.
    async fn dispatch(self) -> Dispatched {
        let Some(router) = self.app.router.clone() else {
            let mut request = self
                .app
                .http
                .request(self.method, self.app.url(&self.path))
                .body(self.body);
            for (k, v) in &self.headers {
                request = request.header(k, v);
            }
            return Dispatched::Socket(request.send().await.expect("request"));
        };
        use tower::ServiceExt as _;
        let mut request = axum::http::Request::builder()
            .method(self.method.as_str())
            .uri(&self.path);
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let request = request
            .body(axum::body::Body::from(self.body))
            .expect("a valid request");
        Dispatched::InProcess(router.oneshot(request).await.expect("infallible"))
    }

    async fn exchange(self, read_body: bool) -> Answer {
        let response = match self.dispatch().await {
            Dispatched::Socket(response) => {
                let (status, headers) = (response.status().as_u16(), response.headers().clone());
                let text = if read_body {
                    response.text().await.expect("body")
                } else {
                    String::new()
                };
                return Answer {
                    status,
                    headers,
                    text,
                };
            }
            Dispatched::InProcess(response) => response,
        };
        let status = response.status().as_u16();
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in response.headers() {
            headers.append(
                reqwest::header::HeaderName::from_bytes(k.as_str().as_bytes()).expect("name"),
                reqwest::header::HeaderValue::from_bytes(v.as_bytes()).expect("value"),
            );
        }
        let bytes = if read_body {
            axum::body::to_bytes(response.into_body(), 64 << 20)
                .await
                .expect("body")
        } else {
            Default::default()
        };
        Answer {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }
}

/// A request's raw answer, from either transport.
enum Dispatched {
    Socket(reqwest::Response),
    InProcess(axum::response::Response),
}

impl TestApp {
    /// An app behind a listener over `masters`, with the test's own settings (`tweak`)
    /// over `config`'s.
    pub async fn over<'a>(
        masters: impl IntoIterator<Item = &'a RedisMaster>,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let mut cfg = config(masters);
        tweak(&mut cfg);
        Self::spawn(cfg).await
    }

    pub async fn spawn(config: Config) -> Self {
        init_test_logging();
        let app = App::new(config).await.expect("app builds");
        let listener = app.bind().await.expect("bound");
        let addr = listener.local_addr().expect("bound");
        let events = app.events();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base: format!("http://{addr}"),
            http: http_builder()
                .timeout(Duration::from_secs(90))
                .build()
                .expect("http client"),
            router: None,
            app: None,
            stop: Some(stop),
            task: Some(task),
            events,
        }
    }

    /// The app with no socket: each request goes through its router with `oneshot`.
    pub async fn in_process(config: Config) -> Self {
        init_test_logging();
        Self::in_process_app(App::new(config).await.expect("app builds"))
    }

    /// In process, over `nodes` (memory nodes a test can fail) in place of the masters:
    /// quorum loss through the router, under paused time.
    pub async fn with_nodes(
        config: Config,
        nodes: &[std::sync::Arc<redlockd::store::memory::MemoryNode>],
    ) -> Self {
        init_test_logging();
        let nodes = nodes
            .iter()
            .map(|n| n.clone() as std::sync::Arc<dyn redlockd::store::node::LockNode>)
            .collect();
        Self::in_process_app(App::with_nodes(config, nodes).await.expect("app builds"))
    }

    /// In process over three fresh memory nodes, once its first probe has counted them
    /// (`until_ready`): the nodes, for a test to fail.
    pub async fn over_three_nodes(
        config: Config,
    ) -> (
        Self,
        Vec<std::sync::Arc<redlockd::store::memory::MemoryNode>>,
    ) {
        let nodes: Vec<_> = (0..3)
            .map(|i| std::sync::Arc::new(redlockd::store::memory::MemoryNode::new(format!("m{i}"))))
            .collect();
        let app = Self::with_nodes(config, &nodes).await;
        app.until_ready().await;
        (app, nodes)
    }

    /// Wait (bounded) until `/readyz` answers 200: the nodes are probed and vote.
    pub async fn until_ready(&self) {
        wait_for("readiness", Duration::from_secs(30), async || {
            (self.get("/readyz").await.0 == 200).then_some(())
        })
        .await;
    }

    /// Two replicas in process over the same three memory masters, each with `config`.
    pub async fn replicas_in_process(config: Config) -> (Self, Self) {
        let nodes: Vec<std::sync::Arc<redlockd::store::memory::MemoryNode>> = (0..3)
            .map(|i| std::sync::Arc::new(redlockd::store::memory::MemoryNode::new(format!("m{i}"))))
            .collect();
        let a = Self::with_nodes(config.clone(), &nodes).await;
        let b = Self::with_nodes(config, &nodes).await;
        (a, b)
    }

    fn in_process_app(app: App) -> Self {
        Self {
            // Nothing listens: a request sent over a socket by mistake fails at once.
            base: "http://in-process.invalid".into(),
            http: http(),
            events: app.events(),
            router: Some(app.router()),
            app: Some(app),
            stop: None,
            task: None,
        }
    }

    /// Open a session held by a stream, with `query` (`ttl_ms=…&grace_ms=…`): the stream,
    /// past its `opened`, and the session's id.
    pub async fn hold_session(&self, query: &str) -> (EventStream, String) {
        let mut stream = self
            .call("POST", &format!("/sessions?{query}"))
            .header("accept", "text/event-stream")
            .send_stream()
            .await;
        let opened = stream.expect("opened").await;
        let id = opened["session_id"].as_str().unwrap().to_owned();
        (stream, id)
    }

    /// The request that resumes the held stream of `lease`, of the lock, semaphore or
    /// election at `route` (`/locks/<name>`, …), through this replica (`body`: its fields):
    /// send it with `stream()`.
    pub fn resume_hold(&self, route: &str, lease: &str, body: Value) -> Call<'_> {
        self.call("POST", &format!("{route}/leases/{lease}/hold"))
            .json(&body)
    }

    /// Resume session `id`'s held stream through this replica (`body`: its fields).
    pub async fn resume_session(&self, id: &str, body: Value) -> EventStream {
        self.call("POST", &format!("/sessions/{id}/hold"))
            .json(&body)
            .send_stream()
            .await
    }

    /// Drop `stream` (its connection closes without a revoke) while a grant of `name`
    /// (lock class `class`) waits on this replica: the waiter is granted, and no sooner
    /// than `grace` after the drop, which the hold outlived its connection by.
    pub async fn granted_after_grace(
        &self,
        name: &str,
        class: &str,
        stream: EventStream,
        grace: Duration,
    ) {
        let (waiter, left) = self.dropped_under_waiter(name, class, stream).await;
        let (_, after) = granted_since(waiter, left).await;
        assert!(
            after >= grace,
            "granted {after:?} after the connection closed, within its grace"
        );
    }

    /// Drop `stream`, which holds `name` with the fencing token `token`, while a grant of
    /// `name` (its lock class too) waits on this replica: the drop wakes the waiter, within
    /// `bound`. The waiter's lease.
    pub async fn woken_by_drop(
        &self,
        name: &str,
        stream: EventStream,
        token: u64,
        bound: Duration,
    ) -> Value {
        let (waiter, left) = self.dropped_under_waiter(name, name, stream).await;
        woken_within(waiter, left, bound, Some(token)).await
    }

    /// A grant of `name` (lock class `class`) put in line on this replica, then `stream`
    /// dropped (its connection closes without a revoke): the waiting grant, and when the
    /// stream was dropped.
    async fn dropped_under_waiter(
        &self,
        name: &str,
        class: &str,
        stream: EventStream,
    ) -> (tokio::task::JoinHandle<(u16, Value, Instant)>, Instant) {
        let waiter = self
            .grant_in_line(name, json!({"wait_ms": 10_000}), class, 1)
            .await;
        let left = Instant::now();
        drop(stream);
        (waiter, left)
    }

    /// Another handle on the same app, over the same transport, for a request sent from a
    /// task of its own (the app stays owned by `self`).
    pub fn handle(&self) -> Self {
        Self {
            base: self.base.clone(),
            http: self.http.clone(),
            events: self.events.clone(),
            router: self.router.clone(),
            app: None,
            stop: None,
            task: None,
        }
    }

    /// The embedded store, defaults otherwise, in process.
    pub async fn embedded() -> Self {
        Self::in_process(config(&[])).await
    }

    /// Stop the app gracefully and wait until it has stopped.
    pub async fn stop(mut self) {
        if let Some(app) = self.app.take() {
            app.stop();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("app task").expect("app ran");
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request of any method to `path`, over this app's transport.
    pub fn call(&self, method: &str, path: &str) -> Call<'_> {
        Call {
            app: self,
            method: method.parse().expect("an HTTP method"),
            path: path.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// POST /locks/{name} with `body` as JSON; returns the status and the JSON body.
    pub async fn grant(&self, name: &str, body: Value) -> (u16, Value) {
        self.json_call("POST", &format!("/locks/{name}"), Some(&body))
            .await
    }

    /// A grant at `route` under Idempotency-Key `key`: what a client's retries send.
    pub async fn keyed(&self, route: &str, key: &str, body: Value) -> Answer {
        self.call("POST", route)
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
    }

    /// The status of `method` on the lease `lease` granted on `route` (`/locks/doc`):
    /// a renew (`PUT`), a check (`GET`) or a revoke (`DELETE`) with no body.
    pub async fn lease_status(&self, method: &str, route: &str, lease: &Value) -> u16 {
        self.send(method, &lease_path(route, lease), None).await.0
    }

    /// A grant that must succeed; returns (lease_id, fencing_token).
    pub async fn must_grant(&self, name: &str, body: Value) -> (String, u64) {
        let (status, lease) = self.grant(name, body).await;
        assert_eq!(status, 201, "grant of {name} failed: {lease}");
        (
            lease["lease_id"].as_str().expect("lease_id").to_owned(),
            lease["fencing_token"].as_u64().expect("token"),
        )
    }

    /// A grant sent in the background that finds `name` held and waits: returned once it
    /// is in line, the `nth` contended grant of lock class `class` on this replica.
    pub async fn grant_in_line(
        &self,
        name: &str,
        body: Value,
        class: &str,
        nth: usize,
    ) -> tokio::task::JoinHandle<(u16, Value, Instant)> {
        let waiter = self.grant_in_background(name, body);
        self.wait_for_contention(class, nth).await;
        waiter
    }

    /// A grant sent in the background, typically one that waits: the handle yields its
    /// status, its body and when it was answered.
    pub fn grant_in_background(
        &self,
        name: &str,
        body: Value,
    ) -> tokio::task::JoinHandle<(u16, Value, Instant)> {
        let path = format!("/locks/{name}");
        if self.router.is_some() {
            let bed = self.handle();
            return tokio::spawn(async move {
                let (status, body) = bed.json_call("POST", &path, Some(&body)).await;
                (status, body, Instant::now())
            });
        }
        let request = self.http.post(self.url(&path)).json(&body);
        tokio::spawn(async move {
            let response = request.send().await.expect("grant request");
            let status = response.status().as_u16();
            let text = response.text().await.expect("body");
            let answer = Answer {
                status,
                headers: Default::default(),
                text,
            };
            (status, answer.json(), Instant::now())
        })
    }

    /// Wait until this replica hears every master's announcements (`/readyz` says each is
    /// subscribed): before then, another replica's announcement may pass it by.
    pub async fn hears_every_master(&self) {
        wait_for(
            "every master's announcements heard",
            Duration::from_secs(10),
            async || {
                let (_, ready) = self.get("/readyz").await;
                let masters = ready["masters"].as_array()?.clone();
                masters
                    .iter()
                    .all(|m| m["subscribed"] == true)
                    .then_some(())
            },
        )
        .await;
    }

    /// Wait until no held stream is open here: each stream's task (and what its end
    /// revokes) is over.
    pub async fn streams_done(&self) {
        self.streams_of_kind_done("hold").await;
    }

    /// Every held stream of a session on this replica has ended, its grace included.
    pub async fn session_streams_done(&self) {
        self.streams_of_kind_done("session").await;
    }

    async fn streams_of_kind_done(&self, kind: &str) {
        let line = format!("redlockd_streams_active{{kind=\"{kind}\"}}");
        let open = || async {
            let metrics = self.text("/metrics").await;
            metrics
                .lines()
                .find(|l| l.starts_with(&line))
                .and_then(|l| l.split_whitespace().last())
                .map(str::to_owned)
        };
        within(
            Duration::from_secs(10),
            async {
                while open().await.as_deref() != Some("0") {
                    tokio::time::sleep(POLL).await;
                }
            },
            "every held stream ended",
        )
        .await;
    }

    /// Wait until `count` grants of `class` have found their lock held: a waiting grant is
    /// then in line.
    pub async fn wait_for_contention(&self, class: &str, count: usize) {
        let line = format!(r#"redlockd_contention_total{{lock_class="{class}"}} {count}"#);
        self.wait_for_metrics(&format!("{count} contended grants of {class}"), &line)
            .await;
    }

    /// Wait (5 s at most) until `/metrics` shows `text` (a series and its value).
    pub async fn wait_for_metrics(&self, what: &str, text: &str) {
        wait_for(what, Duration::from_secs(5), async || {
            self.text("/metrics").await.contains(text).then_some(())
        })
        .await;
    }

    pub async fn renew(&self, name: &str, lease: &str, body: Value) -> (u16, Value) {
        self.json_call("PUT", &format!("/locks/{name}/leases/{lease}"), Some(&body))
            .await
    }

    pub async fn revoke(&self, name: &str, lease: &str) -> (u16, Value) {
        self.json_call("DELETE", &format!("/locks/{name}/leases/{lease}"), None)
            .await
    }

    pub async fn check(&self, name: &str, lease: &str) -> (u16, Value) {
        self.get(&format!("/locks/{name}/leases/{lease}")).await
    }

    pub async fn inspect(&self, name: &str) -> (u16, Value) {
        self.get(&format!("/locks/{name}")).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.json_call("GET", path, None).await
    }

    pub async fn text(&self, path: &str) -> String {
        self.call("GET", path).send().await.text
    }

    /// Any route: the status and the JSON answer of `method path` with `body`, if any.
    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.json_call(method, path, body.as_ref()).await
    }

    /// `POST path` with `body`, which must be answered 201: the answer.
    pub async fn created(&self, path: &str, body: Value) -> Value {
        let (status, answer) = self.json_call("POST", path, Some(&body)).await;
        assert_eq!(status, 201, "POST {path}: {answer}");
        answer
    }

    /// DELETE `path`, which must answer 204 (a revoke, a resign, a session's end).
    pub async fn deleted(&self, path: &str) {
        let (status, answer) = self.json_call("DELETE", path, None).await;
        assert_eq!(status, 204, "DELETE {path}: {answer}");
    }

    async fn json_call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut call = self.call(method, path);
        if let Some(body) = body {
            call = call.json(body);
        }
        let answer = call.send().await;
        (answer.status, answer.json())
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(app) = self.app.take() {
            app.stop();
        }
    }
}

/// A server-sent event stream, read one event at a time. Dropping it is the client
/// leaving (the connection closes, or the in-process body is dropped).
pub struct EventStream {
    pub status: u16,
    /// The response's `content-encoding`, if any.
    pub encoding: Option<String>,
    body: StreamBody,
    buffer: String,
}

enum StreamBody {
    Socket(reqwest::Response),
    InProcess(axum::body::BodyDataStream),
}

impl Call<'_> {
    /// Send the request asking for an event stream (`Accept: text/event-stream`).
    pub async fn stream(self) -> EventStream {
        self.header("accept", "text/event-stream")
            .send_stream()
            .await
    }

    /// Send the request as it is and read the answer as an event stream.
    pub async fn send_stream(self) -> EventStream {
        let response = match self.dispatch().await {
            Dispatched::Socket(response) => return EventStream::read(response),
            Dispatched::InProcess(response) => response,
        };
        EventStream {
            status: response.status().as_u16(),
            encoding: content_encoding(response.headers()),
            body: StreamBody::InProcess(response.into_body().into_data_stream()),
            buffer: String::new(),
        }
    }
}

/// A response's `content-encoding`, if any.
fn content_encoding(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("content-encoding")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

impl EventStream {
    /// Send `request` asking for a stream.
    pub async fn open(request: reqwest::RequestBuilder) -> Self {
        let response = request
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("stream request");
        Self::read(response)
    }

    /// Read `response` as an event stream.
    pub fn read(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            encoding: content_encoding(response.headers()),
            body: StreamBody::Socket(response),
            buffer: String::new(),
        }
    }

    /// The next event's name and JSON data (comments and keep-alives skipped), or `None`
    /// when the stream ends.
    pub async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let value = serde_json::from_str(&data).expect("JSON event data");
                return Some((name, value));
            }
            let chunk = match &mut self.body {
                StreamBody::Socket(response) => response.chunk().await.ok().flatten(),
                StreamBody::InProcess(body) => {
                    futures::StreamExt::next(body).await.and_then(Result::ok)
                }
            };
            match chunk {
                Some(chunk) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                None => return None,
            }
        }
    }

    /// The next event, which must be `name`; its data.
    pub async fn expect(&mut self, name: &str) -> Value {
        let got = tokio::time::timeout(Duration::from_secs(10), self.next())
            .await
            .unwrap_or_else(|_| panic!("no {name} event within 10 s"));
        match got {
            Some((n, data)) if n == name => data,
            other => panic!("expected {name}, got {other:?}"),
        }
    }

    /// The stream's first event, which must be `name`, in a 200 answer; its data.
    pub async fn expect_first(&mut self, name: &str) -> Value {
        assert_eq!(self.status, 200, "a stream, not a refusal");
        self.expect(name).await
    }

    /// The `closed` event that ends a stream displaced by a resume elsewhere (at its next
    /// renew), past any heartbeats before it; then the stream's end.
    pub async fn displaced(&mut self) -> Value {
        let closed = within(
            Duration::from_secs(5),
            async {
                loop {
                    match self.next().await {
                        Some((event, body)) if event == "closed" => break body,
                        Some((event, _)) if event == "heartbeat" => continue,
                        other => panic!("expected closed, got {other:?}"),
                    }
                }
            },
            "the older stream is told it was displaced",
        )
        .await;
        assert_eq!(closed["reason"], "resumed", "{closed}");
        assert!(self.next().await.is_none(), "the older stream ends");
        closed
    }
}

/// A redlockd process serving on a free port, killed on drop.
pub struct Server {
    pub child: Child,
    pub base: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    pub async fn start(envs: &[(&str, &str)]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_redlockd"))
            .env_clear()
            .env("REDLOCKD_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "debug")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn redlockd");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            stderr,
        };
        serving(&server.base, "redlockd to serve").await;
        server
    }

    /// Wait until `/readyz` says the replica can grant.
    pub async fn wait_ready(&self, what: &str) {
        wait_for(what, Duration::from_secs(10), async || {
            self.text("/readyz")
                .await
                .contains(r#""ready":true"#)
                .then_some(())
        })
        .await;
    }

    pub async fn post(&self, path: &str) -> reqwest::Response {
        let url = format!("{}{path}", self.base);
        http().post(url).send().await.expect("POST")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        let url = format!("{}{path}", self.base);
        http().get(url).send().await.expect("GET")
    }

    pub async fn text(&self, path: &str) -> String {
        self.get(path).await.text().await.expect("body")
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Send `sig` (`-TERM`, `-HUP`, …) to the process `pid`, which this test started.
pub fn signal(pid: u32, sig: &str) {
    assert!(pid > 1, "only a process of our own");
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {sig} {pid} failed");
}

/// Three tokens in a token file: a client and a reader on `jobs:`, an administrator.
pub struct Tokens {
    pub client: String,
    pub reader: String,
    pub admin: String,
    pub file: tempfile::NamedTempFile,
}

pub fn write_tokens(file: &std::path::Path, entries: &[TokenEntry]) {
    std::fs::write(file, json!({ "tokens": entries }).to_string()).unwrap();
}

pub fn tokens() -> Tokens {
    let (client, c) = new_token("ci-jobs", Role::Client, vec!["jobs:".into()]);
    let (reader, r) = new_token("grafana", Role::Reader, vec!["jobs:".into()]);
    let (admin, a) = new_token("oncall", Role::Admin, vec![]);
    let file = tempfile::NamedTempFile::new().unwrap();
    write_tokens(file.path(), &[c, r, a]);
    Tokens {
        client,
        reader,
        admin,
        file,
    }
}

/// `method path` with `token` (if any); the status and the JSON body. A 401 must carry the
/// `WWW-Authenticate` challenge.
pub async fn call_as(app: &TestApp, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut call = app.call(method, path);
    if let Some(token) = token {
        call = call.bearer(token);
    }
    let answer = call.send().await;
    if answer.status == 401 {
        assert_eq!(
            answer.header("www-authenticate"),
            Some("Bearer realm=\"redlockd\"")
        );
    }
    (answer.status, answer.json())
}
