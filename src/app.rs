//! Building and running the service: masters, engine, lease service, HTTP, background
//! tasks. Three steps kept apart, after axum's testing example: `App::new` builds the
//! state (no socket), `router` is the whole HTTP surface (tests drive it in process with
//! `oneshot`), and `serve` runs it on a listener the caller bound (port 0 works), so tests
//! start a real server without sleeping or guessing ports.

mod command;

pub use command::main;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::config::{Backend, Config, Settings};
use crate::http::{self, AppState};
use crate::lease::{Events, LeaseService, LockEvent};
use crate::metrics::Metrics;
use crate::redlock::{EngineConfig, Redlock};
use crate::store::clock::ClockPolicy;
use crate::store::cluster::ShardPolicy;
use crate::store::memory::MemoryNode;
use crate::store::node::LockNode;
use crate::store::node::{Announcement, Listener};
use crate::store::redis::RedisNode;

pub struct App {
    state: AppState,
    tls: Option<Arc<http::tls::Tls>>,
}

/// The masters the settings name, or the embedded store when they name none.
fn nodes(settings: &Settings) -> anyhow::Result<Vec<Arc<dyn LockNode>>> {
    let Backend::Redis(urls) = &settings.backend else {
        return Ok(vec![Arc::new(MemoryNode::embedded())]);
    };
    let engine = engine_config(settings);
    let policy = ShardPolicy {
        quarantine: engine.quarantine(),
        skip_quarantine: engine.unsafe_skip_quarantine,
        clock: ClockPolicy {
            drift_factor: settings.drift_factor,
            max_offset: settings.max_clock_offset,
            settle: engine.quarantine(),
            trust: settings.unsafe_trust_master_clocks,
        },
    };
    urls.iter()
        .map(|url| {
            RedisNode::with_policy(
                url,
                &settings.key_prefix,
                settings.master_timeout,
                settings.master_batch_max,
                policy,
            )
            .map(|n| Arc::new(n) as Arc<dyn LockNode>)
            .with_context(|| format!("REDLOCKD_REDIS_URLS: {url}"))
        })
        .collect()
}

fn engine_config(settings: &Settings) -> EngineConfig {
    EngineConfig {
        unsafe_skip_quarantine: settings.unsafe_skip_quarantine,
        max_lock_delay: settings.leases.max_lock_delay,
        ..EngineConfig::new(
            settings.master_timeout,
            settings.drift_factor,
            settings.leases.longest(),
        )
    }
}

/// What hears a master's announcements for this replica: releases wake its waiting grants,
/// grants and releases reach its observers, a gap makes every waiter look again.
pub fn listener(events: Arc<Events>) -> Listener {
    Arc::new(move |announced| match announced {
        Announcement::Freed(name) => events.wake(name),
        Announcement::Released(name, token) => events.publish(name, LockEvent::Released { token }),
        Announcement::Evicted(name, token) => events.publish(name, LockEvent::Evicted { token }),
        Announcement::Acquired(name, token) => events.publish(name, LockEvent::Acquired { token }),
        Announcement::Proclaimed(name, token) => {
            events.publish(name, LockEvent::Proclaimed { token })
        }
        Announcement::Missed => events.resync(),
    })
}

impl App {
    /// Validate `config`, connect (lazily) to the masters, probe them once and start the
    /// background tasks; nothing listens yet (`bind`, then `serve`, or `router` alone).
    pub async fn new(config: Config) -> anyhow::Result<Self> {
        let settings = config.settings()?;
        let nodes = nodes(&settings)?;
        Self::from_parts(settings, nodes).await
    }

    /// An app over `nodes` in place of the masters `config` names (the embedded store's
    /// nodes with a fault plan, say: quorum loss through the router, in process).
    pub async fn with_nodes(config: Config, nodes: Vec<Arc<dyn LockNode>>) -> anyhow::Result<Self> {
        Self::from_parts(config.settings()?, nodes).await
    }

    /// The app of `settings` over `nodes`: what `new` and `with_nodes` share.
    async fn from_parts(settings: Settings, nodes: Vec<Arc<dyn LockNode>>) -> anyhow::Result<Self> {
        // For rediss:// masters.
        crate::trust::use_ring();
        if settings.backend == Backend::Embedded {
            tracing::warn!(
                "no REDLOCKD_REDIS_URLS: serving from the embedded in-process store (one process, not distributed; for development and tests)"
            );
        } else {
            let masters: Vec<&str> = nodes.iter().map(|n| n.address()).collect();
            tracing::info!(?masters, "running Redlock over {} masters", nodes.len());
        }
        if settings.fleetlock == crate::config::FleetLock::Off(crate::config::FLEETLOCK_NEEDS_KEPT)
        {
            tracing::warn!("{}", crate::config::FLEETLOCK_NEEDS_KEPT);
        }
        if crate::config::dapr_off(settings.leases.max_ttl) {
            tracing::warn!("{}", crate::config::DAPR_NEEDS_A_SECOND);
        }
        if settings.unsafe_skip_quarantine {
            tracing::error!(
                "UNSAFE: REDLOCKD_UNSAFE_SKIP_QUARANTINE is set: masters that lost their data vote again at once, and two clients can hold one lock; for the fault suite only"
            );
        }
        let auth = match &settings.auth_file {
            Some(path) => {
                let auth = Auth::load(path, settings.auth_protect_operations, settings.auth_rate)
                    .map_err(|e| anyhow::anyhow!("REDLOCKD_AUTH_FILE: {e}"))?;
                tracing::info!(
                    tokens = auth.tokens().len(),
                    "bearer tokens required (REDLOCKD_AUTH_FILE)"
                );
                Some(Arc::new(auth))
            }
            None => {
                let loopback = settings
                    .listen
                    .parse::<SocketAddr>()
                    .map(|a| a.ip().is_loopback())
                    .unwrap_or(settings.listen.starts_with("localhost:"));
                if loopback {
                    tracing::info!(
                        "no REDLOCKD_AUTH_FILE: any client that reaches the port may lock any name"
                    );
                } else {
                    tracing::warn!(
                        listen = %settings.listen,
                        "no REDLOCKD_AUTH_FILE on a non-loopback address: anyone who reaches the port may take, inspect or force-release any lock"
                    );
                }
                None
            }
        };
        let tls = match &settings.tls {
            Some((cert, key)) => {
                let tls = http::tls::Tls::load(cert, key).map_err(|e| anyhow::anyhow!(e))?;
                tracing::info!("serving HTTPS (REDLOCKD_TLS_CERT)");
                Some(Arc::new(tls))
            }
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        metrics.settings(settings.master_timeout, settings.caps.streams);
        if auth.is_some() {
            metrics.reloaded("auth", true);
        }
        if tls.is_some() {
            metrics.reloaded("tls", true);
        }
        let engine = Arc::new(Redlock::new(
            nodes.clone(),
            engine_config(&settings),
            metrics.clone(),
        ));
        let shutdown = CancellationToken::new();
        engine.start(shutdown.child_token()).await;
        let events = Events::new();
        for node in &nodes {
            node.listen(listener(events.clone()), shutdown.child_token());
        }
        let service = LeaseService::with_caps(
            engine,
            events,
            metrics.clone(),
            shutdown.clone(),
            settings.caps,
        );
        service.keep_streams_through(settings.shutdown_grace);

        Ok(Self {
            state: AppState {
                service,
                metrics,
                settings: Arc::new(settings),
                shutdown,
                auth,
            },
            tls,
        })
    }

    /// The per-name event bus, for code that embeds redlockd and observes locks.
    pub fn events(&self) -> Arc<Events> {
        self.state.service.events().clone()
    }

    /// The whole HTTP surface over this app's state, for a listener or for `oneshot`.
    pub fn router(&self) -> axum::Router {
        http::router(self.state.clone())
    }

    /// Bind the address the settings name (`REDLOCKD_LISTEN`).
    pub async fn bind(&self) -> anyhow::Result<TcpListener> {
        let listen = &self.state.settings.listen;
        TcpListener::bind(listen)
            .await
            .with_context(|| format!("REDLOCKD_LISTEN: cannot listen on {listen}"))
    }

    /// Stop the background tasks and close the master connections without serving: for an
    /// app that was only driven through `router` (`serve` does this itself at its end).
    pub fn stop(&self) {
        self.state.shutdown.cancel();
        self.state.service.engine().stop();
    }

    /// Serve on `listener` until `signal` completes. Then `/readyz` fails and waiting grants answer 503
    /// at once, the listener closes, and requests in flight get the grace period to
    /// finish; then the background tasks stop and the master connections close. Leases
    /// stay held: they belong to their clients, who renew or revoke them through another
    /// replica, or let them expire.
    pub async fn serve(
        self,
        listener: TcpListener,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let shutdown = self.state.shutdown.clone();
        let service = self.state.service.clone();
        let engine = service.engine().clone();
        let grace = self.state.settings.shutdown_grace;
        let limits = http::serve::Limits {
            header_timeout: self.state.settings.client_timeout,
            max_connections: self.state.settings.max_connections,
            tls: self.tls.clone(),
        };
        let metrics = self.state.metrics.clone();
        if let Some(tls) = self.tls.clone() {
            let metrics = metrics.clone();
            tokio::spawn(
                tls.reload_on_change(move |ok| metrics.reloaded("tls", ok), shutdown.clone()),
            );
        }
        if let Some(auth) = self.state.auth.clone() {
            tokio::spawn(reload_on_sighup(auth, metrics, shutdown.clone()));
        }
        let router = http::router(self.state);
        let stopping = shutdown.clone();
        let stopped_at = Arc::new(std::sync::OnceLock::new());
        let signalled = stopped_at.clone();
        let serve = http::serve::serve(listener, router, limits, async move {
            signal.await;
            let _ = signalled.set(tokio::time::Instant::now());
            tracing::info!(
                grace_ms = grace.as_millis() as u64,
                "shutting down: finishing requests in flight"
            );
            stopping.cancel();
        });
        let overdue = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = serve => {}
            () = overdue => tracing::warn!("grace period over; stopping with requests still in flight"),
        }
        // Grants whose clients left are still finishing; what they won is released now
        // rather than left held until its TTL. They share what is left of the grace.
        let signalled = stopped_at
            .get()
            .copied()
            .unwrap_or_else(tokio::time::Instant::now);
        if !service.drain(signalled + grace).await {
            tracing::warn!(
                "grace period over; abandoning grants whose clients left (their keys expire at their TTL)"
            );
        }
        shutdown.cancel();
        engine.stop();
        tracing::info!("stopped");
        Ok(())
    }
}

/// Re-read the token file on each SIGHUP, and when it changes (a Kubernetes Secret volume
/// is updated in place), until shutdown, without touching connections or leases. A
/// malformed file keeps the tokens in force and says why.
async fn reload_on_sighup(auth: Arc<Auth>, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; the token file is re-read when it changes");
            None
        }
    };
    let mut seen = auth.modified();
    let mut look = tokio::time::interval(AUTH_FILE_POLL);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hangup = async {
            match hangups.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            got = hangup => if got.is_none() { return },
            _ = look.tick() => {
                let now = auth.modified();
                if now == seen || now.is_none() {
                    continue;
                }
            }
        }
        seen = auth.modified();
        match auth.reload() {
            Ok(count) => {
                metrics.reloaded("auth", true);
                tracing::info!(tokens = count, "token file re-read")
            }
            Err(e) => {
                metrics.reloaded("auth", false);
                tracing::error!(error = %e, "token file refused; the tokens in force stay")
            }
        }
    }
}

/// How often the token file is looked at for changes.
const AUTH_FILE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// `redlockd recover`: the operator's recovery after a majority of masters lost their data.
pub(crate) async fn recover(
    config: Config,
    fence_floor: Option<u64>,
    force: bool,
) -> anyhow::Result<Vec<String>> {
    crate::trust::use_ring();
    let settings = config.settings()?;
    anyhow::ensure!(
        settings.backend != Backend::Embedded,
        "REDLOCKD_REDIS_URLS: name the masters to recover"
    );
    let nodes = nodes(&settings)?;
    let engine = Redlock::new(
        nodes.clone(),
        engine_config(&settings),
        Arc::new(Metrics::new()),
    );
    engine
        .monitor()
        .recover(&nodes, fence_floor, force)
        .await
        .map_err(anyhow::Error::msg)
}

/// `redlockd healthcheck`: GET /healthz on the configured address (a wildcard address is
/// asked on loopback) and succeed on 200. A hand-written request keeps an HTTP client out
/// of the binary.
pub(crate) async fn healthcheck(listen: &str, tls: bool) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut addr: SocketAddr = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("REDLOCKD_LISTEN: cannot resolve {listen}"))?
        .next()
        .with_context(|| format!("REDLOCKD_LISTEN: {listen} resolves to nothing"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    if tls {
        // Its own process, on this host: the certificate names the service's public name,
        // not this address, so it is not verified here.
        crate::trust::use_ring();
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(std::time::Duration::from_secs(3))
            .build()?;
        let status = http
            .get(format!("https://{addr}/healthz"))
            .send()
            .await
            .with_context(|| format!("cannot reach https://{addr}"))?
            .status();
        anyhow::ensure!(status == 200, "https://{addr}/healthz answered {status}");
        return Ok(());
    }
    let check = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        anyhow::Ok(head)
    };
    let head = tokio::time::timeout(std::time::Duration::from_secs(3), check)
        .await
        .with_context(|| format!("no answer from {addr} within 3 s"))?
        .with_context(|| format!("cannot reach {addr}"))?;
    anyhow::ensure!(
        head.starts_with(b"HTTP/1.1 200"),
        "{addr}/healthz answered {}",
        String::from_utf8_lossy(&head)
    );
    Ok(())
}
