//! The one back-off policy of every reconnect loop in the group and its
//! clients: exponential with jitter (`backon`), so that processes that lost
//! the same peer do not all knock again at the same instant.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays between attempts: from `first`, doubling up to `max`, each with up
/// to as much again of random jitter; never gives up.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Backoff {
    /// A policy from `first` up to `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            delays: builder.build(),
            builder,
        }
    }

    /// Between processes of one group, which restart within milliseconds:
    /// 5 ms, doubling up to 200 ms.
    pub fn peer() -> Backoff {
        Backoff::new(Duration::from_millis(5), Duration::from_millis(200))
    }

    /// A client of the group over the network: 10 ms, doubling up to 2 s.
    pub fn client() -> Backoff {
        Backoff::new(Duration::from_millis(10), Duration::from_secs(2))
    }

    /// The wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // `without_max_times`: the iterator never ends.
        self.delays.next().unwrap_or(Duration::from_secs(1))
    }

    /// After a success: the next failure starts from `first` again.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let bounds = [(10, 20), (20, 40), (40, 80), (80, 160), (80, 160)];
        for (low, high) in bounds {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(low) && d <= Duration::from_millis(high),
                "{d:?} not in {low}..={high} ms"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(20));
    }
}
