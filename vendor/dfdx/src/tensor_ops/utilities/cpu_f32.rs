//! typed-amp patch: helpers for CPU kernels that compute in `f32` whatever the element type.
//!
//! The convolution, pooling and batch-norm CPU kernels are written once, on `f32` slices. For
//! `E = f32` they run on the tensors' own buffers ([as_f32], [as_f32_mut]); for 16-bit types
//! (`f16`, `AMP<f16>`, `bf16`) they convert a block of values to `f32` with one vectorised slice
//! conversion ([to_f32]), compute, and convert back ([from_f32], [add_from_f32]), instead of
//! rounding after every arithmetic operation as `half`'s scalar operators do. Other types go
//! through `num_traits` one element at a time (correct, not fast).
//!
//! Also: a rayon `for_each` over chunks that runs serially without the `cpu` feature, and a
//! `Send` raw pointer for kernels whose parallel tasks write disjoint parts of one buffer.

use crate::shapes::Dtype;
use std::any::TypeId;

/// Elements per block when a kernel converts a slice to `f32` piece by piece on the stack.
pub(crate) const BLOCK: usize = 1024;

#[inline(always)]
fn is<A: 'static, B: 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

/// `s` itself when `E` is `f32`.
#[inline(always)]
pub(crate) fn as_f32<E: Dtype>(s: &[E]) -> Option<&[f32]> {
    if is::<E, f32>() {
        // SAFETY: E is f32.
        Some(unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) })
    } else {
        None
    }
}

/// `s` itself when `E` is `f32`.
#[inline(always)]
pub(crate) fn as_f32_mut<E: Dtype>(s: &mut [E]) -> Option<&mut [f32]> {
    if is::<E, f32>() {
        // SAFETY: E is f32.
        Some(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut f32, s.len()) })
    } else {
        None
    }
}

/// The 16-bit float formats `half` converts in bulk, and the types stored as them.
enum Half {
    F16,
    Bf16,
    Other,
}

#[inline(always)]
fn half_kind<E: 'static>() -> Half {
    #[cfg(feature = "f16")]
    {
        if is::<E, half::f16>() || is::<E, crate::dtypes::AMP<half::f16>>() {
            return Half::F16;
        }
        if is::<E, half::bf16>() || is::<E, crate::dtypes::AMP<half::bf16>>() {
            return Half::Bf16;
        }
    }
    Half::Other
}

/// `dst[i] = src[i] as f32`. Same lengths.
#[inline]
pub(crate) fn to_f32<E: Dtype>(src: &[E], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    if let Some(s) = as_f32(src) {
        dst.copy_from_slice(s);
        return;
    }
    // typed-amp patch: 16-bit conversions go through typed-amp-kernels' one conversion layer
    // (vectorised for the CPU it runs on, one NaN rule for every path).
    #[cfg(feature = "f16")]
    match half_kind::<E>() {
        Half::F16 => {
            // SAFETY: E is f16 or AMP<f16> (repr(transparent)).
            let s =
                unsafe { std::slice::from_raw_parts(src.as_ptr() as *const half::f16, src.len()) };
            #[cfg(feature = "cpu")]
            return typed_amp_kernels::convert::f16_to_f32(s, dst);
            #[cfg(not(feature = "cpu"))]
            return half::slice::HalfFloatSliceExt::convert_to_f32_slice(s, dst);
        }
        Half::Bf16 => {
            // SAFETY: E is bf16 or AMP<bf16> (repr(transparent)).
            let s =
                unsafe { std::slice::from_raw_parts(src.as_ptr() as *const half::bf16, src.len()) };
            #[cfg(feature = "cpu")]
            return typed_amp_kernels::convert::bf16_to_f32(s, dst);
            #[cfg(not(feature = "cpu"))]
            return half::slice::HalfFloatSliceExt::convert_to_f32_slice(s, dst);
        }
        Half::Other => {}
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32().unwrap();
    }
}

/// `dst[i] = src[i]` rounded to `E`. Same lengths.
#[inline]
pub(crate) fn from_f32<E: Dtype>(src: &[f32], dst: &mut [E]) {
    debug_assert_eq!(src.len(), dst.len());
    if let Some(d) = as_f32_mut(dst) {
        d.copy_from_slice(src);
        return;
    }
    // typed-amp patch: see `to_f32`.
    #[cfg(feature = "f16")]
    match half_kind::<E>() {
        Half::F16 => {
            // SAFETY: E is f16 or AMP<f16> (repr(transparent)).
            let d = unsafe {
                std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut half::f16, dst.len())
            };
            #[cfg(feature = "cpu")]
            return typed_amp_kernels::convert::f32_to_f16(src, d);
            #[cfg(not(feature = "cpu"))]
            return half::slice::HalfFloatSliceExt::convert_from_f32_slice(d, src);
        }
        Half::Bf16 => {
            // SAFETY: E is bf16 or AMP<bf16> (repr(transparent)).
            let d = unsafe {
                std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut half::bf16, dst.len())
            };
            #[cfg(feature = "cpu")]
            return typed_amp_kernels::convert::f32_to_bf16(src, d);
            #[cfg(not(feature = "cpu"))]
            return half::slice::HalfFloatSliceExt::convert_from_f32_slice(d, src);
        }
        Half::Other => {}
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = E::from_f32(*s).unwrap();
    }
}

/// `dst[i] += src[i]`, the sum computed in `f32` and rounded once to `E`. Same lengths.
#[inline]
pub(crate) fn add_from_f32<E: Dtype>(src: &[f32], dst: &mut [E]) {
    debug_assert_eq!(src.len(), dst.len());
    if let Some(d) = as_f32_mut(dst) {
        for (d, s) in d.iter_mut().zip(src) {
            *d += *s;
        }
        return;
    }
    let mut buf = [0.0f32; BLOCK];
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let b = &mut buf[..d.len()];
        to_f32(d, b);
        for (b, s) in b.iter_mut().zip(s) {
            *b += *s;
        }
        from_f32(b, d);
    }
}

/// Calls `f(i, chunk)` for each `chunk_len`-element chunk of `data` (the last may be shorter),
/// in parallel on rayon's pool with the `cpu` feature.
#[inline]
pub(crate) fn par_chunks_mut<T: Send, F>(data: &mut [T], chunk_len: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Send + Sync,
{
    let chunk_len = chunk_len.max(1);
    #[cfg(feature = "cpu")]
    {
        use rayon::prelude::*;
        data.par_chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
    #[cfg(not(feature = "cpu"))]
    for (i, c) in data.chunks_mut(chunk_len).enumerate() {
        f(i, c);
    }
}

/// Elements an elementwise kernel's parallel piece covers at least: below twice this a kernel
/// runs on the calling thread, where handing pieces to the pool would cost more than it saves.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 15;

/// Calls `f(offset, piece)` for pieces of `data` that cover it in order: one piece, on the
/// calling thread, below `2 · PAR_MIN_ELEMS` elements; else pieces of at least
/// [PAR_MIN_ELEMS] elements (whole multiples of `unit`, the last may be shorter), in parallel
/// on rayon's pool with the `cpu` feature. For elementwise work, whose results do not depend on
/// how it is split.
#[inline]
pub(crate) fn par_elementwise<T: Send, F>(data: &mut [T], unit: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Send + Sync,
{
    let n = data.len();
    let unit = unit.max(1);
    if n < 2 * PAR_MIN_ELEMS || n < 2 * unit {
        f(0, data);
        return;
    }
    let chunk = n.div_ceil(pieces(n / PAR_MIN_ELEMS)).div_ceil(unit) * unit;
    par_chunks_mut(data, chunk, |i, c| f(i * chunk, c));
}

/// Calls `f(i)` for `i` in `0..n`, in parallel on rayon's pool with the `cpu` feature.
#[inline]
pub(crate) fn par_for<F>(n: usize, f: F)
where
    F: Fn(usize) + Send + Sync,
{
    #[cfg(feature = "cpu")]
    {
        use rayon::prelude::*;
        (0..n).into_par_iter().for_each(f);
    }
    #[cfg(not(feature = "cpu"))]
    for i in 0..n {
        f(i);
    }
}

/// How many pieces to split `n` independent items into for parallel work: enough for the pool
/// to balance load on a shared machine, and fixed by `n` alone (not by the thread count) so that
/// results summed piece by piece are the same on every machine.
#[inline]
pub(crate) fn pieces(n: usize) -> usize {
    n.clamp(1, 16)
}

/// A raw pointer that parallel tasks may share, each writing a disjoint part of the buffer.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: users guarantee that tasks access disjoint elements.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

/// Whether `E` is stored as a 16-bit float that [to_f32] and [from_f32] convert in bulk.
#[inline(always)]
pub(crate) fn is_half<E: 'static>() -> bool {
    !matches!(half_kind::<E>(), Half::Other)
}

/// typed-amp patch: whether `E` is `f32`.
pub(crate) fn is_f32<E: 'static>() -> bool {
    is::<E, f32>()
}

/// Reads `dst.len()` values of `src`, starting at `off` and `step` apart, as `f32`.
#[inline]
pub(crate) fn load_f32<E: Dtype>(src: &[E], off: usize, step: usize, dst: &mut [f32]) {
    match step {
        0 => dst.fill(src[off].to_f32().unwrap()),
        1 => to_f32(&src[off..off + dst.len()], dst),
        _ => {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = src[off + j * step].to_f32().unwrap();
            }
        }
    }
}

std::thread_local! {
    /// Per-thread scratch memory that kernels reuse from call to call (see [with_scratch]).
    static SCRATCH: std::cell::Cell<Vec<u64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with scratch slices of `A` (of lengths `a`) and of `B` (of lengths `b`), carved
/// from this thread's reusable scratch memory, so that kernels neither allocate nor zero their
/// buffers on every call. The slices hold arbitrary earlier values: callers write before they
/// read. Re-entrant: a nested call (rayon may run another task on this thread while `f` waits
/// in a parallel GEMM) finds the memory taken and uses a fresh allocation.
pub(crate) fn with_scratch<A: Dtype, B: Dtype, R, const N: usize, const M: usize>(
    a: [usize; N],
    b: [usize; M],
    f: impl FnOnce([&mut [A]; N], [&mut [B]; M]) -> R,
) -> R {
    // SAFETY (below): Dtypes are plain numbers (valid for any bit pattern) of at most 8 bytes
    // and alignment at most 8; the u64 buffer is aligned to 8.
    fn check<T>() -> usize {
        assert!(std::mem::align_of::<T>() <= 8 && std::mem::size_of::<T>() <= 8);
        std::mem::size_of::<T>()
    }
    let (sa, sb) = (check::<A>(), check::<B>());
    // Each slice starts on a 64-byte boundary (8 u64s).
    let words = |len: usize, size: usize| (len * size).div_ceil(64) * 8;
    let total: usize = a.iter().map(|l| words(*l, sa)).sum::<usize>()
        + b.iter().map(|l| words(*l, sb)).sum::<usize>();
    let mut buf = SCRATCH.with(|s| s.take());
    if buf.len() < total {
        buf = std::vec![0u64; total];
    }
    let r = {
        let mut rest: &mut [u64] = &mut buf[..total];
        let mut carve = |len: usize, size: usize| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(words(len, size));
            rest = tail;
            head.as_mut_ptr()
        };
        let pa: [*mut u64; N] = std::array::from_fn(|i| carve(a[i], sa));
        let pb: [*mut u64; M] = std::array::from_fn(|i| carve(b[i], sb));
        let sa_: [&mut [A]; N] = std::array::from_fn(|i| unsafe {
            std::slice::from_raw_parts_mut(pa[i] as *mut A, a[i])
        });
        let sb_: [&mut [B]; M] = std::array::from_fn(|i| unsafe {
            std::slice::from_raw_parts_mut(pb[i] as *mut B, b[i])
        });
        f(sa_, sb_)
    };
    SCRATCH.with(|s| {
        let old = s.take();
        s.set(if old.len() > buf.len() { old } else { buf });
    });
    r
}

#[cfg(all(test, feature = "f16"))]
mod tests {
    use super::*;

    /// The bulk conversions give `half`'s scalar conversions bit for bit: every f16 to f32, and
    /// f32 values around every f16 (ties included), infinities and NaNs back to f16.
    #[test]
    fn bulk_conversions_match_half() {
        let all: std::vec::Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
        let mut wide = std::vec![0.0f32; all.len()];
        to_f32(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert_eq!(h.to_f32().to_bits(), w.to_bits(), "{h:?}");
        }
        let mut probes = std::vec::Vec::new();
        for w in wide.iter().filter(|w| w.is_finite()) {
            let b = w.to_bits();
            probes.extend([*w, f32::from_bits(b + 1), f32::from_bits(b.wrapping_sub(1))]);
            probes.push(*w * (1.0 + 1.0 / 2048.0)); // about half an f16 ulp up: near a tie
        }
        probes.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-30,
            -1e-30,
            7e4,
            -7e4,
        ]);
        let mut narrow = std::vec![half::f16::ZERO; probes.len()];
        from_f32(&probes, &mut narrow);
        for (p, n) in probes.iter().zip(&narrow) {
            let want = half::f16::from_f32(*p);
            if p.is_nan() {
                assert!(n.is_nan());
            } else {
                assert_eq!(want.to_bits(), n.to_bits(), "{p:e}");
            }
        }
    }
}
