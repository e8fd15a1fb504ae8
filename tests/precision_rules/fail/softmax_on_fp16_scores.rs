use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<3, 1000>, f16, _> = dev.zeros();
    // Wrong: a sum of 1,000 exponentials in FP16 overflows; softmax is an FP32 op.
    let _probs = softmax(scores.leaky_traced_mixed());
}
