use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let grads = model.alloc_grads()?;
    // Wrong: the one-call step of an FP16 model without a loss scaler (FP16 gradients below
    // 2^-24 flush to zero); `NoScaler` steps BF16 and FP32 models only.
    let _grads = NoScaler::new().train_step(&mut model, &mut opt, grads, |model, _, grads| {
        let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
        let logits = model.working().forward(x.traced_mixed(grads));
        mse_loss(logits.to_f32(), dev.zeros())
    })?;
    Ok(())
}
