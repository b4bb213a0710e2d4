//! Waits between retries, spread out: a pause of `d` becomes one drawn evenly from `d/2`
//! to `d` ("equal jitter"). Many replicas that lost one master at once (a restart, a
//! network blip) would otherwise retry it in lock-step, each wave landing together.

use std::time::Duration;

/// `d` with jitter: evenly between half of it and all of it.
pub(crate) fn jittered(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jittered_wait_lies_between_half_and_all_of_it_and_varies() {
        let d = Duration::from_millis(800);
        let waits: Vec<Duration> = (0..200).map(|_| jittered(d)).collect();
        assert!(waits.iter().all(|w| *w >= d / 2 && *w <= d), "{waits:?}");
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(
            distinct.len() > 100,
            "spread, not one value: {}",
            distinct.len()
        );
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }
}
