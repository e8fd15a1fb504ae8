//! The loops a pass is made of: a row against a transposed matrix, weighted sums of rows,
//! outer-product updates of rows, and the lane-wise copies, masks, reductions and rounding
//! between them.

use half::f16;

use super::head::{Rounding, LANES, MAX_KEYS};
use super::lanes::Lanes8;
use crate::convert::{f16_to_f32, f32_to_f16, narrow_bf16, widen_bf16};

/// Calls `$f::<V, C>(…)` for the chunk count `$n` (1 to 8 vectors of [`LANES`]), so that each
/// count's loops are compiled with their `C` sums in registers.
macro_rules! with_chunks {
    ($n:expr, $f:ident::<$v:ty>($($arg:expr),*)) => {
        match $n {
            1 => $f::<$v, 1>($($arg),*),
            2 => $f::<$v, 2>($($arg),*),
            3 => $f::<$v, 3>($($arg),*),
            4 => $f::<$v, 4>($($arg),*),
            5 => $f::<$v, 5>($($arg),*),
            6 => $f::<$v, 6>($($arg),*),
            7 => $f::<$v, 7>($($arg),*),
            _ => $f::<$v, 8>($($arg),*),
        }
    };
}
pub(super) use with_chunks;

/// `s[c·LANES + l] = Σ_d a[d]·bt[d·ld + c·LANES + l]` for the first `C` vectors: a row against
/// a transposed matrix, each sum in order of `d`, the `C` vectors' chains side by side.
#[inline(always)]
pub(super) fn row_by_transposed<V: Lanes8, const C: usize>(
    a: &[f32],
    bt: &[f32],
    ld: usize,
    s: &mut [f32],
) {
    let mut acc = [V::zero(); C];
    for (d, &x) in a.iter().enumerate() {
        let row = &bt[d * ld..d * ld + C * LANES];
        let x = V::splat(x);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&row[c * LANES..]), *acc);
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        acc.store(&mut s[c * LANES..]);
    }
}

/// `out[..C·LANES] = Σ_j w[j]·m[j·ld..][..C·LANES]`: the even and the odd `j` summed apart (in
/// order) and added at the end, twice the chains of one running sum.
#[inline(always)]
pub(super) fn weighted_rows<V: Lanes8, const C: usize>(
    w: &[f32],
    m: &[f32],
    ld: usize,
    out: &mut [f32],
) {
    let mut even = [V::zero(); C];
    let mut odd = [V::zero(); C];
    let mut rows = w.iter().enumerate();
    while let Some((j, &x)) = rows.next() {
        let (r, x) = (&m[j * ld..j * ld + C * LANES], V::splat(x));
        for (c, acc) in even.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
        }
        if let Some((j, &x)) = rows.next() {
            let (r, x) = (&m[j * ld..j * ld + C * LANES], V::splat(x));
            for (c, acc) in odd.iter_mut().enumerate() {
                *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
            }
        }
    }
    for (c, (e, o)) in even.iter().zip(&odd).enumerate() {
        e.add(*o).store(&mut out[c * LANES..]);
    }
}

/// `m[j·ld..][..C·LANES] += w[j]·x[..C·LANES]` for every `j` (one fused multiply-add each), `x`
/// held in registers.
#[inline(always)]
pub(super) fn add_outer<V: Lanes8, const C: usize>(w: &[f32], x: &[f32], m: &mut [f32], ld: usize) {
    let xs: [V; C] = std::array::from_fn(|c| V::load(&x[c * LANES..]));
    for (j, &wj) in w.iter().enumerate() {
        let row = &mut m[j * ld..j * ld + C * LANES];
        let wj = V::splat(wj);
        for (c, x) in xs.iter().enumerate() {
            let r = &mut row[c * LANES..];
            wj.mul_add(*x, V::load(r)).store(r);
        }
    }
}

/// `dst[..n] = src[..n]` in copies of [`LANES`] (for `n` a multiple of it): a variable-length
/// `copy_from_slice` is a call to `memcpy`, which on rows of 16 to 64 elements costs more than
/// the copy.
#[inline(always)]
pub(super) fn copy_lanes(src: &[f32], dst: &mut [f32], n: usize) {
    let (dst, _) = dst[..n].as_chunks_mut::<LANES>();
    let (src, _) = src[..n].as_chunks::<LANES>();
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

/// `x[n..] = value`, for `x` a multiple of [`LANES`] long and `n` in its last vector (a lane
/// loop, not a call to `memset`).
#[inline(always)]
pub(super) fn fill_from(x: &mut [f32], n: usize, value: f32) {
    let base = x.len().saturating_sub(LANES);
    if let Some(last) = x.as_chunks_mut::<LANES>().0.last_mut() {
        for (l, v) in last.iter_mut().enumerate() {
            if base + l >= n {
                *v = value;
            }
        }
    }
}

/// The largest of `x` (a multiple of [`LANES`] long), NaNs passed over as `f32::max` does.
#[inline(always)]
pub(super) fn lane_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    for c in x.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    acc.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// The sum of `x` (a multiple of [`LANES`] long) in [`LANES`] running sums, added in order.
#[inline(always)]
pub(super) fn lane_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for c in x.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.into_iter().sum()
}

/// `x` rounded to the working precision (to nearest even) and widened again (exact). BF16 on
/// whole vectors of [`LANES`] ([`Lanes8::round_bf16`]; the scalar loop it replaces was a tenth
/// of the ViT head's backward), a remainder one element at a time.
#[inline(always)]
pub(super) fn round<V: Lanes8>(rounding: Rounding, x: &mut [f32]) {
    match rounding {
        Rounding::F32 => {}
        Rounding::Bf16 => {
            let (vectors, rest) = x.as_chunks_mut::<LANES>();
            for v in vectors {
                V::load(v).round_bf16().store(v);
            }
            for v in rest {
                *v = widen_bf16(narrow_bf16(*v));
            }
        }
        Rounding::F16 => {
            let mut buf = [f16::ZERO; MAX_KEYS];
            let buf = &mut buf[..x.len()];
            f32_to_f16(x, buf);
            f16_to_f32(buf, x);
        }
    }
}
