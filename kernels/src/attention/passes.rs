//! The forward and the backward pass over one head, generic over the lanes they compute in.
//!
//! Keys as rows, queries in lanes: the scores are computed as `Sᵀ` (row `j` holds key `j`'s
//! scores against every query, [`ShortHead::padded_keys`] lanes apart), so that a query's
//! softmax (its maximum, its sum) runs down a column of vectors, lane by lane, with no sum
//! across the lanes of a register and no per-query loop around a few vectors. Key `j`'s rows
//! of `dV` and `dK` are then weighted sums over the queries in one row each (written once, in
//! registers), and a query's output row and `dQ` row weighted sums over a column of the
//! probabilities or of the scores' gradient, each weight broadcast from where it lies.

use super::head::{ShortHead, LANES, MAX_KEYS};
use super::lanes::{Lanes8, RowPass};
use super::row_ops::{rows_by_transposed, transpose, weighted_rows, with_chunks};
use super::{HeadGradsMut, HeadRows};

/// `out`'s row `j` (`tp` lanes apart) from the first vector of queries that sees key `j`:
/// `Σ_d a[j][d]·bt[d][i]`, rows of `a` against `bt` (`head_dim × tp`).
/// Keys of one group of [`LANES`] share that first vector under the causal mask (all of them
/// without it), and run as one call.
#[inline(always)]
fn key_rows<V: Lanes8>(h: &ShortHead, a: HeadRows<'_>, bt: &[f32], out: &mut [f32]) {
    let tp = h.padded_keys();
    let group = if h.causal { LANES } else { h.tokens };
    for first in (0..h.tokens).step_by(group) {
        let at = h.first_query_vector(first) * LANES;
        let rows = group.min(h.tokens - first);
        with_chunks!(
            (tp - at) / LANES,
            rows_by_transposed::<V>(
                (&a.data[first * a.ld..], a.ld, h.head_dim),
                rows,
                (&bt[at..], tp),
                (&mut out[first * tp + at..], tp)
            )
        );
    }
}

/// The forward's operands, and its scratch: `qt` is `head_dim × padded_keys` (for the queries
/// transposed), `st` `tokens × padded_keys` (for the scores).
pub(super) struct Forward<'a> {
    pub(super) h: ShortHead,
    pub(super) q: HeadRows<'a>,
    pub(super) qt: &'a mut [f32],
    pub(super) k: HeadRows<'a>,
    pub(super) v: HeadRows<'a>,
    pub(super) o: (&'a mut [f32], usize),
    pub(super) lse: &'a mut [f32],
    pub(super) st: &'a mut [f32],
}

impl RowPass for Forward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        let Forward {
            h,
            q,
            qt,
            k,
            v,
            o: (o, o_ld),
            lse,
            st,
        } = self;
        let (s, tp) = (h.stride(), h.padded_keys());
        transpose::<V>((q.data, q.ld, h.tokens), h.head_dim, (qt, tp));
        key_rows::<V>(&h, k, qt, st);
        for at in (0..h.tokens).step_by(LANES) {
            // This vector's queries see keys `..keys`; where a key is masked for some of them
            // (`first_visible(j) > at`), its lanes below `first_visible(j)` are −∞ (whatever the
            // score, NaN included: a later token's).
            let keys = h.keys_seen_by(at);
            let masked_below = |j: usize| h.first_visible(j).saturating_sub(at);
            let mut max = V::splat(f32::NEG_INFINITY);
            for j in 0..keys {
                let x = &mut st[j * tp + at..];
                let sc = V::load(x).mul(V::splat(h.scale));
                let sc = sc.fill_below(masked_below(j), V::splat(f32::NEG_INFINITY));
                sc.store(x);
                max = sc.max_into(max);
            }
            // A query with no score above −∞ (every one −∞ or NaN) gets zero probabilities, and
            // so a NaN output (0·(1/0)) and a −∞ log-sum-exp. NaN scores elsewhere stay NaN
            // through the subtraction and the exponential, and reach the output.
            let mut sum = V::zero();
            for j in 0..keys {
                let x = &mut st[j * tp + at..];
                let p = V::load(x).sub(max).exp().zero_where_neg_inf(max);
                let p = p.fill_below(masked_below(j), V::zero());
                sum = sum.add(p);
                p.store(x);
            }
            let (max, sum) = (max.to_array(), sum.to_array());
            for (l, i) in (at..h.tokens.min(at + LANES)).enumerate() {
                let oi = &mut o[i * o_ld..i * o_ld + s];
                with_chunks!(
                    s / LANES,
                    weighted_rows::<V>((&st[i..], tp, h.visible(i)), (v.data, v.ld), oi)
                );
                let inv = 1.0 / sum[l];
                oi.iter_mut().for_each(|x| *x *= inv);
                lse[i] = max[l] + sum[l].ln();
            }
        }
    }
}

/// The backward's operands, and its scratch: `qt` and `dyt` are `head_dim × padded_keys` (for
/// the queries and the output's gradient transposed), `st` and `dst` `tokens × padded_keys`
/// (for the probabilities and the scores' gradient).
pub(super) struct Backward<'a> {
    pub(super) h: ShortHead,
    pub(super) q: HeadRows<'a>,
    pub(super) qt: &'a mut [f32],
    pub(super) k: HeadRows<'a>,
    pub(super) v: HeadRows<'a>,
    pub(super) y: HeadRows<'a>,
    pub(super) dy: HeadRows<'a>,
    pub(super) dyt: &'a mut [f32],
    pub(super) lse: &'a [f32],
    pub(super) grads: HeadGradsMut<'a>,
    pub(super) st: &'a mut [f32],
    pub(super) dst: &'a mut [f32],
}

impl RowPass for Backward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        let Backward {
            h,
            q,
            qt,
            k,
            v,
            y,
            dy,
            dyt,
            lse,
            grads,
            st,
            dst,
        } = self;
        let (hd, s, tp) = (h.head_dim, h.stride(), h.padded_keys());
        let (dqkv, ld, [at_q, at_k, at_v]) = (grads.data, grads.ld, grads.at);
        // Per query (lanes past the last zero): the log-sum-exp and Σ dy·y over the row's
        // columns, in order.
        let mut lse_lanes = [0f32; MAX_KEYS];
        let mut delta = [0f32; MAX_KEYS];
        lse_lanes[..h.tokens].copy_from_slice(lse);
        for (i, delta) in delta[..h.tokens].iter_mut().enumerate() {
            let dyi = &dy.data[i * dy.ld..i * dy.ld + hd];
            let yi = &y.data[i * y.ld..i * y.ld + hd];
            *delta = dyi.iter().zip(yi).map(|(a, b)| a * b).sum();
        }
        // Sᵀ (the probabilities again, from the forward's log-sum-exps) and dPᵀ = V·dyᵀ.
        transpose::<V>((q.data, q.ld, h.tokens), hd, (qt, tp));
        transpose::<V>((dy.data, dy.ld, h.tokens), hd, (dyt, tp));
        key_rows::<V>(&h, k, qt, st);
        key_rows::<V>(&h, v, dyt, dst);
        let scale = V::splat(h.scale);
        for j in 0..h.tokens {
            // Lanes of queries that do not see key `j` (`..first`, in its first vector) are
            // computed with the rest and never read.
            let first = h.first_visible(j);
            let from = h.first_query_vector(j) * LANES;
            for at in (from..tp).step_by(LANES) {
                let (p, dp) = (&mut st[j * tp + at..], &mut dst[j * tp + at..]);
                let pj = V::load(p).mul(scale).sub(V::load(&lse_lanes[at..])).exp();
                // dS = P ⊙ (dP − Σ dy·y), and the scores' scale (for dq and dk both).
                let ds = pj.mul(V::load(dp).sub(V::load(&delta[at..]))).mul(scale);
                pj.store(p);
                ds.store(dp);
            }
            // dv[j] = Σ_i p_ij·dy_i, dk[j] = Σ_i dS_ij·q_i over the queries that see key j.
            let n = h.tokens - first;
            let (pj, dsj) = (&st[j * tp + first..], &dst[j * tp + first..]);
            let dvj = &mut dqkv[j * ld + at_v..j * ld + at_v + s];
            with_chunks!(
                s / LANES,
                weighted_rows::<V>((pj, 1, n), (&dy.data[first * dy.ld..], dy.ld), dvj)
            );
            let dkj = &mut dqkv[j * ld + at_k..j * ld + at_k + s];
            with_chunks!(
                s / LANES,
                weighted_rows::<V>((dsj, 1, n), (&q.data[first * q.ld..], q.ld), dkj)
            );
        }
        // dq_i = Σ_j dS_ij·k_j over the keys query i sees.
        for i in 0..h.tokens {
            let dqi = &mut dqkv[i * ld + at_q..i * ld + at_q + s];
            with_chunks!(
                s / LANES,
                weighted_rows::<V>((&dst[i..], tp, h.visible(i)), (k.data, k.ld), dqi)
            );
        }
    }
}
