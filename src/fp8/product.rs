//! Products of FP8 tensors: `A · Bᵀ` of the codes, widened exactly (to bf16, by
//! [`typed_amp_kernels::gemm_fp8`], which multiplies at the bf16 GEMM's rate), accumulated in
//! FP32, and multiplied by the two operands' `1 / scale` (per tensor or per row, both of which
//! factor out of a sum over columns).

use typed_amp_kernels::{gemm_fp8, MatMut, MatRef};

use super::error::Fp8Error;
use super::format::{ForwardOperand, Fp8Element};
use super::granularity::Granularity;
use super::scaling::ScalingMode;
use super::tensor::Fp8Tensor;

/// `y = x · wᵀ` for a forward pass (a linear layer's `x` of `m × k` and weights of `n × k`):
/// both operands E4M3 (rule [`ForwardOperand`]), the result `m × n` in FP32, row-major.
///
/// Each product of two codes is exact in FP32 and the sum over `k` is accumulated in FP32;
/// then it is multiplied by `x`'s row scale inverse and `w`'s (once, by their product, when
/// both are per tensor). So `y` differs from the exact
/// product of the dequantised operands by at most `γ(k + 4) · Σ|x̃||w̃|` per element, `γ(n) =
/// n·u / (1 - n·u)`, `u = 2^-24` (tested in `tests/ops/fp8.rs`).
///
/// ```
/// use typed_amp::fp8::{forward_product, Fp8Error, Fp8Tensor, E4M3, PerTensor, Current};
/// # fn main() -> Result<(), Fp8Error> {
/// let x = Fp8Tensor::<E4M3>::quantize(&[1.0f32, 2.0, 4.0, 0.5], 2, 2)?; // scale 448 / 4
/// let w = Fp8Tensor::<E4M3>::quantize(&[0.5f32, 0.25], 1, 2)?;           // scale 448 / 0.5
/// let y = forward_product(&x, &w)?;                                      // 2 × 1
/// // Every value here is an E4M3 value times its scale; only 1 / scale rounds.
/// assert!((y[0] - 1.0).abs() <= 1e-6 && (y[1] - 2.125).abs() <= 1e-6);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`Fp8Error::Shape`] if the operands' column counts differ.
pub fn forward_product<X, W, GX, GW, MX, MW>(
    x: &Fp8Tensor<X, GX, MX>,
    w: &Fp8Tensor<W, GW, MW>,
) -> Result<Vec<f32>, Fp8Error>
where
    X: ForwardOperand,
    W: ForwardOperand,
    GX: Granularity,
    GW: Granularity,
    MX: ScalingMode,
    MW: ScalingMode,
{
    product_nt(x, w)
}

/// `dy · bᵀ` in the backward pass: the output gradient `dy` (`m × n`, E5M2 in the hybrid
/// recipe, or E4M3) times an E4M3 operand `b` (`p × n`: the weights transposed, for the input
/// gradient, or the activations transposed, for the weight gradient). Accumulated as
/// [`forward_product`].
///
/// # Errors
/// [`Fp8Error::Shape`] if the operands' column counts differ.
pub fn gradient_product<D, B, GD, GB, MD, MB>(
    dy: &Fp8Tensor<D, GD, MD>,
    b: &Fp8Tensor<B, GB, MB>,
) -> Result<Vec<f32>, Fp8Error>
where
    D: Fp8Element,
    B: ForwardOperand,
    GD: Granularity,
    GB: Granularity,
    MD: ScalingMode,
    MB: ScalingMode,
{
    product_nt(dy, b)
}

fn product_nt<A, B, GA, GB, MA, MB>(
    a: &Fp8Tensor<A, GA, MA>,
    b: &Fp8Tensor<B, GB, MB>,
) -> Result<Vec<f32>, Fp8Error>
where
    A: Fp8Element,
    B: Fp8Element,
    GA: Granularity,
    GB: Granularity,
    MA: ScalingMode,
    MB: ScalingMode,
{
    let (m, k, n) = (a.rows(), a.cols(), b.rows());
    if b.cols() != k {
        return Err(Fp8Error::Shape(format!(
            "a product of {m} × {k} and ({n} × {})ᵀ: the inner dimensions differ",
            b.cols()
        )));
    }
    let len = m.checked_mul(n).ok_or_else(|| {
        Fp8Error::Shape(format!("a product of {m} × {n} elements overflows usize"))
    })?;
    let mut c = vec![0.0f32; len];
    if len == 0 || k == 0 {
        return Ok(c);
    }
    // The kernels' FP8 product: both operands widened exactly to bf16, the bf16 GEMM
    // accumulating in f32, then the scales.
    let sa: Vec<f32> = (0..GA::scale_count(m)).map(|i| a.scale_inv(i)).collect();
    let sb: Vec<f32> = (0..GB::scale_count(n)).map(|j| b.scale_inv(j)).collect();
    let av = MatRef {
        data: a.raw_codes(),
        rows: m,
        cols: k,
        rs: k,
        cs: 1,
    };
    // bᵀ: k × n, element (l, j) at j·k + l.
    let bv = MatRef {
        data: b.raw_codes(),
        rows: k,
        cols: n,
        rs: 1,
        cs: k,
    };
    let cv = MatMut {
        data: &mut c,
        rows: m,
        cols: n,
        rs: n,
        cs: 1,
    };
    gemm_fp8(av, bv, &sa, &sb, cv, rayon::current_num_threads());
    Ok(c)
}
