use typed_amp::prelude::*;

/// A type alias hides the layer's name from `#[amp]`.
type Hidden = Linear<4, 2>;

#[typed_amp::amp(policy = "O2")]
struct Mlp {
    fc: Hidden,
}

fn main() {
    let dev = Cpu::default();
    let _ = Mlp::build(&dev);
}
