//! Models declared with `#[amp]`.

use typed_amp::amp::norm::MixedNorm;
use typed_amp::amp::AmpModel;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, Linear};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
pub struct Mlp {
    fc1: Linear<16, 32>,
    act: ReLU,
    fc2: Linear<32, 4>,
}

#[typed_amp::amp(policy = "O2")]
pub struct Cnn {
    conv1: Conv2D<1, 4, 3, 1, 1>,
    bn1: BatchNorm2D<4>,
    act1: ReLU,
    pool1: MaxPool2D<2>,
    flat: Flatten<{ 4 * 4 * 4 }>,
    fc: Linear<64, 3>,
}

#[test]
fn o2_field_types() {
    let dev = Cpu::default();
    let model = Cnn::build(&dev).unwrap();
    let _: &typed_amp::dfdx::nn::modules::BatchNorm2D<4, f32, Cpu> = &model.working().bn1;
    // The fix the `Module` message names for 16-bit activations into an O2 batch norm: the mixed
    // forward, which agrees with the FP32 forward between casts to one rounding.
    let h: Tensor<Rank4<2, 4, 8, 8>, f32, _> = dev.sample_normal();
    let h = h.to_f16();
    let mixed = model.working().bn1.try_forward_mixed(h.clone()).unwrap();
    let cast = model.working().bn1.forward(h.to_f32()).to_f16();
    // Both paths round an FP32 value of the same formula to FP16 once: they differ by at most
    // one FP16 ulp (at most ε·|c| for a normal value, the smallest subnormal below).
    let (eps, tiny) = (f16::EPSILON.to_f32(), f16::from_bits(1).to_f32());
    for (m, c) in mixed.as_vec().iter().zip(cast.as_vec()) {
        let (m, c) = (m.to_f32(), c.to_f32());
        assert!((m - c).abs() <= eps * c.abs() + tiny, "{m} vs {c}");
    }
    let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
    let y = model.working().forward(x);
    let _ = y;
    let m = Mlp::build(&dev).unwrap();
    let x: Tensor<Rank2<2, 16>, f32, _> = dev.sample_normal();
    let _y: Tensor<Rank2<2, 4>, f16, _> = m.working().forward(x);
    let _ = <Mlp as AmpModel<Cpu>>::CONFIG;
}

// dfdx's deprecated `GeLU` is the tanh approximation, `FastGeLU` under its older name: a correct
// layer, which `#[amp]` used to refuse (it had no row of the policy table).
// (The allowance covers the code `#[amp]` generates from the field's type too.)
#[allow(deprecated)]
mod old_gelu {
    use typed_amp::prelude::*;

    #[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
    pub struct OldGelu {
        fc1: Linear<6, 16>,
        act: typed_amp::dfdx::nn::builders::GeLU,
        fc2: Linear<16, 3>,
    }
}
use old_gelu::OldGelu;

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
pub struct FastGelu {
    fc1: Linear<6, 16>,
    act: FastGeLU,
    fc2: Linear<16, 3>,
}

/// The losses of 30 Adam steps of `$model` on one fixed batch, from seed 0.
macro_rules! losses {
    ($model:ty) => {{
        let dev = Cpu::seed_from_u64(0);
        let mut model = <$model>::build(&dev).unwrap();
        let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
        let mut scaler = <$model>::scaler();
        let mut grads = model.alloc_grads().unwrap();
        let x: Tensor<Rank2<8, 6>, f32, _> = dev.sample_normal();
        let y: Tensor<Rank2<8, 3>, f32, _> = dev.sample_normal();
        let mut losses = Vec::new();
        for _ in 0..30 {
            let out = model.working().forward(x.trace_mixed(grads));
            let loss = mse_loss(out, y.clone());
            losses.push(loss.value());
            let scaled = scaler.scale(loss).backward().unwrap();
            let unscaled = scaler.unscale(&mut model, scaled).unwrap();
            let outcome = scaler.step(&mut opt, unscaled).unwrap();
            grads = scaler.update(outcome).unwrap();
        }
        losses
    }};
}

#[test]
fn the_deprecated_gelu_trains_under_o2_as_fast_gelu_does() {
    let old = losses!(OldGelu);
    // The same layer under its current name, from the same seed: the same losses, bit for bit.
    assert_eq!(old, losses!(FastGelu));
    assert!(old.iter().all(|l| l.is_finite()), "{old:?}");
    assert!(old[29] < 0.9 * old[0], "it trains: {old:?}");
}
