//! One event bus per lock name: what happens to a lock, for whoever in this process cares.
//!
//! Events (`LockEvent`) come from the lease service (a grant it decided, a revoke, a lease
//! it found lost) and from the other replicas through the masters' pub/sub (releases, and
//! grants decided elsewhere). Two kinds of subscriber listen:
//!
//! - **Waiting grants**, in a first-come-first-served queue per name. Only the waiter at
//!   the head of the queue tries the lock, and only it is woken by a release: one release
//!   can hand the lock to one grant, so waking the others would only make them look and go
//!   back to sleep (with thousands waiting, seconds of CPU a release). Leaving the queue
//!   wakes the next in line. Expiry of the holder's lease is the waiter's own timer.
//! - **Observers** (streams, elections, watchers): every event of the name, in order, from
//!   a bounded channel; one that falls behind is told how many it missed.
//!
//! Each event carries the fencing token of the lease it is about, which orders them: an
//! observer is told each grant and each release once (several masters announce each, and a
//! replica hears its own), never news older than what it was told. Waiting grants are also
//! woken by the tokenless release announcement that every version of redlockd sends.
//! Entries exist only while someone listens: the last to leave removes the name, so
//! nothing accumulates as names come and go.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};

use crate::model::FencingToken;

/// How many events an observer may fall behind before it is told it missed some.
const OBSERVER_BACKLOG: usize = 64;

/// Something that happened to a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockEvent {
    /// A lease was granted with this fencing token (by this replica or another).
    Acquired { token: FencingToken },
    /// The holder of the lease with this token revoked it: the lock is free unless
    /// granted again since (a later `Acquired` says so).
    Released { token: FencingToken },
    /// An administrator removed the holder of the lease with this token (force-release):
    /// for waiters and observers, a release like any other.
    Evicted { token: FencingToken },
    /// A lease granted through this replica was found lost when renewed: it expired, or
    /// a majority no longer holds it. Only the replica that renews it knows.
    Lost { token: FencingToken },
    /// The holder of the lease with this token changed its owner text (an elected leader
    /// proclaimed a new value).
    Proclaimed { token: FencingToken },
}

#[derive(Default)]
pub struct Events {
    /// A std mutex: it is held only for map updates, never across an await.
    names: Mutex<HashMap<String, Topic>>,
    next_ticket: AtomicU64,
    /// Waiting grants on every name (changed under `names`' lock).
    waiting: AtomicU64,
}

/// One name's listeners.
#[derive(Default)]
struct Topic {
    /// Waiting grants in arrival order, each with its own wake-up channel.
    order: VecDeque<(u64, watch::Sender<u64>)>,
    /// Observers, created with the first one.
    observers: Option<broadcast::Sender<LockEvent>>,
    /// The highest token announced (granted or released), so that a grant announced by
    /// several masters (and by this replica itself) reaches observers once, and news older
    /// than what they were told does not.
    last_token: FencingToken,
    /// The highest token whose release observers were told of.
    last_released: FencingToken,
    /// Waiters woken by every release of the name, wherever they are in line: grants of
    /// several names, which claim a name they wait for, so that the waiter at the head
    /// (a single grant of it) may find it claimed and go back to sleep.
    eager: Vec<u64>,
}

impl Topic {
    /// Wake the waiter at the head of the line, and the eager ones.
    fn wake_first(&self) {
        if let Some((_, wake)) = self.order.front() {
            wake.send_modify(|v| *v = v.wrapping_add(1));
        }
        for id in &self.eager {
            if let Ok(at) = self.order.binary_search_by_key(id, |(id, _)| *id) {
                self.order[at].1.send_modify(|v| *v = v.wrapping_add(1));
            }
        }
    }

    fn is_idle(&self) -> bool {
        self.order.is_empty()
            && self
                .observers
                .as_ref()
                .is_none_or(|o| o.receiver_count() == 0)
    }
}

/// A place in a name's queue of waiting grants. Dropping it (the grant finished, timed
/// out, or its client went away) leaves the queue and wakes the next waiter.
pub(crate) struct Ticket {
    events: Arc<Events>,
    name: String,
    id: u64,
    wake: watch::Receiver<u64>,
}

/// An observer of one name's events. Dropping it unsubscribes.
pub struct Subscription {
    events: Arc<Events>,
    name: String,
    rx: Option<broadcast::Receiver<LockEvent>>,
}

impl Events {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, Topic>> {
        // Only plain collections are behind it; a panic elsewhere cannot corrupt them.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join the end of `name`'s queue of waiting grants.
    #[cfg(test)]
    pub(crate) fn join(self: &Arc<Self>, name: &str) -> Ticket {
        let mut names = self.names();
        self.enqueue(&mut names, name)
    }

    /// Join `name`'s queue unless it already holds `per_name` waiters, or every queue
    /// together holds `total`: then which cap was met. An `eager` waiter is woken by every
    /// release of the name (see `Topic::eager`).
    pub(crate) fn join_as(
        self: &Arc<Self>,
        name: &str,
        per_name: usize,
        total: u64,
        eager: bool,
    ) -> Result<Ticket, &'static str> {
        let mut names = self.names();
        if self.waiting.load(Ordering::Relaxed) >= total {
            return Err("grants waiting in all");
        }
        if names.get(name).is_some_and(|t| t.order.len() >= per_name) {
            return Err("grants waiting on this name");
        }
        let ticket = self.enqueue(&mut names, name);
        if eager && let Some(topic) = names.get_mut(name) {
            topic.eager.push(ticket.id);
        }
        Ok(ticket)
    }

    /// Put a new waiter at the end of `name`'s queue; `names` is the map, locked.
    fn enqueue(self: &Arc<Self>, names: &mut HashMap<String, Topic>, name: &str) -> Ticket {
        let (wake, rx) = watch::channel(0);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        // Numbered under the lock, so that numbers rise along every queue.
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        names
            .entry(name.to_owned())
            .or_default()
            .order
            .push_back((id, wake));
        Ticket {
            events: self.clone(),
            name: name.to_owned(),
            id,
            wake: rx,
        }
    }

    /// Observe every event of `name` from now on.
    pub fn subscribe(self: &Arc<Self>, name: &str) -> Subscription {
        let mut names = self.names();
        let topic = names.entry(name.to_owned()).or_default();
        let rx = topic
            .observers
            .get_or_insert_with(|| broadcast::channel(OBSERVER_BACKLOG).0)
            .subscribe();
        Subscription {
            events: self.clone(),
            name: name.to_owned(),
            rx: Some(rx),
        }
    }

    /// Tell `name`'s listeners what happened. Cheap when nobody listens.
    pub(crate) fn publish(&self, name: &str, event: LockEvent) {
        let mut names = self.names();
        let Some(topic) = names.get_mut(name) else {
            return;
        };
        let news = match event {
            LockEvent::Acquired { token } => token > topic.last_token,
            LockEvent::Released { token } | LockEvent::Evicted { token } => {
                topic.wake_first();
                // A release of an older lease than the newest grant seen is old news, and
                // one heard before its grant's announcement makes that announcement so.
                let news = token > topic.last_released && token >= topic.last_token;
                topic.last_released = topic.last_released.max(token);
                news
            }
            LockEvent::Lost { .. } => true,
            // Not older than the newest grant: a value proclaimed by a leader since replaced
            // is old news.
            LockEvent::Proclaimed { token } => token >= topic.last_token,
        };
        if let LockEvent::Acquired { token }
        | LockEvent::Released { token }
        | LockEvent::Evicted { token } = event
        {
            topic.last_token = topic.last_token.max(token);
        }
        if news && let Some(observers) = &topic.observers {
            // No receiver left is not an error: the last one is about to remove the name.
            let _ = observers.send(event);
        }
    }

    /// `name` may have been released (an announcement without a token, from any version
    /// of redlockd): wake its first waiter to look.
    pub(crate) fn wake(&self, name: &str) {
        if let Some(topic) = self.names().get(name) {
            topic.wake_first();
        }
    }

    /// Releases may have been missed (a master's announcements were cut off): wake the
    /// first waiter of every name to look again.
    pub(crate) fn resync(&self) {
        for topic in self.names().values() {
            topic.wake_first();
        }
    }

    /// How many names have listeners: zero when everyone has left.
    #[cfg(test)]
    pub(crate) fn names_listened_to(&self) -> usize {
        self.names().len()
    }
}

/// A waiting grant's places in line: one per name it waits for (a several-name grant's,
/// one per name). It tries when it is first in any of them (first in all of them could
/// leave two such grants each first in one line and second in the other, both waiting).
pub(super) struct Line(pub(super) Vec<Ticket>);

impl Line {
    pub(super) fn is_first(&self) -> bool {
        self.0.iter().any(Ticket::is_first)
    }

    pub(super) fn position(&self) -> usize {
        self.0.iter().map(Ticket::position).min().unwrap_or(0)
    }

    pub(super) fn mark_seen(&mut self) {
        self.0.iter_mut().for_each(Ticket::mark_seen);
    }

    pub(super) async fn woken(&mut self) {
        let woken = self.0.iter_mut().map(|t| Box::pin(t.woken()));
        futures::future::select_all(woken).await;
    }
}

impl Ticket {
    /// Whether this waiter is first in line and may try the lock.
    pub(crate) fn is_first(&self) -> bool {
        self.events
            .names()
            .get(&self.name)
            .and_then(|t| t.order.front())
            .is_some_and(|(id, _)| *id == self.id)
    }

    /// This waiter's place in line: 1 when it is first.
    pub(crate) fn position(&self) -> usize {
        self.events
            .names()
            .get(&self.name)
            .and_then(|t| t.order.binary_search_by_key(&self.id, |(id, _)| *id).ok())
            .map_or(1, |at| at + 1)
    }

    /// Forget the wake-ups seen so far; `woken` then waits for a newer one.
    pub(crate) fn mark_seen(&mut self) {
        self.wake.borrow_and_update();
    }

    /// Wait for this waiter's next wake-up since `mark_seen`.
    pub(crate) async fn woken(&mut self) {
        // The sender lives in the topic as long as this ticket does.
        let _ = self.wake.changed().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut names = self.events.names();
        self.events.waiting.fetch_sub(1, Ordering::Relaxed);
        let Some(topic) = names.get_mut(&self.name) else {
            return;
        };
        let was_first = topic.order.front().is_some_and(|(id, _)| *id == self.id);
        topic.eager.retain(|id| *id != self.id);
        // The head leaves in O(1) (every hand-off); a waiter that gives up mid-queue is
        // found by its ticket number, which rises along the queue.
        if was_first {
            topic.order.pop_front();
        } else if let Ok(at) = topic.order.binary_search_by_key(&self.id, |(id, _)| *id) {
            topic.order.remove(at);
        }
        if topic.is_idle() {
            names.remove(&self.name);
        } else if was_first {
            // The next waiter is now first: let it look.
            topic.wake_first();
        }
    }
}

/// What an observer receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    Event(LockEvent),
    /// The observer fell this many events behind and they were dropped: whatever it
    /// derives from events (who holds the lock) must be read again.
    Missed(u64),
}

impl Subscription {
    /// The next event, or `None` once the bus is gone.
    pub async fn next(&mut self) -> Option<Observed> {
        let rx = self.rx.as_mut()?;
        match rx.recv().await {
            Ok(event) => Some(Observed::Event(event)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Observed::Missed(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Drop the receiver first, so that the count below no longer includes it.
        self.rx.take();
        let mut names = self.events.names();
        if names.get(&self.name).is_some_and(Topic::is_idle) {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_come_first_served_and_nothing_left_behind() {
        let events = Events::new();
        let first = events.join("a");
        let mut second = events.join("a");
        assert!(first.is_first());
        assert!(!second.is_first());
        second.mark_seen();
        drop(first);
        // Leaving wakes the next in line.
        tokio::time::timeout(std::time::Duration::from_secs(1), second.woken())
            .await
            .expect("woken when the first waiter left");
        assert!(second.is_first());
        drop(second);
        assert_eq!(events.names_listened_to(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_mid_queue_keeps_the_others_in_order() {
        let events = Events::new();
        let tickets: Vec<Ticket> = (0..5).map(|_| events.join("a")).collect();
        let mut tickets: Vec<Option<Ticket>> = tickets.into_iter().map(Some).collect();
        tickets[2] = None;
        tickets[0] = None;
        let order: Vec<bool> = tickets.iter().flatten().map(Ticket::is_first).collect();
        assert_eq!(
            order,
            [true, false, false],
            "the second in line is now first"
        );
        let places: Vec<usize> = tickets.iter().flatten().map(Ticket::position).collect();
        assert_eq!(places, [1, 2, 3]);
        tickets[1] = None;
        tickets[4] = None;
        assert!(tickets[3].as_ref().unwrap().is_first());
        tickets[3] = None;
        assert_eq!(events.names_listened_to(), 0);
    }

    /// Two waiting grants, of `one` and of `other`, that have both looked at their locks.
    fn two_waiters(events: &Arc<Events>, one: &str, other: &str) -> (Ticket, Ticket) {
        let (mut first, mut second) = (events.join(one), events.join(other));
        first.mark_seen();
        second.mark_seen();
        (first, second)
    }

    #[tokio::test]
    async fn a_release_wakes_only_the_first_waiter() {
        let events = Events::new();
        let (first, second) = two_waiters(&events, "a", "a");
        events.wake("a");
        assert!(first.wake.has_changed().unwrap_or(false), "first woken");
        assert!(
            !second.wake.has_changed().unwrap_or(true),
            "second must not be woken by a release it cannot win"
        );
        drop(first);
        assert!(
            second.wake.has_changed().unwrap_or(false),
            "second woken when first left"
        );
    }

    #[tokio::test]
    async fn a_release_wakes_the_waiters_of_that_name_only() {
        let events = Events::new();
        let (mut a, b) = two_waiters(&events, "a", "b");
        events.wake("a");
        events.wake("nobody-waits");
        tokio::time::timeout(std::time::Duration::from_secs(1), a.woken())
            .await
            .expect("a woken");
        assert!(!b.wake.has_changed().unwrap_or(true), "b must not be woken");
    }

    #[tokio::test]
    async fn observers_see_every_event_once_in_order_and_leave_nothing_behind() {
        let events = Events::new();
        let mut watch = events.subscribe("a");
        let waiter = events.join("a");
        let (acquired, released, lost) = (
            |t| LockEvent::Acquired {
                token: FencingToken::new(t),
            },
            |t| LockEvent::Released {
                token: FencingToken::new(t),
            },
            |t| LockEvent::Lost {
                token: FencingToken::new(t),
            },
        );
        let told = [
            ("a", acquired(7)),
            // The same grant announced again (by another master, or echoed back): once.
            ("a", acquired(7)),
            ("a", released(7)),
            ("a", released(7)),
            ("b", released(1)),
            // A release heard before its grant's announcement: the late grant is old news.
            ("a", released(8)),
            ("a", acquired(8)),
            ("a", acquired(9)),
            // A late release of an older lease does not say the lock is free.
            ("a", released(7)),
            ("a", lost(9)),
        ];
        for (name, event) in told {
            events.publish(name, event);
        }
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(watch.next().await.expect("event"));
        }
        let expected = [acquired(7), released(7), released(8), acquired(9), lost(9)];
        assert_eq!(seen, expected.map(Observed::Event));
        drop(waiter);
        assert_eq!(events.names_listened_to(), 1, "the observer still listens");
        drop(watch);
        assert_eq!(events.names_listened_to(), 0);
    }

    #[tokio::test]
    async fn an_observer_that_falls_behind_is_told_how_much_it_missed() {
        let events = Events::new();
        let mut watch = events.subscribe("a");
        for token in 1..=(OBSERVER_BACKLOG as u64 + 10) {
            events.publish(
                "a",
                LockEvent::Acquired {
                    token: FencingToken::new(token),
                },
            );
        }
        assert_eq!(watch.next().await, Some(Observed::Missed(10)));
        assert_eq!(
            watch.next().await,
            Some(Observed::Event(LockEvent::Acquired {
                token: FencingToken::new(11)
            }))
        );
    }
}
