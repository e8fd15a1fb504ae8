use crate::tensor_ops::cpu_kernels::{BinaryDerivative, UnaryDerivative};

use num_traits::Float;

impl<F: Float> UnaryDerivative<F> for super::ScalarMulKernelOp<F> {
    const DF_USES_FX: bool = false;
    const HAS_CONST_DF: bool = true;
    // typed-amp patch: 16-bit values run the op in f32 (see UnaryDerivative::IN_F32); the
    // scalar is exact in f32, so each result is the one `half`'s operator rounds to.
    const IN_F32: bool = true;
    fn f_f32(&self, xs: &mut [f32]) {
        let s = num_traits::ToPrimitive::to_f32(&self.scalar).unwrap_or(f32::NAN);
        for x in xs {
            *x = *x * s;
        }
    }
    fn df_f32(&self, xs: &mut [f32]) {
        let s = num_traits::ToPrimitive::to_f32(&self.scalar).unwrap_or(f32::NAN);
        xs.fill(s);
    }
    #[inline(always)]
    fn f(&self, &x: &F) -> F {
        x * self.scalar
    }
    #[inline(always)]
    fn df(&self, _: &F) -> F {
        self.scalar
    }
    fn const_df(&self) -> F {
        self.scalar
    }
}

impl<F: Float> BinaryDerivative<F> for super::BinaryMulKernelOp {
    const HAS_CONST_DF: bool = false;
    // typed-amp patch: 16-bit types compute the forward in f32 a block at a time
    const ARITH: Option<crate::tensor_ops::cpu_kernels::Arith> =
        Some(crate::tensor_ops::cpu_kernels::Arith::Mul);
    #[inline(always)]
    fn f(&self, &x: &F, &y: &F) -> F {
        x * y
    }
    #[inline(always)]
    fn dfdx(&self, _x: &F, &y: &F) -> F {
        y
    }
    #[inline(always)]
    fn dfdy(&self, &x: &F, _y: &F) -> F {
        x
    }
}
