use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::dynamic();
    let grads = model.alloc_grads()?;
    let options = StepOptions::new().clip_grad_norm(1.0).accumulate(2);
    let _grads = scaler.train_step_with(&mut model, &mut opt, grads, &options, |model, _, grads| {
        let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
        let logits = model.working().forward(x.traced_mixed(grads));
        // Wrong: the loss the one-call step scales is computed on FP16 logits.
        cross_entropy_with_logits_loss(logits, dev.zeros())
    })?;
    Ok(())
}
