use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let master = dev.build_module::<Mlp, f32>();
    let model = MasterWeights::<_, _, _, BF16>::convert(master, &dev)?;
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    // Wrong: FP32 data into BF16 layers, without a cast.
    let _logits = model.working().forward(x);
    Ok(())
}
