#![deny(unused_must_use)]
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = mse_loss(logits.to_f32(), dev.zeros());
    let unscaled = scaler.unscale(&mut model, scaler.scale(loss).backward()?)?;
    // Wrong: the outcome is dropped, so the scaler never backs off or grows.
    scaler.step(&mut opt, unscaled)?;
    Ok(())
}
