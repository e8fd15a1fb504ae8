use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<Mlp, f32>();
    let model = MasterWeights::<_, _, _, BF16>::convert(master, &dev)?;
    let x: Tensor<Rank2<3, 4>, bf16, _> = dev.zeros();
    let logits = model.working().forward(x.traced_mixed(model.alloc_grads()?));
    // Wrong: the loss is computed on BF16 logits.
    let _loss = cross_entropy_with_logits_loss(logits, dev.zeros());
    Ok(())
}
