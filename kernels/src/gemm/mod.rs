//! Blocked matrix products in the style of BLIS / Goto: pack a block of B and a block of A into
//! contiguous micro-panels (widening 16-bit and FP8 inputs on the way), then sweep an `MR × NR`
//! register-blocked micro-kernel over them; products too small for packing to pay (attention's
//! per-head products) skip it (`small.rs`). On the bf16-pair path a row-major A is not packed
//! at all: its (k, k+1) pairs already lie side by side, and the micro-kernel reads its rows in
//! place (`arch::RowsKernFn`). Where the CPU has AMX, bf16 products run on its tiles
//! (`x86/tiles.rs`) over the same B panels, A's panels laid out row by row. Every finished f32
//! tile goes through one store routine (`store.rs`), which applies the [`Epilogue`] and rounds
//! once into C.

mod arch;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod driver;
mod elem;
mod entry;
mod fp8_entry;
mod k_pieces;
mod pack;
mod packed_b;
mod portable;
mod problem;
mod small;
mod store;
mod tile;
mod tile_run;
mod types;
mod whole_panels;
#[cfg(target_arch = "x86_64")]
mod x86;

// What the packing, storing and x86 files reach through `super::`.
use arch::Arch;
#[cfg(target_arch = "x86_64")]
use portable::kernel_table;
#[cfg(target_arch = "x86_64")]
use portable::rows_kernel_table;
use tile::{KernFn, RowsKernFn, TILE_MR, TILE_NR};

pub use arch::set_a_rows_in_place;
pub use entry::{
    gemm, gemm_epilogue, gemm_epilogue_slices, gemm_epilogue_uninit, gemm_slices,
    set_bf16_pair_emulation,
};
pub use fp8_entry::gemm_fp8_epilogue;
pub use k_pieces::set_k_halves;
pub use packed_b::{gemm_packed_b, PackedB};
pub use small::set_small_products;
use types::Kind;
pub use types::{Activation, Epilogue, GemmElem, GemmOut, GemmReport, MatMut, MatRef};

#[cfg(test)]
mod tests {
    use super::entry::*;
    use super::*;
    use crate::level::detected_level;
    use crate::level::Level;
    use half::bf16;

    /// Held by the tests below while they run: the pair emulation is a process-wide switch,
    /// and a bf16 product that straddles its toggling (on a CPU without AVX512-BF16) is run by
    /// two different paths.
    static EMULATION: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The vector pair packing changes where bits are copied, never the arithmetic: whole bf16
    /// products must come out bit for bit as with the scalar packing, for every layout.
    #[test]
    fn pair_packing_vector_and_scalar_products_identical() {
        let _guard = EMULATION.lock().unwrap_or_else(|e| e.into_inner());
        let emulate = detected_level() < Level::Avx512Bf16;
        if emulate {
            set_bf16_pair_emulation(true);
        }
        let shapes = [
            (256, 512, 784),
            (256, 10, 512),
            (784, 512, 256),
            (37, 45, 300),
            (13, 33, 1025),
            (1, 17, 5),
            (19, 1, 4),
            (5, 7, 1),
        ];
        let mut seed = 1u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            bf16::from_f32((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
        };
        for (m, n, k) in shapes {
            let a: Vec<bf16> = (0..m * k).map(|_| next()).collect();
            let b: Vec<bf16> = (0..k * n).map(|_| next()).collect();
            let c0: Vec<bf16> = (0..m * n).map(|_| next()).collect();
            for (a_rs, a_cs) in [(k, 1), (1, m)] {
                for (b_rs, b_cs) in [(n, 1), (1, k)] {
                    for (c_rs, c_cs) in [(n, 1), (1, m)] {
                        for accumulate in [false, true] {
                            let product = |scalar: bool| {
                                pack::SCALAR_PAIRS.with(|f| f.set(scalar));
                                let mut c = c0.clone();
                                // SAFETY: the strides address m × k, k × n and m × n views of
                                // vectors of exactly that size; C is a distinct vector. One
                                // thread, so the flag above (thread-local) applies throughout.
                                unsafe {
                                    gemm(
                                        m,
                                        n,
                                        k,
                                        a.as_ptr(),
                                        a_rs as isize,
                                        a_cs as isize,
                                        b.as_ptr(),
                                        b_rs as isize,
                                        b_cs as isize,
                                        c.as_mut_ptr(),
                                        c_rs as isize,
                                        c_cs as isize,
                                        accumulate,
                                        1,
                                    )
                                };
                                pack::SCALAR_PAIRS.with(|f| f.set(false));
                                c.iter().map(|x| x.to_bits()).collect::<Vec<u16>>()
                            };
                            assert_eq!(
                                product(true),
                                product(false),
                                "m {m} n {n} k {k} A ({a_rs},{a_cs}) B ({b_rs},{b_cs}) \
                                 C ({c_rs},{c_cs}) acc {accumulate}"
                            );
                        }
                    }
                }
            }
        }
        if emulate {
            set_bf16_pair_emulation(false);
        }
    }

    /// Packing every panel once (`whole_panels::serial`) reorders the loops, never a
    /// sum: its products must be bit for bit those of the blocked loops, for every element
    /// type, operand layout and store (a 16-bit or f32 C, with and without the epilogue), on
    /// shapes of several row, column and k blocks, odd ones included.
    #[test]
    fn whole_panel_packing_gives_the_blocked_loops_bits() {
        let _guard = EMULATION.lock().unwrap_or_else(|e| e.into_inner());
        use half::f16;
        fn products<T: GemmElem + GemmOut<T>>(from: fn(f32) -> T, bits: fn(T) -> u32)
        where
            f32: GemmOut<T>,
        {
            let mut seed = 7u32;
            let mut next = move || {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            };
            for (m, n, k) in [(500, 800, 600), (487, 801, 601), (13, 1601, 40)] {
                let a: Vec<T> = (0..m * k).map(|_| from(next())).collect();
                let b: Vec<T> = (0..k * n).map(|_| from(next())).collect();
                let c0: Vec<T> = (0..m * n).map(|_| from(next())).collect();
                let c0_f32: Vec<f32> = (0..m * n).map(|_| next()).collect();
                let bias: Vec<f32> = (0..n).map(|_| next()).collect();
                for (a_rs, a_cs) in [(k, 1), (1, m)] {
                    for (b_rs, b_cs) in [(n, 1), (1, k)] {
                        let a = MatRef {
                            data: &a,
                            rows: m,
                            cols: k,
                            rs: a_rs,
                            cs: a_cs,
                        };
                        let b = MatRef {
                            data: &b,
                            rows: k,
                            cols: n,
                            rs: b_rs,
                            cs: b_cs,
                        };
                        let run = |whole: bool| {
                            whole_panels::WHOLE_PANELS_OFF.with(|f| f.set(!whole));
                            let mut legacy = c0.clone();
                            gemm_slices(a, b, &mut legacy, n, 1, true, 1);
                            let mut epi16 = c0.clone();
                            let epi = Epilogue {
                                alpha: 0.5,
                                accumulate: true,
                                bias: Some(&bias),
                                activation: Activation::Relu,
                                report_non_finite: true,
                            };
                            let c = MatMut {
                                data: &mut epi16,
                                rows: m,
                                cols: n,
                                rs: 1,
                                cs: m,
                            };
                            let r16 = gemm_epilogue_slices(a, b, c, &epi, 1);
                            let mut epi32 = c0_f32.clone();
                            let c = MatMut {
                                data: &mut epi32,
                                rows: m,
                                cols: n,
                                rs: n,
                                cs: 1,
                            };
                            let r32 = gemm_epilogue_slices(a, b, c, &Epilogue::ACCUMULATE, 1);
                            whole_panels::WHOLE_PANELS_OFF.with(|f| f.set(false));
                            let mut out: Vec<u32> = legacy.into_iter().map(bits).collect();
                            out.extend(epi16.into_iter().map(bits));
                            out.extend(epi32.into_iter().map(f32::to_bits));
                            (out, r16.non_finite, r32.non_finite)
                        };
                        assert!(
                            run(true) == run(false),
                            "m {m} n {n} k {k} A ({a_rs},{a_cs}) B ({b_rs},{b_cs})"
                        );
                    }
                }
            }
        }
        products::<f32>(|x| x, f32::to_bits);
        products::<f16>(f16::from_f32, |x| x.to_bits() as u32);
        products::<bf16>(bf16::from_f32, |x| x.to_bits() as u32);
    }
}
