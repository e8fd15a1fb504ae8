use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<3, 1000>, bf16, _> = dev.zeros();
    // Wrong: dfdx's own log-softmax over BF16 loses the small terms of its sum.
    let _log_probs = scores.log_softmax::<Axis<1>>();
}
