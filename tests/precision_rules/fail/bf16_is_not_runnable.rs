use typed_amp::prelude::*;

fn main() {
    let dev = Cpu::default();
    let x: Tensor<Rank1<2>, f32, _> = dev.zeros();
    // BF16 is declared, but dfdx 0.13 has no bf16 kernels.
    let _y = x.cast::<typed_amp::BF16>();
}
