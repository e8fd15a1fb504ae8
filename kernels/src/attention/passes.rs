//! The forward and the backward pass over one head's rows, generic over the lanes they compute
//! in.

use super::head::{Rounding, ShortHead, LANES, MAX_KEYS};
use super::lanes::{Lanes8, RowPass};
use super::row_ops::{
    add_outer, copy_lanes, fill_from, lane_max, lane_sum, round, row_by_transposed, weighted_rows,
    with_chunks,
};
use crate::math::exp_f32;

/// The forward's operands: `kt` is `head_dim × padded_keys`.
pub(super) struct Forward<'a> {
    pub(super) h: ShortHead,
    pub(super) rounding: Rounding,
    pub(super) q: &'a [f32],
    pub(super) kt: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) o: &'a mut [f32],
    pub(super) lse: &'a mut [f32],
}

impl RowPass for Forward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        let Forward {
            h,
            rounding,
            q,
            kt,
            v,
            o,
            lse,
        } = self;
        let (st, kp, head_chunks) = (h.stride(), h.padded_keys(), h.stride() / LANES);
        let mut s = [0f32; MAX_KEYS];
        let mut pe = [0f32; MAX_KEYS];
        for i in 0..h.tokens {
            let n = h.visible(i);
            let key_chunks = n.div_ceil(LANES);
            let np = key_chunks * LANES;
            let qi = &q[i * st..i * st + h.head_dim];
            with_chunks!(key_chunks, row_by_transposed::<V>(qi, kt, kp, &mut s));
            // Keys past the row's last (the mask, and the padding) out of the maximum, then zero;
            // their scores may be anything, NaN included (a later token's).
            s[..n].iter_mut().for_each(|x| *x *= h.scale);
            fill_from(&mut s[..np], n, f32::NEG_INFINITY);
            let max = lane_max(&s[..np]);
            let sum = if max == f32::NEG_INFINITY {
                s[..np].fill(0.0);
                0.0
            } else {
                // NaN scores stay NaN through the subtraction and the exponential, and reach the
                // output (and so the loss and the gradients, which skips the step).
                s[..np].iter_mut().for_each(|x| *x = exp_f32(*x - max));
                fill_from(&mut s[..np], n, 0.0);
                lane_sum(&s[..np])
            };
            copy_lanes(&s, &mut pe, np);
            round::<V>(rounding, &mut pe[..np]);
            let oi = &mut o[i * st..(i + 1) * st];
            with_chunks!(head_chunks, weighted_rows::<V>(&pe[..n], v, st, oi));
            let inv = 1.0 / sum;
            oi.iter_mut().for_each(|x| *x *= inv);
            lse[i] = max + sum.ln();
        }
    }
}

/// The backward's operands: `kt` and `vt` are `head_dim × padded_keys`.
pub(super) struct Backward<'a> {
    pub(super) h: ShortHead,
    pub(super) rounding: Rounding,
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) kt: &'a [f32],
    pub(super) vt: &'a [f32],
    pub(super) y: &'a [f32],
    pub(super) dy: &'a [f32],
    pub(super) lse: &'a [f32],
    pub(super) dq: &'a mut [f32],
    pub(super) dk: &'a mut [f32],
    pub(super) dv: &'a mut [f32],
}

impl RowPass for Backward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        let Backward {
            h,
            rounding,
            q,
            k,
            kt,
            vt,
            y,
            dy,
            lse,
            dq,
            dk,
            dv,
        } = self;
        let (hd, st, kp, head_chunks) =
            (h.head_dim, h.stride(), h.padded_keys(), h.stride() / LANES);
        dk.fill(0.0);
        dv.fill(0.0);
        let mut p = [0f32; MAX_KEYS];
        let mut pe = [0f32; MAX_KEYS];
        let mut ds = [0f32; MAX_KEYS];
        for i in 0..h.tokens {
            let n = h.visible(i);
            let key_chunks = n.div_ceil(LANES);
            let np = key_chunks * LANES;
            let (qi, dyi) = (&q[i * st..(i + 1) * st], &dy[i * st..(i + 1) * st]);
            // Σ dy·y over the row's columns, in order.
            let delta: f32 = dyi[..hd]
                .iter()
                .zip(&y[i * st..i * st + hd])
                .map(|(a, b)| a * b)
                .sum();
            // The probabilities again, from the forward's log-sum-exp.
            with_chunks!(
                key_chunks,
                row_by_transposed::<V>(&qi[..hd], kt, kp, &mut p)
            );
            let l = lse[i];
            p[..np]
                .iter_mut()
                .for_each(|x| *x = exp_f32(*x * h.scale - l));
            fill_from(&mut p[..np], n, 0.0);
            copy_lanes(&p, &mut pe, np);
            round::<V>(rounding, &mut pe[..np]);
            // dv[j] += p_j·dy_i
            with_chunks!(head_chunks, add_outer::<V>(&pe[..n], dyi, dv, st));
            // dP = dy_i·Vᵀ; dS = P ⊙ (dP − Σ dy·y), rounded for its products.
            with_chunks!(
                key_chunks,
                row_by_transposed::<V>(&dyi[..hd], vt, kp, &mut ds)
            );
            for (d, &p) in ds[..n].iter_mut().zip(&p[..n]) {
                *d = p * (*d - delta);
            }
            round::<V>(rounding, &mut ds[..np]);
            // dq_i = dS·K, dk[j] += dS_j·q_i (the scale once, below).
            let dqi = &mut dq[i * st..(i + 1) * st];
            with_chunks!(head_chunks, weighted_rows::<V>(&ds[..n], k, st, dqi));
            with_chunks!(head_chunks, add_outer::<V>(&ds[..n], qi, dk, st));
        }
        dq.iter_mut()
            .chain(dk.iter_mut())
            .for_each(|x| *x *= h.scale);
    }
}
