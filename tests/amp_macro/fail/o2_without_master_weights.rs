use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2", master_weights = false)]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
