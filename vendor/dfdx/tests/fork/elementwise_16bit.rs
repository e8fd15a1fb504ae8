//! dfdx's unary ops on 16-bit tensors run a block at a time in f32 (the vendored patch's
//! `UnaryDerivative::IN_F32`): one vectorised widening, the op in f32, one rounding. These tests
//! hold that block path to its unfused definition over every one of the 65,536 bit patterns of
//! FP16 and of BF16 (NaNs, infinities and subnormals included):
//!
//! - the scalar ops (`x * s`, `x + s`, `x - s`, `x / s`) give the bits `half`'s scalar operators
//!   give (each widens both operands, computes in f32 and rounds once), so the patch changes no
//!   result;
//! - exact and tanh GELU give `round(f32_op(widen(x)))`: the f32 op run on the widened values,
//!   rounded once, and their gradients `round(f32_df(widen(x)) · 1)`.
//!
//! - large tensors, whose elementwise ops run in pieces on rayon's pool, give the bits their rows
//!   give one at a time (f32, FP16 and BF16; forward and gradients).
//!
//! Every comparison is exact (bit for bit, or both NaN): the two computations make the same f32
//! operations on the same values, so no tolerance is needed or allowed.

use typed_amp_dfdx::dtypes::{bf16, f16};
use typed_amp_dfdx::prelude::*;

/// A 16-bit type with its bit patterns.
trait Bits: Dtype {
    fn from_bits16(b: u16) -> Self;
    fn bits16(self) -> u16;
    fn widen(self) -> f32;
    fn round(x: f32) -> Self;
}

impl Bits for f16 {
    fn from_bits16(b: u16) -> Self {
        f16::from_bits(b)
    }
    fn bits16(self) -> u16 {
        self.to_bits()
    }
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Bits for bf16 {
    fn from_bits16(b: u16) -> Self {
        bf16::from_bits(b)
    }
    fn bits16(self) -> u16 {
        self.to_bits()
    }
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn round(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// An op's name, what the tensor op gave, and `half`'s scalar operator.
type Case<E> = (&'static str, Vec<E>, fn(E, E) -> E);

/// Every bit pattern of `E`, in order.
fn every<E: Bits>() -> Vec<E> {
    (0..=u16::MAX).map(E::from_bits16).collect()
}

/// Asserts `got[i]` and `want[i]` are the same value: equal bits, or both NaN.
fn assert_same<E: Bits>(what: &str, xs: &[E], got: &[E], want: &[E]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for ((x, g), w) in xs.iter().zip(got).zip(want) {
        let same = g.bits16() == w.bits16() || (g.widen().is_nan() && w.widen().is_nan());
        assert!(
            same,
            "{what}: x = {:?} ({:#06x}) gave {:?} ({:#06x}), the unfused path {:?} ({:#06x})",
            x,
            x.bits16(),
            g,
            g.bits16(),
            w,
            w.bits16()
        );
    }
}

fn scalar_ops_match_half<E>()
where
    E: Bits
        + std::ops::Mul<Output = E>
        + std::ops::Add<Output = E>
        + std::ops::Sub<Output = E>
        + std::ops::Div<Output = E>,
    Cpu: Device<E>,
    Tensor<(usize,), E, Cpu>: TryMul<E> + TryAdd<E> + TrySub<E> + TryDiv<E>,
{
    let dev = Cpu::default();
    let xs = every::<E>();
    // A scalar whose products and quotients round (not a power of two) and one that overflows.
    for s in [E::round(0.3), E::round(3.0e4)] {
        let t = || dev.tensor_from_vec(xs.clone(), (xs.len(),));
        let cases: [Case<E>; 4] = [
            ("x * s", t().try_mul(s).unwrap().as_vec(), |x, s| x * s),
            ("x + s", t().try_add(s).unwrap().as_vec(), |x, s| x + s),
            ("x - s", t().try_sub(s).unwrap().as_vec(), |x, s| x - s),
            ("x / s", t().try_div(s).unwrap().as_vec(), |x, s| x / s),
        ];
        for (what, got, op) in cases {
            let want: Vec<E> = xs.iter().map(|x| op(*x, s)).collect();
            assert_same(what, &xs, &got, &want);
        }
    }
}

#[test]
fn scalar_ops_on_f16_give_halfs_bits() {
    scalar_ops_match_half::<f16>();
}

#[test]
fn scalar_ops_on_bf16_give_halfs_bits() {
    scalar_ops_match_half::<bf16>();
}

/// A 1-d tensor recording onto dfdx's own tape.
type Taped<E> = Tensor<(usize,), E, Cpu, OwnedTape<E, Cpu>>;

/// `op` forward and backward on every pattern of `E` against the f32 op on the widened values,
/// rounded once.
fn gelu_matches_f32_rounded_once<E: Bits>(
    name: &str,
    op16: fn(Taped<E>) -> Taped<E>,
    op32: fn(Taped<f32>) -> Taped<f32>,
) where
    Cpu: Device<E>,
{
    let dev = Cpu::default();
    let xs = every::<E>();
    let n = xs.len();

    let x16 = dev.tensor_from_vec(xs.clone(), (n,));
    let y16 = op16(x16.leaky_trace());
    let fwd16 = y16.retaped::<NoneTape>().as_vec();
    // d(sum y)/dy = 1 exactly, so the 16-bit gradient is df(x) · 1 rounded once.
    let g16 = y16.sum().backward().get(&x16).as_vec();

    let x32 = dev.tensor_from_vec(xs.iter().map(|x| x.widen()).collect::<Vec<f32>>(), (n,));
    let y32 = op32(x32.leaky_trace());
    let fwd32: Vec<E> = y32
        .retaped::<NoneTape>()
        .as_vec()
        .into_iter()
        .map(E::round)
        .collect();
    let g32: Vec<E> = y32
        .sum()
        .backward()
        .get(&x32)
        .as_vec()
        .into_iter()
        .map(E::round)
        .collect();

    assert_same(&format!("{name} forward"), &xs, &fwd16, &fwd32);
    assert_same(&format!("{name} backward"), &xs, &g16, &g32);
}

#[test]
fn exact_gelu_on_f16_and_bf16_is_the_f32_op_rounded_once() {
    gelu_matches_f32_rounded_once::<f16>(
        "f16 accurate_gelu",
        |t| t.accurate_gelu(),
        |t| t.accurate_gelu(),
    );
    gelu_matches_f32_rounded_once::<bf16>(
        "bf16 accurate_gelu",
        |t| t.accurate_gelu(),
        |t| t.accurate_gelu(),
    );
}

#[test]
fn tanh_gelu_on_f16_and_bf16_is_the_f32_op_rounded_once() {
    gelu_matches_f32_rounded_once::<f16>("f16 fast_gelu", |t| t.fast_gelu(), |t| t.fast_gelu());
    gelu_matches_f32_rounded_once::<bf16>("bf16 fast_gelu", |t| t.fast_gelu(), |t| t.fast_gelu());
}

// Large elementwise ops run in pieces on rayon's pool (the vendored patch's `par_elementwise`:
// unary ops forward and backward, binary ops forward, and their backward when neither operand
// is broadcast or permuted). Each element is computed by the same expressions as on one thread,
// so a large tensor must give, bit for bit, what its rows give one at a time (each row far below
// the size at which the pieces start).

/// Rows × columns: 81,920 elements, above the 65,536 at which ops split into pieces.
const ROWS: usize = 160;
const COLS: usize = 512;

/// `gelu(x)² · y + wᵀ + b` summed, for `x`, `y` of shape `S`, `wt` (`w` transposed, a
/// permuted view) and `b` (broadcast over rows) untraced: its value and the gradients of `x`
/// and `y`.
fn pieces_case<E: Dtype, S: Shape>(
    x: Tensor<S, E, Cpu>,
    y: Tensor<S, E, Cpu>,
    wt: Tensor<S, E, Cpu>,
    b: Tensor<S, E, Cpu>,
) -> (Vec<E>, Vec<E>, Vec<E>)
where
    Cpu: Device<E>,
{
    let z = x.leaky_trace().accurate_gelu().square() * y.leaky_trace() + wt + b;
    let value = z.retaped::<NoneTape>().as_vec();
    let grads = z.sum().backward();
    (value, grads.get(&x).as_vec(), grads.get(&y).as_vec())
}

/// The whole `ROWS × COLS` case against the same case row by row, bit for bit.
fn pieces_match_rows<E: Dtype>(name: &str)
where
    Cpu: Device<E>,
{
    let dev = Cpu::seed_from_u64(7);
    let sample = |n: usize| -> Vec<E> {
        let t: Tensor<(usize,), f32, Cpu> = SampleTensor::<f32>::sample_normal_like(&dev, &(n,));
        t.as_vec()
            .into_iter()
            .map(|v| E::from_f32(v * 2.0).unwrap())
            .collect()
    };
    let (xs, ys, ws, bs) = (
        sample(ROWS * COLS),
        sample(ROWS * COLS),
        sample(ROWS * COLS),
        sample(COLS),
    );

    let shape = (ROWS, COLS);
    let x = dev.tensor_from_vec(xs.clone(), shape);
    let y = dev.tensor_from_vec(ys.clone(), shape);
    // `w` stored as COLS × ROWS; its transpose is a permuted view (strides [1, ROWS]).
    let w = dev.tensor_from_vec(ws.clone(), (COLS, ROWS));
    let wt = w.permute::<_, Axes2<1, 0>>();
    let b = dev
        .tensor_from_vec(bs.clone(), (COLS,))
        .broadcast_like::<(usize, usize), Axis<0>>(&shape);
    let (whole, gx, gy) = pieces_case(x, y, wt, b);

    let (mut row_value, mut row_gx, mut row_gy) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..ROWS {
        let row = |v: &[E]| dev.tensor_from_vec(v[r * COLS..(r + 1) * COLS].to_vec(), (COLS,));
        let w_row: Vec<E> = (0..COLS).map(|c| ws[c * ROWS + r]).collect();
        let (v, gx_r, gy_r) = pieces_case(
            row(&xs),
            row(&ys),
            dev.tensor_from_vec(w_row, (COLS,)),
            dev.tensor_from_vec(bs.clone(), (COLS,)),
        );
        row_value.extend(v);
        row_gx.extend(gx_r);
        row_gy.extend(gy_r);
    }

    let bits = |v: &[E]| -> Vec<u32> { v.iter().map(|e| e.to_f32().unwrap().to_bits()).collect() };
    for (what, got, want) in [
        ("value", &whole, &row_value),
        ("gradient of x", &gx, &row_gx),
        ("gradient of y", &gy, &row_gy),
    ] {
        let (got, want) = (bits(got), bits(want));
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{name} {what}: element {i} (row {}, column {}) is {:e} in pieces, {:e} row by row",
                i / COLS,
                i % COLS,
                f32::from_bits(got[i]),
                f32::from_bits(want[i])
            );
        }
    }
}

#[test]
fn large_elementwise_ops_in_parallel_pieces_give_the_bits_of_their_rows_one_at_a_time() {
    pieces_match_rows::<f32>("f32");
    pieces_match_rows::<f16>("f16");
    pieces_match_rows::<bf16>("bf16");
}
