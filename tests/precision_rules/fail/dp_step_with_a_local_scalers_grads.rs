use typed_amp::dfdx::optim::Sgd;
use typed_amp::distributed::{DataParallel, SingleProcess};
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let dist = DataParallel::new(GradScaler::default(), SingleProcess)?;
    let scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = scaler.scale(loss).backward()?;
    let grads = scaler.unscale(&mut model, grads)?;
    // Wrong: a single-process scaler's gradients were never averaged across ranks.
    let _ = dist.step(&mut opt, grads)?;
    Ok(())
}
