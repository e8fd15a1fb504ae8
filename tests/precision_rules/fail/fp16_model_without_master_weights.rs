use typed_amp::dfdx::optim::Sgd;
use typed_amp::{prelude::*, tape::MixedGradients};

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    // Wrong: an FP16 model trained directly, with no FP32 master weights.
    let mut model = dev.build_module::<Linear<4, 2>, f16>();
    let mut opt = Sgd::new(&model, SgdConfig::default());
    let scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.forward(x.traced_mixed(MixedGradients::for_params(&model)?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = scaler.scale(loss).backward()?;
    let grads = scaler.unscale(&mut model, grads)?;
    let _ = scaler.step(&mut opt, grads)?;
    Ok(())
}
