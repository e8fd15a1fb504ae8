use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2", keep_layernorm_fp32 = true)]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
