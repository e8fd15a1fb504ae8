use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O0")]
struct Mlp {
    #[amp(fp16)]
    fc: Linear<4, 2>,
}

fn main() {}
