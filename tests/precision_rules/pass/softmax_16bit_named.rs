//! O3's deliberate 16-bit softmax: dfdx's explicitly named forms take FP16 and BF16 values.
use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<2, 3>, f16, _> = dev.zeros();
    let probs = scores.clone().softmax_16bit::<Axis<1>>();
    assert!((probs.as_vec()[0].to_f32() - 1.0 / 3.0).abs() < 1e-3);
    let _log_probs = scores.log_softmax_16bit::<Axis<1>>();
    let scores: Tensor<Rank2<2, 3>, bf16, _> = dev.zeros();
    let _probs = scores.clone().try_softmax_16bit::<Axis<1>>().unwrap();
    let _log_probs = scores.try_log_softmax_16bit::<Axis<1>>().unwrap();
    // FP32 takes the plain methods.
    let scores: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
    let _probs = scores.softmax::<Axis<1>>();
}
