use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.clone().traced_mixed(model.alloc_grads()?));
    let unscaled = scaler.unscale(&mut model, scaler.scale(mse_loss(logits.to_f32(), dev.zeros())).backward()?)?;
    let outcome = scaler.step(&mut opt, unscaled)?;

    let mut window = scaler.accumulate(model.alloc_grads()?);
    let logits = model.working().forward(window.trace(x)?);
    window.backward(mse_loss(logits.to_f32(), dev.zeros()))?;
    // Wrong: the scale changes while micro-batches are still accumulating at the old one.
    let _grads = scaler.update(outcome)?;
    let _scaled = window.finish()?;
    Ok(())
}
