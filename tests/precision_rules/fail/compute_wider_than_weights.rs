use typed_amp::master::SinglePrecision;
use typed_amp::prelude::*;

type Mlp = (Linear<4, 8>, ReLU, Linear<8, 2>);

fn main() {
    let dev = Cpu::default();
    let module = dev.build_module::<Mlp, f16>();
    // Wrong: FP16 weights declared to compute in BF16, so that their FP16 gradients would step
    // without a loss scaler (BF16 may).
    let _model: SinglePrecision<_, f16, Cpu, BF16> = SinglePrecision::with_compute(module, &dev);
    let module = dev.build_module::<Mlp, f16>();
    // Wrong: the same, declared FP32.
    let _model: SinglePrecision<_, f16, Cpu, F32> = SinglePrecision::with_compute(module, &dev);
}
