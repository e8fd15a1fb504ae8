use std::borrow::Cow;

use super::cpu_f32::{
    as_f32_mut, from_f32, is_f32, is_half, load_f32, par_elementwise, to_f32, BLOCK,
};
use super::ops::{BinaryKernel, UnaryKernel};
use crate::{
    shapes::{Dtype, Shape},
    tensor::{
        cpu::{for_each_run, try_map_in_parallel, Cpu},
        unique_id, Tensor, Tensorlike, ZerosTensor,
    },
};

// typed-amp patch: the elementwise CPU kernels iterate broadcast and strided operands a run at a
// time ([for_each_run]) instead of computing every element's index, reduce broadcast
// gradients (stride-0 runs) in independent lanes, and, for 16-bit types, do the arithmetic that
// surrounds an op (the forward of the four basic binary ops, and every gradient accumulation
// `grad += df · grad_out`) in f32 a block at a time instead of through `half`'s scalar
// operators. Results are bit-identical to upstream's except for the broadcast reductions (a
// different summation order) and the 16-bit accumulations (one rounding instead of two).
// Large elementwise ops run in pieces on rayon's pool ([par_elementwise]): unary ops' forward and
// backward, binary ops' forward, and their backward where neither operand is broadcast or
// permuted; every element is computed as on one thread, so results do not change.

pub trait UnaryDerivative<E> {
    /// Whether the [UnaryDerivative::df] function can re-use the output
    /// from [UnaryDerivative::f].
    const DF_USES_FX: bool;
    /// Whether the derivative of this op can be computed without
    /// any data.
    const HAS_CONST_DF: bool;

    fn f(&self, x: &E) -> E;

    /// Receives `f(x)` if [UnaryDerivative::DF_USES_FX] is true,
    /// otherwise `x`.
    fn df(&self, x: &E) -> E;

    fn const_df(&self) -> E {
        unimplemented!()
    }

    /// typed-amp patch: whether [UnaryDerivative::f_f32] and [UnaryDerivative::df_f32] compute
    /// this op on values widened to f32. 16-bit types then run the op a block at a time: one
    /// vectorised widening, the op in f32, one rounding, instead of `half`'s scalar operators
    /// (a conversion pair and a rounding after every arithmetic operation).
    const IN_F32: bool = false;

    /// typed-amp patch: `x ← f(x)` for a block of values widened to f32 (only called when
    /// [UnaryDerivative::IN_F32]).
    fn f_f32(&self, _x: &mut [f32]) {
        unimplemented!()
    }

    /// typed-amp patch: `x ← df(x)` for a block of values widened to f32 (only called when
    /// [UnaryDerivative::IN_F32]; receives `f(x)` if [UnaryDerivative::DF_USES_FX]).
    fn df_f32(&self, _x: &mut [f32]) {
        unimplemented!()
    }

    /// typed-amp patch: whether f32 tensors too run [UnaryDerivative::f_f32] and
    /// [UnaryDerivative::df_f32] a block at a time, for ops whose slice forms are faster than
    /// `f`/`df` element by element and give the same bits (GELU's, built for the CPU's widest
    /// vectors at run time).
    const F32_SLICES: bool = false;
}

/// typed-amp patch: whether this op runs on f32 tensors by its f32 slice forms
/// ([UnaryDerivative::F32_SLICES]).
fn f32_slices<E: Dtype, Op: UnaryDerivative<E>>() -> bool {
    Op::F32_SLICES && is_f32::<E>()
}

/// typed-amp patch: the arithmetic of the four basic binary ops. 16-bit types compute it in f32
/// a block at a time, which gives the same bits as `half`'s operators (each converts both
/// operands to f32, computes and rounds back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

impl Arith {
    #[inline(always)]
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Arith::Add => a + b,
            Arith::Sub => a - b,
            Arith::Mul => a * b,
            Arith::Div => a / b,
        }
    }
}

pub trait BinaryDerivative<E>: std::fmt::Debug {
    /// Whether the derivative of this op can be computed without
    /// any data.
    const HAS_CONST_DF: bool;
    /// typed-amp patch: `Some` when [BinaryDerivative::f] is one of the four basic operations.
    const ARITH: Option<Arith> = None;
    fn f(&self, x: &E, y: &E) -> E;
    fn dfdx(&self, x: &E, y: &E) -> E;
    fn dfdy(&self, x: &E, y: &E) -> E;
    fn const_dfdx(&self) -> E {
        unimplemented!()
    }
    fn const_dfdy(&self) -> E {
        unimplemented!()
    }
}

/// Lanes for reductions of a broadcast gradient.
const LANES: usize = 8;

/// `g[off + j·step] += coef · go[j]` for each `j`; a stride-0 `g` gets the sum, summed in lanes.
#[inline(always)]
fn accumulate<E: Dtype>(g: &mut [E], off: usize, step: usize, coef: E, go: &[E]) {
    match step {
        0 => {
            let (chunks, rest) = go.as_chunks::<LANES>();
            let mut acc = [E::default(); LANES];
            for c in chunks {
                for i in 0..LANES {
                    acc[i] += coef * c[i];
                }
            }
            let mut s = E::default();
            for a in acc {
                s += a;
            }
            for v in rest {
                s += coef * *v;
            }
            g[off] += s;
        }
        1 => {
            for (g, go) in g[off..off + go.len()].iter_mut().zip(go) {
                *g += coef * *go;
            }
        }
        _ => {
            for (j, go) in go.iter().enumerate() {
                g[off + j * step] += coef * *go;
            }
        }
    }
}

/// `g[off + j·step] += d[j] · go[j]` for each `j`, in f32 (`g` holds a 16-bit type).
#[inline(always)]
fn accumulate_f32<E: Dtype>(g: &mut [E], off: usize, step: usize, d: &[f32], go: &[f32]) {
    match step {
        0 => {
            let d = &d[..go.len()];
            let (dc, dr) = d.as_chunks::<LANES>();
            let (gc, gr) = go.as_chunks::<LANES>();
            let mut acc = [0.0f32; LANES];
            for (d, go) in dc.iter().zip(gc) {
                for i in 0..LANES {
                    acc[i] += d[i] * go[i];
                }
            }
            let mut s = 0.0f32;
            for a in acc {
                s += a;
            }
            for (d, go) in dr.iter().zip(gr) {
                s += *d * *go;
            }
            g[off] = E::from_f32(g[off].to_f32().unwrap() + s).unwrap();
        }
        1 => {
            let mut buf = [0.0f32; BLOCK];
            let g = &mut g[off..off + go.len()];
            for ((g, d), go) in g
                .chunks_mut(BLOCK)
                .zip(d.chunks(BLOCK))
                .zip(go.chunks(BLOCK))
            {
                let b = &mut buf[..g.len()];
                to_f32(g, b);
                for ((b, d), go) in b.iter_mut().zip(d).zip(go) {
                    *b += *d * *go;
                }
                from_f32(b, g);
            }
        }
        _ => {
            for (j, (d, go)) in d.iter().zip(go).enumerate() {
                let i = off + j * step;
                g[i] = E::from_f32(g[i].to_f32().unwrap() + *d * *go).unwrap();
            }
        }
    }
}

impl<E: Dtype, Op: UnaryDerivative<E> + Sync> UnaryKernel<Op, E> for Cpu {
    const BACKWARD_WITHOUT_INP: bool = Op::DF_USES_FX;
    const BACKWARD_WITHOUT_DATA: bool = Op::HAS_CONST_DF;

    fn forward<S: Shape>(
        &self,
        op: Op,
        inp: Cow<Tensor<S, E, Self>>,
    ) -> Result<Tensor<S, E, Self>, Self::Err> {
        let slices = f32_slices::<E, Op>();
        let mut out = match inp {
            Cow::Borrowed(inp) if !(Op::IN_F32 && is_half::<E>()) => {
                // typed-amp patch: `f(x)` written straight into a new buffer, in parallel
                // pieces, instead of copying the input (memcpy) and overwriting the copy; for
                // an op whose f32 slice form runs below, the copy itself.
                let data = try_map_in_parallel(&inp.data, |x| if slices { *x } else { op.f(x) })?;
                let data = crate::tensor::cpu::CachableVec {
                    data,
                    cache: self.cache.clone(),
                };
                let out = Tensor {
                    id: unique_id(),
                    data: std::sync::Arc::new(data),
                    shape: inp.shape,
                    strides: inp.strides,
                    device: self.clone(),
                    tape: Default::default(),
                };
                if !slices {
                    return Ok(out);
                }
                out
            }
            Cow::Borrowed(inp) => {
                // allocate a new data buffer
                Tensor {
                    id: unique_id(),
                    data: inp.data.clone(),
                    shape: inp.shape,
                    strides: inp.strides,
                    device: self.clone(),
                    tape: Default::default(),
                }
            }
            Cow::Owned(mut inp) => {
                // re-use the data buffer
                inp.id = unique_id();
                inp
            }
        };
        // NOTE: we can iterate over buf here because we know inp & out
        // have exact same strides due to clone.
        let buf: &mut [E] = &mut std::sync::Arc::make_mut(&mut out.data)[..];
        if let (true, Some(buf)) = (slices, as_f32_mut(buf)) {
            // typed-amp patch: the op's f32 slice form, a block at a time.
            par_elementwise(buf, BLOCK, |_, piece| op.f_f32(piece));
            return Ok(out);
        }
        if Op::IN_F32 && is_half::<E>() {
            // typed-amp patch: widen a block, run the op in f32, round once.
            par_elementwise(buf, BLOCK, |_, piece| {
                let mut b = [0.0f32; BLOCK];
                for chunk in piece.chunks_mut(BLOCK) {
                    let b = &mut b[..chunk.len()];
                    to_f32(chunk, b);
                    op.f_f32(b);
                    from_f32(b, chunk);
                }
            });
            return Ok(out);
        }
        par_elementwise(buf, 1, |_, piece| {
            for x in piece {
                *x = op.f(x);
            }
        });
        Ok(out)
    }
    fn backward<S: Shape>(
        &self,
        op: Op,
        inp: &impl Tensorlike<S, E, Self>,
        grad_inp: &mut Self::Vec,
        out: &impl Tensorlike<S, E, Self>,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let grad_inp: &mut [E] = grad_inp;
        let grad_out: &[E] = grad_out;
        let data: Option<&[E]> = match (inp.data(), out.data()) {
            (None, None) => None,
            (None, Some(out)) => Some(out),
            (Some(inp), None) => Some(inp),
            _ => unreachable!(),
        };
        if is_half::<E>() || f32_slices::<E, Op>() {
            // df in E (or in f32 by the op's slice form), then grad_inp += df · grad_out in f32,
            // a block at a time.
            let const_df = data.is_none().then(|| op.const_df());
            par_elementwise(grad_inp, BLOCK, |off, grad_inp| {
                let data = data.map(|x| &x[off..off + grad_inp.len()]);
                let grad_out = &grad_out[off..off + grad_inp.len()];
                half_unary_backward(&op, const_df, data, grad_out, grad_inp);
            });
            return Ok(());
        }
        par_elementwise(grad_inp, 1, |off, grad_inp| {
            let grad_out = &grad_out[off..off + grad_inp.len()];
            match data {
                None => {
                    let df = op.const_df();
                    for (x, go) in grad_inp.iter_mut().zip(grad_out) {
                        *x += df * *go;
                    }
                }
                Some(data) => {
                    // `f(x)` if the derivative uses it, else `x`.
                    let data = &data[off..off + grad_inp.len()];
                    for ((x, v), go) in grad_inp.iter_mut().zip(data).zip(grad_out) {
                        *x += op.df(v) * *go;
                    }
                }
            }
        });
        Ok(())
    }
}

/// A 16-bit unary op's backward over one piece: `df` in `E` (or in f32 from widened values for
/// [UnaryDerivative::IN_F32] ops), then `grad_inp += df · grad_out` in f32, a block at a time.
fn half_unary_backward<E: Dtype, Op: UnaryDerivative<E>>(
    op: &Op,
    const_df: Option<E>,
    data: Option<&[E]>,
    grad_out: &[E],
    grad_inp: &mut [E],
) {
    let (mut d, mut d32, mut go32) = ([E::default(); BLOCK], [0.0; BLOCK], [0.0; BLOCK]);
    for start in (0..grad_inp.len()).step_by(BLOCK) {
        let n = BLOCK.min(grad_inp.len() - start);
        match (const_df, data) {
            (Some(df), _) => {
                d[..n].fill(df);
                to_f32(&d[..n], &mut d32[..n]);
            }
            // typed-amp patch: the derivative in f32 from the widened values, not
            // rounded to E before it multiplies the gradient.
            (None, Some(x)) if Op::IN_F32 => {
                to_f32(&x[start..start + n], &mut d32[..n]);
                op.df_f32(&mut d32[..n]);
            }
            (None, Some(x)) => {
                for (d, x) in d[..n].iter_mut().zip(&x[start..start + n]) {
                    *d = op.df(x);
                }
                to_f32(&d[..n], &mut d32[..n]);
            }
            _ => unreachable!(),
        }
        to_f32(&grad_out[start..start + n], &mut go32[..n]);
        accumulate_f32(grad_inp, start, 1, &d32[..n], &go32[..n]);
    }
}

/// Where a binary op's forward writes: a new buffer, or in place over one of its operands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dst {
    New,
    OverLhs,
    OverRhs,
}

/// `out[i] = op.f(lhs[..], rhs[..])` over the contiguous `out` of shape `dims`, with each
/// operand read through its strides; with [Dst::OverLhs] (or [Dst::OverRhs]) that operand is
/// `out` itself (contiguous) and its buffer argument is ignored.
fn binary_forward<E: Dtype, Op: BinaryDerivative<E>>(
    op: &Op,
    dims: &[usize],
    lhs: (&[E], &[usize]),
    rhs: (&[E], &[usize]),
    out: &mut [E],
    dst: Dst,
) {
    if let (Some(arith), true) = (Op::ARITH, is_half::<E>()) {
        let (mut a, mut b, mut o32) = ([0.0f32; BLOCK], [0.0f32; BLOCK], [0.0f32; BLOCK]);
        for_each_run(dims, [lhs.1, rhs.1], |o, [ol, or], len, [sl, sr]| {
            for start in (0..len).step_by(BLOCK) {
                let n = BLOCK.min(len - start);
                let out = &mut out[o + start..o + start + n];
                let (a, b) = (&mut a[..n], &mut b[..n]);
                match dst {
                    Dst::OverLhs => to_f32(out, a),
                    _ => load_f32(lhs.0, ol + start * sl, sl, a),
                }
                match dst {
                    Dst::OverRhs => to_f32(out, b),
                    _ => load_f32(rhs.0, or + start * sr, sr, b),
                }
                for ((o, a), b) in o32[..n].iter_mut().zip(a.iter()).zip(b.iter()) {
                    *o = arith.apply(*a, *b);
                }
                from_f32(&o32[..n], out);
            }
        });
        return;
    }
    for_each_run(dims, [lhs.1, rhs.1], |o, [ol, or], len, [sl, sr]| {
        let out = &mut out[o..o + len];
        match dst {
            Dst::New => match (sl, sr) {
                (1, 1) => {
                    let (l, r) = (&lhs.0[ol..ol + len], &rhs.0[or..or + len]);
                    for ((o, l), r) in out.iter_mut().zip(l).zip(r) {
                        *o = op.f(l, r);
                    }
                }
                (1, 0) => {
                    let r = &rhs.0[or];
                    for (o, l) in out.iter_mut().zip(&lhs.0[ol..ol + len]) {
                        *o = op.f(l, r);
                    }
                }
                (0, 1) => {
                    let l = &lhs.0[ol];
                    for (o, r) in out.iter_mut().zip(&rhs.0[or..or + len]) {
                        *o = op.f(l, r);
                    }
                }
                _ => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = op.f(&lhs.0[ol + j * sl], &rhs.0[or + j * sr]);
                    }
                }
            },
            Dst::OverLhs => match sr {
                0 => {
                    let r = &rhs.0[or];
                    for o in out.iter_mut() {
                        *o = op.f(o, r);
                    }
                }
                1 => {
                    for (o, r) in out.iter_mut().zip(&rhs.0[or..or + len]) {
                        *o = op.f(o, r);
                    }
                }
                _ => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = op.f(o, &rhs.0[or + j * sr]);
                    }
                }
            },
            Dst::OverRhs => match sl {
                0 => {
                    let l = &lhs.0[ol];
                    for o in out.iter_mut() {
                        *o = op.f(l, o);
                    }
                }
                1 => {
                    for (o, l) in out.iter_mut().zip(&lhs.0[ol..ol + len]) {
                        *o = op.f(l, o);
                    }
                }
                _ => {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = op.f(&lhs.0[ol + j * sl], o);
                    }
                }
            },
        }
    });
}

/// [binary_forward] in pieces along the first dimension longer than one, in parallel for large
/// outputs ([par_elementwise]): `out` is contiguous, so each piece of that dimension's indices
/// owns one contiguous part of it, and reads its operands from their own offsets.
fn binary_forward_par<E: Dtype, Op: BinaryDerivative<E> + Sync>(
    op: &Op,
    dims: &[usize],
    lhs: (&[E], &[usize]),
    rhs: (&[E], &[usize]),
    out: &mut [E],
    dst: Dst,
) {
    let Some(axis) = dims.iter().position(|&d| d > 1) else {
        return binary_forward(op, dims, lhs, rhs, out, dst);
    };
    let inner: usize = dims[axis + 1..].iter().product();
    par_elementwise(out, inner, |off, piece| {
        let first = off / inner;
        let mut sub = dims.to_vec();
        sub[axis] = piece.len() / inner;
        // An operand written over is `out` itself: its buffer argument is not read.
        let (l, r) = (
            if dst == Dst::OverLhs {
                lhs.0
            } else {
                &lhs.0[first * lhs.1[axis]..]
            },
            if dst == Dst::OverRhs {
                rhs.0
            } else {
                &rhs.0[first * rhs.1[axis]..]
            },
        );
        binary_forward(op, &sub, (l, lhs.1), (r, rhs.1), piece, dst);
    });
}

/// typed-amp patch: a binary op's backward for 16-bit `E`: the derivatives in `E`, then
/// `grad += d · grad_out` in f32, a block at a time, into gradients stored as `G` (`E` itself,
/// or f32 buffers that the caller rounds once).
fn binary_backward_f32<E: Dtype, G: Dtype, Op: BinaryDerivative<E>>(
    op: &Op,
    dims: &[usize],
    strides: [&[usize]; 2],
    data: Option<(&[E], &[E])>,
    grad_out: &[E],
    grad_lhs: &mut [G],
    grad_rhs: &mut [G],
) {
    // Derivatives in E, then grad += d · grad_out in f32, a block at a time.
    let (mut dl, mut dr) = ([E::default(); BLOCK], [E::default(); BLOCK]);
    let (mut dl32, mut dr32, mut go32) = ([0.0; BLOCK], [0.0; BLOCK], [0.0; BLOCK]);
    let consts = data.is_none().then(|| (op.const_dfdx(), op.const_dfdy()));
    for_each_run(dims, strides, |o, [ol, or], len, [sl, sr]| {
        for start in (0..len).step_by(BLOCK) {
            let n = BLOCK.min(len - start);
            let (ol, or) = (ol + start * sl, or + start * sr);
            match (consts, data) {
                (Some((dx, dy)), _) => {
                    dl[..n].fill(dx);
                    dr[..n].fill(dy);
                }
                (None, Some((lb, rb))) => {
                    for j in 0..n {
                        let (l, r) = (&lb[ol + j * sl], &rb[or + j * sr]);
                        dl[j] = op.dfdx(l, r);
                        dr[j] = op.dfdy(l, r);
                    }
                }
                _ => unreachable!(),
            }
            to_f32(&dl[..n], &mut dl32[..n]);
            to_f32(&dr[..n], &mut dr32[..n]);
            to_f32(&grad_out[o + start..o + start + n], &mut go32[..n]);
            accumulate_f32(grad_lhs, ol, sl, &dl32[..n], &go32[..n]);
            accumulate_f32(grad_rhs, or, sr, &dr32[..n], &go32[..n]);
        }
    });
}

// typed-amp patch: `CpuCompute` bound (bf16 accumulates its gradients in f32).
impl<E: Dtype + crate::dtypes::CpuCompute, Op: BinaryDerivative<E> + Sync> BinaryKernel<Op, E>
    for Cpu
{
    const BACKWARD_WITHOUT_DATA: bool = Op::HAS_CONST_DF;
    fn forward<S: Shape>(
        &self,
        op: Op,
        lhs: Cow<Tensor<S, E, Self>>,
        rhs: Cow<Tensor<S, E, Self>>,
    ) -> Result<Tensor<S, E, Self>, Self::Err> {
        match (lhs, rhs) {
            (Cow::Borrowed(lhs), Cow::Borrowed(rhs)) => {
                let mut out = self.try_zeros_like(&lhs.shape)?;
                let dims = lhs.shape.concrete();
                binary_forward_par(
                    &op,
                    dims.as_ref(),
                    (&lhs.data, lhs.strides.as_ref()),
                    (&rhs.data, rhs.strides.as_ref()),
                    &mut std::sync::Arc::make_mut(&mut out.data)[..],
                    Dst::New,
                );
                Ok(out)
            }
            (Cow::Owned(mut lhs), Cow::Owned(mut rhs)) => {
                let lhs_valid = lhs.strides == lhs.shape.strides();
                let rhs_valid = rhs.strides == rhs.shape.strides();
                if lhs_valid || rhs_valid {
                    let lhs_count = std::sync::Arc::strong_count(&lhs.data);
                    let rhs_count = std::sync::Arc::strong_count(&rhs.data);
                    let dims = lhs.shape.concrete();
                    if rhs_valid && (rhs_count == 1 || !lhs_valid || lhs_count != 1) {
                        rhs.id = unique_id();
                        let strides = rhs.strides;
                        binary_forward_par(
                            &op,
                            dims.as_ref(),
                            (&lhs.data, lhs.strides.as_ref()),
                            (&[], strides.as_ref()),
                            &mut std::sync::Arc::make_mut(&mut rhs.data)[..],
                            Dst::OverRhs,
                        );
                        Ok(rhs)
                    } else {
                        lhs.id = unique_id();
                        let strides = lhs.strides;
                        binary_forward_par(
                            &op,
                            dims.as_ref(),
                            (&[], strides.as_ref()),
                            (&rhs.data, rhs.strides.as_ref()),
                            &mut std::sync::Arc::make_mut(&mut lhs.data)[..],
                            Dst::OverLhs,
                        );
                        Ok(lhs)
                    }
                } else {
                    <Self as BinaryKernel<Op, E>>::forward(
                        self,
                        op,
                        Cow::Borrowed(&lhs),
                        Cow::Borrowed(&rhs),
                    )
                }
            }
            _ => unreachable!(),
        }
    }
    fn backward<S: Shape>(
        &self,
        op: Op,
        lhs: &impl Tensorlike<S, E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &impl Tensorlike<S, E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let dims = lhs.shape().concrete();
        let (ls, rs) = (lhs.strides(), rhs.strides());
        let grad_lhs: &mut [E] = grad_lhs;
        let grad_rhs: &mut [E] = grad_rhs;
        let grad_out: &[E] = grad_out;
        // NOTE: grad_out is contiguous: the outcome of this op's forward.
        let data = match (lhs.data(), rhs.data()) {
            (Some(l), Some(r)) => Some((&l[..], &r[..])),
            (None, None) => {
                assert!(Op::HAS_CONST_DF);
                None
            }
            _ => unreachable!(),
        };
        let contiguous = lhs.shape().strides();
        let n = grad_out.len();
        if ls == contiguous && rs == contiguous && grad_lhs.len() == n && grad_rhs.len() == n {
            // Both operands laid out as the output: one flat run, split into pieces that own
            // their parts of both gradients.
            let go = grad_out;
            let gr = super::cpu_f32::SendPtr(grad_rhs.as_mut_ptr());
            par_elementwise(grad_lhs, 1, |off, gl| {
                let len = gl.len();
                let gr = gr;
                // SAFETY: `grad_rhs` has `n` elements like `grad_lhs` (checked above), and each
                // piece takes the same range `off..off + len` of both, disjoint from the others'.
                let gr = unsafe { std::slice::from_raw_parts_mut(gr.0.add(off), len) };
                let data = data.map(|(l, r)| (&l[off..off + len], &r[off..off + len]));
                binary_backward_slices(
                    &op,
                    &[len],
                    [&[1], &[1]],
                    data,
                    &go[off..off + len],
                    gl,
                    gr,
                );
            });
            return Ok(());
        }
        binary_backward_slices(
            &op,
            dims.as_ref(),
            [ls.as_ref(), rs.as_ref()],
            data,
            grad_out,
            grad_lhs,
            grad_rhs,
        );
        Ok(())
    }
}

/// A binary op's backward over gradients and operands read through `strides` (`grad_out`
/// contiguous over `dims`).
fn binary_backward_slices<E: Dtype + crate::dtypes::CpuCompute, Op: BinaryDerivative<E>>(
    op: &Op,
    dims: &[usize],
    strides: [&[usize]; 2],
    data: Option<(&[E], &[E])>,
    grad_out: &[E],
    grad_lhs: &mut [E],
    grad_rhs: &mut [E],
) {
    if is_half::<E>() {
        use crate::dtypes::CpuCompute;
        if E::WIDENS {
            // A broadcast operand (a bias, a batch statistic) receives one gradient term
            // per output element, one run of them at a time. In bf16 a running sum stops
            // growing at 2^8 times its terms, so bf16 accumulates the whole gradient in
            // f32 and rounds each element once; f16 (11 bits) rounds once per run.
            let mut gl32 = std::vec![0.0f32; grad_lhs.len()];
            let mut gr32 = std::vec![0.0f32; grad_rhs.len()];
            to_f32(grad_lhs, &mut gl32);
            to_f32(grad_rhs, &mut gr32);
            binary_backward_f32(op, dims, strides, data, grad_out, &mut gl32, &mut gr32);
            from_f32(&gl32, grad_lhs);
            from_f32(&gr32, grad_rhs);
        } else {
            binary_backward_f32(op, dims, strides, data, grad_out, grad_lhs, grad_rhs);
        }
        return;
    }
    match data {
        Some((lhs_buf, rhs_buf)) => {
            for_each_run(dims, strides, |o, [ol, or], len, [sl, sr]| {
                let go = &grad_out[o..o + len];
                match (sl, sr) {
                    (1, 1) => {
                        let l = &lhs_buf[ol..ol + len];
                        let r = &rhs_buf[or..or + len];
                        let gl = &mut grad_lhs[ol..ol + len];
                        let gr = &mut grad_rhs[or..or + len];
                        for ((((l, r), go), gl), gr) in l.iter().zip(r).zip(go).zip(gl).zip(gr) {
                            *gl += op.dfdx(l, r) * *go;
                            *gr += op.dfdy(l, r) * *go;
                        }
                    }
                    _ => {
                        // Accumulate a stride-0 gradient in a register, in the same order
                        // as element by element in memory.
                        let (mut al, mut ar) = (grad_lhs[ol], grad_rhs[or]);
                        for (j, go) in go.iter().enumerate() {
                            let (il, ir) = (ol + j * sl, or + j * sr);
                            let (l, r) = (&lhs_buf[il], &rhs_buf[ir]);
                            let (dl, dr) = (op.dfdx(l, r) * *go, op.dfdy(l, r) * *go);
                            if sl == 0 {
                                al += dl;
                            } else {
                                grad_lhs[il] += dl;
                            }
                            if sr == 0 {
                                ar += dr;
                            } else {
                                grad_rhs[ir] += dr;
                            }
                        }
                        if sl == 0 {
                            grad_lhs[ol] = al;
                        }
                        if sr == 0 {
                            grad_rhs[or] = ar;
                        }
                    }
                }
            });
        }
        None => {
            let dx = op.const_dfdx();
            let dy = op.const_dfdy();
            for_each_run(dims, strides, |o, [ol, or], len, [sl, sr]| {
                let go = &grad_out[o..o + len];
                accumulate(grad_lhs, ol, sl, dx, go);
                accumulate(grad_rhs, or, sr, dy, go);
            });
        }
    }
}
