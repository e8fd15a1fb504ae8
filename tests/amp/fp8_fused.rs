//! The FP8 linear op (`typed_amp::ops::fp8_linear`) against the unfused composition of the
//! public FP8 pieces it fuses, bit for bit (the arithmetic is the same; only where it runs
//! differs):
//!
//! - its output against `forward_product` of the quantised operands (FP32) rounded to BF16:
//!   the op stores the product straight into BF16, its scales folded into the store;
//! - its weight gradient against `gradient_product` of the *transposed copies* of the quantised
//!   output gradient and input (the op reads the codes transposed in place), and its input
//!   gradient against `gradient_product(Q(dy), Q(W)ᵀ)` added to zero and rounded to BF16;
//! - exact GELU and ReLU fused into the op (the backward applies their derivative to the
//!   output gradient in place, before quantising it) against dfdx's GELU and ReLU after it;
//! - what the op keeps of its input for the weight gradient, each way against the others, bit
//!   for bit (`c_fc`, GELU, `c_proj`, as in the GPT's MLP): the input's FP8 codes (an input
//!   nothing else holds: a cast's output, dfdx's GELU's output), the 16-bit input shared with
//!   another holder (quantised again in the backward pass), and, after a fused GELU, the GELU
//!   computed again from the input it keeps.

use typed_amp::dfdx::nn::modules::UnbiasedLinear as LinearModule;
use typed_amp::fp8::{forward_product, gradient_product, Fp8Tensor, Hybrid, E4M3, E5M2};
use typed_amp::ops::fp8_linear::try_fp8_linear;
use typed_amp::ops::gelu::try_gelu;
use typed_amp::ops::relu::try_relu;
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;
use typed_amp::{loss::Loss, precision::AmpElem};

fn sample(dev: &Cpu, n: usize, scale: f32) -> Vec<bf16> {
    let t: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(n,));
    t.as_vec()
        .into_iter()
        .map(|v| bf16::from_f32(v * scale))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| bf16::from_f32(*x).to_bits()).collect()
}

/// The op's output, input gradient and FP32 weight gradient for `Σ act(y)·r`, with `act`
/// fused into the op (`fused`) or dfdx's after it.
fn run<const I: usize, const O: usize>(
    layer: &LinearModule<I, O, bf16, Cpu>,
    x: &Tensor<(usize, Const<I>), bf16, Cpu>,
    r: &Tensor<(usize, Const<O>), bf16, Cpu>,
    act: Option<&str>,
    fused: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let xt = x.clone().traced_mixed(MixedGradients::leaky());
    let y = try_fp8_linear::<Hybrid, _, I, O, _, _, _, _>(layer, xt).unwrap();
    let id = y.id();
    let y = match (act, fused) {
        (None, _) => y,
        (Some("gelu"), true) => try_gelu(y).unwrap(),
        (Some("gelu"), false) => y.accurate_gelu(),
        (Some(_), true) => try_relu(y).unwrap(),
        (Some(_), false) => y.relu(),
    };
    // A fused activation overwrites the op's output and keeps its id.
    assert_eq!(y.id() == id, fused && act.is_some() || act.is_none());
    let values: Vec<f32> = y
        .retaped::<NoneTape>()
        .as_vec()
        .into_iter()
        .map(AmpElem::to_f32)
        .collect();
    let loss = (y * r.clone()).to_f32().sum();
    let grads = Loss::new(loss).backward().unwrap().grads().clone();
    let dw = grads.param_grad(layer.weight.id()).unwrap().to_vec();
    let dx = grads
        .get(x)
        .unwrap()
        .as_vec()
        .into_iter()
        .map(AmpElem::to_f32)
        .collect();
    (values, dx, dw)
}

fn case<const I: usize, const O: usize>(rows: usize, seed: u64) {
    let dev = Cpu::seed_from_u64(seed);
    let (xv, wv, rv) = (
        sample(&dev, rows * I, 1.0),
        sample(&dev, O * I, 0.1),
        sample(&dev, rows * O, 1e-3),
    );
    let layer = LinearModule::<I, O, bf16, Cpu> {
        weight: dev.tensor_from_vec(wv.clone(), (Const::<O>, Const::<I>)),
    };
    let x = dev.tensor_from_vec(xv.clone(), (rows, Const::<I>));
    let r = dev.tensor_from_vec(rv.clone(), (rows, Const::<O>));
    let what = format!("rows {rows}, {I}→{O}");
    let (y, dx, dw) = run(&layer, &x, &r, None, false);

    // The unfused composition: outside a working copy's forward each scale is the tensor's
    // own amax's, as `Fp8Tensor::quantize` chooses it; `Σ y·r` makes `dy = r`.
    let qx = Fp8Tensor::<E4M3>::quantize(&xv, rows, I).unwrap();
    let qw = Fp8Tensor::<E4M3>::quantize(&wv, O, I).unwrap();
    let qdy = Fp8Tensor::<E5M2>::quantize(&rv, rows, O).unwrap();
    let y_ref = forward_product(&qx, &qw).unwrap();
    assert_eq!(bf16_bits(&y), bf16_bits(&y_ref), "output, {what}");
    let dw_ref = gradient_product(&qdy.transpose(), &qx.transpose()).unwrap();
    assert_eq!(bits(&dw), bits(&dw_ref), "weight gradient, {what}");
    let dx_ref: Vec<f32> = gradient_product(&qdy, &qw.transpose())
        .unwrap()
        .into_iter()
        .map(|v| 0.0 + v)
        .collect();
    assert_eq!(bf16_bits(&dx), bf16_bits(&dx_ref), "input gradient, {what}");

    for act in ["gelu", "relu"] {
        let (fused, composed) = (
            run(&layer, &x, &r, Some(act), true),
            run(&layer, &x, &r, Some(act), false),
        );
        assert_eq!(bits(&fused.0), bits(&composed.0), "{act} output, {what}");
        assert_eq!(
            bits(&fused.1),
            bits(&composed.1),
            "{act} input gradient, {what}"
        );
        assert_eq!(
            bits(&fused.2),
            bits(&composed.2),
            "{act} weight gradient, {what}"
        );
        // The activation ran: some outputs changed.
        assert_ne!(bits(&fused.0), bits(&y), "{act} did nothing, {what}");
    }
}

#[test]
fn the_fp8_linear_gives_the_bits_of_its_unfused_products_and_activations() {
    case::<64, 48>(33, 1);
    case::<17, 5>(3, 2);
    // Several k blocks of the weight gradient's product (k = rows), a multi-threaded one.
    case::<96, 200>(1100, 3);
}

/// How the MLP's GELU runs, and so what `c_proj` keeps of its input.
#[derive(Clone, Copy, Debug)]
enum Gelu {
    /// Fused into `c_fc`: `c_proj` recomputes it from the input the GELU keeps.
    Fused,
    /// dfdx's op: its output is `c_proj`'s alone, which keeps its codes.
    Composed,
    /// Fused, its output also held here: `c_proj` keeps that shared output.
    FusedHeld,
}

/// `Σ c_proj(gelu(c_fc(x)))·r` with FP8 linear layers: the output's bits and the FP32 bits of
/// the input gradient and both weight gradients. With `cast_input` the input of `c_fc` is a
/// cast's output that nothing else holds (its codes are kept), else a BF16 tensor held here
/// (kept shared).
fn mlp<const I: usize, const H: usize>(
    fc: &LinearModule<I, H, bf16, Cpu>,
    proj: &LinearModule<H, I, bf16, Cpu>,
    x: &Tensor<(usize, Const<I>), f32, Cpu>,
    r: &Tensor<(usize, Const<I>), bf16, Cpu>,
    cast_input: bool,
    gelu: Gelu,
) -> [Vec<u32>; 4] {
    let xb = x.clone().to_dtype::<bf16>();
    let xt = if cast_input {
        x.clone().traced_mixed(MixedGradients::leaky()).to_bf16()
    } else {
        xb.clone().traced_mixed(MixedGradients::leaky())
    };
    let h = try_fp8_linear::<Hybrid, _, I, H, _, _, _, _>(fc, xt).unwrap();
    let (h, held) = match gelu {
        Gelu::Fused => (try_gelu(h).unwrap(), None),
        Gelu::Composed => (h.accurate_gelu(), None),
        Gelu::FusedHeld => {
            let h = try_gelu(h).unwrap();
            let held = h.retaped::<NoneTape>();
            (h, Some(held))
        }
    };
    let y = try_fp8_linear::<Hybrid, _, H, I, _, _, _, _>(proj, h).unwrap();
    let values: Vec<u32> = y
        .retaped::<NoneTape>()
        .as_vec()
        .into_iter()
        .map(|v| AmpElem::to_f32(v).to_bits())
        .collect();
    let loss = (y * r.clone()).to_f32().sum();
    let grads = Loss::new(loss).backward().unwrap().grads().clone();
    drop(held);
    let dx: Vec<f32> = if cast_input {
        grads.get(x).unwrap().as_vec()
    } else {
        let g = grads.get(&xb).unwrap().as_vec();
        g.into_iter().map(AmpElem::to_f32).collect()
    };
    [
        values,
        bits(&dx),
        bits(&grads.param_grad(fc.weight.id()).unwrap().to_vec()),
        bits(&grads.param_grad(proj.weight.id()).unwrap().to_vec()),
    ]
}

fn kept_inputs_case<const I: usize, const H: usize>(rows: usize, seed: u64) {
    let dev = Cpu::seed_from_u64(seed);
    let fc = LinearModule::<I, H, bf16, Cpu> {
        weight: dev.tensor_from_vec(sample(&dev, H * I, 0.1), (Const::<H>, Const::<I>)),
    };
    let proj = LinearModule::<H, I, bf16, Cpu> {
        weight: dev.tensor_from_vec(sample(&dev, I * H, 0.05), (Const::<I>, Const::<H>)),
    };
    let xv: Vec<f32> = sample(&dev, rows * I, 1.0)
        .into_iter()
        .map(f32::from)
        .collect();
    let x = dev.tensor_from_vec(xv, (rows, Const::<I>));
    let r = dev.tensor_from_vec(sample(&dev, rows * I, 1e-3), (rows, Const::<I>));
    let what = format!("rows {rows}, {I}→{H}→{I}");
    // The reference: both layers keep their input's codes.
    let want = mlp(&fc, &proj, &x, &r, true, Gelu::Composed);
    let names = [
        "output",
        "input gradient",
        "c_fc's weight gradient",
        "c_proj's weight gradient",
    ];
    for (cast_input, gelu) in [
        (true, Gelu::Fused),
        (false, Gelu::Composed),
        (false, Gelu::Fused),
        (true, Gelu::FusedHeld),
    ] {
        let got = mlp(&fc, &proj, &x, &r, cast_input, gelu);
        for ((g, w), name) in got.iter().zip(&want).zip(names) {
            assert_eq!(g, w, "{name}, {what}, cast input {cast_input}, {gelu:?}");
        }
    }
    // The MLP did something: a gradient reached the input.
    assert!(want[1].iter().any(|&b| f32::from_bits(b) != 0.0), "{what}");
}

#[test]
fn keeping_the_inputs_codes_a_shared_input_or_a_recomputed_gelu_gives_the_same_bits() {
    kept_inputs_case::<32, 128>(20, 4);
    // Several blocks of the recomputed GELU, one shorter than the others; a threaded product.
    kept_inputs_case::<48, 192>(700, 5);
}
