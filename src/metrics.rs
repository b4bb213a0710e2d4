//! Prometheus metrics, on a registry owned by the app rather than the global default, so
//! that every test (and every app in one process) counts only its own traffic.
//!
//! The names and labels are part of the HTTP contract: dashboards use them. No label
//! ever carries a raw lock name, owner or lease id; lock names are reduced to a bounded
//! set of classes.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// At most this many distinct `lock_class` values; the rest count under `other`.
pub(crate) const MAX_LOCK_CLASSES: usize = 100;

/// The operations of `redlockd_requests_total{op}`: a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Grant,
    Renew,
    Revoke,
    Check,
    Inspect,
    List,
    Campaign,
    Leader,
    Observe,
    Proclaim,
    Resign,
    Fence,
    ForceRelease,
}

impl Op {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Grant => "grant",
            Op::Renew => "renew",
            Op::Revoke => "revoke",
            Op::Check => "check",
            Op::Inspect => "inspect",
            Op::List => "list",
            Op::Campaign => "campaign",
            Op::Leader => "leader",
            Op::Observe => "observe",
            Op::Proclaim => "proclaim",
            Op::Resign => "resign",
            Op::Fence => "fence",
            Op::ForceRelease => "force_release",
        }
    }
}

/// The kinds of `redlockd_streams_active{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamKind {
    Hold,
    Campaign,
    Observe,
    Session,
}

impl StreamKind {
    const ALL: [StreamKind; 4] = [
        StreamKind::Hold,
        StreamKind::Campaign,
        StreamKind::Observe,
        StreamKind::Session,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StreamKind::Hold => "hold",
            StreamKind::Campaign => "campaign",
            StreamKind::Observe => "observe",
            StreamKind::Session => "session",
        }
    }
}

/// An open stream, counted in `redlockd_streams_active` until dropped.
pub(crate) struct StreamGuard(IntGauge);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    wait_duration: Histogram,
    contention: IntCounterVec,
    /// Kept holds granted, by kind of lock.
    kept: IntCounterVec,
    master_up: IntGaugeVec,
    master_duration: HistogramVec,
    master_errors: IntCounterVec,
    /// Steps sent to each master and the calls (batches) that carried them.
    master_steps: IntCounterVec,
    master_calls: IntCounterVec,
    leases_active: IntGauge,
    sessions_active: IntGauge,
    session_holds: Histogram,
    master_backlog: IntGaugeVec,
    master_backlog_dropped: IntCounterVec,
    streams_active: IntGaugeVec,
    /// What alerts compare against, read at each scrape: whether a majority votes, each
    /// master's vote and quarantine.
    ready: IntGauge,
    master_voting: IntGaugeVec,
    master_quarantine_end: GaugeVec,
    /// Each master's clock against this replica's, and the jumps seen (`store::clock`).
    master_clock_offset: GaugeVec,
    master_clock_jumps: IntCounterVec,
    /// Settings that alerts compare against (the master timeout, the cap on streams).
    master_timeout: Gauge,
    streams_max: IntGauge,
    /// Whether the last reading of a file read again at run time (the token file, the TLS
    /// certificate) succeeded.
    reload_success: IntGaugeVec,
    /// The lock classes seen so far, to keep `lock_class` bounded.
    classes: Mutex<HashSet<String>>,
}

/// Buckets from 100 µs to about a minute: a grant on local masters takes well under a
/// millisecond, a waiting grant up to the largest `wait_ms`.
fn wide_buckets() -> Vec<f64> {
    vec![
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0, 30.0, 60.0,
    ]
}

/// One master step is bounded by the master timeout (tens of milliseconds).
fn master_buckets() -> Vec<f64> {
    vec![
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    ]
}

/// `vec`'s metric of one label's value.
fn of<B: MetricVecBuilder>(vec: &MetricVec<B>, label: &str) -> B::M {
    vec.with_label_values(&[label])
}

/// Defines each metric and registers it, in one step.
struct Define<'a>(&'a Registry);

impl Define<'_> {
    fn add<C: Collector + Clone + 'static>(&self, metric: prometheus::Result<C>) -> C {
        // Every definition is fixed and registered once into a fresh registry: none can
        // fail at run time, and a wrong one fails every test.
        let metric = metric.expect("static metric definition");
        self.0
            .register(Box::new(metric.clone()))
            .expect("each metric is registered once");
        metric
    }

    fn counters(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.add(IntCounterVec::new(Opts::new(name, help), labels))
    }

    fn gauges(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::new(name, help))
    }

    fn histograms(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> HistogramVec {
        self.add(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets),
            labels,
        ))
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let define = Define(&registry);
        let metrics = Self {
            requests: define.counters(
                "redlockd_requests_total",
                "Lock requests by operation, kind of lock and outcome",
                &["op", "kind", "outcome"],
            ),
            request_duration: define.histograms(
                "redlockd_request_duration_seconds",
                "Time to answer a lock request, waiting included",
                wide_buckets(),
                &["op"],
            ),
            wait_duration: define.add(Histogram::with_opts(
                HistogramOpts::new(
                    "redlockd_wait_duration_seconds",
                    "Time grants spent waiting for a held lock",
                )
                .buckets(wide_buckets()),
            )),
            contention: define.counters(
                "redlockd_contention_total",
                "Grants that found their lock held, by lock class",
                &["lock_class"],
            ),
            kept: define.counters(
                "redlockd_kept_holds_granted_total",
                "Kept holds granted (kept: true, FleetLock's slots), by kind of lock: held until revoked or REDLOCKD_MAX_KEPT_HOLD_MS, renewed by no one",
                &["kind"],
            ),
            master_up: define.gauges(
                "redlockd_master_up",
                "1 while the master answers and votes",
                &["master"],
            ),
            master_duration: define.histograms(
                "redlockd_master_request_duration_seconds",
                "Time one master took to answer one step",
                master_buckets(),
                &["master"],
            ),
            master_errors: define.counters(
                "redlockd_master_errors_total",
                "Master steps that failed, by kind",
                &["master", "kind"],
            ),
            master_steps: define.counters(
                "redlockd_master_steps_total",
                "Steps sent to a master (acquire, confirm, renew, release, read)",
                &["master"],
            ),
            master_calls: define.counters(
                "redlockd_master_calls_total",
                "Script calls that carried those steps: several concurrent requests' steps travel in one",
                &["master"],
            ),
            leases_active: define.gauge(
                "redlockd_leases_active",
                "Leases granted by this process and neither revoked nor expired",
            ),
            sessions_active: define.gauge(
                "redlockd_sessions_active",
                "Sessions opened or renewed through this process and neither ended nor expired",
            ),
            session_holds: define.add(Histogram::with_opts(
                HistogramOpts::new(
                    "redlockd_session_holds",
                    "Holds per session, as each renew and read of a session finds them",
                )
                .buckets(vec![
                    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
                ]),
            )),
            master_backlog: define.gauges(
                "redlockd_master_backlog",
                "Work a master still owes after its request was answered: late acquires to settle, releases to repeat",
                &["master"],
            ),
            master_backlog_dropped: define.counters(
                "redlockd_master_backlog_dropped_total",
                "Backlog work refused because the master's backlog was full (the keys expire at their TTL instead)",
                &["master"],
            ),
            streams_active: define.gauges(
                "redlockd_streams_active",
                "Event streams open: held leases (hold), election campaigns (campaign), observers (observe), held sessions (session)",
                &["kind"],
            ),
            ready: define.gauge(
                "redlockd_ready",
                "1 while a majority of masters answer and vote and the process is not shutting down (as /readyz)",
            ),
            master_voting: define.gauges(
                "redlockd_master_voting",
                "1 while the master's answers count towards a majority (up, marked, verified, not quarantined)",
                &["master"],
            ),
            master_clock_offset: define.add(GaugeVec::new(
                Opts::new(
                    "redlockd_master_clock_offset_seconds",
                    "The master's clock (its TIME) against this replica's wall clock when last read, positive when the master's is ahead",
                ),
                &["master"],
            )),
            master_clock_jumps: define.counters(
                "redlockd_master_clock_jumps_total",
                "Jumps of a master's clock (a cluster's shards' clocks) beyond what drift explains, seen by this replica: forward ones quarantine the master",
                &["master", "direction"],
            ),
            master_quarantine_end: define.add(GaugeVec::new(
                Opts::new(
                    "redlockd_master_quarantine_end_timestamp_seconds",
                    "While the master is quarantined (it lost its data): when it votes again at the earliest, in Unix seconds; 0 otherwise",
                ),
                &["master"],
            )),
            master_timeout: define.add(Gauge::new(
                "redlockd_master_timeout_seconds",
                "How long one master may take to answer one step (REDLOCKD_MASTER_TIMEOUT_MS)",
            )),
            streams_max: define.gauge(
                "redlockd_streams_max",
                "Most event streams this replica keeps open at once (REDLOCKD_MAX_STREAMS)",
            ),
            reload_success: define.gauges(
                "redlockd_reload_success",
                "1 when the last reading of a file read again at run time succeeded: the token file (auth), the TLS certificate (tls)",
                &["file"],
            ),
            classes: Mutex::new(HashSet::new()),
            registry,
        };
        for kind in StreamKind::ALL {
            metrics
                .streams_active
                .with_label_values(&[kind.as_str()])
                .set(0);
        }
        // Registered once, into the registry just made, where every other name starts with
        // `redlockd_`: it cannot clash, and a clash would fail every test that builds metrics.
        #[cfg(target_os = "linux")]
        metrics
            .registry
            .register(Box::new(ProcessMetrics::new()))
            .expect("the process collector is registered once");
        metrics
    }

    /// Count a request to a lock route: `kind` is `lock`, `election` or `semaphore` (the
    /// route's collection; a bounded set).
    pub(crate) fn request(&self, op: Op, kind: &str, outcome: &str, took: Duration) {
        self.requests
            .with_label_values(&[op.as_str(), kind, outcome])
            .inc();
        self.request_duration
            .with_label_values(&[op.as_str()])
            .observe(took.as_secs_f64());
    }

    /// Count a stream as open until the guard is dropped.
    pub(crate) fn stream_opened(&self, kind: StreamKind) -> StreamGuard {
        let gauge = self.streams_active.with_label_values(&[kind.as_str()]);
        gauge.inc();
        StreamGuard(gauge)
    }

    /// A kept hold of `kind` granted (`lock`, `election`, `semaphore`).
    pub(crate) fn kept_granted(&self, kind: &'static str) {
        self.kept.with_label_values(&[kind]).inc();
    }

    pub(crate) fn waited(&self, took: Duration) {
        self.wait_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn contended(&self, class: &str) {
        let label = {
            let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
            if classes.contains(class) {
                class
            } else if classes.len() < MAX_LOCK_CLASSES {
                classes.insert(class.to_owned());
                class
            } else {
                "other"
            }
        };
        self.contention.with_label_values(&[label]).inc();
    }

    /// Create every per-master series at its starting value, so that dashboards and
    /// `rate()` see a master's series before its first error.
    pub(crate) fn register_master(&self, master: &str, error_kinds: &[&str]) {
        for kind in error_kinds {
            self.master_errors.with_label_values(&[master, kind]);
        }
        self.master_backlog.with_label_values(&[master]).set(0);
        self.master_backlog_dropped.with_label_values(&[master]);
        self.master_voting.with_label_values(&[master]).set(0);
        of(&self.master_quarantine_end, master).set(0.0);
    }

    /// The settings alerts compare against.
    pub(crate) fn settings(&self, master_timeout: Duration, max_streams: usize) {
        self.master_timeout.set(master_timeout.as_secs_f64());
        self.streams_max
            .set(i64::try_from(max_streams).unwrap_or(i64::MAX));
    }

    /// Whether a majority votes (as `/readyz` says).
    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// One master's vote, and when its quarantine ends if it is quarantined.
    pub(crate) fn master_health(
        &self,
        master: &str,
        voting: bool,
        quarantine_ends: Option<std::time::SystemTime>,
    ) {
        of(&self.master_voting, master).set(i64::from(voting));
        let ends = quarantine_ends
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        of(&self.master_quarantine_end, master).set(ends);
    }

    /// One master's clock as last read, and how many jumps of it were seen (forward,
    /// backward) in all: the counters catch up with the watch's counts.
    pub(crate) fn master_clock(&self, master: &str, offset_s: Option<f64>, jumps: [u64; 2]) {
        if let Some(offset) = offset_s {
            of(&self.master_clock_offset, master).set(offset);
        }
        for (direction, seen) in ["forward", "backward"].into_iter().zip(jumps) {
            let counter = self
                .master_clock_jumps
                .with_label_values(&[master, direction]);
            counter.inc_by(seen.saturating_sub(counter.get()));
        }
    }

    /// The outcome of reading `file` (`auth`, `tls`) again.
    pub(crate) fn reloaded(&self, file: &str, ok: bool) {
        of(&self.reload_success, file).set(i64::from(ok));
    }

    pub(crate) fn master_backlog(&self, master: &str, depth: usize) {
        of(&self.master_backlog, master).set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    pub(crate) fn master_backlog_dropped(&self, master: &str) {
        of(&self.master_backlog_dropped, master).inc();
    }

    pub(crate) fn master_up(&self, master: &str, up: bool) {
        of(&self.master_up, master).set(i64::from(up));
    }

    pub(crate) fn master_answered(&self, master: &str, took: Duration) {
        of(&self.master_duration, master).observe(took.as_secs_f64());
    }

    pub(crate) fn master_failed(&self, master: &str, kind: &str) {
        self.master_errors.with_label_values(&[master, kind]).inc();
    }

    /// The master's steps and calls so far, counted where they are sent and copied here
    /// before each scrape.
    pub(crate) fn master_traffic(&self, master: &str, steps: u64, calls: u64) {
        for (counter, total) in [(&self.master_steps, steps), (&self.master_calls, calls)] {
            let counter = of(counter, master);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Leases expire on the masters without telling us, so the gauge is set from the
    /// lease service's own count just before each scrape.
    pub(crate) fn set_leases_active(&self, count: usize) {
        self.leases_active
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sessions end on the masters without telling us, so the gauge is set from the lease
    /// service's own count just before each scrape.
    pub(crate) fn set_sessions_active(&self, count: usize) {
        self.sessions_active
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A session was seen holding `count` holds.
    pub(crate) fn session_holds(&self, count: usize) {
        self.session_holds.observe(count as f64);
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The prometheus crate's process metrics, with `process_cpu_seconds_total` in fractions
/// of a second: the crate counts whole seconds, so a process that used 0.24 s of CPU reads
/// 0, and a rate over a quiet replica reads nothing at all.
#[cfg(target_os = "linux")]
struct ProcessMetrics {
    inner: prometheus::process_collector::ProcessCollector,
    cpu: prometheus::Counter,
    ticks_per_second: f64,
}

#[cfg(target_os = "linux")]
impl ProcessMetrics {
    const CPU: &'static str = "process_cpu_seconds_total";

    fn new() -> Self {
        use nix::unistd::{SysconfVar, sysconf};
        Self {
            inner: prometheus::process_collector::ProcessCollector::for_self(),
            // A fixed name and help text that Prometheus accepts: it cannot fail.
            cpu: prometheus::Counter::new(
                Self::CPU,
                "Total user and system CPU time spent in seconds.",
            )
            .expect("a fixed, valid metric definition"),
            // 100 on every Linux there is; asked all the same.
            ticks_per_second: sysconf(SysconfVar::CLK_TCK)
                .ok()
                .flatten()
                .filter(|t| *t > 0)
                .map_or(100.0, |t| t as f64),
        }
    }

    /// User and system CPU time of this process so far, from `/proc/self/stat`.
    fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command (which may hold spaces) start at the state, field 3;
        // utime and stime are fields 14 and 15.
        let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
        let utime: u64 = fields.next()?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        Some((utime + stime) as f64 / self.ticks_per_second)
    }
}

#[cfg(target_os = "linux")]
impl prometheus::core::Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families: Vec<_> = self
            .inner
            .collect()
            .into_iter()
            .filter(|f| f.name() != Self::CPU)
            .collect();
        if let Some(seconds) = self.cpu_seconds() {
            let past = self.cpu.get();
            if seconds > past {
                self.cpu.inc_by(seconds - past);
            }
            families.extend(prometheus::core::Collector::collect(&self.cpu));
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_classes_are_bounded() {
        let m = Metrics::new();
        for i in 0..150 {
            m.contended(&format!("class{i}"));
        }
        m.contended("class0");
        let text = m.render();
        assert!(text.contains(r#"redlockd_contention_total{lock_class="class0"} 2"#));
        assert!(text.contains(r#"redlockd_contention_total{lock_class="other"} 50"#));
        assert!(!text.contains(r#"lock_class="class120""#));
    }
}
