//! The fused attention's blocked path on the CPU, for heads longer than `cpu_short` takes: per
//! head, query rows in blocks of [`BLOCK`], keys in blocks of [`BLOCK`] up to the diagonal, the
//! scores of one block pair in an FP32 scratch tile that the online softmax consumes. The
//! products run on `typed_amp_kernels`' micro-kernels, one thread each, straight from the packed
//! 16-bit rows (the probabilities rounded to the working precision before `P·V`, as
//! FlashAttention does), so 16-bit attention multiplies at the 16-bit rate. Each head's
//! right-hand operands (`Kᵀ` and `V`; in the backward `Kᵀ`, `Vᵀ`, `K`, `Q` and `dy`) are packed
//! once for all of its block pairs ([`PackedB`]), and every product writes its FP32 result in
//! place.

use typed_amp_kernels::attention::{
    finish_block, probabilities_block, score_grads_block, shift_block,
};
use typed_amp_kernels::{Epilogue, PackedB};

use super::AttentionDims;
use crate::device::utilities::cpu::f32_as;
use crate::device::utilities::cpu_gemm::{gemm_packed_into, pack_b};
use crate::precision::AmpElem;

/// Query rows and keys per block: a 64 × 64 FP32 score tile is 16 KiB, in L1 beside its
/// operands.
const BLOCK: usize = 64;

/// For each query row `i0 + r` of `counts` (one per row of the query block), the keys it sees
/// in the key block starting at `j0` of length `kb`: all, or (causal) those up to the row.
fn visible_keys(d: &AttentionDims, i0: usize, j0: usize, kb: usize, counts: &mut [usize]) {
    for (r, count) in counts.iter_mut().enumerate() {
        *count = if d.causal {
            (i0 + r + 1).saturating_sub(j0).min(kb)
        } else {
            kb
        };
    }
}

/// Where one head's queries, keys and values start in a packed row, and the row's length.
struct Layout {
    q: usize,
    k: usize,
    v: usize,
    row: usize,
    width: usize,
}

impl Layout {
    fn of(d: &AttentionDims, head: usize) -> Self {
        let width = d.width();
        let at = head * d.head_dim;
        Layout {
            q: at,
            k: width + at,
            v: 2 * width + at,
            row: 3 * width,
            width,
        }
    }
}

/// One sequence's forward, head by head: `y` (the sequence's output rows) and `lse` (its
/// heads' log-sum-exps, head-major) written whole.
pub(super) fn forward_sequence<E: AmpElem>(
    d: &AttentionDims,
    qkv: &[E],
    y: &mut [E],
    lse: &mut [f32],
    scratch: &mut Scratch<E>,
) {
    for (h, lse) in lse.chunks_mut(d.tokens).enumerate() {
        forward_head(d, &Layout::of(d, h), qkv, y, lse, scratch);
    }
}

/// One sequence's backward, head by head, into its rows of `dqkv` (written, or added to with
/// the flag).
pub(super) fn backward_sequence<E: AmpElem>(
    d: &AttentionDims,
    (qkv, y, dy): (&[E], &[E], &[E]),
    lse: &[f32],
    (dqkv, accumulate): (&mut [E], bool),
    (scratch, grads): &mut (Scratch<E>, HeadGrads),
) {
    for (h, lse) in lse.chunks(d.tokens).enumerate() {
        let lay = Layout::of(d, h);
        backward_head(d, &lay, qkv, y, dy, lse, scratch, grads);
        grads.store(d, &lay, dqkv, accumulate);
    }
}

/// One task's working tiles.
pub(super) struct Scratch<E> {
    /// Scores, then probabilities, of one block pair (FP32).
    s: Vec<f32>,
    /// The probabilities (or the scores' gradient) rounded to the working precision.
    pe: Vec<E>,
    /// The probabilities' gradient of one block pair (FP32).
    dp: Vec<f32>,
    /// A query block's output accumulator.
    o: Vec<f32>,
    /// Per query row: the running maximum, and the running sum of exponentials.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// Per query row: the maximum with this key block's scores.
    next_max: Vec<f32>,
    /// Per query row: how many of this key block's keys it sees.
    visible: Vec<usize>,
    /// One row of a head's width (an output row; in the backward, `y`'s row).
    row: Vec<f32>,
    /// A second row of a head's width (in the backward, `dy`'s row).
    row2: Vec<f32>,
    /// The head's operands packed for the products' B side: `Kᵀ` (forward and backward), `V`
    /// (forward), `K`, `Vᵀ`, `Q` and `dy` (backward).
    kt: PackedB,
    v: PackedB,
    k: PackedB,
    vt: PackedB,
    q: PackedB,
    dy: PackedB,
}

impl<E: AmpElem> Scratch<E> {
    pub(super) fn new(head_dim: usize) -> Self {
        Scratch {
            s: vec![0.0; BLOCK * BLOCK],
            pe: vec![E::default(); BLOCK * BLOCK],
            dp: vec![0.0; BLOCK * BLOCK],
            o: vec![0.0; BLOCK * head_dim],
            max: vec![0.0; BLOCK],
            sum: vec![0.0; BLOCK],
            next_max: vec![0.0; BLOCK],
            visible: vec![0; BLOCK],
            row: vec![0.0; head_dim],
            row2: vec![0.0; head_dim],
            kt: PackedB::new(),
            v: PackedB::new(),
            k: PackedB::new(),
            vt: PackedB::new(),
            q: PackedB::new(),
            dy: PackedB::new(),
        }
    }
}

/// The first `n` elements of `x` in the working precision: the FP32 tile itself under O0,
/// else rounded into `buf`.
fn working<'a, E: AmpElem>(x: &'a [f32], buf: &'a mut [E], n: usize) -> &'a [E] {
    match f32_as::<E>(&x[..n]) {
        Some(same) => same,
        None => {
            E::slice_from_f32(&x[..n], &mut buf[..n]);
            &buf[..n]
        }
    }
}

/// `s = Q[i0..i0+qb] · K[j0..j0+kb]ᵀ` (FP32, `qb × kb`, rows `kb` apart), unscaled: the
/// softmax passes multiply by the scale (the same single multiplication of the same sum that
/// an epilogue's `alpha` would be, without a store through a tile).
fn scores<E: AmpElem>(
    d: &AttentionDims,
    lay: &Layout,
    qkv: &[E],
    kt: &PackedB,
    (i0, qb): (usize, usize),
    (j0, kb): (usize, usize),
    s: &mut [f32],
) {
    gemm_packed_into::<E>(
        (qb, d.head_dim, kb),
        (&qkv[i0 * lay.row + lay.q..], lay.row, 1),
        kt,
        (0, j0),
        (&mut s[..qb * kb], kb, 1),
        &Epilogue::STORE,
    );
}

fn forward_head<E: AmpElem>(
    d: &AttentionDims,
    lay: &Layout,
    qkv: &[E],
    y: &mut [E],
    lse: &mut [f32],
    sc: &mut Scratch<E>,
) {
    let (t, hd) = (d.tokens, d.head_dim);
    let scale = d.scale();
    // Kᵀ (`head_dim × tokens`) and V (`tokens × head_dim`), once for all query blocks.
    pack_b(&mut sc.kt, (&qkv[lay.k..], 1, lay.row), (hd, t));
    pack_b(&mut sc.v, (&qkv[lay.v..], lay.row, 1), (t, hd));
    for i0 in (0..t).step_by(BLOCK) {
        let qb = BLOCK.min(t - i0);
        let o = &mut sc.o[..qb * hd];
        o.fill(0.0);
        sc.max[..qb].fill(f32::NEG_INFINITY);
        sc.sum[..qb].fill(0.0);
        let keys = if d.causal { i0 + qb } else { t };
        for j0 in (0..keys).step_by(BLOCK) {
            let kb = BLOCK.min(keys - j0);
            scores(d, lay, qkv, &sc.kt, (i0, qb), (j0, kb), &mut sc.s);
            // The online softmax: each row's new maximum rescales what the earlier key blocks
            // summed; the probabilities of this block replace the scores in place, their
            // exponentials over the whole tile in one call (a row of the ViT's is 17 keys: one
            // call per row cost as much again in calls and part-filled vectors). NaN scores
            // stay NaN through both passes and reach the output (and so the loss and the
            // gradients, which skips the step).
            visible_keys(d, i0, j0, kb, &mut sc.visible[..qb]);
            shift_block(
                &mut sc.s,
                kb,
                &sc.visible,
                scale,
                &sc.max[..qb],
                &mut sc.next_max,
            );
            finish_block(
                &mut sc.s,
                kb,
                &sc.visible,
                &sc.next_max,
                &mut sc.max[..qb],
                &mut sc.sum,
                (o, hd),
            );
            // o += P · V[j0..j0+kb]
            gemm_packed_into::<E>(
                (qb, kb, hd),
                (working(&sc.s, &mut sc.pe, qb * kb), kb, 1),
                &sc.v,
                (j0, 0),
                (o, hd, 1),
                &Epilogue::ACCUMULATE,
            );
        }
        let out = &mut sc.row;
        for r in 0..qb {
            let i = i0 + r;
            let inv = 1.0 / sc.sum[r];
            out.iter_mut()
                .zip(&o[r * hd..(r + 1) * hd])
                .for_each(|(y, o)| *y = o * inv);
            let at = i * lay.width + lay.q;
            E::slice_from_f32(out, &mut y[at..at + hd]);
            lse[i] = sc.max[r] + sc.sum[r].ln();
        }
    }
}

/// One head's gradients of its queries, keys and values over a whole sequence, in FP32.
pub(super) struct HeadGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    /// `Σ dy·y` per query row.
    delta: Vec<f32>,
    /// A stored gradient row widened, and the sum written back (when accumulating).
    old: Vec<f32>,
    sum: Vec<f32>,
}

impl HeadGrads {
    pub(super) fn new(tokens: usize, head_dim: usize) -> Self {
        HeadGrads {
            dq: vec![0.0; tokens * head_dim],
            dk: vec![0.0; tokens * head_dim],
            dv: vec![0.0; tokens * head_dim],
            delta: vec![0.0; tokens],
            old: vec![0.0; head_dim],
            sum: vec![0.0; head_dim],
        }
    }

    /// Writes (or adds) the head's gradients into its columns of the packed gradient rows.
    fn store<E: AmpElem>(
        &mut self,
        d: &AttentionDims,
        lay: &Layout,
        dqkv: &mut [E],
        accumulate: bool,
    ) {
        let hd = d.head_dim;
        let (old, sum) = (&mut self.old, &mut self.sum);
        for i in 0..d.tokens {
            for (grad, at) in [(&self.dq, lay.q), (&self.dk, lay.k), (&self.dv, lay.v)] {
                let src = &grad[i * hd..(i + 1) * hd];
                let dst = &mut dqkv[i * lay.row + at..i * lay.row + at + hd];
                if accumulate {
                    E::slice_to_f32(dst, old);
                    sum.iter_mut()
                        .zip(src.iter().zip(old.iter()))
                        .for_each(|(s, (g, o))| *s = g + o);
                    E::slice_from_f32(sum, dst);
                } else {
                    E::slice_from_f32(src, dst);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn backward_head<E: AmpElem>(
    d: &AttentionDims,
    lay: &Layout,
    qkv: &[E],
    y: &[E],
    dy: &[E],
    lse: &[f32],
    sc: &mut Scratch<E>,
    g: &mut HeadGrads,
) {
    let (t, hd) = (d.tokens, d.head_dim);
    g.dq.fill(0.0);
    g.dk.fill(0.0);
    g.dv.fill(0.0);
    let (yr, dyr) = (&mut sc.row, &mut sc.row2);
    for i in 0..t {
        let at = i * lay.width + lay.q;
        E::slice_to_f32(&y[at..at + hd], yr);
        E::slice_to_f32(&dy[at..at + hd], dyr);
        g.delta[i] = yr.iter().zip(dyr.iter()).map(|(a, b)| a * b).sum();
    }
    let scale = d.scale();
    pack_b(&mut sc.kt, (&qkv[lay.k..], 1, lay.row), (hd, t));
    pack_b(&mut sc.vt, (&qkv[lay.v..], 1, lay.row), (hd, t));
    pack_b(&mut sc.k, (&qkv[lay.k..], lay.row, 1), (t, hd));
    pack_b(&mut sc.q, (&qkv[lay.q..], lay.row, 1), (t, hd));
    pack_b(&mut sc.dy, (&dy[lay.q..], lay.width, 1), (t, hd));
    for i0 in (0..t).step_by(BLOCK) {
        let qb = BLOCK.min(t - i0);
        let keys = if d.causal { i0 + qb } else { t };
        for j0 in (0..keys).step_by(BLOCK) {
            let kb = BLOCK.min(keys - j0);
            let n = qb * kb;
            scores(d, lay, qkv, &sc.kt, (i0, qb), (j0, kb), &mut sc.s);
            // The probabilities again, from the forward's log-sum-exp.
            visible_keys(d, i0, j0, kb, &mut sc.visible[..qb]);
            probabilities_block(&mut sc.s, kb, &sc.visible, scale, &lse[i0..i0 + qb]);
            // dv[j] += Pᵀ · dy[i]
            gemm_packed_into::<E>(
                (kb, qb, hd),
                (working(&sc.s, &mut sc.pe, n), 1, kb),
                &sc.dy,
                (i0, 0),
                (&mut g.dv[j0 * hd..], hd, 1),
                &Epilogue::ACCUMULATE,
            );
            // dP = dy[i] · V[j]ᵀ
            gemm_packed_into::<E>(
                (qb, hd, kb),
                (&dy[i0 * lay.width + lay.q..], lay.width, 1),
                &sc.vt,
                (0, j0),
                (&mut sc.dp[..n], kb, 1),
                &Epilogue::STORE,
            );
            // dS = P ⊙ (dP − Σ dy·y), rounded to the working precision for the products.
            score_grads_block(&mut sc.dp, &sc.s, kb, &g.delta[i0..i0 + qb]);
            let ds = working(&sc.dp, &mut sc.pe, n);
            // dq[i] += dS · K[j], dk[j] += dSᵀ · Q[i] (the scale once, below)
            gemm_packed_into::<E>(
                (qb, kb, hd),
                (ds, kb, 1),
                &sc.k,
                (j0, 0),
                (&mut g.dq[i0 * hd..], hd, 1),
                &Epilogue::ACCUMULATE,
            );
            gemm_packed_into::<E>(
                (kb, qb, hd),
                (ds, 1, kb),
                &sc.q,
                (i0, 0),
                (&mut g.dk[j0 * hd..], hd, 1),
                &Epilogue::ACCUMULATE,
            );
        }
    }
    // The scores' scale, applied once to the sums over all key (query) blocks rather than to
    // each block's product: a plain sum is written in place, an epilogue goes through a tile.
    g.dq.iter_mut()
        .chain(g.dk.iter_mut())
        .for_each(|x| *x *= scale);
}
