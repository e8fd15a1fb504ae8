//! The fused attention's short heads on the CPU (at most [`MAX_KEYS`] tokens, heads at most
//! [`MAX_HEAD_DIM`] wide: the ViT's and the small GPT's): `typed_amp_kernels::attention`'s row
//! loops instead of the blocked kernel's products on the GEMM, whose packing and calls cost
//! several times the arithmetic of products this small.
//!
//! Each head's columns are copied out of the sequence's operands for the kernels, widened on the
//! way where the operands are bf16 (a shift, inline in the copy); f16 operands are widened to
//! FP32 in one conversion first (F16C's, through a call: not per head and row, as a ViT head's
//! rows are 16 elements and a call per row cost more than its attention). The results are
//! gathered back into a sequence-wide FP32 buffer that is rounded once.
//!
//! [`MAX_KEYS`]: typed_amp_kernels::attention::MAX_KEYS
//! [`MAX_HEAD_DIM`]: typed_amp_kernels::attention::MAX_HEAD_DIM

use typed_amp_kernels::attention::{
    short_head_backward, short_head_forward, Rounding, ShortHead, ShortHeadScratch,
};

use std::cell::RefCell;

use super::AttentionDims;
use crate::device::utilities::cpu::{as_f32, as_f32_mut};
use crate::precision::{dtype_of, AmpElem, DType};

/// The short-head kernels' sizes for `d`, if its heads fit them.
pub(super) fn short_head(d: &AttentionDims) -> Option<ShortHead> {
    let h = ShortHead {
        tokens: d.tokens,
        head_dim: d.head_dim,
        causal: d.causal,
        scale: d.scale(),
    };
    h.fits().then_some(h)
}

/// What the probabilities are rounded to for operands of `E`.
fn rounding<E: AmpElem>() -> Rounding {
    match dtype_of::<E>() {
        DType::F16 => Rounding::F16,
        DType::BF16 => Rounding::Bf16,
        DType::F32 => Rounding::F32,
    }
}

/// A thread's buffers: a sequence's 16-bit operands and results in FP32 (`wide`, `out`), and
/// one head's matrices as the kernels take them (`tokens × stride` each). Kept per thread
/// between calls, as the GEMM keeps its packing buffers: allocated per rayon job, the small
/// GPT's (about 100 KiB a sequence, above glibc's first mmap threshold) were given back to the
/// system and faulted in again on every pass where the application had not called
/// [`keep_freed_memory`](crate::device::keep_freed_memory).
#[derive(Default)]
struct ShortScratch {
    /// `[qkv, y, dy]` of one sequence, widened (unused when the operands are FP32 already).
    wide: [Vec<f32>; 3],
    /// The sequence's output (forward) or its `[q | k | v]` gradient rows (backward) in FP32,
    /// rounded once at the end (unused when they are FP32 already).
    out: Vec<f32>,
    /// One head's `[q, k, v, y, dy]`.
    head: [Vec<f32>; 5],
    /// One head's `[o]` (forward) or `[dq, dk, dv]` (backward).
    results: [Vec<f32>; 3],
    kernels: ShortHeadScratch,
}

impl ShortScratch {
    /// The head buffers sized for `h` (their contents are overwritten before use).
    fn sized(&mut self, h: &ShortHead) -> &mut Self {
        let len = h.matrix_len();
        for buf in self.head.iter_mut().chain(self.results.iter_mut()) {
            buf.resize(len, 0.0);
        }
        self
    }
}

thread_local! {
    static SCRATCH: RefCell<ShortScratch> = RefCell::new(ShortScratch::default());
}

/// Runs `f` on this thread's buffers, sized for `h`.
fn with_scratch<R>(h: &ShortHead, f: impl FnOnce(&mut ShortScratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut sc) => f(sc.sized(h)),
        // Only if a kernel were re-entered on this thread; stay correct regardless.
        Err(_) => f(ShortScratch::default().sized(h)),
    })
}

/// `src` as FP32: itself, or widened into `buf`.
fn wide<'a, E: AmpElem>(src: &'a [E], buf: &'a mut Vec<f32>) -> &'a [f32] {
    match as_f32(src) {
        Some(same) => same,
        None => {
            buf.resize(src.len(), 0.0);
            E::slice_to_f32(src, buf);
            buf
        }
    }
}

/// A sequence's operand as the head gathers read it: where it lies (FP32, or bf16, widened
/// element by element as it is gathered), or widened whole into a buffer first (f16).
enum Operand<'a, E> {
    Lies(&'a [E]),
    Wide(&'a [f32]),
}

/// `src` as the gathers read it, widened into `buf` only for f16. bf16 used to be widened whole
/// too, a pass over the sequence's operands before the gathers read them again (2.7% of the
/// ViT's O2-BF16 samples in `perf`, session 52).
fn operand<'a, E: AmpElem>(src: &'a [E], buf: &'a mut Vec<f32>) -> Operand<'a, E> {
    match dtype_of::<E>() {
        DType::BF16 => Operand::Lies(src),
        DType::F16 | DType::F32 => Operand::Wide(wide(src, buf)),
    }
}

/// [`gather`] from an operand however it is held.
fn gather_operand<E: AmpElem>(
    h: &ShortHead,
    src: &Operand<'_, E>,
    (row, at): (usize, usize),
    dst: &mut [f32],
) {
    match src {
        Operand::Wide(src) => gather(h, src, (row, at), dst),
        Operand::Lies(src) => {
            for (i, out) in dst.chunks_exact_mut(h.stride()).enumerate() {
                let from = &src[i * row + at..i * row + at + h.head_dim];
                out[..h.head_dim]
                    .iter_mut()
                    .zip(from)
                    .for_each(|(o, &x)| *o = AmpElem::to_f32(x));
            }
        }
    }
}

/// `dst = src` in copies of eight: `copy_from_slice` of a row's 16 to 64 elements is a call to
/// `memcpy`, which costs more than the copy.
#[inline(always)]
fn copy_row(src: &[f32], dst: &mut [f32]) {
    let (d8, dst_tail) = dst.as_chunks_mut::<8>();
    let (s8, src_tail) = src.as_chunks::<8>();
    for (d, s) in d8.iter_mut().zip(s8) {
        *d = *s;
    }
    for (d, s) in dst_tail.iter_mut().zip(src_tail) {
        *d = *s;
    }
}

/// Copies the head's columns (`at..at + head_dim` of rows `row` apart) into `dst`'s rows.
fn gather(h: &ShortHead, src: &[f32], (row, at): (usize, usize), dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(h.stride()).enumerate() {
        copy_row(
            &src[i * row + at..i * row + at + h.head_dim],
            &mut out[..h.head_dim],
        );
    }
}

/// Copies `src`'s rows into the head's columns of `dst` (rows `row` apart, from `at`).
fn scatter(h: &ShortHead, src: &[f32], (row, at): (usize, usize), dst: &mut [f32]) {
    for (i, s) in src.chunks_exact(h.stride()).enumerate() {
        copy_row(
            &s[..h.head_dim],
            &mut dst[i * row + at..i * row + at + h.head_dim],
        );
    }
}

/// One sequence's forward: `qkv` (`tokens × 3·width`) in, `y` (`tokens × width`) out, rounded
/// once, and the log-sum-exps `lse` (`heads × tokens`).
pub(super) fn forward_sequence<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    qkv: &[E],
    y: &mut [E],
    lse: &mut [f32],
) {
    with_scratch(h, |sc| forward_with(d, h, qkv, y, lse, sc));
}

fn forward_with<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    qkv: &[E],
    y: &mut [E],
    lse: &mut [f32],
    sc: &mut ShortScratch,
) {
    let width = d.width();
    let [wide_qkv, ..] = &mut sc.wide;
    let src = operand(qkv, wide_qkv);
    let [q, k, v, ..] = &mut sc.head;
    let [o, ..] = &mut sc.results;
    // FP32 rows are written in place; 16-bit ones gathered in `out` and rounded once.
    let narrow = as_f32_mut(y).is_none();
    let out: &mut [f32] = match as_f32_mut(y) {
        Some(y) => y,
        None => {
            sc.out.resize(y.len(), 0.0);
            &mut sc.out
        }
    };
    for (head, lse) in lse.chunks_mut(d.tokens).enumerate() {
        let at = head * d.head_dim;
        gather_operand(h, &src, (3 * width, at), q);
        gather_operand(h, &src, (3 * width, width + at), k);
        gather_operand(h, &src, (3 * width, 2 * width + at), v);
        short_head_forward(h, rounding::<E>(), [q, k, v], o, lse, &mut sc.kernels);
        scatter(h, o, (width, at), out);
    }
    if narrow {
        E::slice_from_f32(&sc.out, y);
    }
}

/// One sequence's backward: the gradient of `qkv` from the output `y`, its gradient `dy` and
/// the forward's `lse`, written into `dqkv` or added to it (`accumulate`), rounded once.
pub(super) fn backward_sequence<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    operands: (&[E], &[E], &[E]),
    lse: &[f32],
    dqkv: (&mut [E], bool),
) {
    with_scratch(h, |sc| backward_with(d, h, operands, lse, dqkv, sc));
}

fn backward_with<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    (qkv, y, dy): (&[E], &[E], &[E]),
    lse: &[f32],
    (dqkv, accumulate): (&mut [E], bool),
    sc: &mut ShortScratch,
) {
    let width = d.width();
    let [wide_qkv, wide_y, wide_dy] = &mut sc.wide;
    let (qkv, y, dy) = (
        operand(qkv, wide_qkv),
        operand(y, wide_y),
        operand(dy, wide_dy),
    );
    // FP32 gradient rows are written (or added to) in place; 16-bit ones start in `out` as the
    // old values (when adding to them), so that each element is rounded once, after its one
    // addition.
    let narrow = as_f32_mut(dqkv).is_none();
    let out: &mut [f32] = match as_f32_mut(dqkv) {
        Some(dqkv) => dqkv,
        None => {
            sc.out.resize(dqkv.len(), 0.0);
            if accumulate {
                E::slice_to_f32(dqkv, &mut sc.out);
            }
            &mut sc.out
        }
    };
    let [q, k, v, yh, dyh] = &mut sc.head;
    let [dq, dk, dv] = &mut sc.results;
    for (head, lse) in lse.chunks(d.tokens).enumerate() {
        let at = head * d.head_dim;
        let parts = [at, width + at, 2 * width + at];
        for (buf, at) in [&mut *q, &mut *k, &mut *v].into_iter().zip(parts) {
            gather_operand(h, &qkv, (3 * width, at), buf);
        }
        gather_operand(h, &y, (width, at), yh);
        gather_operand(h, &dy, (width, at), dyh);
        short_head_backward(
            h,
            rounding::<E>(),
            [q, k, v],
            [yh, dyh],
            lse,
            [dq, dk, dv],
            &mut sc.kernels,
        );
        for (grad, at) in [&*dq, &*dk, &*dv].into_iter().zip(parts) {
            if accumulate {
                add_into(h, grad, (3 * width, at), out);
            } else {
                scatter(h, grad, (3 * width, at), out);
            }
        }
    }
    if narrow {
        E::slice_from_f32(&sc.out, dqkv);
    }
}

/// Adds `src`'s rows to the head's columns of `dst` (rows `row` apart, from `at`).
fn add_into(h: &ShortHead, src: &[f32], (row, at): (usize, usize), dst: &mut [f32]) {
    for (i, s) in src.chunks_exact(h.stride()).enumerate() {
        let out = &mut dst[i * row + at..i * row + at + h.head_dim];
        out.iter_mut().zip(s).for_each(|(o, s)| *o += s);
    }
}
