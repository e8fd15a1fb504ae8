//! Running a training loop on the CPU kernels' own threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` on one of rayon's worker threads (the global pool, which the CPU kernels split
/// their work over) and returns its result; called from a worker already, runs `f` there.
///
/// A loop run from the program's own thread hands each parallel kernel to the pool and sleeps
/// until it ends: every kernel pays to wake the workers and to wake the caller again, and
/// between kernels the idle workers spin and yield for a while before they sleep, competing
/// with the caller's serial work for the cores. Run on a worker, the loop's thread is one of
/// the pool's: a kernel's halves go to the other workers directly and the caller works on one
/// of them. On two cores (`cargo bench --bench cpu_step -- --only vit`, Zen 5) the ViT's step
/// took 16.8 → 13.2 ms under O0 and 14.5 → 11.0 ms under O2-BF16; the CLI runs every command
/// this way.
///
/// While `f` runs, the pool's other workers poll for its kernels' work instead of going to sleep
/// between kernels, as OpenMP runtimes' threads do (Intel's wait for 200 ms by default). Rayon's
/// idle workers sleep after a few dozen yields, and a step's kernels come tens of microseconds
/// apart: each kernel then paid a futex wake and a context switch before its second half
/// started (about 11% of the ViT's profile on a two-core Xeon, session 50; the ViT's step
/// 19.08 / 18.01 → 16.43 / 16.99 ms under O2-BF16 in `cargo bench --bench cpu_step -- --only
/// vit`, BENCHMARKS.md). A polling worker yields its core between polls (to
/// another process, or another rank's threads, where the machine is shared), and one that has
/// found nothing for 5 ms (a serial stretch: loading data, writing a checkpoint) backs off to
/// polling every 200 µs, so an idle program costs little. One call keeps the workers polling at
/// a time; a concurrent call from another thread runs `f` without it. A poller runs whatever work
/// the pool has, as any rayon worker that waits does: should that be another thread's
/// `on_cpu_pool` body, the call whose poller took it returns when that body ends.
///
/// ```
/// let sum = typed_amp::device::on_cpu_pool(|| (1..=4).sum::<u32>());
/// assert_eq!(sum, 10);
/// ```
pub fn on_cpu_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    // Two calls' pollers could each end up running the other's `f` inside their own frames and
    // wait on each other for ever; so only the call that holds `POLLING` starts pollers.
    let poll = POLLING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok();
    let _release = poll.then_some(SetOnDrop(&POLLING, false));
    let done = AtomicBool::new(false);
    // Called from outside the pool, `rayon::scope` runs its body on a worker and blocks the
    // caller until it and everything it spawned have returned.
    rayon::scope(|s| {
        if poll {
            for _ in 1..rayon::current_num_threads() {
                let done = &done;
                s.spawn(move |_| poll_for_work(done));
            }
        }
        // Set when `f` returns or panics: the scope waits for the pollers before it returns
        // (or re-raises `f`'s panic).
        let _stop = SetOnDrop(&done, true);
        f()
    })
}

/// Whether a call of [`on_cpu_pool`] has pollers running.
static POLLING: AtomicBool = AtomicBool::new(false);

/// How long an idle poller spins before it backs off: inside a step, kernels come microseconds
/// apart.
const SPIN_FOR: Duration = Duration::from_millis(5);

/// A backed-off poller's sleep between polls: the most a kernel that follows a long serial
/// stretch waits for this worker.
const BACKED_OFF_POLL: Duration = Duration::from_micros(200);

/// Runs the pool's pending work on this worker until `done`.
fn poll_for_work(done: &AtomicBool) {
    let mut idle_since = Instant::now();
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle_since = Instant::now();
        } else if idle_since.elapsed() < SPIN_FOR {
            // Between polls, the core to any other thread that is ready to run (another
            // process's, or another rank's on a shared machine); with none, this returns at once.
            std::thread::yield_now();
        } else {
            std::thread::sleep(BACKED_OFF_POLL);
        }
    }
}

/// Stores a value into a flag when dropped, also while unwinding.
struct SetOnDrop<'a>(&'a AtomicBool, bool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::on_cpu_pool;
    use rayon::prelude::*;

    #[test]
    fn parallel_work_inside_is_done() {
        let sum = on_cpu_pool(|| (0..100_000u64).into_par_iter().sum::<u64>());
        assert_eq!(sum, 100_000 * 99_999 / 2);
    }

    #[test]
    fn a_panic_in_f_reaches_the_caller_and_the_pollers_stop() {
        let caught = std::panic::catch_unwind(|| on_cpu_pool(|| panic!("inside")));
        assert!(caught.is_err());
        // Pollers still running would hold the flag: the next call gets its own.
        assert_eq!(on_cpu_pool(|| 3), 3);
    }

    #[test]
    fn concurrent_callers_from_other_threads_all_finish() {
        let handles: Vec<_> = (0..4u64)
            .map(|i| {
                std::thread::spawn(move || {
                    on_cpu_pool(|| (0..10_000u64).into_par_iter().map(|x| x * i).sum::<u64>())
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), 10_000 * 9_999 / 2 * i as u64);
        }
    }
}
