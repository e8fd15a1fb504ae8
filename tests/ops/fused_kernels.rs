//! The fused kernels against the unfused path they replace.
//!
//! - The fused linear op ([`typed_amp::ops::linear`], with a ReLU fused through the tape,
//!   [`typed_amp::ops::relu`]) in FP32, FP16 and BF16, on odd sizes: in FP32 against dfdx's
//!   `Linear` forward followed by dfdx's ReLU, output and input gradient bit for bit (the same
//!   products, rounded at the same places); in every precision against an f64 reference, the
//!   output and the input gradient within the bound of an FP32 accumulation and one rounding
//!   to the layer's precision (dfdx rounds the product, then its sum with the bias: twice), the
//!   weight and bias gradients within the bound of an FP32 accumulation alone (the fused op
//!   keeps them in FP32); and non-finite values found.
//! - Exact GELU fused into the linear op before it ([`typed_amp::ops::gelu`]) against the same
//!   linear op followed by dfdx's `accurate_gelu`, in FP32, FP16 and BF16 on odd sizes: output,
//!   input, weight and bias gradients equal (the same FP32 formulas, rounded once).
//! - The residual connection's sum ([`typed_amp::ops::residual`]) against dfdx's `add`: the sum,
//!   the skip's and the branch's gradients equal, whether or not the skip already had a
//!   gradient when the sum's backward ran.
//! - The fused optimizer + refresh ([`typed_amp::device::UpdateKernel`]) against dfdx's Adam and SGD
//!   followed by the separate refresh: master weights, optimizer state and the working copy bit
//!   for bit, on tensors large enough to take the parallel path.

use typed_amp::device::HostKernel;
use typed_amp::dfdx::nn::modules::Linear as LinearModule;
use typed_amp::ops::gelu::try_gelu;
use typed_amp::ops::linear::try_linear;
use typed_amp::ops::relu::try_relu;
use typed_amp::ops::residual::try_residual_add;
use typed_amp::prelude::*;
use typed_amp::{loss::Loss, params::Parameters, tape::MixedGradients};
use typed_amp::{master::TrainTarget, optim::MasterOptimizer, precision::AmpElem};

/// Values of precision `E`, returned as FP32.
fn sample<E: AmpElem>(dev: &Cpu, n: usize, scale: f32) -> Vec<f32> {
    let t: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(n,));
    t.as_vec()
        .into_iter()
        .map(|v| <E as AmpElem>::from_f32(v * scale).to_f32())
        .collect()
}

fn tensor<S: Shape, E: AmpElem>(dev: &Cpu, values: &[f32], shape: S) -> Tensor<S, E, Cpu>
where
    Cpu: typed_amp::device::Kernels<E>,
{
    dev.tensor_from_vec(
        values
            .iter()
            .map(|v| <E as AmpElem>::from_f32(*v))
            .collect(),
        shape,
    )
}

fn f32s<S: Shape, E: AmpElem>(t: &Tensor<S, E, Cpu>) -> Vec<f32> {
    t.as_vec().into_iter().map(AmpElem::to_f32).collect()
}

/// Unit roundoff of `E`.
fn unit<E: AmpElem>() -> f64 {
    f64::from(typed_amp::precision::dtype_of::<E>().unit_roundoff())
}

/// γ(n) = n·u/(1 − n·u) for FP32 sums of `n` terms (Higham, Accuracy and Stability, §3.1).
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * 2f64.powi(-24);
    nu / (1.0 - nu)
}

/// One fused-linear case: `rows × inputs` through `Linear<I, O>` in precision `E`.
fn linear_case<const I: usize, const O: usize, E: AmpElem>(rows: usize, relu: bool, seed: u64)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let dev = Cpu::seed_from_u64(seed);
    let xv = sample::<E>(&dev, rows * I, 1.0);
    let wv = sample::<E>(&dev, O * I, 0.5);
    let bv = sample::<E>(&dev, O, 0.5);
    // The loss is Σ y·r, so the output's gradient is r.
    let rv = sample::<E>(&dev, rows * O, 1.0);
    let layer = LinearModule::<I, O, E, Cpu> {
        weight: tensor(&dev, &wv, (Const::<O>, Const::<I>)),
        bias: tensor(&dev, &bv, (Const::<O>,)),
    };
    let x: Tensor<(usize, Const<I>), E, Cpu> = tensor(&dev, &xv, (rows, Const::<I>));
    let r: Tensor<(usize, Const<O>), E, Cpu> = tensor(&dev, &rv, (rows, Const::<O>));

    let run = |fused: bool| {
        let grads = MixedGradients::leaky();
        let xt = x.clone().traced_mixed(grads);
        let y = if fused {
            let y = try_linear(&layer, xt).unwrap();
            if relu {
                try_relu(y).unwrap()
            } else {
                y
            }
        } else {
            let y = layer.forward(xt);
            if relu {
                y.relu()
            } else {
                y
            }
        };
        let y_values = f32s(&y.retaped::<NoneTape>());
        let loss = (y * r.clone()).to_f32().sum();
        let grads = Loss::new(loss).backward().unwrap().grads().clone();
        // The fused op keeps the parameters' gradients in FP32 (`get` would round them to the
        // layer's precision); dfdx's are in the layer's precision.
        let fp32 = |id| grads.param_grad(id).map(|g| g.to_vec());
        let dw =
            fp32(layer.weight.id()).unwrap_or_else(|| f32s(&grads.get(&layer.weight).unwrap()));
        let db = fp32(layer.bias.id()).unwrap_or_else(|| f32s(&grads.get(&layer.bias).unwrap()));
        (
            y_values,
            f32s(&grads.get(&x).expect("x's gradient")),
            dw,
            db,
        )
    };
    let (y, dx, dw, db) = run(true);
    let (y_ref, dx_ref, _, _) = run(false);
    let what = format!(
        "{} rows {rows}, {I}→{O}, relu {relu}",
        std::any::type_name::<E>()
    );
    let u = unit::<E>();
    if u == unit::<f32>() {
        // FP32: the same products and the same roundings (the bias added to the FP32 product
        // once) as dfdx's matmul and broadcast add: equal values (ReLU may give -0 where the
        // fused op gives 0).
        assert_eq!(y, y_ref, "output, {what}");
        assert_eq!(dx, dx_ref, "input gradient, {what}");
    }
    // The output against f64: the product and the bias summed in FP32, rounded once.
    for row in 0..rows {
        for o in 0..O {
            let (mut exact, mut size) = (f64::from(bv[o]), f64::from(bv[o]).abs());
            for i in 0..I {
                let p = f64::from(xv[row * I + i]) * f64::from(wv[o * I + i]);
                exact += p;
                size += p.abs();
            }
            let exact = if relu { exact.max(0.0) } else { exact };
            let bound = gamma(I + 1) * size + u * exact.abs() + 1e-30;
            let got = f64::from(y[row * O + o]);
            assert!(
                (got - exact).abs() <= bound,
                "y[{row},{o}] {got} vs {exact} ({bound}), {what}"
            );
        }
    }

    // The weight and bias gradients against f64, with the mask the forward produced.
    let dz: Vec<f64> = (0..rows * O)
        .map(|i| {
            if relu && y[i] <= 0.0 {
                0.0
            } else {
                f64::from(rv[i])
            }
        })
        .collect();
    for row in 0..rows {
        for i in 0..I {
            let (mut exact, mut size) = (0f64, 0f64);
            for o in 0..O {
                let p = dz[row * O + o] * f64::from(wv[o * I + i]);
                exact += p;
                size += p.abs();
            }
            // FP32 accumulation, one rounding to the layer's precision.
            let bound = gamma(O) * size + u * exact.abs() + 1e-30;
            let got = f64::from(dx[row * I + i]);
            assert!(
                (got - exact).abs() <= bound,
                "dx[{row},{i}] {got} vs {exact} ({bound}), {what}"
            );
        }
    }
    for o in 0..O {
        let (mut exact, mut size) = (0f64, 0f64);
        for row in 0..rows {
            exact += dz[row * O + o];
            size += dz[row * O + o].abs();
        }
        // FP32 column sums; the fused op keeps them in FP32, unrounded.
        let bound = gamma(rows) * size + 1e-30;
        let err = (f64::from(db[o]) - exact).abs();
        assert!(
            err <= bound,
            "db[{o}] {} vs {exact}: {err} > {bound}, {what}",
            db[o]
        );
        for i in 0..I {
            let (mut exact, mut size) = (0f64, 0f64);
            for row in 0..rows {
                let p = dz[row * O + o] * f64::from(xv[row * I + i]);
                exact += p;
                size += p.abs();
            }
            // Accumulated and stored in FP32: no rounding to the layer's precision.
            let bound = gamma(rows) * size + 1e-30;
            let got = f64::from(dw[o * I + i]);
            assert!(
                (got - exact).abs() <= bound,
                "dw[{o},{i}] {got} vs {exact} (bound {bound}), {what}"
            );
        }
    }
}

#[test]
fn the_fused_linear_op_matches_dfdx_linear_and_relu() {
    for relu in [false, true] {
        linear_case::<1, 1, f32>(1, relu, 1);
        linear_case::<7, 5, f32>(3, relu, 2);
        linear_case::<33, 130, f32>(17, relu, 3);
        linear_case::<129, 10, f32>(65, relu, 4);
        linear_case::<7, 5, f16>(3, relu, 5);
        linear_case::<33, 130, f16>(17, relu, 6);
        linear_case::<129, 10, f16>(65, relu, 7);
        linear_case::<7, 5, bf16>(3, relu, 8);
        linear_case::<33, 130, bf16>(17, relu, 9);
        linear_case::<129, 10, bf16>(65, relu, 10);
    }
}

#[test]
fn a_relu_after_a_shared_linear_output_is_not_fused() {
    // Another reader of the linear op's output (a clone kept for a second branch) must see the
    // values before the ReLU, so the ReLU runs unfused and the output keeps its values.
    let dev = Cpu::seed_from_u64(11);
    let layer = dev.build_module::<Linear<4, 3>, f32>();
    let x: Tensor<Rank2<5, 4>, f32, Cpu> = dev.sample_normal();
    let y = try_linear(&layer, x.clone().leaky_traced_mixed()).unwrap();
    let kept = y.retaped::<NoneTape>();
    let before = kept.as_vec();
    let z = try_relu(y).unwrap();
    assert_eq!(kept.as_vec(), before, "the shared output was overwritten");
    let expected: Vec<f32> = before.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(z.retaped::<NoneTape>().as_vec(), expected);
}

#[test]
fn a_nan_in_a_fused_layers_input_reaches_its_gradients() {
    for relu in [false, true] {
        let dev = Cpu::seed_from_u64(12);
        let layer = dev.build_module::<Linear<4, 3>, bf16>();
        let mut xv = vec![0.5f32; 20];
        xv[5] = f32::NAN;
        let x: Tensor<(usize, Const<4>), bf16, Cpu> = tensor(&dev, &xv, (5, Const::<4>));
        let y = try_linear(&layer, x.leaky_traced_mixed()).unwrap();
        let y = if relu { try_relu(y).unwrap() } else { y };
        let grads = Loss::new(y.to_f32().sum())
            .backward()
            .unwrap()
            .grads()
            .clone();
        let dw = f32s(&grads.get(&layer.weight).unwrap());
        // The NaN row feeds every output of its sample; ReLU passes NaN on as 0 (as dfdx's
        // `max(x, 0)`), so with it only the weight gradient, through the input, sees the NaN.
        assert!(dw.iter().any(|v| v.is_nan()), "relu {relu}: {dw:?}");
    }
}

/// One GELU case: `rows × I` through the fused linear op, then exact GELU fused into it or
/// dfdx's `accurate_gelu` after it; everything that comes out must be equal.
fn gelu_case<const I: usize, const O: usize, E: AmpElem>(rows: usize, bias: bool, seed: u64)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let dev = Cpu::seed_from_u64(seed);
    let xv = sample::<E>(&dev, rows * I, 1.0);
    let wv = sample::<E>(&dev, O * I, 0.5);
    let bv = sample::<E>(&dev, O, if bias { 0.5 } else { 0.0 });
    let rv = sample::<E>(&dev, rows * O, 1.0);
    let layer = LinearModule::<I, O, E, Cpu> {
        weight: tensor(&dev, &wv, (Const::<O>, Const::<I>)),
        bias: tensor(&dev, &bv, (Const::<O>,)),
    };
    let x: Tensor<(usize, Const<I>), E, Cpu> = tensor(&dev, &xv, (rows, Const::<I>));
    let r: Tensor<(usize, Const<O>), E, Cpu> = tensor(&dev, &rv, (rows, Const::<O>));
    let what = format!("{} rows {rows}, {I}→{O}", std::any::type_name::<E>());
    let run = |fused: bool| {
        let grads = MixedGradients::leaky();
        let y = try_linear(&layer, x.clone().traced_mixed(grads)).unwrap();
        let id = y.id();
        let y = if fused {
            let y = try_gelu(y).unwrap();
            // Fused: the activation overwrote the product's output, whose id it keeps.
            assert_eq!(y.id(), id, "GELU did not fuse, {what}");
            y
        } else {
            y.accurate_gelu()
        };
        let y_values = f32s(&y.retaped::<NoneTape>());
        let loss = (y * r.clone()).to_f32().sum();
        let grads = Loss::new(loss).backward().unwrap().grads().clone();
        let fp32 = |id| {
            grads
                .param_grad(id)
                .map(|g| g.to_vec())
                .expect("FP32 gradient")
        };
        (
            y_values,
            f32s(&grads.get(&x).expect("x's gradient")),
            fp32(layer.weight.id()),
            fp32(layer.bias.id()),
        )
    };
    let (fused, composed) = (run(true), run(false));
    assert_eq!(fused.0, composed.0, "output, {what}");
    assert_eq!(fused.1, composed.1, "input gradient, {what}");
    assert_eq!(fused.2, composed.2, "weight gradient, {what}");
    assert_eq!(fused.3, composed.3, "bias gradient, {what}");
    // And GELU itself ran: its dip below zero shows among more than a few outputs.
    if rows * O > 4 {
        assert!(
            fused.0.iter().any(|v| *v < 0.0),
            "GELU's dip below zero, {what}"
        );
    }
}

#[test]
fn gelu_fused_into_the_linear_op_matches_dfdx_gelu_after_it() {
    for bias in [false, true] {
        gelu_case::<1, 1, f32>(1, bias, 31);
        gelu_case::<7, 5, f32>(3, bias, 32);
        gelu_case::<33, 130, f32>(17, bias, 33);
        gelu_case::<129, 10, f32>(65, bias, 34);
        // Over one parallel task of the kernels (2^15 elements).
        gelu_case::<16, 1030, f32>(40, bias, 35);
        gelu_case::<7, 5, f16>(3, bias, 36);
        gelu_case::<33, 130, f16>(17, bias, 37);
        gelu_case::<16, 1030, f16>(40, bias, 38);
        gelu_case::<7, 5, bf16>(3, bias, 39);
        gelu_case::<33, 130, bf16>(17, bias, 40);
        gelu_case::<16, 1030, bf16>(40, bias, 41);
    }
}

#[test]
fn a_gelu_after_a_shared_linear_output_is_not_fused() {
    let dev = Cpu::seed_from_u64(13);
    let layer = dev.build_module::<Linear<4, 3>, bf16>();
    let x: Tensor<Rank2<5, 4>, bf16, Cpu> = dev.sample_normal();
    let y = try_linear(&layer, x.clone().leaky_traced_mixed()).unwrap();
    let id = y.id();
    let kept = y.retaped::<NoneTape>();
    let before = kept.as_vec();
    let z = try_gelu(y).unwrap();
    assert_ne!(z.id(), id, "fused over a shared output");
    assert_eq!(kept.as_vec(), before, "the shared output was overwritten");
    assert_eq!(
        z.retaped::<NoneTape>().as_vec(),
        kept.clone().accurate_gelu().as_vec()
    );
}

#[test]
fn a_nan_before_a_fused_gelu_reaches_the_gradients() {
    let dev = Cpu::seed_from_u64(14);
    let layer = dev.build_module::<Linear<4, 3>, bf16>();
    let mut xv = vec![0.5f32; 20];
    xv[5] = f32::NAN;
    let x: Tensor<(usize, Const<4>), bf16, Cpu> = tensor(&dev, &xv, (5, Const::<4>));
    let y = try_gelu(try_linear(&layer, x.clone().leaky_traced_mixed()).unwrap()).unwrap();
    let grads = Loss::new(y.to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let fp32 = |id| grads.param_grad(id).map(|g| g.to_vec()).unwrap();
    // GELU of NaN is NaN, and so is its derivative: the NaN row's output gradient is NaN, and
    // so the bias gradient and the weight gradient (through every input) are.
    assert!(fp32(layer.bias.id()).iter().all(|v| v.is_nan()));
    assert!(fp32(layer.weight.id()).iter().any(|v| v.is_nan()));
    assert!(f32s(&grads.get(&x).unwrap())
        .iter()
        .skip(4)
        .take(4)
        .any(|v| v.is_nan()));
}

/// `x + linear(x)` by the residual op or dfdx's `add`; with `reread`, `x` is read again after
/// the sum (so its gradient exists when the sum's backward runs).
fn residual_case<E: AmpElem>(rows: usize, reread: bool, seed: u64)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let dev = Cpu::seed_from_u64(seed);
    let xv = sample::<E>(&dev, rows * 9, 1.0);
    let layer = LinearModule::<9, 9, E, Cpu> {
        weight: tensor(&dev, &sample::<E>(&dev, 81, 0.3), (Const::<9>, Const::<9>)),
        bias: tensor(&dev, &sample::<E>(&dev, 9, 0.3), (Const::<9>,)),
    };
    let x: Tensor<(usize, Const<9>), E, Cpu> = tensor(&dev, &xv, (rows, Const::<9>));
    let r: Tensor<(usize, Const<9>), E, Cpu> =
        tensor(&dev, &sample::<E>(&dev, rows * 9, 1.0), (rows, Const::<9>));
    let what = format!("{} rows {rows} reread {reread}", std::any::type_name::<E>());
    let run = |fused: bool| {
        let xt = x.clone().traced_mixed(MixedGradients::leaky());
        let branch = try_linear(&layer, xt.with_empty_tape()).unwrap();
        let id = branch.id();
        let sum = if fused {
            let sum = try_residual_add(branch, xt.with_empty_tape()).unwrap();
            assert_eq!(
                sum.id(),
                id,
                "the sum did not take the branch's buffer, {what}"
            );
            sum
        } else {
            branch + xt.with_empty_tape()
        };
        let sum_values = f32s(&sum.retaped::<NoneTape>());
        let mut loss = (sum * r.clone()).to_f32().sum();
        if reread {
            loss = loss + (xt * r.clone()).to_f32().sum();
        }
        let grads = Loss::new(loss).backward().unwrap().grads().clone();
        let fp32 = |id| {
            grads
                .param_grad(id)
                .map(|g| g.to_vec())
                .expect("FP32 gradient")
        };
        (
            sum_values,
            f32s(&grads.get(&x).expect("x's gradient")),
            fp32(layer.weight.id()),
            fp32(layer.bias.id()),
        )
    };
    let (fused, composed) = (run(true), run(false));
    assert_eq!(fused.0, composed.0, "sum, {what}");
    assert_eq!(fused.1, composed.1, "skip's gradient, {what}");
    assert_eq!(fused.2, composed.2, "branch's weight gradient, {what}");
    assert_eq!(fused.3, composed.3, "branch's bias gradient, {what}");
}

#[test]
fn the_residual_sum_matches_dfdx_add() {
    for reread in [false, true] {
        residual_case::<f32>(5, reread, 51);
        residual_case::<f16>(5, reread, 52);
        residual_case::<bf16>(5, reread, 53);
        residual_case::<bf16>(4000, reread, 54);
    }
}

/// An MLP big enough that its first layer takes the parallel update (over 32,768 weights).
type Mlp = (Linear<300, 128>, ReLU, Linear<128, 10>);

#[test]
fn fused_adam_and_sgd_match_the_unfused_update_and_refresh_bit_for_bit() {
    use common::{optimizer_bytes, param_bytes};
    use typed_amp::dfdx::optim::{Adam, Sgd};
    use typed_amp::dfdx::prelude::{Momentum, WeightDecay};

    let dev = Cpu::seed_from_u64(13);
    let master = dev.build_module::<Mlp, f32>();
    let working = master.to_dtype::<bf16>();

    // One seeded stream of gradients, FP32 master gradients as the step would pass them.
    let grad_stream = |step: u64| {
        let d = Cpu::seed_from_u64(100 + step);
        let mut grads = MixedGradients::<Cpu>::for_params(&master).unwrap();
        struct Fill<'a>(&'a Cpu, &'a mut MixedGradients<Cpu>);
        impl typed_amp::params::ParamVisitor<Cpu> for Fill<'_> {
            type Error = std::convert::Infallible;
            fn visit<S: Shape, E: AmpElem>(
                &mut self,
                _path: &str,
                param: &Tensor<S, E, Cpu>,
                trainable: bool,
            ) -> Result<(), Self::Error>
            where
                Cpu: typed_amp::device::Kernels<E>,
            {
                if trainable {
                    let values: Tensor<S, f32, Cpu> =
                        SampleTensor::<f32>::sample_normal_like(self.0, param.shape());
                    let values = values.to_dtype::<E>();
                    let buf = self.1.store_mut::<E>().get_or_alloc_mut(param).unwrap();
                    HostKernel::<E>::try_write(self.0, buf, &values.as_vec()).unwrap();
                }
                Ok(())
            }
        }
        let Ok(()) = master.visit_params(&mut Fill(&d, &mut grads));
        grads
    };

    macro_rules! compare {
        ($name:literal, $make:expr) => {{
            let mut fused_model = MasterWeights::<_, _, _, typed_amp::precision::BF16>::pair(
                master.clone(),
                working.clone(),
                &dev,
            )
            .unwrap();
            let mut plain_model = MasterWeights::<_, _, _, typed_amp::precision::BF16>::pair(
                master.clone(),
                working.clone(),
                &dev,
            )
            .unwrap();
            let mut fused_opt = $make(fused_model.master());
            let mut plain_opt = $make(plain_model.master());
            for step in 0..3 {
                // The copies' masters are clones of one model: their tensors keep its ids, so
                // one set of gradients serves both.
                let grads = grad_stream(step);
                fused_model.update_with(&mut fused_opt, &grads).unwrap();
                MasterOptimizer::try_update(&mut plain_opt, plain_model.master_mut(), &grads)
                    .unwrap();
                plain_model.refresh().unwrap();
                assert_eq!(
                    param_bytes(fused_model.master()),
                    param_bytes(plain_model.master()),
                    "{}: master after step {step}",
                    $name
                );
                assert_eq!(
                    param_bytes(fused_model.working()),
                    param_bytes(plain_model.working()),
                    "{}: working copy after step {step}",
                    $name
                );
                assert_eq!(
                    optimizer_bytes(&fused_opt, fused_model.master()),
                    optimizer_bytes(&plain_opt, plain_model.master()),
                    "{}: optimizer state after step {step}",
                    $name
                );
            }
        }};
    }

    compare!("Adam", |m| Adam::<_, f32, Cpu>::new(
        m,
        AdamConfig::default()
    ));
    compare!("AdamW", |m| typed_amp::optim::adamw(m, 3e-3, 0.01));
    compare!("Adam L2", |m| Adam::<_, f32, Cpu>::new(
        m,
        AdamConfig {
            lr: 2e-3,
            weight_decay: Some(WeightDecay::L2(1e-2)),
            ..Default::default()
        }
    ));
    for momentum in [
        None,
        Some(Momentum::Classic(0.9)),
        Some(Momentum::Nesterov(0.8)),
    ] {
        compare!("SGD", |m| Sgd::<_, f32, Cpu>::new(
            m,
            SgdConfig {
                lr: 0.05,
                momentum,
                weight_decay: Some(WeightDecay::Decoupled(1e-3)),
            }
        ));
    }
}

use crate::common;

/// The mixed batch norm (16-bit activations, FP32 parameters and statistics) against an f64
/// reference on the same 16-bit input: the output, the input's gradient and the parameters'
/// gradients, with and without a fused ReLU, and the running statistics.
fn batch_norm_case<E: AmpElem>(seed: u64, relu: bool)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    use typed_amp::amp::norm::MixedNormMut;
    use typed_amp::dfdx::nn::modules::BatchNorm2D;
    const C: usize = 3;
    type Builder = typed_amp::dfdx::nn::builders::BatchNorm2D<C>;
    let (b, h, w) = (5, 7, 3);
    let dev = Cpu::seed_from_u64(seed);
    let n = b * h * w;
    // An offset mean, so that the centred values are small beside the raw ones.
    let xv: Vec<f32> = sample::<E>(&dev, b * C * h * w, 2.0)
        .into_iter()
        .map(|v| <E as AmpElem>::from_f32(v + 3.0).to_f32())
        .collect();
    let rv = sample::<E>(&dev, b * C * h * w, 1.0);
    let mut bn: BatchNorm2D<C, f32, Cpu> = dev.build_module::<Builder, f32>();
    bn.scale = dev.tensor([1.5, -0.5, 0.75]);
    bn.bias = dev.tensor([0.25, 1.0, -2.0]);
    let shape = (b, Const::<C>, h, w);
    let x: Tensor<(usize, Const<C>, usize, usize), E, Cpu> = tensor(&dev, &xv, shape);
    let r: Tensor<(usize, Const<C>, usize, usize), E, Cpu> = tensor(&dev, &rv, shape);
    let y = bn
        .try_forward_mixed_mut(x.clone().leaky_traced_mixed())
        .unwrap();
    let y = if relu { try_relu(y).unwrap() } else { y };
    let yv = f32s(&y.retaped::<NoneTape>());
    let grads = Loss::new((y * r.clone()).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let dx = f32s(&grads.get(&x).unwrap());
    let ds = grads.param_grad(bn.scale.id()).unwrap().to_vec();
    let db = grads.param_grad(bn.bias.id()).unwrap().to_vec();

    let what = format!("{} relu {relu}", std::any::type_name::<E>());
    let (u, u32_) = (unit::<E>(), 2f64.powi(-24));
    let at = |i: usize, c: usize, hw: usize| (i * C + c) * h * w + hw;
    let (scale, bias) = ([1.5f64, -0.5, 0.75], [0.25f64, 1.0, -2.0]);
    for c in 0..C {
        let vals: Vec<(usize, f64)> = (0..b)
            .flat_map(|i| (0..h * w).map(move |k| at(i, c, k)))
            .map(|j| (j, f64::from(xv[j])))
            .collect();
        let mean = vals.iter().map(|(_, v)| v).sum::<f64>() / n as f64;
        let var = vals.iter().map(|(_, v)| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let std = (var + 1e-5).sqrt();
        let a = scale[c] / std;
        let abs_sum: f64 = vals.iter().map(|(_, v)| v.abs()).sum();
        // The FP32 statistics are within γ of the sums of magnitudes (run sums in 16 lanes,
        // runs added in f64), and a handful of FP32 operations apply them.
        let mean_err = gamma(n / 16 + 32) * abs_sum / n as f64;
        let mut dz = vec![0f64; n];
        for (k, (j, v)) in vals.iter().enumerate() {
            let exact = (v - mean) * a + bias[c];
            let exact = if relu { exact.max(0.0) } else { exact };
            let bound = u * exact.abs()
                + 16.0 * u32_ * ((v - mean).abs() * a.abs() + bias[c].abs())
                + a.abs() * mean_err * 4.0;
            let got = f64::from(yv[*j]);
            assert!(
                (got - exact).abs() <= bound,
                "y[{j}] {got} vs {exact} ({bound}), {what}"
            );
            // The gradient flows where the fused op's own output is positive.
            dz[k] = if relu && yv[*j] <= 0.0 {
                0.0
            } else {
                f64::from(rv[*j])
            };
        }
        let sum_dz: f64 = dz.iter().sum();
        let sum_dz_xhat: f64 = vals
            .iter()
            .zip(&dz)
            .map(|((_, v), d)| d * (v - mean) / std)
            .sum();
        let mag: f64 =
            dz.iter().map(|d| d.abs()).sum::<f64>() * (1.0 + 4.0 * abs_sum / n as f64 / std);
        let sum_bound = gamma(n / 16 + 32) * mag + 64.0 * u32_ * mag;
        let got_db = f64::from(db[c]);
        assert!(
            (got_db - sum_dz).abs() <= sum_bound,
            "db[{c}] {got_db} vs {sum_dz}, {what}"
        );
        let got_ds = f64::from(ds[c]);
        assert!(
            (got_ds - sum_dz_xhat).abs() <= sum_bound,
            "dscale[{c}] {got_ds} vs {sum_dz_xhat}, {what}"
        );
        for (k, (j, v)) in vals.iter().enumerate() {
            let xhat = (v - mean) / std;
            let exact = a / n as f64 * (n as f64 * dz[k] - sum_dz - xhat * sum_dz_xhat);
            let bound = u * exact.abs()
                + a.abs() / n as f64 * (sum_bound * (1.0 + xhat.abs()))
                + 32.0
                    * u32_
                    * a.abs()
                    * (dz[k].abs() + (sum_dz.abs() + xhat.abs() * sum_dz_xhat.abs()) / n as f64);
            let got = f64::from(dx[*j]);
            assert!(
                (got - exact).abs() <= bound,
                "dx[{j}] {got} vs {exact} ({bound}), {what}"
            );
        }
        // Running statistics: 0.9 · (0, 1) + 0.1 · (mean, unbiased variance), in FP32.
        let rm = f64::from(bn.running_mean.as_vec()[c]);
        let rvar = f64::from(bn.running_var.as_vec()[c]);
        let unbiased = var * n as f64 / (n as f64 - 1.0);
        assert!(
            (rm - 0.1 * mean).abs() <= 0.1 * mean_err + 8.0 * u32_ * mean.abs(),
            "{what}"
        );
        assert!(
            (rvar - (0.9 + 0.1 * unbiased)).abs() <= 1e-5 * (1.0 + unbiased),
            "running var {rvar} vs {}, {what}",
            0.9 + 0.1 * unbiased
        );
    }
}

#[test]
fn the_mixed_batch_norm_matches_an_f64_reference() {
    for relu in [false, true] {
        batch_norm_case::<f16>(21, relu);
        batch_norm_case::<bf16>(22, relu);
        batch_norm_case::<f32>(23, relu);
    }
}

/// A non-finite value in the mixed batch norm's 16-bit input is not hidden by its FP32
/// statistics: its channel's output and gradients carry it (so the step's inf/NaN check finds
/// it and skips), with and without the fused ReLU, in FP16 and BF16.
fn batch_norm_non_finite_case<E: AmpElem>(bad: f32, relu: bool)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    use typed_amp::amp::norm::MixedNormMut;
    use typed_amp::dfdx::nn::modules::BatchNorm2D;
    const C: usize = 3;
    type Builder = typed_amp::dfdx::nn::builders::BatchNorm2D<C>;
    let (b, h, w) = (3, 5, 3);
    let dev = Cpu::seed_from_u64(31);
    let mut xv = sample::<E>(&dev, b * C * h * w, 1.0);
    // Image 1, channel 2, position 4.
    xv[(C + 2) * h * w + 4] = bad;
    let rv = sample::<E>(&dev, b * C * h * w, 1.0);
    let mut bn: BatchNorm2D<C, f32, Cpu> = dev.build_module::<Builder, f32>();
    let shape = (b, Const::<C>, h, w);
    let x: Tensor<(usize, Const<C>, usize, usize), E, Cpu> = tensor(&dev, &xv, shape);
    let r: Tensor<(usize, Const<C>, usize, usize), E, Cpu> = tensor(&dev, &rv, shape);
    let y = bn
        .try_forward_mixed_mut(x.clone().leaky_traced_mixed())
        .unwrap();
    let y = if relu { try_relu(y).unwrap() } else { y };
    let grads = Loss::new((y * r).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let what = format!("{} {bad} relu {relu}", std::any::type_name::<E>());
    let ds = grads.param_grad(bn.scale.id()).unwrap().to_vec();
    let db = grads.param_grad(bn.bias.id()).unwrap().to_vec();
    let dx = f32s(&grads.get(&x).unwrap());
    // The poisoned channel's statistics are NaN (inf − inf in the variance): the scale's and
    // the input's gradients depend on them and are non-finite; the bias's gradient is the sum
    // of the incoming gradient, which does not. The clean channels stay finite.
    assert!(!ds[2].is_finite(), "{what}: {ds:?}");
    assert!(
        ds[..2].iter().chain(&db[..2]).all(|v| v.is_finite()),
        "{what}"
    );
    let channel = |c: usize| {
        (0..b).flat_map(move |i| ((i * C + c) * h * w..(i * C + c + 1) * h * w).collect::<Vec<_>>())
    };
    assert!(channel(2).any(|j| !dx[j].is_finite()), "{what}");
    assert!(
        channel(0).chain(channel(1)).all(|j| dx[j].is_finite()),
        "{what}"
    );
    let running_mean = bn.running_mean.as_vec();
    assert!(!running_mean[2].is_finite(), "{what}: {running_mean:?}");
}

#[test]
fn a_non_finite_input_of_the_mixed_batch_norm_reaches_its_gradients() {
    for relu in [false, true] {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            batch_norm_non_finite_case::<f16>(bad, relu);
            batch_norm_non_finite_case::<bf16>(bad, relu);
        }
    }
}
