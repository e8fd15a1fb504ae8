use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2", loss_scale = 65536.0)]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
