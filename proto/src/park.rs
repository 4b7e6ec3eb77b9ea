//! Keeping the CPU while answers are awaited: what a listener's runtime
//! does before it parks (decision 0162).
//!
//! On a virtual machine an idle core halts, and a process woken on a
//! halted core waits tens of µs for it (about 40 on the project's 2-core
//! VM, whose `haltpoll` idle driver does not poll first). A request crossing
//! the group meets that at every hop whose core slept: listener → broker →
//! router → manager → listener is five such wake-ups at one client where
//! the in-process server has two. When a listener thread set up here
//! ([`set_spin`]) has requests out ([`Awaited`]) and nothing left to run,
//! it yields the CPU in a loop instead of sleeping, looking at the rings
//! its readers wait on, for up to `listener.park_spin_us`:
//!
//! - its own core stays awake, so the hops after the first find no idle
//!   core to be woken on and run one after another on the other core,
//!   and the answer is seen in the ring without a wake-up;
//! - it stops at the first yield that gave the CPU to another process
//!   (the yield took longer than [`BUSY_YIELD`]): that core is not going
//!   idle, so spinning on would only take time from whoever needs it;
//! - a ring reader on such a thread does not yield before it sleeps (the
//!   park hook yields at the one moment nothing else can run).
//!
//! The readers raise their waiting flags as always, so a thread that
//! stops spinning and sleeps is woken as before: the spin only ever
//! shortens a wait.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::pipe::RingProbe;

/// A yield that took longer than this gave the CPU to another process.
/// One that finds nobody else to run returns in a system call's time
/// (about 1 µs on the project's VM).
pub const BUSY_YIELD: Duration = Duration::from_micros(10);

/// Requests this process sent and awaits answers to.
static AWAITED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Microseconds this thread may spin before its runtime parks; 0: never.
    static SPIN_US: Cell<u64> = const { Cell::new(0) };
    /// The rings this thread's readers found empty, and their wakers.
    static WAITING: RefCell<Vec<(RingProbe, Waker)>> = const { RefCell::new(Vec::new()) };
}

/// Makes this thread spin up to `us` microseconds before its runtime
/// parks while answers are awaited; 0 (every thread's default) turns it
/// off. Install [`before_park`] as the runtime's `on_thread_park`.
pub fn set_spin(us: u64) {
    SPIN_US.set(us);
}

/// Whether this thread spins before it parks (its ring readers then do
/// not yield on their own).
pub(crate) fn spinning() -> bool {
    SPIN_US.get() > 0
}

/// A request whose answer this process awaits, while it lives.
pub struct Awaited(());

impl Awaited {
    pub fn start() -> Awaited {
        AWAITED.fetch_add(1, Ordering::Relaxed);
        Awaited(())
    }
}

impl Drop for Awaited {
    fn drop(&mut self) {
        AWAITED.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Awaited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Awaited")
    }
}

/// A reader on this thread found `ring` empty and waits with `waker`.
pub(crate) fn note_waiting(ring: RingProbe, waker: &Waker) {
    WAITING.with_borrow_mut(|waiting| {
        if let Some(entry) = waiting.iter_mut().find(|(probe, _)| probe.same(&ring)) {
            entry.1.clone_from(waker);
        } else {
            waiting.push((ring, waker.clone()));
        }
    });
}

/// The runtime's `on_thread_park`: spins as the module says. Returns
/// once a waiting ring has bytes (its reader woken: the runtime then runs
/// it instead of parking), the time is up, a yield ran another process,
/// or there is nothing to wait for.
pub fn before_park() {
    let spin = SPIN_US.get();
    if spin == 0 || AWAITED.load(Ordering::Relaxed) == 0 {
        return;
    }
    WAITING.with_borrow_mut(|waiting| {
        // A reader that is gone leaves its entry behind: drop it here.
        waiting.retain(|(probe, _)| probe.is_open());
        if waiting.is_empty() {
            return;
        }
        let until = Instant::now() + Duration::from_micros(spin);
        loop {
            let mut woke = false;
            waiting.retain(|(probe, waker)| {
                if probe.has_bytes() {
                    waker.wake_by_ref();
                    woke = true;
                    false
                } else {
                    true
                }
            });
            let yielded_at = Instant::now();
            if woke || yielded_at >= until {
                return;
            }
            std::thread::yield_now();
            if yielded_at.elapsed() > BUSY_YIELD {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    /// The three cases on one thread (the state is per thread and per
    /// process, so one test owns it): nothing awaited, bytes waiting,
    /// none waiting.
    #[test]
    fn a_spinning_thread_wakes_the_reader_whose_ring_has_bytes_and_only_while_answers_are_awaited() {
        let (mut producer, handle) = crate::pipe::pipe(4096, None).unwrap();
        let consumer = handle.open().unwrap();
        let (count, waker) = counting_waker();
        set_spin(1_000_000);
        note_waiting(consumer.probe(), &waker);
        producer.try_write(b"an answer").unwrap();

        // Nothing awaited: no spin, no wake, even with bytes there.
        before_park();
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "nothing was awaited");

        // Awaited, bytes waiting: the reader is woken before any yield (a
        // spin that missed the bytes would end without waking it).
        let awaited = Awaited::start();
        before_park();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the reader with bytes is woken"
        );
        // Its entry is gone with the wake: it notes itself again when it
        // next finds its ring empty.
        assert!(WAITING.with_borrow(|w| w.is_empty()));

        // A ring with no bytes: the spin ends at its limit, nobody woken.
        let (_producer, handle) = crate::pipe::pipe(4096, None).unwrap();
        let empty = handle.open().unwrap();
        note_waiting(empty.probe(), &waker);
        set_spin(200);
        before_park();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "an empty ring wakes nobody");

        // A reader that is gone is forgotten.
        drop(empty);
        before_park();
        assert!(
            WAITING.with_borrow(|w| w.is_empty()),
            "a closed ring's entry is dropped"
        );
        drop(awaited);
        set_spin(0);
    }
}
