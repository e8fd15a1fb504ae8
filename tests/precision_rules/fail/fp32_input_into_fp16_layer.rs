use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = MasterWeights::build::<Mlp>(&dev)?;
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    // Wrong: FP32 data into FP16 layers ("Input type FloatTensor and weight type HalfTensor").
    let _logits = model.working().forward(x);
    Ok(())
}
