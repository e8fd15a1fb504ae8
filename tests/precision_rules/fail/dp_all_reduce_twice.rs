use typed_amp::distributed::{DataParallel, SingleProcess};
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let dist = DataParallel::new(GradScaler::default(), SingleProcess)?;
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = dist.scale(loss).backward()?;
    let local = dist.unscale(&mut model, grads)?;
    let averaged = dist.all_reduce(local)?;
    // Wrong: averaged again, the gradients would be divided by the number of ranks twice.
    let _twice = dist.all_reduce(averaged)?;
    Ok(())
}
