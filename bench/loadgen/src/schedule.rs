//! The open-loop schedule: one fixed-rate sequence of send times shared by
//! all the clients of a window, each free client taking the next slot due.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Slot `n` of a window is due at `start + n / rate`; the window holds the
/// slots due before its deadline.
pub(super) struct Schedule {
    start: Instant,
    rate: f64,
    slots: u64,
    /// One permit per slot that has fallen due and is not yet claimed.
    due: Semaphore,
    /// Slots claimed so far: the next one to claim is slot `claimed`.
    claimed: AtomicU64,
}

impl Schedule {
    pub(super) fn new(start: Instant, deadline: Instant, rate: f64) -> Schedule {
        let mut schedule = Schedule {
            start,
            rate,
            slots: 0,
            due: Semaphore::new(0),
            claimed: AtomicU64::new(0),
        };
        // Counted with `at` itself, so that the count and the times agree to the last rounding.
        let mut slots = ((deadline - start).as_secs_f64() * rate).ceil() as u64;
        while slots > 0 && schedule.at(slots - 1) >= deadline {
            slots -= 1;
        }
        while schedule.at(slots) < deadline {
            slots += 1;
        }
        schedule.slots = slots;
        schedule
    }

    /// When slot `n` is due.
    pub(super) fn at(&self, n: u64) -> Instant {
        self.start + Duration::from_secs_f64(n as f64 / self.rate)
    }

    /// Releases the slots as they fall due, until the last; blocks its thread.
    ///
    /// A thread of its own because tokio's timer has millisecond granularity:
    /// slots released by it would go out up to a millisecond late, and that
    /// lateness would count in every latency measured from the schedule.
    /// `std::thread::sleep` is good to some tens of microseconds, and slots
    /// closer together than that are released together.
    pub(super) fn release(&self) {
        let mut released = 0;
        while released < self.slots {
            let now = Instant::now();
            let mut due = released;
            while due < self.slots && self.at(due) <= now {
                due += 1;
            }
            if due > released {
                self.due.add_permits((due - released) as usize);
                released = due;
            }
            if released < self.slots {
                std::thread::sleep(self.at(released).saturating_duration_since(Instant::now()));
            }
        }
    }

    /// Waits for a slot to fall due, claims the earliest unclaimed one and
    /// returns when it was due. Cancel-safe: a slot is claimed only on return.
    pub(super) async fn next(&self) -> Instant {
        // The semaphore is never closed.
        if let Ok(permit) = self.due.acquire().await {
            permit.forget();
        }
        self.at(self.claimed.fetch_add(1, Ordering::Relaxed))
    }

    /// The due times of the slots nobody claimed.
    pub(super) fn unclaimed(&self) -> impl Iterator<Item = Instant> + '_ {
        let claimed = self.claimed.load(Ordering::Relaxed).min(self.slots);
        (claimed..self.slots).map(|n| self.at(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_holds_the_slots_due_before_its_deadline() {
        let start = Instant::now();
        let count =
            |secs: f64, rate: f64| Schedule::new(start, start + Duration::from_secs_f64(secs), rate).slots;
        // Slots 0, 0.01, ..., 0.49: 0.5 itself is the deadline, not in the window.
        assert_eq!(count(0.5, 100.0), 50);
        assert_eq!(count(0.3, 200.0), 60);
        assert_eq!(count(1.0, 3.0), 3);
        assert_eq!(count(0.001, 1.0), 1);
        assert_eq!(count(0.3, 1e6), 300_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_are_claimed_in_order_as_they_fall_due() {
        let start = Instant::now();
        let schedule = std::sync::Arc::new(Schedule::new(start, start + Duration::from_millis(50), 100.0));
        assert_eq!(schedule.slots, 5);
        let releaser = schedule.clone();
        let released = tokio::task::spawn_blocking(move || releaser.release());
        for n in 0..3 {
            let at = schedule.next().await;
            assert_eq!(at, schedule.at(n));
            // Never before it was due.
            assert!(Instant::now() >= at);
        }
        released.await.unwrap();
        assert_eq!(
            schedule.unclaimed().collect::<Vec<_>>(),
            [schedule.at(3), schedule.at(4)]
        );
    }
}
