//! Models declared with `#[amp]`.

use typed_amp::amp::AmpModel;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, Linear};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
pub struct Mlp {
    fc1: Linear<16, 32>,
    act: ReLU,
    fc2: Linear<32, 4>,
}

#[typed_amp::amp(policy = "O2")]
pub struct Cnn {
    conv1: Conv2D<1, 4, 3, 1, 1>,
    bn1: BatchNorm2D<4>,
    act1: ReLU,
    pool1: MaxPool2D<2>,
    flat: Flatten<{ 4 * 4 * 4 }>,
    fc: Linear<64, 3>,
}

#[test]
fn o2_field_types() {
    let dev = Cpu::default();
    let model = Cnn::build(&dev).unwrap();
    let _: &typed_amp::dfdx::nn::modules::BatchNorm2D<4, f32, Cpu> = &model.working().bn1;
    let x: Tensor<Rank4<2, 1, 8, 8>, f32, _> = dev.sample_normal();
    let y = model.working().forward(x);
    let _ = y;
    let m = Mlp::build(&dev).unwrap();
    let x: Tensor<Rank2<2, 16>, f32, _> = dev.sample_normal();
    let _y: Tensor<Rank2<2, 4>, f16, _> = m.working().forward(x);
    let _ = <Mlp as AmpModel<Cpu>>::CONFIG;
}
