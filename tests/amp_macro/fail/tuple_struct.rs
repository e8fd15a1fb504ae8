use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
struct Mlp(Linear<4, 2>, ReLU);

fn main() {}
