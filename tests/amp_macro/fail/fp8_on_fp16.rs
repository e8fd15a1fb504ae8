use typed_amp::prelude::*;

// Wrong: FP8 linear layers are a recipe on top of O2-BF16; this model's dtype is FP16.
#[typed_amp::amp(policy = "O2", fp8 = "hybrid")]
struct Mlp {
    fc: Linear<4, 2>,
}

fn main() {}
