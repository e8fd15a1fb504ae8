use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<3, 1000>, f16, _> = dev.zeros();
    // Wrong: dfdx's own softmax (the tensor method) carries the same FP32 rule as typed-amp's.
    let _probs = scores.softmax::<Axis<1>>();
}
