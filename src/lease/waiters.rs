//! Grants waiting for a held lock, per name, first come first served.
//!
//! A waiting grant is woken by events, never by polling: a release announced by any
//! redlockd replica (Redis pub/sub), a release done by this process, or the departure of
//! the waiter ahead of it. Expiry of the holder's lease is the waiter's own timer. Only
//! the waiter at the head of a name's queue tries the lock, so waiters in one process are
//! served in arrival order.
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

struct Queue {
    /// Bumped on every event for this name; each waiter watches it.
    events: watch::Sender<u64>,
    order: VecDeque<u64>,
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
        let mut names = self.names();
        let queue = names.entry(name.to_owned()).or_insert_with(|| Queue {
            events: watch::channel(0).0,
            order: VecDeque::new(),
        });
        queue.order.push_back(id);
        let events = queue.events.subscribe();
        Ticket {
            waiters: self.clone(),
            name: name.to_owned(),
            id,
            events,
        }
    }

    /// `name` was released: wake its waiters. Cheap when nobody waits.
    pub fn released(&self, name: &str) {
        if let Some(queue) = self.names().get(name) {
            queue.events.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Releases may have been missed: wake every waiter to look again.
    pub fn released_any(&self) {
        for queue in self.names().values() {
            queue.events.send_modify(|v| *v = v.wrapping_add(1));
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
            .is_some_and(|q| q.order.front() == Some(&self.id))
    }

    /// Forget the events seen so far; `event` then waits for a newer one.
    pub fn mark_seen(&mut self) {
        self.events.borrow_and_update();
    }

    /// Wait for the next event on this name since `mark_seen`.
    pub async fn event(&mut self) {
        // The sender lives as long as any ticket for the name, this one included.
        let _ = self.events.changed().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut names = self.waiters.names();
        let Some(queue) = names.get_mut(&self.name) else {
            return;
        };
        queue.order.retain(|id| *id != self.id);
        if queue.order.is_empty() {
            names.remove(&self.name);
        } else {
            // The next waiter may now be first: let it look.
            queue.events.send_modify(|v| *v = v.wrapping_add(1));
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
