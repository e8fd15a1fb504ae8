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
//! is a loop over vectors of queries (or head columns) with its sums in registers: sixteen
//! lanes on AVX-512 where a head's width is a multiple of sixteen and its queries pad no further
//! to sixteen than to eight (the small GPT's 64 × 32; not the ViT's 17 tokens), else eight on
//! AVX2 and FMA where the CPU has them, else plain arrays of eight; every multiply-add is fused
//! and no sum's order depends on the lanes, so the bits do not depend on the CPU.
//!
//! Layout: keys as rows, queries in lanes (`passes`). The scores are computed as `Sᵀ` (key
//! `j`'s row holds its scores against every query), so a query's softmax runs down a column of
//! vectors, lane by lane: no sums across a register's lanes, no loop per query around a few
//! vectors (the row-per-query loops this replaced spent most of their time there: ViT head
//! forward 1,650 → 930 ns, `cargo bench --bench short_attention`, session 53).
//!
//! The arithmetic is the blocked kernel's: scores `q·k` as `head_dim`-term sums in order,
//! scaled, the query's maximum subtracted, [`exp_f32`](crate::math::exp_f32); all of it in FP32.
//! The probabilities and the scores' gradient are not rounded to a 16-bit working precision
//! before their products, as the blocked kernel's are for its 16-bit GEMM (and FlashAttention's
//! for its tensor cores): these products are FP32 loops, and the rounding was only a cost (a
//! sixth of the ViT head's time, `cargo bench --bench short_attention`, session 53) and an
//! error. The scores' scale enters `dS` (for `dq` and `dk` both) before its products.
//!
//! Operands: every `tokens × head_dim` matrix is row-major, its rows `ld` apart where they lie
//! ([`HeadRows`], [`HeadGradsMut`]), [`ShortHead::stride`] elements of each row (the head width
//! rounded up to [`LANES`]) read or written. The lanes past `head_dim` of an input never reach
//! an output's first `head_dim` columns; those of an output are unspecified.

mod block_softmax;
mod head;
mod lanes;
mod passes;
mod row_ops;

pub use block_softmax::{finish_block, probabilities_block, score_grads_block, shift_block};
pub use head::{HeadGradsMut, HeadRows, ShortHead, LANES, MAX_HEAD_DIM, MAX_KEYS};

use lanes::{run_rows, MAX_LANES};
use passes::{Backward, Forward};

/// A head's transposed queries (and, for the backward, output gradient), its scores and their
/// gradient (keys as rows), kept between calls so that a loop over heads allocates once.
#[derive(Debug, Default)]
pub struct ShortHeadScratch {
    qt: Vec<f32>,
    dyt: Vec<f32>,
    st: Vec<f32>,
    dst: Vec<f32>,
}

impl ShortHeadScratch {
    /// Empty buffers, grown on first use.
    pub fn new() -> Self {
        Self::default()
    }
}

/// `y = softmax(q·kᵀ·scale + mask)·v` for one head, into `o`'s rows (FP32, [`ShortHead::stride`]
/// elements each, `o_ld` apart), and each query row's log-sum-exp into `lse` (`tokens`), from
/// `[q, k, v]`. The operands and the output may lie in a sequence's packed rows (no copies) or
/// in buffers of their own.
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits), a matrix does not hold its rows, or `lse`
/// does not hold one value per token.
pub fn short_head_forward(
    h: &ShortHead,
    [q, k, v]: [HeadRows<'_>; 3],
    (o, o_ld): (&mut [f32], usize),
    lse: &mut [f32],
    scratch: &mut ShortHeadScratch,
) {
    h.check(&[q, k, v, HeadRows { data: o, ld: o_ld }], lse.len());
    run_rows(
        h.sixteen_lanes_fit(),
        Forward {
            h: *h,
            q,
            qt: rows_of_queries(h, h.head_dim, &mut scratch.qt),
            k,
            v,
            o: (o, o_ld),
            lse,
            st: rows_of_queries(h, h.tokens, &mut scratch.st),
        },
    );
}

/// The gradients of one head's `[q, k, v]` into `grads` (FP32, overwritten) from the forward's
/// output `y`, the output's gradient `dy` and the forward's log-sum-exps `lse`; the
/// probabilities are recomputed.
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits), a matrix does not hold its rows, the
/// gradients' columns overlap, or `lse` does not hold one value per token.
pub fn short_head_backward(
    h: &ShortHead,
    [q, k, v]: [HeadRows<'_>; 3],
    [y, dy]: [HeadRows<'_>; 2],
    lse: &[f32],
    grads: HeadGradsMut<'_>,
    scratch: &mut ShortHeadScratch,
) {
    h.check(&[q, k, v, y, dy], lse.len());
    h.check_grads(grads.data.len(), grads.ld, grads.at);
    run_rows(
        h.sixteen_lanes_fit(),
        Backward {
            h: *h,
            q,
            qt: rows_of_queries(h, h.head_dim, &mut scratch.qt),
            k,
            v,
            y,
            dy,
            dyt: rows_of_queries(h, h.head_dim, &mut scratch.dyt),
            lse,
            grads,
            st: rows_of_queries(h, h.tokens, &mut scratch.st),
            dst: rows_of_queries(h, h.tokens, &mut scratch.dst),
        },
    );
}

/// `buf` as room for `rows` rows of the head's queries in lanes (scores, or a transposed
/// operand), padded for the widest vectors; its contents are overwritten before use.
fn rows_of_queries<'a>(h: &ShortHead, rows: usize, buf: &'a mut Vec<f32>) -> &'a mut [f32] {
    buf.resize(rows * h.padded_queries(MAX_LANES), 0.0);
    buf
}
