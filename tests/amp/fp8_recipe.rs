//! The FP8 recipe of `#[amp(fp8 = ...)]` (typed_amp::ops::fp8_linear, typed_amp::fp8::Fp8Scaling):
//!
//! - the FP8 linear op's output, input gradient and weight gradient against the f64 product of
//!   the dequantised operands, within the bound of an FP32 accumulation of the accumulation
//!   length (γ(k + 4), as `forward_product` documents) and one rounding to BF16;
//! - the same op against the 16-bit linear op on the unquantised operands, within the
//!   quantisation bound of E4M3 (2^-4 relative, 2^-10 / scale absolute below its normals);
//! - an inf or NaN in the input reaches the step's non-finite check (the step is skipped);
//! - a model's recipe state survives a checkpoint bit for bit, and a file whose state is missing
//!   or non-finite is refused with `CheckpointError::Fp8State`;
//! - a data-parallel commit refuses amaxes that were not reduced across ranks, and the
//!   data-parallel step (its all-reduce stage reduces them) trains as a single process does.

use std::collections::BTreeMap;

use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::dfdx::nn::builders::{AccurateGeLU, UnbiasedLinear};
use typed_amp::dfdx::nn::modules::UnbiasedLinear as LinearModule;
use typed_amp::dfdx::optim::Adam;
use typed_amp::fp8::{Fp8Error, Fp8Scaling, Fp8ScalingState, Fp8Tensor, Hybrid, E4M3, E5M2};
use typed_amp::ops::fp8_linear::try_fp8_linear;
use typed_amp::ops::linear::try_linear;
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;
use typed_amp::{loss::Loss, precision::AmpElem};

use crate::common;
use common::{param_bytes, rewrite, TempDir};

/// γ(n) = n·u/(1 − n·u) for FP32 sums of `n` terms.
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * 2f64.powi(-24);
    nu / (1.0 - nu)
}

/// BF16's unit roundoff.
const U_BF16: f64 = 1.0 / 256.0;

fn bf16s(dev: &Cpu, n: usize, scale: f32) -> Vec<f32> {
    let t: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(n,));
    t.as_vec()
        .into_iter()
        .map(|v| bf16::from_f32(v * scale).to_f32())
        .collect()
}

fn tensor<S: Shape>(dev: &Cpu, values: &[f32], shape: S) -> Tensor<S, bf16, Cpu> {
    dev.tensor_from_vec(values.iter().map(|v| bf16::from_f32(*v)).collect(), shape)
}

fn f32s<S: Shape>(t: &Tensor<S, bf16, Cpu>) -> Vec<f32> {
    t.as_vec().into_iter().map(AmpElem::to_f32).collect()
}

/// The exact values of a current-scaled FP8 tensor, in f64: code / scale.
fn exact<F: typed_amp::fp8::Fp8Element>(data: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let t = Fp8Tensor::<F>::quantize(data, rows, cols).unwrap();
    let s = f64::from(t.scales()[0]);
    t.codes()
        .bits()
        .into_iter()
        .map(|b| f64::from(F::from_bits(b).to_f32()) / s)
        .collect()
}

/// `a (m × k) · bᵀ (n × k)` in f64, and `Σ|a||b|` per element.
fn product(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                c[i * n + j] += a[i * k + l] * b[j * k + l];
                abs[i * n + j] += (a[i * k + l] * b[j * k + l]).abs();
            }
        }
    }
    (c, abs)
}

fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = a[i * cols + j];
        }
    }
    t
}

/// Output, input gradient and FP32 weight gradient of `Σ y·r` through the op.
fn run<const I: usize, const O: usize>(
    layer: &LinearModule<I, O, bf16, Cpu>,
    x: &Tensor<(usize, Const<I>), bf16, Cpu>,
    r: &Tensor<(usize, Const<O>), bf16, Cpu>,
    fp8: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let xt = x.clone().traced_mixed(MixedGradients::leaky());
    let y = if fp8 {
        try_fp8_linear::<Hybrid, _, I, O, _, _, _, _>(layer, xt).unwrap()
    } else {
        try_linear(layer, xt).unwrap()
    };
    let values = f32s(&y.retaped::<NoneTape>());
    let loss = (y * r.clone()).to_f32().sum();
    let grads = Loss::new(loss).backward().unwrap().grads().clone();
    let dw = grads.param_grad(layer.weight.id()).unwrap().to_vec();
    (values, f32s(&grads.get(x).unwrap()), dw)
}

fn case<const I: usize, const O: usize>(rows: usize, seed: u64) {
    let dev = Cpu::seed_from_u64(seed);
    let xv = bf16s(&dev, rows * I, 1.0);
    let wv = bf16s(&dev, O * I, 0.1);
    let rv = bf16s(&dev, rows * O, 1e-3);
    let layer = LinearModule::<I, O, bf16, Cpu> {
        weight: tensor(&dev, &wv, (Const::<O>, Const::<I>)),
    };
    let x = tensor(&dev, &xv, (rows, Const::<I>));
    let r = tensor(&dev, &rv, (rows, Const::<O>));
    let (y, dx, dw) = run(&layer, &x, &r, true);
    // Outside a working copy's forward every scale is the tensor's own amax's: the operands
    // as `Fp8Tensor::quantize` makes them.
    let (xq, wq) = (exact::<E4M3>(&xv, rows, I), exact::<E4M3>(&wv, O, I));
    let dyq = exact::<E5M2>(&rv, rows, O);
    let what = format!("rows {rows}, {I}→{O}");

    let (y_ref, y_abs) = product(&xq, &wq, rows, I, O);
    for (i, (&got, (&want, &abs))) in y.iter().zip(y_ref.iter().zip(&y_abs)).enumerate() {
        let acc = gamma(I + 4) * abs;
        let bound = acc + U_BF16 * (want.abs() + acc);
        assert!(
            (f64::from(got) - want).abs() <= bound,
            "{what}: y[{i}] = {got}, the dequantised product {want}, bound {bound:e}"
        );
    }
    // dx = Q(dy) · Q(W): (rows × O) · ((I × O))ᵀ, rounded to BF16.
    let (dx_ref, dx_abs) = product(&dyq, &transpose(&wq, O, I), rows, O, I);
    for (i, (&got, (&want, &abs))) in dx.iter().zip(dx_ref.iter().zip(&dx_abs)).enumerate() {
        let acc = gamma(O + 4) * abs;
        let bound = acc + U_BF16 * (want.abs() + acc);
        assert!(
            (f64::from(got) - want).abs() <= bound,
            "{what}: dx[{i}] = {got}, the dequantised product {want}, bound {bound:e}"
        );
    }
    // dW = Q(dy)ᵀ · Q(x): (O × rows) · (I × rows)ᵀ, kept in FP32.
    let (dw_ref, dw_abs) = product(
        &transpose(&dyq, rows, O),
        &transpose(&xq, rows, I),
        O,
        rows,
        I,
    );
    for (i, (&got, (&want, &abs))) in dw.iter().zip(dw_ref.iter().zip(&dw_abs)).enumerate() {
        let bound = gamma(rows + 4) * abs;
        assert!(
            (f64::from(got) - want).abs() <= bound,
            "{what}: dw[{i}] = {got}, the dequantised product {want}, bound {bound:e}"
        );
    }

    // Against the BF16 op on the unquantised operands: each E4M3 operand is within 2^-4 of its
    // value (relative) or 2^-10 / scale (absolute, below E4M3's normals).
    let (y16, _, _) = run(&layer, &x, &r, false);
    let (sx, sw) = (448.0 / amax(&xv), 448.0 / amax(&wv));
    let q = |v: f64, s: f64| (v.abs() / 16.0).max(2f64.powi(-10) / s);
    for i in 0..rows {
        for j in 0..O {
            let mut bound = 0.0;
            let mut abs = 0.0;
            for l in 0..I {
                let (xa, wa) = (f64::from(xv[i * I + l]), f64::from(wv[j * I + l]));
                bound += q(xa, sx) * (wa.abs() + q(wa, sw)) + xa.abs() * q(wa, sw);
                abs += (xa * wa).abs();
            }
            let (a, b) = (f64::from(y[i * O + j]), f64::from(y16[i * O + j]));
            let bound = bound + 2.0 * gamma(I + 4) * abs * 1.2 + U_BF16 * (a.abs() + b.abs());
            assert!(
                (a - b).abs() <= bound,
                "{what}: y[{i},{j}] FP8 {a}, BF16 {b}, bound {bound:e}"
            );
        }
    }
}

fn amax(v: &[f32]) -> f64 {
    f64::from(v.iter().fold(0f32, |m, x| m.max(x.abs())))
}

#[test]
fn the_fp8_linear_matches_the_dequantised_product_and_the_bf16_op() {
    case::<64, 48>(33, 1);
    case::<17, 5>(3, 2);
    case::<200, 96>(70, 3);
}

#[test]
fn a_nan_or_inf_in_the_input_reaches_the_gradients() {
    for bad in [f32::NAN, f32::INFINITY] {
        let dev = Cpu::seed_from_u64(4);
        let layer = dev.build_module::<UnbiasedLinear<8, 4>, bf16>();
        let mut xv = vec![0.5f32; 24];
        xv[5] = bad;
        let x = tensor(&dev, &xv, (3, Const::<8>));
        let y =
            try_fp8_linear::<Hybrid, _, 8, 4, _, _, _, _>(&layer, x.leaky_traced_mixed()).unwrap();
        let out = f32s(&y.retaped::<NoneTape>());
        // A saturating cast would have made the inf ±448 / scale: finite.
        assert!(out.iter().any(|v| !v.is_finite()), "{bad}: {out:?}");
        let grads = Loss::new(y.to_f32().sum())
            .backward()
            .unwrap()
            .grads()
            .clone();
        let dw = grads.param_grad(layer.weight.id()).unwrap().to_vec();
        assert!(dw.iter().any(|v| !v.is_finite()), "{bad}: {dw:?}");
    }
}

#[typed_amp::amp(
    policy = "O2",
    dtype = "bf16",
    fp8 = "hybrid",
    cast_model_outputs = "fp32"
)]
pub struct Net {
    fc1: UnbiasedLinear<6, 16>,
    act: AccurateGeLU,
    fc2: UnbiasedLinear<16, 3>,
}

type Model = <Net as typed_amp::amp::AmpModel<Cpu>>::Weights;

fn batch(i: u64) -> (Tensor<Rank2<5, 6>, f32, Cpu>, Tensor<Rank2<5, 3>, f32, Cpu>) {
    let dev = Cpu::seed_from_u64(1000 + i);
    let x: Tensor<Rank2<5, 6>, f32, Cpu> = dev.sample_normal();
    let y = dev.tensor([
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
    ]);
    (x, y)
}

/// Steps of the FP8 model; whether each was skipped.
fn train(
    model: &mut Model,
    opt: &mut Adam<NetMaster<Cpu>, f32, Cpu>,
    steps: std::ops::Range<u64>,
    poison: Option<f32>,
) -> Vec<bool> {
    let mut grads = model.alloc_grads().unwrap();
    let mut skipped = Vec::new();
    for i in steps {
        let (mut x, y) = batch(i);
        if let Some(bad) = poison {
            let mut v = x.as_vec();
            v[7] = bad;
            x.copy_from(&v);
        }
        let logits = model
            .working_mut()
            .try_forward_mut(x.traced_mixed(grads))
            .unwrap();
        let loss = cross_entropy_with_logits_loss(logits, y);
        let outcome = loss
            .backward()
            .unwrap()
            .check(model)
            .unwrap()
            .step(opt)
            .unwrap();
        skipped.push(outcome.skipped());
        grads = outcome.into_grads();
    }
    skipped
}

#[test]
fn a_nan_or_inf_input_skips_the_step_and_leaves_the_histories_finite() {
    for bad in [f32::NAN, f32::INFINITY] {
        let mut model = Net::build(&Cpu::seed_from_u64(5)).unwrap();
        let mut opt = Adam::new(model.master(), AdamConfig::default());
        assert_eq!(train(&mut model, &mut opt, 0..2, None), [false, false]);
        let before = param_bytes(model.master());
        assert_eq!(
            train(&mut model, &mut opt, 2..3, Some(bad)),
            [true],
            "{bad}"
        );
        assert_eq!(param_bytes(model.master()), before);
        let state = model.working().fp8_scaling().state();
        assert_eq!(state.layers, 2);
        assert!(state.values.iter().all(|v| v.is_finite()));
        assert_eq!(train(&mut model, &mut opt, 3..4, None), [false]);
    }
}

#[test]
fn the_recipe_state_resumes_bit_for_bit_and_damage_is_refused() {
    let dir = TempDir::new("fp8-recipe-resume");
    let path = dir.join("model.safetensors");
    let mut model = Net::build(&Cpu::seed_from_u64(6)).unwrap();
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    let scaler = Net::scaler();
    // Before any forward pass the state is empty, and it round-trips as such.
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    let mut empty = Net::build(&Cpu::seed_from_u64(7)).unwrap();
    let mut empty_opt = Adam::new(empty.master(), AdamConfig::default());
    checkpoint::load(&path, &mut empty, &mut empty_opt, &mut Net::scaler()).unwrap();
    assert_eq!(empty.working().fp8_scaling().layers(), 0);
    train(&mut empty, &mut empty_opt, 0..1, None);
    assert_eq!(empty.working().fp8_scaling().history_len(), Some(1024));
    train(&mut model, &mut opt, 0..4, None);
    let saved = model.working().fp8_scaling().state();
    // Two FP8 linear layers, each with 3 histories of 1,024 (+1 pending), the last 4 amaxes
    // recorded.
    assert_eq!((saved.layers, saved.history_len), (2, 1024));
    assert!(saved.values.iter().filter(|v| **v > 0.0).count() >= 2 * 3 * 4);
    checkpoint::save_with_policy(
        &path,
        &mut model,
        &opt,
        &scaler,
        &Net::AMP_CONFIG,
        &BTreeMap::new(),
    )
    .unwrap();
    train(&mut model, &mut opt, 4..9, None);

    let mut resumed = Net::build(&Cpu::seed_from_u64(60)).unwrap();
    let mut resumed_opt = Adam::new(resumed.master(), AdamConfig::default());
    let mut resumed_scaler = Net::scaler();
    checkpoint::load_with_policy(
        &path,
        &mut resumed,
        &mut resumed_opt,
        &mut resumed_scaler,
        &Net::AMP_CONFIG,
    )
    .unwrap();
    assert_eq!(resumed.working().fp8_scaling().state(), saved);
    train(&mut resumed, &mut resumed_opt, 4..9, None);
    assert_eq!(param_bytes(resumed.master()), param_bytes(model.master()));
    assert_eq!(
        resumed.working().fp8_scaling().state(),
        model.working().fp8_scaling().state()
    );

    // A non-finite amax in the file, then no state at all: refused by name, the model untouched.
    for (damage, word) in [(Some(f32::NAN), "damaged"), (None, "missing")] {
        let bad = dir.join(format!("{word}.safetensors"));
        std::fs::copy(&path, &bad).unwrap();
        rewrite(&bad, |tensors, _| match damage {
            Some(v) => {
                let t = tensors
                    .iter_mut()
                    .find(|t| t.0 == "fp8.amax_history")
                    .unwrap();
                t.3[4..8].copy_from_slice(&v.to_le_bytes());
            }
            None => tensors.retain(|t| t.0 != "fp8.amax_history"),
        });
        let mut fresh = Net::build(&Cpu::seed_from_u64(61)).unwrap();
        let before = param_bytes(fresh.master());
        let mut o: Adam<NetMaster<Cpu>, f32, Cpu> =
            Adam::new(fresh.master(), AdamConfig::default());
        let mut s = Net::scaler();
        let err = checkpoint::load(&bad, &mut fresh, &mut o, &mut s).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Fp8State { detail, .. } if detail.contains(word)),
            "{word}: {err}"
        );
        assert_eq!(param_bytes(fresh.master()), before, "{word}");
        assert_eq!(fresh.working().fp8_scaling().layers(), 0, "{word}");
    }
}

#[test]
fn a_data_parallel_commit_needs_the_amaxes_reduced() {
    let scaling = Fp8Scaling::default();
    scaling
        .restore(&Fp8ScalingState {
            history_len: 2,
            layers: 1,
            values: vec![1.0, 2.0, 3.0, 0.5, 0.5, 0.5, 0.0, 0.0, 1e-3],
        })
        .unwrap();
    assert_eq!(scaling.commit(true), Err(Fp8Error::AmaxNotReduced));
    // Another rank saw larger amaxes: the reduced maximum is what enters the histories.
    scaling.set_reduced_amaxes(&[4.0, 0.5, 2e-3]).unwrap();
    scaling.commit(true).unwrap();
    assert_eq!(
        scaling.state().values,
        [2.0, 4.0, 0.0, 0.5, 0.5, 0.0, 0.0, 2e-3, 0.0]
    );
    assert!(matches!(
        scaling.set_reduced_amaxes(&[f32::NAN, 0.0, 0.0]),
        Err(Fp8Error::DamagedState(_))
    ));
    assert!(matches!(
        scaling.restore(&Fp8ScalingState {
            history_len: 2,
            layers: 1,
            values: vec![f32::INFINITY; 9],
        }),
        Err(Fp8Error::DamagedState(_))
    ));
}

/// Through `DataParallel` (one process here): the all-reduce stage reduces the step's amaxes
/// before the step commits them, so the data-parallel step trains and the histories advance as
/// a single process's do; a data-parallel model stepped without that stage is refused (the
/// library's own `NotAllReduced` check, before the FP8 one).
#[test]
fn a_data_parallel_step_reduces_the_amaxes_before_committing_them() {
    use typed_amp::distributed::{DataParallel, SingleProcess};
    let run = |parallel: bool| {
        let mut model = Net::build(&Cpu::seed_from_u64(8)).unwrap();
        let mut opt = Adam::new(model.master(), AdamConfig::default());
        let mut dist = DataParallel::new(GradScaler::disabled(), SingleProcess).unwrap();
        if parallel {
            dist.sync_model(&mut model).unwrap();
        }
        for i in 0..3 {
            let (x, y) = batch(i);
            let grads = model.alloc_grads().unwrap();
            let logits = model
                .working_mut()
                .try_forward_mut(x.traced_mixed(grads))
                .unwrap();
            let loss = cross_entropy_with_logits_loss(logits, y);
            if parallel {
                let scaled = dist.scale(loss).backward().unwrap();
                let local = dist.unscale(&mut model, scaled).unwrap();
                let averaged = dist.all_reduce(local).unwrap();
                let outcome = dist.step(&mut opt, averaged).unwrap();
                dist.update(outcome).unwrap();
            } else {
                let outcome = loss.backward().unwrap().check(&mut model).unwrap();
                assert!(!outcome.step(&mut opt).unwrap().skipped());
            }
        }
        (
            param_bytes(model.master()),
            model.working().fp8_scaling().state(),
        )
    };
    let (dp, alone) = (run(true), run(false));
    assert_eq!(dp.1.layers, 2);
    assert_eq!(dp, alone);
}
