//! The blocked attention's online-softmax passes (`block_softmax`: [`shift_block`],
//! [`finish_block`], [`probabilities_block`], [`score_grads_block`]), and the rest of this
//! module: one short head's attention in FP32, forward and backward: at most [`MAX_KEYS`] tokens, so a
//! query row's scores fit in a few vectors and its softmax is exact in one pass (no key blocks,
//! no online rescaling), and the head's operands sit in L1 for all of its rows.
//!
//! Why a kernel apart from the blocked one (`typed_amp`'s CPU attention, FlashAttention's
//! blocks on the GEMM): its products on such heads are tiny (the ViT's 17 tokens × 16 columns,
//! the small GPT's 64 × 32), and packing each operand plus the GEMM's calls cost several times
//! their arithmetic: 13–25 GFLOP/s in `cargo bench --bench attention` on Zen 3 before these
//! kernels (BENCHMARKS.md, session 45), where the GEMM itself runs at 160. Here every product
//! is a loop over vectors of [`LANES`] keys (or head columns) with its sums in registers, on
//! AVX2 and FMA where the CPU has them, else on plain arrays; every multiply-add is fused, so
//! the bits do not depend on the CPU.
//!
//! The arithmetic is the blocked kernel's: scores `q·k` as `head_dim`-term sums in order,
//! scaled, the row's maximum subtracted, [`exp_f32`](crate::math::exp_f32); the probabilities
//! (forward and `dv`) and the scores' gradient (`dq`, `dk`) rounded once to the working
//! precision ([`Rounding`]) before their products, as FlashAttention rounds them; only the order
//! of a row's sum of probabilities and of the products' sums over keys differ.
//!
//! Layout: every `tokens × head_dim` matrix is row-major, its rows [`ShortHead::stride`] apart
//! (the head width rounded up to [`LANES`]). The lanes past `head_dim` of an input never reach
//! an output's first `head_dim` columns; those of an output are unspecified.

mod block_softmax;
mod head;
mod lanes;
mod passes;
mod row_ops;

pub use block_softmax::{finish_block, probabilities_block, score_grads_block, shift_block};
pub use head::{Rounding, ShortHead, LANES, MAX_HEAD_DIM, MAX_KEYS};

use lanes::run_rows;
use passes::{Backward, Forward};

/// Transposed copies of a head's keys (and, for the backward, values), kept between calls so
/// that a loop over heads allocates once.
#[derive(Debug, Default)]
pub struct ShortHeadScratch {
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl ShortHeadScratch {
    /// Empty buffers, grown on first use.
    pub fn new() -> Self {
        Self::default()
    }
}

/// `y = softmax(q·kᵀ·scale + mask)·v` for one head, into `o` (FP32, `tokens × stride`), and
/// each query row's log-sum-exp into `lse` (`tokens`), from `[q, k, v]` (`tokens × stride`
/// each).
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits) or a buffer has another length.
pub fn short_head_forward(
    h: &ShortHead,
    rounding: Rounding,
    [q, k, v]: [&[f32]; 3],
    o: &mut [f32],
    lse: &mut [f32],
    scratch: &mut ShortHeadScratch,
) {
    h.check(&[q.len(), k.len(), v.len(), o.len()], lse.len());
    transpose(h, k, &mut scratch.kt);
    run_rows(Forward {
        h: *h,
        rounding,
        q,
        kt: &scratch.kt,
        v,
        o,
        lse,
    });
}

/// The gradients of one head's `[q, k, v]` into `[dq, dk, dv]` (FP32, `tokens × stride` each,
/// overwritten) from the forward's output `y`, the output's gradient `dy` and the forward's
/// log-sum-exps `lse`; the probabilities are recomputed.
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits) or a buffer has another length.
pub fn short_head_backward(
    h: &ShortHead,
    rounding: Rounding,
    [q, k, v]: [&[f32]; 3],
    [y, dy]: [&[f32]; 2],
    lse: &[f32],
    [dq, dk, dv]: [&mut [f32]; 3],
    scratch: &mut ShortHeadScratch,
) {
    h.check(
        &[
            q.len(),
            k.len(),
            v.len(),
            y.len(),
            dy.len(),
            dq.len(),
            dk.len(),
            dv.len(),
        ],
        lse.len(),
    );
    transpose(h, k, &mut scratch.kt);
    transpose(h, v, &mut scratch.vt);
    run_rows(Backward {
        h: *h,
        rounding,
        q,
        k,
        kt: &scratch.kt,
        vt: &scratch.vt,
        y,
        dy,
        lse,
        dq,
        dk,
        dv,
    });
}

/// `out[d·padded_keys + j] = m[j·stride + d]`, the keys past `tokens` zero.
fn transpose(h: &ShortHead, m: &[f32], out: &mut Vec<f32>) {
    let (st, kp) = (h.stride(), h.padded_keys());
    out.clear();
    out.resize(h.head_dim * kp, 0.0);
    for (j, row) in m.chunks_exact(st).enumerate() {
        for (d, &x) in row[..h.head_dim].iter().enumerate() {
            out[d * kp + j] = x;
        }
    }
}
