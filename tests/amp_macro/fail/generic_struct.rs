use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2")]
struct Mlp<A> {
    fc: Linear<4, 2>,
    act: A,
}

fn main() {}
