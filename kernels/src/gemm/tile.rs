//! A tile of C, the micro-kernels' unit of work: a micro-kernel's signature ([`KernFn`], and
//! [`RowsKernFn`] for one reading A's rows in place, either held by a [`Micro`]), the
//! f32 tile it writes where C cannot take its output directly ([`Tile`], `TILE_MR × TILE_NR`),
//! and the epilogue a finished tile is stored with ([`TileEpi`]). The bottom of the GEMM's
//! files: the kernel tables, the stores and the drivers import it.

/// Micro-kernel: multiplies a packed `kc`-long A micro-panel (`MR` per k step, the first `M`
/// used) by a packed B micro-panel (`NR` per k step, the first `NV` vectors used) and writes
/// (`load == false`) or adds (`load == true`) the `M × NV·VW` f32 result at `dst`, rows
/// `dst_rs` apart, columns contiguous. `kc` counts k steps, or k pairs for the bf16-pair path.
///
/// # Safety
/// `a` readable for `kc · MR` f32 (the path's `mr`), `b` for `kc · NR` f32; `dst` writable (and
/// readable with `load`) for `M` rows of `NV · VW` f32, `dst_rs` apart; the CPU has the
/// features of the path the kernel belongs to.
pub(super) type KernFn =
    unsafe fn(kc: usize, a: *const f32, b: *const f32, dst: *mut f32, dst_rs: isize, load: bool);

/// Micro-kernel of the bf16-pair path that reads A where it lies instead of packed: row `i` of
/// the micro-panel starts at byte `a + i·a_rs`, its k pairs contiguous from there (A row-major
/// with unit k stride, so a (k, k+1) pair is already the 32-bit slot `vdpbf16ps` broadcasts).
/// Otherwise as [`KernFn`], whose bits it gives: packing only copies the same pairs.
///
/// # Safety
/// As [`KernFn`], with `a + i·a_rs` readable for `kc` pairs (4 bytes each) for `i < M`.
pub(super) type RowsKernFn = unsafe fn(
    kc: usize,
    a: *const f32,
    a_rs: isize,
    b: *const f32,
    dst: *mut f32,
    dst_rs: isize,
    load: bool,
);

/// The micro-kernel for one tile and how it reads A: from a packed micro-panel, or from A's own
/// rows (`a_rs` bytes apart).
#[derive(Clone, Copy)]
pub(super) enum Micro {
    Packed(KernFn),
    Rows(RowsKernFn, isize),
}

impl Micro {
    /// Runs the kernel on `kc` k steps of A's micro-panel at `a` (packed, or the first row's
    /// first pair) and B's packed micro-panel at `b`.
    ///
    /// # Safety
    /// As [`KernFn`] or [`RowsKernFn`], whichever this holds.
    #[inline(always)]
    pub(super) unsafe fn run(
        self,
        kc: usize,
        a: *const f32,
        b: *const f32,
        dst: *mut f32,
        dst_rs: isize,
        load: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Micro::Packed(kern) => kern(kc, a, b, dst, dst_rs, load),
                Micro::Rows(kern, a_rs) => kern(kc, a, a_rs, b, dst, dst_rs, load),
            }
        }
    }
}

#[repr(C, align(64))]
pub(super) struct Tile(pub(super) [f32; TILE_MR * TILE_NR]);
/// The tallest micro-tile of any path (AMX's).
pub(super) const TILE_MR: usize = 16;
pub(super) const TILE_NR: usize = 32;

/// The epilogue for one tile (or run) of C.
#[derive(Clone, Copy)]
pub(super) struct TileEpi {
    pub alpha: f32,
    /// `alpha != 1`: multiply. (Skipping `1·x` changes no value: every sum the kernels produce
    /// is an arithmetic result, never a signalling NaN.)
    pub scale: bool,
    /// Add C's old value.
    pub add_c: bool,
    pub relu: bool,
    /// Null without a bias; else the tile's element `(r, j)` gets `bias[r·bias_rs +
    /// j·bias_cs]`, one of the two strides 0 and the other 1.
    pub bias: *const f32,
    pub bias_rs: isize,
    pub bias_cs: isize,
    /// Look for non-finite stored values (`gemm`, which reports nothing, skips it).
    pub check: bool,
}

impl TileEpi {
    /// Only the sum, plus C's old value with `add_c`: `gemm`'s store.
    pub fn sum(add_c: bool, check: bool) -> TileEpi {
        TileEpi {
            alpha: 1.0,
            scale: false,
            add_c,
            relu: false,
            bias: std::ptr::null(),
            bias_rs: 0,
            bias_cs: 0,
            check,
        }
    }

    /// The epilogue of one element: `s` the f32 sum, `old` C's widened old value (read only
    /// with `add_c`), `bias` its bias entry (read only with a bias). The vector paths do the
    /// same operations in the same order.
    #[inline(always)]
    pub fn apply(&self, s: f32, old: f32, bias: f32) -> f32 {
        let mut v = if self.scale { self.alpha * s } else { s };
        if self.add_c {
            v += old;
        }
        if !self.bias.is_null() {
            v += bias;
        }
        if self.relu && v < 0.0 {
            v = 0.0;
        }
        v
    }

    /// The bias pointer for the tile's element `(r, j)` (null without a bias).
    ///
    /// # Safety
    /// `(r, j)` is inside the tile the bias pointer was made for.
    #[inline(always)]
    pub(super) unsafe fn bias_at(&self, r: usize, j: usize) -> *const f32 {
        if self.bias.is_null() {
            return self.bias;
        }
        // SAFETY: the bias has an entry for every element of the tile.
        unsafe {
            self.bias
                .offset(r as isize * self.bias_rs + j as isize * self.bias_cs)
        }
    }
}
