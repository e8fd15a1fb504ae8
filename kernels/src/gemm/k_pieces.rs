//! A long, thin product (k at least six times C's longer side: a weight gradient, whose k is
//! every token row of the batch) as two halves of k, each a product of its own, added at the
//! end.
//!
//! Split over C's rows or columns, as the driver splits other products, each thread packs all
//! of k for its part of C and one operand whole: both threads read and pack all of `x` (or of
//! `dy`) for a weight gradient `dyᵀ·x`, from L3, since the forward pass wrote it long before.
//! Split over k, each thread packs half of each operand once, and the price is one `m × n`
//! FP32 sum at the end, small beside `(m + n) · k` when k is long. On a two-core AVX-512 Xeon
//! with AMX (session 52), in the ViT's step (`cargo bench --bench cpu_step -- --only vit`,
//! alternated with the build before): O0 19.4–20.2 → 17.5–18.2 ms, O2-BF16 14.6–15.4 →
//! 13.7–15.1 ms; the small GPT's 128 × 128 × 768 (`--breakdown`) 0.64 → 0.48 ms a step under
//! O0. With the operands in cache (`cargo bench -p typed-amp-kernels --bench gemm -- halves`)
//! the f32 products gain 4–41%; the bf16 ones range from 28% slower to 47% faster from run to
//! run, AMX's products being short beside their packing either way.
//!
//! The halves are fixed by the shape alone (never by the thread count) and added in one order,
//! so a product has the same bits on any number of threads.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::arch::Arch;
use super::driver::run;
use super::problem::{Epi, Problem};
use super::types::Kind;

/// How long k must be against C's longer side for the halves to pay. Split over k, a thread
/// packs `min(m, n) · k / 2` fewer elements than split over C (two threads), and C costs about
/// three passes of `m · n` more (the second half's buffer, zeroed and written, and the sum).
/// Set between the small GPT's f32 weight gradients that gained when split (128 × 128 × 768,
/// k = 6 × the longer side; `cargo bench -p typed-amp-kernels --bench gemm -- halves`) and
/// those a build splitting every product measured 5–13% slower (384 × 128 × 768 and 512 × 128 ×
/// 768, k = 2 and 1.5 × the longer side; session 52's issue note).
const K_PER_SIDE: usize = 6;

/// The largest C (elements) split: each half holds all of C as its running sum, which past
/// half a 2 MiB L2 goes back to L3 every k block. The baby GPT's 384 × 384 bf16 weight gradient
/// (147,456 elements) gains when split (`cargo bench -p typed-amp-kernels --bench gemm --
/// halves`); its 1152 × 384 and 1536 × 384 ones ran 9% and 3% slower in its step in a build
/// that split them (session 52's issue note).
const MAX_C: usize = 1 << 18;

/// Products below this many flops are left whole: their halves would be too short to share.
const MIN_FLOPS: usize = 1 << 22;

static K_HALVES: AtomicBool = AtomicBool::new(true);

/// Benchmarks only: with `false`, no product is split over k, so that the two ways can be
/// timed side by side (`cargo bench -p typed-amp-kernels --bench gemm -- halves`).
#[doc(hidden)]
pub fn set_k_halves(on: bool) {
    K_HALVES.store(on, Ordering::Relaxed);
}

/// Where `p` is split, when it is: the length of the first half of k (a whole number of the
/// kernels' k units, so that the second half starts on a pair or tile boundary). Only an FP32
/// C whose epilogue is a plain sum (optionally added to C's old value): the halves' sums are
/// added in FP32 before anything else touches them. Not `gemm`'s own products (`legacy`),
/// whose C_old enters the sum first.
pub(super) fn split_at(arch: &Arch, p: &Problem) -> Option<usize> {
    let e = &p.epi;
    let flops =
        p.m.saturating_mul(p.n)
            .saturating_mul(p.k)
            .saturating_mul(2);
    let unit = arch.k_unit();
    let first = p.k / 2 / unit * unit;
    (p.out == Kind::F32
        && e.plain()
        && !e.legacy
        && p.k >= K_PER_SIDE * p.m.max(p.n)
        && p.m.saturating_mul(p.n) <= MAX_C
        && flops >= MIN_FLOPS
        && first > 0
        && K_HALVES.load(Ordering::Relaxed))
    .then_some(first)
}

/// Runs `p` as its two halves of k (the first `first` long), on `threads` threads in all, and
/// adds them into C: `C = (P₀ + P₁)`, or `C = (P₀ + P₁) + C_old` when accumulating, the old
/// value added once after the whole sum as [`Epilogue`](super::Epilogue) promises. Returns
/// whether C holds a non-finite element, when the epilogue asks (else `false`).
///
/// # Safety
/// As [`drive`](super::entry::drive), and `first` from [`split_at`] for `p`.
pub(super) unsafe fn run_halves(arch: &Arch, p: &Problem, threads: usize, first: usize) -> bool {
    let (m, n) = (p.m, p.n);
    let len = m * n;
    // The halves report nothing: C's elements are checked once they are whole.
    let fresh = Epi {
        accumulate: false,
        check: false,
        ..p.epi
    };
    // The halves' own C: the first half writes straight into C unless C's old value is still
    // needed, the second always into a buffer of its own (row-major, `n` apart).
    let mut second = vec![0f32; len];
    let mut first_sum = if p.epi.accumulate {
        vec![0f32; len]
    } else {
        Vec::new()
    };
    let half = |k0: usize, k: usize, c: *mut f32, (c_rs, c_cs): (isize, isize)| {
        let (sa, sb) = (p.a_kind.size(), p.b_kind.size());
        // SAFETY: column `k0 < k` of A and row `k0` of B are elements of them (the contract).
        let (a, b) = unsafe {
            (
                p.a.offset(k0 as isize * p.a_cs * sa),
                p.b.offset(k0 as isize * p.b_rs * sb),
            )
        };
        Problem {
            k,
            a,
            b,
            c: c as *mut u8,
            c_rs,
            c_cs,
            epi: fresh,
            ..*p
        }
    };
    let p0 = if p.epi.accumulate {
        half(0, first, first_sum.as_mut_ptr(), (n as isize, 1))
    } else {
        half(0, first, p.c as *mut f32, (p.c_rs, p.c_cs))
    };
    let p1 = half(first, p.k - first, second.as_mut_ptr(), (n as isize, 1));
    // SAFETY: each half is a product over the same A and B (its columns, its rows of them)
    // into a C of `m × n` slots of its own (C itself, or a buffer of `len`), disjoint from
    // the other's; `drive`'s contract carries over.
    unsafe {
        if threads > 1 {
            let t0 = threads / 2;
            rayon::join(|| run(arch, &p0, t0), || run(arch, &p1, threads - t0));
        } else {
            run(arch, &p0, 1);
            run(arch, &p1, 1);
        }
    }
    // C's row `i`: the sums of both halves, and C's old value when accumulating; whether any
    // of the row's new values is non-finite, when asked.
    let add_row = |i: usize, row: &[f32]| -> bool {
        let mut non_finite = false;
        for (j, &s1) in row.iter().enumerate() {
            // SAFETY: `(i, j)` with `i < m`, `j < n` is a slot of C (the contract), written by
            // this row's task alone.
            unsafe {
                let c = (p.c as *mut f32).offset(i as isize * p.c_rs + j as isize * p.c_cs);
                *c = if p.epi.accumulate {
                    (first_sum[i * n + j] + s1) + *c
                } else {
                    *c + s1
                };
                non_finite |= !(*c).is_finite();
            }
        }
        p.epi.check && non_finite
    };
    if threads > 1 && len >= PARALLEL_SUM_MIN {
        second
            .par_chunks(n)
            .enumerate()
            .with_min_len((PARALLEL_SUM_MIN / n).max(1))
            .map(|(i, row)| add_row(i, row))
            .reduce(|| false, |x, y| x | y)
    } else {
        second
            .chunks(n)
            .enumerate()
            .fold(false, |x, (i, row)| x | add_row(i, row))
    }
}

/// C's elements below which the halves are added on the calling thread alone.
const PARALLEL_SUM_MIN: usize = 1 << 15;
