//! Identity mismatches the types do not see, each a typed error raised before any weight,
//! optimizer state or scale changes: a forward pass through one model traced with another
//! model's gradients (the owner would step on zeros, the other never train), gradients kept
//! from an earlier iteration (a clone of last step's scaled gradients), and a checkpoint saved
//! or loaded with another model's policy value.
//!
//! Why run-time errors and not type brands: a brand per model (a generative lifetime, or a
//! type parameter per model) would have to appear in the README's loop: `x.traced_mixed(grads)`
//! would need the model's brand to reach the tape through dfdx's modules (whose forward is
//! generic over the tape, not over a model), and a generative lifetime needs the whole loop
//! inside a closure (`typed_amp::scope(|brand| ..)`), which the short loop does not have.

use std::collections::BTreeMap;

use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::dfdx::nn::builders::{BatchNorm1D, Linear};
use typed_amp::loss::Loss;
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;

use crate::common;
use common::{optimizer_bytes, param_bytes, TempDir};

type Mlp = (Linear<6, 8>, ReLU, Linear<8, 3>);
type Master = <Mlp as BuildOnDevice<Cpu, f32>>::Built;
type Model = MasterWeights<Master, <Mlp as BuildOnDevice<Cpu, f16>>::Built, Cpu>;
type Opt = typed_amp::dfdx::optim::Adam<Master, f32, Cpu>;

fn setup(seed: u64) -> (Model, Opt) {
    let dev = Cpu::seed_from_u64(seed);
    let model = MasterWeights::build::<Mlp>(&dev).unwrap();
    let opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    (model, opt)
}

/// A loss of `model`'s forward pass traced into `grads`.
fn loss(dev: &Cpu, model: &Model, grads: MixedGradients<Cpu>) -> Loss<Cpu> {
    let x: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
    let out = model
        .working()
        .forward(x.to_dtype::<f16>().traced_mixed(grads));
    mse_loss(out.to_f32(), dev.ones())
}

/// Everything a step may change: master and working weights, optimizer state, scaler state.
type Snapshot = (
    Vec<(String, typed_amp::precision::DType, Vec<u8>)>,
    Vec<(String, typed_amp::precision::DType, Vec<u8>)>,
    common::OptimizerBytes,
    typed_amp::scaler::ScalerState,
);

fn snapshot(model: &Model, opt: &Opt, scaler: &GradScaler) -> Snapshot {
    (
        param_bytes(model.master()),
        param_bytes(model.working()),
        optimizer_bytes(opt, model.master()),
        scaler.state(),
    )
}

#[test]
fn a_forward_through_another_model_with_these_gradients_is_refused_at_backward() {
    let dev = Cpu::seed_from_u64(1);
    let (mut a, mut opt_a) = setup(2);
    let (mut b, mut opt_b) = setup(3);
    // A scale at which these FP16 gradients do not overflow, so that every step is taken.
    let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 2000).unwrap();
    // One real step first, so that optimizer state and the scale's tracker are not trivial.
    let grads = a.alloc_grads().unwrap();
    let scaled = scaler.scale(loss(&dev, &a, grads)).backward().unwrap();
    let unscaled = scaler.unscale(&mut a, scaled).unwrap();
    let outcome = scaler.step(&mut opt_a, unscaled).unwrap();
    let a_grads = scaler.update(outcome).unwrap();
    let before = (snapshot(&a, &opt_a, &scaler), snapshot(&b, &opt_b, &scaler));

    // Model B's forward traced with model A's gradients: A would step on zeros.
    let err = scaler
        .scale(loss(&dev, &b, a_grads.clone()))
        .backward()
        .unwrap_err();
    assert!(matches!(err, AmpError::ForeignForward), "{err:?}");
    assert!(
        err.to_string().contains("ran through another model"),
        "{err}"
    );
    // The scaler-free backward and an accumulation window find it too.
    let err = loss(&dev, &b, a_grads.clone()).backward().unwrap_err();
    assert!(matches!(err, AmpError::ForeignForward), "{err:?}");
    let mut window = scaler.accumulate(a_grads.clone());
    let x: Tensor<Rank2<4, 6>, f16, Cpu> = dev.sample_normal();
    let out = b.working().forward(window.trace(x).unwrap());
    let err = window
        .backward(mse_loss(out.to_f32(), dev.ones()))
        .unwrap_err();
    assert!(matches!(err, AmpError::ForeignForward), "{err:?}");
    assert_eq!(
        (snapshot(&a, &opt_a, &scaler), snapshot(&b, &opt_b, &scaler)),
        before,
        "nothing changes"
    );

    // Each model traced with its own gradients trains.
    let scaled = scaler.scale(loss(&dev, &a, a_grads)).backward().unwrap();
    let unscaled = scaler.unscale(&mut a, scaled).unwrap();
    let outcome_a = scaler.step(&mut opt_a, unscaled).unwrap();
    let scaled = scaler
        .scale(loss(&dev, &b, b.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    let unscaled = scaler.unscale(&mut b, scaled).unwrap();
    let outcome_b = scaler.step(&mut opt_b, unscaled).unwrap();
    scaler.update((outcome_a, outcome_b)).unwrap();
    assert_ne!(param_bytes(a.master()), before.0 .0);
    assert_ne!(param_bytes(b.master()), before.1 .0);
}

#[test]
fn a_copy_of_last_steps_scaled_gradients_is_refused_in_a_later_step() {
    let dev = Cpu::seed_from_u64(4);
    let (mut model, mut opt) = setup(5);
    let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 2000).unwrap();
    let grads = model.alloc_grads().unwrap();
    let scaled = scaler.scale(loss(&dev, &model, grads)).backward().unwrap();
    let stale = scaled.grads().clone();
    let unscaled = scaler.unscale(&mut model, scaled).unwrap();
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    let fresh = scaler.update(outcome).unwrap();
    let before = snapshot(&model, &opt, &scaler);

    // Traced again: the backward would add last step's gradients into this one's.
    let err = scaler
        .scale(loss(&dev, &model, stale.clone()))
        .backward()
        .unwrap_err();
    assert!(
        matches!(
            err,
            AmpError::StaleGradients {
                scaled_after: 0,
                updates: 1
            }
        ),
        "{err:?}"
    );
    // In an accumulation window.
    let mut window = scaler.accumulate(stale.clone());
    let x: Tensor<Rank2<4, 6>, f16, Cpu> = dev.sample_normal();
    let out = model.working().forward(window.trace(x).unwrap());
    let err = window
        .backward(mse_loss(out.to_f32(), dev.ones()))
        .unwrap_err();
    assert!(matches!(err, AmpError::StaleGradients { .. }), "{err:?}");
    // Swapped into this iteration's scaled gradients: refused at unscale.
    let mut scaled = scaler
        .scale(loss(&dev, &model, fresh.clone()))
        .backward()
        .unwrap();
    *scaled.grads_mut() = stale;
    let err = scaler.unscale(&mut model, scaled).unwrap_err();
    assert!(matches!(err, AmpError::StaleGradients { .. }), "{err:?}");
    assert_eq!(snapshot(&model, &opt, &scaler), before, "nothing changes");

    // The gradients the update returned train, iteration after iteration.
    let mut grads = fresh;
    for _ in 0..3 {
        let scaled = scaler.scale(loss(&dev, &model, grads)).backward().unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
    assert_ne!(param_bytes(model.master()), before.0);
}

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
pub struct Net {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

/// `Net` but for its output cast: a policy setting that changes nothing stored.
#[typed_amp::amp(policy = "O2")]
pub struct NetFp16Outputs {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

#[test]
fn a_checkpoint_with_another_models_policy_value_is_refused_before_anything_is_written() {
    let dir = TempDir::new("identity-policy");
    let path = dir.join("net.st");
    let mut net = Net::build(&Cpu::seed_from_u64(6)).unwrap();
    let net_opt = typed_amp::optim::adam(net.master(), AdamConfig::default());
    let net_scaler = Net::scaler();
    let extra = BTreeMap::new();
    checkpoint::save_with_policy(
        &path,
        &mut net,
        &net_opt,
        &net_scaler,
        &Net::AMP_CONFIG,
        &extra,
    )
    .unwrap();
    let saved = std::fs::read(&path).unwrap();

    let mut other = NetFp16Outputs::build(&Cpu::seed_from_u64(7)).unwrap();
    let mut opt = typed_amp::optim::adam(other.master(), AdamConfig::default());
    let mut scaler = NetFp16Outputs::scaler();
    let before = (
        param_bytes(other.master()),
        param_bytes(other.working()),
        optimizer_bytes(&opt, other.master()),
        scaler.state(),
    );
    // Loaded with the saving model's policy value into a model of another policy.
    let err =
        checkpoint::load_with_policy(&path, &mut other, &mut opt, &mut scaler, &Net::AMP_CONFIG)
            .unwrap_err();
    assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("is not this model's"), "{message}");
    assert!(
        message.contains("(cast_model_outputs is F32 in the policy passed, none in the model)"),
        "{message}"
    );
    // Loaded without naming a policy: the model's own is compared with the file's.
    let err = checkpoint::load(&path, &mut other, &mut opt, &mut scaler).unwrap_err();
    assert!(
        err.to_string()
            .contains("cast_model_outputs is F32 in the checkpoint, none here"),
        "{err}"
    );
    let after = (
        param_bytes(other.master()),
        param_bytes(other.working()),
        optimizer_bytes(&opt, other.master()),
        scaler.state(),
    );
    assert_eq!(after, before, "nothing loaded");

    // Saved with another model's policy value: refused, the file left as it was.
    let err =
        checkpoint::save_with_policy(&path, &mut other, &opt, &scaler, &Net::AMP_CONFIG, &extra)
            .unwrap_err();
    assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err:?}");
    assert_eq!(std::fs::read(&path).unwrap(), saved);

    // The model's own policy loads.
    let (mut net_opt, mut net_scaler) = (net_opt, net_scaler);
    checkpoint::load_with_policy(
        &path,
        &mut net,
        &mut net_opt,
        &mut net_scaler,
        &Net::AMP_CONFIG,
    )
    .unwrap();
    checkpoint::load(&path, &mut net, &mut net_opt, &mut net_scaler).unwrap();
}
