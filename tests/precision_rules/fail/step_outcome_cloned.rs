use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let scaled = scaler.scale(loss).backward()?;
    let unscaled = scaler.unscale(&mut model, scaled)?;
    let outcome = scaler.step(&mut opt, unscaled)?;
    // Wrong: a copy would count the step twice, or hand out its gradients twice.
    let copy = outcome.clone();
    let _grads = scaler.update(outcome)?;
    let _again = scaler.update(copy)?;
    Ok(())
}
