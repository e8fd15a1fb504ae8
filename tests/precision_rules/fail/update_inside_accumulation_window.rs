use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = MasterWeights::build::<Mlp>(&dev)?;
    let mut scaler = GradScaler::default();
    let mut window = scaler.accumulate(model.alloc_grads()?);
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(window.trace(x)?);
    window.backward(mse_loss(logits.to_f32(), dev.zeros()))?;
    // Wrong: the scale changes while micro-batches are still accumulating at the old one.
    scaler.update(false)?;
    let _scaled = window.finish()?;
    Ok(())
}
