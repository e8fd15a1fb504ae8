//! One instruction-set path (`Arch`): its block sizes and micro-kernels, chosen by element kind
//! and CPU level.
use std::sync::atomic::{AtomicBool, Ordering};

use crate::level::Level;

use super::portable::{PAIR_EMULATION_KERNELS, PAIR_EMULATION_ROWS_KERNELS, PORTABLE_KERNELS};
use super::problem::Problem;
use super::tile::{KernFn, Micro, RowsKernFn};
use super::types::Kind;

/// Whether bf16 products on a CPU without AVX512-BF16 run the bf16-pair packing with a scalar
/// stand-in for `vdpbf16ps` ([`set_bf16_pair_emulation`](super::set_bf16_pair_emulation)).
pub(super) static BF16_PAIR_EMULATION: AtomicBool = AtomicBool::new(false);

/// One instruction-set path: block sizes and kernels.
pub(super) struct Arch {
    pub(super) level: Level,
    /// Rows of the micro-tile.
    pub(super) mr: usize,
    /// f32 lanes in a vector.
    pub(super) vw: usize,
    /// Vectors across the micro-tile (`NR = nvmax · vw`).
    pub(super) nvmax: usize,
    /// k depth of a packed block (even for the pair path).
    pub(super) kc: usize,
    /// Rows of A packed at once (a multiple of `mr`); the A block lives in L3.
    pub(super) mc: usize,
    /// Columns of B packed at once (a multiple of `nr`); `kc × nc` f32 is sized to stay in L2
    /// while each A micro-panel sweeps across it.
    pub(super) nc: usize,
    /// bf16 packed as (k, k+1) pairs for `vdpbf16ps` (and AMX's `tdpbf16ps`).
    pub(super) pairs: bool,
    /// A's micro-panels packed row by row, each row's k pairs contiguous (AMX's tile loads),
    /// instead of k step by k step.
    pub(super) a_tile_rows: bool,
    /// `kernels[M - 1][NV - 1]`.
    pub(super) kernels: &'static [[KernFn; 2]],
    /// The same, reading A's rows in place ([`RowsKernFn`]): the pair path only.
    pub(super) rows_kernels: Option<&'static [[RowsKernFn; 2]]>,
}

impl Arch {
    pub(super) fn nr(&self) -> usize {
        self.nvmax * self.vw
    }

    /// The unit k blocks are made of: a k step (a pair on the pair paths), or on AMX's path
    /// one of its 32-deep tile steps, so that only the last block of a `k` that is not a
    /// multiple of 32 has a tail to pad.
    pub(super) fn k_unit(&self) -> usize {
        match (self.a_tile_rows, self.pairs) {
            (true, _) => 32,
            (false, true) => 2,
            (false, false) => 1,
        }
    }

    /// Where A's rows can be read in place (a path with rows kernels: the bf16-pair path and
    /// the AVX-512 and AVX2 f32 paths; A stored in the product's own type, not FP8 or a 16-bit A to widen;
    /// A's k stride 1; on the pair path k even so that no pair reaches past a row's end), the
    /// distance between them in bytes; else `None` (pack A).
    ///
    /// Packing A cost as much as the products themselves on a transformer's products (k of 64
    /// or 128, one pass of each packed A micro-panel over a few B panels): 7.5% of the ViT's
    /// O2-BF16 step, in `pack_pairs_transpose`; on AVX2, 4-6% of the GPTs' FP32 steps.
    pub(super) fn a_rows(&self, p: &Problem) -> Option<isize> {
        (self.rows_kernels.is_some()
            && p.a_kind == p.kind
            && p.a_cs == 1
            && (!self.pairs || p.k.is_multiple_of(2))
            && (self.a_tile_rows || !crowds_l1_set(p.a_rs * p.kind.size(), self.mr))
            && !rows_off())
        .then(|| p.a_rs * p.kind.size())
    }

    /// The micro-kernel for an `mrr`-row tile of `nv` vectors: packed, or with `a_rows` (from
    /// [`Arch::a_rows`]) reading A's rows.
    pub(super) fn micro(&self, a_rows: Option<isize>, mrr: usize, nv: usize) -> Micro {
        match (a_rows, self.rows_kernels) {
            (Some(a_rs), Some(rows)) => Micro::Rows(rows[mrr - 1][nv - 1], a_rs),
            _ => Micro::Packed(self.kernels[mrr - 1][nv - 1]),
        }
    }

    pub(super) fn select(kind: Kind, lvl: Level) -> Arch {
        let pair_emulation = BF16_PAIR_EMULATION.load(Ordering::Relaxed);
        #[cfg(target_arch = "x86_64")]
        {
            if kind == Kind::Bf16 && lvl >= Level::Avx512Bf16 {
                let pairs = Arch {
                    level: lvl,
                    mr: 12,
                    vw: 16,
                    nvmax: 2,
                    kc: 512,
                    mc: 480,
                    // 768 columns × 256 k pairs × 4 bytes = 768 KiB of B block, which Zen 4/5's 1 MiB L2
                    // holds: A is packed again for every B block, and at 256 columns that
                    // repacking took 40% as long as the products on the GPT's tall shapes
                    // (16384 token rows): 580-700 GFLOP/s there against 775-835 at 768.
                    nc: 768,
                    pairs: true,
                    a_tile_rows: false,
                    kernels: &super::x86::KERNELS_AVX512_BF16,
                    rows_kernels: Some(&super::x86::ROWS_KERNELS_AVX512_BF16),
                };
                if lvl < Level::AmxBf16 {
                    return pairs;
                }
                // AMX: the same B panels and blocks, a 16 × 32 tile (one A tile, two B and two
                // C tiles of the eight), A's panels row by row.
                return Arch {
                    mr: 16,
                    a_tile_rows: true,
                    kernels: &super::x86::KERNELS_AMX,
                    rows_kernels: Some(&super::x86::ROWS_KERNELS_AMX),
                    ..pairs
                };
            }
            if kind == Kind::Bf16 && pair_emulation {
                return Arch::pair_emulation(lvl);
            }
            // 16-bit C needs an f32 running sum between k blocks (a round trip through
            // memory per block), so its blocks are deeper and narrower: the same B block size,
            // and the A micro-panel (12 × kc f32) still fits L1.
            // A 16-bit operand widened to f32 while packing takes twice its own size there: its
            // A block is half as tall, so that the per-thread packing buffers (kept between
            // calls) are no larger than f32's.
            let (kc, nc, mc) = if kind == Kind::F32 {
                (256, 512, 480)
            } else {
                (512, 256, 240)
            };
            if lvl >= Level::Avx512 {
                return Arch {
                    level: lvl,
                    mr: 12,
                    vw: 16,
                    nvmax: 2,
                    kc,
                    mc,
                    nc,
                    pairs: false,
                    a_tile_rows: false,
                    kernels: &super::x86::KERNELS_AVX512,
                    // Only f32 A can be read where it lies; 16-bit A widens while packing.
                    rows_kernels: (kind == Kind::F32).then_some(&super::x86::ROWS_KERNELS_AVX512),
                };
            }
            if lvl >= Level::Avx2 {
                return Arch {
                    level: lvl,
                    mr: 6,
                    vw: 8,
                    nvmax: 2,
                    kc,
                    mc,
                    nc,
                    pairs: false,
                    a_tile_rows: false,
                    kernels: &super::x86::KERNELS_AVX2,
                    // Only f32 A can be read where it lies; 16-bit A widens while packing.
                    rows_kernels: (kind == Kind::F32).then_some(&super::x86::ROWS_KERNELS_AVX2),
                };
            }
        }
        if kind == Kind::Bf16 && pair_emulation {
            return Arch::pair_emulation(lvl);
        }
        Arch {
            level: Level::Portable,
            mr: 4,
            vw: 8,
            nvmax: 1,
            kc: 256,
            mc: 480,
            nc: 512,
            pairs: false,
            a_tile_rows: false,
            kernels: &PORTABLE_KERNELS,
            rows_kernels: None,
        }
    }

    pub(super) fn pair_emulation(lvl: Level) -> Arch {
        Arch {
            level: lvl.min(Level::Avx512),
            mr: 12,
            vw: 16,
            nvmax: 2,
            kc: 512,
            mc: 480,
            nc: 256,
            pairs: true,
            a_tile_rows: false,
            kernels: &PAIR_EMULATION_KERNELS,
            rows_kernels: Some(&PAIR_EMULATION_ROWS_KERNELS),
        }
    }
}

/// Bytes of a cache line, and of one L1 data cache way (64 sets of lines) on every x86-64 core
/// of the last decade (32 KiB 8-way, 48 KiB 12-way).
const LINE_BYTES: isize = 64;
const L1_WAY_BYTES: isize = 4096;

/// At most this many of a micro-tile's A rows may fall in one L1 set for them to be read in
/// place.
const MAX_ROWS_PER_L1_SET: usize = 8;

/// Whether `rows` rows of A, `row_bytes` apart, read in place would crowd one L1 set: their
/// lines at the same k fall into too few sets, and the rows kernel touches each of those lines
/// again at every k step while B's panel and C's tile compete for the same ways.
///
/// A row-major A whose rows are a multiple of 4 KiB long (1024 f32 or 2048 bf16 columns, widths
/// models use) puts all 12 rows of an AVX-512 tile in one set. On a two-core Zen 5, `cargo
/// bench -p typed-amp-kernels --bench gemm -- square` ran 1024³ f32 at 217–232 GFLOP/s with
/// those rows read in place (9e98b91) and 332–334 with A packed by this rule (5cc8ddf). At six
/// rows to a set (1536 f32 columns) reading in place ran as fast as packing or faster (the same
/// bench's `a rows` rows, BENCHMARKS.md session 54). AMX's tile loads read each row's line once
/// per tile, not once per k step: left in place.
fn crowds_l1_set(row_bytes: isize, rows: usize) -> bool {
    let mut per_set = [0usize; (L1_WAY_BYTES / LINE_BYTES) as usize];
    (0..rows as isize).any(|i| {
        let set = (i.wrapping_mul(row_bytes).rem_euclid(L1_WAY_BYTES) / LINE_BYTES) as usize;
        per_set[set] += 1;
        per_set[set] > MAX_ROWS_PER_L1_SET
    })
}

static A_ROWS_IN_PLACE: AtomicBool = AtomicBool::new(true);

/// Tests and benchmarks only: with `false`, every path packs A rather than reading its rows in
/// place (`Arch::a_rows`), so that the two can be compared (they must give the same bits) and
/// timed.
#[doc(hidden)]
pub fn set_a_rows_in_place(on: bool) {
    A_ROWS_IN_PLACE.store(on, Ordering::Relaxed);
}

fn rows_off() -> bool {
    !A_ROWS_IN_PLACE.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::crowds_l1_set;

    #[test]
    fn rows_a_multiple_of_4_kib_apart_crowd_one_set() {
        // 1024 and 2048 f32 columns: every row of a 12-row tile in one set.
        assert!(crowds_l1_set(4096, 12));
        assert!(crowds_l1_set(8192, 12));
        // Negative strides (a transposed view read backwards) alias the same way.
        assert!(crowds_l1_set(-4096, 12));
        // Six rows to a set (1,536 f32 columns), three, or a row per set: read in place.
        assert!(!crowds_l1_set(6144, 12));
        assert!(!crowds_l1_set(5120, 12));
        assert!(!crowds_l1_set(4160, 12));
        assert!(!crowds_l1_set(256, 12));
        // Up to the bound, even in one set (AVX2's six-row tile).
        assert!(!crowds_l1_set(4096, 8));
        assert!(crowds_l1_set(4096, 9));
    }
}
