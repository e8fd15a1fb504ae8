//! The CPU's FP32 peak: twelve independent chains of fused multiply-adds on the widest vectors
//! the CPU has (AVX-512, else AVX2 and FMA), no loads, on one thread and then on every thread
//! at once. The GEMM's and a step's products are read against it ("at N% of the FP32 peak").
//!
//! ```text
//! cargo bench -p typed-amp-kernels --bench fma_peak
//! ```

use std::time::Instant;

/// Multiply-adds a chain runs per timed pass.
const STEPS: u64 = 100_000_000;

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (name, one) = peak();
    println!("FP32 fused multiply-adds on {name}: twelve independent chains, {STEPS} steps each");
    println!("  1 thread:  {one:7.1} GFLOP/s");
    let all: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(|| peak().1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let per: Vec<String> = all.iter().map(|g| format!("{g:.1}")).collect();
    println!(
        "  {threads} threads: {:7.1} GFLOP/s in all ({} each)",
        all.iter().sum::<f64>(),
        per.join(", ")
    );
}

/// The vectors used and one thread's GFLOP/s.
fn peak() -> (&'static str, f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected.
            return ("AVX-512 (16 lanes)", unsafe { avx512() });
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected.
            return ("AVX2 (8 lanes)", unsafe { avx2() });
        }
    }
    ("scalar f32::mul_add", scalar())
}

/// Runs `step` (twelve multiply-adds of `lanes` each) `STEPS` times; GFLOP/s.
#[inline(always)]
fn timed(lanes: u64, mut step: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..STEPS {
        step();
    }
    (STEPS * 12 * lanes * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512() -> f64 {
    use std::arch::x86_64::*;
    let (b, c) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(0.5); 12];
    let g = timed(16, || {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, b, c);
        }
    });
    std::hint::black_box(acc);
    g
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2() -> f64 {
    use std::arch::x86_64::*;
    let (b, c) = (_mm256_set1_ps(1.000_000_1), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(0.5); 12];
    let g = timed(8, || {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, b, c);
        }
    });
    std::hint::black_box(acc);
    g
}

fn scalar() -> f64 {
    let mut acc = [0.5f32; 12];
    let g = timed(1, || {
        for x in acc.iter_mut() {
            *x = x.mul_add(1.000_000_1, 1e-7);
        }
    });
    std::hint::black_box(acc);
    g
}
