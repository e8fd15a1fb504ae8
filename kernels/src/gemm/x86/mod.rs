//! x86-64 micro-kernels and packing, each compiled for its own instruction set with
//! `#[target_feature]` and only called after run-time detection (see `Arch::select`).

mod kernels;
mod lanes;
mod pack;
mod store;
mod tiles;

pub(super) use kernels::{
    KERNELS_AVX2, KERNELS_AVX512, KERNELS_AVX512_BF16, ROWS_KERNELS_AVX2, ROWS_KERNELS_AVX512,
    ROWS_KERNELS_AVX512_BF16,
};
pub(super) use pack::{
    pack_pairs_rows_avx512, pack_pairs_rows_fp8_avx512, pack_pairs_transpose_avx512,
    pack_pairs_transpose_fp8_avx512, pack_rows_avx512, pack_transpose_avx512,
};
pub(super) use store::{store_cols_avx512, store_rows_avx512, tile_non_finite_avx512};
pub(super) use tiles::{pairs_to_rows, KERNELS_AMX, ROWS_KERNELS_AMX};

#[cfg(test)]
mod tests {
    use super::lanes::{load16, load16_masked};
    use crate::gemm::Kind;
    use crate::level::{detected_level, Level};
    use std::arch::x86_64::*;

    /// The widening the packing and the C_old loads do in registers gives the bits of the
    /// crate's conversions for all 65,536 patterns of both formats.
    #[test]
    fn in_register_widening_follows_the_conversion_rule() {
        if detected_level() < Level::Avx512 {
            println!("in_register_widening_follows_the_conversion_rule: no AVX-512, skipped");
            return;
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for kind in [Kind::F16, Kind::Bf16] {
            for chunk in all.chunks(16) {
                let want: Vec<u32> = chunk
                    .iter()
                    .map(|&h| match kind {
                        Kind::F16 => crate::convert::widen_f16(half::f16::from_bits(h)),
                        _ => crate::convert::widen_bf16(half::bf16::from_bits(h)),
                    })
                    .map(f32::to_bits)
                    .collect();
                let mut got = [0u32; 16];
                let mut got_masked = [0u32; 16];
                // SAFETY: 16 readable u16 at the chunk (65,536 is a multiple of 16), 16
                // writable u32 in each array; the CPU has AVX-512F/BW/VL (checked above).
                unsafe {
                    let p = chunk.as_ptr() as *const u8;
                    _mm512_storeu_ps(got.as_mut_ptr() as *mut f32, load16(kind, p));
                    let v = load16_masked(kind, p, 0x7FFF);
                    _mm512_storeu_ps(got_masked.as_mut_ptr() as *mut f32, v);
                }
                assert_eq!(&got[..], &want[..], "{kind:?} at {:#06x}", chunk[0]);
                assert_eq!(&got_masked[..15], &want[..15], "{kind:?} masked");
                assert_eq!(got_masked[15], 0, "masked-off lane is zero");
            }
        }
    }
}
