//! `redlockd lock NAME -- CMD`: run a command while holding a lock (with `--limit N`, one
//! of N permits of the semaphore NAME).
//!
//! The lock is granted first (waiting up to `--wait`; the grant carries an Idempotency-Key,
//! so it fails over to the next server when an answer is lost), then the command runs in a process
//! group of its own with the lease in its environment. A background task renews the lease
//! at about a third of its TTL, failing over between the servers; when a renew says the
//! lease is gone, or the lease's validity runs out before a renew succeeds, the command's
//! process group gets SIGTERM, then SIGKILL after `--grace`. When the command exits, the
//! lock is released, or with `--hold-at-least` kept until that long after the grant.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use reqwest::Method;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until, timeout_at};

use serde::{Deserialize, Serialize};

use super::{Failure, Repeat, Servers, idempotency_key, lock_path};
use crate::cli::LockArgs;
use crate::model::{FencingToken, Jeopardy, MIN_TTL_MS};
use crate::wire::{GrantRequest, GroupRequest, LockMode, RenewRequest, SemaphoreRequest, Whole};

/// What `redlockd lock` asks for: a lock, or a semaphore's permit.
#[derive(Serialize)]
#[serde(untagged)]
enum Grant {
    Lock(GrantRequest),
    Permit(SemaphoreRequest),
    Group(GroupRequest),
}

/// What the grant answers that the command needs: a lock's lease body or a permit's.
#[derive(Deserialize)]
struct Granted {
    lease_id: String,
    fencing_token: FencingToken,
    validity_ms: u64,
    /// A permit's slot.
    #[serde(default)]
    slot: Option<u16>,
}

/// The exit statuses of `redlockd lock` other than the command's own.
pub(crate) mod exit {
    /// The command line, a value the server refused as malformed, or a token it refused.
    pub(crate) const USAGE: u8 = 64;
    /// No server answered, or none could reach a majority of masters.
    pub(crate) const UNAVAILABLE: u8 = 69;
    // 75, another lease held the lock for the whole of `--wait`, is `--held-exit-code`'s
    // default in `cli`, where a caller may change it.
    /// The lease was lost while the command ran; the command was stopped.
    pub(crate) const LOST: u8 = 76;
    /// The command exists but could not be executed (as a shell answers).
    pub(crate) const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found (as a shell answers).
    pub(crate) const NOT_FOUND: u8 = 127;
}

/// The shortest pause between renews that failed to get an answer.
const MIN_RETRY: Duration = Duration::from_millis(20);
/// The longest pause between renews that failed to get an answer.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// How often a stopping command's process group is looked at.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// Between renews, how often the lease is checked: an administrator's force-release (or
/// the masters losing it) is then noticed within this, not at the next renew, which with
/// the default 30 s TTL is up to 10 s later. A check is one read.
const CHECK_EVERY: Duration = Duration::from_secs(1);

fn say(what: impl std::fmt::Display) {
    eprintln!("redlockd lock: {what}");
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Run `args.command` under the lock; the process's exit status.
pub(crate) async fn run(args: LockArgs) -> u8 {
    let servers = match Servers::of(&args.server) {
        Ok(servers) => Arc::new(servers),
        Err(e) => {
            say(e);
            return exit::USAGE;
        }
    };
    if args.names.len() > 1 && (args.limit.is_some() || args.shared) {
        say("several names are one exclusive lease: they take neither --limit nor --shared");
        return exit::USAGE;
    }
    if args.names.len() > 1 && args.lock_delay.is_some() {
        say("--lock-delay is for a lock on one name");
        return exit::USAGE;
    }
    // Messages and the command's environment name them all, separated by commas.
    let name = args.names.join(",");
    let first = args.names[0].clone();
    // A lock kept --hold-at-least after the grant is granted for that long at once (renews
    // then shorten it to --ttl): a server that cannot keep it so long refuses the grant
    // before the command runs, rather than after it ran with nothing kept.
    let hold_at_least = args.hold_at_least.filter(|h| *h > args.ttl);
    let ttl_ms = Some(Whole(millis(hold_at_least.unwrap_or(args.ttl))));
    let wait_ms = Some(Whole(millis(args.wait)));
    let owner = Some(
        args.owner
            .clone()
            .unwrap_or_else(|| default_owner(&args.command)),
    );
    // Where the grant goes, and where its lease is renewed and released (a lease on several
    // names, through any of them).
    let (grant_path, path, grant, what) = match args.limit {
        _ if args.names.len() > 1 => (
            "/locks".to_owned(),
            lock_path(&first),
            Grant::Group(GroupRequest {
                names: args.names.clone(),
                ttl_ms,
                wait_ms,
                owner,
                mode: None,
                session: None,
                grace_ms: None,
                kept: None,
            }),
            "locks",
        ),
        Some(limit) => (
            format!("/semaphores/{first}"),
            format!("/semaphores/{first}"),
            Grant::Permit(SemaphoreRequest {
                limit: Some(Whole(u64::from(limit))),
                ttl_ms,
                wait_ms,
                owner,
                session: None,
                grace_ms: None,
                kept: None,
            }),
            "permit",
        ),
        None => (
            lock_path(&first),
            lock_path(&first),
            Grant::Lock(GrantRequest {
                ttl_ms,
                wait_ms,
                owner,
                mode: args.shared.then_some(LockMode::Shared),
                lock_delay_ms: args.lock_delay.map(|d| Whole(millis(d))),
                session: None,
                grace_ms: None,
                kept: None,
            }),
            if args.shared { "shared lock" } else { "lock" },
        ),
    };
    let asked = Instant::now();
    let lease: Granted = match servers
        .call(
            Method::POST,
            &grant_path,
            Some(&grant),
            args.wait,
            Repeat::Keyed(&idempotency_key()),
        )
        .await
    {
        Ok(lease) => lease,
        Err(Failure::Held {
            retry_after,
            message,
        }) => {
            // A skip the user declared a success is silent: cron mails any output.
            if !args.quiet && args.held_exit_code != 0 {
                let ms = millis(retry_after);
                // A lock-delay cannot be renewed: it ends when it says.
                let held = match args.limit {
                    Some(limit) => format!(
                        "every one of the {limit} permits of {name} is taken (one is free in \
                         about {ms} ms at the latest, unless renewed)"
                    ),
                    None if message.contains("lock-delay") => format!(
                        "{name} is in its lock-delay: its last lease ended without a revoke \
                         (free in about {ms} ms)"
                    ),
                    None => format!(
                        "{name} is held by another lease (free in about {ms} ms at the \
                         latest, unless renewed)"
                    ),
                };
                say(held);
            }
            return args.held_exit_code;
        }
        Err(Failure::Invalid(m)) if hold_at_least.is_some() && m.contains("ttl_ms") => {
            say(format_args!(
                "the server cannot keep the {what} for --hold-at-least {} ({m}); \
                 nothing was run: use a shorter --hold-at-least, or raise the server's \
                 REDLOCKD_MAX_TTL_MS",
                humantime::format_duration(hold_at_least.unwrap_or_default())
            ));
            return exit::USAGE;
        }
        Err(Failure::Invalid(m) | Failure::Denied(m)) => {
            say(m);
            return exit::USAGE;
        }
        Err(Failure::NotFound(m) | Failure::Unavailable(m)) => {
            say(format_args!("cannot take the {what} {name}: {m}"));
            return exit::UNAVAILABLE;
        }
    };
    let granted = Instant::now();
    // Validity counts from the server's answer; counting from the request errs safe.
    let valid_until = asked + Duration::from_millis(lease.validity_ms);
    let lease_path = format!("{path}/leases/{}", lease.lease_id);

    // Listening before the command starts, so that no signal meant for it is missed.
    let signals = match Signals::listen() {
        Ok(signals) => signals,
        Err(e) => {
            say(format_args!("cannot listen for signals: {e}"));
            release(&servers, &lease_path).await;
            return exit::UNAVAILABLE;
        }
    };
    let mut command = tokio::process::Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("REDLOCKD_LOCK_NAME", &name)
        .env("REDLOCKD_LEASE_ID", &lease.lease_id)
        .env("REDLOCKD_FENCING_TOKEN", lease.fencing_token.to_string())
        // Its own group, so that a lost lease stops every process the command started.
        .process_group(0);
    if let Some(slot) = lease.slot {
        command.env("REDLOCKD_SLOT", slot.to_string());
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            say(format_args!("cannot run {}: {e}", args.command[0]));
            release(&servers, &lease_path).await;
            return match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);

    let alarm = Alarm {
        group,
        jeopardy: args.jeopardy_signal,
        safe: args.safe_signal,
    };
    let keeper = tokio::spawn(keep(
        servers.clone(),
        lease_path.clone(),
        args.ttl,
        valid_until,
        alarm,
    ));
    let lost = run_child(&mut child, group, keeper, signals).await;
    match lost {
        Ok(status) => {
            finish(&servers, &lease_path, granted, args.ttl, args.hold_at_least).await;
            status_code(status)
        }
        Err(reason) => {
            say(format_args!(
                "lost the {what} on {name}: {reason}; stopping the command"
            ));
            stop(&mut child, group, args.grace).await;
            exit::LOST
        }
    }
}

/// Wait for the command to exit, forwarding signals to it; `Err` with the reason when the
/// lease is lost first.
async fn run_child(
    child: &mut tokio::process::Child,
    group: Option<Pid>,
    mut keeper: tokio::task::JoinHandle<String>,
    signals: Signals,
) -> Result<std::process::ExitStatus, String> {
    let Signals {
        mut int,
        mut term,
        mut hup,
    } = signals;
    let forward = |sig: Signal| {
        if let Some(group) = group {
            let _ = killpg(group, sig);
        }
    };
    let result = loop {
        tokio::select! {
            status = child.wait() => {
                break status.map_err(|e| format!("cannot wait for the command: {e}"));
            }
            reason = &mut keeper => {
                break Err(reason.unwrap_or_else(|e| format!("the renew task failed: {e}")));
            }
            _ = int.recv() => forward(Signal::SIGINT),
            _ = term.recv() => forward(Signal::SIGTERM),
            _ = hup.recv() => forward(Signal::SIGHUP),
        }
    };
    keeper.abort();
    result
}

/// The signals forwarded to the command.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// What the command is told when its renews stop getting through (`jeopardy`) and when one
/// gets through again (`safe`): the signals its process group gets, if any.
struct Alarm {
    group: Option<Pid>,
    jeopardy: Option<Signal>,
    safe: Option<Signal>,
}

impl Alarm {
    fn jeopardy(&self, validity: Duration) {
        say(format_args!(
            "renews are not getting through; the lease is valid for {} ms more{}",
            validity.as_millis(),
            self.sent(self.jeopardy)
        ));
    }

    fn safe(&self, validity: Duration) {
        say(format_args!(
            "a renew got through; the lease is valid for {} ms again{}",
            validity.as_millis(),
            self.sent(self.safe)
        ));
    }

    /// Send `signal` to the command's group; how the message says so.
    fn sent(&self, signal: Option<Signal>) -> String {
        match (signal, self.group) {
            (Some(signal), Some(group)) => match killpg(group, signal) {
                Ok(()) => format!(" (sent {signal} to the command)"),
                Err(e) => format!(" (could not send {signal} to the command: {e})"),
            },
            _ => String::new(),
        }
    }
}

/// Renew the lease at about a third of its TTL until it is lost; the reason it was. Less
/// than a third of the TTL left without a renew through is told once (`alarm`).
async fn keep(
    servers: Arc<Servers>,
    path: String,
    ttl: Duration,
    mut valid_until: Instant,
    alarm: Alarm,
) -> String {
    let mut jeopardy = Jeopardy::new(ttl);
    let mut warn = |validity| alarm.jeopardy(validity);
    let every = ttl / 3;
    let retry = (every / 4).clamp(MIN_RETRY, MAX_RETRY);
    let mut next = Instant::now() + every;
    let mut last_error = None;
    // Explicitly the TTL asked for: the grant may have been made longer (--hold-at-least).
    let keep_ttl = RenewRequest {
        ttl_ms: Some(Whole(millis(ttl))),
    };
    let mut next_check = Instant::now() + CHECK_EVERY;
    loop {
        if next_check < next.min(valid_until) {
            jeopardy
                .during(sleep_until(next_check), valid_until, &mut warn)
                .await;
            next_check = Instant::now() + CHECK_EVERY;
            // Only "gone" counts: any other answer (or none) leaves it to the renews.
            if let Err(Failure::NotFound(m)) = servers.get::<serde_json::Value>(&path).await {
                return format!(
                    "the masters no longer hold the lease (force-released, or lost: {m})"
                );
            }
            continue;
        }
        jeopardy
            .during(sleep_until(next.min(valid_until)), valid_until, &mut warn)
            .await;
        let sent = Instant::now();
        if sent >= valid_until {
            return ran_out(last_error);
        }
        next_check = sent + CHECK_EVERY;
        let call = servers.call::<_, Granted>(
            Method::PUT,
            &path,
            Some(&keep_ttl),
            Duration::ZERO,
            Repeat::Safe,
        );
        let answer = jeopardy
            .during(timeout_at(valid_until, call), valid_until, &mut warn)
            .await;
        match answer {
            Err(_) => return ran_out(last_error),
            Ok(Ok(lease)) => {
                valid_until = sent + Duration::from_millis(lease.validity_ms);
                next = sent + every;
                last_error = None;
                if let Some(validity) = jeopardy.renewed(valid_until) {
                    alarm.safe(validity);
                }
            }
            Ok(Err(Failure::NotFound(m))) => {
                return format!("the masters no longer hold the lease ({m})");
            }
            Ok(Err(e)) => {
                say(format_args!("renew failed, trying again: {e}"));
                last_error = Some(e.to_string());
                next = Instant::now() + retry;
            }
        }
    }
}

fn ran_out(last_error: Option<String>) -> String {
    match last_error {
        Some(e) => format!("its validity ran out before a renew succeeded (last error: {e})"),
        None => "its validity ran out before a renew succeeded".into(),
    }
}

/// After the command exited: release the lock, or keep it until `hold_at_least` after the
/// grant by making the rest of that time the lease's TTL.
async fn finish(
    servers: &Servers,
    path: &str,
    granted: Instant,
    ttl: Duration,
    hold_at_least: Option<Duration>,
) {
    let Some(until) = hold_at_least.map(|h| granted + h) else {
        release(servers, path).await;
        return;
    };
    if keep_until(servers, path, ttl, until).await.is_err() {
        say("cannot keep the lock for --hold-at-least; releasing it");
        release(servers, path).await;
    }
}

/// Keep the lease until `until`: one renew whose TTL is the rest of that time, or, where a
/// server will not take so long a TTL (replicas configured apart), renews of `ttl` until
/// the rest fits in one. `Err` when no renew got through before the lease ran out.
async fn keep_until(
    servers: &Servers,
    path: &str,
    ttl: Duration,
    until: Instant,
) -> Result<(), Failure> {
    let mut rest_in_one = true;
    loop {
        let Some(rest) = until.checked_duration_since(Instant::now()) else {
            return Ok(());
        };
        let step = if rest_in_one { rest } else { rest.min(ttl) };
        let renewed = servers
            .call::<_, Granted>(
                Method::PUT,
                path,
                Some(&RenewRequest {
                    ttl_ms: Some(Whole(millis(step).max(MIN_TTL_MS))),
                }),
                Duration::ZERO,
                Repeat::Safe,
            )
            .await;
        match renewed {
            Ok(_) if step == rest => return Ok(()),
            Ok(_) => tokio::time::sleep(ttl / 3).await,
            // Gone already: nothing to keep, nothing to release.
            Err(Failure::NotFound(_)) => return Ok(()),
            Err(Failure::Invalid(_)) if rest_in_one => rest_in_one = false,
            Err(e) => return Err(e),
        }
    }
}

async fn release(servers: &Servers, path: &str) {
    let result = servers
        .call::<(), serde_json::Value>(Method::DELETE, path, None, Duration::ZERO, Repeat::Safe)
        .await;
    match result {
        // NotFound: it lapsed, or an earlier attempt whose answer was lost released it.
        Ok(_) | Err(Failure::NotFound(_)) => {}
        Err(e) => say(format_args!(
            "cannot release the lock ({e}); it stays held until its TTL"
        )),
    }
}

/// Stop the command's process group: SIGTERM, then SIGKILL to whatever of the group is
/// left after `grace` (the command may exit at once and leave children that ignore it).
async fn stop(child: &mut tokio::process::Child, group: Option<Pid>, grace: Duration) {
    let Some(group) = group else { return };
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        // Reaped, the command no longer counts as a member of its group.
        let _ = child.try_wait();
        if killpg(group, None).is_err() {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
    say("the command did not stop within --grace; killing it");
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait().await;
}

/// The command's exit status as a shell reports it: its code, or 128 + the signal.
fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}

/// `host pid 123: cmd args`, at most the contract's 256 bytes, no control characters.
fn default_owner(command: &[String]) -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    let text = format!("{host} pid {}: {}", std::process::id(), command.join(" "));
    let mut owner: String = text.chars().filter(|c| !c.is_control()).collect();
    if owner.len() > 256 {
        let mut end = 256;
        while !owner.is_char_boundary(end) {
            end -= 1;
        }
        owner.truncate(end);
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn exit_status_is_reported_as_a_shell_does() {
        assert_eq!(status_code(std::process::ExitStatus::from_raw(3 << 8)), 3);
        // Killed by SIGKILL (9).
        assert_eq!(status_code(std::process::ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn the_default_owner_fits_the_contract() {
        let long = vec!["é".repeat(400)];
        let owner = default_owner(&long);
        assert!(owner.len() <= 256);
        assert!(owner.contains("pid"));
        assert!(!default_owner(&["a\nb".into()]).contains('\n'));
    }
}
