use typed_amp::dfdx::optim::{Adam, Optimizer};
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    // Wrong: dfdx's own optimizer on the FP16 working copy, which the next refresh from the FP32
    // masters would undo (master and working copy would diverge).
    let mut opt = Adam::new(model.working(), AdamConfig::default());
    let grads = model.working().alloc_grads();
    opt.update(model.working_mut(), &grads).unwrap();
    // The same through the trait's path.
    Optimizer::update(&mut opt, model.working_mut(), &grads).unwrap();
    Ok(())
}
