use typed_amp::prelude::*;
use typed_amp::step::StepOutcome;

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = MasterWeights::build::<(Linear<4, 2>,)>(&dev)?;
    let mut scaler = GradScaler::default();
    // Wrong: an outcome made by hand, reporting no overflow, so a skipped step would count as
    // clean, with gradients of its own.
    let forged: StepOutcome<Cpu> = StepOutcome {
        found_inf: false,
        grads: model.alloc_grads()?,
    };
    let _grads = scaler.update(forged)?;
    Ok(())
}
