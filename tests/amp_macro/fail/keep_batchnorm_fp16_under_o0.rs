use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O0", keep_batchnorm_fp32 = false)]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
