//! Softmax along an axis.
//!
//! typed-amp patch: [SoftmaxKernel] runs it. Its default is upstream's composition (max,
//! subtract, exp, sum, divide: five passes, two reductions and two broadcasts, each with its
//! backward op); the CPU overrides it for `f32` and `f64` along the last axis of a contiguous
//! tensor with one fused pass per row forward and one backward, in parallel over rows
//! (`cpu_kernel.rs`). 16-bit types keep the composition in their own precision, whose overflow
//! typed-amp's policy table exists to avoid.

mod cpu_kernel;
#[cfg(feature = "cuda")]
mod cuda_kernel;

use super::*;
use crate::{shapes::*, tensor::*};

/// typed-amp patch: how a device runs softmax. The default is upstream's composition of
/// generic ops ([softmax_composed]); a device overrides it with a fused kernel.
pub trait SoftmaxKernel<E: Dtype>: Storage<E> {
    /// Softmax of `x` along `Ax`.
    fn try_softmax_along<S: Shape, T: Tape<E, Self>, Ax: Axes>(
        x: Tensor<S, E, Self, T>,
    ) -> Result<Tensor<S, E, Self, T>, Self::Err>
    where
        Self: Device<E>,
        S: ReduceShape<Ax>,
    {
        softmax_composed::<Ax, S, E, Self, T>(x)
    }
}

/// Computes the [softmax function](https://en.wikipedia.org/wiki/Softmax_function) across
/// `Ax`.
///
/// Equivalent to `exp(log_softmax(t))`.
///
/// **Pytorch equivalent**: `t.softmax(Axes)`
///
/// Example:
/// ```rust
/// # use dfdx::prelude::*;
/// # let dev: Cpu = Default::default();
/// let t: Tensor<Rank3<2, 3, 5>, f32, _> = dev.zeros();
/// let _ = t.softmax::<Axis<2>>();
/// ```
pub fn softmax<Ax: Axes, S: Shape, E: Dtype, D: Device<E>, T: Tape<E, D>>(
    t: Tensor<S, E, D, T>,
) -> Tensor<S, E, D, T>
where
    S: ReduceShape<Ax>,
{
    t.softmax::<Ax>()
}

impl<S: Shape, E: Dtype, D: Device<E>, T: Tape<E, D>> Tensor<S, E, D, T> {
    /// See [softmax()]
    pub fn softmax<Ax: Axes>(self) -> Self
    where
        S: ReduceShape<Ax>,
    {
        self.try_softmax::<Ax>().unwrap()
    }
    /// See [softmax()]
    pub fn try_softmax<Ax: Axes>(self) -> Result<Self, D::Err>
    where
        S: ReduceShape<Ax>,
    {
        D::try_softmax_along::<S, T, Ax>(self)
    }
}

/// Upstream dfdx's softmax, composed of generic ops.
pub(crate) fn softmax_composed<Ax: Axes, S: Shape, E: Dtype, D: Device<E>, T: Tape<E, D>>(
    t: Tensor<S, E, D, T>,
) -> Result<Tensor<S, E, D, T>, D::Err>
where
    S: ReduceShape<Ax>,
{
    {
        /*
        # Notes on this reduction

        Softmax is equivalent to:
            `t.log_softmax().exp()`

        which when given the log_softmax reductions is equivalent to:
            `(t - t.logsumexp()).exp()`

        logsumexp can be inlined to:
            `(t - ((t - t.max()).exp().sum().ln() + t.max())).exp()`

        we can apply the subtraction in the following way:
            `(t - (t - t.max()).exp().sum().ln() - t.max()).exp()`
            `(t - t.max() - (t - t.max()).exp().sum().ln()).exp()`

        Notice there is a repeated expression here of `t - t.max()`.
        So we can re-use this calculation. Let's denote this expression tm:
            `(tm - tm.exp().sum().ln()).exp()`

        Another reduction is the identity of the form `e^(x - y)` = `e^x / e^y`.
            `tm.exp() / tm.exp().sum().ln().exp()`

        First we can re-use the `tm.exp()` calculation - lets call it tme
            `tme / tme.sum().ln().exp()`

        And finally we know that `t.ln().exp()` is equivalent to `t`. I.e. they are
        fused
            `tme / tme.sum()`
        */
        let shape = *t.shape();
        let (t, tape) = t.split_tape();
        let max = t.clone().try_max::<_, Ax>()?;
        let t = {
            // in place subtraction of max since we don't want to record this
            // on the auto diff graph.
            let keep_id = t.id;
            let mut t = t.try_sub(max.try_broadcast_like::<_, Ax>(&shape)?)?;
            t.id = keep_id;
            t
        };
        let t_exp = t.put_tape(tape).try_exp()?;
        let t_expsum = t_exp.retaped::<T>().try_sum::<_, Ax>()?;
        t_exp.try_div(t_expsum.try_broadcast_like(&shape)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::{shapes::*, tensor::*, tensor_ops::*, tests::*};

    /// typed-amp patch: the fused CPU softmax (last axis, contiguous, f32) against the
    /// composition (run directly) and an f64 reference. 3,000 rows of 33: several parallel
    /// pieces, each row's arithmetic the same in both paths.
    ///
    /// Bounds, with u = 2⁻²⁴ and n = 33: the output is the composition's bit for bit (same
    /// operations in the same order). Against f64: `exp` within 1 ulp, the row sum's n − 1
    /// additions and the division keep `|y − y₆₄| ≤ (n + 4)·u·y₆₄`. The input gradient
    /// `y·(dy − Σ dy·y)` from those `y`: the dot product's n roundings, the subtraction and the
    /// product put it within `(2n + 12)·u·y₆₄·(|dy| + Σ|dy·y₆₄|)` of the f64 value, and the
    /// composition's gradient (the backward ops of divide, sum and exp, its own sum of n terms)
    /// within twice that of the fused one.
    #[cfg(feature = "cpu")]
    #[test]
    fn test_fused_softmax_against_composition_and_f64() {
        const N: usize = 33;
        let w = |v: f32| -> f64 { v.into() };
        let dev: Cpu = Cpu::seed_from_u64(7);
        let rows = 3000;
        let x: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));
        let x = x * 4.0;
        let dy: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));

        let fused = x.leaky_trace().softmax::<Axis<1>>();
        let composed = super::softmax_composed::<Axis<1>, _, _, _, _>(x.leaky_trace()).unwrap();
        assert_eq!(
            fused.as_vec(),
            composed.as_vec(),
            "fused forward is the composition's"
        );
        let (yv, xv, dyv) = (fused.as_vec(), x.as_vec(), dy.as_vec());
        let g_fused = (fused * dy.clone()).sum().backward();
        let g_composed = (composed * dy.clone()).sum().backward();
        let (gf, gc) = (g_fused.get(&x).as_vec(), g_composed.get(&x).as_vec());

        let u = w(f32::EPSILON) / 2.0;
        let n = N as f64;
        for r in 0..rows {
            let row = |v: &[f32]| -> std::vec::Vec<f64> {
                v[r * N..(r + 1) * N].iter().map(|a| w(*a)).collect()
            };
            let (xs, dys) = (row(&xv), row(&dyv));
            let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: std::vec::Vec<f64> = xs.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            let y64: std::vec::Vec<f64> = e.iter().map(|v| v / sum).collect();
            let dot: f64 = dys.iter().zip(&y64).map(|(g, y)| g * y).sum();
            let mag: f64 = dys.iter().zip(&y64).map(|(g, y)| (g * y).abs()).sum();
            for c in 0..N {
                let i = r * N + c;
                let y_bound = (n + 4.0) * u * y64[c];
                assert!((w(yv[i]) - y64[c]).abs() <= y_bound, "y[{i}]");
                let exact = y64[c] * (dys[c] - dot);
                let g_bound = (2.0 * n + 12.0) * u * y64[c] * (dys[c].abs() + mag);
                assert!(
                    (w(gf[i]) - exact).abs() <= g_bound,
                    "fused dx[{i}]: {} vs {exact} (bound {g_bound})",
                    gf[i]
                );
                assert!(
                    (w(gf[i]) - w(gc[i])).abs() <= 2.0 * g_bound,
                    "fused vs composed dx[{i}]"
                );
            }
        }
    }

    /// typed-amp patch: a softmax along another axis, or of a permuted tensor, runs the
    /// composition; on the same values it agrees with the fused one.
    #[cfg(feature = "cpu")]
    #[test]
    fn test_softmax_not_last_or_not_contiguous_runs_the_composition() {
        let dev: Cpu = Cpu::seed_from_u64(8);
        let x: Tensor<Rank2<5, 9>, f32, _> = dev.sample_normal();
        let fused = x.clone().softmax::<Axis<1>>().as_vec();
        let xt = x.clone().permute::<_, Axes2<1, 0>>();
        let by_axis0 = xt.softmax::<Axis<0>>().permute::<_, Axes2<1, 0>>();
        for (a, b) in fused.iter().zip(by_axis0.as_vec()) {
            assert!((a - b).abs() <= 40.0 * f32::EPSILON * a.abs().max(b.abs()));
        }
    }

    #[test]
    fn test_softmax_equivalence() {
        let dev: TestDevice = Default::default();
        let t: Tensor<Rank4<8, 16, 32, 64>, TestDtype, _> = dev.sample_normal();
        let p = t.leaky_trace().softmax::<Axis<3>>();
        let p_truth = t.leaky_trace().log_softmax::<Axis<3>>().exp();
        // we can't create an array as it will overflow the stack
        for (p_i, pt_i) in p.as_vec().iter().zip(p_truth.as_vec().iter()) {
            assert!((p_i - pt_i).abs() <= TestDtype::DEFAULT_TOLERANCE);
        }
        let g = p.square().mean().backward();
        let g_truth = p_truth.square().mean().backward();
        for (g_i, gt_i) in g
            .get(&t)
            .as_vec()
            .iter()
            .zip(g_truth.get(&t).as_vec().iter())
        {
            assert!((g_i - gt_i).abs() <= TestDtype::DEFAULT_TOLERANCE);
        }
    }

    #[test]
    fn test_softmax_1d() {
        let dev: TestDevice = Default::default();
        let a = dev
            .tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
            .to_dtype::<TestDtype>();
        let r = a.leaky_trace().softmax();
        assert_close_to_literal!(
            r,
            [0.011656232, 0.031684924, 0.086128555, 0.23412168, 0.6364087]
        );
        let l = r * dev
            .tensor([0.0, 0.0, 1.0, 0.0, 0.0])
            .to_dtype::<TestDtype>();
        assert_close_to_literal!(l, [0.0, 0.0, 0.086128555, 0.0, 0.0]);
        let g = l.mean().backward();
        assert_close_to_literal!(
            g.get(&a),
            [
                -0.00020078686,
                -0.00054579525,
                0.015742086,
                -0.0040329117,
                -0.010962591,
            ]
        );
    }

    #[test]
    fn test_softmax_2d() {
        let dev: TestDevice = Default::default();
        let a = dev
            .tensor([[-2.0, -1.0, 0.0], [1.0, 4.0, 7.0]])
            .to_dtype::<TestDtype>();
        let r = a.leaky_trace().softmax::<Axis<1>>();
        assert_close_to_literal!(
            r,
            [
                [0.09003058, 0.24472849, 0.66524094],
                [0.002355633, 0.047314156, 0.9503302],
            ]
        );
        let l = r * dev
            .tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
            .to_dtype::<TestDtype>();
        assert_close_to_literal!(l, [[0.09003058, 0.0, 0.0], [0.0, 0.047314156, 0.0]]);
        let g = l.mean().backward();
        assert_close_to_literal!(
            g.get(&a),
            [
                [0.01365418, -0.0036721744, -0.009982005],
                [-1.85758e-5, 0.0075125876, -0.0074940124],
            ]
        );
    }

    #[test]
    fn test_softmax_2d_0th_axis() {
        let dev: TestDevice = Default::default();
        let a = dev
            .tensor([[-2.0, -1.0, 0.0], [1.0, 4.0, 7.0]])
            .to_dtype::<TestDtype>();
        let r = a.leaky_trace().softmax::<Axis<0>>();
        assert_close_to_literal!(
            r,
            [
                [0.047425874, 0.0066928514, 0.0009110514],
                [0.95257413, 0.9933072, 0.9990892],
            ]
        );
        let l = r * dev
            .tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
            .to_dtype::<TestDtype>();
        assert_close_to_literal!(l, [[0.047425874, 0.0, 0.0], [0.0, 0.9933072, 0.0]]);
        let g = l.mean().backward();
        assert_close_to_literal!(
            g.get(&a),
            [
                [0.0075294436, -0.0011080095, 0.0],
                [-0.0075294436, 0.0011080056, 0.0],
            ]
        );
    }

    #[test]
    fn test_softmax_3d_to_1d_12() {
        let dev: TestDevice = Default::default();
        let t: Tensor<Rank3<2, 3, 4>, TestDtype, _> = dev.sample_normal();
        let r = t.leaky_trace().softmax::<Axes2<1, 2>>();
        #[rustfmt::skip]
        assert_close_to_literal!(
            r,
            [
                [[0.08535644, 0.0987266, 0.00366116, 0.04927256], [0.01169326, 0.1515922, 0.00951258, 0.07721686], [0.0776206, 0.23813945, 0.19471556, 0.00249278]],
                [[0.01881982, 0.25171953, 0.02559674, 0.03725754], [0.04064152, 0.314442, 0.02427996, 0.04708378], [0.02791536, 0.14462142, 0.02221143, 0.04541067]],
            ]
        );
    }
}
