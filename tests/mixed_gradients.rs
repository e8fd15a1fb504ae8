//! Gradients through graphs with FP16 layers and an FP32 loss match a pure-FP32 reference.
//!
//! Each test builds an FP32 reference model, rounds its weights to FP16 values, and pairs it
//! with a mixed-precision working copy holding exactly those values (FP16 linear and conv
//! layers; batch norm, layer norm, softmax and the loss in FP32). Both see the same input (also
//! FP16-representable), so every difference between their gradients comes from FP16 arithmetic
//! in the working copy's forward and backward passes, plus nothing from loss scaling: the scale
//! is a power of two, so scaling and unscaling are exact.
//!
//! Tolerance. An FP16 op rounds its result once, to a relative error of at most `u = ε/2`, with
//! `ε = 2^-10` FP16's machine epsilon (dfdx's FP16 matmul and convolution accumulate in FP32 and
//! round once at the end). To first order, the rounding errors along a gradient's path add up,
//! each bounded by `u` times the magnitude of the value rounded. A parameter's gradient depends
//! on the FP16 activations of every layer before the loss and on the FP16 gradients of every
//! layer after it, so its path has at most `R = 2·L + 1` roundings for a network with `L` FP16
//! layers (one forward output and one backward product per layer, plus the cast of the loss
//! gradient into FP16). Each test checks, per parameter, `max |g16 − g32| ≤ R·ε·max |g32|`: the
//! first-order bound with a factor 2 for the sums of same-signed errors in reductions.

use approx::assert_abs_diff_eq;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, LayerNorm1D, Linear};
use typed_amp::loss::{cross_entropy_with_logits_loss, mse_loss};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D, ToF16, ToF32};
use typed_amp::params::ParamVisitorMut;
use typed_amp::prelude::*;
use typed_amp::{AmpElem, DType, UnscaledGrads};

/// FP16's machine epsilon, 2^-10.
const F16_EPS: f32 = 1.0 / 1024.0;

/// A power-of-two scale that keeps these small models' FP16 gradients far from overflow.
const SCALE: f32 = 1024.0;

/// Rounds every parameter to the nearest FP16 value, in place.
struct RoundToF16;

impl ParamVisitorMut<Cpu> for RoundToF16 {
    type Error = std::convert::Infallible;
    fn visit_mut<S: Shape, E: AmpElem>(
        &mut self,
        _path: &str,
        param: &mut Tensor<S, E, Cpu>,
        _trainable: bool,
    ) -> Result<(), Self::Error>
    where
        Cpu: Device<E>,
    {
        let rounded: Vec<E> = param
            .as_vec()
            .into_iter()
            .map(|x| <E as AmpElem>::from_f32(f16::from_f32(x.to_f32()).to_f32()))
            .collect();
        param.copy_from(&rounded);
        Ok(())
    }
}

fn fp16_values<S: ConstShape>(dev: &Cpu) -> Tensor<S, f32, Cpu> {
    let x: Tensor<S, f32, Cpu> = dev.sample_normal();
    x.to_dtype::<f16>().to_dtype::<f32>()
}

fn one_hot<const B: usize, const C: usize>(dev: &Cpu) -> Tensor<Rank2<B, C>, f32, Cpu> {
    let mut probs = [[0.0f32; C]; B];
    for (i, row) in probs.iter_mut().enumerate() {
        row[(i * 7 + 3) % C] = 1.0;
    }
    dev.tensor(probs)
}

/// Checks every parameter's gradient against the reference within `R·ε·max|g32|`.
fn assert_close(
    mixed: &[(String, Vec<f32>)],
    reference: &[(String, Vec<f32>)],
    roundings: f32,
) -> f32 {
    assert_eq!(mixed.len(), reference.len());
    let mut worst = 0f32;
    for ((path, g16), (ref_path, g32)) in mixed.iter().zip(reference) {
        assert_eq!(path, ref_path);
        let scale = g32.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(scale > 0.0, "`{path}` has an all-zero reference gradient");
        let tolerance = roundings * F16_EPS * scale;
        for (a, b) in g16.iter().zip(g32) {
            assert_abs_diff_eq!(*a, *b, epsilon = tolerance);
            worst = worst.max((a - b).abs() / scale);
        }
    }
    worst
}

fn master_grads<T: TrainTarget<Cpu>>(
    mut grads: UnscaledGrads<'_, T, Cpu>,
) -> Vec<(String, Vec<f32>)> {
    assert!(!grads.found_inf());
    grads.to_host().unwrap()
}

#[test]
fn mlp_with_fp16_linear_layers() {
    let dev = Cpu::seed_from_u64(1);
    type Reference = (Linear<12, 32>, ReLU, Linear<32, 32>, ReLU, Linear<32, 5>);
    let mut master = dev.build_module::<Reference, f32>();
    master.visit_params_mut(&mut RoundToF16).unwrap();
    let working = dev.build_module::<Reference, f16>();
    let mut mixed = MasterWeights::from_parts(master.clone(), working, &dev).unwrap();
    let mut reference = Fp32Weights::new(master, &dev);

    let x = fp16_values::<Rank2<16, 12>>(&dev);
    let target = one_hot::<16, 5>(&dev);

    let scaler = GradScaler::disabled();
    let logits = reference
        .working()
        .forward(x.clone().traced_mixed(reference.alloc_grads().unwrap()));
    let loss = cross_entropy_with_logits_loss(logits, target.clone());
    let grads = scaler.scale(loss).backward().unwrap();
    let want = master_grads(scaler.unscale(&mut reference, grads).unwrap());

    let scaler = GradScaler::with_static_scale(SCALE).unwrap();
    let logits = mixed
        .working()
        .forward(
            x.to_dtype::<f16>()
                .traced_mixed(mixed.alloc_grads().unwrap()),
        )
        .to_f32();
    let loss = cross_entropy_with_logits_loss(logits, target);
    let grads = scaler.scale(loss).backward().unwrap();
    let got = master_grads(scaler.unscale(&mut mixed, grads).unwrap());

    // L = 3 FP16 layers: R = 7.
    let worst = assert_close(&got, &want, 7.0);
    eprintln!(
        "MLP: worst |g16 - g32| / max|g32| = {worst:.2e} (bound {:.2e})",
        7.0 * F16_EPS
    );
}

#[test]
fn cnn_with_fp16_convolutions_and_fp32_batch_norm() {
    let dev = Cpu::seed_from_u64(2);
    // dfdx builds tuples of up to six layers: nest them.
    type Reference = (
        (Conv2D<1, 4, 3, 1, 1>, ReLU, ToF32, BatchNorm2D<4>),
        (ToF32, MaxPool2D<2>, Flatten<{ 4 * 4 * 4 }>, Linear<64, 3>),
    );
    let mut master = dev.build_module::<Reference, f32>();
    master.visit_params_mut(&mut RoundToF16).unwrap();
    let working = (
        (
            dev.build_module::<Conv2D<1, 4, 3, 1, 1>, f16>(),
            ReLU,
            ToF32,
            dev.build_module::<BatchNorm2D<4>, f32>(),
        ),
        (
            ToF16,
            MaxPool2D::<2>,
            Flatten::<64>,
            dev.build_module::<Linear<64, 3>, f16>(),
        ),
    );
    let mut mixed = MasterWeights::from_parts(master.clone(), working, &dev).unwrap();
    let mut reference = Fp32Weights::new(master, &dev);
    let summary = mixed.working().param_summary();
    assert_eq!(summary[0].dtype, DType::F16, "conv weight");
    assert_eq!(summary[2].dtype, DType::F32, "batch norm scale");

    let x = fp16_values::<Rank4<6, 1, 8, 8>>(&dev);
    let target = one_hot::<6, 3>(&dev);

    let scaler = GradScaler::disabled();
    let grads = reference.alloc_grads().unwrap();
    let logits = reference
        .working_mut()
        .forward_mut(x.clone().traced_mixed(grads));
    let loss = cross_entropy_with_logits_loss(logits, target.clone());
    let grads = scaler.scale(loss).backward().unwrap();
    let want = master_grads(scaler.unscale(&mut reference, grads).unwrap());

    let scaler = GradScaler::with_static_scale(SCALE).unwrap();
    let grads = mixed.alloc_grads().unwrap();
    let logits = mixed
        .working_mut()
        .forward_mut(x.to_dtype::<f16>().traced_mixed(grads))
        .to_f32();
    let loss = cross_entropy_with_logits_loss(logits, target);
    let grads = scaler.scale(loss).backward().unwrap();
    let got = master_grads(scaler.unscale(&mut mixed, grads).unwrap());

    // Roundings on the conv weight's path: forward, the conv's output, the cast back to FP16
    // after batch norm and the linear layer's output; backward, the loss gradient cast into
    // FP16, the linear layer's input gradient, batch norm's input gradient cast into FP16 and
    // the conv's weight gradient. ReLU and non-overlapping max pooling are exact and batch norm
    // runs in FP32, so R = 7, as for three FP16 layers.
    let worst = assert_close(&got, &want, 7.0);
    eprintln!(
        "CNN: worst |g16 - g32| / max|g32| = {worst:.2e} (bound {:.2e})",
        7.0 * F16_EPS
    );

    // Batch norm trained in FP32 in both models. Its input differs only by the one rounding of
    // the conv's output (relative u = ε/2 per element); after ReLU every element is
    // non-negative, so the batch mean's relative error is at most u too: ε leaves a factor 2.
    let (master, working) = mixed.into_parts();
    let _ = master;
    let running = working.0 .3.running_mean.array();
    let expected = reference.working().0 .3.running_mean.array();
    for (a, b) in running.iter().zip(expected) {
        assert_abs_diff_eq!(*a, b, epsilon = F16_EPS * b.abs().max(1e-3));
    }
}

#[test]
fn layer_norm_and_softmax_in_fp32_between_fp16_layers() {
    let dev = Cpu::seed_from_u64(3);
    type Reference = (
        (Linear<10, 24>, ToF32, LayerNorm1D<24>),
        (ToF32, Linear<24, 6>, ToF32, Softmax),
    );
    let mut master = dev.build_module::<Reference, f32>();
    master.visit_params_mut(&mut RoundToF16).unwrap();
    let working = (
        (
            dev.build_module::<Linear<10, 24>, f16>(),
            ToF32,
            dev.build_module::<LayerNorm1D<24>, f32>(),
        ),
        (
            ToF16,
            dev.build_module::<Linear<24, 6>, f16>(),
            ToF32,
            Softmax,
        ),
    );
    let mut mixed = MasterWeights::from_parts(master.clone(), working, &dev).unwrap();
    let mut reference = Fp32Weights::new(master, &dev);

    let x = fp16_values::<Rank2<8, 10>>(&dev);
    let target = one_hot::<8, 6>(&dev);

    let scaler = GradScaler::disabled();
    let probs = reference
        .working()
        .forward(x.clone().traced_mixed(reference.alloc_grads().unwrap()));
    let grads = scaler
        .scale(mse_loss(probs, target.clone()))
        .backward()
        .unwrap();
    let want = master_grads(scaler.unscale(&mut reference, grads).unwrap());

    let scaler = GradScaler::with_static_scale(SCALE).unwrap();
    let probs = mixed.working().forward(
        x.to_dtype::<f16>()
            .traced_mixed(mixed.alloc_grads().unwrap()),
    );
    let grads = scaler.scale(mse_loss(probs, target)).backward().unwrap();
    let got = master_grads(scaler.unscale(&mut mixed, grads).unwrap());

    // Roundings on the first layer's path: forward, its output, the cast back to FP16 after
    // layer norm and the second layer's output; backward, softmax's input gradient cast into
    // FP16, the second layer's input gradient, layer norm's input gradient cast into FP16 and
    // the first layer's weight gradient. Layer norm and softmax run in FP32: R = 7.
    let worst = assert_close(&got, &want, 7.0);
    eprintln!(
        "LayerNorm/softmax: worst |g16 - g32| / max|g32| = {worst:.2e} (bound {:.2e})",
        7.0 * F16_EPS
    );
}
