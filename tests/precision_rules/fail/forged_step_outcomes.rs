use typed_amp::{prelude::*, tape::MixedGradients};
use typed_amp::scaler::ScalerId;
use typed_amp::step::StepOutcomes;

/// Wrong: a hand-written outcome that reports no overflow (a skipped step would count as clean)
/// and makes up the next gradients. `StepOutcomes` is sealed: only a step's own outcomes are.
struct Forged(MixedGradients<Cpu>);

impl StepOutcomes<Cpu> for Forged {
    type Grads = MixedGradients<Cpu>;
    fn for_each_flag(&self, _f: &mut dyn FnMut(ScalerId, bool)) {}
    fn into_grads(self) -> MixedGradients<Cpu> {
        self.0
    }
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = MasterWeights::build::<(Linear<4, 2>,)>(&dev)?;
    let mut scaler = GradScaler::default();
    let _grads = scaler.update(Forged(model.alloc_grads()?))?;
    Ok(())
}
