//! The precision markers' and rules' unit tests.

use super::*;

#[test]
fn markers_name_their_element_types() {
    assert_eq!(F16::DTYPE, DType::F16);
    assert_eq!(F32::DTYPE, DType::F32);
    assert_eq!(BF16::DTYPE, DType::BF16);
    assert_eq!(dtype_of::<f16>(), DType::F16);
    assert_eq!(dtype_of::<bf16>(), DType::BF16);
    assert_eq!(dtype_of::<f32>(), DType::F32);
    assert_eq!(DType::F16.size_in_bytes(), 2);
    assert_eq!(DType::from_name("F32"), Some(DType::F32));
    assert_eq!(DType::F16.unit_roundoff(), 2f32.powi(-11));
    assert_eq!(DType::F32.unit_roundoff(), 2f32.powi(-24));
    assert_eq!(DType::from_name("F8"), None);
    let indices = [f16::INDEX, bf16::INDEX, f32::INDEX];
    for (i, dtype) in DType::ALL.iter().enumerate() {
        assert_eq!(indices[i], i, "{dtype} is listed at its index");
    }
    assert_eq!(PRECISIONS, 3);
}

#[test]
fn fp16_conversion_rounds_and_overflows_like_hardware() {
    // 65504 is FP16's largest finite value; 65520 is the first value that rounds to inf.
    assert_eq!(<f16 as AmpElem>::from_f32(65504.0).to_f32(), 65504.0);
    assert_eq!(<f16 as AmpElem>::from_f32(65519.0).to_f32(), 65504.0);
    assert!(<f16 as AmpElem>::from_f32(65520.0).to_f32().is_infinite());
    // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 and rounds to even (1).
    assert_eq!(
        <f16 as AmpElem>::from_f32(1.0 + 2f32.powi(-11)).to_f32(),
        1.0
    );
    let src = [1.5f32, -2.0, 65520.0, f32::NAN];
    let mut half = [f16::ZERO; 4];
    f16::slice_from_f32(&src, &mut half);
    let mut back = [0f32; 4];
    f16::slice_to_f32(&half, &mut back);
    assert_eq!(&back[..2], &[1.5, -2.0]);
    assert!(back[2].is_infinite() && back[3].is_nan());
}

#[test]
fn bf16_slice_conversion_matches_half_bit_for_bit() {
    // Ties (1 + 2^-8 rounds to even 1, 1 + 3·2^-8 to 1 + 2^-6), the largest finite BF16 and
    // what overflows past it, subnormals, zeros of both signs, infinities and NaNs.
    let mut values = vec![
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        bf16::MAX.to_f32(),
        f32::MAX,
        -f32::MAX,
        f32::from_bits(1),
        f32::from_bits(0x0040_8000),
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0xff80_0001),
    ];
    // A sweep through every exponent with mantissas near the rounding boundary.
    for exp in 0..=255u32 {
        for low in [0x7fffu32, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001] {
            values.push(f32::from_bits((exp << 23) | low));
        }
    }
    let mut ours = vec![bf16::ZERO; values.len()];
    bf16::slice_from_f32(&values, &mut ours);
    for (v, o) in values.iter().zip(&ours) {
        let reference = bf16::from_f32(*v);
        if v.is_nan() {
            assert!(o.is_nan(), "{v:e} -> {o}");
        } else {
            assert_eq!(
                o.to_bits(),
                reference.to_bits(),
                "{v:e} ({:#010x})",
                v.to_bits()
            );
        }
    }
    let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let mut wide = vec![0f32; all.len()];
    bf16::slice_to_f32(&all, &mut wide);
    for (b, w) in all.iter().zip(&wide) {
        if b.is_nan() {
            // The shift keeps a signalling NaN's payload where `half` quiets it: NaN both.
            assert!(w.is_nan());
        } else {
            assert_eq!(w.to_bits(), b.to_f32().to_bits());
        }
    }
}

#[test]
fn full_range_is_fp32_and_bf16() {
    assert!(DType::BF16.has_full_range() && DType::F32.has_full_range());
    assert!(!DType::F16.has_full_range());
    assert_eq!(DType::BF16.unit_roundoff(), 2f32.powi(-8));
}
