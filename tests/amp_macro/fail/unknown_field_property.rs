use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
struct Mlp {
    #[amp(fp8)]
    fc: Linear<4, 2>,
}

fn main() {}
