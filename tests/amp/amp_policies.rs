//! An MLP and a small CNN with batch norm, declared with `#[amp]`, train under O0, O1, O2 and
//! opted-in O3, in FP16 and in BF16; O1 and O2 end within 2% of O0's held-out loss for the same
//! seed and data in either precision, and so does O3 in BF16. BF16 models train without a loss scaler, and a BF16 step with a NaN
//! gradient is skipped without touching master weights or optimizer state.

use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::StandardNormal;
use typed_amp::amp::{AmpModel, OptLevel};
use typed_amp::dfdx::losses;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, Linear};
use typed_amp::dfdx::optim::{Adam, Sgd};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;
use typed_amp::{
    optim::LowPrecisionUpdates, optim::MasterOptimizer, precision::DType, precision::FullRange,
};
use typed_amp::{params::Parameters, tape::MixedTape};

use crate::common;
use common::{inject, optimizer_bytes, param_bytes};

const CLASSES: usize = 4;
const BATCH: usize = 32;
const STEPS: usize = 200;
const FEATURES: usize = 32;
const SIDE: usize = 12;

macro_rules! mlp {
    ($name:ident, $($policy:tt)*) => {
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            fc1: Linear<FEATURES, 64>,
            act1: ReLU,
            fc2: Linear<64, 64>,
            act2: ReLU,
            fc3: Linear<64, CLASSES>,
        }
    };
}

mlp!(MlpO0, policy = "O0");
mlp!(MlpO1, policy = "O1");
mlp!(MlpO2, policy = "O2");
mlp!(MlpO3, policy = "O3", allow_fp16_updates);
mlp!(MlpO1Bf16, policy = "O1", dtype = "bf16");
mlp!(MlpO2Bf16, policy = "O2", dtype = "bf16");
mlp!(MlpO3Bf16, policy = "O3", dtype = "bf16", allow_bf16_updates);

macro_rules! cnn {
    ($name:ident, $($policy:tt)*) => {
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            conv1: Conv2D<1, 8, 3, 1, 1>,
            bn1: BatchNorm2D<8>,
            act1: ReLU,
            pool1: MaxPool2D<2>,
            conv2: Conv2D<8, 16, 3, 1, 1>,
            bn2: BatchNorm2D<16>,
            act2: ReLU,
            pool2: MaxPool2D<2>,
            flat: Flatten<{ 16 * 3 * 3 }>,
            fc: Linear<{ 16 * 3 * 3 }, CLASSES>,
        }
    };
}

cnn!(CnnO0, policy = "O0");
cnn!(CnnO1, policy = "O1");
cnn!(CnnO2, policy = "O2");
cnn!(CnnO3, policy = "O3", allow_fp16_updates);
cnn!(CnnO1Bf16, policy = "O1", dtype = "bf16");
cnn!(CnnO2Bf16, policy = "O2", dtype = "bf16");
cnn!(CnnO3Bf16, policy = "O3", dtype = "bf16", allow_bf16_updates);

/// A batch of examples of one input shape with one-hot labels.
type Batch<S> = (Tensor<S, f32, Cpu>, Tensor<Rank2<BATCH, CLASSES>, f32, Cpu>);

/// Batches of examples.
struct Data<S: ConstShape> {
    batches: Vec<Batch<S>>,
}

impl<S: ConstShape> Data<S> {
    /// The first `n` batches to train on and the rest, which training never sees, to evaluate.
    fn split(mut self, n: usize) -> (Self, Self) {
        let held_out = self.batches.split_off(n);
        (self, Data { batches: held_out })
    }
}

/// Training batches (200 steps are 4 passes over them) and held-out batches, drawn after them
/// from the same generator.
const TRAIN_BATCHES: usize = 50;
const HELD_OUT_BATCHES: usize = 32;

fn one_hot(labels: &[usize]) -> Vec<f32> {
    let mut y = vec![0.0; labels.len() * CLASSES];
    for (i, &c) in labels.iter().enumerate() {
        y[i * CLASSES + c] = 1.0;
    }
    y
}

/// Four overlapping Gaussian clusters in 32 dimensions.
fn clusters(dev: &Cpu, batches: usize) -> Data<Rank2<BATCH, FEATURES>> {
    let mut rng = StdRng::seed_from_u64(7);
    let centres: Vec<Vec<f32>> = (0..CLASSES)
        .map(|_| {
            (0..FEATURES)
                .map(|_| 0.3 * rng.sample::<f32, _>(StandardNormal))
                .collect()
        })
        .collect();
    let batches = (0..batches)
        .map(|_| {
            let labels: Vec<usize> = (0..BATCH).map(|_| rng.gen_range(0..CLASSES)).collect();
            let x: Vec<f32> = labels
                .iter()
                .flat_map(|&c| {
                    centres[c]
                        .iter()
                        .map(|m| m + rng.sample::<f32, _>(StandardNormal))
                        .collect::<Vec<_>>()
                })
                .collect();
            (
                dev.tensor_from_vec(x, (Const, Const)),
                dev.tensor_from_vec(one_hot(&labels), (Const, Const)),
            )
        })
        .collect();
    Data { batches }
}

/// 12×12 images of a bar (top, bottom, left or right, by class) in noise.
fn bars(dev: &Cpu, batches: usize) -> Data<Rank4<BATCH, 1, SIDE, SIDE>> {
    let mut rng = StdRng::seed_from_u64(8);
    let batches = (0..batches)
        .map(|_| {
            let labels: Vec<usize> = (0..BATCH).map(|_| rng.gen_range(0..CLASSES)).collect();
            let mut x = Vec::with_capacity(BATCH * SIDE * SIDE);
            for &c in &labels {
                for r in 0..SIDE {
                    for col in 0..SIDE {
                        let on = match c {
                            0 => r < 3,
                            1 => r >= SIDE - 3,
                            2 => col < 3,
                            _ => col >= SIDE - 3,
                        };
                        let signal = if on { 0.5 } else { 0.0 };
                        x.push(signal + rng.sample::<f32, _>(StandardNormal));
                    }
                }
            }
            (
                dev.tensor_from_vec(x, (Const, Const, Const, Const)),
                dev.tensor_from_vec(one_hot(&labels), (Const, Const)),
            )
        })
        .collect();
    Data { batches }
}

type Logits<T = NoneTape> = Tensor<Rank2<BATCH, CLASSES>, f32, Cpu, T>;
type WorkingOf<M> = typed_amp::amp::WorkingOf<M, Cpu>;
type MasterOf<M> = typed_amp::amp::MasterOf<M, Cpu>;

/// Trains `STEPS` steps and returns the loss on held-out batches.
fn train<M, S, O>(
    data: &Data<S>,
    held_out: &Data<S>,
    optimizer: impl FnOnce(&MasterOf<M>) -> O,
) -> f32
where
    M: AmpModel<Cpu>,
    S: ConstShape,
    WorkingOf<M>: ModuleMut<Tensor<S, f32, Cpu, MixedTape<Cpu>>, Output = Logits<MixedTape<Cpu>>>
        + Module<Tensor<S, f32, Cpu>, Output = Logits>,
    O: MasterOptimizer<MasterOf<M>, Cpu>,
{
    let dev = Cpu::seed_from_u64(42);
    let mut model = M::try_build(&dev).unwrap();
    let mut opt = optimizer(model.master());
    let mut scaler = M::scaler();
    let mut grads = model.alloc_grads().unwrap();
    for step in 0..STEPS {
        let (x, y) = &data.batches[step % data.batches.len()];
        let logits = model
            .working_mut()
            .try_forward_mut(x.clone().traced_mixed(grads))
            .unwrap();
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let scaled = scaler.scale(loss).backward().unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
    held_out_loss::<M, S>(&model, held_out)
}

/// Trains as [`train`] does, without a loss scaler: `loss.backward()?.check(..)?.step(..)?`,
/// which only models whose working precision has FP32's exponent range (BF16) may take.
fn train_scale_free<M, S, O>(
    data: &Data<S>,
    held_out: &Data<S>,
    optimizer: impl FnOnce(&MasterOf<M>) -> O,
) -> f32
where
    M: AmpModel<Cpu>,
    <M::Weights as TrainTarget<Cpu>>::Precision: FullRange,
    S: ConstShape,
    WorkingOf<M>: ModuleMut<Tensor<S, f32, Cpu, MixedTape<Cpu>>, Output = Logits<MixedTape<Cpu>>>
        + Module<Tensor<S, f32, Cpu>, Output = Logits>,
    O: MasterOptimizer<MasterOf<M>, Cpu>,
{
    assert!(
        !M::scaler().is_enabled(),
        "{} needs no loss scale",
        M::CONFIG
    );
    let dev = Cpu::seed_from_u64(42);
    let mut model = M::try_build(&dev).unwrap();
    let mut opt = optimizer(model.master());
    let mut grads = model.alloc_grads().unwrap();
    for step in 0..STEPS {
        let (x, y) = &data.batches[step % data.batches.len()];
        let logits = model
            .working_mut()
            .try_forward_mut(x.clone().traced_mixed(grads))
            .unwrap();
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let checked = loss.backward().unwrap().check(&mut model).unwrap();
        let outcome = checked.step(&mut opt).unwrap();
        assert!(!outcome.skipped(), "{}: step {step} skipped", M::CONFIG);
        grads = outcome.into_grads();
    }
    held_out_loss::<M, S>(&model, held_out)
}

/// The mean cross-entropy of `model` on `held_out`.
fn held_out_loss<M, S>(model: &M::Weights, held_out: &Data<S>) -> f32
where
    M: AmpModel<Cpu>,
    S: ConstShape,
    WorkingOf<M>: Module<Tensor<S, f32, Cpu>, Output = Logits>,
{
    let total: f32 = held_out
        .batches
        .iter()
        .map(|(x, y)| {
            let logits = model.working().try_forward(x.clone()).unwrap();
            losses::cross_entropy_with_logits_loss(logits, y.clone()).array()
        })
        .sum();
    total / held_out.batches.len() as f32
}

/// SGD with momentum 0.9 at learning rate `lr`.
fn sgd(lr: f64) -> SgdConfig {
    SgdConfig {
        lr,
        momentum: Some(Momentum::Classic(0.9)),
        weight_decay: None,
    }
}

/// The MLP's learning rate.
const MLP_LR: f64 = 0.02;

/// The CNN's learning rate. At 0.02, the MLP's, the CNN's loss after 200 steps is not
/// reproducible to 2% under perturbations the size of one rounding: over model seeds 42 to 45,
/// O2-FP16
/// ended -0.60% to +3.56% from O0 and O2-BF16 +0.95% to +3.23% (on these 32 held-out batches),
/// so whether a run met the bound was down to the seed. At 0.005 the same runs end within 0.70%
/// of O0 in both precisions, and the bound tests the precision, not the seed.
const CNN_LR: f64 = 0.005;

/// Adam for the scale-free step's own test.
fn adam() -> AdamConfig {
    AdamConfig {
        lr: 1e-3,
        ..Default::default()
    }
}

/// The acceptance threshold, not a derived bound: training runs drift apart once their
/// first roundings differ, so no per-op error analysis covers 200 steps. The same 2% holds in
/// BF16, whose roundings are 8 times coarser than FP16's. Observed on the 32 held-out batches:
/// MLP 0.11% (FP16 O1, O2), 0.14% (BF16 O1, O2), 0.11% (O3-BF16); CNN 0.55% (FP16 O1, O2),
/// 0.70% (BF16 O1, O2), 0.86% (O3-BF16).
fn assert_within_2_percent(policy: &str, loss: f32, o0: f32) {
    let relative = (loss - o0).abs() / o0;
    eprintln!(
        "{policy}: held-out loss {loss:.4} vs O0 {o0:.4} ({:.2}%)",
        relative * 100.0
    );
    assert!(
        relative <= 0.02,
        "{policy}'s loss {loss} is not within 2% of O0's {o0}"
    );
}

#[test]
fn mlp_trains_under_every_policy() {
    let dev = Cpu::default();
    let (data, held_out) = clusters(&dev, TRAIN_BATCHES + HELD_OUT_BATCHES).split(TRAIN_BATCHES);
    let initial = 4f32.ln();
    let o0 = train::<MlpO0, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(MLP_LR)));
    let o1 = train::<MlpO1, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(MLP_LR)));
    let o2 = train::<MlpO2, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(MLP_LR)));
    let o3 = train::<MlpO3, _, _>(&data, &held_out, |m| {
        LowPrecisionUpdates(Sgd::new(m, sgd(MLP_LR)))
    });
    eprintln!(
        "MLP O0: held-out loss {o0:.4}; O3 (SGD on FP16 weights): {o3:.4} ({:+.2}%)",
        100.0 * (o3 - o0) / o0
    );
    assert!(o0 < 0.6 * initial, "O0 learned: {o0} (chance: {initial})");
    assert!(o3 < 0.8 * initial, "O3 learned: {o3}");
    assert_within_2_percent("MLP O1", o1, o0);
    assert_within_2_percent("MLP O2", o2, o0);

    // BF16: the same seed and data, stepped without a loss scaler.
    let o1 = train_scale_free::<MlpO1Bf16, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(MLP_LR)));
    let o2 = train_scale_free::<MlpO2Bf16, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(MLP_LR)));
    // O3-BF16: SGD updates the BF16 weights themselves (its kernel computes in FP32 and rounds
    // the weight and the velocity once per step).
    let o3 = train_scale_free::<MlpO3Bf16, _, _>(&data, &held_out, |m| {
        LowPrecisionUpdates(Sgd::<_, bf16, _>::new(m, sgd(MLP_LR)))
    });
    assert_within_2_percent("MLP O1-BF16", o1, o0);
    assert_within_2_percent("MLP O2-BF16", o2, o0);
    assert_within_2_percent("MLP O3-BF16", o3, o0);
}

#[test]
fn cnn_with_batch_norm_trains_under_every_policy() {
    let dev = Cpu::default();
    let (data, held_out) = bars(&dev, TRAIN_BATCHES + HELD_OUT_BATCHES).split(TRAIN_BATCHES);
    let initial = 4f32.ln();
    let o0 = train::<CnnO0, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(CNN_LR)));
    let o1 = train::<CnnO1, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(CNN_LR)));
    let o2 = train::<CnnO2, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(CNN_LR)));
    let o3 = train::<CnnO3, _, _>(&data, &held_out, |m| {
        LowPrecisionUpdates(Sgd::new(m, sgd(CNN_LR)))
    });
    eprintln!(
        "CNN O0: held-out loss {o0:.4}; O3 (SGD on FP16 weights): {o3:.4} ({:+.2}%)",
        100.0 * (o3 - o0) / o0
    );
    assert!(o0 < 0.6 * initial, "O0 learned: {o0} (chance: {initial})");
    assert!(o3 < 0.8 * initial, "O3 learned: {o3}");
    assert_within_2_percent("CNN O1", o1, o0);
    assert_within_2_percent("CNN O2", o2, o0);

    // BF16: the same seed and data, stepped without a loss scaler.
    let o1 = train_scale_free::<CnnO1Bf16, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(CNN_LR)));
    let o2 = train_scale_free::<CnnO2Bf16, _, _>(&data, &held_out, |m| Sgd::new(m, sgd(CNN_LR)));
    // O3-BF16: SGD updates the BF16 weights themselves (its kernel computes in FP32 and rounds
    // the weight and the velocity once per step).
    let o3 = train_scale_free::<CnnO3Bf16, _, _>(&data, &held_out, |m| {
        LowPrecisionUpdates(Sgd::<_, bf16, _>::new(m, sgd(CNN_LR)))
    });
    assert_within_2_percent("CNN O1-BF16", o1, o0);
    assert_within_2_percent("CNN O2-BF16", o2, o0);
    assert_within_2_percent("CNN O3-BF16", o3, o0);
}

#[test]
fn o2_stores_batch_norm_in_fp32_and_conv_and_linear_in_fp16() {
    use typed_amp::dfdx::nn::modules as dfdx_modules;
    use typed_amp::nn::modules as amp_modules;
    let dev = Cpu::default();
    let model: typed_amp::master::MasterWeights<CnnO2Master<Cpu>, CnnO2Working<Cpu>, Cpu> =
        CnnO2::build(&dev).unwrap();

    // The field types, named: this only compiles if O2 gave each layer these precisions.
    let working = model.working();
    let _: &amp_modules::Conv2D<1, 8, 3, 1, 1, f16, Cpu> = &working.conv1;
    let _: &dfdx_modules::BatchNorm2D<8, f32, Cpu> = &working.bn1;
    let _: &amp_modules::Conv2D<8, 16, 3, 1, 1, f16, Cpu> = &working.conv2;
    let _: &dfdx_modules::BatchNorm2D<16, f32, Cpu> = &working.bn2;
    let _: &dfdx_modules::Linear<144, CLASSES, f16, Cpu> = &working.fc;
    let master = model.master();
    let _: &amp_modules::Conv2D<1, 8, 3, 1, 1, f32, Cpu> = &master.conv1;
    let _: &dfdx_modules::Linear<144, CLASSES, f32, Cpu> = &master.fc;

    // And the same at run time, by parameter path.
    for p in working.param_summary() {
        let expected = if p.path.starts_with("bn") {
            DType::F32
        } else {
            DType::F16
        };
        assert_eq!(p.dtype, expected, "{}", p.path);
    }
    assert_eq!(
        CnnO2::AMP_CONFIG,
        typed_amp::amp::AmpConfig {
            opt_level: OptLevel::O2,
            dtype: Some(DType::F16),
            master_weights: true,
            keep_batchnorm_fp32: true,
            loss_scale: typed_amp::amp::LossScale::Dynamic,
            cast_model_outputs: Some(DType::F32),
            low_precision_updates: false,
            fp8: None,
        }
    );
    assert_eq!(CnnO0::scaler().get_scale(), 1.0, "O0 does not scale");
    assert_eq!(CnnO2::scaler().get_scale(), 65536.0);
}

#[test]
fn inference_casts_inputs_at_the_entry() {
    let dev = Cpu::default();
    let model = MlpO2::build(&dev).unwrap();
    let x32: Tensor<Rank2<2, FEATURES>, f32, Cpu> = dev.sample_normal();
    let x16 = x32.clone().to_dtype::<f16>();
    // FP32 or FP16 input, with or without a tape: the model casts at its entry.
    let a: Tensor<Rank2<2, CLASSES>, f32, Cpu> = model.working().forward(x32);
    let b: Tensor<Rank2<2, CLASSES>, f32, Cpu> = model.working().forward(x16.clone());
    assert_eq!(a.array(), b.array());
    let grads = model.alloc_grads().unwrap();
    let c = model.working().forward(x16.traced_mixed(grads));
    assert_eq!(c.array(), a.array());
}

#[test]
fn bf16_policies_store_their_layers_in_bf16_and_need_no_loss_scale() {
    use typed_amp::dfdx::nn::modules as dfdx_modules;
    use typed_amp::nn::modules as amp_modules;
    let dev = Cpu::default();
    let model: typed_amp::master::MasterWeights<
        CnnO2Bf16Master<Cpu>,
        CnnO2Bf16Working<Cpu>,
        Cpu,
        typed_amp::precision::BF16,
    > = CnnO2Bf16::build(&dev).unwrap();
    let working = model.working();
    let _: &amp_modules::Conv2D<1, 8, 3, 1, 1, bf16, Cpu> = &working.conv1;
    let _: &dfdx_modules::BatchNorm2D<8, f32, Cpu> = &working.bn1;
    let _: &dfdx_modules::Linear<144, CLASSES, bf16, Cpu> = &working.fc;
    for p in working.param_summary() {
        let expected = if p.path.starts_with("bn") {
            DType::F32
        } else {
            DType::BF16
        };
        assert_eq!(p.dtype, expected, "{}", p.path);
    }
    // O3 in BF16: every layer BF16, batch norm included, and no master copy.
    let o3: typed_amp::master::Bf16Weights<CnnO3Bf16Working<Cpu>, Cpu> =
        CnnO3Bf16::build(&dev).unwrap();
    assert!(o3
        .master()
        .param_summary()
        .iter()
        .all(|p| p.dtype == DType::BF16));
    for config in [
        CnnO1Bf16::AMP_CONFIG,
        CnnO2Bf16::AMP_CONFIG,
        CnnO3Bf16::AMP_CONFIG,
    ] {
        assert_eq!(config.dtype, Some(DType::BF16), "{config}");
        assert_eq!(
            config.loss_scale,
            typed_amp::amp::LossScale::None,
            "{config}"
        );
    }
    assert_eq!(CnnO3Bf16::AMP_CONFIG.opt_level, OptLevel::O3);
    const { assert!(CnnO3Bf16::AMP_CONFIG.low_precision_updates) };
    for scaler in [
        CnnO1Bf16::scaler(),
        CnnO2Bf16::scaler(),
        CnnO3Bf16::scaler(),
    ] {
        assert!(!scaler.is_enabled());
    }
}

#[test]
fn bf16_o2_trains_without_a_scaler_and_skips_a_step_with_a_nan_gradient() {
    let dev = Cpu::default();
    let data = clusters(&dev, 10);
    let mut model = MlpO2Bf16::build(&Cpu::seed_from_u64(5)).unwrap();
    let mut opt = Adam::new(model.master(), adam());
    let mut grads = model.alloc_grads().unwrap();
    let mut losses = Vec::new();

    // Train without any `GradScaler`.
    for step in 0..60 {
        let (x, y) = &data.batches[step % data.batches.len()];
        let logits = model.working().forward(x.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        losses.push(loss.value());
        let outcome = loss
            .backward()
            .unwrap()
            .check(&mut model)
            .unwrap()
            .step(&mut opt)
            .unwrap();
        assert!(!outcome.skipped(), "step {step}");
        grads = outcome.into_grads();
    }
    let first: f32 = losses[..10].iter().sum::<f32>() / 10.0;
    let last: f32 = losses[50..].iter().sum::<f32>() / 10.0;
    eprintln!("O2-BF16 without a scaler: mean loss {first:.4} over the first 10 steps, {last:.4} over the last 10");
    assert!(last < 0.8 * first, "it learned: {first} -> {last}");
    assert_eq!(opt.step_count(), 60);

    // A NaN in one BF16 gradient: the step is skipped, and nothing changes.
    let master_before = param_bytes(model.master());
    let working_before = param_bytes(model.working());
    let state_before = optimizer_bytes(&opt, model.master());
    assert!(state_before.0.iter().all(|(_, bytes)| bytes.is_some()));
    let (x, y) = &data.batches[0];
    let logits = model.working().forward(x.clone().traced_mixed(grads));
    let mut raw = cross_entropy_with_logits_loss(logits, y.clone())
        .backward()
        .unwrap();
    inject(raw.grads_mut(), &model.working().fc2.weight, f32::NAN);
    let checked = raw.check(&mut model).unwrap();
    assert!(checked.found_inf());
    assert_eq!(checked.non_finite_params(), ["fc2.weight".to_string()]);
    let outcome = checked.step(&mut opt).unwrap();
    assert!(outcome.skipped());
    assert_eq!(outcome.non_finite_params(), ["fc2.weight".to_string()]);
    assert_eq!(
        param_bytes(model.master()),
        master_before,
        "master weights changed on a skipped step"
    );
    assert_eq!(
        param_bytes(model.working()),
        working_before,
        "the BF16 working copy changed on a skipped step"
    );
    assert_eq!(
        optimizer_bytes(&opt, model.master()),
        state_before,
        "Adam's moments or step count changed on a skipped step"
    );

    // The gradients it hands back are clean: the next step goes through.
    let grads = outcome.into_grads();
    let logits = model.working().forward(x.clone().traced_mixed(grads));
    let outcome = cross_entropy_with_logits_loss(logits, y.clone())
        .backward()
        .unwrap()
        .check(&mut model)
        .unwrap()
        .step(&mut opt)
        .unwrap();
    assert!(!outcome.skipped());
    assert_eq!(opt.step_count(), 61);
    assert_ne!(param_bytes(model.master()), master_before);
}

/// Issue 34, item 4: O3-FP16 with Adam never trained: its update ran in FP16 arithmetic, where
/// Adam's eps of 1e-8 is 0 (NaN weights from the first update). Adam's kernel now computes in
/// FP32 registers over FP16 weights and state, and an eps that rounds to 0 in FP16 is refused
/// with a typed error before anything changes.
#[test]
fn o3_fp16_adam_trains_and_an_eps_that_rounds_to_zero_in_fp16_is_refused() {
    let dev = Cpu::default();
    let (data, held_out) = clusters(&dev, TRAIN_BATCHES + HELD_OUT_BATCHES).split(TRAIN_BATCHES);
    let initial = 4f32.ln();
    let o3 = train::<MlpO3, _, _>(&data, &held_out, |m| {
        LowPrecisionUpdates(Adam::new(
            m,
            AdamConfig {
                eps: 1e-4,
                ..adam()
            },
        ))
    });
    eprintln!("MLP O3-FP16 with Adam: held-out loss {o3:.4} (chance {initial:.4})");
    assert!(
        o3.is_finite() && o3 < 0.8 * initial,
        "O3-FP16 Adam learned: {o3}"
    );

    // Adam's default eps, 1e-8, is 0 in FP16: refused at the step, nothing changed.
    let mut model = MlpO3::try_build(&Cpu::seed_from_u64(42)).unwrap();
    let mut opt = LowPrecisionUpdates(Adam::new(model.master(), adam()));
    let scaler = MlpO3::scaler();
    let (x, y) = &data.batches[0];
    let grads = model.alloc_grads().unwrap();
    let logits = model
        .working_mut()
        .try_forward_mut(x.clone().traced_mixed(grads))
        .unwrap();
    let loss = cross_entropy_with_logits_loss(logits, y.clone());
    let scaled = scaler.scale(loss).backward().unwrap();
    let before = param_bytes(model.master());
    let unscaled = scaler.unscale(&mut model, scaled).unwrap();
    let err = scaler.step(&mut opt, unscaled).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, AmpError::EpsilonUnderflows { .. }),
        "{message}"
    );
    assert!(
        message.contains("eps of 0.00000001 rounds to 0 in") && message.contains("1e-4"),
        "{message}"
    );
    assert_eq!(param_bytes(model.master()), before, "the weights changed");
}
