use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = mse_loss(logits.to_f32(), dev.zeros());
    let unscaled = scaler.unscale(&mut model, scaler.scale(loss).backward()?)?;
    let outcome = scaler.step(&mut opt, unscaled)?;
    let _grads = scaler.update(outcome)?;
    // Wrong: counting one step twice would grow the scale twice as fast.
    let _again = scaler.update(outcome)?;
    Ok(())
}
