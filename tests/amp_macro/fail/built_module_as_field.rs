// A field naming a built FP16 module (through a type alias) instead of an architecture: its
// precision is fixed, so the policy cannot build it (here O0 would train FP16 weights with no
// master copy and no loss scaler).
use typed_amp::prelude::*;

type Fc16 = typed_amp::dfdx::nn::modules::Linear<4, 2, half::f16, Cpu>;

#[typed_amp::amp(policy = "O0")]
struct Mlp {
    fc: Fc16,
}

fn main() {
    let dev = Cpu::default();
    let _model = Mlp::build(&dev);
}
