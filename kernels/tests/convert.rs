//! The conversion layer (`typed_amp_kernels::convert`), bit for bit against `half`'s scalar
//! conversions: the slice functions at every level this CPU supports, on lengths that run the
//! vector bodies and the scalar tails, and the scalar helpers; widening over all 65,536
//! patterns of both formats (every NaN payload included), narrowing over a stride through all
//! 2³² f32 patterns plus every rounding boundary; and the module's NaN rule stated directly.

use half::{bf16, f16};
use typed_amp_kernels::convert;

mod common;
use common::at_every_level as at_each_level;

/// f32 inputs for the narrowing directions: every bf16 pattern with the discarded half at and
/// around the tie and at the extremes; every f16 value, every midpoint between neighbouring f16
/// values (exact ties, normal and subnormal) and the f32 values either side of it; a stride
/// through all 2³² patterns; and the specials.
fn narrowing_inputs() -> Vec<f32> {
    let mut v = Vec::new();
    for hi in 0..=u16::MAX as u32 {
        for lo in [0u32, 1, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF] {
            v.push(f32::from_bits(hi << 16 | lo));
        }
    }
    for h in 0..=u16::MAX {
        let x = f16::from_bits(h);
        let next = f16::from_bits(h.wrapping_add(1));
        if x.is_finite() && next.is_finite() && (h & 0x7FFF) != 0x7FFF {
            let mid = (x.to_f64() + next.to_f64()) / 2.0;
            let m = mid as f32;
            assert_eq!(m as f64, mid, "f16 midpoints are exact in f32");
            v.extend([
                m,
                f32::from_bits(m.to_bits() + 1),
                f32::from_bits(m.to_bits() - 1),
            ]);
        }
        v.push(x.to_f32());
    }
    // Two strides through all 2³² patterns, with different residues.
    for (start, stride) in [(0u64, 4093u64), (1, 65_521)] {
        let mut bits = start;
        while bits <= u32::MAX as u64 {
            v.push(f32::from_bits(bits as u32));
            bits += stride;
        }
    }
    // f32 subnormals (f16 flushes them all to ±0, bf16 keeps or rounds them).
    for bits in (0..0x0080_0000u32).step_by(61) {
        v.extend([f32::from_bits(bits), f32::from_bits(bits | 0x8000_0000)]);
    }
    // Overflow thresholds and the subnormal end of f16, and bf16's overflow midpoint, each with
    // its f32 neighbours: f16 65504 is the largest finite, 65520 the midpoint to inf (a tie,
    // which goes to the even inf); 2⁻²⁴ is f16's smallest subnormal and 2⁻²⁵ the tie below it
    // (to even: zero); bf16's largest finite is 0x7F7F and 0x7F7F_8000 the tie above it.
    for x in [
        65504.0f32,
        65520.0,
        2f32.powi(-24),
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        2f32.powi(-14),
        f32::from_bits(0x7F7F_8000),
        f32::from_bits(0x7F7F_0000),
        f32::from_bits(0x0080_0000),
    ] {
        for d in -2i32..=2 {
            let b = (x.to_bits() as i32 + d) as u32;
            v.extend([f32::from_bits(b), -f32::from_bits(b)]);
        }
    }
    // NaNs with payloads only in the bits narrowing drops (must not become inf), only in the
    // bits it keeps, and signalling ones.
    for payload in [
        1u32, 0x1FFF, 0xFFFF, 0x2000, 0x1_0000, 0x3F_0000, 0x20_0000, 0x40_0000,
    ] {
        v.extend([
            f32::from_bits(0x7F80_0000 | payload),
            f32::from_bits(0xFF80_0000 | payload),
        ]);
    }
    v.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001), // signalling NaN
        f32::from_bits(0xFF80_0001),
        f32::from_bits(0x7FBF_FFFF),
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        0.0,
        -0.0,
    ]);
    // An odd length, so that every vector loop also runs its scalar tail.
    if v.len().is_multiple_of(2) {
        v.push(1.0);
    }
    v
}

/// Compares `f`'s whole-slice output with `g` element by element, and also on unaligned
/// offsets and every short length (vector bodies plus each possible tail).
fn check_slices<S: Copy, D: Copy + Default + PartialEq + std::fmt::Debug>(
    src: &[S],
    f: impl Fn(&[S], &mut [D]),
    g: impl Fn(S) -> D,
    bits: impl Fn(D) -> u32,
) {
    let mut out = vec![D::default(); src.len()];
    f(src, &mut out);
    for (i, (&s, &d)) in src.iter().zip(&out).enumerate() {
        assert_eq!(bits(d), bits(g(s)), "element {i}");
    }
    // Every length up to 70 (bodies of 8 and 16 plus every tail) from four offsets.
    let shapes = (0..4).flat_map(|start| (0..=70).map(move |len| (start, len)));
    for (start, len) in shapes {
        let s = &src[start..start + len];
        let mut o = vec![D::default(); len];
        f(s, &mut o);
        for (&s, &d) in s.iter().zip(&o) {
            assert_eq!(bits(d), bits(g(s)));
        }
    }
}

#[test]
fn f16_to_f32_all_patterns() {
    let src: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    at_each_level("f16_to_f32_all_patterns", || {
        check_slices(&src, convert::f16_to_f32, |x| x.to_f32(), f32::to_bits)
    });
}

#[test]
fn bf16_to_f32_all_patterns() {
    let src: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    at_each_level("bf16_to_f32_all_patterns", || {
        check_slices(&src, convert::bf16_to_f32, |x| x.to_f32(), f32::to_bits)
    });
}

#[test]
fn f32_to_f16_rounds_like_half() {
    let src = narrowing_inputs();
    at_each_level("f32_to_f16_rounds_like_half", || {
        check_slices(&src, convert::f32_to_f16, f16::from_f32, |x| {
            x.to_bits() as u32
        })
    });
}

#[test]
fn f32_to_bf16_rounds_like_half() {
    let src = narrowing_inputs();
    at_each_level("f32_to_bf16_rounds_like_half", || {
        check_slices(&src, convert::f32_to_bf16, bf16::from_f32, |x| {
            x.to_bits() as u32
        })
    });
}

#[test]
fn narrowing_specials() {
    // The properties the module promises, stated directly rather than through `half`.
    at_each_level("narrowing_specials", || {
        let src = [
            f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::MAX,
            65520.0,
            1.0 + 1.0 / 2048.0,
        ];
        let mut h = [f16::ZERO; 5];
        convert::f32_to_f16(&src, &mut h);
        assert!(
            h[0].is_nan() && h[1].is_nan() && h[1].to_bits() & 0x0200 != 0,
            "quiet NaN"
        );
        assert_eq!(h[2], f16::INFINITY);
        assert_eq!(h[3], f16::INFINITY);
        assert_eq!(h[4], f16::ONE, "tie to even");
        let mut b = [bf16::ZERO; 5];
        convert::f32_to_bf16(&src, &mut b);
        assert!(
            b[0].is_nan() && b[1].is_nan() && b[1].to_bits() & 0x0040 != 0,
            "quiet NaN"
        );
        assert_eq!(
            b[2],
            bf16::from_f32(f32::MAX),
            "f32::MAX rounds to bf16 inf"
        );
        assert!(b[2].is_infinite());
    });
}

#[test]
fn scalar_helpers_match_half() {
    for h in 0..=u16::MAX {
        let (x, y) = (f16::from_bits(h), bf16::from_bits(h));
        assert_eq!(
            convert::widen_f16(x).to_bits(),
            x.to_f32().to_bits(),
            "{h:#06x}"
        );
        assert_eq!(
            convert::widen_bf16(y).to_bits(),
            y.to_f32().to_bits(),
            "{h:#06x}"
        );
    }
    for x in narrowing_inputs() {
        assert_eq!(
            convert::narrow_f16(x).to_bits(),
            f16::from_f32(x).to_bits(),
            "{x:e}"
        );
        assert_eq!(
            convert::narrow_bf16(x).to_bits(),
            bf16::from_f32(x).to_bits(),
            "{x:e}"
        );
    }
}

/// The module's NaN rule, stated on the bits rather than through `half`, for every 16-bit NaN
/// pattern (widening) and a sweep of f32 NaN payloads (narrowing), through the slice functions
/// at every level and the scalar helpers.
#[test]
fn nan_rule() {
    let nan16 = |exp: u16| {
        (0..=u16::MAX)
            .filter(move |h| h & exp == exp && h & !0x8000 & !exp != 0)
            .collect::<Vec<u16>>()
    };
    let (f16_nans, bf16_nans) = (nan16(0x7C00), nan16(0x7F80));
    assert_eq!((f16_nans.len(), bf16_nans.len()), (2 * 1023, 2 * 127));
    let mut f32_nans: Vec<u32> = (1..0x80_0000u32)
        .step_by(97)
        .map(|m| 0x7F80_0000 | m)
        .collect();
    f32_nans.extend((0..23).map(|b| 0x7F80_0000 | 1 << b));
    f32_nans.extend(f32_nans.clone().iter().map(|b| b | 0x8000_0000));

    // Widening: sign kept, payload moved to the top of the significand, quiet bit set.
    let widen_f16 = |h: u16| ((h as u32 & 0x8000) << 16) | 0x7FC0_0000 | ((h as u32 & 0x3FF) << 13);
    let widen_bf16 = |h: u16| ((h as u32) << 16) | 0x0040_0000;
    // Narrowing: sign kept, top payload bits kept, quiet bit set.
    let narrow_f16 = |x: u32| ((x >> 16) as u16 & 0x8000) | 0x7E00 | ((x >> 13) as u16 & 0x3FF);
    let narrow_bf16 = |x: u32| (x >> 16) as u16 | 0x0040;

    at_each_level("nan_rule", || {
        let src: Vec<f16> = f16_nans.iter().map(|&h| f16::from_bits(h)).collect();
        let mut out = vec![0.0f32; src.len()];
        convert::f16_to_f32(&src, &mut out);
        for (&h, o) in f16_nans.iter().zip(&out) {
            assert_eq!(o.to_bits(), widen_f16(h), "f16 {h:#06x}");
        }
        let src: Vec<bf16> = bf16_nans.iter().map(|&h| bf16::from_bits(h)).collect();
        let mut out = vec![0.0f32; src.len()];
        convert::bf16_to_f32(&src, &mut out);
        for (&h, o) in bf16_nans.iter().zip(&out) {
            assert_eq!(o.to_bits(), widen_bf16(h), "bf16 {h:#06x}");
        }
        let src: Vec<f32> = f32_nans.iter().map(|&b| f32::from_bits(b)).collect();
        let mut h = vec![f16::ZERO; src.len()];
        let mut b = vec![bf16::ZERO; src.len()];
        convert::f32_to_f16(&src, &mut h);
        convert::f32_to_bf16(&src, &mut b);
        for (i, &x) in f32_nans.iter().enumerate() {
            assert_eq!(h[i].to_bits(), narrow_f16(x), "f32 {x:#010x} to f16");
            assert_eq!(b[i].to_bits(), narrow_bf16(x), "f32 {x:#010x} to bf16");
        }
    });
    for &h in &f16_nans {
        assert_eq!(
            convert::widen_f16(f16::from_bits(h)).to_bits(),
            widen_f16(h)
        );
    }
    for &h in &bf16_nans {
        assert_eq!(
            convert::widen_bf16(bf16::from_bits(h)).to_bits(),
            widen_bf16(h)
        );
    }
    for &x in &f32_nans {
        assert_eq!(
            convert::narrow_f16(f32::from_bits(x)).to_bits(),
            narrow_f16(x)
        );
        assert_eq!(
            convert::narrow_bf16(f32::from_bits(x)).to_bits(),
            narrow_bf16(x)
        );
    }
}
