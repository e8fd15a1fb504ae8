//! Dropout's mask: a counter-based draw per element (the `(i + 1)`-th output of SplitMix64
//! seeded with the op's seed), so that any element's draw is computed on its own: in parallel
//! pieces, again in the backward pass, and on the GPU by the same formula (the vendored dfdx's
//! `dropout.cu`), so that the CPU's and CUDA's masks agree for a seed.
//!
//! [`mask_scale`] applies the mask to a run of f32 values. The draw is three 64-bit
//! multiplications per element; the scalar loop runs them one element at a time, and on the
//! baby GPT (13 dropouts over 6.3 M elements a step, forward and backward) that was 8% of an
//! O2-BF16 step's samples on an AVX-512 Xeon (`perf record` of the step bench). The same loop
//! compiled for AVX-512 (with DQ's `vpmullq`) draws eight elements at a time; integer
//! arithmetic, so every build draws the same mask.

/// Whether element `i` is dropped: the `(i + 1)`-th output of SplitMix64 seeded with `seed` is
/// below `threshold` (`p · 2⁶⁴` for a drop probability `p`, rand_distr's `Bernoulli`
/// threshold; `u64::MAX` drops everything).
#[inline(always)]
pub fn drops(seed: u64, threshold: u64, i: u64) -> bool {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    threshold == u64::MAX || z < threshold
}

/// `v[j] = 0` where element `first + j` is dropped ([`drops`]), else `v[j] · scale`, in f32.
pub fn mask_scale(seed: u64, threshold: u64, scale: f32, first: u64, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::level::level() >= crate::level::Level::Avx512
        && std::is_x86_feature_detected!("avx512dq")
    {
        #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2")]
        fn widest(seed: u64, threshold: u64, scale: f32, first: u64, v: &mut [f32]) {
            mask_scale_loop(seed, threshold, scale, first, v)
        }
        // SAFETY: the level is at least AVX-512 (F, BW, VL, only detected or forced on a CPU
        // with them) and DQ was detected above.
        return unsafe { widest(seed, threshold, scale, first, v) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::level::level() >= crate::level::Level::Avx2 {
        #[target_feature(enable = "avx2,fma")]
        fn wide(seed: u64, threshold: u64, scale: f32, first: u64, v: &mut [f32]) {
            mask_scale_loop(seed, threshold, scale, first, v)
        }
        // SAFETY: the level is at least AVX2, which is only detected (or forced) on a CPU
        // with AVX2 and FMA.
        return unsafe { wide(seed, threshold, scale, first, v) };
    }
    mask_scale_loop(seed, threshold, scale, first, v)
}

/// [`mask_scale`]'s loop, written for the vectoriser: a select, no branch.
#[inline(always)]
fn mask_scale_loop(seed: u64, threshold: u64, scale: f32, first: u64, v: &mut [f32]) {
    for (j, x) in v.iter_mut().enumerate() {
        let kept = *x * scale;
        *x = if drops(seed, threshold, first.wrapping_add(j as u64)) {
            0.0
        } else {
            kept
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64's first outputs for state 0 (Vigna's `splitmix64.c`): the draw is that
    /// generator, as `dropout.cu` computes it.
    #[test]
    fn the_draw_is_splitmix64() {
        // The first output from state 0 is 0xE220A8397B1DCDAF: dropped under a threshold just
        // above it, kept at it.
        assert!(drops(0, 0xE220_A839_7B1D_CDB0, 0));
        assert!(!drops(0, 0xE220_A839_7B1D_CDAF, 0));
        // The second, 0x6E789E6AA1B965F4.
        assert!(drops(0, 0x6E78_9E6A_A1B9_65F5, 1));
        assert!(!drops(0, 0x6E78_9E6A_A1B9_65F4, 1));
    }
}
