use typed_amp::nn::builders::SelfAttention;
use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
pub struct Encoder {
    attn: SelfAttention<8, 2>,
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = Encoder::build(&dev)?;
    let tokens: Tensor<Rank3<2, 5, 8>, f32, _> = dev.sample_normal();
    // Wrong: under O2 the attention's projections are FP16; FP32 tokens need a cast first.
    let _y = model.working().attn.forward(tokens);
    Ok(())
}
