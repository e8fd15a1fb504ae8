//! CPU helpers shared by the ops' CPU kernels.

use dfdx::prelude::CpuError;

use crate::precision::AmpElem;

/// Elements converted per chunk: 4 KiB of FP32, small enough to stay in L1.
pub(crate) const CHUNK: usize = 1024;

/// Elements per parallel task of an elementwise pass over a buffer: large enough that rayon's
/// overhead is noise, small enough that a 512 × 512 weight splits across two cores.
pub(crate) const TASK: usize = 1 << 15;

/// Calls `f` on consecutive FP32 chunks of a buffer of any precision (FP32 buffers are
/// passed through without a copy).
#[inline]
pub(crate) fn for_each_f32_chunk<E: AmpElem>(src: &[E], mut f: impl FnMut(usize, &[f32])) {
    if let Some(src) = as_f32(src) {
        for (i, chunk) in src.chunks(CHUNK).enumerate() {
            f(i * CHUNK, chunk);
        }
        return;
    }
    let mut tmp = [0f32; CHUNK];
    for (i, chunk) in src.chunks(CHUNK).enumerate() {
        let tmp = &mut tmp[..chunk.len()];
        E::slice_to_f32(chunk, tmp);
        f(i * CHUNK, tmp);
    }
}

/// Applies `f` to FP32 chunks of a buffer of any precision, in place.
#[inline]
pub(crate) fn map_f32_chunks<E: AmpElem>(buf: &mut [E], mut f: impl FnMut(&mut [f32])) {
    if let Some(buf) = as_f32_mut(buf) {
        for chunk in buf.chunks_mut(CHUNK) {
            f(chunk);
        }
        return;
    }
    let mut tmp = [0f32; CHUNK];
    for chunk in buf.chunks_mut(CHUNK) {
        let tmp = &mut tmp[..chunk.len()];
        E::slice_to_f32(chunk, tmp);
        f(tmp);
        E::slice_from_f32(tmp, chunk);
    }
}

/// A new buffer holding `src`, each parallel task's piece copied and then passed to `f` to
/// rewrite in place while it is still in cache: an op's output computed from its input without
/// the zero fill a new buffer would otherwise get first (as long a pass as the output itself).
pub(crate) fn par_new_from<E: AmpElem>(
    src: &[E],
    f: impl Fn(&mut [E]) + Send + Sync,
) -> Result<Vec<E>, CpuError> {
    use rayon::prelude::*;
    let len = src.len();
    let mut out: Vec<E> = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| CpuError::OutOfMemory)?;
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(TASK)
        .zip(src.par_chunks(TASK))
        .for_each(|(dst, src)| f(copied_into(dst, src)));
    // SAFETY: the pieces cover `0..len`, each copied whole above.
    unsafe { out.set_len(len) };
    Ok(out)
}

/// `dst`, a piece of a new buffer, initialised with a copy of `src` (the same length) just
/// before its writer rewrites it: the copy lands in the cache the writer reads it from, and the
/// piece may then be taken as a `[E]`.
pub(crate) fn copied_into<'a, E: AmpElem>(
    dst: &'a mut [std::mem::MaybeUninit<E>],
    src: &[E],
) -> &'a mut [E] {
    assert_eq!(dst.len(), src.len());
    // SAFETY: the lengths match (checked) and `dst`, new memory under a unique borrow, cannot
    // overlap `src`; after the copy every element of `dst` is initialised.
    unsafe {
        let at = dst.as_mut_ptr().cast::<E>();
        std::ptr::copy_nonoverlapping(src.as_ptr(), at, src.len());
        std::slice::from_raw_parts_mut(at, src.len())
    }
}

/// A piece of a new buffer, zeroed by the task about to write it (so the zeros land in its
/// cache, not in a separate pass over memory first), as initialised elements.
pub(crate) fn zeroed<E: AmpElem>(piece: &mut [std::mem::MaybeUninit<E>]) -> &mut [E] {
    // SAFETY: `AmpElem` is sealed to f32, f16 and bf16, for which all-zero bits are +0; after
    // the write every element is initialised, so the piece may be viewed as a `[E]`.
    unsafe {
        let at = piece.as_mut_ptr().cast::<E>();
        std::ptr::write_bytes(at, 0, piece.len());
        std::slice::from_raw_parts_mut(at, piece.len())
    }
}

/// `buf` as a slice of `B` when `A` and `B` are the same type, else `None`: how a generic
/// kernel takes its FP32 fast path without a copy.
#[inline]
pub(crate) fn same_type<A: 'static, B: 'static>(buf: &[A]) -> Option<&[B]> {
    if std::any::TypeId::of::<A>() == std::any::TypeId::of::<B>() {
        // SAFETY: `A` is `B`, so the slice already is a `[B]` of the same length.
        Some(unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<B>(), buf.len()) })
    } else {
        None
    }
}

/// The buffer itself when `E` is `f32`, so FP32 buffers skip the conversion copy.
#[inline]
pub(crate) fn as_f32<E: AmpElem>(buf: &[E]) -> Option<&[f32]> {
    same_type(buf)
}

/// The buffer itself when `E` is `f32`, mutably.
#[inline]
pub(crate) fn as_f32_mut<E: AmpElem>(buf: &mut [E]) -> Option<&mut [f32]> {
    if std::any::TypeId::of::<E>() == std::any::TypeId::of::<f32>() {
        // SAFETY: as in `same_type`; the unique borrow is carried over.
        Some(unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), buf.len()) })
    } else {
        None
    }
}

/// An FP32 buffer as one of `E` when `E` is `f32` (the reverse of [`as_f32`]), so that an FP32
/// tile serves as the working precision's copy of itself.
#[inline]
pub(crate) fn f32_as<E: AmpElem>(buf: &[f32]) -> Option<&[E]> {
    same_type(buf)
}

/// The stats slot `slot`, or an error if the buffer has no such slot.
pub(crate) fn slot_of(stats: &mut [f32], slot: usize) -> Result<&mut f32, CpuError> {
    stats.get_mut(slot).ok_or(CpuError::WrongNumElements)
}

/// Buffers are paired by typed-amp itself; a length mismatch is a bug, reported rather than
/// read out of bounds.
pub(crate) fn check_lengths(src: usize, dst: usize) -> Result<(), CpuError> {
    if src == dst {
        Ok(())
    } else {
        Err(CpuError::WrongNumElements)
    }
}
