//! Helpers shared by the epilogue and safety tests: element types, layouts, strided matrices,
//! and running a test at every level.

#![allow(dead_code)]

use std::sync::Mutex;

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use typed_amp_kernels::{
    detected_level, force_level, set_bf16_pair_emulation, GemmElem, Level, MatMut, MatRef,
};

/// The level is process-wide: tests that force it take turns.
pub static LOCK: Mutex<()> = Mutex::new(());

/// An element type of A, B or C, with what the tolerances need.
pub trait Elem: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    const NAME: &'static str;
    /// Unit roundoff of a store into this type (0 for f32, whose rounding is the arithmetic's).
    const U: f64;
    /// Absolute error a store may add below the normal range (half the subnormal spacing).
    const ABS: f64;
    const IS_F32: bool;
    /// `half`'s rounding (independent of the crate's conversions).
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn bits(self) -> u32;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    const U: f64 = 0.0;
    const ABS: f64 = 0.0;
    const IS_F32: bool = true;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

impl Elem for f16 {
    const NAME: &'static str = "f16";
    const U: f64 = 1.0 / 2048.0;
    const ABS: f64 = 2.980_232_238_769_531_2e-8; // 2^-25
    const IS_F32: bool = false;
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}

impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    const U: f64 = 1.0 / 256.0;
    const ABS: f64 = 0.0; // 2^-134, below anything the f64 checks can see
    const IS_F32: bool = false;
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}

/// How a matrix sits in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    RowMajor,
    ColMajor,
    /// Row-major with padded rows.
    PaddedRows,
    /// Both strides larger than the extents they step over would need.
    Sparse,
}

pub const LAYOUTS: [Layout; 4] = [
    Layout::RowMajor,
    Layout::ColMajor,
    Layout::PaddedRows,
    Layout::Sparse,
];

impl Layout {
    pub fn strides(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Layout::RowMajor => (cols, 1),
            Layout::ColMajor => (1, rows),
            Layout::PaddedRows => (cols + 5, 1),
            Layout::Sparse => (2, 2 * rows + 3),
        }
    }
}

/// A strided matrix over its own vector.
#[derive(Clone)]
pub struct Mat<T> {
    pub data: Vec<T>,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<T: Elem> Mat<T> {
    /// Uniform in [-1, 1); the slots between elements get values too (every 11th one zero), so
    /// a kernel that reads or writes one shows up in a result or in the untouched-slot check.
    pub fn random(rng: &mut StdRng, rows: usize, cols: usize, layout: Layout) -> Self {
        let (rs, cs) = layout.strides(rows, cols);
        let len = if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * rs + (cols - 1) * cs + 1
        };
        let data = (0..len)
            .map(|i| {
                if i % 11 == 0 {
                    T::from_f32(0.0)
                } else {
                    T::from_f32(rng.gen_range(-1.0f32..1.0))
                }
            })
            .collect();
        Mat {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    pub fn idx(&self, i: usize, j: usize) -> usize {
        i * self.rs + j * self.cs
    }

    pub fn at(&self, i: usize, j: usize) -> T {
        self.data[self.idx(i, j)]
    }

    pub fn set(&mut self, i: usize, j: usize, v: T) {
        let idx = self.idx(i, j);
        self.data[idx] = v;
    }

    pub fn view(&self) -> MatRef<'_, T> {
        MatRef {
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    pub fn view_mut(&mut self) -> MatMut<'_, T> {
        MatMut {
            data: &mut self.data,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// The same matrix widened to a row-major f32 one (exact).
    pub fn to_f32_rows(&self) -> Mat<f32> {
        let mut data = Vec::with_capacity(self.rows * self.cols);
        for i in 0..self.rows {
            for j in 0..self.cols {
                data.push(self.at(i, j).to_f32());
            }
        }
        Mat {
            data,
            rows: self.rows,
            cols: self.cols,
            rs: self.cols,
            cs: 1,
        }
    }
}

/// Runs `f` once at every level this CPU supports, plus the bf16-pair emulation where
/// AVX512-BF16 is absent, and prints which ran. `f` gets a seeded RNG and whether bf16
/// products go through the `vdpbf16ps` pair path (its own arithmetic) at this level.
pub fn at_each_level(name: &str, mut f: impl FnMut(&mut StdRng, bool)) {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut ran = Vec::new();
    for lvl in Level::ALL {
        if lvl > detected_level() {
            continue;
        }
        assert_eq!(force_level(Some(lvl)), lvl);
        let mut rng = StdRng::seed_from_u64(0x5eed ^ lvl as u64);
        f(&mut rng, lvl >= Level::Avx512Bf16);
        ran.push(lvl.name().to_string());
    }
    if detected_level() < Level::Avx512Bf16 {
        set_bf16_pair_emulation(true);
        for lvl in [Level::Portable, detected_level()] {
            force_level(Some(lvl));
            let mut rng = StdRng::seed_from_u64(0xbf16);
            f(&mut rng, true);
            ran.push(format!("{}+bf16-pair-emulation", lvl.name()));
        }
        set_bf16_pair_emulation(false);
    }
    force_level(None);
    println!(
        "{name}: ran levels [{}] (detected {})",
        ran.join(", "),
        detected_level().name()
    );
}

/// Whether bf16 products use the pair kernels' own arithmetic at this level, for types that
/// are bf16.
pub fn uses_pairs<T: GemmElem + Elem>(pairs: bool) -> bool {
    pairs && T::NAME == "bf16"
}

/// Runs `f` at every level the CPU has (one test at a time: the level is process-wide), then
/// returns to the default level; prints the levels it ran.
pub fn at_every_level(name: &str, mut f: impl FnMut()) {
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

/// The message `f` panicked with (a `String` or `&str` payload, else empty), or `None` if it
/// returned.
pub fn panic_message(f: impl FnOnce()) -> Option<String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(()) => None,
        Err(e) => Some(
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}
