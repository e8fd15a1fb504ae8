#![allow(clippy::needless_return)]

use crate::shapes::*;
use crate::tensor::{Cpu, Tensor, ZerosTensor};

use std::sync::Arc;

use crate::tensor_ops::utilities::cpu_f32::{par_for, SendPtr};

#[allow(unused)]
#[allow(clippy::too_many_arguments)]
fn naive_gemm<F: num_traits::Float + std::ops::AddAssign, M: Dim, K: Dim, N: Dim>(
    (m, k, n): (M, K, N),
    accum: bool,
    ap: *const F,
    a_strides: [usize; 2],
    bp: *const F,
    b_strides: [usize; 2],
    cp: *mut F,
    c_strides: [usize; 2],
) {
    for i_m in 0..m.size() {
        for i_k in 0..k.size() {
            for i_n in 0..n.size() {
                unsafe {
                    let a = *ap.add(a_strides[0] * i_m + a_strides[1] * i_k);
                    let b = *bp.add(b_strides[0] * i_k + b_strides[1] * i_n);
                    let c = cp.add(c_strides[0] * i_m + c_strides[1] * i_n);
                    if accum {
                        *c += a * b;
                    } else {
                        *c = a * b;
                    }
                }
            }
        }
    }
}

pub(crate) trait MatMulImpl<E> {
    #[allow(clippy::too_many_arguments)]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        dims: (M, K, N),
        accum: bool,
        ap: *const E,
        a_strides: [usize; 2],
        bp: *const E,
        b_strides: [usize; 2],
        cp: *mut E,
        c_strides: [usize; 2],
    );

    /// typed-amp patch: the product of `E` operands into an `f32` C (written, or with `accum`
    /// added to), accumulated in f32 and never rounded to `E`: for 16-bit types a conv's
    /// `Wᵀ·dY` and `dY·colsᵀ` land in the f32 buffers they are summed in, without a 16-bit
    /// copy and a widening pass. The default (f32, f64 has no caller) is `matmul` itself.
    #[allow(clippy::too_many_arguments)]
    fn matmul_f32_out<M: Dim, K: Dim, N: Dim>(
        dims: (M, K, N),
        accum: bool,
        ap: *const E,
        a_strides: [usize; 2],
        bp: *const E,
        b_strides: [usize; 2],
        cp: *mut f32,
        c_strides: [usize; 2],
    ) {
        assert_eq!(
            std::mem::size_of::<E>(),
            std::mem::size_of::<f32>(),
            "matmul_f32_out: a 16-bit type must run on typed-amp's kernels"
        );
        Self::matmul(
            dims,
            accum,
            ap,
            a_strides,
            bp,
            b_strides,
            cp as *mut E,
            c_strides,
        )
    }
}

/// typed-amp patch: f32, f16 and AMP<f16> products run on `typed_amp_kernels::gemm`
/// (blocked, AVX-512 / AVX2 selected at run time, 16-bit operands widened to f32 while packing
/// and accumulated in f32) instead of gemm 0.15, whose f16 path converts element by element.
/// `E` must have the layout of `K` (checked by the callers' `repr(transparent)` types).
#[cfg(feature = "cpu")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn typed_amp_gemm<E, K: typed_amp_kernels::GemmElem, M: Dim, KD: Dim, N: Dim>(
    (m, k, n): (M, KD, N),
    accum: bool,
    ap: *const E,
    astr: [usize; 2],
    bp: *const E,
    bstr: [usize; 2],
    cp: *mut E,
    cstr: [usize; 2],
) {
    debug_assert_eq!(std::mem::size_of::<E>(), std::mem::size_of::<K>());
    typed_amp_kernels::gemm::<K>(
        m.size(),
        n.size(),
        k.size(),
        ap as *const K,
        astr[0] as isize,
        astr[1] as isize,
        bp as *const K,
        bstr[0] as isize,
        bstr[1] as isize,
        cp as *mut K,
        cstr[0] as isize,
        cstr[1] as isize,
        accum,
        rayon::current_num_threads(),
    )
}

/// typed-amp patch: `typed_amp_gemm` with an f32 C (`typed_amp_kernels::gemm_epilogue`, the
/// plain store or accumulation: no scale, bias or activation).
#[cfg(feature = "cpu")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn typed_amp_gemm_f32_out<E, K, M: Dim, KD: Dim, N: Dim>(
    (m, k, n): (M, KD, N),
    accum: bool,
    ap: *const E,
    astr: [usize; 2],
    bp: *const E,
    bstr: [usize; 2],
    cp: *mut f32,
    cstr: [usize; 2],
) where
    K: typed_amp_kernels::GemmElem,
    f32: typed_amp_kernels::GemmOut<K>,
{
    debug_assert_eq!(std::mem::size_of::<E>(), std::mem::size_of::<K>());
    let epilogue = typed_amp_kernels::Epilogue {
        accumulate: accum,
        ..typed_amp_kernels::Epilogue::STORE
    };
    // SAFETY: the caller's contract is `gemm_epilogue`'s (no bias, so nothing else to alias).
    unsafe {
        typed_amp_kernels::gemm_epilogue::<K, f32>(
            m.size(),
            n.size(),
            k.size(),
            ap as *const K,
            astr[0] as isize,
            astr[1] as isize,
            bp as *const K,
            bstr[0] as isize,
            bstr[1] as isize,
            cp,
            cstr[0] as isize,
            cstr[1] as isize,
            &epilogue,
            rayon::current_num_threads(),
        );
    }
}

/// typed-amp patch: `MatMulImpl::matmul_f32_out` for a 16-bit type `$e` laid out as `$k` and
/// widened to f32 by `$widen` (the naive product's, without the `cpu` feature's kernels).
macro_rules! matmul_f32_out_16 {
    ($e:ty, $k:ty, $widen:expr) => {
        #[inline]
        fn matmul_f32_out<M: Dim, K: Dim, N: Dim>(
            (m, k, n): (M, K, N),
            accum: bool,
            ap: *const $e,
            astr: [usize; 2],
            bp: *const $e,
            bstr: [usize; 2],
            cp: *mut f32,
            cstr: [usize; 2],
        ) {
            #[cfg(not(feature = "cpu"))]
            {
                let widen: fn($e) -> f32 = $widen;
                for i in 0..m.size() {
                    for j in 0..n.size() {
                        let mut sum = 0.0f32;
                        for p in 0..k.size() {
                            // SAFETY: in-bounds views, as for `naive_gemm`.
                            let (a, b) = unsafe {
                                (
                                    *ap.add(astr[0] * i + astr[1] * p),
                                    *bp.add(bstr[0] * p + bstr[1] * j),
                                )
                            };
                            sum += widen(a) * widen(b);
                        }
                        // SAFETY: as above.
                        let c = unsafe { &mut *cp.add(cstr[0] * i + cstr[1] * j) };
                        *c = if accum { *c + sum } else { sum };
                    }
                }
            }
            // SAFETY: `$e` has `$k`'s layout; dfdx's callers pass in-bounds views and a C that
            // aliases neither operand.
            #[cfg(feature = "cpu")]
            unsafe {
                typed_amp_gemm_f32_out::<_, $k, _, _, _>(
                    (m, k, n),
                    accum,
                    ap,
                    astr,
                    bp,
                    bstr,
                    cp,
                    cstr,
                )
            }
        }
    };
}

#[cfg(feature = "f16")]
impl MatMulImpl<crate::dtypes::AMP<half::f16>> for Cpu {
    matmul_f32_out_16!(crate::dtypes::AMP<half::f16>, half::f16, |x| x.0.to_f32());

    #[inline]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        (m, k, n): (M, K, N),
        accum: bool,
        ap: *const crate::dtypes::AMP<half::f16>,
        astr: [usize; 2],
        bp: *const crate::dtypes::AMP<half::f16>,
        bstr: [usize; 2],
        cp: *mut crate::dtypes::AMP<half::f16>,
        cstr: [usize; 2],
    ) {
        #[cfg(not(feature = "cpu"))]
        naive_gemm((m, k, n), accum, ap, astr, bp, bstr, cp, cstr);

        // SAFETY: `AMP<f16>` is `repr(transparent)` over `f16`; dfdx's callers pass in-bounds
        // views and a C that does not alias A or B, as gemm 0.15 required before.
        #[cfg(feature = "cpu")]
        unsafe {
            typed_amp_gemm::<_, half::f16, _, _, _>((m, k, n), accum, ap, astr, bp, bstr, cp, cstr)
        }
    }
}

#[cfg(feature = "f16")]
impl MatMulImpl<half::f16> for Cpu {
    matmul_f32_out_16!(half::f16, half::f16, |x| x.to_f32());

    #[inline]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        (m, k, n): (M, K, N),
        accum: bool,
        ap: *const half::f16,
        astr: [usize; 2],
        bp: *const half::f16,
        bstr: [usize; 2],
        cp: *mut half::f16,
        cstr: [usize; 2],
    ) {
        #[cfg(not(feature = "cpu"))]
        naive_gemm((m, k, n), accum, ap, astr, bp, bstr, cp, cstr);

        // SAFETY: as for `AMP<f16>` above.
        #[cfg(feature = "cpu")]
        unsafe {
            typed_amp_gemm::<_, half::f16, _, _, _>((m, k, n), accum, ap, astr, bp, bstr, cp, cstr)
        }
    }
}

// typed-amp patch: bfloat16 matmul on typed-amp's kernels (gemm 0.15 has none): with AVX512-BF16,
// `vdpbf16ps` on k-pairs into f32 accumulators; otherwise the operands are widened to f32 while
// packing (exact: a bf16 is the upper half of an f32). Either way the product accumulates in f32
// and is rounded to bf16 once (nearest, ties to even); with `accum`, C + A·B is rounded once.
#[cfg(feature = "f16")]
impl MatMulImpl<half::bf16> for Cpu {
    matmul_f32_out_16!(half::bf16, half::bf16, |x| x.to_f32());

    #[inline]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        (m, k, n): (M, K, N),
        accum: bool,
        ap: *const half::bf16,
        astr: [usize; 2],
        bp: *const half::bf16,
        bstr: [usize; 2],
        cp: *mut half::bf16,
        cstr: [usize; 2],
    ) {
        #[cfg(not(feature = "cpu"))]
        naive_gemm((m, k, n), accum, ap, astr, bp, bstr, cp, cstr);

        // SAFETY: as for `AMP<f16>` above.
        #[cfg(feature = "cpu")]
        unsafe {
            typed_amp_gemm::<_, half::bf16, _, _, _>((m, k, n), accum, ap, astr, bp, bstr, cp, cstr)
        }
    }
}

impl MatMulImpl<f32> for Cpu {
    #[inline]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        (m, k, n): (M, K, N),
        accum: bool,
        ap: *const f32,
        astr: [usize; 2],
        bp: *const f32,
        bstr: [usize; 2],
        cp: *mut f32,
        cstr: [usize; 2],
    ) {
        #[cfg(not(feature = "cpu"))]
        naive_gemm((m, k, n), accum, ap, astr, bp, bstr, cp, cstr);

        // SAFETY: as for `AMP<f16>` above.
        #[cfg(feature = "cpu")]
        unsafe {
            typed_amp_gemm::<_, f32, _, _, _>((m, k, n), accum, ap, astr, bp, bstr, cp, cstr)
        }
    }
}

impl MatMulImpl<f64> for Cpu {
    #[inline]
    fn matmul<M: Dim, K: Dim, N: Dim>(
        (m, k, n): (M, K, N),
        accum: bool,
        ap: *const f64,
        astr: [usize; 2],
        bp: *const f64,
        bstr: [usize; 2],
        cp: *mut f64,
        cstr: [usize; 2],
    ) {
        #[cfg(not(feature = "cpu"))]
        naive_gemm((m, k, n), accum, ap, astr, bp, bstr, cp, cstr);

        #[cfg(feature = "cpu")]
        unsafe {
            gemm::gemm(
                m.size(),
                n.size(),
                k.size(),
                cp,
                cstr[1] as isize,
                cstr[0] as isize,
                accum,
                ap,
                astr[1] as isize,
                astr[0] as isize,
                bp,
                bstr[1] as isize,
                bstr[0] as isize,
                if accum { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            )
        }
    }
}

impl<E: Dtype> super::MatMatKernel<E> for Cpu
where
    Self: MatMulImpl<E>,
{
    fn forward<M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(M, K), E, Self>,
        rhs: &Tensor<(K, N), E, Self>,
    ) -> Result<Tensor<(M, N), E, Self>, Self::Err> {
        let (m, k) = lhs.shape;
        let n = rhs.shape.1;
        let mut out = self.try_zeros_like(&(m, n))?;
        Self::matmul(
            (m, k, n),
            false,
            lhs.data.as_ptr(),
            lhs.strides,
            rhs.data.as_ptr(),
            rhs.strides,
            Arc::get_mut(&mut out.data).unwrap().as_mut_ptr(),
            out.strides,
        );
        Ok(out)
    }
    fn backward<M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(M, K), E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<(K, N), E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let (m, k) = lhs.shape;
        let n = rhs.shape.1;
        let strides = (m, n).strides();
        Self::matmul(
            (m, n, k),
            true,
            grad_out.as_ptr(),
            strides,
            rhs.data.as_ptr(),
            [rhs.strides[1], rhs.strides[0]],
            grad_lhs.as_mut_ptr(),
            lhs.strides,
        );
        Self::matmul(
            (k, m, n),
            true,
            lhs.data.as_ptr(),
            [lhs.strides[1], lhs.strides[0]],
            grad_out.as_ptr(),
            strides,
            grad_rhs.as_mut_ptr(),
            rhs.strides,
        );
        Ok(())
    }

    // typed-amp patch: only the product for `rhs`'s gradient.
    fn backward_rhs<M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(M, K), E, Self>,
        rhs: &Tensor<(K, N), E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let (m, k) = lhs.shape;
        let n = rhs.shape.1;
        Self::matmul(
            (k, m, n),
            true,
            lhs.data.as_ptr(),
            [lhs.strides[1], lhs.strides[0]],
            grad_out.as_ptr(),
            (m, n).strides(),
            grad_rhs.as_mut_ptr(),
            rhs.strides,
        );
        Ok(())
    }
}

impl<E: Dtype> super::MatMatBrKernel<E> for Cpu
where
    Self: MatMulImpl<E>,
{
    fn forward<B: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, M, K), E, Self>,
        rhs: &Tensor<(K, N), E, Self>,
    ) -> Result<Tensor<(B, M, N), E, Self>, Self::Err> {
        let (batch, m, k) = lhs.shape;
        let n = rhs.shape.1;
        let mut out = self.try_zeros_like(&(batch, m, n))?;
        let cp = Arc::get_mut(&mut out.data).unwrap();
        for i in 0..batch.size() {
            Self::matmul(
                (m, k, n),
                false,
                lhs.data[i * lhs.strides[0]..].as_ptr(),
                [lhs.strides[1], lhs.strides[2]],
                rhs.data.as_ptr(),
                rhs.strides,
                cp[i * out.strides[0]..].as_mut_ptr(),
                [out.strides[1], out.strides[2]],
            );
        }
        Ok(out)
    }
    fn backward<B: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, M, K), E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<(K, N), E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let (batch, m, k) = lhs.shape;
        let n = rhs.shape.1;
        let strides = (batch, m, n).strides();
        for i in 0..batch.size() {
            Self::matmul(
                (m, n, k),
                true,
                grad_out[i * strides[0]..].as_ptr(),
                [strides[1], strides[2]],
                rhs.data.as_ptr(),
                [rhs.strides[1], rhs.strides[0]],
                grad_lhs[i * lhs.strides[0]..].as_mut_ptr(),
                [lhs.strides[1], lhs.strides[2]],
            );
            Self::matmul(
                (k, m, n),
                true,
                lhs.data[i * lhs.strides[0]..].as_ptr(),
                [lhs.strides[2], lhs.strides[1]],
                grad_out[i * strides[0]..].as_ptr(),
                [strides[1], strides[2]],
                grad_rhs.as_mut_ptr(),
                rhs.strides,
            );
        }
        Ok(())
    }
}

impl<E: Dtype> super::MatMatBatch3Kernel<E> for Cpu
where
    Self: MatMulImpl<E>,
{
    fn forward<B: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, M, K), E, Self>,
        rhs: &Tensor<(B, K, N), E, Self>,
    ) -> Result<Tensor<(B, M, N), E, Self>, Self::Err> {
        let (b, m, k) = lhs.shape;
        let n = rhs.shape.2;
        let mut out = self.try_zeros_like(&(b, m, n))?;
        let ap = lhs.data.as_ref();
        let bp = rhs.data.as_ref();
        let cp = Arc::get_mut(&mut out.data).unwrap();
        for i in 0..b.size() {
            Self::matmul(
                (m, k, n),
                false,
                ap[i * lhs.strides[0]..].as_ptr(),
                [lhs.strides[1], lhs.strides[2]],
                bp[i * rhs.strides[0]..].as_ptr(),
                [rhs.strides[1], rhs.strides[2]],
                cp[i * out.strides[0]..].as_mut_ptr(),
                [out.strides[1], out.strides[2]],
            )
        }
        Ok(out)
    }
    fn backward<B: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, M, K), E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<(B, K, N), E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let (b, m, k) = lhs.shape;
        let n = rhs.shape.2;
        let strides = (b, m, n).strides();
        for i in 0..b.size() {
            Self::matmul(
                (m, n, k),
                true,
                grad_out[i * strides[0]..].as_ptr(),
                [strides[1], strides[2]],
                rhs.data[i * rhs.strides[0]..].as_ptr(),
                [rhs.strides[2], rhs.strides[1]],
                grad_lhs[i * lhs.strides[0]..].as_mut_ptr(),
                [lhs.strides[1], lhs.strides[2]],
            );
            Self::matmul(
                (k, m, n),
                true,
                lhs.data[i * lhs.strides[0]..].as_ptr(),
                [lhs.strides[2], lhs.strides[1]],
                grad_out[i * strides[0]..].as_ptr(),
                [strides[1], strides[2]],
                grad_rhs[i * rhs.strides[0]..].as_mut_ptr(),
                [rhs.strides[1], rhs.strides[2]],
            );
        }
        Ok(())
    }
}

/// typed-amp patch: whether a 4-d layout maps every index to its own element (no broadcast, no
/// overlap), so that parallel tasks writing the sub-matrices of different `(i, j)` never write
/// one element twice: sorted by stride, each stride must reach past the extent of the ones
/// below it.
fn injective(dims: [usize; 4], strides: [usize; 4]) -> bool {
    let mut d: Vec<(usize, usize)> = dims
        .into_iter()
        .zip(strides)
        .filter(|(n, _)| *n > 1)
        .map(|(n, s)| (s, n))
        .collect();
    d.sort_unstable();
    let mut reach = 1usize;
    for (s, n) in d {
        if s < reach {
            return false;
        }
        reach = match s.checked_mul(n) {
            Some(r) => r,
            None => return false,
        };
    }
    true
}

// typed-amp patch: the batch × heads products run in parallel (rayon, through `par_for`): at a
// transformer's sizes each is a few microseconds of work, far below the GEMM's own threshold
// for threads, so they ran one after another on one core. Each task computes whole products,
// the same as before, so results do not change; the backward runs in parallel only when the
// gradients' layouts give every task its own elements (`injective`), else serially as before.
impl<E: Dtype> super::MatMatBatch4Kernel<E> for Cpu
where
    Self: MatMulImpl<E>,
{
    fn forward<B: Dim, S: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, S, M, K), E, Self>,
        rhs: &Tensor<(B, S, K, N), E, Self>,
    ) -> Result<Tensor<(B, S, M, N), E, Self>, Self::Err> {
        let (b, s, m, k) = lhs.shape;
        let n = rhs.shape.3;
        let mut out = self.try_zeros_like(&(b, s, m, n))?;
        let (ls, rs, os) = (lhs.strides, rhs.strides, out.strides);
        let data: &mut [E] = Arc::get_mut(&mut out.data).unwrap();
        let cp = SendPtr(data.as_mut_ptr());
        let (ap, bp) = (
            SendPtr(lhs.data.as_ptr() as *mut E),
            SendPtr(rhs.data.as_ptr() as *mut E),
        );
        let heads = s.size();
        par_for(b.size() * heads, |t| {
            let (i, j) = (t / heads, t % heads);
            let (ap, bp, cp) = (ap, bp, cp);
            // SAFETY: offsets of the (i, j) sub-matrices inside each buffer (as the serial loop
            // formed them); `out` is fresh and contiguous, so tasks write disjoint blocks.
            unsafe {
                Self::matmul(
                    (m, k, n),
                    false,
                    ap.0.add(i * ls[0] + j * ls[1]),
                    [ls[2], ls[3]],
                    bp.0.add(i * rs[0] + j * rs[1]),
                    [rs[2], rs[3]],
                    cp.0.add(i * os[0] + j * os[1]),
                    [os[2], os[3]],
                );
            }
        });
        Ok(out)
    }
    fn backward<B: Dim, S: Dim, M: Dim, K: Dim, N: Dim>(
        &self,
        lhs: &Tensor<(B, S, M, K), E, Self>,
        grad_lhs: &mut Self::Vec,
        rhs: &Tensor<(B, S, K, N), E, Self>,
        grad_rhs: &mut Self::Vec,
        grad_out: &Self::Vec,
    ) -> Result<(), Self::Err> {
        let (b, s, m, k) = lhs.shape;
        let n = rhs.shape.3;
        let strides = (b, s, m, n).strides();
        let (ls, rs) = (lhs.strides, rhs.strides);
        let (go, a, bm) = (
            SendPtr(grad_out.as_ptr() as *mut E),
            SendPtr(lhs.data.as_ptr() as *mut E),
            SendPtr(rhs.data.as_ptr() as *mut E),
        );
        let (gl, gr) = (
            SendPtr(grad_lhs.as_mut_ptr()),
            SendPtr(grad_rhs.as_mut_ptr()),
        );
        let heads = s.size();
        let task = move |t: usize| {
            let (i, j) = (t / heads, t % heads);
            let (go, a, bm, gl, gr) = (go, a, bm, gl, gr);
            // SAFETY: offsets of the (i, j) sub-matrices, as the serial loop formed them.
            unsafe {
                Self::matmul(
                    (m, n, k),
                    true,
                    go.0.add(i * strides[0] + j * strides[1]),
                    [strides[2], strides[3]],
                    bm.0.add(i * rs[0] + j * rs[1]),
                    [rs[3], rs[2]],
                    gl.0.add(i * ls[0] + j * ls[1]),
                    [ls[2], ls[3]],
                );
                Self::matmul(
                    (k, m, n),
                    true,
                    a.0.add(i * ls[0] + j * ls[1]),
                    [ls[3], ls[2]],
                    go.0.add(i * strides[0] + j * strides[1]),
                    [strides[2], strides[3]],
                    gr.0.add(i * rs[0] + j * rs[1]),
                    [rs[2], rs[3]],
                );
            }
        };
        let disjoint = injective([b.size(), heads, m.size(), k.size()], ls)
            && injective([b.size(), heads, k.size(), n.size()], rs);
        if disjoint {
            par_for(b.size() * heads, task);
        } else {
            (0..b.size() * heads).for_each(task);
        }
        Ok(())
    }
}
