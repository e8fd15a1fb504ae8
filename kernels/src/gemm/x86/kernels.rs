//! The AVX-512, AVX2 and AVX-512-BF16 micro-kernels and their tables.

use std::arch::x86_64::*;

use crate::gemm::{kernel_table, rows_kernel_table, KernFn, RowsKernFn};

/// Writes (or, with `load`, adds into what is there) a kernel's `M × NV` accumulators to `M`
/// rows of `NV` vectors at `dst`, rows `dst_rs` f32 apart: the last step of every AVX-512 kernel.
///
/// Inlined into each kernel (which is compiled for AVX-512F), so that the sums go from their
/// registers to C: called out of line, each kernel spilled its 24 sums to the stack (after
/// zero-filling that array with `memset` at entry) for this function to load them again,
/// 2.8% of the small GPT's O0 step (`perf record` on an AVX-512 Xeon).
///
/// # Safety
/// `dst` writable (and readable with `load`) for `M` rows of `NV · 16` f32, `dst_rs` apart; the
/// CPU has AVX-512F (the caller is compiled for it).
#[inline(always)]
unsafe fn write_tile_avx512<const M: usize, const NV: usize>(
    acc: &[[__m512; NV]; M],
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the stores (and loads) stay inside the `M × NV·16` block the contract provides.
    unsafe {
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (v, &x) in row.iter().enumerate() {
                let d = d.add(v * 16);
                let x = if load {
                    _mm512_add_ps(_mm512_loadu_ps(d), x)
                } else {
                    x
                };
                _mm512_storeu_ps(d, x);
            }
        }
    }
}

/// [`write_tile_avx512`] for the AVX2 kernels' eight-lane vectors.
///
/// # Safety
/// As [`write_tile_avx512`], with `NV · 8` f32 a row; the CPU has AVX2 (the caller is compiled
/// for it).
#[inline(always)]
unsafe fn write_tile_avx2<const M: usize, const NV: usize>(
    acc: &[[__m256; NV]; M],
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the stores (and loads) stay inside the `M × NV·8` block the contract provides.
    unsafe {
        for (i, row) in acc.iter().enumerate() {
            let d = dst.offset(i as isize * dst_rs);
            for (v, &x) in row.iter().enumerate() {
                let d = d.add(v * 8);
                let x = if load {
                    _mm256_add_ps(_mm256_loadu_ps(d), x)
                } else {
                    x
                };
                _mm256_storeu_ps(d, x);
            }
        }
    }
}

/// Where each of a rows kernel's `M` rows of A starts: `a + i·a_rs` bytes, as `T` pointers.
/// Forming the pointers reads nothing; the kernel's contract says what may be read from them.
fn row_starts<T, const M: usize>(a: *const f32, a_rs: isize) -> [*const T; M] {
    std::array::from_fn(|i| (a as *const u8).wrapping_offset(i as isize * a_rs) as *const T)
}

/// An f32 micro-kernel that reads A's rows in place (a [`RowsKernFn`]), for one instruction
/// set: its target features, B panel width, lanes per vector, intrinsics and tile writer.
macro_rules! f32_rows_kernel {
    (
        $(#[$doc:meta])*
        $name:ident, $features:literal, $nr:expr, $lanes:literal,
        $zero:ident, $loadu:ident, $set1:ident, $fmadd:ident, $write:ident
    ) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        unsafe fn $name<const M: usize, const NV: usize>(
            kc: usize,
            a: *const f32,
            a_rs: isize,
            b: *const f32,
            dst: *mut f32,
            dst_rs: isize,
            load: bool,
        ) {
            // SAFETY: the loads read `kc` f32 of each of the `M` rows and `kc` steps of the
            // packed B panel, and the stores write `M` rows of `NV` vectors at `dst`, all inside
            // what the contract provides. Unaligned f32 loads are allowed on x86.
            unsafe {
                let rows: [*const f32; M] = row_starts(a, a_rs);
                let mut b = b;
                let mut acc = [[$zero(); NV]; M];
                for p in 0..kc {
                    let mut bv = [$zero(); NV];
                    for (v, x) in bv.iter_mut().enumerate() {
                        *x = $loadu(b.add(v * $lanes));
                    }
                    for (row, r) in acc.iter_mut().zip(rows.iter()) {
                        let av = $set1(r.add(p).read_unaligned());
                        for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                            *x = $fmadd(av, bx, *x);
                        }
                    }
                    b = b.add($nr);
                }
                $write(&acc, dst, dst_rs, load);
            }
        }
    };
}

// AVX-512 f32: a 12 × 32 tile is 24 zmm accumulators, plus 2 for the B row and the broadcast
// A element folded into the FMA's memory operand: 26 of the 32 registers, no spills. Per k step
// it issues 24 FMAs against 14 loads, so the two FMA ports, not the load ports, set the pace.
const MR512: usize = 12;
const NR512: usize = 32;

/// # Safety
/// As [`KernFn`]; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn kernel_avx512<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; M];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add(v * 16));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(i));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm512_fmadd_ps(av, bx, *x);
                }
            }
            a = a.add(MR512);
            b = b.add(NR512);
        }
        write_tile_avx512(&acc, dst, dst_rs, load);
    }
}

pub(in crate::gemm) static KERNELS_AVX512: [[KernFn; 2]; MR512] =
    kernel_table!(kernel_avx512; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

f32_rows_kernel!(
    /// [`kernel_avx512`] reading an f32 A's rows in place: row `i`'s element `p` is the f32 at
    /// byte `a + i·a_rs + 4p`, broadcast as its packed copy would be. Same instructions on the
    /// same values in the same order, so the same bits. On a transformer's FP32 products (k of
    /// 128 to 512, a few B panels per A panel) packing A was as long as a third of the products'
    /// own multiply-adds: `pack_transpose_avx512` 4.7% of the small GPT's O0 step on an Intel
    /// AMX core.
    ///
    /// # Safety
    /// As [`RowsKernFn`] (`a + i·a_rs` readable for `kc` f32 for `i < M`); the CPU has
    /// AVX-512F.
    rows_kernel_avx512, "avx512f", NR512, 16,
    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps, write_tile_avx512
);

pub(in crate::gemm) static ROWS_KERNELS_AVX512: [[RowsKernFn; 2]; MR512] =
    rows_kernel_table!(rows_kernel_avx512; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

// AVX2: the classic 6 × 16 tile, 12 ymm accumulators of 16.
const MR256: usize = 6;
const NR256: usize = 16;

/// # Safety
/// As [`KernFn`]; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2<const M: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NV]; M];
        let (mut a, mut b) = (a, b);
        for _ in 0..kc {
            let mut bv = [_mm256_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(b.add(v * 8));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*a.add(i));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm256_fmadd_ps(av, bx, *x);
                }
            }
            a = a.add(MR256);
            b = b.add(NR256);
        }
        write_tile_avx2(&acc, dst, dst_rs, load);
    }
}

pub(in crate::gemm) static KERNELS_AVX2: [[KernFn; 2]; MR256] =
    kernel_table!(kernel_avx2; 1, 2, 3, 4, 5, 6);

f32_rows_kernel!(
    /// [`kernel_avx2`] reading an f32 A's rows in place: row `i`'s element `p` is the f32 at
    /// byte `a + i·a_rs + 4p`, broadcast as its packed copy would be. Same instructions on the
    /// same values in the same order, so the same bits; what it saves is the copy (on a
    /// transformer's products, k of 128 to 1536 and a few B panels per A panel, packing A took
    /// a tenth of the step on AVX2: `pack_transpose` in `perf`).
    ///
    /// # Safety
    /// As [`RowsKernFn`] (`a + i·a_rs` readable for `kc` f32 for `i < M`); the CPU has AVX2
    /// and FMA.
    rows_kernel_avx2, "avx2,fma", NR256, 8,
    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_fmadd_ps, write_tile_avx2
);

pub(in crate::gemm) static ROWS_KERNELS_AVX2: [[RowsKernFn; 2]; MR256] =
    rows_kernel_table!(rows_kernel_avx2; 1, 2, 3, 4, 5, 6);

// AVX512-BF16: the same 12 × 32 tile, but each packed slot is a (k, k+1) bf16 pair and one
// `vdpbf16ps` does two k steps per lane. Products of two bf16 are exact in f32; the instruction
// adds them with round-to-nearest-even but flushes subnormal inputs and outputs to zero, unlike
// the f32 kernels (the tests' tolerance carries an absolute term for that).
/// # Safety
/// As [`KernFn`] (with `kc` counting k pairs); the CPU has AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_avx512_bf16<const M: usize, const NV: usize>(
    kp: usize,
    a: *const f32,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kc` steps of the packed panels and the stores write `M` rows of
    // `NV` vectors at `dst`, all inside what the contract provides.
    // The transmutes reinterpret 512-bit integer vectors as `__m512bh`, the same size and
    // any bit pattern valid.
    unsafe {
        let (mut a, mut b) = (a as *const i32, b as *const i32);
        let mut acc = [[_mm512_setzero_ps(); NV]; M];
        for _ in 0..kp {
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(b.add(v * 16) as *const _);
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i)));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bx));
                }
            }
            a = a.add(MR512);
            b = b.add(NR512);
        }
        write_tile_avx512(&acc, dst, dst_rs, load);
    }
}

pub(in crate::gemm) static KERNELS_AVX512_BF16: [[KernFn; 2]; MR512] =
    kernel_table!(kernel_avx512_bf16; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);

/// [`kernel_avx512_bf16`] reading A's rows in place: row `i`'s pair `p` is the 32-bit slot at
/// byte `a + i·a_rs + 4p`, broadcast as the packed slot would be. Same instructions on the
/// same pairs, so the same bits.
///
/// # Safety
/// As [`RowsKernFn`] (with `kc` counting k pairs); the CPU has AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows_kernel_avx512_bf16<const M: usize, const NV: usize>(
    kp: usize,
    a: *const f32,
    a_rs: isize,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
) {
    // SAFETY: the loads read `kp` pairs of each of the `M` rows and `kp` steps of the packed
    // B panel, and the stores write `M` rows of `NV` vectors at `dst`, all inside what the
    // contract provides. Unaligned 32-bit loads are allowed on x86. The transmutes reinterpret
    // 512-bit integer vectors as `__m512bh`, the same size and any bit pattern valid.
    unsafe {
        let rows: [*const i32; M] = row_starts(a, a_rs);
        let mut b = b as *const i32;
        let mut acc = [[_mm512_setzero_ps(); NV]; M];
        for p in 0..kp {
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(b.add(v * 16) as *const _);
            }
            for (row, r) in acc.iter_mut().zip(rows.iter()) {
                let av: __m512bh =
                    std::mem::transmute(_mm512_set1_epi32(r.add(p).read_unaligned()));
                for (x, &bx) in row.iter_mut().zip(bv.iter()) {
                    *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bx));
                }
            }
            b = b.add(NR512);
        }
        write_tile_avx512(&acc, dst, dst_rs, load);
    }
}

pub(in crate::gemm) static ROWS_KERNELS_AVX512_BF16: [[RowsKernFn; 2]; MR512] =
    rows_kernel_table!(rows_kernel_avx512_bf16; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
