use typed_amp::prelude::*;
use typed_amp::dfdx::nn::builders::BatchNorm1D;

fn main() {
    let dev = Cpu::default();
    // Wrong: an FP32 batch norm feeds an FP16 linear layer without a cast between them.
    let model = (
        dev.build_module::<BatchNorm1D<4>, f32>(),
        dev.build_module::<Linear<4, 2>, f16>(),
    );
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let _y = model.forward(x);
}
