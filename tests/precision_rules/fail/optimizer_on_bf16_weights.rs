use typed_amp::dfdx::optim::Sgd;
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<Mlp, f32>();
    let mut model = MasterWeights::<_, _, _, BF16>::convert(master, &dev)?;
    // Wrong: the optimizer is built on the BF16 working copy.
    let mut opt = Sgd::new(model.working(), SgdConfig::default());
    let x: Tensor<Rank2<3, 4>, bf16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), dev.zeros());
    let grads = loss.backward()?.check(&mut model)?;
    let _ = grads.step(&mut opt)?;
    Ok(())
}
