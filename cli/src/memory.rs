//! Whether a training step fits in memory: a batch too large for the machine is refused before
//! training starts, with the batch size that fits, rather than ending the process halfway
//! through a step (`memory allocation of N bytes failed`, or the kernel's OOM killer).

/// Memory this process can still fill, in bytes, and what limits it: the tightest of the
/// system's available memory, the cgroup's limit and the process's address-space and data-size
/// limits (`ulimit -v`, `ulimit -d`). `None` where the OS does not say (outside Linux).
///
/// The last two count address space, not memory filled: what is left under them is reduced by
/// what each worker thread reserves without filling (measured: the CNN's step at batch 730
/// fits in 375 MiB of address space and at batch 744 does not, where 132 MiB for two threads
/// and 340 KiB per example predict 732).
pub fn available() -> Option<(u64, &'static str)> {
    let usable = |b: u64| b.saturating_sub(worker_threads().saturating_mul(THREAD_RESERVE_BYTES));
    [
        mem_available().map(|b| (b, "available")),
        cgroup_headroom().map(|b| (b, "left under the cgroup's memory limit")),
        rlimit_headroom("Max address space", "VmSize").map(|b| {
            (
                usable(b),
                "usable under the address-space limit (ulimit -v)",
            )
        }),
        rlimit_headroom("Max data size", "VmData")
            .map(|b| (usable(b), "usable under the data-size limit (ulimit -d)")),
    ]
    .into_iter()
    .flatten()
    .min_by_key(|(bytes, _)| *bytes)
}

/// Address space a worker thread reserves: glibc's allocation arena (`HEAP_MAX_SIZE`, 64 MiB on
/// 64-bit systems) and its stack (2 MiB).
const THREAD_RESERVE_BYTES: u64 = 66 << 20;

/// The threads the CPU kernels run on: rayon's pool, `RAYON_NUM_THREADS` or one per core.
fn worker_threads() -> u64 {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// The value of `key` (in kB) in a `/proc` file such as `/proc/meminfo`, in bytes.
fn proc_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The kernel's estimate of memory available to new allocations without swapping.
fn mem_available() -> Option<u64> {
    proc_kib(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable:",
    )
}

/// What the process's cgroup (v2) may still use: `memory.max` minus `memory.current`.
fn cgroup_headroom() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    // "max" means no limit.
    let max: u64 = read("memory.max")?.trim().parse().ok()?;
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// A resource limit's soft value (from `/proc/self/limits`) minus what the process already uses
/// of it (`usage`, a `/proc/self/status` field); `None` when unlimited.
fn rlimit_headroom(limit: &str, usage: &str) -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with(limit))?;
    // "Max address space   <soft>   <hard>   bytes": the soft limit is what malloc meets.
    let soft: u64 = line[limit.len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = proc_kib(&status, &format!("{usage}:"))?;
    Some(soft.saturating_sub(used))
}

/// `bytes` for people: `38.2 GiB`, `512.0 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "bytes";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if unit == "bytes" {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(38 << 30), "38.0 GiB");
        assert_eq!(human(1536 << 10), "1.5 MiB");
    }

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let meminfo = "MemTotal:       24684092 kB\nMemAvailable:   24059664 kB\n";
        assert_eq!(proc_kib(meminfo, "MemAvailable:"), Some(24059664 * 1024));
        assert_eq!(proc_kib(meminfo, "SwapTotal:"), None);
    }

    #[test]
    fn linux_says_how_much_memory_is_left() {
        if !cfg!(target_os = "linux") {
            eprintln!("skipping: memory figures come from Linux's /proc");
            return;
        }
        let (bytes, _) = available().expect("/proc/meminfo has MemAvailable");
        assert!(bytes > 0);
    }
}
