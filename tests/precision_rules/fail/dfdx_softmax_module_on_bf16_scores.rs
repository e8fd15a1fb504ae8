use dfdx::nn::modules::{LogSoftmax, Module, Softmax};
use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let scores: Tensor<Rank2<3, 1000>, bf16, _> = dev.zeros();
    // Wrong: dfdx's `Softmax` and `LogSoftmax` modules, run by hand on 16-bit values.
    let _probs = Softmax.forward(scores.clone());
    let _log_probs = LogSoftmax.forward(scores);
}
