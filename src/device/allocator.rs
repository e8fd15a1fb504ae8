//! Keeping freed memory for reuse on the CPU.
//!
//! dfdx allocates a fresh buffer for nearly every tensor of a training step and frees it when the
//! step is done. glibc's `malloc` serves buffers above its mmap threshold (128 KiB at start,
//! adjusted up to 32 MiB) with `mmap` and returns them with `munmap`, and trims the top of its
//! heap back to the system: the next step then faults in and zeroes the same pages again. On the
//! main job's CNN that was about half of the CPU step (measured with `perf`: page faults, page
//! clearing, TLB shootdowns). Raising both thresholds keeps freed memory inside the process for
//! the next step, reused across sizes (unlike dfdx's exact-size tensor cache, which also does
//! the job, at several times the memory).
//!
//! Threads share the main heap: glibc gives each thread that allocates its own arena, whose heaps
//! are at most 64 MiB and are given back to the system as they empty, so a loop run on a worker
//! thread ([`on_cpu_pool`](super::on_cpu_pool)) faulted its activations in again every step (the
//! baby GPT's FP32 step, three configurations interleaved: 4.4 → 9.5 s, 38 s of system time).
//!
//! A trim threshold of 1 GiB was not enough either: the baby GPT at batch 64 frees several GiB at
//! the end of each step, the heap's free top then exceeded the threshold, and the whole of it was
//! given back and faulted in again (584,000 page faults and about 2.4 s of system time a step,
//! measured with `perf stat -e page-faults` on `cargo bench --bench cpu_step -- --only gpt-baby
//! --config O0`); its 100 MB activations were above the old 64 MiB mmap threshold as well. With
//! trimming off and the threshold at 1 GiB, the steps after the first fault in nothing, at the
//! same peak resident size (2.80 GB for three steps either way).

/// Makes glibc's `malloc` keep freed memory for reuse: buffers up to 1 GiB come from the heap,
/// the heap is never trimmed, and every thread allocates from that one
/// heap (call it before other threads allocate: arenas already made stay). Returns whether the allocator took the
/// settings (`false` on other C libraries and systems, where nothing changes).
///
/// Process-wide and permanent, so it is the application's call: the `typed-amp` binary and the
/// benchmarks make it; a library never does. The cost is memory: the process's resident size
/// stays near its peak instead of shrinking between steps. The same settings without code:
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1099511627776:glibc.malloc.arena_max=1`
/// (a trim threshold above the machine's memory).
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30) == 1
                // -1: never trim (mallopt(3)).
                && libc::mallopt(libc::M_TRIM_THRESHOLD, -1) == 1
                && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
