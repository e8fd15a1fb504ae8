use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::dynamic();
    let grads = model.alloc_grads()?;
    // Wrong: the forward closure returns the logits; the one-call step needs the FP32 loss.
    let _grads = scaler.train_step(&mut model, &mut opt, grads, |model, _, grads| {
        let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
        model.working().forward(x.traced_mixed(grads)).to_f32()
    })?;
    Ok(())
}
