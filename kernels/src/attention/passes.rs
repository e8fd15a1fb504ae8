//! The forward and the backward pass over one head, generic over the lanes they compute in.
//!
//! Keys as rows, queries in lanes: the scores are computed as `Sᵀ` (row `j` holds key `j`'s
//! scores against every query, the queries padded to whole vectors), so that a query's softmax
//! (its maximum, its sum) runs down a column of vectors, lane by lane, with no sum across the
//! lanes of a register and no per-query loop around a few vectors. Key `j`'s rows
//! of `dV` and `dK` are then weighted sums over the queries in one row each (written once, in
//! registers), and a query's output row and `dQ` row weighted sums over a column of the
//! probabilities or of the scores' gradient, each weight broadcast from where it lies.

use super::head::{HeadGradsMut, HeadRows, ShortHead, MAX_KEYS};
use super::lanes::{Lanes, RowPass, MAX_LANES};
use super::row_ops::{
    dot, rows_by_transposed, transpose, weighted_rows, weighted_rows_pair, with_chunks,
    WeightedRows,
};

/// `out`'s row `j` (`tp` lanes apart) from the first vector of queries that sees key `j`:
/// `Σ_d a[j][d]·bt[d][i]`, rows of `a` against `bt` (`head_dim × tp`).
/// Keys of one group of `V::N` share that first vector under the causal mask (all of them
/// without it), and run as one call.
#[inline(always)]
fn key_rows<V: Lanes>(h: &ShortHead, a: HeadRows<'_>, bt: &[f32], out: &mut [f32]) {
    let tp = h.padded_queries(V::N);
    let group = if h.causal { V::N } else { h.tokens };
    for first in (0..h.tokens).step_by(group) {
        let at = h.first_query_vector(first, V::N);
        let rows = group.min(h.tokens - first);
        with_chunks!(
            (tp - at) / V::N,
            rows_by_transposed::<V>(
                (&a.data[first * a.ld..], a.ld, h.head_dim),
                rows,
                (&bt[at..], tp),
                (&mut out[first * tp + at..], tp)
            )
        );
    }
}

/// The forward's operands, and its scratch: `qt` is room for `head_dim × padded_queries` (the
/// queries transposed), `st` for `tokens × padded_queries` (the scores), at the widest vectors.
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
    fn run<V: Lanes>(self) {
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
        let (s, tp) = (h.stride(), h.padded_queries(V::N));
        transpose::<V::Eight>((q.data, q.ld, h.tokens), h.head_dim, (qt, tp));
        key_rows::<V>(&h, k, qt, st);
        for at in (0..h.tokens).step_by(V::N) {
            // This vector's queries see keys `..keys`; where a key is masked for some of them
            // (`first_visible(j) > at`), its lanes below `first_visible(j)` are −∞ (whatever the
            // score, NaN included: a later token's).
            let keys = h.keys_seen_by(at, V::N);
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
            // Each query's output row from its column of probabilities, then scaled by 1/sum.
            let end = h.tokens.min(at + V::N);
            column_sums::<V>(
                at..end,
                |i| ((&st[i..], tp, h.visible(i)), (v.data, v.ld)),
                (o, o_ld, 0),
                s,
            );
            for i in at..end {
                let l = i - at;
                let inv = 1.0 / sum[l];
                o[i * o_ld..i * o_ld + s].iter_mut().for_each(|x| *x *= inv);
                lse[i] = max[l] + sum[l].ln();
            }
        }
    }
}

/// `out[i·ld + at..][..s]` = `sum_for(i)` for each query `i` of `queries`, two queries at a time
/// ([`weighted_rows_pair`]), a last one alone.
#[inline(always)]
fn column_sums<'a, V: Lanes>(
    queries: std::ops::Range<usize>,
    sum_for: impl Fn(usize) -> WeightedRows<'a>,
    (out, ld, at): (&mut [f32], usize, usize),
    s: usize,
) {
    for i in queries.clone().step_by(2) {
        if i + 1 < queries.end {
            let rows = two_rows(out, [i * ld + at, (i + 1) * ld + at], s);
            let sums = [sum_for(i), sum_for(i + 1)];
            with_chunks!(s / V::N, weighted_rows_pair::<V>(sums, rows));
        } else {
            let row = &mut out[i * ld + at..i * ld + at + s];
            with_chunks!(s / V::N, weighted_rows::<V>(sum_for(i), row));
        }
    }
}

/// Two rows of `len` elements of `buf`, from `at[0]` and `at[1]`, which must not overlap.
/// (`slice::get_disjoint_mut` does the same checks, but cost the ViT's head forward about 10%,
/// `cargo bench -p typed-amp-kernels --bench short_attention` alternated: it is called for
/// every pair of queries.)
fn two_rows(buf: &mut [f32], at: [usize; 2], len: usize) -> [&mut [f32]; 2] {
    let [a, b] = at;
    assert!(
        a + len <= b || b + len <= a,
        "two_rows: rows at {at:?} of {len} overlap"
    );
    if a < b {
        let (lo, hi) = buf.split_at_mut(b);
        [&mut lo[a..a + len], &mut hi[..len]]
    } else {
        let (lo, hi) = buf.split_at_mut(a);
        let (b, a) = (&mut lo[b..b + len], &mut hi[..len]);
        [a, b]
    }
}

/// The backward's operands, and its scratch: `qt` and `dyt` are room for `head_dim ×
/// padded_queries` (the queries and the output's gradient transposed), `st` and `dst` for
/// `tokens × padded_queries` (the probabilities and the scores' gradient), at the widest
/// vectors.
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
    fn run<V: Lanes>(self) {
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
        let (hd, s, tp) = (h.head_dim, h.stride(), h.padded_queries(V::N));
        let (dqkv, ld, [at_q, at_k, at_v]) = (grads.data, grads.ld, grads.at);
        // Per query (lanes past the last zero): the log-sum-exp and Σ dy·y over the row's
        // columns ([`dot`]: one at a time, in order, this was a twentieth of the kernels' time).
        let mut lse_lanes = [0f32; MAX_KEYS.next_multiple_of(MAX_LANES)];
        let mut delta = [0f32; MAX_KEYS.next_multiple_of(MAX_LANES)];
        lse_lanes[..h.tokens].copy_from_slice(lse);
        for (i, delta) in delta[..h.tokens].iter_mut().enumerate() {
            let (dyi, yi) = (&dy.data[i * dy.ld..], &y.data[i * y.ld..]);
            *delta = dot::<V::Eight>(dyi, yi, hd);
        }
        // Sᵀ (the probabilities again, from the forward's log-sum-exps) and dPᵀ = V·dyᵀ.
        transpose::<V::Eight>((q.data, q.ld, h.tokens), hd, (qt, tp));
        transpose::<V::Eight>((dy.data, dy.ld, h.tokens), hd, (dyt, tp));
        key_rows::<V>(&h, k, qt, st);
        key_rows::<V>(&h, v, dyt, dst);
        let scale = V::splat(h.scale);
        for j in 0..h.tokens {
            // Lanes of queries that do not see key `j` (`..first`, in its first vector) are
            // computed with the rest and never read.
            let first = h.first_visible(j);
            let from = h.first_query_vector(j, V::N);
            for at in (from..tp).step_by(V::N) {
                let (p, dp) = (&mut st[j * tp + at..], &mut dst[j * tp + at..]);
                let pj = V::load(p).mul(scale).sub(V::load(&lse_lanes[at..])).exp();
                // dS = P ⊙ (dP − Σ dy·y), and the scores' scale (for dq and dk both).
                let ds = pj.mul(V::load(dp).sub(V::load(&delta[at..]))).mul(scale);
                pj.store(p);
                ds.store(dp);
            }
            // dv[j] = Σ_i p_ij·dy_i, dk[j] = Σ_i dS_ij·q_i over the queries that see key j.
            let n = h.tokens - first;
            let sums: [WeightedRows<'_>; 2] = [
                (
                    (&st[j * tp + first..], 1, n),
                    (&dy.data[first * dy.ld..], dy.ld),
                ),
                (
                    (&dst[j * tp + first..], 1, n),
                    (&q.data[first * q.ld..], q.ld),
                ),
            ];
            let rows = two_rows(dqkv, [j * ld + at_v, j * ld + at_k], s);
            with_chunks!(s / V::N, weighted_rows_pair::<V>(sums, rows));
        }
        // dq_i = Σ_j dS_ij·k_j over the keys query i sees.
        column_sums::<V>(
            0..h.tokens,
            |i| ((&dst[i..], tp, h.visible(i)), (k.data, k.ld)),
            (dqkv, ld, at_q),
            s,
        );
    }
}
