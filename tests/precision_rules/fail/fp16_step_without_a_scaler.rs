use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = mse_loss(logits.to_f32(), dev.zeros());
    // Wrong: FP16 gradients below 2^-24 flush to zero without a loss scale.
    let _grads = loss.backward()?.check(&mut model)?;
    Ok(())
}
