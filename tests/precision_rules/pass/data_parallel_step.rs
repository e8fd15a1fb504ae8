use typed_amp::dfdx::optim::Sgd;
use typed_amp::distributed::{DataParallel, SingleProcess};
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let mut dist = DataParallel::new(GradScaler::default(), SingleProcess)?;
    // One step.
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = dist.scale(loss).backward()?;
    let local = dist.unscale(&mut model, grads)?;
    let mut averaged = dist.all_reduce(local)?;
    clip_grad_norm(&mut averaged, 1.0)?;
    clip_grad_value(&mut averaged, 1.0)?;
    let outcome = dist.step(&mut opt, averaged)?;
    let grads: MixedGradients<Cpu> = dist.update(outcome)?;
    // An accumulation window: one reduction for two micro-batches.
    let mut window = dist.accumulate(grads);
    for _ in 0..2 {
        let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
        let logits = model.working().forward(window.trace(x)?);
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
        window.backward(loss * 0.5)?;
    }
    let scaled = window.finish()?;
    let local = dist.unscale(&mut model, scaled)?;
    let averaged = dist.all_reduce(local)?;
    let outcome = dist.step(&mut opt, averaged)?;
    let _next = dist.update([outcome])?;
    dist.check_in_sync(&model)?;
    Ok(())
}
