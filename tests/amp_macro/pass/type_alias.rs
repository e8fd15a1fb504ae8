//! A type alias hides a layer's name from `#[amp]`; the layer's `AmpLayer` row still gives it
//! its precision (before layers were recognised by trait, this failed to compile unless the
//! field was pinned).
use typed_amp::prelude::*;

type Hidden = Linear<4, 2>;

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct Mlp {
    fc: Hidden,
    act: ReLU,
}

fn main() {
    let dev = Cpu::default();
    let model = Mlp::build(&dev).unwrap();
    let _: &typed_amp::dfdx::nn::modules::Linear<4, 2, f16, Cpu> = &model.working().fc;
    let x: Tensor<Rank2<3, 4>, f32, _> = dev.zeros();
    let _: Tensor<Rank2<3, 2>, f32, _> = model.working().forward(x);
}
