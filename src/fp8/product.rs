//! Products of FP8 tensors: `A · Bᵀ` of the codes, widened exactly (to bf16, by
//! [`typed_amp_kernels::gemm_fp8`], which multiplies at the bf16 GEMM's rate), accumulated in
//! FP32, and multiplied by the two operands' `1 / scale` (per tensor or per row, both of which
//! factor out of a sum over columns).

use half::bf16;
use typed_amp_kernels::{gemm_fp8, gemm_fp8_epilogue, Epilogue, GemmOut, MatMut, MatRef};

use super::error::Fp8Error;
use super::format::{ForwardOperand, Fp8Element};
use super::granularity::{Granularity, PerTensor};
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

/// An FP8 tensor's codes as the `rows × cols` operand of a product, or (`transposed`) as its
/// `cols × rows` transpose: the same codes read with swapped strides, never copied. Only a
/// per-tensor scaled tensor is taken (rule
/// [`TransposesWithItsScale`](super::TransposesWithItsScale): its one scale is its transpose's).
fn operand<F: Fp8Element, M: ScalingMode>(
    t: &Fp8Tensor<F, PerTensor, M>,
    transposed: bool,
) -> MatRef<'_, F> {
    let (rows, cols) = (t.rows(), t.cols());
    if transposed {
        MatRef {
            data: t.raw_codes(),
            rows: cols,
            cols: rows,
            rs: 1,
            cs: cols,
        }
    } else {
        MatRef {
            data: t.raw_codes(),
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
}

/// `c = round(sa·sb·(op(a) · op(b)ᵀ) (+ c) (+ bias))` into a row-major bf16 or FP32 `c`, with
/// `op(t)` the tensor or (its flag set) its transpose, both per-tensor scaled (`sa`, `sb` their
/// `1 / scale`): the kernels' FP8 GEMM reading the codes where they lie (no transposed copy,
/// no widened copy), the two dequantising scales folded into the store's `alpha` as their
/// product, and one rounding. Returns whether anything stored is inf or NaN.
fn product_into<A, B, MA, MB, C>(
    (ta, a_t): (&Fp8Tensor<A, PerTensor, MA>, bool),
    (tb, b_t): (&Fp8Tensor<B, PerTensor, MB>, bool),
    c: &mut [C],
    accumulate: bool,
    bias: Option<&[f32]>,
) -> Result<bool, Fp8Error>
where
    A: Fp8Element,
    B: Fp8Element,
    MA: ScalingMode,
    MB: ScalingMode,
    C: GemmOut<bf16>,
{
    let a = operand(ta, a_t);
    // op(b)ᵀ is b read the other way.
    let b = operand(tb, !b_t);
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let shape = |what: String| Err(Fp8Error::Shape(what));
    if b.rows != k {
        return shape(format!(
            "a product of {m} × {k} and ({n} × {})ᵀ: the inner dimensions differ",
            b.rows
        ));
    }
    if m.checked_mul(n) != Some(c.len()) {
        return shape(format!("{} outputs for a {m} × {n} product", c.len()));
    }
    if let Some(bias) = bias.filter(|b| b.len() != n) {
        return shape(format!("a bias of {} for {n} outputs", bias.len()));
    }
    let alpha = ta.scale_inv(0) * tb.scale_inv(0);
    let threads = rayon::current_num_threads();
    fn view<C>(data: &mut [C], rows: usize, cols: usize) -> MatMut<'_, C> {
        MatMut {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
    // An FP32 C written afresh (a weight gradient, k = every token row) is its own running sum
    // between the GEMM's k blocks only for the plain product, whose packing of each operand
    // the GEMM then does once; the scale follows in a pass of its own, the same one
    // multiplication per element as in the store (`alpha·s`), so the same bits.
    if let (false, None, Some(c)) = (accumulate, bias, as_f32_mut(c)) {
        gemm_fp8_epilogue(a, b, view(&mut *c, m, n), &Epilogue::STORE, threads);
        if alpha != 1.0 {
            c.iter_mut().for_each(|x| *x *= alpha);
        }
        return Ok(c.iter().any(|x| !x.is_finite()));
    }
    let epi = Epilogue {
        alpha,
        accumulate,
        bias,
        // The FP8 recipe reads the flag: an overflowing product skips the step.
        report_non_finite: true,
        ..Epilogue::STORE
    };
    let report = gemm_fp8_epilogue(a, b, view(c, m, n), &epi, threads);
    Ok(report.non_finite)
}

/// `c` itself where `C` is `f32`.
fn as_f32_mut<C: 'static>(c: &mut [C]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<C>() == std::any::TypeId::of::<f32>()).then(|| {
        // SAFETY: `C` is `f32`: the same slice, borrowed uniquely for as long as `c`.
        unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast::<f32>(), c.len()) }
    })
}

/// [`forward_product`] of per-tensor scaled operands into a row-major `x.rows() × w.rows()`
/// bf16 or FP32 `y`: `y = round(x · wᵀ · sx·sw (+ bias))`, rounded once, as a linear layer's
/// forward stores its output. Returns whether anything stored is inf or NaN.
///
/// # Errors
/// [`Fp8Error::Shape`] if the column counts differ or `y` (or the bias) does not fit.
pub(crate) fn forward_product_into<X, W, MX, MW, C>(
    x: &Fp8Tensor<X, PerTensor, MX>,
    w: &Fp8Tensor<W, PerTensor, MW>,
    y: &mut [C],
    bias: Option<&[f32]>,
) -> Result<bool, Fp8Error>
where
    X: ForwardOperand,
    W: ForwardOperand,
    MX: ScalingMode,
    MW: ScalingMode,
    C: GemmOut<bf16>,
{
    product_into((x, false), (w, false), y, false, bias)
}

/// [`gradient_product`] with either operand read transposed (per-tensor scaled, so each keeps
/// its scale): `c (+)= round(op(dy) · op(b)ᵀ · sdy·sb)` into a row-major bf16 or FP32 `c`, one
/// rounding, `+ c` (its old value, widened) with `accumulate`. A linear layer's input
/// gradient is `dy · W`, `(dy, false)` and `(w, true)`; its weight gradient `dyᵀ · x`,
/// `(dy, true)` and `(x, true)`. Returns whether anything stored is inf or NaN.
///
/// # Errors
/// [`Fp8Error::Shape`] if the inner dimensions differ or `c` does not fit.
pub(crate) fn gradient_product_into<D, B, MD, MB, C>(
    dy: (&Fp8Tensor<D, PerTensor, MD>, bool),
    b: (&Fp8Tensor<B, PerTensor, MB>, bool),
    c: &mut [C],
    accumulate: bool,
) -> Result<bool, Fp8Error>
where
    D: Fp8Element,
    B: ForwardOperand,
    MD: ScalingMode,
    MB: ScalingMode,
    C: GemmOut<bf16>,
{
    product_into(dy, b, c, accumulate, None)
}
