//! Slice conversions, bit for bit against `half`'s scalar conversions, at every level.

use std::sync::Mutex;

use half::{bf16, f16};
use typed_amp_kernels::convert;
use typed_amp_kernels::{detected_level, force_level, Level};

static LOCK: Mutex<()> = Mutex::new(());

fn at_each_level(name: &str, mut f: impl FnMut()) {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut ran = Vec::new();
    for lvl in Level::ALL {
        if lvl <= detected_level() {
            assert_eq!(force_level(Some(lvl)), lvl);
            f();
            ran.push(lvl.name());
        }
    }
    force_level(None);
    println!("{name}: ran levels {ran:?}");
}

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
    let mut bits = 0u64;
    while bits <= u32::MAX as u64 {
        v.push(f32::from_bits(bits as u32));
        bits += 4093;
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
/// offsets and short lengths that live entirely in the tails.
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
    for (start, len) in [(1, 0), (3, 1), (5, 7), (7, 15), (9, 17), (11, 33)] {
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
