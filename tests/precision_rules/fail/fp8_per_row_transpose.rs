use typed_amp::fp8::{Fp8Error, Fp8Tensor, PerRow, E4M3};

fn main() -> Result<(), Fp8Error> {
    let x = Fp8Tensor::<E4M3, PerRow>::quantize(&[1.0f32, 2.0, 300.0, 4.0], 2, 2)?;
    // Wrong: each row has its own scale; transposed, a row would hold codes of two scales.
    let _xt = x.transpose();
    Ok(())
}
