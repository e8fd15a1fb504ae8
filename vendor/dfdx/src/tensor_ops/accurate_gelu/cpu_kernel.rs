use crate::tensor_ops::cpu_kernels::UnaryDerivative;
#[cfg(feature = "f16")]
use half::f16;
use libm::erf;
use num_traits::{Float, FloatConst};

// typed-amp patch: f32's erf and exp (GELU's and its derivative's) come from typed-amp's
// kernels, without branches or library calls, so that the elementwise loops vectorize (libm's
// `erff` was about a tenth of a ViT's FP32 step); 16-bit values go through the same f32 erf.
#[cfg(not(feature = "cpu"))]
use libm::{erff, expf as exp_f32};
#[cfg(feature = "cpu")]
use typed_amp_kernels::math::{erf_f32 as erff, exp_f32};

trait Erf {
    fn erf(self) -> Self;
    /// typed-amp patch: `exp`, through `exp_f32` for f32.
    fn exp_(self) -> Self;
}

#[cfg(feature = "f16")]
impl Erf for crate::dtypes::AMP<f16> {
    fn erf(self) -> Self {
        crate::dtypes::AMP(f16::from_f32(erff(self.0.to_f32())))
    }
    fn exp_(self) -> Self {
        self.exp()
    }
}

#[cfg(feature = "f16")]
impl Erf for f16 {
    fn erf(self) -> Self {
        f16::from_f32(erff(self.to_f32()))
    }
    fn exp_(self) -> Self {
        self.exp()
    }
}

// typed-amp patch: erf for bfloat16, evaluated in f32 and rounded once, as for f16.
#[cfg(feature = "f16")]
impl Erf for half::bf16 {
    fn erf(self) -> Self {
        half::bf16::from_f32(erff(self.to_f32()))
    }
    fn exp_(self) -> Self {
        self.exp()
    }
}

impl Erf for f64 {
    fn erf(self) -> Self {
        erf(self)
    }
    fn exp_(self) -> Self {
        self.exp()
    }
}

impl Erf for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        erff(self)
    }
    #[inline(always)]
    fn exp_(self) -> Self {
        exp_f32(self)
    }
}

impl<F: Float + FloatConst + Erf> UnaryDerivative<F> for super::AccurateGeLUKernelOp {
    const DF_USES_FX: bool = false;
    const HAS_CONST_DF: bool = false;
    // typed-amp patch: 16-bit values run the op in f32 (see UnaryDerivative::IN_F32).
    const IN_F32: bool = true;
    // typed-amp patch: f32 tensors take the slice forms too (with the `cpu` feature, vectorised
    // for the CPU at run time; the same bits as `f`/`df`).
    const F32_SLICES: bool = cfg!(feature = "cpu");
    // typed-amp patch: with the `cpu` feature, typed-amp's kernels run the same f32 formulas
    // over the slice in code built for the CPU's widest vectors (the same bits as `f`/`df`).
    fn f_f32(&self, xs: &mut [f32]) {
        #[cfg(feature = "cpu")]
        typed_amp_kernels::math::gelu_slice(xs);
        #[cfg(not(feature = "cpu"))]
        for x in xs {
            *x = <Self as UnaryDerivative<f32>>::f(self, x);
        }
    }
    fn df_f32(&self, xs: &mut [f32]) {
        #[cfg(feature = "cpu")]
        typed_amp_kernels::math::gelu_derivative_slice(xs);
        #[cfg(not(feature = "cpu"))]
        for x in xs {
            *x = <Self as UnaryDerivative<f32>>::df(self, x);
        }
    }
    #[inline(always)]
    fn f(&self, &x: &F) -> F {
        let alpha = F::FRAC_1_SQRT_2();
        F::from(0.5).unwrap() * x * (F::one() + (x * alpha).erf())
    }

    #[inline(always)]
    fn df(&self, &x: &F) -> F {
        let half = F::from(0.5).unwrap();
        let alpha = F::FRAC_1_SQRT_2();
        let x_sq = x * x;
        let normal_dist = F::FRAC_2_SQRT_PI() * (F::from(0.5).unwrap() * x_sq.neg()).exp_();

        let left = half * x;
        let right = F::one() + (alpha * x).erf();

        let left_derivative = half * right;

        // typed-amp patch: d/dx erf(x/sqrt 2) carries the chain rule's 1/sqrt 2 (alpha).
        let right_derivative = left * normal_dist * alpha;

        left_derivative + right_derivative
    }
}
