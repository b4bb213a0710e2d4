//! The warning before a hold is lost (`jeopardy`), and the word that it is safe again, as
//! every renew loop gives it: a held stream's and a streamed session's on the server, and
//! `redlockd lock`'s.

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

/// When a holder is warned that its renews are not getting through (`jeopardy`), and told
/// when one does again (`safe`): a healthy hold is renewed with two thirds of its TTL left,
/// so one with less than a third left has seen its renews fail for a while. Told once until
/// a renew gets through.
pub(crate) struct Jeopardy {
    third: Duration,
    warned: bool,
}

impl Jeopardy {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            third: ttl / 3,
            warned: false,
        }
    }

    /// When to warn, for a validity that ends at `until`; `None` once warned.
    pub(crate) fn at(&self, until: Instant) -> Option<Instant> {
        (!self.warned).then(|| until.checked_sub(self.third).unwrap_or(until))
    }

    /// Warned now: what is left of the validity.
    pub(crate) fn warn(&mut self, until: Instant) -> Duration {
        self.warned = true;
        until.saturating_duration_since(Instant::now())
    }

    /// A renew got through, the validity now ending at `until`: what is left of it, when the
    /// holder was warned and must be told it is safe.
    pub(crate) fn renewed(&mut self, until: Instant) -> Option<Duration> {
        std::mem::take(&mut self.warned).then(|| until.saturating_duration_since(Instant::now()))
    }

    /// `renew`'s answer; a renew that hangs (its masters paused) does not hold back the
    /// warning: `tell` gets it when it falls due meanwhile.
    pub(crate) async fn during<T>(
        &mut self,
        renew: impl Future<Output = T>,
        until: Instant,
        mut tell: impl FnMut(Duration),
    ) -> T {
        tokio::pin!(renew);
        loop {
            let due = self.at(until);
            tokio::select! {
                answer = &mut renew => return answer,
                () = sleep_until(due.unwrap_or(until)), if due.is_some() => tell(self.warn(until)),
            }
        }
    }
}
