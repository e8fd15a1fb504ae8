use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O3", dtype = "bf16")]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
