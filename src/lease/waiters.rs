//! Grants waiting for a held lock, per name, first come first served.
//!
//! A waiting grant is woken by events, never by polling: a release announced by any
//! redlockd replica (Redis pub/sub), a release done by this process, or the departure of
//! the waiter ahead of it. Expiry of the holder's lease is the waiter's own timer. Only
//! the waiter at the head of a name's queue tries the lock, and only it is woken by a
//! release: one release can hand the lock to one grant, so waking the others would only
//! make them look and go back to sleep (with thousands waiting, seconds of CPU a release).
//!
//! Entries exist only while someone waits: the last waiter to leave removes its name, so
//! nothing accumulates as names come and go.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

#[derive(Default)]
pub struct Waiters {
    /// A std mutex: it is held only for map updates, never across an await.
    names: Mutex<HashMap<String, Queue>>,
    next_ticket: AtomicU64,
}

/// The waiters of one name, in arrival order, each with its own wake-up channel.
#[derive(Default)]
struct Queue {
    order: VecDeque<(u64, watch::Sender<u64>)>,
}

impl Queue {
    /// Wake the waiter at the head of the line.
    fn wake_first(&self) {
        if let Some((_, wake)) = self.order.front() {
            wake.send_modify(|v| *v = v.wrapping_add(1));
        }
    }
}

/// A place in a name's queue. Dropping it (the grant finished, timed out, or its client
/// went away) leaves the queue and wakes the next waiter.
pub struct Ticket {
    waiters: Arc<Waiters>,
    name: String,
    id: u64,
    events: watch::Receiver<u64>,
}

impl Waiters {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        // Only plain collections are behind it; a panic elsewhere cannot corrupt them.
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Join the end of `name`'s queue.
    pub fn join(self: &Arc<Self>, name: &str) -> Ticket {
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (wake, events) = watch::channel(0);
        self.names()
            .entry(name.to_owned())
            .or_default()
            .order
            .push_back((id, wake));
        Ticket {
            waiters: self.clone(),
            name: name.to_owned(),
            id,
            events,
        }
    }

    /// `name` was released: wake the first of its waiters. Cheap when nobody waits.
    pub fn released(&self, name: &str) {
        if let Some(queue) = self.names().get(name) {
            queue.wake_first();
        }
    }

    /// Releases may have been missed: wake the first waiter of every name to look again.
    pub fn released_any(&self) {
        for queue in self.names().values() {
            queue.wake_first();
        }
    }

    /// How many names have waiters: zero when everyone has left.
    pub fn names_waited_on(&self) -> usize {
        self.names().len()
    }
}

impl Ticket {
    /// Whether this waiter is first in line and may try the lock.
    pub fn is_first(&self) -> bool {
        self.waiters
            .names()
            .get(&self.name)
            .and_then(|q| q.order.front())
            .is_some_and(|(id, _)| *id == self.id)
    }

    /// Forget the events seen so far; `event` then waits for a newer one.
    pub fn mark_seen(&mut self) {
        self.events.borrow_and_update();
    }

    /// Wait for the next event for this waiter since `mark_seen`.
    pub async fn event(&mut self) {
        // The sender lives in the queue as long as this ticket does.
        let _ = self.events.changed().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut names = self.waiters.names();
        let Some(queue) = names.get_mut(&self.name) else {
            return;
        };
        let was_first = queue.order.front().is_some_and(|(id, _)| *id == self.id);
        queue.order.retain(|(id, _)| *id != self.id);
        if queue.order.is_empty() {
            names.remove(&self.name);
        } else if was_first {
            // The next waiter is now first: let it look.
            queue.wake_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_come_first_served_and_nothing_left_behind() {
        let waiters = Waiters::new();
        let first = waiters.join("a");
        let mut second = waiters.join("a");
        assert!(first.is_first());
        assert!(!second.is_first());
        second.mark_seen();
        drop(first);
        // Leaving wakes the next in line.
        tokio::time::timeout(std::time::Duration::from_secs(1), second.event())
            .await
            .expect("woken when the first waiter left");
        assert!(second.is_first());
        drop(second);
        assert_eq!(waiters.names_waited_on(), 0);
    }

    #[tokio::test]
    async fn a_release_wakes_only_the_first_waiter() {
        let waiters = Waiters::new();
        let mut first = waiters.join("a");
        let mut second = waiters.join("a");
        first.mark_seen();
        second.mark_seen();
        waiters.released("a");
        assert!(first.events.has_changed().unwrap_or(false), "first woken");
        assert!(
            !second.events.has_changed().unwrap_or(true),
            "second must not be woken by a release it cannot win"
        );
        drop(first);
        assert!(
            second.events.has_changed().unwrap_or(false),
            "second woken when first left"
        );
    }

    #[tokio::test]
    async fn a_release_wakes_the_waiters_of_that_name_only() {
        let waiters = Waiters::new();
        let mut a = waiters.join("a");
        let mut b = waiters.join("b");
        a.mark_seen();
        b.mark_seen();
        waiters.released("a");
        waiters.released("nobody-waits");
        tokio::time::timeout(std::time::Duration::from_secs(1), a.event())
            .await
            .expect("a woken");
        assert!(
            !b.events.has_changed().unwrap_or(true),
            "b must not be woken"
        );
    }
}
