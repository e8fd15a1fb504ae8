use typed_amp::fp8::{forward_product, Fp8Error, Fp8Tensor, E4M3, E5M2};

fn main() -> Result<(), Fp8Error> {
    let w = Fp8Tensor::<E4M3>::quantize(&[0.5f32, 0.25], 1, 2)?;
    // Wrong: an activation quantised to E5M2, the gradient format, as a forward-pass operand.
    let x = Fp8Tensor::<E5M2>::quantize(&[1.0f32, 2.0], 1, 2)?;
    let _y = forward_product(&x, &w)?;
    Ok(())
}
