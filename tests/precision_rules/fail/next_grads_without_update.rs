use typed_amp::prelude::*;
use typed_amp::step::StepOutcomes;
use typed_amp::step::StepOutcome;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let scaler = GradScaler::default();
    let x: Tensor<Rank2<3, 4>, f16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = mse_loss(logits.to_f32(), dev.zeros());
    let unscaled = scaler.unscale(&mut model, scaler.scale(loss).backward()?)?;
    let outcome = scaler.step(&mut opt, unscaled)?;
    // Wrong: the next gradients taken out of the outcome by the trait's helper, so that the
    // scaler never hears of the step. Only `scaler.update(outcome)` gives them.
    let _grads: MixedGradients<Cpu> =
        <StepOutcome<Cpu> as StepOutcomes<Cpu>>::into_grads(outcome);
    Ok(())
}
