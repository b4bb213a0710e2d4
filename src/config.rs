//! The server's one typed configuration: every variable of the contract, each also a flag
//! of `redlockd serve`, parsed once before anything starts into `Settings`, which the rest
//! of the program takes. A bad value stops the process with a message that names the
//! variable. Redis URLs become `MasterUrl`s, which never show their credentials (`--help`
//! hides the environment's values for the same reason). The command line's grammar (the
//! verbs and their own options) is `cli`'s.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use crate::model::{DEFAULT_MAX_TTL_MS, DEFAULT_MAX_WAIT_MS, MAX_LOCK_DELAY_MS, MIN_TTL_MS};

/// The configuration as given: raw values from flags and the environment. `settings()`
/// parses it. `Debug` is not derived: the Redis URLs may carry passwords.
#[derive(Clone, Args)]
#[command(next_display_order = None)]
pub struct Config {
    /// Address to serve on.
    #[arg(long, env = "REDLOCKD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,

    /// Comma-separated redis:// or rediss:// URLs, one per independent master. Unset: the
    /// embedded in-process store (one process, for development and tests).
    #[arg(
        long,
        env = "REDLOCKD_REDIS_URLS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub redis_urls: Vec<String>,

    /// TTL of a grant that names none, in ms.
    #[arg(long, env = "REDLOCKD_DEFAULT_TTL_MS", default_value_t = 30_000)]
    pub default_ttl_ms: u64,

    /// Largest TTL accepted, in ms; also how long a master that lost its data is quarantined
    /// (REDLOCKD_MAX_KEPT_HOLD_MS when kept holds are on).
    #[arg(long, env = "REDLOCKD_MAX_TTL_MS", default_value_t = DEFAULT_MAX_TTL_MS)]
    pub max_ttl_ms: u64,

    /// How long a kept hold (`kept: true`, renewed by no one) lives at most, in ms: its keys'
    /// TTL on the masters. Default: twice REDLOCKD_MAX_TTL_MS (2 h). Must be more than
    /// REDLOCKD_MAX_TTL_MS, which it then replaces as how long a master that lost its data
    /// is quarantined; 0 (or not more) turns kept holds off.
    #[arg(long, env = "REDLOCKD_MAX_KEPT_HOLD_MS")]
    pub max_kept_hold_ms: Option<u64>,

    /// Largest wait_ms accepted.
    #[arg(long, env = "REDLOCKD_MAX_WAIT_MS", default_value_t = DEFAULT_MAX_WAIT_MS)]
    pub max_wait_ms: u64,

    /// Largest lock_delay_ms accepted (at most 60000); a master that lost its data is
    /// quarantined up to this much longer than the largest TTL (as long as the lock-delay
    /// in force on the others), so that no delay is cut short.
    #[arg(long, env = "REDLOCKD_MAX_LOCK_DELAY_MS", default_value_t = MAX_LOCK_DELAY_MS)]
    pub max_lock_delay_ms: u64,

    /// Clock-drift allowance as a share of the TTL (plus 2 ms); also how far a master's
    /// clock may drift between two readings before it counts as a jump.
    #[arg(long, env = "REDLOCKD_DRIFT_FACTOR", default_value_t = 0.01)]
    pub drift_factor: f64,

    /// How far a master's clock may be from this replica's when this replica first meets
    /// it, in ms; one further off may have jumped before anyone watched it, and is not
    /// counted until it has been watched for the largest TTL plus lock-delay.
    #[arg(long, env = "REDLOCKD_MAX_CLOCK_OFFSET_MS", default_value_t = 1_000)]
    pub max_clock_offset_ms: u64,

    /// How long one master may take to answer one step, in ms.
    #[arg(long, env = "REDLOCKD_MASTER_TIMEOUT_MS", default_value_t = 50)]
    pub master_timeout_ms: u64,

    /// Most steps sent to one master in one script call (the steps concurrent requests
    /// queue for it while its previous call is answered); 1 sends each step on its own.
    #[arg(long, env = "REDLOCKD_MASTER_BATCH_MAX", default_value_t = 256)]
    pub master_batch_max: usize,

    /// Prefix of every key written to Redis.
    #[arg(long, env = "REDLOCKD_KEY_PREFIX", default_value = "redlockd:")]
    pub key_prefix: String,

    /// Log format: `text` or `json` (default: text in a terminal, JSON otherwise). Levels
    /// come from RUST_LOG (default `info`).
    #[arg(long, env = "REDLOCKD_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// On SIGTERM or ctrl-c, how long requests in flight may take to finish, in ms.
    #[arg(long, env = "REDLOCKD_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,

    /// How long a client may take to send a request's headers, and then its body, in ms:
    /// past it the connection is closed (headers) or answered 408 (body), so that slow or
    /// stalled clients cannot hold connections open.
    #[arg(long, env = "REDLOCKD_CLIENT_TIMEOUT_MS", default_value_t = 10_000)]
    pub client_timeout_ms: u64,

    /// Most client connections open at once; more wait in the listen backlog until one
    /// closes.
    #[arg(long, env = "REDLOCKD_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// UNSAFE, for the fault suite only: masters that lost their data vote again at once,
    /// which lets two clients hold one lock. Hidden from `--help`.
    #[arg(long, env = "REDLOCKD_UNSAFE_SKIP_QUARANTINE", hide = true)]
    pub unsafe_skip_quarantine: bool,

    /// UNSAFE, for tests only: masters' clocks are read and shown but a jump stops nothing,
    /// which lets two clients hold one lock when a master's clock jumps. Hidden from
    /// `--help`.
    #[arg(long, env = "REDLOCKD_UNSAFE_TRUST_MASTER_CLOCKS", hide = true)]
    pub unsafe_trust_master_clocks: bool,

    /// Refuse to start with an even number of masters (an even count buys no extra fault
    /// tolerance over one master fewer).
    #[arg(long, env = "REDLOCKD_REQUIRE_ODD")]
    pub require_odd: bool,

    /// Most grants that may wait on one name at once; past it a waiting grant is 429.
    #[arg(long, env = "REDLOCKD_MAX_WAITERS_PER_NAME", default_value_t = 1_000)]
    pub max_waiters_per_name: usize,

    /// Most grants that may wait at once, on every name together; past it 429.
    #[arg(long, env = "REDLOCKD_MAX_WAITERS", default_value_t = 10_000)]
    pub max_waiters: u64,

    /// Most event streams (held leases, campaigns, observers) open at once; past it 429.
    #[arg(long, env = "REDLOCKD_MAX_STREAMS", default_value_t = 10_000)]
    pub max_streams: usize,

    /// A PEM certificate chain: serve HTTPS with it (and REDLOCKD_TLS_KEY). Re-read when
    /// the file changes.
    #[arg(long, env = "REDLOCKD_TLS_CERT")]
    pub tls_cert: Option<String>,

    /// The PEM private key of REDLOCKD_TLS_CERT.
    #[arg(long, env = "REDLOCKD_TLS_KEY")]
    pub tls_key: Option<String>,

    /// FleetLock's groups (`/fleetlock`, for Zincati and Flatcar's reboot coordination): a
    /// comma-separated list of `group=slots`, each group a semaphore of that many slots
    /// (1 to 1000) whose permits are kept holds; a group not listed is refused. Unset:
    /// `default=1` while kept holds are on (FleetLock is off, with a warning, while they
    /// are off). Empty: FleetLock is off. Groups named while kept holds are off refuse to
    /// start: a reboot slot is a kept hold.
    #[arg(long, env = "REDLOCKD_FLEETLOCK_GROUPS")]
    pub fleetlock_groups: Option<String>,

    /// A JSON file of bearer tokens (name, SHA-256 of the token, role, name prefixes; see
    /// docs/security.md). Unset: no authentication (logged at start). Re-read on SIGHUP.
    #[arg(long, env = "REDLOCKD_AUTH_FILE")]
    pub auth_file: Option<String>,

    /// With REDLOCKD_AUTH_FILE: requests per second each token may make (0: no limit); past
    /// it 429 with Retry-After.
    #[arg(long, env = "REDLOCKD_AUTH_RATE", default_value_t = 0)]
    pub auth_rate: u32,

    /// With REDLOCKD_AUTH_RATE: how many requests a token may make at once before the rate
    /// applies (default: one second's worth).
    #[arg(long, env = "REDLOCKD_AUTH_BURST")]
    pub auth_burst: Option<u32>,

    /// An OTLP/HTTP collector (`http://otel-collector:4318`, or https://): send traces
    /// there, a span per request with one per master step (JSON to `/v1/traces`). Unset:
    /// the standard OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_EXPORTER_OTLP_*
    /// variables) are read instead; neither set: no traces, no cost.
    #[arg(long, env = "REDLOCKD_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// The built docs site (`mdbook build` writes target/book): served at /book/, with a
    /// runbook page per alert. Unset: /book/ answers 404 saying how to get it.
    #[arg(long, env = "REDLOCKD_BOOK_DIR", value_name = "DIR")]
    pub book_dir: Option<std::path::PathBuf>,

    /// A PEM file of CA certificates to trust for an https:// trace collector, beside the
    /// operating system's store (which SSL_CERT_FILE and SSL_CERT_DIR also set).
    #[arg(long, env = "REDLOCKD_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<std::path::PathBuf>,

    /// With REDLOCKD_AUTH_FILE: `/metrics`, `/openapi.json`, `/docs` and `/book/` need a reader token
    /// too (they are open by default; `/healthz` and `/readyz` always are).
    #[arg(long, env = "REDLOCKD_AUTH_PROTECT_OPERATIONS")]
    pub auth_protect_operations: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration error: which variable, and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}: {problem}")]
pub(crate) struct ConfigError {
    pub variable: &'static str,
    pub problem: String,
}

fn bad(variable: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        variable,
        problem: problem.into(),
    }
}

impl Config {
    /// The configuration as the environment alone gives it (no command line), for tests
    /// and embedders.
    pub fn from_env() -> Result<Self, clap::Error> {
        #[derive(Parser)]
        struct Serve {
            #[command(flatten)]
            config: Config,
        }
        Serve::try_parse_from(["redlockd"]).map(|serve| serve.config)
    }

    /// Parse and check every value: the settings the program runs with.
    pub(crate) fn settings(&self) -> Result<Settings, ConfigError> {
        if self.max_lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(bad(
                "REDLOCKD_MAX_LOCK_DELAY_MS",
                format!(
                    "{} is more than the contract's largest lock-delay, {MAX_LOCK_DELAY_MS} ms",
                    self.max_lock_delay_ms
                ),
            ));
        }
        if self.max_ttl_ms < MIN_TTL_MS {
            return Err(bad(
                "REDLOCKD_MAX_TTL_MS",
                format!("must be at least {MIN_TTL_MS}"),
            ));
        }
        if !(MIN_TTL_MS..=self.max_ttl_ms).contains(&self.default_ttl_ms) {
            return Err(bad(
                "REDLOCKD_DEFAULT_TTL_MS",
                format!(
                    "must be from {MIN_TTL_MS} to REDLOCKD_MAX_TTL_MS ({}), got {}",
                    self.max_ttl_ms, self.default_ttl_ms
                ),
            ));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(bad(
                "REDLOCKD_DRIFT_FACTOR",
                "must be at least 0 and below 0.5",
            ));
        }
        if self.client_timeout_ms == 0 {
            return Err(bad("REDLOCKD_CLIENT_TIMEOUT_MS", "must be at least 1"));
        }
        if self.max_connections == 0 {
            return Err(bad("REDLOCKD_MAX_CONNECTIONS", "must be at least 1"));
        }
        if self.master_timeout_ms == 0 {
            return Err(bad("REDLOCKD_MASTER_TIMEOUT_MS", "must be at least 1"));
        }
        if self.master_timeout_ms >= self.default_ttl_ms {
            return Err(bad(
                "REDLOCKD_MASTER_TIMEOUT_MS",
                "must be well below REDLOCKD_DEFAULT_TTL_MS, or no grant keeps any validity",
            ));
        }
        if !(1..=4096).contains(&self.master_batch_max) {
            return Err(bad("REDLOCKD_MASTER_BATCH_MAX", "must be from 1 to 4096"));
        }
        let mut masters: Vec<MasterUrl> = Vec::new();
        for url in &self.redis_urls {
            let url = MasterUrl::parse(url).map_err(|e| bad("REDLOCKD_REDIS_URLS", e))?;
            if masters.iter().any(|m| m.redacted() == url.redacted()) {
                return Err(bad(
                    "REDLOCKD_REDIS_URLS",
                    format!("{url} is listed twice; Redlock needs independent masters"),
                ));
            }
            masters.push(url);
        }
        if masters.iter().any(MasterUrl::is_cluster) && self.key_prefix.contains(['{', '}']) {
            return Err(bad(
                "REDLOCKD_KEY_PREFIX",
                "must not contain { or } when a master is a Redis Cluster: redlockd's keys carry a hash tag of their own",
            ));
        }
        if let Some(endpoint) = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty())
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(bad(
                "REDLOCKD_OTLP_ENDPOINT",
                format!(
                    "{endpoint:?}: must be an http:// or https:// URL of an OTLP/HTTP collector (http://otel-collector:4318)"
                ),
            ));
        }
        let book_dir = self.book_dir.clone().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = &book_dir
            && !dir.join("index.html").is_file()
        {
            return Err(bad(
                "REDLOCKD_BOOK_DIR",
                format!(
                    "{}: no index.html there; name the folder `mdbook build` wrote (target/book)",
                    dir.display()
                ),
            ));
        }
        if self.require_odd && masters.len().is_multiple_of(2) {
            return Err(bad(
                "REDLOCKD_REDIS_URLS",
                format!(
                    "{} masters given, but --require-odd (REDLOCKD_REQUIRE_ODD) asks for an odd number",
                    masters.len()
                ),
            ));
        }
        let max_kept = Some(
            self.max_kept_hold_ms
                .unwrap_or(self.max_ttl_ms.saturating_mul(2)),
        )
        .filter(|&kept| kept > self.max_ttl_ms)
        .map(ms);
        Ok(Settings {
            listen: self.listen.clone(),
            backend: if masters.is_empty() {
                Backend::Embedded
            } else {
                Backend::Redis(masters)
            },
            leases: LeaseBounds {
                default_ttl: ms(self.default_ttl_ms),
                max_ttl: ms(self.max_ttl_ms),
                max_wait: ms(self.max_wait_ms),
                max_lock_delay: ms(self.max_lock_delay_ms),
                max_kept,
            },
            drift_factor: self.drift_factor,
            master_timeout: ms(self.master_timeout_ms),
            master_batch_max: self.master_batch_max,
            key_prefix: self.key_prefix.clone(),
            shutdown_grace: ms(self.shutdown_grace_ms),
            client_timeout: ms(self.client_timeout_ms),
            max_connections: self.max_connections,
            unsafe_skip_quarantine: self.unsafe_skip_quarantine,
            max_clock_offset: ms(self.max_clock_offset_ms),
            unsafe_trust_master_clocks: self.unsafe_trust_master_clocks,
            caps: Caps {
                waiters_per_name: self.max_waiters_per_name,
                waiters: self.max_waiters,
                streams: self.max_streams,
            },
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => {
                    Some((c.clone(), k.clone()))
                }
                (None, None) => None,
                (Some(c), Some(k)) if c.is_empty() && k.is_empty() => None,
                _ => {
                    return Err(bad(
                        "REDLOCKD_TLS_CERT",
                        "REDLOCKD_TLS_CERT and REDLOCKD_TLS_KEY go together",
                    ));
                }
            },
            auth_file: self.auth_file.clone().filter(|f| !f.is_empty()),
            fleetlock: self.fleetlock(max_kept.is_some())?,
            book_dir,
            auth_protect_operations: self.auth_protect_operations,
            auth_rate: NonZeroU32::new(self.auth_rate).map(|rate| {
                let burst = self.auth_burst.and_then(NonZeroU32::new).unwrap_or(rate);
                (rate, burst)
            }),
        })
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// What FleetLock serves: its groups and their slots, or why it is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetLock {
    Groups(std::collections::BTreeMap<String, u16>),
    /// Its routes answer 503 `fleetlock_off` with this reason.
    Off(&'static str),
}

/// Why Dapr's locks are off: the largest TTL is below Dapr's smallest expiry (said at
/// start too, as a warning).
pub(crate) const DAPR_NEEDS_A_SECOND: &str = "Dapr's locks are off: Dapr asks for whole seconds (expiryInSeconds, at least 1), and REDLOCKD_MAX_TTL_MS is below 1000, so no lock would fit; raise it to at least 1000 to serve them";

/// Whether a largest TTL of `max_ttl` leaves Dapr's locks off (`DAPR_NEEDS_A_SECOND`).
pub(crate) fn dapr_off(max_ttl: Duration) -> bool {
    max_ttl < Duration::from_secs(1)
}

/// Why FleetLock is off when its groups are left unset with kept holds off (said at start
/// too, as a warning).
pub(crate) const FLEETLOCK_NEEDS_KEPT: &str = "FleetLock is off: a reboot slot is a kept hold, and REDLOCKD_MAX_KEPT_HOLD_MS turned kept holds off (REDLOCKD_FLEETLOCK_GROUPS is not set; set it empty to turn FleetLock off without this warning)";

impl Config {
    /// FleetLock's groups, as REDLOCKD_FLEETLOCK_GROUPS and kept holds (`kept`) allow: a
    /// slot is a kept hold, so with kept holds off the default is off and groups named
    /// explicitly cannot be served (refused, rather than a pre-reboot that fails for ever).
    fn fleetlock(&self, kept: bool) -> Result<FleetLock, ConfigError> {
        match self.fleetlock_groups.as_deref().map(str::trim) {
            None if kept => Ok(FleetLock::Groups(fleetlock_groups("default=1")?)),
            None => Ok(FleetLock::Off(FLEETLOCK_NEEDS_KEPT)),
            Some("") => Ok(FleetLock::Off(
                "FleetLock is off here (REDLOCKD_FLEETLOCK_GROUPS is empty)",
            )),
            Some(_) if !kept => Err(bad(
                "REDLOCKD_FLEETLOCK_GROUPS",
                "names reboot groups, but REDLOCKD_MAX_KEPT_HOLD_MS turned kept holds off (0, or not above REDLOCKD_MAX_TTL_MS) and a reboot slot is a kept hold: turn kept holds on, or set REDLOCKD_FLEETLOCK_GROUPS empty to turn FleetLock off",
            )),
            Some(raw) => Ok(FleetLock::Groups(fleetlock_groups(raw)?)),
        }
    }
}

/// Whether `group` names a FleetLock reboot group: 1 to 128 bytes matching the protocol's
/// `^[a-zA-Z0-9.-]+$`.
pub(crate) fn is_fleetlock_group(group: &str) -> bool {
    (1..=128).contains(&group.len())
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

/// `group=slots,...`: FleetLock's group names (`^[a-zA-Z0-9.-]+$`, as the protocol says)
/// and their slots.
fn fleetlock_groups(raw: &str) -> Result<std::collections::BTreeMap<String, u16>, ConfigError> {
    let mut groups = std::collections::BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.split_once('=').and_then(|(group, slots)| {
            let group = group.trim();
            let named = is_fleetlock_group(group);
            let slots = slots
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|s| (1..=1000).contains(s))?;
            named.then(|| (group.to_owned(), slots))
        });
        let Some((group, slots)) = parsed else {
            return Err(bad(
                "REDLOCKD_FLEETLOCK_GROUPS",
                format!(
                    "{entry:?} is not group=slots (a group name of 1 to 128 bytes of A-Z a-z 0-9 . -, 1 to 1000 slots)"
                ),
            ));
        };
        if groups.insert(group.clone(), slots).is_some() {
            return Err(bad(
                "REDLOCKD_FLEETLOCK_GROUPS",
                format!("the group {group:?} is listed twice"),
            ));
        }
    }
    Ok(groups)
}

/// The configuration, parsed: what the program runs with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub listen: String,
    pub backend: Backend,
    /// The TTL and wait bounds every grant is held to.
    pub leases: LeaseBounds,
    pub drift_factor: f64,
    pub master_timeout: Duration,
    /// Most steps in one script call to one master.
    pub master_batch_max: usize,
    pub key_prefix: String,
    pub shutdown_grace: Duration,
    pub client_timeout: Duration,
    pub max_connections: usize,
    pub unsafe_skip_quarantine: bool,
    /// How far a master's clock may be from this replica's when first met.
    pub max_clock_offset: Duration,
    pub unsafe_trust_master_clocks: bool,
    /// Caps on what one replica holds open for its clients.
    pub caps: Caps,
    /// The certificate chain and key files, when the listener serves HTTPS.
    pub tls: Option<(String, String)>,
    /// The token file, when authentication is on.
    pub auth_file: Option<String>,
    /// FleetLock's groups and their slots, or why it is off.
    pub fleetlock: FleetLock,
    /// The built docs site, served at /book/ when given.
    pub book_dir: Option<std::path::PathBuf>,
    pub auth_protect_operations: bool,
    /// Requests per second per token, and the burst.
    pub auth_rate: Option<(NonZeroU32, NonZeroU32)>,
}

/// The configured bounds of every lease (checked: `MIN_TTL_MS <= default_ttl <= max_ttl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseBounds {
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub max_wait: Duration,
    pub max_lock_delay: Duration,
    /// How long a kept hold lives: more than `max_ttl`, so that a hold whose TTL is longer
    /// than any a client may ask is a kept one. `None`: kept holds are off.
    pub max_kept: Option<Duration>,
}

impl LeaseBounds {
    /// The longest any lease may live on the masters: a kept hold's, or the largest TTL.
    pub(crate) fn longest(&self) -> Duration {
        self.max_kept.unwrap_or(self.max_ttl)
    }
}

/// Caps on what one replica holds open for its clients, so that no client can make it
/// hold without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub waiters_per_name: usize,
    pub waiters: u64,
    pub streams: usize,
}

impl Caps {
    /// No caps (for programs that embed the service and bound it themselves).
    pub(crate) const NONE: Caps = Caps {
        waiters_per_name: usize::MAX,
        waiters: u64::MAX,
        streams: usize::MAX,
    };
}

/// Where locks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The in-process store: one process, not distributed; for development and tests.
    Embedded,
    /// Independent Redis masters.
    Redis(Vec<MasterUrl>),
}

impl Backend {
    /// `redis` or `embedded`, as `/readyz` reports it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Redis(_) => "redis",
        }
    }
}

/// A master's `redis://` or `rediss://` URL. It may carry a password: `Debug` and `Display`
/// show it without credentials, and only `expose` hands the full URL to the Redis client.
#[derive(Clone, PartialEq, Eq)]
pub struct MasterUrl {
    url: String,
    redacted: String,
    cluster: bool,
}

impl MasterUrl {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if !raw.contains("://") {
            return Err(format!(
                "{:?} is not a URL: write it as redis://{}",
                redact_text(raw),
                redact_text(raw)
            ));
        }
        let parsed = url::Url::parse(raw)
            .map_err(|e| format!("{:?} is not a URL: {e}", redact_text(raw)))?;
        let redacted = redact_parsed(&parsed);
        let cluster = match parsed.scheme() {
            "redis" | "rediss" => false,
            "redis+cluster" | "rediss+cluster" => true,
            _ => {
                return Err(format!(
                    "{redacted}: the scheme must be redis://, rediss://, redis+cluster:// or rediss+cluster://"
                ));
            }
        };
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("{redacted}: no host"));
        }
        if cluster && !matches!(parsed.path(), "" | "/" | "/0") {
            return Err(format!(
                "{redacted}: a Redis Cluster has only database 0; name no other"
            ));
        }
        // The client dials a cluster's nodes as plain masters: the URL it is given is the
        // seed's, without `+cluster`.
        let url = raw.replacen("+cluster://", "://", 1);
        redis::Client::open(url.as_str()).map_err(|e| format!("{redacted}: {e}"))?;
        Ok(Self {
            url,
            redacted,
            cluster,
        })
    }

    /// Whether the URL names a Redis Cluster (through a seed node) rather than one master.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Scheme, host, port and database: safe for logs, metrics and `/readyz`.
    pub(crate) fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The full URL, credentials included: for the Redis client only.
    pub(crate) fn expose(&self) -> &str {
        &self.url
    }
}

impl fmt::Display for MasterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for MasterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterUrl({})", self.redacted)
    }
}

fn redact_parsed(parsed: &url::Url) -> String {
    let host = parsed.host_str().unwrap_or("?");
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!("{}://{host}{port}{}", parsed.scheme(), parsed.path())
}

/// Text that failed to parse as a URL, as it may be shown: whatever stands between the
/// scheme and the last `@` (a user and password) is hidden.
fn redact_text(raw: &str) -> String {
    let (scheme, rest) = raw.split_once("://").map_or(("", raw), |(s, r)| (s, r));
    let shown = match rest.rfind('@') {
        Some(at) => format!("***{}", &rest[at..]),
        None => rest.to_owned(),
    };
    if scheme.is_empty() {
        shown
    } else {
        format!("{scheme}://{shown}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            config: Config,
        }
        let mut argv = vec!["redlockd"];
        argv.extend_from_slice(args);
        <Serve as clap::Parser>::try_parse_from(argv)
            .expect("parses")
            .config
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = config(&[]);
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert!(c.redis_urls.is_empty());
        assert_eq!(
            (c.default_ttl_ms, c.max_ttl_ms, c.max_wait_ms),
            (30_000, 3_600_000, 60_000)
        );
        assert_eq!(c.drift_factor, 0.01);
        assert_eq!(c.master_timeout_ms, 50);
        assert_eq!(c.key_prefix, "redlockd:");
        let settings = c.settings().expect("valid");
        assert_eq!(settings.backend, Backend::Embedded);
    }

    #[test]
    fn errors_name_the_variable() {
        let err = config(&["--default-ttl-ms", "5000", "--max-ttl-ms", "1000"])
            .settings()
            .unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_DEFAULT_TTL_MS");
        let err = config(&["--redis-urls", "http://x:1"])
            .settings()
            .unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_REDIS_URLS");
        let err = config(&["--redis-urls", "redis://a:1,redis://b:1", "--require-odd"])
            .settings()
            .unwrap_err();
        assert!(err.to_string().contains("odd"), "{err}");
        let err = config(&["--redis-urls", "redis://:pw@a:1,redis://:pw@a:1"])
            .settings()
            .unwrap_err();
        assert!(!err.to_string().contains("pw"), "{err}");
        let err = config(&["--drift-factor", "2"]).settings().unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_DRIFT_FACTOR");
    }

    #[test]
    fn a_cluster_url_is_one_master_reached_through_its_seed() {
        let url = MasterUrl::parse("rediss+cluster://:pw@10.0.0.5:7000").unwrap();
        assert!(url.is_cluster());
        assert_eq!(url.redacted(), "rediss+cluster://10.0.0.5:7000");
        assert_eq!(url.expose(), "rediss://:pw@10.0.0.5:7000");
        assert!(
            !MasterUrl::parse("redis://10.0.0.5:7000")
                .unwrap()
                .is_cluster()
        );
        let err = MasterUrl::parse("redis+cluster://10.0.0.5:7000/2").unwrap_err();
        assert!(err.contains("database 0"), "{err}");
        let err = config(&[
            "--redis-urls",
            "redis+cluster://a:1",
            "--key-prefix",
            "locks{x}:",
        ])
        .settings()
        .unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_KEY_PREFIX");
        assert!(
            config(&["--redis-urls", "redis://a:1", "--key-prefix", "locks{x}:"])
                .settings()
                .is_ok()
        );
    }

    #[test]
    fn master_urls_never_show_their_credentials() {
        let url = MasterUrl::parse("redis://:s3cret@127.0.0.1:7000/0").unwrap();
        assert_eq!(url.redacted(), "redis://127.0.0.1:7000/0");
        assert!(!format!("{url} {url:?}").contains("s3cret"));
        assert!(url.expose().contains("s3cret"));
        assert_eq!(
            MasterUrl::parse("rediss://user:pw@cache.internal:6380")
                .unwrap()
                .redacted(),
            "rediss://cache.internal:6380"
        );
    }

    #[test]
    fn an_entry_that_is_not_a_url_is_named_and_its_password_hidden() {
        let err = config(&["--redis-urls", "redis://a:1,127.0.0.1:7501"])
            .settings()
            .unwrap_err();
        assert!(
            err.to_string().contains("\"127.0.0.1:7501\" is not a URL"),
            "{err}"
        );
        assert!(err.to_string().contains("redis://127.0.0.1:7501"), "{err}");
        let err = MasterUrl::parse("redis://:s3cret@[bad").unwrap_err();
        assert!(
            err.contains("redis://***@[bad") && !err.contains("s3cret"),
            "{err}"
        );
    }
}
