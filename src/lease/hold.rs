//! Leases held for as long as a client stays connected: the service grants the lease (or
//! takes over one already granted: a resume), renews it at a third of its TTL, and says
//! what happens on a bounded channel that the HTTP layer streams as server-sent events.
//!
//! - When the client goes (the channel's receiver is dropped), the lease is revoked at
//!   once, or after the grace its holder asked for, while no resume has taken it over:
//!   each stream has a name of its own on the masters, and its end revokes only while it
//!   keeps the lease (`Ending::Leave`). A stream that finds another keeping it ends
//!   (`closed`, `resumed`) and revokes nothing.
//! - When the lease is lost, the client is told why, and told before that (`jeopardy`)
//!   when renews have failed long enough that less than a third of its TTL is left, and
//!   again (`safe`) when one gets through.
//! - When this replica shuts down, the client is told how long it may still rely on the
//!   lease (`closed`), and the lease is renewed until the drain's deadline or its resume
//!   elsewhere, then left to lapse: never revoked under a validity already answered. If
//!   the process itself dies, the lease expires at its TTL.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use super::events::{LockEvent, Observed};
use super::{Lease, LeaseError, LeaseService, Target, Ttl, WaitTime};
use crate::metrics::StreamKind;
use crate::model::Jeopardy;
use crate::model::{LeaseId, LockName, Mode, Owner, Unavailability, opener_of, stream_name};

/// Events a held stream may have waiting for a slow reader. Heartbeats beyond it are
/// dropped (the next one says the same, newer), so a client that never reads costs a
/// bounded amount of memory.
const HOLD_BUFFER: usize = 8;
/// How long a final event (granted, failed, lost) may wait for room in the buffer.
const DELIVER_WAIT: Duration = Duration::from_secs(1);
/// The shortest and longest pause before a renew that failed to get an answer is tried
/// again (a quarter of the renew interval, within these).
const MIN_RETRY: Duration = Duration::from_millis(20);
const MAX_RETRY: Duration = Duration::from_secs(1);
/// The grid a held stream's or a session's renews fall on (finer for a renew interval
/// under 2 s: a tenth of it).
const RENEW_TICK: Duration = Duration::from_millis(200);

/// When a renew due `every` from now is made: then, rounded down to this process's renew
/// grid. Held streams renew on timers of their own, and a master's queue (`store::batch`)
/// carries in one script call only the steps that meet in it; spread over the interval as
/// their clients arrived, 10 000 streams' renews met in few, and each paid a script call
/// and a system call of its own. On one grid, the renews due within a tick of each other
/// are made together and share their calls. Rounding down only renews sooner (at most a
/// tenth of the interval, about 2 % more renews at the default TTL); a renew's validity
/// counts from its own start, so no validity answered is longer for it.
pub(super) fn next_renew(every: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    on_grid(epoch, Instant::now() + every, (every / 10).min(RENEW_TICK))
}

/// `at`, rounded down to the grid of `tick`s from `epoch`.
fn on_grid(epoch: Instant, at: Instant, tick: Duration) -> Instant {
    match tick.as_nanos() {
        0 => at,
        tick => {
            let past = at.saturating_duration_since(epoch).as_nanos() % tick;
            at - Duration::from_nanos(u64::try_from(past).unwrap_or(0))
        }
    }
}

/// What happens to a held lease, in order. Kept small (the lease and the error boxed): a
/// stream's channel allocates room for 32 events at once however few it buffers, which at
/// 240 bytes an event was 7.7 KiB of every held stream.
#[derive(Debug)]
pub enum HoldEvent {
    /// Waiting: this grant's place in this replica's line (1 is next).
    Queued { position: usize },
    /// The lease, granted.
    Granted(Box<Lease>),
    /// The lease, granted before and now kept by this stream (a resume): renewed at once.
    Resumed(Box<Lease>),
    /// The lease, renewed: its validity counts from now again.
    Renewed(Box<Lease>),
    /// Renews have not got through, and less than a third of the TTL is left: the holder
    /// should get ready to stop (told once; `Safe` when a renew gets through again).
    Jeopardy { validity: Duration },
    /// A renew got through after `Jeopardy`: the lease is held for `validity` again (its
    /// `Renewed` follows).
    Safe { validity: Duration },
    /// The lease was lost; nothing follows.
    Lost(LostReason),
    /// This replica is shutting down: the stream ends, and the lease is not revoked. It may
    /// be relied on for `validity` more; the replica renews it until its drain deadline, so
    /// that its holder finds it held when it resumes through another replica.
    Closed { validity: Duration },
    /// The lease was resumed through another stream: this one ends, and revokes nothing.
    Displaced,
    /// The grant failed (held after `wait`, no quorum); nothing follows.
    Failed(Box<LeaseError>),
}

/// Why a held lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// A renew found the lease gone from a majority of masters (it expired).
    NotFound,
    /// No renew reached a majority before the lease's validity ran out.
    QuorumLost,
    /// It was revoked with its lease id (by a client that knows the id, not this stream).
    Released,
    /// An administrator force-released it.
    ForceReleased,
    /// This replica is shutting down: told as `closed`, and the lease is left to lapse.
    ShuttingDown,
    /// Another stream resumed the lease (a majority of masters say it keeps it now): told
    /// as `closed`, and the lease is left to that stream.
    Resumed,
}

impl LostReason {
    /// The stable code of the `lost` event.
    pub(crate) fn code(self) -> &'static str {
        match self {
            LostReason::NotFound => "lease_not_found",
            LostReason::QuorumLost => "quorum_lost",
            LostReason::Released => "released",
            LostReason::ForceReleased => "force_released",
            LostReason::ShuttingDown => "shutting_down",
            LostReason::Resumed => "resumed",
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            LostReason::NotFound => {
                "a renew found the lease gone from a majority of masters: it expired"
            }
            LostReason::QuorumLost => {
                "no renew reached a majority of masters before the lease's validity ran out"
            }
            LostReason::Released => {
                "the lease was revoked with its lease id (a DELETE of its lease, not this stream)"
            }
            LostReason::ForceReleased => {
                "an administrator force-released the lock (the audit log says who)"
            }
            LostReason::ShuttingDown => {
                "the replica holding the stream is shutting down; the lease was not revoked"
            }
            LostReason::Resumed => {
                "the lease was resumed through another stream; this one ends and revokes nothing"
            }
        }
    }
}

/// What a held stream's holder asked of its stream beyond the lease: the grace its lease
/// outlives a dropped connection by, and who opened it (the token's name, `""` without
/// authentication), which is who alone may resume it.
#[derive(Debug, Clone, Default)]
pub struct StreamTerms {
    pub grace: Duration,
    pub opener: Arc<str>,
}

impl LeaseService {
    /// Grant `name` (waiting up to `wait`) and hold it until the returned receiver is
    /// dropped (and the stream's grace more, for a resume), the lease is lost, or the
    /// process shuts down.
    pub fn hold(
        self: &Arc<Self>,
        target: impl Into<Target>,
        ttl: Ttl,
        wait: WaitTime,
        owner: Option<Owner>,
        terms: StreamTerms,
    ) -> Result<mpsc::Receiver<HoldEvent>, LeaseError> {
        let target = target.into();
        self.stream(HOLD_BUFFER, |service, tx| {
            service.hold_task(target, ttl, wait, owner, terms, tx)
        })
    }

    /// Take over lease `id` of `name`, granted before (through a stream on any replica, or
    /// not), and hold it as `hold` does: a resume. It is renewed at once, and from then on
    /// only this stream's end revokes it. A lease held through a stream that another token
    /// opened is not taken over (`NotYours`).
    pub fn resume(
        self: &Arc<Self>,
        name: LockName,
        id: LeaseId,
        terms: StreamTerms,
    ) -> Result<mpsc::Receiver<HoldEvent>, LeaseError> {
        self.stream(HOLD_BUFFER, |service, tx| {
            service.resume_task(name, id, terms, tx)
        })
    }

    /// Open a stream of `buffer` events: a place among the streams this replica keeps
    /// open, and `task` fed its sender until it ends (it holds the place until then).
    pub(super) fn stream<E, F>(
        self: &Arc<Self>,
        buffer: usize,
        task: impl FnOnce(Arc<Self>, mpsc::Sender<E>) -> F,
    ) -> Result<mpsc::Receiver<E>, LeaseError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let slot = self.stream_slot()?;
        let (tx, rx) = mpsc::channel(buffer);
        let work = task(self.clone(), tx);
        // `map` keeps the task's future once; an `async move` block awaiting it would keep it
        // twice (captured, and pinned while awaited).
        let task = futures::FutureExt::map(work, move |()| drop(slot));
        self.tasks.spawn(task);
        Ok(rx)
    }

    /// A place among the streams this replica keeps open, or `TooMany` past the cap.
    fn stream_slot(self: &Arc<Self>) -> Result<StreamSlot, LeaseError> {
        let open = self.streams.fetch_add(1, Ordering::Relaxed);
        let slot = StreamSlot(self.clone());
        if open >= self.caps.streams {
            return Err(LeaseError::TooMany {
                what: format!(
                    "too many event streams open on this replica ({}); try again later",
                    self.caps.streams
                ),
            });
        }
        Ok(slot)
    }

    async fn hold_task(
        self: Arc<Self>,
        target: Target,
        ttl: Ttl,
        wait: WaitTime,
        owner: Option<Owner>,
        terms: StreamTerms,
        tx: mpsc::Sender<HoldEvent>,
    ) {
        let _open = self.metrics.stream_opened(StreamKind::Hold);
        let mut report = |position| {
            let _ = tx.try_send(HoldEvent::Queued { position });
        };
        // The grant, the name's opening and a revoke are boxed, as are the renews below:
        // an idle stream's task then keeps only the state of its wait for the next renew,
        // not room for the largest of these (8.4 KiB a stream before).
        let granted = tokio::select! {
            result = Box::pin(self.grant_reporting(target, ttl, wait, owner, None, Some(&mut report))) => result,
            // Gone while waiting: the grant stops; one won meanwhile is released by its task.
            () = tx.closed() => return,
        };
        let lease = match granted {
            Ok(lease) => lease,
            Err(e) => {
                deliver(&tx, HoldEvent::Failed(Box::new(e))).await;
                return;
            }
        };
        let stream = match Box::pin(self.name_opener(&lease, &terms.opener)).await {
            Ok(stream) => stream,
            Err(e) => {
                // Not answered: nothing may be left held by a stream that failed.
                let _ = Box::pin(self.revoke(lease.name.clone(), lease.id.clone())).await;
                deliver(&tx, HoldEvent::Failed(Box::new(e))).await;
                return;
            }
        };
        let carried = Carried {
            lease,
            ttl: ttl.get(),
            stream,
            grace: terms.grace,
        };
        self.carry(carried, HoldEvent::Granted, &tx).await;
    }

    /// The name the stream that granted `lease` keeps it under on the masters. Without
    /// authentication it is the empty name (renew.lua), and costs nothing. Under it, the
    /// stream takes the lease under a name that carries its opener's tag before its holder
    /// learns the lease id, so that a majority of masters refuse a resume by any other token
    /// from the start.
    async fn name_opener(&self, lease: &Lease, opener: &str) -> Result<Arc<str>, LeaseError> {
        if opener.is_empty() {
            return Ok(Arc::from(""));
        }
        let stream = stream_name(opener);
        let named = self
            .renew_with(
                lease.name.clone(),
                lease.id.clone(),
                None,
                None,
                Some(stream.clone()),
            )
            .await?;
        if named.kept_by.as_deref() == Some(&*stream) {
            Ok(stream)
        } else {
            // A lease just granted has no other stream: only a majority that did not answer
            // alike leaves this (the masters changed under the grant).
            Err(LeaseError::NotFound)
        }
    }

    async fn resume_task(
        self: Arc<Self>,
        name: LockName,
        id: LeaseId,
        terms: StreamTerms,
        tx: mpsc::Sender<HoldEvent>,
    ) {
        let _open = self.metrics.stream_opened(StreamKind::Hold);
        // A name no other stream has: from this renew on, only this stream's end revokes.
        let stream = stream_name(&terms.opener);
        let resumed = Box::pin(self.renew_with(name, id, None, None, Some(stream.clone())))
            .await
            .and_then(|lease| taken_over(lease, &stream));
        let lease = match resumed {
            Ok(lease) => lease,
            Err(e) => {
                deliver(&tx, HoldEvent::Failed(Box::new(e))).await;
                return;
            }
        };
        let ttl = lease.ttl;
        let carried = Carried {
            lease,
            ttl,
            stream,
            grace: terms.grace,
        };
        self.carry(carried, HoldEvent::Resumed, &tx).await;
    }

    /// Keep a held stream's lease until it is lost, its client leaves (and the grace is
    /// up) or this replica stops, then end it as its reason says.
    async fn carry(
        &self,
        carried: Carried,
        first: fn(Box<Lease>) -> HoldEvent,
        tx: &mpsc::Sender<HoldEvent>,
    ) {
        let Carried {
            lease,
            ttl,
            stream,
            grace,
        } = carried;
        let (lost, valid_until) = self.keep(&lease, ttl, &stream, first, tx).await;
        match lost {
            // Told with `closed` (by `keep`): a validity answered is kept, so the lease is
            // not revoked; it lapses at its TTL, or its holder resumes it elsewhere.
            Some(LostReason::ShuttingDown) => {
                Box::pin(self.keep_through_drain(&lease, ttl / 3, &stream)).await;
                return;
            }
            // The lease is another stream's now.
            Some(LostReason::Resumed) => {
                deliver(tx, HoldEvent::Displaced).await;
                return;
            }
            Some(reason) => deliver(tx, HoldEvent::Lost(reason)).await,
            // The client left: with a grace, its holder may resume the lease through any
            // replica until the grace (or the validity) is up; it is renewed no further.
            None if !grace.is_zero() => {
                let until = valid_until.min(Instant::now() + grace);
                tokio::select! {
                    () = sleep_until(until) => {}
                    () = self.shutdown.cancelled() => return,
                }
            }
            None => {}
        }
        if !matches!(
            lost,
            Some(LostReason::NotFound | LostReason::Released | LostReason::ForceReleased)
        ) {
            let _ = Box::pin(self.leave(lease.name.clone(), lease.id.clone(), stream)).await;
        }
    }

    /// After `closed`: renew `lease` every `every` until this replica's drain deadline, so
    /// that a holder that resumes through another replica finds it held however long its
    /// reconnect took. Stops once another stream keeps it (the holder resumed) or it is
    /// gone; never revokes.
    async fn keep_through_drain(&self, lease: &Lease, every: Duration, stream: &str) {
        self.renew_through_drain(every, || async {
            let renewed = self
                .renew(lease.name.clone(), lease.id.clone(), None)
                .await?;
            Ok(displaced(&renewed, stream))
        })
        .await;
    }

    /// Call `renew` every `every` until this replica's drain deadline, or until it answers
    /// that another stream keeps the hold (`true`) or fails other than for want of a
    /// majority. The closed stream's hold, kept for a holder that resumes elsewhere.
    pub(super) async fn renew_through_drain<F>(&self, every: Duration, mut renew: impl FnMut() -> F)
    where
        F: Future<Output = Result<bool, LeaseError>>,
    {
        let Some(grace) = self.drain_grace.get() else {
            return;
        };
        // A tenth of the grace is left for the last renew's answer and the drain's end.
        let deadline = Instant::now() + grace.mul_f64(0.9);
        loop {
            let next = Instant::now() + every;
            if next >= deadline {
                return;
            }
            sleep_until(next).await;
            match timeout_at(deadline, renew()).await {
                Ok(Ok(true)) => return,
                Ok(Ok(false)) | Ok(Err(LeaseError::Unavailable(_))) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Renew `lease` until it is lost (the reason) or its client leaves (`None`), with when
    /// its last validity ends.
    async fn keep(
        &self,
        lease: &Lease,
        ttl: Duration,
        stream: &str,
        first: fn(Box<Lease>) -> HoldEvent,
        tx: &mpsc::Sender<HoldEvent>,
    ) -> (Option<LostReason>, Instant) {
        let mut events = self.events().subscribe(&lease.name.topic());
        let mut listening = true;
        deliver(tx, first(Box::new(lease.clone()))).await;
        let every = ttl / 3;
        let retry = (every / 4).clamp(MIN_RETRY, MAX_RETRY);
        let mut valid_until = lease.at + lease.validity;
        let mut next = next_renew(every);
        let mut jeopardy = Jeopardy::new(ttl);
        let warn = |validity| {
            let _ = tx.try_send(HoldEvent::Jeopardy { validity });
        };
        // Set when news says the lease was released (revoked, or force-released by an
        // administrator): a renew then confirms it.
        let mut released = None;
        loop {
            let warn_at = jeopardy.at(valid_until);
            tokio::select! {
                () = sleep_until(next.min(valid_until)) => {
                    if Instant::now() >= valid_until {
                        return (Some(LostReason::QuorumLost), valid_until);
                    }
                    let renew = Box::pin(self.renew(lease.name.clone(), lease.id.clone(), None));
                    let renewed = jeopardy
                        .during(timeout_at(valid_until, renew), valid_until, warn)
                        .await;
                    match renewed {
                        Err(_) => return (Some(LostReason::QuorumLost), valid_until),
                        Ok(Ok(renewed)) if displaced(&renewed, stream) => {
                            return (Some(LostReason::Resumed), valid_until);
                        }
                        Ok(Ok(renewed)) => {
                            valid_until = renewed.at + renewed.validity;
                            next = next_renew(every);
                            released = None;
                            if let Some(validity) = jeopardy.renewed(valid_until) {
                                let _ = tx.try_send(HoldEvent::Safe { validity });
                            }
                            // Dropped when the reader is behind: the next one is newer.
                            let _ = tx.try_send(HoldEvent::Renewed(Box::new(renewed)));
                        }
                        Ok(Err(LeaseError::NotFound)) if released.is_some() => {
                            return (released, valid_until);
                        }
                        Ok(Err(LeaseError::NotFound)) => {
                            return (Some(LostReason::NotFound), valid_until);
                        }
                        Ok(Err(_)) => next = Instant::now() + retry,
                    }
                }
                () = sleep_until(warn_at.unwrap_or(valid_until)), if warn_at.is_some() => {
                    warn(jeopardy.warn(valid_until));
                }
                () = tx.closed() => return (None, valid_until),
                () = self.shutdown.cancelled() => {
                    let validity = valid_until.saturating_duration_since(Instant::now());
                    deliver(tx, HoldEvent::Closed { validity }).await;
                    return (Some(LostReason::ShuttingDown), valid_until);
                }
                seen = events.next(), if listening => match seen {
                    Some(Observed::Event(LockEvent::Released { token })) if token == lease.token => {
                        released = Some(LostReason::Released);
                        next = Instant::now();
                    }
                    Some(Observed::Event(LockEvent::Evicted { token })) if token == lease.token => {
                        released = Some(LostReason::ForceReleased);
                        next = Instant::now();
                    }
                    // A later grant of the name means this lease has lost it; of a semaphore,
                    // only that another slot was taken, and of a shared lock, perhaps that
                    // another shared holder came.
                    Some(Observed::Event(LockEvent::Acquired { token }))
                        if token > lease.token
                            && lease.slot.is_none()
                            && lease.mode == Mode::Exclusive =>
                    {
                        next = Instant::now();
                    }
                    Some(Observed::Missed(_)) => next = Instant::now(),
                    Some(Observed::Event(_)) => {}
                    None => listening = false,
                },
            }
        }
    }
}

/// The lease a resume's renew answered, if `stream` took it over. A lease that a stream of
/// another token keeps was renewed and not taken (renew.lua): `NotYours`. Under
/// authentication a majority must name `stream`, since a resume that only some masters
/// took may have met, on the others, a stream another token opened. A stream of the same
/// token that keeps it is another resume of the same holder, racing this one: the stream
/// goes on and learns which won at its next renew.
fn taken_over(lease: Lease, stream: &str) -> Result<Lease, LeaseError> {
    match lease.kept_by.as_deref() {
        Some(kept) if kept == stream => Ok(lease),
        Some(kept) if opener_of(kept) != opener_of(stream) => Err(LeaseError::NotYours),
        None if !opener_of(stream).is_empty() => Err(LeaseError::Unavailable(Unavailability {
            reason: "the resume was not confirmed by a majority of masters; try again".into(),
            masters: Vec::new(),
        })),
        _ => Ok(lease),
    }
}

/// Whether a renew of a stream's lease found that another stream keeps it (a majority of
/// masters name one other than `stream`).
fn displaced(renewed: &Lease, stream: &str) -> bool {
    renewed.kept_by.as_deref().is_some_and(|k| k != stream)
}

/// A held stream's lease, and what its end depends on: the TTL it is renewed at, the name
/// the stream keeps it under on the masters, and the grace its holder asked for.
struct Carried {
    lease: Lease,
    ttl: Duration,
    stream: Arc<str>,
    grace: Duration,
}

/// One open stream, counted until dropped.
pub(super) struct StreamSlot(Arc<LeaseService>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Send a final event (of a held stream, or an observer's), waiting a little for a slow
/// reader; one that does not make room in time does not get it (its connection is as good
/// as gone).
pub(super) async fn deliver<T>(tx: &mpsc::Sender<T>, event: T) {
    let _ = timeout(DELIVER_WAIT, tx.send(event)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle stream's task is kept for as long as its holder holds: its future's size is
    /// paid by every open stream, so the large steps it takes now and then are boxed.
    #[tokio::test]
    async fn a_held_streams_task_keeps_no_room_for_the_steps_it_takes_now_and_then() {
        use crate::lease::{Events, LeasePolicy};
        use crate::metrics::Metrics;
        use crate::redlock::Redlock;
        let metrics = Arc::new(Metrics::new());
        let engine = Redlock::over_one_memory_node(metrics.clone());
        let service = LeaseService::new(
            Arc::new(engine),
            Events::new(),
            metrics,
            tokio_util::sync::CancellationToken::new(),
        );
        let policy = LeasePolicy::new(
            Duration::from_secs(30),
            Duration::from_secs(3600),
            Duration::from_secs(60),
        );
        let (tx, _rx) = mpsc::channel(1);
        let terms = StreamTerms {
            grace: Duration::ZERO,
            opener: Arc::from(""),
        };
        let task = service.clone().hold_task(
            LockName::parse("a").expect("a name").into(),
            policy.ttl(None).expect("a TTL"),
            policy.wait(None).expect("a wait"),
            None,
            terms,
            tx,
        );
        let size = std::mem::size_of_val(&task);
        assert!(size <= 2_560, "{size} bytes");
    }

    #[test]
    fn renews_due_within_a_tick_of_each_other_fall_on_the_same_instant_never_later() {
        let epoch = Instant::now();
        let tick = Duration::from_millis(200);
        let due = |ms| epoch + Duration::from_millis(ms);
        for ms in [10_000, 10_050, 10_199] {
            assert_eq!(on_grid(epoch, due(ms), tick), due(10_000), "due at {ms} ms");
        }
        assert_eq!(on_grid(epoch, due(10_200), tick), due(10_200));
        for at in [
            due(7),
            due(10_321),
            epoch + Duration::from_nanos(123_456_789),
        ] {
            let renew = on_grid(epoch, at, tick);
            assert!(renew <= at && at - renew < tick, "{at:?} went to {renew:?}");
        }
        assert_eq!(on_grid(epoch, due(5), Duration::ZERO), due(5));
    }

    #[test]
    fn a_renew_is_due_no_later_than_its_interval_and_at_most_a_tenth_sooner() {
        for every in [Duration::from_secs(10), Duration::from_millis(300)] {
            let before = Instant::now();
            let renew = next_renew(every);
            let after = Instant::now();
            assert!(renew <= after + every, "later than {every:?}");
            assert!(
                renew >= before + every - every / 10,
                "too early for {every:?}"
            );
        }
    }

    #[test]
    fn an_event_is_small_enough_that_a_streams_channel_costs_about_a_kilobyte() {
        assert!(
            std::mem::size_of::<HoldEvent>() <= 32,
            "{} bytes",
            std::mem::size_of::<HoldEvent>()
        );
    }
}
