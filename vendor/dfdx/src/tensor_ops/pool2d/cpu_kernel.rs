// typed-amp patch: the CPU pooling kernels are rewritten as tight loops over image planes (each
// output's window of valid taps is found once per row and column, not by bound checks per
// element), run in parallel over planes with rayon, and computed in `f32` for 16-bit types
// (one conversion per plane). Max/min pooling and f32 average pooling give the same bits as
// upstream's kernels: the same operations in the same order.
use crate::{shapes::*, tensor::*};

use crate::tensor_ops::utilities::cpu_f32::{
    as_f32, as_f32_mut, from_f32, par_chunks_mut, pieces, to_f32,
};

use std::sync::Arc;

use num_traits::Float;

impl super::Pool2DKind {
    #[inline(always)]
    fn init(&self) -> f32 {
        match self {
            super::Pool2DKind::Avg => 0.0,
            super::Pool2DKind::Min => f32::INFINITY,
            super::Pool2DKind::Max => f32::NEG_INFINITY,
        }
    }
}

/// For each output position along one axis, the range of kernel taps `k` whose input position
/// `o·stride + k·dilation − padding` lies inside `0..len_in`.
fn tap_ranges(op: &super::Pool2DOp, len_out: usize, len_in: usize) -> Vec<(usize, usize)> {
    (0..len_out)
        .map(|o| {
            let base = (o * op.stride) as isize - op.padding as isize;
            let mut lo = op.kernel;
            let mut hi = 0;
            for k in 0..op.kernel {
                let i = base + (k * op.dilation) as isize;
                if i >= 0 && (i as usize) < len_in {
                    lo = lo.min(k);
                    hi = k + 1;
                }
            }
            (lo.min(hi), hi)
        })
        .collect()
}

/// The input offset of tap `k` of output `o` along one axis (valid taps only).
#[inline(always)]
fn tap(op: &super::Pool2DOp, o: usize, k: usize) -> usize {
    o * op.stride + k * op.dilation - op.padding
}

/// Pools one `h_in × w_in` plane into one `h_out × w_out` plane, in f32.
fn pool_plane(
    op: &super::Pool2DOp,
    ys: &[(usize, usize)],
    xs: &[(usize, usize)],
    inp: &[f32],
    out: &mut [f32],
) {
    match op.kind {
        super::Pool2DKind::Avg => {
            let inv_n = (1.0 / (op.kernel * op.kernel) as f64) as f32;
            pool_plane_with(op, ys, xs, inp, out, |t, v| t + v, |t| t * inv_n)
        }
        super::Pool2DKind::Min => pool_plane_with(op, ys, xs, inp, out, f32::min, |t| t),
        super::Pool2DKind::Max => pool_plane_with(op, ys, xs, inp, out, f32::max, |t| t),
    }
}

/// [pool_plane] for one kind: `out = finish(fold(…fold(fold(init, v₀), v₁)…))` over each
/// window's valid taps in row-major order.
#[inline(always)]
fn pool_plane_with(
    op: &super::Pool2DOp,
    ys: &[(usize, usize)],
    xs: &[(usize, usize)],
    inp: &[f32],
    out: &mut [f32],
    fold: impl Fn(f32, f32) -> f32,
    finish: impl Fn(f32) -> f32,
) {
    let init = op.kind.init();
    let w = op.w_in;
    if op.kernel == 2 && op.stride == 2 && op.padding == 0 && op.dilation == 1 {
        // The common 2×2 pooling: every window is whole.
        for (oh, out_row) in out.chunks_exact_mut(op.w_out).enumerate() {
            let r0 = &inp[2 * oh * w..][..2 * op.w_out];
            let r1 = &inp[(2 * oh + 1) * w..][..2 * op.w_out];
            for ((o, a), b) in out_row
                .iter_mut()
                .zip(r0.chunks_exact(2))
                .zip(r1.chunks_exact(2))
            {
                *o = finish(fold(fold(fold(fold(init, a[0]), a[1]), b[0]), b[1]));
            }
        }
        return;
    }
    for (oh, &(ky0, ky1)) in ys.iter().enumerate() {
        let out_row = &mut out[oh * op.w_out..(oh + 1) * op.w_out];
        for (ow, (o, &(kx0, kx1))) in out_row.iter_mut().zip(xs).enumerate() {
            let mut t = init;
            for ky in ky0..ky1 {
                let row = &inp[tap(op, oh, ky) * w..][..w];
                let x0 = tap(op, ow, kx0);
                for v in row[x0..].iter().step_by(op.dilation).take(kx1 - kx0) {
                    t = fold(t, *v);
                }
            }
            *o = finish(t);
        }
    }
}

/// `grad_inp += ` the pooling's backward for one plane, in f32.
fn unpool_plane(
    op: &super::Pool2DOp,
    ys: &[(usize, usize)],
    xs: &[(usize, usize)],
    inp: &[f32],
    grad_inp: &mut [f32],
    out: &[f32],
    grad_out: &[f32],
) {
    let w = op.w_in;
    match op.kind {
        super::Pool2DKind::Avg => {
            let inv_n = (1.0 / (op.kernel * op.kernel) as f64) as f32;
            for (oh, &(ky0, ky1)) in ys.iter().enumerate() {
                for (ow, &(kx0, kx1)) in xs.iter().enumerate() {
                    let go = grad_out[oh * op.w_out + ow] * inv_n;
                    for ky in ky0..ky1 {
                        let row = &mut grad_inp[tap(op, oh, ky) * w..][..w];
                        let x0 = tap(op, ow, kx0);
                        for g in row[x0..].iter_mut().step_by(op.dilation).take(kx1 - kx0) {
                            *g += go;
                        }
                    }
                }
            }
        }
        super::Pool2DKind::Min | super::Pool2DKind::Max => {
            // As upstream: every tap equal to the output gets the gradient, and the others get
            // + 0.0.
            let pick = |x: f32, vo: f32, go: f32| if x == vo { go } else { 0.0 };
            if op.kernel == 2 && op.stride == 2 && op.padding == 0 && op.dilation == 1 {
                for oh in 0..op.h_out {
                    let (vo, go) = (
                        &out[oh * op.w_out..][..op.w_out],
                        &grad_out[oh * op.w_out..][..op.w_out],
                    );
                    for r in 2 * oh..2 * oh + 2 {
                        let x = &inp[r * w..][..2 * op.w_out];
                        let g = &mut grad_inp[r * w..][..2 * op.w_out];
                        for (((g, x), vo), go) in
                            g.chunks_exact_mut(2).zip(x.chunks_exact(2)).zip(vo).zip(go)
                        {
                            g[0] += pick(x[0], *vo, *go);
                            g[1] += pick(x[1], *vo, *go);
                        }
                    }
                }
                return;
            }
            for (oh, &(ky0, ky1)) in ys.iter().enumerate() {
                for (ow, &(kx0, kx1)) in xs.iter().enumerate() {
                    let i_out = oh * op.w_out + ow;
                    let (vo, go) = (out[i_out], grad_out[i_out]);
                    for ky in ky0..ky1 {
                        let r0 = tap(op, oh, ky) * w;
                        let x0 = tap(op, ow, kx0);
                        let xs = inp[r0 + x0..r0 + w].iter().step_by(op.dilation);
                        let gs = grad_inp[r0 + x0..r0 + w].iter_mut().step_by(op.dilation);
                        for (g, x) in gs.zip(xs).take(kx1 - kx0) {
                            *g += pick(*x, vo, go);
                        }
                    }
                }
            }
        }
    }
}

impl<E: Float + Dtype> super::Pool2DKernel<E> for Cpu {
    fn alloc<S: Shape>(&self, s: S) -> Result<Tensor<S, E, Self>, Self::Err> {
        self.try_zeros_like(&s)
    }
    fn forward<I: Shape, O: Shape>(
        &self,
        op: super::Pool2DOp,
        inp: &Tensor<I, E, Self>,
        out: &mut Tensor<O, E, Self>,
    ) -> Result<(), Self::Err> {
        // The op checked that `inp` is contiguous; `out` was just allocated.
        let planes = op.batch * op.chan;
        let (in_len, out_len) = (op.h_in * op.w_in, op.h_out * op.w_out);
        if planes == 0 || out_len == 0 {
            return Ok(());
        }
        let ys = tap_ranges(&op, op.h_out, op.h_in);
        let xs = tap_ranges(&op, op.w_out, op.w_in);
        let inp = &inp.data[..planes * in_len];
        let out = &mut Arc::make_mut(&mut out.data)[..planes * out_len];
        let per_piece = planes.div_ceil(pieces(planes));
        par_chunks_mut(out, per_piece * out_len, |i, out| {
            let inp = &inp[i * per_piece * in_len..][..out.len() / out_len * in_len];
            match (as_f32(inp), as_f32_mut(out)) {
                (Some(inp), Some(out)) => {
                    for (inp, out) in inp.chunks_exact(in_len).zip(out.chunks_exact_mut(out_len)) {
                        pool_plane(&op, &ys, &xs, inp, out);
                    }
                }
                _ => {
                    let mut inp32 = std::vec![0.0f32; in_len];
                    let mut out32 = std::vec![0.0f32; out_len];
                    for (inp, out) in inp.chunks_exact(in_len).zip(out.chunks_exact_mut(out_len)) {
                        to_f32(inp, &mut inp32);
                        pool_plane(&op, &ys, &xs, &inp32, &mut out32);
                        from_f32(&out32, out);
                    }
                }
            }
        });
        Ok(())
    }
    fn backward<I: Shape, O: Shape>(
        &self,
        op: super::Pool2DOp,
        inp: &Tensor<I, E, Self>,
        grad_inp: &mut Self::Vec,
        out: &Tensor<O, E, Self>,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let planes = op.batch * op.chan;
        let (in_len, out_len) = (op.h_in * op.w_in, op.h_out * op.w_out);
        if planes == 0 || out_len == 0 {
            return Ok(());
        }
        let ys = tap_ranges(&op, op.h_out, op.h_in);
        let xs = tap_ranges(&op, op.w_out, op.w_in);
        let inp = &inp.data[..planes * in_len];
        let out = &out.data[..planes * out_len];
        let grad_out = &grad_out[..planes * out_len];
        let per_piece = planes.div_ceil(pieces(planes));
        par_chunks_mut(
            &mut grad_inp[..planes * in_len],
            per_piece * in_len,
            |i, grad_inp| {
                let n = grad_inp.len() / in_len;
                let p0 = i * per_piece;
                let inp = &inp[p0 * in_len..(p0 + n) * in_len];
                let out = &out[p0 * out_len..(p0 + n) * out_len];
                let grad_out = &grad_out[p0 * out_len..(p0 + n) * out_len];
                if let (Some(inp), Some(out), Some(grad_out)) =
                    (as_f32(inp), as_f32(out), as_f32(grad_out))
                {
                    let grad_inp = as_f32_mut(grad_inp).unwrap();
                    for (((i, gi), o), go) in inp
                        .chunks_exact(in_len)
                        .zip(grad_inp.chunks_exact_mut(in_len))
                        .zip(out.chunks_exact(out_len))
                        .zip(grad_out.chunks_exact(out_len))
                    {
                        unpool_plane(&op, &ys, &xs, i, gi, o, go);
                    }
                } else {
                    let mut i32s = std::vec![0.0f32; in_len];
                    let mut gi32 = std::vec![0.0f32; in_len];
                    let mut o32 = std::vec![0.0f32; out_len];
                    let mut go32 = std::vec![0.0f32; out_len];
                    for (((i, gi), o), go) in inp
                        .chunks_exact(in_len)
                        .zip(grad_inp.chunks_exact_mut(in_len))
                        .zip(out.chunks_exact(out_len))
                        .zip(grad_out.chunks_exact(out_len))
                    {
                        to_f32(i, &mut i32s);
                        to_f32(gi, &mut gi32);
                        to_f32(o, &mut o32);
                        to_f32(go, &mut go32);
                        unpool_plane(&op, &ys, &xs, &i32s, &mut gi32, &o32, &go32);
                        from_f32(&gi32, gi);
                    }
                }
            },
        );
        Ok(())
    }
}
