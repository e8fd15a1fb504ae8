use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
struct Mlp {
    #[amp(bf16)]
    fc: Linear<4, 2>,
}

fn main() {}
