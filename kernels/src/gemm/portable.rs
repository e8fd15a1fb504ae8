//! Portable kernels: plain loops over fixed-size arrays, which the compiler keeps in vector
//! registers for whatever the build target offers (SSE2 on x86-64, NEON on aarch64); and the
//! bf16 pair-emulation kernels.

use super::tile::KernFn;

pub(super) const PORTABLE_MR: usize = 4;
pub(super) const PORTABLE_NR: usize = 8;

/// # Safety
/// As [`KernFn`], with `MR = 4`, `NR = 8`.
pub(super) unsafe fn portable_kernel<const M: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows at
    // `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[0.0f32; PORTABLE_NR]; M];
        for p in 0..kc {
            let bv: [f32; PORTABLE_NR] = *(b.add(p * PORTABLE_NR) as *const [f32; PORTABLE_NR]);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = *a.add(p * PORTABLE_MR + i);
                for (x, &bj) in row.iter_mut().zip(bv.iter()) {
                    // mul_add would be a libm call where the target has no FMA.
                    *x += av * bj;
                }
            }
        }
        store_acc(&acc, dst, dst_rs, load);
    }
}

/// # Safety
/// `dst` writable (and readable with `load`) for `M` rows of `W` f32, `dst_rs` apart.
#[inline(always)]
pub(super) unsafe fn store_acc<const M: usize, const W: usize>(
    acc: &[[f32; W]; M],
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the contract.
    unsafe {
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (j, &x) in row.iter().enumerate() {
                *d.add(j) = if load { *d.add(j) + x } else { x };
            }
        }
    }
}

macro_rules! kernel_table {
    ($f:ident; $($m:literal),*) => {
        [$([$f::<$m, 1> as KernFn, $f::<$m, 2> as KernFn]),*]
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use kernel_table;

/// # Safety
/// As [`KernFn`], with `MR = 4`, `NR = 8`.
pub(super) unsafe fn portable_kernel_nv<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the same contract as `portable_kernel`'s.
    unsafe { portable_kernel::<M>(kc, a, b, dst, dst_rs, load) }
}

pub(super) static PORTABLE_KERNELS: [[KernFn; 2]; PORTABLE_MR] =
    kernel_table!(portable_kernel_nv; 1, 2, 3, 4);

/// Scalar stand-in for the `vdpbf16ps` kernel, on the same pair-packed panels (12 × 32).
///
/// # Safety
/// As [`KernFn`] (`kc` counting k pairs), with `MR = 12`, `NR = 32`.
pub(super) unsafe fn pair_emulation_kernel<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows at
    // `dst`, all inside what the contract provides.
    unsafe {
        let (a, b) = (a as *const u32, b as *const u32);
        let mut acc = [[0.0f32; 32]; M];
        let lo = |x: u32| f32::from_bits(x << 16);
        let hi = |x: u32| f32::from_bits(x & 0xFFFF_0000);
        for p in 0..kc {
            for (i, row) in acc.iter_mut().enumerate() {
                let av = *a.add(p * 12 + i);
                for (j, x) in row.iter_mut().enumerate().take(NV * 16) {
                    let bv = *b.add(p * 32 + j);
                    // The order Intel documents for vdpbf16ps: odd element first.
                    *x += hi(av) * hi(bv);
                    *x += lo(av) * lo(bv);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (j, &x) in row.iter().enumerate().take(NV * 16) {
                *d.add(j) = if load { *d.add(j) + x } else { x };
            }
        }
    }
}

pub(super) static PAIR_EMULATION_KERNELS: [[KernFn; 2]; 12] =
    kernel_table!(pair_emulation_kernel; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
