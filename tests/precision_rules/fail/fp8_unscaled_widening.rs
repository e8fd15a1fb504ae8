use typed_amp::fp8::{widen, Fp8Error, Fp8Tensor, E4M3};

fn main() -> Result<(), Fp8Error> {
    let t = Fp8Tensor::<E4M3>::quantize(&[1.0f32, 2.0], 1, 2)?;
    // Wrong: the codes widened without their scale (2.0 would come back as 448.0).
    let _x = widen(&t.codes());
    Ok(())
}
