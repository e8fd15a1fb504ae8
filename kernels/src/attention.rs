//! One short head's attention in FP32, forward and backward: at most [`MAX_KEYS`] tokens, so a
//! query row's scores fit in a few vectors and its softmax is exact in one pass (no key blocks,
//! no online rescaling), and the head's operands sit in L1 for all of its rows.
//!
//! Why a kernel apart from the blocked one (`typed_amp`'s CPU attention, FlashAttention's
//! blocks on the GEMM): its products on such heads are tiny (the ViT's 17 tokens × 16 columns,
//! the small GPT's 64 × 32), and packing each operand plus the GEMM's calls cost several times
//! their arithmetic: 13–25 GFLOP/s in `cargo bench --bench attention` on Zen 3, where the GEMM
//! itself runs at 160. Here every product is a loop over vectors of [`LANES`] keys (or head
//! columns) with its sums in registers, on AVX2 and FMA where the CPU has them, else on plain
//! arrays; every multiply-add is fused, so the bits do not depend on the CPU.
//!
//! The arithmetic is the blocked kernel's: scores `q·k` as `head_dim`-term sums in order, scaled,
//! the row's maximum subtracted, [`exp_f32`]; the probabilities (forward and `dv`) and the
//! scores' gradient (`dq`, `dk`) rounded once to the working precision ([`Rounding`]) before
//! their products, as FlashAttention rounds them; only the order of a row's sum of
//! probabilities and of the products' sums over keys differ.
//!
//! Layout: every `tokens × head_dim` matrix is row-major, its rows [`ShortHead::stride`] apart
//! (the head width rounded up to [`LANES`]). The lanes past `head_dim` of an input never reach
//! an output's first `head_dim` columns; those of an output are unspecified.

use half::f16;

use crate::convert::{bf16_bits_to_f32_bits, f16_to_f32, f32_bits_to_bf16_bits, f32_to_f16};
use crate::math::exp_f32;

/// The width of the vectors the loops run in (f32 lanes of an AVX2 register).
pub const LANES: usize = 8;

/// The most tokens (keys per query row) a short head may have.
pub const MAX_KEYS: usize = 64;

/// The widest head a short head may have.
pub const MAX_HEAD_DIM: usize = 64;

/// One head's sizes and options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShortHead {
    /// Tokens of the sequence: query rows, and keys per row.
    pub tokens: usize,
    /// Columns of one head's queries, keys and values.
    pub head_dim: usize,
    /// Whether token `i` attends only to tokens `j ≤ i`.
    pub causal: bool,
    /// The scores' scale (`1/√head_dim` for scaled dot-product attention).
    pub scale: f32,
}

impl ShortHead {
    /// Whether these kernels take the head: 1 to [`MAX_KEYS`] tokens, heads 1 to
    /// [`MAX_HEAD_DIM`] wide.
    pub fn fits(&self) -> bool {
        (1..=MAX_KEYS).contains(&self.tokens) && (1..=MAX_HEAD_DIM).contains(&self.head_dim)
    }

    /// Elements between the starts of two rows of a matrix: `head_dim` rounded up to [`LANES`].
    pub fn stride(&self) -> usize {
        self.head_dim.div_ceil(LANES) * LANES
    }

    /// Elements of one `tokens × head_dim` matrix (`tokens × stride`).
    pub fn matrix_len(&self) -> usize {
        self.tokens * self.stride()
    }

    /// Keys rounded up to [`LANES`]: the row length of the transposed keys and values.
    fn padded_keys(&self) -> usize {
        self.tokens.div_ceil(LANES) * LANES
    }

    /// Keys query row `i` sees.
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            i + 1
        } else {
            self.tokens
        }
    }

    /// Panics unless the head fits and every matrix and row vector has its length.
    fn check(&self, matrices: &[usize], rows: &[usize]) {
        assert!(self.fits(), "short-head attention: {self:?} does not fit");
        let len = self.matrix_len();
        assert!(
            matrices.iter().all(|&l| l == len) && rows.iter().all(|&l| l == self.tokens),
            "short-head attention: matrices of {len} elements and rows of {} expected",
            self.tokens
        );
    }
}

/// The precision the probabilities and the scores' gradient are rounded to before their
/// products: the working precision of the head's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// FP32 operands: nothing is rounded.
    F32,
    /// FP16 operands.
    F16,
    /// BF16 operands.
    Bf16,
}

/// Transposed copies of a head's keys (and, for the backward, values), kept between calls so
/// that a loop over heads allocates once.
#[derive(Debug, Default)]
pub struct ShortHeadScratch {
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl ShortHeadScratch {
    /// Empty buffers, grown on first use.
    pub fn new() -> Self {
        Self::default()
    }
}

/// `y = softmax(q·kᵀ·scale + mask)·v` for one head, into `o` (FP32, `tokens × stride`), and
/// each query row's log-sum-exp into `lse` (`tokens`), from `[q, k, v]` (`tokens × stride`
/// each).
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits) or a buffer has another length.
pub fn short_head_forward(
    h: &ShortHead,
    rounding: Rounding,
    [q, k, v]: [&[f32]; 3],
    o: &mut [f32],
    lse: &mut [f32],
    scratch: &mut ShortHeadScratch,
) {
    h.check(&[q.len(), k.len(), v.len(), o.len()], &[lse.len()]);
    transpose(h, k, &mut scratch.kt);
    run_rows(Forward {
        h: *h,
        rounding,
        q,
        kt: &scratch.kt,
        v,
        o,
        lse,
    });
}

/// The gradients of one head's `[q, k, v]` into `[dq, dk, dv]` (FP32, `tokens × stride` each,
/// overwritten) from the forward's output `y`, the output's gradient `dy` and the forward's
/// log-sum-exps `lse`; the probabilities are recomputed.
///
/// # Panics
/// If the head does not [`fit`](ShortHead::fits) or a buffer has another length.
pub fn short_head_backward(
    h: &ShortHead,
    rounding: Rounding,
    [q, k, v]: [&[f32]; 3],
    [y, dy]: [&[f32]; 2],
    lse: &[f32],
    [dq, dk, dv]: [&mut [f32]; 3],
    scratch: &mut ShortHeadScratch,
) {
    h.check(
        &[
            q.len(),
            k.len(),
            v.len(),
            y.len(),
            dy.len(),
            dq.len(),
            dk.len(),
            dv.len(),
        ],
        &[lse.len()],
    );
    transpose(h, k, &mut scratch.kt);
    transpose(h, v, &mut scratch.vt);
    run_rows(Backward {
        h: *h,
        rounding,
        q,
        k,
        kt: &scratch.kt,
        vt: &scratch.vt,
        y,
        dy,
        lse,
        dq,
        dk,
        dv,
    });
}

/// `out[d·padded_keys + j] = m[j·stride + d]`, the keys past `tokens` zero.
fn transpose(h: &ShortHead, m: &[f32], out: &mut Vec<f32>) {
    let (st, kp) = (h.stride(), h.padded_keys());
    out.clear();
    out.resize(h.head_dim * kp, 0.0);
    for (j, row) in m.chunks_exact(st).enumerate() {
        for (d, &x) in row[..h.head_dim].iter().enumerate() {
            out[d * kp + j] = x;
        }
    }
}

/// Eight f32 lanes and the operations the row loops need: written with AVX2 intrinsics
/// ([`Avx2`]) and as a plain array ([`Portable`]), so the loops are one generic body. (Written
/// over arrays alone, the compiler split some of them into two-lane vectors and spilled the
/// sums to the stack.)
trait Lanes8: Copy {
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    /// `s[..8]`.
    fn load(s: &[f32]) -> Self;
    /// Into `s[..8]`.
    fn store(self, s: &mut [f32]);
    /// `self·a + b`, rounded once.
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn add(self, o: Self) -> Self;
}

/// [`Lanes8`] for any CPU: `f32::mul_add` is the correctly rounded fused multiply-add on every
/// target, so this gives [`Avx2`]'s bits.
#[derive(Clone, Copy)]
struct Portable([f32; LANES]);

impl Lanes8 for Portable {
    #[inline(always)]
    fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable([x; LANES])
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let mut v = [0.0; LANES];
        v.copy_from_slice(&s[..LANES]);
        Portable(v)
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        s[..LANES].copy_from_slice(&self.0);
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l].mul_add(a.0[l], b.0[l])))
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] + o.0[l]))
    }
}

/// [`Lanes8`] in one AVX register. Values of this type are only made inside [`run_rows`]' AVX2
/// body, which runs after the CPU's AVX2 and FMA were checked ([`crate::level`]): that is what
/// makes its intrinsics sound to call.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx2(std::arch::x86_64::__m256);

#[cfg(target_arch = "x86_64")]
impl Lanes8 for Avx2 {
    #[inline(always)]
    fn zero() -> Self {
        // SAFETY: AVX is present (see the type's documentation).
        Avx2(unsafe { std::arch::x86_64::_mm256_setzero_ps() })
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_set1_ps(x) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..LANES];
        // SAFETY: as in `zero`; `s` holds the eight elements read (unaligned load).
        Avx2(unsafe { std::arch::x86_64::_mm256_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, s: &mut [f32]) {
        let s = &mut s[..LANES];
        // SAFETY: as in `load`, for the eight elements written.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(s.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        // SAFETY: FMA is present (see the type's documentation).
        Avx2(unsafe { std::arch::x86_64::_mm256_fmadd_ps(self.0, a.0, b.0) })
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        // SAFETY: as in `zero`.
        Avx2(unsafe { std::arch::x86_64::_mm256_add_ps(self.0, o.0) })
    }
}

/// Calls `$f::<V, C>(…)` for the chunk count `$n` (1 to 8 vectors of [`LANES`]), so that each
/// count's loops are compiled with their `C` sums in registers.
macro_rules! with_chunks {
    ($n:expr, $f:ident::<$v:ty>($($arg:expr),*)) => {
        match $n {
            1 => $f::<$v, 1>($($arg),*),
            2 => $f::<$v, 2>($($arg),*),
            3 => $f::<$v, 3>($($arg),*),
            4 => $f::<$v, 4>($($arg),*),
            5 => $f::<$v, 5>($($arg),*),
            6 => $f::<$v, 6>($($arg),*),
            7 => $f::<$v, 7>($($arg),*),
            _ => $f::<$v, 8>($($arg),*),
        }
    };
}

/// `s[c·LANES + l] = Σ_d a[d]·bt[d·ld + c·LANES + l]` for the first `C` vectors: a row against
/// a transposed matrix, each sum in order of `d`, the `C` vectors' chains side by side.
#[inline(always)]
fn row_by_transposed<V: Lanes8, const C: usize>(a: &[f32], bt: &[f32], ld: usize, s: &mut [f32]) {
    let mut acc = [V::zero(); C];
    for (d, &x) in a.iter().enumerate() {
        let row = &bt[d * ld..d * ld + C * LANES];
        let x = V::splat(x);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&row[c * LANES..]), *acc);
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        acc.store(&mut s[c * LANES..]);
    }
}

/// `out[..C·LANES] = Σ_j w[j]·m[j·ld..][..C·LANES]`: the even and the odd `j` summed apart (in
/// order) and added at the end, twice the chains of one running sum.
#[inline(always)]
fn weighted_rows<V: Lanes8, const C: usize>(w: &[f32], m: &[f32], ld: usize, out: &mut [f32]) {
    let mut even = [V::zero(); C];
    let mut odd = [V::zero(); C];
    let mut rows = w.iter().enumerate();
    while let Some((j, &x)) = rows.next() {
        let (r, x) = (&m[j * ld..j * ld + C * LANES], V::splat(x));
        for (c, acc) in even.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
        }
        if let Some((j, &x)) = rows.next() {
            let (r, x) = (&m[j * ld..j * ld + C * LANES], V::splat(x));
            for (c, acc) in odd.iter_mut().enumerate() {
                *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
            }
        }
    }
    for (c, (e, o)) in even.iter().zip(&odd).enumerate() {
        e.add(*o).store(&mut out[c * LANES..]);
    }
}

/// `m[j·ld..][..C·LANES] += w[j]·x[..C·LANES]` for every `j` (one fused multiply-add each), `x`
/// held in registers.
#[inline(always)]
fn add_outer<V: Lanes8, const C: usize>(w: &[f32], x: &[f32], m: &mut [f32], ld: usize) {
    let xs: [V; C] = std::array::from_fn(|c| V::load(&x[c * LANES..]));
    for (j, &wj) in w.iter().enumerate() {
        let row = &mut m[j * ld..j * ld + C * LANES];
        let wj = V::splat(wj);
        for (c, x) in xs.iter().enumerate() {
            let r = &mut row[c * LANES..];
            wj.mul_add(*x, V::load(r)).store(r);
        }
    }
}

/// `dst[..n] = src[..n]` in copies of [`LANES`] (for `n` a multiple of it): a variable-length
/// `copy_from_slice` is a call to `memcpy`, and such calls on rows of 16 to 64 elements were a
/// fifth of the ViT's attention.
#[inline(always)]
fn copy_lanes(src: &[f32], dst: &mut [f32], n: usize) {
    let (dst, _) = dst[..n].as_chunks_mut::<LANES>();
    let (src, _) = src[..n].as_chunks::<LANES>();
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

/// `x[n..] = value`, for `x` a multiple of [`LANES`] long and `n` in its last vector (a lane
/// loop, not a call to `memset`).
#[inline(always)]
fn fill_from(x: &mut [f32], n: usize, value: f32) {
    let base = x.len().saturating_sub(LANES);
    if let Some(last) = x.as_chunks_mut::<LANES>().0.last_mut() {
        for (l, v) in last.iter_mut().enumerate() {
            if base + l >= n {
                *v = value;
            }
        }
    }
}

/// The largest of `x` (a multiple of [`LANES`] long), NaNs passed over as `f32::max` does.
#[inline(always)]
fn lane_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    for c in x.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    acc.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// The sum of `x` (a multiple of [`LANES`] long) in [`LANES`] running sums, added in order.
#[inline(always)]
fn lane_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for c in x.chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.into_iter().sum()
}

/// `x` rounded to the working precision (to nearest even) and widened again (exact).
#[inline(always)]
fn round(rounding: Rounding, x: &mut [f32]) {
    match rounding {
        Rounding::F32 => {}
        Rounding::Bf16 => {
            for v in x.iter_mut() {
                let narrow = f32_bits_to_bf16_bits(v.to_bits());
                *v = f32::from_bits(bf16_bits_to_f32_bits(narrow));
            }
        }
        Rounding::F16 => {
            let mut buf = [f16::ZERO; MAX_KEYS];
            let buf = &mut buf[..x.len()];
            f32_to_f16(x, buf);
            f16_to_f32(buf, x);
        }
    }
}

/// One of the passes over a head's rows, generic over the lanes it computes in.
trait RowPass {
    fn run<V: Lanes8>(self);
}

/// Runs `pass` on AVX2 and FMA where the CPU has them (AVX-512 CPUs included), else on
/// [`Portable`] lanes; the same bits either way.
fn run_rows<P: RowPass>(pass: P) {
    #[cfg(target_arch = "x86_64")]
    if crate::level::level() >= crate::level::Level::Avx2 {
        #[target_feature(enable = "avx2,fma")]
        fn wide<P: RowPass>(pass: P) {
            pass.run::<Avx2>()
        }
        // SAFETY: the level is at least AVX2, which is only detected (or forced) on a CPU with
        // AVX2 and FMA.
        return unsafe { wide(pass) };
    }
    pass.run::<Portable>()
}

impl RowPass for Forward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        forward_body::<V>(self)
    }
}

impl RowPass for Backward<'_> {
    #[inline(always)]
    fn run<V: Lanes8>(self) {
        backward_body::<V>(self)
    }
}

/// The forward's operands: `kt` is `head_dim × padded_keys`.
struct Forward<'a> {
    h: ShortHead,
    rounding: Rounding,
    q: &'a [f32],
    kt: &'a [f32],
    v: &'a [f32],
    o: &'a mut [f32],
    lse: &'a mut [f32],
}

#[inline(always)]
fn forward_body<V: Lanes8>(a: Forward<'_>) {
    let Forward {
        h,
        rounding,
        q,
        kt,
        v,
        o,
        lse,
    } = a;
    let (st, kp, head_chunks) = (h.stride(), h.padded_keys(), h.stride() / LANES);
    let mut s = [0f32; MAX_KEYS];
    let mut pe = [0f32; MAX_KEYS];
    for i in 0..h.tokens {
        let n = h.visible(i);
        let key_chunks = n.div_ceil(LANES);
        let np = key_chunks * LANES;
        let qi = &q[i * st..i * st + h.head_dim];
        with_chunks!(key_chunks, row_by_transposed::<V>(qi, kt, kp, &mut s));
        // Keys past the row's last (the mask, and the padding) out of the maximum, then zero;
        // their scores may be anything, NaN included (a later token's).
        s[..n].iter_mut().for_each(|x| *x *= h.scale);
        fill_from(&mut s[..np], n, f32::NEG_INFINITY);
        let max = lane_max(&s[..np]);
        let sum = if max == f32::NEG_INFINITY {
            s[..np].fill(0.0);
            0.0
        } else {
            // NaN scores stay NaN through the subtraction and the exponential, and reach the
            // output (and so the loss and the gradients, which skips the step).
            s[..np].iter_mut().for_each(|x| *x = exp_f32(*x - max));
            fill_from(&mut s[..np], n, 0.0);
            lane_sum(&s[..np])
        };
        copy_lanes(&s, &mut pe, np);
        round(rounding, &mut pe[..n]);
        let oi = &mut o[i * st..(i + 1) * st];
        with_chunks!(head_chunks, weighted_rows::<V>(&pe[..n], v, st, oi));
        let inv = 1.0 / sum;
        oi.iter_mut().for_each(|x| *x *= inv);
        lse[i] = max + sum.ln();
    }
}

/// The backward's operands: `kt` and `vt` are `head_dim × padded_keys`.
struct Backward<'a> {
    h: ShortHead,
    rounding: Rounding,
    q: &'a [f32],
    k: &'a [f32],
    kt: &'a [f32],
    vt: &'a [f32],
    y: &'a [f32],
    dy: &'a [f32],
    lse: &'a [f32],
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

#[inline(always)]
fn backward_body<V: Lanes8>(a: Backward<'_>) {
    let Backward {
        h,
        rounding,
        q,
        k,
        kt,
        vt,
        y,
        dy,
        lse,
        dq,
        dk,
        dv,
    } = a;
    let (hd, st, kp, head_chunks) = (h.head_dim, h.stride(), h.padded_keys(), h.stride() / LANES);
    dk.fill(0.0);
    dv.fill(0.0);
    let mut p = [0f32; MAX_KEYS];
    let mut pe = [0f32; MAX_KEYS];
    let mut ds = [0f32; MAX_KEYS];
    for i in 0..h.tokens {
        let n = h.visible(i);
        let key_chunks = n.div_ceil(LANES);
        let np = key_chunks * LANES;
        let (qi, dyi) = (&q[i * st..(i + 1) * st], &dy[i * st..(i + 1) * st]);
        // Σ dy·y over the row's columns, in order.
        let delta: f32 = dyi[..hd]
            .iter()
            .zip(&y[i * st..i * st + hd])
            .map(|(a, b)| a * b)
            .sum();
        // The probabilities again, from the forward's log-sum-exp.
        with_chunks!(
            key_chunks,
            row_by_transposed::<V>(&qi[..hd], kt, kp, &mut p)
        );
        let l = lse[i];
        p[..np]
            .iter_mut()
            .for_each(|x| *x = exp_f32(*x * h.scale - l));
        fill_from(&mut p[..np], n, 0.0);
        copy_lanes(&p, &mut pe, np);
        round(rounding, &mut pe[..n]);
        // dv[j] += p_j·dy_i
        with_chunks!(head_chunks, add_outer::<V>(&pe[..n], dyi, dv, st));
        // dP = dy_i·Vᵀ; dS = P ⊙ (dP − Σ dy·y), rounded for its products.
        with_chunks!(
            key_chunks,
            row_by_transposed::<V>(&dyi[..hd], vt, kp, &mut ds)
        );
        for (d, &p) in ds[..n].iter_mut().zip(&p[..n]) {
            *d = p * (*d - delta);
        }
        round(rounding, &mut ds[..n]);
        // dq_i = dS·K, dk[j] += dS_j·q_i (the scale once, below).
        let dqi = &mut dq[i * st..(i + 1) * st];
        with_chunks!(head_chunks, weighted_rows::<V>(&ds[..n], k, st, dqi));
        with_chunks!(head_chunks, add_outer::<V>(&ds[..n], qi, dk, st));
    }
    dq.iter_mut()
        .chain(dk.iter_mut())
        .for_each(|x| *x *= h.scale);
}
