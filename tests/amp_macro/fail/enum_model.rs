#[typed_amp::amp(policy = "O2")]
enum Mlp {
    Small,
    Large,
}

fn main() {}
