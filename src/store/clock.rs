//! Each master's clock, watched: the answer to Redlock's last open objection.
//!
//! Redis expires keys by its wall clock. A master whose clock jumps forward drops every
//! lock on it at once, early; with one other master that never had a lock, a second client
//! can then win a majority while the first still holds a validity it was answered. So every
//! step a master answers carries the master's `TIME` (one reading per batch, and one per
//! probe), and this watch compares, between two readings, how far the master's clock moved
//! with how far this process's monotonic clock moved around them.
//!
//! Two readings A and B were each taken on the master between the moment the call left
//! and the moment its answer arrived here, so a master clock that keeps time moved by at
//! least `B.sent - A.received` and at most `B.received - A.sent`. Past that window by more
//! than the drift the validity already allows for (`drift_factor` of the interval) and a
//! few milliseconds, the master's clock jumped:
//! - **forward**: its keys may have expired early, so its answers stop counting at once
//!   (the answer that showed the jump is a refusal, never a vote) and stay refused until the
//!   monitor has quarantined the master as one that lost its data (`settle`);
//! - **backward**: its keys live longer than granted, a liveness cost only; it is counted
//!   and shown, and nothing else changes (a remaining TTL a master answers is still the
//!   truth about when its key goes, by the master's own clock, which is what expiry uses).
//!
//! A master met for the first time has no earlier reading: its clock is compared with this
//! process's wall clock instead, and one further off than `max_offset` (a jump seen by no
//! replica, or a replica whose own clock is off) is not counted until it has been watched
//! for `settle` without a jump: by then every lock a jump before could have cut short has
//! ended anyway.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::node::NodeError;

/// What the watch allows beyond drift: the resolution of the readings and a master's
/// cached time within one command.
const MARGIN: Duration = Duration::from_millis(5);

/// How far a first reading may differ from another replica's record of the same master
/// and still be vouched for by it (the replicas' own clocks must agree this well).
pub(crate) const VOUCH_TOLERANCE: Duration = Duration::from_millis(100);

/// How old, by the master's clock, a record may be and still vouch (records are written
/// about once a second).
pub(crate) const RECORD_FRESH: Duration = Duration::from_secs(10);

/// What a master's clock is held to.
#[derive(Debug, Clone, Copy)]
pub struct ClockPolicy {
    /// The share of an interval a master's clock may drift from this process's
    /// (`REDLOCKD_DRIFT_FACTOR`, the one validity allows for).
    pub drift_factor: f64,
    /// How far a master met for the first time may be from this process's wall clock
    /// before it must first be watched for `settle` (`REDLOCKD_MAX_CLOCK_OFFSET_MS`).
    pub max_offset: Duration,
    /// How long a master first met that far off is watched before it counts: the
    /// quarantine of a master that lost its data.
    pub settle: Duration,
    /// `REDLOCKD_UNSAFE_TRUST_MASTER_CLOCKS`: read and show the clocks, act on nothing (to
    /// show what the watch prevents, in tests).
    pub trust: bool,
}

impl Default for ClockPolicy {
    fn default() -> Self {
        Self {
            drift_factor: 0.01,
            max_offset: Duration::from_secs(1),
            settle: Duration::from_secs(120),
            trust: false,
        }
    }
}

/// One reading of a master's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// When the call that carried it left, and when its answer arrived, by this process.
    pub sent: Instant,
    pub received: Instant,
    /// The master's `TIME`, in microseconds since the Unix epoch.
    pub master_us: i64,
    /// This process's wall clock when the answer arrived, in microseconds since the epoch.
    pub local_us: i64,
}

/// A jump the watch saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Jump {
    /// How far, beyond what drift explains: positive forward.
    pub by_us: i64,
    pub at: SystemTime,
}

impl Jump {
    /// As `/readyz` says it: "clock jumped +20.3 s".
    pub(crate) fn describe(&self) -> String {
        format!("clock jumped {:+.1} s", self.by_us as f64 / 1e6)
    }
}

/// What the watch knows now, for `/readyz` and metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClockStatus {
    /// The master's clock against this process's wall clock, as last read (seconds).
    pub offset_s: Option<f64>,
    /// A forward jump whose master has not been quarantined yet: its answers are refused.
    pub pending: Option<Jump>,
    /// The last jump seen either way.
    pub last: Option<Jump>,
    pub forward_jumps: u64,
    pub backward_jumps: u64,
    /// Why the master does not count yet, when it was first met too far off.
    pub settling: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Reading>,
    offset_us: Option<i64>,
    pending: Option<Jump>,
    last_jump: Option<Jump>,
    forward: u64,
    backward: u64,
    /// First met too far off: not counted until then (and why).
    settling: Option<(Instant, String)>,
    /// The last forward jump settled, and when: answers to calls sent before then are
    /// still refused for it.
    settled: Option<(Instant, Jump)>,
}

/// One master's clock, watched (see the module's doc).
#[derive(Debug)]
pub(crate) struct ClockWatch {
    policy: ClockPolicy,
    state: Mutex<State>,
}

impl ClockWatch {
    pub(crate) fn new(policy: ClockPolicy) -> Self {
        Self {
            policy,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain values: a panic elsewhere mid-update leaves nothing worse than one reading.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Judge `reading`: `Err` when the answer it came with must not count.
    pub(crate) fn observe(&self, reading: Reading) -> Result<(), NodeError> {
        self.observe_vouched(reading, &[])
    }

    /// Judge `reading` as `observe` does; a first reading further off than `max_offset` is
    /// counted at once all the same when one of `records` (other replicas' offsets of this
    /// master, recorded by the master's clock within the last `RECORD_FRESH`; see
    /// clocks.lua) agrees with it within `VOUCH_TOLERANCE` and the round trip: then the
    /// master's clock stood there a moment ago for a replica that watched it, and a jump
    /// since would show as a difference.
    pub(crate) fn observe_vouched(
        &self,
        reading: Reading,
        records: &[(i64, i64)],
    ) -> Result<(), NodeError> {
        let mut state = self.state();
        state.offset_us = Some(reading.master_us - reading.local_us);
        match state.last {
            None => {
                let off = reading.master_us - reading.local_us;
                let rtt = reading.received.saturating_duration_since(reading.sent);
                let tolerance =
                    i64::try_from((VOUCH_TOLERANCE + rtt).as_micros()).unwrap_or(i64::MAX);
                let fresh = i64::try_from(RECORD_FRESH.as_micros()).unwrap_or(i64::MAX);
                let vouched = records.iter().any(|(recorded, at)| {
                    (reading.master_us - at).abs() <= fresh && (off - recorded).abs() <= tolerance
                });
                if !vouched && off.unsigned_abs() > self.policy.max_offset.as_micros() as u64 {
                    let why = format!(
                        "clock {:+.1} s from this replica's when first met: not counted for {} s, \
                         in case it jumped before this replica watched it",
                        off as f64 / 1e6,
                        self.policy.settle.as_secs()
                    );
                    tracing::warn!(offset_s = off as f64 / 1e6, "{why}");
                    state.settling = Some((reading.received + self.policy.settle, why));
                }
            }
            Some(last) => {
                if let Some(jump) = judge(&last, &reading, self.policy.drift_factor) {
                    state.last_jump = Some(jump);
                    if jump.by_us > 0 {
                        state.forward += 1;
                        if !self.policy.trust {
                            state.pending.get_or_insert(jump);
                        }
                        tracing::error!(
                            jump_s = jump.by_us as f64 / 1e6,
                            "a master's clock jumped forward: its locks may have expired early; it stops voting"
                        );
                    } else {
                        state.backward += 1;
                        tracing::warn!(
                            jump_s = jump.by_us as f64 / 1e6,
                            "a master's clock jumped backward: its locks live longer than granted"
                        );
                    }
                }
            }
        }
        if state
            .last
            .is_none_or(|last| reading.received >= last.received)
        {
            state.last = Some(reading);
        }
        if let Some(jump) = state.pending {
            return Err(NodeError::Clock(jump.describe()));
        }
        if let Some((at, jump)) = state.settled
            && reading.sent < at
        {
            return Err(NodeError::Clock(jump.describe()));
        }
        match &state.settling {
            Some((until, _)) if reading.received >= *until => {
                state.settling = None;
                Ok(())
            }
            Some((_, why)) if !self.policy.trust => Err(NodeError::Clock(why.clone())),
            _ => Ok(()),
        }
    }

    /// Whether answers are refused now, and why.
    pub(crate) fn refusal(&self) -> Option<NodeError> {
        let state = self.state();
        if let Some(jump) = state.pending {
            return Some(NodeError::Clock(jump.describe()));
        }
        match &state.settling {
            Some((until, why)) if !self.policy.trust && Instant::now() < *until => {
                Some(NodeError::Clock(why.clone()))
            }
            _ => None,
        }
    }

    /// The master the jump was seen on has been quarantined (its marker removed): its
    /// scripts refuse by themselves from here on, so the watch need not.
    ///
    /// Only for calls sent from now on: a call sent before may have been carried out on the
    /// master before its marker went, and be read only now (the probe and the steps travel
    /// on different connections). Its reading keeps time with the probe's, so nothing in it
    /// shows the jump; it stays refused.
    pub(crate) fn settle(&self) {
        self.settle_at(Instant::now());
    }

    /// `settle`, for calls sent from `at` on. `at` is read once the master's marker was
    /// seen gone; a call carried out before that left at least a round trip earlier, so
    /// only calls sent strictly before `at` are refused.
    pub(crate) fn settle_at(&self, at: Instant) {
        let mut state = self.state();
        if let Some(jump) = state.pending.take() {
            state.settled = Some((at, jump));
        }
    }

    pub(crate) fn status(&self) -> ClockStatus {
        let state = self.state();
        ClockStatus {
            offset_s: state.offset_us.map(|us| us as f64 / 1e6),
            pending: state.pending,
            last: state.last_jump,
            forward_jumps: state.forward,
            backward_jumps: state.backward,
            settling: state
                .settling
                .as_ref()
                .filter(|(until, _)| Instant::now() < *until)
                .map(|(_, why)| why.clone()),
        }
    }
}

/// A jump between readings `a` and `b` (in either order), beyond what drift explains.
fn judge(a: &Reading, b: &Reading, drift_factor: f64) -> Option<Jump> {
    let (a, b) = if b.received >= a.received {
        (a, b)
    } else {
        (b, a)
    };
    let moved = b.master_us - a.master_us;
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    let most = micros(b.received.saturating_duration_since(a.sent));
    // Negative when B's call left before A's answer arrived (they overlapped).
    let least = if b.sent >= a.received {
        micros(b.sent - a.received)
    } else {
        -micros(a.received - b.sent)
    };
    let allowance = (most as f64 * drift_factor) as i64 + micros(MARGIN);
    if moved > most + allowance {
        Some(Jump {
            by_us: moved - most,
            at: SystemTime::now(),
        })
    } else if moved < least - allowance {
        Some(Jump {
            by_us: moved - least,
            at: SystemTime::now(),
        })
    } else {
        None
    }
}

/// This process's wall clock, in microseconds since the Unix epoch.
pub(crate) fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A `TIME` answer (seconds and microseconds, as strings or integers), in microseconds.
pub(crate) fn parse_time(value: &redis::Value) -> Option<i64> {
    let redis::Value::Array(parts) = value else {
        return None;
    };
    let [s, us] = parts.as_slice() else {
        return None;
    };
    let int = |v: &redis::Value| -> Option<i64> {
        match v {
            redis::Value::Int(i) => Some(*i),
            redis::Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            redis::Value::SimpleString(s) => s.parse().ok(),
            _ => None,
        }
    };
    Some(int(s)? * 1_000_000 + int(us)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000;

    /// A reading of a call that left at `sent_ms` and came back `rtt_ms` later (by this
    /// process), with the master's clock reading `master_ms`.
    fn at(base: Instant, sent_ms: u64, rtt_ms: u64, master_ms: i64) -> Reading {
        let sent = base + Duration::from_millis(sent_ms);
        Reading {
            sent,
            received: sent + Duration::from_millis(rtt_ms),
            master_us: master_ms * MS,
            local_us: (sent_ms + rtt_ms) as i64 * MS,
        }
    }

    fn policy() -> ClockPolicy {
        ClockPolicy {
            drift_factor: 0.01,
            max_offset: Duration::from_secs(1),
            settle: Duration::from_secs(10),
            trust: false,
        }
    }

    #[test]
    fn a_clock_that_keeps_time_is_never_a_jump_however_slow_the_calls() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        // The master read its clock anywhere inside each call's round trip.
        assert!(watch.observe(at(base, 0, 2, 1)).is_ok());
        assert!(watch.observe(at(base, 1_000, 400, 1_000)).is_ok());
        assert!(watch.observe(at(base, 1_500, 400, 1_899)).is_ok());
        assert!(watch.observe(at(base, 60_000, 1, 60_000 + 500)).is_ok());
        let status = watch.status();
        assert_eq!((status.forward_jumps, status.backward_jumps), (0, 0));
    }

    #[test]
    fn a_forward_jump_refuses_the_answer_that_showed_it_and_every_later_one_until_settled() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        assert!(watch.observe(at(base, 0, 1, 0)).is_ok());
        let refused = watch.observe(at(base, 1_000, 1, 1_000 + 30_000));
        assert!(matches!(&refused, Err(NodeError::Clock(why)) if why == "clock jumped +30.0 s"));
        // The next reading keeps time with the jumped one, and is refused all the same.
        assert!(watch.observe(at(base, 1_100, 1, 31_100)).is_err());
        assert!(watch.refusal().is_some());
        assert_eq!(watch.status().forward_jumps, 1);
        watch.settle();
        assert!(watch.observe(at(base, 1_200, 1, 31_200)).is_ok());
        assert!(watch.refusal().is_none());
    }

    #[test]
    fn an_answer_to_a_call_sent_before_the_master_was_settled_is_refused_however_late_it_is_read() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        assert!(watch.observe(at(base, 0, 1, 0)).is_ok());
        // A probe shows the jump; a step sent before it was settled is read after: its
        // reading keeps time with the probe's, and it must not count all the same.
        assert!(watch.observe(at(base, 1_000, 1, 31_000)).is_err());
        let before = at(base, 1_000, 1, 31_000);
        watch.settle_at(base + Duration::from_millis(1_010));
        let late = Reading {
            received: base + Duration::from_millis(1_050),
            ..before
        };
        assert!(
            matches!(watch.observe(late), Err(NodeError::Clock(why)) if why == "clock jumped +30.0 s")
        );
        // A call sent after the settle is the master's own to refuse (its marker is gone).
        assert!(watch.observe(at(base, 1_020, 1, 31_020)).is_ok());
    }

    #[test]
    fn the_allowance_is_drift_over_the_interval_plus_a_few_milliseconds_not_a_share_of_a_ttl() {
        let base = Instant::now();
        // 1 s between readings: 10 ms of drift, 5 ms of margin, 1 ms of round trip.
        let watch = ClockWatch::new(policy());
        watch.observe(at(base, 0, 1, 0)).unwrap();
        assert!(watch.observe(at(base, 1_000, 0, 1_000 + 15)).is_ok());
        let watch = ClockWatch::new(policy());
        watch.observe(at(base, 0, 1, 0)).unwrap();
        assert!(watch.observe(at(base, 1_000, 0, 1_000 + 30)).is_err());
    }

    #[test]
    fn a_backward_jump_is_counted_and_shown_but_refuses_nothing() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        watch.observe(at(base, 0, 1, 0)).unwrap();
        assert!(watch.observe(at(base, 1_000, 1, 1_000 - 20_000)).is_ok());
        let status = watch.status();
        assert_eq!((status.forward_jumps, status.backward_jumps), (0, 1));
        assert!(status.last.is_some_and(|j| j.by_us < -19_000 * MS));
        assert!(status.pending.is_none());
    }

    #[test]
    fn readings_judged_out_of_order_are_no_jump() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        // Two calls in flight at once; the later one's answer is judged first.
        assert!(watch.observe(at(base, 10, 5, 14)).is_ok());
        assert!(watch.observe(at(base, 0, 20, 3)).is_ok());
        assert!(watch.observe(at(base, 30, 1, 30)).is_ok());
        assert_eq!(
            watch.status().forward_jumps + watch.status().backward_jumps,
            0
        );
    }

    #[test]
    fn a_master_first_met_far_off_is_not_counted_until_watched_for_the_settle_time() {
        let base = Instant::now();
        let watch = ClockWatch::new(policy());
        let first = at(base, 0, 1, 30_000);
        assert!(watch.observe(first).is_err());
        assert!(watch.status().settling.is_some());
        assert!(watch.observe(at(base, 5_000, 1, 35_000)).is_err());
        assert!(watch.observe(at(base, 10_001, 1, 40_001)).is_ok());
        assert!(watch.status().settling.is_none());
        // Within the allowance at first sight: counted at once.
        let near = ClockWatch::new(policy());
        assert!(near.observe(at(base, 0, 1, 900)).is_ok());
    }

    #[test]
    fn a_first_reading_far_off_is_counted_when_a_fresh_record_of_another_replica_agrees() {
        let base = Instant::now();
        let first = at(base, 0, 1, 30_000);
        let now_us = first.master_us;
        // Another replica recorded the same offset 2 s ago: the clock stood there.
        let watch = ClockWatch::new(policy());
        assert!(
            watch
                .observe_vouched(first, &[(29_990 * MS, now_us - 2_000 * MS)])
                .is_ok()
        );
        assert!(watch.status().settling.is_none());
        // A record that disagrees (the clock jumped since), or an old one, vouches nothing.
        for record in [
            (0, now_us - 2_000 * MS),
            (29_990 * MS, now_us - 30_000 * MS),
        ] {
            let watch = ClockWatch::new(policy());
            assert!(
                watch.observe_vouched(first, &[record]).is_err(),
                "{record:?}"
            );
        }
    }

    #[test]
    fn trusting_the_clocks_reads_and_counts_them_but_refuses_nothing() {
        let base = Instant::now();
        let watch = ClockWatch::new(ClockPolicy {
            trust: true,
            ..policy()
        });
        assert!(watch.observe(at(base, 0, 1, 30_000)).is_ok());
        assert!(watch.observe(at(base, 1_000, 1, 90_000)).is_ok());
        assert_eq!(watch.status().forward_jumps, 1);
        assert!(watch.refusal().is_none());
    }

    #[test]
    fn time_answers_parse_as_redis_sends_them() {
        use redis::Value;
        let time = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(parse_time(&time), Some(1_700_000_000_123_456));
        let ints = Value::Array(vec![Value::Int(2), Value::Int(5)]);
        assert_eq!(parse_time(&ints), Some(2_000_005));
        assert_eq!(parse_time(&Value::Nil), None);
    }
}
