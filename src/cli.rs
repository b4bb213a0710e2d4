//! The command line's grammar: the verbs (`serve`, the default, and the client verbs
//! `lock`, `inspect`, `list`, and `openapi`, `healthcheck`, `recover`, `token`), each with
//! its own options and variables only. The server's settings are `config`'s `Config`,
//! which `serve` and `recover` take.

use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::config::Config;

/// The command line: a verb and that verb's own options. With no verb (or with the
/// server's flags first), `serve` is meant: `redlockd --listen 0.0.0.0:8080` serves.
///
/// Each verb takes only its own options and reads only its own variables, so that a
/// client verb never stumbles over (or silently ignores) a server setting.
/// Not `Debug`: it holds the configuration as given, passwords included.
#[derive(Parser)]
#[command(
    name = "redlockd",
    version,
    about = "Named locks with leases and fencing tokens over Redis (Redlock)",
    long_about = None,
    after_help = "With no command, or with the server's options first, `serve` is meant \
                  (`redlockd --listen 0.0.0.0:8080`). `redlockd help serve` lists them."
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Whether `word` names a verb (clap's own `help` included), as the grammar defines them.
fn is_verb(word: &str) -> bool {
    word == "help" || Cli::command().find_subcommand(word).is_some()
}

impl Cli {
    /// Parse `args` (the program's name first), taking `serve` when no verb is named.
    pub(crate) fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
        let top_level_flag = matches!(first, "-h" | "--help" | "-V" | "--version");
        if !is_verb(first) && !top_level_flag {
            args.insert(1.min(args.len()), "serve".into());
        }
        Self::try_parse_from(args)
    }

    /// The verb the command line names (`serve` when none), for telling client verbs from
    /// the server's before the line is parsed.
    pub(crate) fn verb_of(args: &[String]) -> &str {
        let first = args.get(1).map_or("", String::as_str);
        if is_verb(first) { first } else { "serve" }
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP API (the default). Every option is also an environment variable.
    Serve(Config),
    /// Print the OpenAPI document (as committed in openapi/openapi.json).
    Openapi,
    /// Exit 0 if the server at REDLOCKD_LISTEN answers /healthz, else 1 (for container
    /// health checks).
    Healthcheck(HealthcheckArgs),
    /// After a majority of the masters in REDLOCKD_REDIS_URLS lost their data at once: put
    /// every master back in service with its fencing counter above any token that can have
    /// been granted. Refuses while a master that lost its data restarted less than
    /// REDLOCKD_MAX_TTL_MS (REDLOCKD_MAX_KEPT_HOLD_MS when kept holds are on) ago.
    Recover(RecoverArgs),
    /// Run a command while holding a lock: grant NAME, run CMD with the lease in its
    /// environment, renew the lease while CMD runs, end CMD if the lease is lost, release
    /// the lock when CMD exits. Exit status: CMD's own; 64 bad usage; 69 no server or no
    /// quorum; 75 lock held past --wait (or --held-exit-code); 76 lease lost while CMD ran;
    /// 126/127 CMD could not be started.
    Lock(LockArgs),
    /// Show who holds a lock (a client verb: asks the server at --server).
    Inspect(InspectArgs),
    /// List locks held exclusively, by name (a client verb: asks the server at --server;
    /// shared locks, semaphores and elections are shown by `inspect`).
    List(ListArgs),
    /// Bearer tokens for REDLOCKD_AUTH_FILE.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `redlockd healthcheck`: where the server listens, and whether it speaks HTTPS.
#[derive(Debug, Clone, Args)]
pub(crate) struct HealthcheckArgs {
    /// The address the server listens on.
    #[arg(long, env = "REDLOCKD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Set when the server serves HTTPS (the check then speaks HTTPS too).
    #[arg(long, env = "REDLOCKD_TLS_CERT")]
    pub tls_cert: Option<String>,
}

/// `redlockd recover`: the server's configuration (its masters), and how to recover.
#[derive(Args)]
pub(crate) struct RecoverArgs {
    #[command(flatten)]
    pub config: Config,
    /// Raise every fencing counter to at least this (default: the largest counter any
    /// master still has, or the wall clock in microseconds, whichever is larger).
    #[arg(long)]
    pub fence_floor: Option<u64>,
    /// Do not wait for the largest TTL since the masters restarted: only when no lease
    /// can still be live (every client stopped, or the TTLs are known to be over).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub(crate) enum TokenCommand {
    /// Print a new random token once, and the line to add to the token file (which holds
    /// only its hash).
    New {
        /// The token's name, shown in logs.
        #[arg(long)]
        name: String,
        /// `client` (grant, renew, revoke, check), `reader` (inspect, list), `admin`.
        #[arg(long, value_parser = ["client", "reader", "admin"])]
        role: String,
        /// A name prefix the token may use; repeat for several (`""` for every name).
        #[arg(long = "prefix")]
        prefixes: Vec<String>,
    },
}

/// Where the client verbs find redlockd.
#[derive(Debug, Clone, Args)]
pub(crate) struct ServerArgs {
    /// A redlockd replica to ask; repeat for several (tried in order, the next on failure).
    #[arg(
        long = "server",
        env = "REDLOCKD_SERVER",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080"
    )]
    pub servers: Vec<String>,
    /// The bearer token to send, when the servers require one (REDLOCKD_AUTH_FILE).
    #[arg(long, env = "REDLOCKD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM file of CA certificates to trust for https:// servers, beside the operating
    /// system's store (which SSL_CERT_FILE and SSL_CERT_DIR also set).
    #[arg(long, env = "REDLOCKD_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// `redlockd lock`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Lease TTL (renewed at about a third of it while CMD runs), e.g. `30s`, `500ms`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long to wait while another holds the lock (default: do not wait).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
    /// Shown by inspect and list (default: host name, pid and command).
    #[arg(long)]
    pub owner: Option<String>,
    /// Keep the lock at least this long after the grant, even when CMD finishes sooner, so
    /// that other instances whose schedule fires a little later skip this tick. At most
    /// the server's largest TTL (REDLOCKD_MAX_TTL_MS, 1h by default): longer is refused
    /// before CMD starts (exit 64).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub hold_at_least: Option<Duration>,
    /// After the lease is lost: how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// Exit status when another holds the lock past --wait (default 75); 0 lets cron treat
    /// "another instance has it" as success, and then the skip is silent too.
    #[arg(long, default_value_t = 75)]
    pub held_exit_code: u8,
    /// Say nothing when another holds the lock (the skip), whatever --held-exit-code is;
    /// errors are still reported.
    #[arg(long, short)]
    pub quiet: bool,
    /// Take a permit of the semaphore NAME instead of its lock: at most N commands run at
    /// once (1 to 1000). The command gets its slot in REDLOCKD_SLOT (0 to N - 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: Option<u16>,
    /// Hold the lock shared: other --shared runs of NAME hold it at the same time, a run
    /// without --shared waits for them all (and later --shared runs wait behind it).
    #[arg(long, conflicts_with = "limit")]
    pub shared: bool,
    /// When the lease ends other than by this run letting go (the run was killed, stalled
    /// past its TTL, or an administrator removed it), NAME is not granted again for this
    /// long, so that the work in flight of a run that lost its lock lands first, e.g. `5s`.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["limit", "shared"])]
    pub lock_delay: Option<Duration>,
    /// When renews have not got through and less than a third of the TTL is left, send
    /// CMD's process group this signal (e.g. `USR1`), so that it can stop what the lock
    /// guards before the lease ends rather than after; once, until a renew gets through
    /// again. Without it the warning is only printed.
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal)]
    pub jeopardy_signal: Option<nix::sys::signal::Signal>,
    /// When a renew gets through after that warning, send CMD's process group this signal
    /// (e.g. `USR2`).
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal)]
    pub safe_signal: Option<nix::sys::signal::Signal>,
    /// The lock's name (the semaphore's, with --limit). Several names take every one of
    /// them under one lease, all or none (in any order: the server orders them).
    #[arg(required = true, num_args = 1.., value_name = "NAME")]
    pub names: Vec<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A signal by name, with or without `SIG` (`USR1`, `SIGUSR1`, `usr1`).
fn parse_signal(text: &str) -> Result<nix::sys::signal::Signal, String> {
    let upper = text.trim().to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse()
        .map_err(|_| format!("{text:?} is not a signal name (USR1, USR2, HUP, ...)"))
}

/// `redlockd inspect`.
#[derive(Debug, Clone, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Inspect the semaphore NAME (its permits, by slot) rather than the lock: a
    /// semaphore and a lock of one name are apart.
    #[arg(long, conflicts_with = "election")]
    pub semaphore: bool,
    /// Inspect the election NAME (its leader) rather than the lock.
    #[arg(long)]
    pub election: bool,
    pub name: String,
}

/// `redlockd list`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print JSON (`{"locks": [...]}`, every page) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only names that start with this.
    #[arg(default_value = "")]
    pub prefix: String,
}

/// Clap names the flag in a parse error; the contract promises the variable is named too.
/// Only for a bad value: a flag the command does not take (a server flag after `lock`,
/// say) is clap's own error, with no variable to blame.
pub(crate) fn explain_parse_error(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ErrorKind};
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let arg = err.get(ContextKind::InvalidArg)?.to_string();
    let cmd = Cli::command();
    let env = cmd
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .find(|a| {
            a.get_long()
                .is_some_and(|long| arg.starts_with(&format!("--{long}")))
        })?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    Some(format!("{env} (or {arg}) has a bad value"))
}

/// A parse error of the client verb `verb` as printed: clap's text, with its usage line
/// replaced by the verb's own. Clap writes the usage of what it guessed was meant: after an
/// unknown flag it suggests one and puts that in the usage line (`--listen` made
/// "Usage: redlockd lock --limit <N> <NAME>…", which reads as if --limit were required).
pub(crate) fn usage_error_text(err: &clap::Error, verb: &str) -> String {
    let text = err.render().to_string();
    let mut cmd = Cli::command();
    cmd.build();
    let Some(sub) = cmd.find_subcommand_mut(verb) else {
        return text;
    };
    let usage = sub.render_usage().to_string();
    text.lines()
        .map(|line| {
            if line.starts_with("Usage: ") {
                usage.trim_end().to_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_flag_of_lock_shows_locks_own_usage_not_the_suggested_flag() {
        let Err(err) = Cli::try_parse_args([
            "redlockd",
            "lock",
            "--listen",
            "127.0.0.1:9",
            "x",
            "--",
            "true",
        ]) else {
            panic!("a server flag after lock was taken");
        };
        let text = usage_error_text(&err, "lock");
        assert!(text.contains("unexpected argument '--listen'"), "{text}");
        assert!(
            text.contains("Usage: redlockd lock [OPTIONS] <NAME>... -- <COMMAND>..."),
            "{text}"
        );
        assert!(!text.contains("Usage: redlockd lock --limit"), "{text}");
    }

    #[test]
    fn help_hides_the_environments_redis_urls() {
        let hidden = Cli::command()
            .find_subcommand("serve")
            .expect("serve")
            .get_arguments()
            .find(|a| a.get_id() == "redis_urls")
            .expect("the argument")
            .is_hide_env_values_set();
        assert!(
            hidden,
            "--help would print REDLOCKD_REDIS_URLS, passwords included"
        );
    }

    #[test]
    fn parse_errors_are_explained_with_the_variable() {
        let Err(err) = Cli::try_parse_args(["redlockd", "--max-wait-ms", "soon"]) else {
            panic!("parsed a bad value");
        };
        let explained = explain_parse_error(&err).expect("explained");
        assert!(explained.contains("REDLOCKD_MAX_WAIT_MS"), "{explained}");
    }

    #[test]
    fn client_verbs_take_only_their_own_options() {
        // A server flag after a client verb is refused, not ignored, and not called a bad
        // value of the server's variable.
        let Err(err) = Cli::try_parse_args([
            "redlockd",
            "lock",
            "--listen",
            "127.0.0.1:1",
            "a",
            "--",
            "true",
        ]) else {
            panic!("a server flag after lock was taken");
        };
        assert_eq!(explain_parse_error(&err), None, "{err}");
        assert!(Cli::try_parse_args(["redlockd", "list", "--max-ttl-ms", "5"]).is_err());
        // ... nor before it: the server's flags make the line `serve`, which has no verbs.
        assert!(Cli::try_parse_args(["redlockd", "--listen", "127.0.0.1:1", "list"]).is_err());
        // The verb's help lists its own options only.
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("lock")
            .expect("lock")
            .render_long_help()
            .to_string();
        assert!(
            help.contains("--hold-at-least") && help.contains("--server"),
            "{help}"
        );
        for server_flag in ["--auth-file", "--listen", "--max-ttl-ms", "--redis-urls"] {
            assert!(
                !help.contains(server_flag),
                "lock --help lists {server_flag}"
            );
        }
        // No verb, or the server's flags first: serve.
        assert!(matches!(
            Cli::try_parse_args(["redlockd"]).unwrap().command,
            Command::Serve(_)
        ));
        assert!(matches!(
            Cli::try_parse_args(["redlockd", "--listen", "127.0.0.1:1"]).unwrap().command,
            Command::Serve(c) if c.listen == "127.0.0.1:1"
        ));
    }

    #[test]
    fn a_bad_server_variable_does_not_stop_a_client_verb() {
        // The parse reads REDLOCKD_* from the environment; a client verb has none of the
        // server's, so their values cannot matter. (REDLOCKD_CA_FILE means the same to
        // both: the CA to trust when calling out over https.)
        let argv = ["redlockd", "list", "--server", "http://127.0.0.1:1"];
        let mut cmd = Cli::command();
        let list = cmd.find_subcommand_mut("list").expect("list");
        assert!(
            list.get_arguments().all(|a| a.get_env().is_none_or(|e| [
                "REDLOCKD_SERVER",
                "REDLOCKD_TOKEN",
                "REDLOCKD_CA_FILE"
            ]
            .contains(&e.to_str().unwrap_or_default()))),
            "list reads a server variable"
        );
        assert!(Cli::try_parse_args(argv).is_ok());
    }
}
