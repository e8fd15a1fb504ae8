//! Throughput of AVX512-BF16's `vdpbf16ps` against AVX-512's `vfmadd231ps` on this CPU: the
//! measurement behind `typed_amp_kernels::default_level` (bf16 products use the pair kernel by
//! default only where `vdpbf16ps` pays).
//!
//! Each loop issues 12 independent accumulator chains per iteration (more than latency ×
//! ports on any AVX-512 CPU), so the time per instruction is its reciprocal throughput. One
//! `vfmadd231ps` zmm is 16 multiply-adds, one `vdpbf16ps` zmm 32. Single-threaded.
//!
//! ```text
//! cargo bench -p typed-amp-kernels --bench bf16_dot
//! ```

use std::time::Instant;

const ITERATIONS: u64 = 20_000_000;
const CHAINS: f64 = 12.0;

macro_rules! twelve_chains {
    ($instr:literal) => {
        concat!(
            $instr,
            " zmm0, zmm30, zmm31\n",
            $instr,
            " zmm1, zmm30, zmm31\n",
            $instr,
            " zmm2, zmm30, zmm31\n",
            $instr,
            " zmm3, zmm30, zmm31\n",
            $instr,
            " zmm4, zmm30, zmm31\n",
            $instr,
            " zmm5, zmm30, zmm31\n",
            $instr,
            " zmm6, zmm30, zmm31\n",
            $instr,
            " zmm7, zmm30, zmm31\n",
            $instr,
            " zmm8, zmm30, zmm31\n",
            $instr,
            " zmm9, zmm30, zmm31\n",
            $instr,
            " zmm10, zmm30, zmm31\n",
            $instr,
            " zmm11, zmm30, zmm31\n",
        )
    };
}

/// Nanoseconds per instruction of `vfmadd231ps` zmm.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_ns() -> f64 {
    let start = Instant::now();
    // SAFETY: AVX-512F is present (the caller's contract); only zmm registers declared as
    // clobbered and the counter are touched.
    unsafe {
        std::arch::asm!(
            "vpxord zmm30, zmm30, zmm30",
            "vpxord zmm31, zmm31, zmm31",
            "2:",
            twelve_chains!("vfmadd231ps"),
            "dec {n}",
            "jnz 2b",
            n = inout(reg) ITERATIONS => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _,
            out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _,
            out("zmm10") _, out("zmm11") _, out("zmm30") _, out("zmm31") _,
            options(nostack, nomem),
        );
    }
    start.elapsed().as_secs_f64() * 1e9 / (ITERATIONS as f64 * CHAINS)
}

/// Nanoseconds per instruction of `vdpbf16ps` zmm.
///
/// # Safety
/// The CPU has AVX-512F and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16_ns() -> f64 {
    let start = Instant::now();
    // SAFETY: as in `fma_ns`, with AVX512-BF16 present too.
    unsafe {
        std::arch::asm!(
            "vpxord zmm30, zmm30, zmm30",
            "vpxord zmm31, zmm31, zmm31",
            "2:",
            twelve_chains!("vdpbf16ps"),
            "dec {n}",
            "jnz 2b",
            n = inout(reg) ITERATIONS => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _,
            out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _,
            out("zmm10") _, out("zmm11") _, out("zmm30") _, out("zmm31") _,
            options(nostack, nomem),
        );
    }
    start.elapsed().as_secs_f64() * 1e9 / (ITERATIONS as f64 * CHAINS)
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use typed_amp_kernels::{default_level, detected_level};
    println!(
        "detected {:?}, default level {:?}",
        detected_level(),
        default_level()
    );
    if !is_x86_feature_detected!("avx512f") {
        println!("no AVX-512F: nothing to measure");
        return;
    }
    // SAFETY: AVX-512F was detected above.
    let fma = (0..3)
        .map(|_| unsafe { fma_ns() })
        .fold(f64::INFINITY, f64::min);
    println!(
        "vfmadd231ps zmm  {fma:.4} ns/instruction  {:.1} GFLOP/s per core",
        32.0 / fma
    );
    if !is_x86_feature_detected!("avx512bf16") {
        println!("no AVX512-BF16: vdpbf16ps not measured");
        return;
    }
    // SAFETY: AVX-512F and AVX512-BF16 were detected above.
    let dot = (0..3)
        .map(|_| unsafe { dpbf16_ns() })
        .fold(f64::INFINITY, f64::min);
    println!(
        "vdpbf16ps zmm    {dot:.4} ns/instruction  {:.1} GFLOP/s per core",
        64.0 / dot
    );
    println!(
        "bf16 pairs / widened f32, arithmetic rate: {:.2} (above 1: the pair kernel can pay)",
        (64.0 / dot) / (32.0 / fma)
    );
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("not x86-64: nothing to measure");
}
