//! The one typed configuration: every variable of the contract, each also a command-line
//! flag, validated before anything starts. A bad value stops the process with a message
//! that names the variable.

use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::store::redis::redact;

#[derive(Debug, Parser)]
#[command(
    name = "redlockd",
    version,
    about = "Named locks with leases and fencing tokens over Redis (Redlock)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: Config,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Print the OpenAPI document (as committed in openapi/openapi.json).
    Openapi,
    /// Exit 0 if the server at REDLOCKD_LISTEN answers /healthz, else 1 (for container
    /// health checks).
    Healthcheck,
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address to serve on.
    #[arg(
        long,
        env = "REDLOCKD_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    pub listen: String,

    /// Comma-separated redis:// or rediss:// URLs, one per independent master. Unset: the
    /// embedded in-process store (one process, for development and tests).
    #[arg(
        long,
        env = "REDLOCKD_REDIS_URLS",
        value_delimiter = ',',
        global = true
    )]
    pub redis_urls: Vec<String>,

    /// TTL of a grant that names none, in ms.
    #[arg(
        long,
        env = "REDLOCKD_DEFAULT_TTL_MS",
        default_value_t = 30_000,
        global = true
    )]
    pub default_ttl_ms: u64,

    /// Largest TTL accepted, in ms; also how long a master that lost its data is quarantined.
    #[arg(
        long,
        env = "REDLOCKD_MAX_TTL_MS",
        default_value_t = 3_600_000,
        global = true
    )]
    pub max_ttl_ms: u64,

    /// Largest wait_ms accepted.
    #[arg(
        long,
        env = "REDLOCKD_MAX_WAIT_MS",
        default_value_t = 60_000,
        global = true
    )]
    pub max_wait_ms: u64,

    /// Clock-drift allowance as a share of the TTL (plus 2 ms).
    #[arg(
        long,
        env = "REDLOCKD_DRIFT_FACTOR",
        default_value_t = 0.01,
        global = true
    )]
    pub drift_factor: f64,

    /// How long one master may take to answer one step, in ms.
    #[arg(
        long,
        env = "REDLOCKD_MASTER_TIMEOUT_MS",
        default_value_t = 50,
        global = true
    )]
    pub master_timeout_ms: u64,

    /// Prefix of every key written to Redis.
    #[arg(
        long,
        env = "REDLOCKD_KEY_PREFIX",
        default_value = "redlockd:",
        global = true
    )]
    pub key_prefix: String,

    /// Log format: `text` or `json` (default: text in a terminal, JSON otherwise). Levels
    /// come from RUST_LOG (default `info`).
    #[arg(long, env = "REDLOCKD_LOG_FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,

    /// On SIGTERM or ctrl-c, how long requests in flight may take to finish, in ms.
    #[arg(
        long,
        env = "REDLOCKD_SHUTDOWN_GRACE_MS",
        default_value_t = 10_000,
        global = true
    )]
    pub shutdown_grace_ms: u64,

    /// Refuse to start with an even number of masters (an even count buys no extra fault
    /// tolerance over one master fewer).
    #[arg(long, env = "REDLOCKD_REQUIRE_ODD", global = true)]
    pub require_odd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The smallest TTL the contract accepts.
pub const MIN_TTL_MS: u64 = 100;

/// A configuration error: which variable, and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
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
        Cli::try_parse_from(["redlockd"]).map(|cli| cli.config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
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
        if self.master_timeout_ms == 0 {
            return Err(bad("REDLOCKD_MASTER_TIMEOUT_MS", "must be at least 1"));
        }
        if self.master_timeout_ms >= self.default_ttl_ms {
            return Err(bad(
                "REDLOCKD_MASTER_TIMEOUT_MS",
                "must be well below REDLOCKD_DEFAULT_TTL_MS, or no grant keeps any validity",
            ));
        }
        let mut seen = Vec::new();
        for url in &self.redis_urls {
            let shown = redact(url);
            let parsed = url::Url::parse(url)
                .map_err(|e| bad("REDLOCKD_REDIS_URLS", format!("{shown}: {e}")))?;
            if !matches!(parsed.scheme(), "redis" | "rediss") {
                return Err(bad(
                    "REDLOCKD_REDIS_URLS",
                    format!("{shown}: the scheme must be redis:// or rediss://"),
                ));
            }
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(bad("REDLOCKD_REDIS_URLS", format!("{shown}: no host")));
            }
            redis::Client::open(url.as_str())
                .map_err(|e| bad("REDLOCKD_REDIS_URLS", format!("{shown}: {e}")))?;
            if seen.contains(&shown) {
                return Err(bad(
                    "REDLOCKD_REDIS_URLS",
                    format!("{shown} is listed twice; Redlock needs independent masters"),
                ));
            }
            seen.push(shown);
        }
        if self.require_odd && self.redis_urls.len().is_multiple_of(2) {
            return Err(bad(
                "REDLOCKD_REDIS_URLS",
                format!(
                    "{} masters given, but --require-odd (REDLOCKD_REQUIRE_ODD) asks for an odd number",
                    self.redis_urls.len()
                ),
            ));
        }
        Ok(())
    }

    pub fn default_ttl(&self) -> Duration {
        Duration::from_millis(self.default_ttl_ms)
    }

    pub fn max_ttl(&self) -> Duration {
        Duration::from_millis(self.max_ttl_ms)
    }

    pub fn max_wait(&self) -> Duration {
        Duration::from_millis(self.max_wait_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    pub fn master_timeout(&self) -> Duration {
        Duration::from_millis(self.master_timeout_ms)
    }
}

/// Clap names the flag in a parse error; the contract promises the variable is named too.
pub fn explain_parse_error(err: &clap::Error) -> Option<String> {
    use clap::error::ContextKind;
    let arg = err.get(ContextKind::InvalidArg)?.to_string();
    let cmd = Cli::command();
    let env = cmd
        .get_arguments()
        .find(|a| {
            a.get_long()
                .is_some_and(|long| arg.starts_with(&format!("--{long}")))
        })?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    Some(format!("{env} (or {arg}) has a bad value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(args: &[&str]) -> Config {
        let mut argv = vec!["redlockd"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses").config
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
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn errors_name_the_variable() {
        let err = config(&["--default-ttl-ms", "5000", "--max-ttl-ms", "1000"])
            .validate()
            .unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_DEFAULT_TTL_MS");
        let err = config(&["--redis-urls", "http://x:1"])
            .validate()
            .unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_REDIS_URLS");
        let err = config(&["--redis-urls", "redis://a:1,redis://b:1", "--require-odd"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("odd"), "{err}");
        let err = config(&["--redis-urls", "redis://:pw@a:1,redis://:pw@a:1"])
            .validate()
            .unwrap_err();
        assert!(!err.to_string().contains("pw"), "{err}");
        let err = config(&["--drift-factor", "2"]).validate().unwrap_err();
        assert_eq!(err.variable, "REDLOCKD_DRIFT_FACTOR");
    }

    #[test]
    fn parse_errors_are_explained_with_the_variable() {
        let err = Cli::try_parse_from(["redlockd", "--max-wait-ms", "soon"]).unwrap_err();
        let explained = explain_parse_error(&err).expect("explained");
        assert!(explained.contains("REDLOCKD_MAX_WAIT_MS"), "{explained}");
    }
}
