//! The fused attention's short heads on the CPU (at most [`MAX_KEYS`] tokens, heads at most
//! [`MAX_HEAD_DIM`] wide: the ViT's and the small GPT's): `typed_amp_kernels::attention`'s row
//! loops instead of the blocked kernel's products on the GEMM, whose packing and calls cost
//! several times the arithmetic of products this small.
//!
//! The kernels read each head's Q, K, V (and `y`, `dy`) where they lie in the sequence's rows
//! and write its results there too, when a head's width is a whole number of the kernels'
//! vectors (the ViT's 16, the small GPT's 32; no copies); other widths are gathered into and
//! scattered from buffers of their own. 16-bit operands are widened to FP32 in one conversion
//! a sequence first, and the FP32 results rounded once at the end.
//!
//! [`MAX_KEYS`]: typed_amp_kernels::attention::MAX_KEYS
//! [`MAX_HEAD_DIM`]: typed_amp_kernels::attention::MAX_HEAD_DIM

use typed_amp_kernels::attention::{
    short_head_backward, short_head_forward, HeadGradsMut, HeadRows, ShortHead, ShortHeadScratch,
};

use std::cell::RefCell;

use super::AttentionDims;
use crate::device::utilities::cpu::{as_f32, as_f32_mut};
use crate::precision::AmpElem;

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

/// A thread's buffers: a sequence's 16-bit operands and results in FP32 (`wide`, `out`), and,
/// for heads whose width is not a whole number of vectors, one head's matrices as the kernels
/// take them (`tokens × stride` each). Kept per thread between calls, as the GEMM keeps its
/// packing buffers: allocated per rayon job, the small GPT's (about 100 KiB a sequence, above
/// glibc's first mmap threshold) were given back to the system and faulted in again on every
/// pass where the application had not called
/// [`keep_freed_memory`](crate::device::keep_freed_memory).
#[derive(Default)]
struct ShortScratch {
    /// `[qkv, y, dy]` of one sequence, widened (unused when the operands are FP32 already).
    wide: [Vec<f32>; 3],
    /// The sequence's output (forward) or its `[q | k | v]` gradient rows (backward) in FP32,
    /// rounded once at the end (unused when they are written in place).
    out: Vec<f32>,
    /// One head's `[q, k, v, y, dy]`, gathered.
    head: [Vec<f32>; 5],
    /// One head's output (forward) or `[dq | dk | dv]` rows (backward), to be scattered.
    results: Vec<f32>,
    kernels: ShortHeadScratch,
}

thread_local! {
    static SCRATCH: RefCell<ShortScratch> = RefCell::new(ShortScratch::default());
}

/// Runs `f` on this thread's buffers.
fn with_scratch<R>(f: impl FnOnce(&mut ShortScratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut sc) => f(&mut sc),
        // Only if a kernel were re-entered on this thread; stay correct regardless.
        Err(_) => f(&mut ShortScratch::default()),
    })
}

/// `src` as FP32: itself, or widened into `buf` (one conversion for the sequence).
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

/// Whether the kernels read and write `h`'s heads where they lie: a head's rows are whole
/// vectors (its `stride` elements are its own columns).
fn in_place(h: &ShortHead) -> bool {
    h.stride() == h.head_dim
}

/// One head's matrix for the kernels: in the sequence's rows (`row` apart, from column `at`)
/// where [`in_place`], else gathered into `buf`.
fn head_rows<'a>(
    h: &ShortHead,
    src: &'a [f32],
    (row, at): (usize, usize),
    buf: &'a mut Vec<f32>,
) -> HeadRows<'a> {
    if in_place(h) {
        return HeadRows {
            data: &src[at..],
            ld: row,
        };
    }
    buf.resize(h.matrix_len(), 0.0);
    for (i, out) in buf.chunks_exact_mut(h.stride()).enumerate() {
        out[..h.head_dim].copy_from_slice(&src[i * row + at..i * row + at + h.head_dim]);
    }
    HeadRows {
        data: buf,
        ld: h.stride(),
    }
}

/// Copies `src`'s rows (`ld` apart, from `from`) into the head's columns of `dst` (rows `row`
/// apart, from `at`).
fn scatter(
    h: &ShortHead,
    (src, ld, from): (&[f32], usize, usize),
    (row, at): (usize, usize),
    dst: &mut [f32],
) {
    for i in 0..h.tokens {
        dst[i * row + at..i * row + at + h.head_dim]
            .copy_from_slice(&src[i * ld + from..i * ld + from + h.head_dim]);
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
    with_scratch(|sc| forward_with(d, h, qkv, y, lse, sc));
}

fn forward_with<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    qkv: &[E],
    y: &mut [E],
    lse: &mut [f32],
    sc: &mut ShortScratch,
) {
    let (width, st) = (d.width(), h.stride());
    let [wide_qkv, ..] = &mut sc.wide;
    let src = wide(qkv, wide_qkv);
    let [q, k, v, ..] = &mut sc.head;
    // FP32 rows are written in place; 16-bit ones in `out` and rounded once.
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
        let operands = [
            head_rows(h, src, (3 * width, at), q),
            head_rows(h, src, (3 * width, width + at), k),
            head_rows(h, src, (3 * width, 2 * width + at), v),
        ];
        if in_place(h) {
            let o = (&mut out[at..], width);
            short_head_forward(h, operands, o, lse, &mut sc.kernels);
        } else {
            sc.results.resize(h.matrix_len(), 0.0);
            let o = (&mut sc.results[..], st);
            short_head_forward(h, operands, o, lse, &mut sc.kernels);
            scatter(h, (&sc.results, st, 0), (width, at), out);
        }
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
    with_scratch(|sc| backward_with(d, h, operands, lse, dqkv, sc));
}

fn backward_with<E: AmpElem>(
    d: &AttentionDims,
    h: &ShortHead,
    (qkv, y, dy): (&[E], &[E], &[E]),
    lse: &[f32],
    (dqkv, accumulate): (&mut [E], bool),
    sc: &mut ShortScratch,
) {
    let (width, st) = (d.width(), h.stride());
    let [wide_qkv, wide_y, wide_dy] = &mut sc.wide;
    let (qkv, y, dy) = (wide(qkv, wide_qkv), wide(y, wide_y), wide(dy, wide_dy));
    // FP32 gradients are written in place unless added to; otherwise they go to `out` first,
    // and each element is added to and rounded once after the heads.
    let direct = as_f32_mut(dqkv).filter(|_| !accumulate);
    let out: &mut [f32] = match direct {
        Some(dqkv) => dqkv,
        None => {
            sc.out.resize(dqkv.len(), 0.0);
            &mut sc.out
        }
    };
    let [q, k, v, yh, dyh] = &mut sc.head;
    for (head, lse) in lse.chunks(d.tokens).enumerate() {
        let at = head * d.head_dim;
        let parts = [at, width + at, 2 * width + at];
        let operands = [
            head_rows(h, qkv, (3 * width, parts[0]), q),
            head_rows(h, qkv, (3 * width, parts[1]), k),
            head_rows(h, qkv, (3 * width, parts[2]), v),
        ];
        let outputs = [
            head_rows(h, y, (width, at), yh),
            head_rows(h, dy, (width, at), dyh),
        ];
        if in_place(h) {
            let grads = HeadGradsMut {
                data: &mut *out,
                ld: 3 * width,
                at: parts,
            };
            short_head_backward(h, operands, outputs, lse, grads, &mut sc.kernels);
        } else {
            sc.results.resize(3 * h.matrix_len(), 0.0);
            let grads = HeadGradsMut {
                data: &mut sc.results,
                ld: 3 * st,
                at: [0, st, 2 * st],
            };
            short_head_backward(h, operands, outputs, lse, grads, &mut sc.kernels);
            for (g, part) in parts.into_iter().enumerate() {
                scatter(h, (&sc.results, 3 * st, g * st), (3 * width, part), out);
            }
        }
    }
    match as_f32_mut(dqkv) {
        Some(dqkv) if accumulate => dqkv.iter_mut().zip(&sc.out).for_each(|(o, g)| *o += g),
        Some(_) => {}
        None => {
            if accumulate {
                let old = dqkv.iter().map(|&x| AmpElem::to_f32(x));
                sc.out.iter_mut().zip(old).for_each(|(g, o)| *g += o);
            }
            E::slice_from_f32(&sc.out, dqkv);
        }
    }
}
