use typed_amp::dfdx::optim::Sgd;
use typed_amp::distributed::{DataParallel, SingleProcess};
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let dist = DataParallel::new(GradScaler::default(), SingleProcess)?;
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = dist.scale(loss).backward()?;
    let local = dist.unscale(&mut model, grads)?;
    // Wrong: stepping this rank's gradients alone makes the ranks' weights drift apart.
    let _ = dist.step(&mut opt, local)?;
    Ok(())
}
