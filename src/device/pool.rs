//! Running a training loop on the CPU kernels' own threads.

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
/// ```
/// let sum = typed_amp::device::on_cpu_pool(|| (1..=4).sum::<u32>());
/// assert_eq!(sum, 10);
/// ```
pub fn on_cpu_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    // Called from outside the pool, `rayon::scope` runs its body on a worker and blocks the
    // caller until it returns.
    rayon::scope(|_| f())
}
