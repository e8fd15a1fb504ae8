use typed_amp::fp8::{Current, Fp8Recipe, E5M2};

// Wrong: a recipe whose forward-pass operands (activations and weights) are E5M2.
#[derive(Debug, Clone, Copy, Default)]
struct Backwards;

impl Fp8Recipe for Backwards {
    const NAME: &'static str = "backwards";
    type Forward = E5M2;
    type Backward = E5M2;
    type Scaling = Current;
}

fn main() {}
