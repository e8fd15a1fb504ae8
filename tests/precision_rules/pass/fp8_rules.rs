//! The right way round of each FP8 rule: E4M3 operands in the forward pass and E5M2 gradients
//! in the backward pass, widening a tensor with its scales, concatenating per-row scaled rows.
use typed_amp::fp8::{
    forward_product, gradient_product, widen, Current, Delayed, DelayedScaling, Fp8Error,
    Fp8Tensor, PerRow, PerTensor, E4M3, E5M2,
};

fn main() -> Result<(), Fp8Error> {
    let x = Fp8Tensor::<E4M3, PerRow, Current>::quantize(&[1.0f32, 2.0, 4.0, 0.5], 2, 2)?;
    let mut state = DelayedScaling::<16>::from_first(&[0.5f32, 0.25])?;
    let w = Fp8Tensor::<E4M3, PerTensor, Delayed<16>>::quantize_delayed(
        &[0.5f32, 0.25],
        1,
        2,
        &mut state,
    )?;
    let y = forward_product(&x, &w)?;
    assert!((y[0] - 1.0).abs() <= 1e-6 && (y[1] - 2.125).abs() <= 1e-6);
    let dy = Fp8Tensor::<E5M2>::quantize(&[1.0f32, -1.0], 1, 2)?;
    let _g = gradient_product(&dy, &w)?;
    let _v = widen(&x);
    let _v = x.dequantize();
    let more = Fp8Tensor::<E4M3, PerRow, Current>::quantize(&[100.0f32, 200.0], 1, 2)?;
    let all = x.concat_rows(more)?;
    assert_eq!(all.scales().len(), 3);
    Ok(())
}
