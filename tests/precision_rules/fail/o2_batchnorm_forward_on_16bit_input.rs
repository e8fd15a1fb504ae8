use typed_amp::dfdx::nn::builders::BatchNorm2D;
use typed_amp::nn::builders::Conv2D;
use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
pub struct Cnn {
    conv: Conv2D<1, 4, 3, 1, 1>,
    bn: BatchNorm2D<4>,
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::default();
    let model = Cnn::build(&dev)?;
    let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
    let x = x.to_f16();
    let h = model.working().conv.forward(x);
    // Wrong: under O2 the batch norm keeps FP32 parameters (`keep_batchnorm_fp32`); dfdx's own
    // forward cannot take the FP16 activations.
    let _y = model.working().bn.forward(h);
    Ok(())
}
