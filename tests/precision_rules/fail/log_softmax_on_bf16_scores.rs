use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<3, 1000>, bf16, _> = dev.zeros();
    // Wrong: log-softmax over BF16 loses the small terms of its sum; it is an FP32 op.
    let _log_probs = log_softmax(scores);
}
