use typed_amp::fp8::{Current, Fp8Error, Fp8Tensor, PerTensor, E4M3};

fn main() -> Result<(), Fp8Error> {
    let a = Fp8Tensor::<E4M3, PerTensor, Current>::quantize(&[1.0f32, 2.0], 1, 2)?;
    let b = Fp8Tensor::<E4M3, PerTensor, Current>::quantize(&[100.0f32, 200.0], 1, 2)?;
    // Wrong: the codes of two tensors with a scale each, under one scale.
    let _ab = a.concat_rows(b)?;
    Ok(())
}
