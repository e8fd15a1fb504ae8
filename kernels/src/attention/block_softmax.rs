//! The blocked attention's passes over one block of scores, for heads longer than
//! [`MAX_KEYS`](super::MAX_KEYS) (`typed_amp`'s CPU attention): a `rows × cols` FP32 tile
//! between the block's products, row `r` seeing its first `visible[r]` keys (all, or up to the
//! diagonal under a causal mask). The forward's online softmax in two passes
//! ([`shift_block`], [`finish_block`]); the backward's probabilities again
//! ([`probabilities_block`]) and the scores' gradient ([`score_grads_block`]).
//!
//! Why here: written in the op, each row's maximum and sum were scalar loops (`f32::max` and a
//! sum in order do not vectorise, and the op's crate is built for baseline x86-64), and `perf`
//! of the baby GPT's O2-BF16 step put them at 38% of the attention's samples on the recording
//! thread, more than its products. Here a row's maximum and sum are kept in [`ACC`] running
//! lanes (the maximum is the same value in any order; the sum's order is fixed: lane `l` adds
//! elements `l, l + 16, …` in order, then the lanes are added in order), built for AVX-512 or
//! AVX2 where the CPU has them, so every level gives the same bits.

use crate::math::{exp_f32, exp_slice};

/// Running lanes of a row's maximum and sum.
const ACC: usize = 16;

/// The largest of `x` (NaNs passed over, as `f32::max` does), −∞ if there are none.
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; ACC];
    let (whole, rest) = x.as_chunks::<ACC>();
    for c in whole {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a = a.max(v);
    }
    acc.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// The sum of `x`: lane `l` sums elements `l, l + ACC, …` in order, the lanes added in order.
#[inline(always)]
fn row_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; ACC];
    let (whole, rest) = x.as_chunks::<ACC>();
    for c in whole {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += v;
    }
    acc.into_iter().fold(0.0, |s, a| s + a)
}

/// Defines `fn $name` once per target (AVX-512, AVX2 and FMA, baseline) and runs the widest the
/// CPU has: the same operations in each (Rust makes no fused multiply-add of a separate
/// multiply and add, and the ones `exp_f32` asks for are exact on every target), so the same
/// bits.
macro_rules! run_widest {
    (fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
            fn widest($($arg: $ty),*) $body
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma")]
            fn wide($($arg: $ty),*) $body
            #[allow(clippy::too_many_arguments)]
            fn $name($($arg: $ty),*) $body
            let level = crate::level::level();
            if level >= crate::level::Level::Avx512 {
                // SAFETY: the level is at least AVX-512, only detected (or forced) on a CPU
                // with AVX-512F, BW and VL (and AVX2 and FMA).
                unsafe { widest($($arg),*) };
            } else if level >= crate::level::Level::Avx2 {
                // SAFETY: the level is at least AVX2, only detected (or forced) on a CPU with
                // AVX2 and FMA.
                unsafe { wide($($arg),*) };
            } else {
                $name($($arg),*);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            #[allow(clippy::too_many_arguments)]
            fn $name($($arg: $ty),*) $body
            $name($($arg),*);
        }
    }};
}

/// Panics unless each of the first `rows` visible counts is at most the row length `cols`
/// (the passes index `row[..visible[r]]`).
fn check_visible(visible: &[usize], rows: usize, cols: usize) {
    assert!(visible[..rows].iter().all(|&v| v <= cols));
}

/// The online softmax's first pass over a block: in each row `r` of the `rows × cols` tile `s`
/// (`rows = running_max.len()`), the first `visible[r]` scores multiplied by `scale`;
/// `next_max[r]` = the larger of `running_max[r]` and their maximum; those scores minus it
/// when it is finite (a row that has seen only −∞ keeps its scores). Then `exp` of the whole
/// tile ([`exp_slice`]); what a row does not see is left for [`finish_block`] to zero.
///
/// A NaN score stays NaN through the subtraction and the exponential.
///
/// # Panics
/// If `s` is shorter than `rows · cols`, `next_max` or `visible` shorter than `rows`, or a
/// `visible[r]` exceeds `cols`.
pub fn shift_block(
    s: &mut [f32],
    cols: usize,
    visible: &[usize],
    scale: f32,
    running_max: &[f32],
    next_max: &mut [f32],
) {
    let rows = running_max.len();
    assert!(s.len() >= rows * cols && next_max.len() >= rows && visible.len() >= rows);
    check_visible(visible, rows, cols);
    run_widest! {
        fn shift(
            s: &mut [f32],
            cols: usize,
            visible: &[usize],
            scale: f32,
            running_max: &[f32],
            next_max: &mut [f32]
        ) {
            for (r, (&old, next)) in running_max.iter().zip(next_max.iter_mut()).enumerate() {
                let live = &mut s[r * cols..r * cols + visible[r]];
                for x in live.iter_mut() {
                    *x *= scale;
                }
                let new_max = old.max(row_max(live));
                *next = new_max;
                if new_max != f32::NEG_INFINITY {
                    for x in live.iter_mut() {
                        *x -= new_max;
                    }
                }
            }
        }
    }
    exp_slice(&mut s[..rows * cols]);
}

/// The online softmax's second pass, after [`shift_block`]: in each row `r`, the keys past
/// `visible[r]` zeroed; where `next_max[r]` is finite, the row's earlier sum and output row
/// (`o[r·hd..(r + 1)·hd]`) rescaled by `exp(running_max[r] − next_max[r])` (by 0 for a first
/// finite maximum), the block's probabilities added to the sum, and `running_max[r]` moved to
/// `next_max[r]`; a row whose maximum is still −∞ (it sees no key, or only −∞ scores) is all
/// zero and changes nothing.
///
/// # Panics
/// If a slice is shorter than the rows (`running_max.len()`) need, or a `visible[r]` exceeds
/// `cols`.
pub fn finish_block(
    s: &mut [f32],
    cols: usize,
    visible: &[usize],
    next_max: &[f32],
    running_max: &mut [f32],
    sum: &mut [f32],
    (o, hd): (&mut [f32], usize),
) {
    let rows = running_max.len();
    assert!(
        s.len() >= rows * cols
            && visible.len() >= rows
            && next_max.len() >= rows
            && sum.len() >= rows
            && o.len() >= rows * hd
    );
    check_visible(visible, rows, cols);
    run_widest! {
        fn finish(
            s: &mut [f32],
            cols: usize,
            visible: &[usize],
            next_max: &[f32],
            running_max: &mut [f32],
            sum: &mut [f32],
            o: &mut [f32],
            hd: usize
        ) {
            for (r, max) in running_max.iter_mut().enumerate() {
                let row = &mut s[r * cols..(r + 1) * cols];
                let new_max = next_max[r];
                if new_max == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                let (live, masked) = row.split_at_mut(visible[r]);
                masked.fill(0.0);
                let rescale = if *max == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_f32(*max - new_max)
                };
                sum[r] = sum[r] * rescale + row_sum(live);
                *max = new_max;
                for x in &mut o[r * hd..(r + 1) * hd] {
                    *x *= rescale;
                }
            }
        }
    }
}

/// The backward's probabilities of a block, recomputed from the forward's log-sum-exp: in each
/// row `r` of the `rows × cols` tile `s` (`rows = lse.len()`), the first `visible[r]` scores
/// become `exp(score·scale − lse[r])` and the rest zero.
///
/// # Panics
/// If `s` is shorter than `rows · cols`, `visible` shorter than `rows`, or a `visible[r]`
/// exceeds `cols`.
pub fn probabilities_block(s: &mut [f32], cols: usize, visible: &[usize], scale: f32, lse: &[f32]) {
    let rows = lse.len();
    assert!(s.len() >= rows * cols && visible.len() >= rows);
    check_visible(visible, rows, cols);
    run_widest! {
        fn shift(s: &mut [f32], cols: usize, visible: &[usize], scale: f32, lse: &[f32]) {
            for (r, &l) in lse.iter().enumerate() {
                for x in &mut s[r * cols..r * cols + visible[r]] {
                    *x = *x * scale - l;
                }
            }
        }
    }
    exp_slice(&mut s[..rows * cols]);
    for (r, &v) in visible[..rows].iter().enumerate() {
        s[r * cols + v..(r + 1) * cols].fill(0.0);
    }
}

/// The scores' gradient of a block, in place of the probabilities' gradient `dp`: `dS = P ⊙
/// (dP − delta[r])` over the `rows × cols` tile (`rows = delta.len()`), `delta[r]` being row
/// `r`'s `Σ dy·y`.
///
/// # Panics
/// If `dp` or `p` is shorter than `rows · cols`.
pub fn score_grads_block(dp: &mut [f32], p: &[f32], cols: usize, delta: &[f32]) {
    let rows = delta.len();
    assert!(dp.len() >= rows * cols && p.len() >= rows * cols);
    run_widest! {
        fn grads(dp: &mut [f32], p: &[f32], cols: usize, delta: &[f32]) {
            for (r, &dl) in delta.iter().enumerate() {
                let row = r * cols..(r + 1) * cols;
                for (g, &pr) in dp[row.clone()].iter_mut().zip(&p[row]) {
                    *g = pr * (*g - dl);
                }
            }
        }
    }
}
