use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    // Wrong: the optimizer is built on the FP16 working copy, which the next refresh from the
    // FP32 masters would undo.
    let mut opt = typed_amp::optim::adam(model.working(), AdamConfig::default());
    let mut scaler = GradScaler::dynamic();
    let grads = model.alloc_grads()?;
    let _grads = scaler.train_step(&mut model, &mut opt, grads, |model, _, grads| {
        let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
        let logits = model.working().forward(x.traced_mixed(grads));
        Ok::<_, AmpError>(mse_loss(logits.to_f32(), dev.zeros()))
    })?;
    Ok(())
}
