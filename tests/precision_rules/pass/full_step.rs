use typed_amp::dfdx::optim::{Adam, Sgd};
use typed_amp::dfdx::nn::builders::BatchNorm1D;
use typed_amp::nn::builders::{ToF16, ToF32};
use typed_amp::master::Fp32Weights;
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn fp16_mlp() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = scaler.scale(loss).backward()?;
    let mut grads = scaler.unscale(&mut model, grads)?;
    clip_grad_norm(&mut grads, 1.0)?;
    let outcome = scaler.step(&mut opt, grads)?;
    let _next: MixedGradients<Cpu> = scaler.update(outcome)?;
    Ok(())
}

fn fp16_layers_around_an_fp32_norm() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<(Linear<4, 4>, ToF32, BatchNorm1D<4>, ToF32, Linear<4, 2>), f32>();
    let working = (
        dev.build_module::<Linear<4, 4>, f16>(),
        ToF32,
        dev.build_module::<BatchNorm1D<4>, f32>(),
        ToF16,
        dev.build_module::<Linear<4, 2>, f16>(),
    );
    let mut model = MasterWeights::from_parts(master, working, &dev)?;
    let mut opt = Adam::new(model.master(), typed_amp::optim::adamw_config(1e-3, 1e-2));
    let mut scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let grads = model.alloc_grads()?;
    let logits = model.working_mut().forward_mut(x.traced_mixed(grads));
    let loss = mse_loss(logits.to_f32(), dev.zeros());
    let grads = scaler.scale(loss).backward()?;
    let grads = scaler.unscale(&mut model, grads)?;
    let outcome = scaler.step(&mut opt, grads)?;
    let _next = scaler.update(outcome)?;
    Ok(())
}

fn fp32_model() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = Fp32Weights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::disabled();
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits, dev.zeros());
    let grads = scaler.scale(loss).backward()?;
    let grads = scaler.unscale(&mut model, grads)?;
    let outcome = scaler.step(&mut opt, grads)?;
    let _next = scaler.update(outcome)?;
    Ok(())
}

/// An FP32 model has FP32's exponent range: it steps without a scaler, still checked for
/// inf and NaN.
fn fp32_model_without_a_scaler() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = Fp32Weights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits, dev.zeros());
    let mut grads = loss.backward()?.check(&mut model)?;
    clip_grad_value(&mut grads, 1.0)?;
    let _next: MixedGradients<Cpu> = grads.step(&mut opt)?.into_grads();
    Ok(())
}

/// A BF16 working copy has FP32's exponent range: it steps on raw gradients, with no scaler at
/// all, and clipping works on them as on unscaled ones.
fn bf16_model_without_a_scaler() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<Mlp, f32>();
    let mut model = MasterWeights::<_, _, _, BF16>::convert(master, &dev)?;
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    let mut grads = model.alloc_grads()?;
    for _ in 0..2 {
        let x: Tensor<Rank2<3, 4>, bf16, _> = dev.zeros();
        let logits = model.working().forward(x.traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
        let mut unscaled = loss.backward()?.check(&mut model)?;
        clip_grad_norm(&mut unscaled, 1.0)?;
        grads = unscaled.step(&mut opt)?.into_grads();
    }
    Ok(())
}

#[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
struct Bf16Net {
    fc1: Linear<4, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 2>,
}

/// An O2-BF16 `#[amp]` model's whole step: FP32 input cast at the entry, BF16 layers with an
/// FP32 batch norm, FP32 outputs for the loss, no scaler, and the optimizer on the FP32 master.
fn o2_bf16_amp_model() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model: MasterWeights<Bf16NetMaster<Cpu>, Bf16NetWorking<Cpu>, Cpu, BF16> =
        Bf16Net::build(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let grads = model.alloc_grads()?;
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let logits: Tensor<Rank2<3, 2>, f32, _, _> =
        model.working_mut().forward_mut(x.traced_mixed(grads));
    let loss = cross_entropy_with_logits_loss(logits, dev.zeros());
    let mut unscaled = loss.backward()?.check(&mut model)?;
    clip_grad_value(&mut unscaled, 1.0)?;
    let outcome = unscaled.step(&mut opt)?;
    assert!(!outcome.skipped());
    let _next: MixedGradients<Cpu> = outcome.into_grads();
    Ok(())
}

fn main() {
    fp16_mlp().unwrap();
    fp16_layers_around_an_fp32_norm().unwrap();
    fp32_model().unwrap();
    fp32_model_without_a_scaler().unwrap();
    bf16_model_without_a_scaler().unwrap();
    o2_bf16_amp_model().unwrap();
}
