use typed_amp::prelude::*;

#[typed_amp::amp(master_weights = true)]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
