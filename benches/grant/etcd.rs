//! etcd 3.4's lock API as a peer row: the service a user would pick instead of redlockd,
//! measured in the same run, with the same load generator, on the same cores.
//!
//! Debian's `etcd-server` (3.4.23; `scripts/bench` and `scripts/test` install it) is started
//! here as a cluster of three members on free loopback ports, as redlockd runs over three
//! masters, and driven through its JSON gateway (`/v3/…`) as a client without an etcd
//! library would: a lease granted with a TTL, the lock taken under it (the lock's key carries
//! its revision, etcd's fencing token), unlocked, the lease revoked. Each client talks to
//! one member, the clients spread over the three, as a deployment's clients would be.
//!
//! etcd writes its log to disk and waits for `fsync` on every write; the masters here keep
//! no file at all (`--save "" --appendonly no`). So the rows run etcd with its data on tmpfs
//! (`/dev/shm`), where `fsync` costs nothing, the like-for-like figure, and one row at 16
//! clients with its data on disk, etcd as shipped.

use super::*;

/// A running etcd cluster on loopback, stopped (its members killed, by PID) when dropped.
pub(super) struct Etcd {
    members: Vec<Child>,
    clients: Vec<String>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

/// Where the etcd binary is, if installed.
fn etcd_binary() -> Option<&'static str> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl Etcd {
    /// `members` etcd members in one cluster, their data under tmpfs (`on_disk`: under the
    /// system's temporary folder); `None`, said on stderr, when etcd is not installed.
    pub(super) async fn start(members: usize, on_disk: bool) -> Option<Self> {
        let Some(bin) = etcd_binary() else {
            eprintln!("grant bench: etcd rows skipped, no etcd installed (Debian's etcd-server)");
            return None;
        };
        let shm = std::path::Path::new("/dev/shm");
        let dir = match on_disk || !shm.is_dir() {
            true => tempfile::tempdir(),
            false => tempfile::tempdir_in(shm),
        }
        .expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).expect("log");
            let child = Command::new(bin)
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                ])
                .args(["--initial-cluster", &cluster])
                .args(["--initial-cluster-state", "new", "--log-level", "error"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            children.push(child);
        }
        let etcd = Self {
            members: children,
            clients: ports
                .iter()
                .map(|(c, _)| format!("http://127.0.0.1:{c}"))
                .collect(),
            http: common::http_builder()
                .pool_max_idle_per_host(1024)
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            _dir: dir,
        };
        // Ready when every member answers a write (a leader is elected and reachable).
        let started = Instant::now();
        for c in 0..members {
            while etcd
                .call(c, "lease/grant", json!({"TTL": 5}))
                .await
                .is_err()
            {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "etcd did not become ready"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(etcd)
    }

    pub(super) fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Child::id).collect()
    }

    /// One call of the JSON gateway from client `c` (to its member), its answer's body.
    async fn call(&self, c: usize, path: &str, body: Value) -> Result<Value, ()> {
        self.call_within(c, path, body, Duration::from_secs(60))
            .await
    }

    async fn call_within(
        &self,
        c: usize,
        path: &str,
        body: Value,
        within: Duration,
    ) -> Result<Value, ()> {
        let member = &self.clients[c % self.clients.len()];
        let resp = self
            .http
            .post(format!("{member}/v3/{path}"))
            .json(&body)
            .timeout(within)
            .send()
            .await
            .map_err(drop)?;
        if !resp.status().is_success() {
            return Err(());
        }
        resp.json().await.map_err(drop)
    }

    /// A lease of `ttl_s` seconds, its id (int64 as a string, as the gateway writes it).
    async fn lease(&self, c: usize, ttl_s: u64) -> Result<String, ()> {
        let granted = self.call(c, "lease/grant", json!({"TTL": ttl_s})).await?;
        granted["ID"].as_str().map(str::to_owned).ok_or(())
    }

    /// Lock `name` under `lease`, waiting at most `within`: the lock's key.
    async fn lock(
        &self,
        c: usize,
        name: &str,
        lease: &str,
        within: Duration,
    ) -> Result<String, ()> {
        use base64::Engine as _;
        let name = base64::engine::general_purpose::STANDARD.encode(name);
        let locked = self
            .call_within(
                c,
                "lock/lock",
                json!({"name": name, "lease": lease}),
                within,
            )
            .await?;
        locked["key"].as_str().map(str::to_owned).ok_or(())
    }

    /// Unlock `key`, then revoke `lease`: the number of calls that failed.
    async fn let_go(&self, c: usize, key: Option<&str>, lease: &str) -> usize {
        let mut errors = 0;
        if let Some(key) = key {
            errors += usize::from(
                self.call(c, "lock/unlock", json!({"key": key}))
                    .await
                    .is_err(),
            );
        }
        errors += usize::from(
            self.call(c, "lease/revoke", json!({"ID": lease}))
                .await
                .is_err(),
        );
        errors
    }
}

/// One uncontended cycle of etcd's lock API, timed at the grant (lease grant and lock, as
/// redlockd's grant is one request that makes a lease and takes the name): then unlock and
/// revoke the lease.
pub(super) async fn etcd_cycle(etcd: Arc<Etcd>, c: usize) -> Tally {
    let name = format!("etcd:{c}");
    let t = Instant::now();
    let Ok(lease) = etcd.lease(c, 10).await else {
        return Tally::error();
    };
    let Ok(key) = etcd.lock(c, &name, &lease, Duration::from_secs(60)).await else {
        return Tally {
            errors: 1 + etcd.let_go(c, None, &lease).await,
            ..Tally::default()
        };
    };
    let took = t.elapsed();
    Tally::cycle(took, etcd.let_go(c, Some(&key), &lease).await)
}

/// One contended cycle on etcd: wait at most 5 s for the shared name (as redlockd's row
/// waits with `wait_ms` 5000), hold it for a moment, let go.
pub(super) async fn etcd_contended_cycle(
    etcd: Arc<Etcd>,
    last: Arc<Mutex<LastRelease>>,
    c: usize,
) -> Tally {
    let t = Instant::now();
    let Ok(lease) = etcd.lease(c, 10).await else {
        return Tally::error();
    };
    let locked = etcd.lock(c, "hot", &lease, Duration::from_secs(5)).await;
    let got = Instant::now();
    let Ok(key) = locked else {
        // Revoking the lease takes its place in etcd's line away with it.
        etcd.let_go(c, None, &lease).await;
        return Tally {
            timeouts: 1,
            ..Tally::default()
        };
    };
    let mut tally = Tally::cycle(got - t, 0);
    last.lock().await.count(c, got, &mut tally);
    last.lock().await.mark(c);
    tally.errors += etcd.let_go(c, Some(&key), &lease).await;
    tally
}
