use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
struct Mlp {
    fc: Linear<4, 2>,
    steps: usize,
}

fn main() {}
