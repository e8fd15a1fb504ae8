//! The FP8 conversions (`typed_amp_kernels::convert::fp8`): all 256 codes of each format decoded
//! against an independent f64 formula and round-tripped; narrowing checked against an
//! independent f64 reference (nearest, ties to even, saturating) on every rounding boundary of
//! each format (each midpoint between neighbouring values and the f32 values one ulp either side
//! of it), saturation, NaN, subnormals and signed zero; and the slice functions at every level
//! this CPU supports, bit for bit against the scalar reference, on those inputs, on every f32
//! pattern whose code the bf16 and f16 sources can reach, and on random f32 bit patterns.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use typed_amp_kernels::convert::{self, Fp8Format, E4M3, E5M2};

mod common;
use common::at_every_level as at_each_level;

/// The value of a code by the OCP formula, in f64 (independent of the crate's bit tricks):
/// `None` for NaN.
fn reference_value<F: Fp8Format>(c: u8) -> Option<f64> {
    let (e_bits, m_bits) = (F::EXPONENT_BITS, F::MANTISSA_BITS);
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((c >> m_bits) & ((1 << e_bits) - 1)) as i32;
    let m = (c & ((1 << m_bits) - 1)) as f64;
    let e_max = (1 << e_bits) - 1;
    if F::HAS_INFINITY && e == e_max {
        return if m == 0.0 {
            Some(sign * f64::INFINITY)
        } else {
            None
        };
    }
    if !F::HAS_INFINITY && e == e_max && m == ((1 << m_bits) - 1) as f64 {
        return None;
    }
    let frac = m / (1u32 << m_bits) as f64;
    Some(if e == 0 {
        sign * frac * 2f64.powi(1 - F::BIAS)
    } else {
        sign * (1.0 + frac) * 2f64.powi(e - F::BIAS)
    })
}

/// Every finite non-negative value of the format, ascending, with its code.
fn finite_values<F: Fp8Format>() -> Vec<(f64, u8)> {
    let mut v: Vec<(f64, u8)> = (0..=0x7Fu8)
        .filter_map(|c| reference_value::<F>(c).map(|x| (x, c)))
        .filter(|(x, _)| x.is_finite())
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The code an f32 should narrow to, from the f64 list of values: nearest, ties to the even
/// code, saturating to ±max (inf included), NaN to NaN (checked separately).
fn reference_encode<F: Fp8Format>(x: f32) -> u8 {
    assert!(!x.is_nan());
    let values = finite_values::<F>();
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x as f64).abs();
    let (max, max_code) = *values.last().unwrap();
    if a >= max {
        return sign | max_code;
    }
    let i = values.partition_point(|&(v, _)| v <= a) - 1;
    let (lo, lo_code) = values[i];
    let (hi, hi_code) = values[i + 1];
    let code = if a - lo < hi - a {
        lo_code
    } else if a - lo > hi - a {
        hi_code
    } else if lo_code % 2 == 0 {
        lo_code
    } else {
        hi_code
    };
    sign | code
}

/// Every rounding boundary of the format (each midpoint between neighbouring finite values,
/// and the midpoint above the maximum) with the f32 values one and two ulps either side; every
/// value of the format with its f32 neighbours; zeros, f32 subnormals and the specials; both
/// signs. An odd length, so that the vector loops also run their tails.
fn boundary_inputs<F: Fp8Format>() -> Vec<f32> {
    let values = finite_values::<F>();
    let mut points: Vec<f64> = values.iter().map(|v| v.0).collect();
    for w in values.windows(2) {
        points.push((w[0].0 + w[1].0) / 2.0);
    }
    let (max, _) = *values.last().unwrap();
    let ulp_at_max = max - values[values.len() - 2].0;
    points.extend([
        max + ulp_at_max / 2.0,
        max + ulp_at_max,
        2.0 * max,
        2f64.powi(100),
    ]);
    let mut v = Vec::new();
    for p in points {
        let m = p as f32;
        assert_eq!(m as f64, p, "FP8 midpoints are exact in f32");
        for d in [-2i64, -1, 0, 1, 2] {
            let b = m.to_bits() as i64 + d;
            if (0..0x7F80_0000).contains(&b) {
                let y = f32::from_bits(b as u32);
                v.extend([y, -y]);
            }
        }
    }
    for bits in (1..0x0080_0000u32).step_by(4099) {
        v.extend([f32::from_bits(bits), -f32::from_bits(bits)]);
    }
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFF80_0001),
        f32::from_bits(0x7FA0_0000),
        f32::from_bits(0x7FE0_0000),
        f32::from_bits(0xFFDF_FFFF),
    ]);
    if v.len() % 2 == 0 {
        v.push(1.0);
    }
    v
}

fn decode_exhaustive<F: Fp8Format>() {
    for c in 0..=u8::MAX {
        let got = F::from_bits(c).to_f32();
        match reference_value::<F>(c) {
            None => assert!(got.is_nan(), "{} {c:#04x} is NaN", F::NAME),
            Some(r) => {
                assert_eq!(got as f64, r, "{} {c:#04x}", F::NAME);
                assert_eq!(
                    got.is_sign_negative(),
                    c & 0x80 != 0,
                    "{} {c:#04x} sign",
                    F::NAME
                );
            }
        }
        // Exact in bf16 too: the bf16 is the f32's top half, with no bits lost.
        let b = F::from_bits(c).to_bf16();
        assert_eq!(
            b.to_f32().to_bits(),
            got.to_bits(),
            "{} {c:#04x} to bf16",
            F::NAME
        );
    }
}

#[test]
fn every_e4m3_code_decodes_to_the_ocp_value() {
    decode_exhaustive::<E4M3>();
    // The table's landmarks, stated directly.
    assert_eq!(E4M3(0x7E).to_f32(), 448.0);
    assert_eq!(E4M3(0x08).to_f32(), 2f32.powi(-6));
    assert_eq!(E4M3(0x01).to_f32(), 2f32.powi(-9));
    assert_eq!(E4M3(0x80).to_f32().to_bits(), (-0.0f32).to_bits());
    assert!(E4M3(0x7F).to_f32().is_nan() && E4M3(0xFF).to_f32().is_nan());
    assert_eq!((0..=255u8).filter(|&c| E4M3(c).is_nan()).count(), 2);
    assert_eq!(
        (0..=255u8)
            .filter(|&c| E4M3(c).to_f32().is_infinite())
            .count(),
        0
    );
}

#[test]
fn every_e5m2_code_decodes_to_the_ocp_value() {
    decode_exhaustive::<E5M2>();
    assert_eq!(E5M2(0x7B).to_f32(), 57344.0);
    assert_eq!(E5M2(0x04).to_f32(), 2f32.powi(-14));
    assert_eq!(E5M2(0x01).to_f32(), 2f32.powi(-16));
    assert_eq!(E5M2(0x7C).to_f32(), f32::INFINITY);
    assert_eq!(E5M2(0xFC).to_f32(), f32::NEG_INFINITY);
    assert_eq!((0..=255u8).filter(|&c| E5M2(c).is_nan()).count(), 6);
    // E5M2 is the top byte of an f16: its widening is f16's, NaN payloads included.
    for c in 0..=u8::MAX {
        let h = f16::from_bits((c as u16) << 8);
        assert_eq!(E5M2(c).to_f32().to_bits(), convert::widen_f16(h).to_bits());
    }
}

fn round_trip<F: Fp8Format>() {
    for c in 0..=u8::MAX {
        let x = F::from_bits(c);
        let back = F::from_f32(x.to_f32()).to_bits();
        if x.is_nan() {
            // NaN stays NaN with its sign, quiet, payload kept where the format has one.
            let expect = if F::HAS_INFINITY { c | 0x02 } else { c | 0x7F };
            assert_eq!(back, expect, "{} NaN {c:#04x}", F::NAME);
        } else if F::HAS_INFINITY && x.to_f32().is_infinite() {
            // Saturating: inf narrows to ±max.
            assert_eq!(back, (c & 0x80) | 0x7B, "{} inf {c:#04x}", F::NAME);
        } else {
            assert_eq!(back, c, "{} {c:#04x}", F::NAME);
        }
        assert_eq!(
            F::from_bf16(x.to_bf16()).to_bits(),
            back,
            "{} via bf16",
            F::NAME
        );
    }
}

#[test]
fn every_code_round_trips() {
    round_trip::<E4M3>();
    round_trip::<E5M2>();
}

fn narrowing_matches_the_f64_reference<F: Fp8Format>() {
    let inputs = boundary_inputs::<F>();
    let mut ties = 0;
    for &x in &inputs {
        let got = F::from_f32(x).to_bits();
        if x.is_nan() {
            assert!(F::from_bits(got).is_nan(), "{} {x:?}", F::NAME);
            assert_eq!(
                got & 0x80 != 0,
                x.is_sign_negative(),
                "{} NaN sign",
                F::NAME
            );
            continue;
        }
        assert_eq!(
            got,
            reference_encode::<F>(x),
            "{} {x:e} ({:#010x})",
            F::NAME,
            x.to_bits()
        );
        if finite_values::<F>()
            .windows(2)
            .any(|w| (w[0].0 + w[1].0) / 2.0 == (x as f64).abs())
        {
            ties += 1;
        }
    }
    // Every midpoint was tried, both signs.
    assert_eq!(ties, 2 * (finite_values::<F>().len() - 1), "{}", F::NAME);
}

#[test]
fn narrowing_rounds_to_nearest_even_and_saturates_on_every_boundary() {
    narrowing_matches_the_f64_reference::<E4M3>();
    narrowing_matches_the_f64_reference::<E5M2>();
}

#[test]
fn narrowing_specials() {
    // Saturation (inf included) in both formats.
    for (x, e4, e5) in [
        (f32::INFINITY, 0x7Eu8, 0x7Bu8),
        (f32::NEG_INFINITY, 0xFE, 0xFB),
        (f32::MAX, 0x7E, 0x7B),
        (448.0, 0x7E, 0x5F),
        (464.0, 0x7E, 0x5F), // E4M3: the tie above 448, would round to the NaN code's slot
        (480.0, 0x7E, 0x60), // E5M2: the tie between 448 and 512, to the even 512
        (1e6, 0x7E, 0x7B),
        (61440.0, 0x7E, 0x7B), // E5M2: the tie above 57344 (to even: would be inf)
        (-1e6, 0xFE, 0xFB),
        // Ties to even in the normal range: 1 + 1/16 (E4M3's half ulp at 1) goes down to 1,
        // 1 + 3/16 up to 1.25.
        (1.0625, 0x38, 0x3C),
        (1.1875, 0x3A, 0x3D),
        // Subnormals: E4M3's smallest is 2^-9, E5M2's 2^-16; their halves tie to zero, and
        // 1.5 × the smallest ties up to the even code 2.
        (2f32.powi(-9), 0x01, 0x18),
        (2f32.powi(-10), 0x00, 0x14),
        (3.0 * 2f32.powi(-10), 0x02, 0x1A),
        (2f32.powi(-16), 0x00, 0x01),
        (2f32.powi(-17), 0x00, 0x00),
        (3.0 * 2f32.powi(-17), 0x00, 0x02),
        // Just below the smallest normal rounds up to it.
        (f32::from_bits(2f32.powi(-6).to_bits() - 1), 0x08, 0x24),
        (f32::from_bits(2f32.powi(-14).to_bits() - 1), 0x00, 0x04),
        (-0.0, 0x80, 0x80),
        (0.0, 0x00, 0x00),
        (-f32::from_bits(1), 0x80, 0x80),
    ] {
        assert_eq!(E4M3::from_f32(x).0, e4, "E4M3 {x:e}");
        assert_eq!(E5M2::from_f32(x).0, e5, "E5M2 {x:e}");
    }
    for (x, e5) in [
        (f32::NAN, 0x7Eu8),
        (-f32::NAN, 0xFE),
        (f32::from_bits(0x7F80_0001), 0x7E), // signalling, payload only in dropped bits
        (f32::from_bits(0x7FA0_0000), 0x7F), // payload bit 21 kept
        (f32::from_bits(0xFFE0_0000), 0xFF),
    ] {
        assert_eq!(
            E4M3::from_f32(x).0,
            0x7F | (e5 & 0x80),
            "E4M3 NaN {:#010x}",
            x.to_bits()
        );
        assert_eq!(E5M2::from_f32(x).0, e5, "E5M2 NaN {:#010x}", x.to_bits());
    }
}

/// Slices at every level against the scalar reference, also on every short length from four
/// offsets (vector bodies plus each tail).
fn check_narrow<F: Fp8Format, S: Copy>(src: &[S], f: impl Fn(&[S], &mut [F]), g: impl Fn(S) -> F) {
    let mut out = vec![F::default(); src.len()];
    f(src, &mut out);
    for (i, (&s, &d)) in src.iter().zip(&out).enumerate() {
        assert_eq!(d.to_bits(), g(s).to_bits(), "{} element {i}", F::NAME);
    }
    for start in 0..4 {
        for len in 0..=40 {
            let s = &src[start..start + len];
            let mut o = vec![F::default(); len];
            f(s, &mut o);
            for (&s, &d) in s.iter().zip(&o) {
                assert_eq!(d.to_bits(), g(s).to_bits(), "{}", F::NAME);
            }
        }
    }
}

fn random_f32s(n: usize) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xF8);
    let mut v: Vec<f32> = (0..n).map(|_| f32::from_bits(rng.gen())).collect();
    // Values in and around the formats' ranges, where random bit patterns are rare.
    v.extend(
        (0..n).map(|_| rng.gen_range(-70000.0f32..70000.0) * 2f32.powi(-rng.gen_range(0..30))),
    );
    v.push(0.5);
    v
}

fn slices_match_scalar<F: Fp8Format>() {
    let mut f32_inputs = boundary_inputs::<F>();
    f32_inputs.extend(random_f32s(100_000));
    let bf16_inputs: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let f16_inputs: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let codes: Vec<F> = (0..=u8::MAX).chain(0..=100).map(F::from_bits).collect();
    at_each_level(F::NAME, || {
        check_narrow(&f32_inputs, convert::f32_to_fp8::<F>, F::from_f32);
        // Every bf16 and every f16 pattern, NaN payloads included.
        check_narrow(&bf16_inputs, convert::bf16_to_fp8::<F>, F::from_bf16);
        check_narrow(&f16_inputs, convert::f16_to_fp8::<F>, F::from_f16);
        // Widening: every code, at several offsets and lengths.
        for start in 0..4 {
            for len in [0, 1, 15, 16, 17, 33, codes.len() - start] {
                let s = &codes[start..start + len];
                let mut w = vec![0f32; len];
                let mut b = vec![bf16::ZERO; len];
                convert::fp8_to_f32(s, &mut w);
                convert::fp8_to_bf16(s, &mut b);
                for ((&c, &w), &b) in s.iter().zip(&w).zip(&b) {
                    assert_eq!(w.to_bits(), c.to_f32().to_bits(), "{} {c:?}", F::NAME);
                    assert_eq!(b.to_bits(), c.to_bf16().to_bits(), "{} {c:?}", F::NAME);
                }
            }
        }
    });
}

#[test]
fn e4m3_slices_equal_the_scalar_reference_at_every_level() {
    slices_match_scalar::<E4M3>();
}

#[test]
fn e5m2_slices_equal_the_scalar_reference_at_every_level() {
    slices_match_scalar::<E5M2>();
}

/// The bf16 and f16 sources are rounded once: the same code as their exact f32 value.
#[test]
fn sixteen_bit_sources_round_once() {
    for h in 0..=u16::MAX {
        let (b, f) = (bf16::from_bits(h), f16::from_bits(h));
        assert_eq!(E4M3::from_bf16(b), E4M3::from_f32(b.to_f32()));
        assert_eq!(E5M2::from_bf16(b), E5M2::from_f32(b.to_f32()));
        assert_eq!(E4M3::from_f16(f), E4M3::from_f32(f.to_f32()));
        assert_eq!(E5M2::from_f16(f), E5M2::from_f32(f.to_f32()));
    }
}

/// The scalar amax of the module's rule: NaN if any element is, else the largest `|x|`.
fn reference_amax(xs: impl Iterator<Item = f32>) -> f32 {
    let mut m = 0f32;
    for x in xs {
        if x.is_nan() {
            return f32::NAN;
        }
        m = m.max(x.abs());
    }
    m
}

/// `quantize_fp8` against `F(x · scale)` element by element and its amax against
/// [`reference_amax`], and `amax` alone, on `src` and on short pieces of it from four offsets
/// (vector bodies plus each tail).
fn check_quantize<F: Fp8Format, S: convert::QuantizeSource + std::fmt::Debug>(
    src: &[S],
    wide: impl Fn(S) -> f32 + Copy,
    scale: f32,
) {
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let check = |s: &[S]| {
        let mut out = vec![F::default(); s.len()];
        let m = convert::quantize_fp8(s, scale, &mut out);
        let want = reference_amax(s.iter().map(|&x| wide(x)));
        assert!(same(m, want), "{}: amax {m} against {want}", F::NAME);
        assert!(same(convert::amax(s), want), "{}: amax alone", F::NAME);
        for (i, (&x, &d)) in s.iter().zip(&out).enumerate() {
            let code = F::from_f32(wide(x) * scale);
            assert_eq!(
                d.to_bits(),
                code.to_bits(),
                "{} element {i} ({x:?})",
                F::NAME
            );
        }
    };
    check(src);
    for start in 0..4 {
        for len in 0..=40 {
            check(&src[start..start + len]);
        }
    }
}

fn quantize_matches_scalar<F: Fp8Format>() {
    // Finite values, then the same with a NaN and with an inf placed in the parallel tasks'
    // middle chunks (beyond 2^16 elements the pass is split over threads).
    let mut finite: Vec<f32> = random_f32s(70_000)
        .into_iter()
        .filter(|x| x.is_finite())
        .collect();
    finite.truncate(140_000);
    let mut with_inf = finite.clone();
    with_inf[100_003] = f32::NEG_INFINITY;
    let mut with_nan = with_inf.clone();
    with_nan[77_777] = f32::NAN;
    let bf16_inputs: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let f16_inputs: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    at_each_level(F::NAME, || {
        for scale in [1.0f32, 3.5e-3, 448.0 / 3.0] {
            check_quantize::<F, f32>(&finite, |x| x, scale);
            check_quantize::<F, f32>(&with_inf, |x| x, scale);
            check_quantize::<F, f32>(&with_nan, |x| x, scale);
            // Every bf16 and f16 pattern (NaNs included), and their finite ones alone.
            check_quantize::<F, bf16>(&bf16_inputs, |x| x.to_f32(), scale);
            check_quantize::<F, f16>(&f16_inputs, |x| x.to_f32(), scale);
            let finite_bf16: Vec<bf16> = bf16_inputs
                .iter()
                .copied()
                .filter(|x| x.is_finite())
                .collect();
            check_quantize::<F, bf16>(&finite_bf16, |x| x.to_f32(), scale);
        }
    });
}

#[test]
fn e4m3_quantisation_and_amax_equal_the_scalar_reference_at_every_level() {
    quantize_matches_scalar::<E4M3>();
}

#[test]
fn e5m2_quantisation_and_amax_equal_the_scalar_reference_at_every_level() {
    quantize_matches_scalar::<E5M2>();
}
