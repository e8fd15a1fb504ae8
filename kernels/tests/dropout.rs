//! `dropout::mask_scale` at every instruction-set level against the scalar draw.

mod common;

use common::at_every_level;
use typed_amp_kernels::dropout::{drops, mask_scale};

/// Every level draws the scalar formula's mask and scales kept elements alike (the same bits),
/// for probabilities at both ends and between, offsets past 2³² and at the end of the
/// counter's range, and lengths that leave a tail after the vectors.
#[test]
fn every_level_draws_the_scalar_mask() {
    at_every_level("every_level_draws_the_scalar_mask", || {
        // Drop probabilities 0, 0.2, 0.5, 0.9 and 1 as thresholds (p · 2⁶⁴).
        for (prob, threshold) in [
            (0.0, 0),
            (0.2, 0x3333_3333_3333_3400),
            (0.5, 1 << 63),
            (0.9, 0xE666_6666_6666_6800),
            (1.0, u64::MAX),
        ] {
            for (first, len) in [(0u64, 37usize), (1 << 33, 1000), (u64::MAX - 5, 9)] {
                let xs: Vec<f32> = (0..len).map(|i| i as f32 * 0.37 - 3.0).collect();
                let mut got = xs.clone();
                mask_scale(42, threshold, 1.25, first, &mut got);
                let mut kept = 0;
                for (j, (&x, &g)) in xs.iter().zip(&got).enumerate() {
                    let dropped = drops(42, threshold, first.wrapping_add(j as u64));
                    kept += usize::from(!dropped);
                    let want = if dropped { 0.0 } else { x * 1.25 };
                    assert_eq!(g.to_bits(), want.to_bits(), "p {prob} element {j}");
                }
                match prob {
                    0.0 => assert_eq!(kept, len),
                    1.0 => assert_eq!(kept, 0),
                    // A thousand draws at p = 0.5 keep about half (binomial sd ≈ 16).
                    0.5 if len == 1000 => assert!((400..600).contains(&kept), "{kept}"),
                    _ => {}
                }
            }
        }
    });
}
