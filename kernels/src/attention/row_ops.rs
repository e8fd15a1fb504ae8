//! The loops a pass is made of: rows against a transposed matrix, weighted sums of rows, and
//! transposes.

use super::lanes::{Lanes, Lanes8};

/// Calls `$f::<V, C>(…)` for the chunk count `$n` (1 to 8 vectors), so that each
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
pub(super) use with_chunks;

/// `out[r·out_ld + c·N + l] = Σ_d a[r·a_ld + d]·bt[d·ld + c·N + l]` for `rows` rows
/// of `a` and the first `C` vectors of `bt`'s rows: rows of one matrix against a transposed
/// other (a head's keys against its transposed queries: a key's scores over the queries), each
/// sum in order of `d`. Tiles of several rows share each vector of `bt` loaded (as many as keep
/// every sum in the registers), so that their chains of multiply-adds overlap.
#[inline(always)]
pub(super) fn rows_by_transposed<V: Lanes, const C: usize>(
    (a, a_ld, depth): (&[f32], usize, usize),
    rows: usize,
    (bt, ld): (&[f32], usize),
    (out, out_ld): (&mut [f32], usize),
) {
    // At most 12 sums in AVX2's 16 registers, 16 in AVX-512's 32 (with the loaded vectors and
    // the broadcast beside them): on sixteen lanes, twice the rows of eight's tiles (the small
    // GPT's head 1–9% faster, `cargo bench --bench short_attention`, six runs alternated).
    let (a, bt, out) = ((a, a_ld, depth), (bt, ld), (out, out_ld));
    if V::REGISTERS == 32 {
        match C {
            1..=2 => rows_in_tiles::<V, C, 8>(a, rows, bt, out),
            3..=4 => rows_in_tiles::<V, C, 4>(a, rows, bt, out),
            _ => rows_in_tiles::<V, C, 2>(a, rows, bt, out),
        }
    } else {
        match C {
            1..=3 => rows_in_tiles::<V, C, 4>(a, rows, bt, out),
            4..=6 => rows_in_tiles::<V, C, 2>(a, rows, bt, out),
            _ => rows_in_tiles::<V, C, 1>(a, rows, bt, out),
        }
    }
}

/// [`rows_by_transposed`] in tiles of `R` rows, the rest one at a time.
#[inline(always)]
fn rows_in_tiles<V: Lanes, const C: usize, const R: usize>(
    (a, a_ld, depth): (&[f32], usize, usize),
    rows: usize,
    (bt, ld): (&[f32], usize),
    (out, out_ld): (&mut [f32], usize),
) {
    let mut r = 0;
    while r + R <= rows {
        tile::<V, C, R>(
            (&a[r * a_ld..], a_ld, depth),
            (bt, ld),
            (&mut out[r * out_ld..], out_ld),
        );
        r += R;
    }
    while r < rows {
        tile::<V, C, 1>(
            (&a[r * a_ld..], a_ld, depth),
            (bt, ld),
            (&mut out[r * out_ld..], out_ld),
        );
        r += 1;
    }
}

/// `R` rows of [`rows_by_transposed`], their `R·C` sums in registers.
#[inline(always)]
fn tile<V: Lanes, const C: usize, const R: usize>(
    (a, a_ld, depth): (&[f32], usize, usize),
    (bt, ld): (&[f32], usize),
    (out, out_ld): (&mut [f32], usize),
) {
    assert!(
        depth == 0 || ((depth - 1) * ld + C * V::N <= bt.len() && (R - 1) * a_ld + depth <= a.len()),
        "rows_by_transposed: {R} rows of {depth}, {a_ld} apart in {}; {depth} rows of {} lanes, {ld} apart in {}",
        a.len(),
        C * V::N,
        bt.len()
    );
    let mut acc = [[V::zero(); C]; R];
    for d in 0..depth {
        // SAFETY: `d < depth`, so `bt`'s row `d` ends at `d·ld + C·N ≤ bt.len()` and
        // `r·a_ld + d < a.len()` for every `r < R` (asserted above). Checked, these were a
        // bounds check per row and multiply-add group.
        let row = unsafe { bt.get_unchecked(d * ld..d * ld + C * V::N) };
        let b: [V; C] = std::array::from_fn(|c| V::load(&row[c * V::N..]));
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let x = V::splat(unsafe { *a.get_unchecked(r * a_ld + d) });
            for (acc, b) in acc.iter_mut().zip(&b) {
                *acc = x.mul_add(*b, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, acc) in acc.iter().enumerate() {
            acc.store(&mut out[r * out_ld + c * V::N..]);
        }
    }
}

/// One weighted sum of rows: `(w, ws, n)` the weights, `ws` apart, of the first `n` rows of
/// `(m, ld)`, rows `ld` apart.
pub(super) type WeightedRows<'a> = ((&'a [f32], usize, usize), (&'a [f32], usize));

/// `out[..C·N] = Σ_{j<n} w[j·ws]·m[j·ld..][..C·N]`: the even and the odd `j` summed apart (in
/// order) and added at the end, twice the chains of one running sum. The weights are `ws`
/// apart: a row of a matrix (`ws = 1`) or a column (`ws` its row length), each broadcast from
/// where it lies.
#[inline(always)]
pub(super) fn weighted_rows<V: Lanes, const C: usize>(sum: WeightedRows<'_>, out: &mut [f32]) {
    weighted_rows_together::<V, C, 1>([sum], [out]);
}

/// Two [`weighted_rows`] at once where their sums fit the registers (side by side, twice the
/// independent chains: one sum's chains alone left the multiply-adds waiting on each other's
/// latency at sixteen lanes), else one after the other; the same bits either way.
#[inline(always)]
pub(super) fn weighted_rows_pair<V: Lanes, const C: usize>(
    sums: [WeightedRows<'_>; 2],
    [a, b]: [&mut [f32]; 2],
) {
    // Two sums' even and odd chains, and the loaded row and weight beside them.
    if 4 * C + 4 <= V::REGISTERS {
        weighted_rows_together::<V, C, 2>(sums, [a, b]);
    } else {
        let [s, t] = sums;
        weighted_rows::<V, C>(s, a);
        weighted_rows::<V, C>(t, b);
    }
}

/// `K` [`weighted_rows`] interleaved over their common rows, each finished alone past them;
/// each sum's order is its own (even and odd rows apart, in order).
#[inline(always)]
fn weighted_rows_together<V: Lanes, const C: usize, const K: usize>(
    sums: [WeightedRows<'_>; K],
    outs: [&mut [f32]; K],
) {
    for ((w, ws, n), (m, ld)) in sums {
        assert!(
            n == 0 || ((n - 1) * ld + C * V::N <= m.len() && (n - 1) * ws < w.len()),
            "weighted_rows: {n} rows of {} lanes {ld} apart in {}, weights {ws} apart in {}",
            C * V::N,
            m.len(),
            w.len()
        );
    }
    // Row `j < n` of sum `k` and its weight, unchecked: checked per row, their bounds were a
    // tenth of the kernels' time (`perf`, `cargo bench --bench short_attention`).
    let row = |k: usize, j: usize| {
        let ((w, ws, n), (m, ld)) = sums[k];
        debug_assert!(j < n);
        // SAFETY: `j < n`, and row `n − 1` ends at `(n − 1)·ld + C·N ≤ m.len()` and its
        // weight is at `(n − 1)·ws < w.len()` (asserted above).
        unsafe {
            (
                m.get_unchecked(j * ld..j * ld + C * V::N),
                V::splat(*w.get_unchecked(j * ws)),
            )
        }
    };
    let step = |k: usize, j: usize, acc: &mut [V; C]| {
        let (r, x) = row(k, j);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&r[c * V::N..]), *acc);
        }
    };
    let mut even = [[V::zero(); C]; K];
    let mut odd = [[V::zero(); C]; K];
    let common = sums.iter().map(|s| s.0 .2).min().unwrap_or(0);
    let mut j = 0;
    while j + 1 < common {
        for k in 0..K {
            step(k, j, &mut even[k]);
            step(k, j + 1, &mut odd[k]);
        }
        j += 2;
    }
    for k in 0..K {
        for j in j..sums[k].0 .2 {
            let acc = if j % 2 == 0 {
                &mut even[k]
            } else {
                &mut odd[k]
            };
            step(k, j, acc);
        }
    }
    for ((even, odd), out) in even.iter().zip(&odd).zip(outs) {
        for (c, (e, o)) in even.iter().zip(odd).enumerate() {
            e.add(*o).store(&mut out[c * V::N..]);
        }
    }
}

/// `out[d·ld + j] = m[j·stride + d]` for the `rows` rows of `m` and `d < depth`, lanes
/// `rows..` of each of `out`'s rows zero up to `ld` (which is at least `rows` rounded up to 8):
/// blocks of 8 × 8 through registers ([`Lanes8::transpose8`]), blocks of whole rows without a
/// test per row.
#[inline(always)]
pub(super) fn transpose<V: Lanes8>(
    (m, stride, rows): (&[f32], usize, usize),
    depth: usize,
    (out, ld): (&mut [f32], usize),
) {
    for j in (0..rows).step_by(8) {
        let whole_rows = j + 8 <= rows;
        for d in (0..depth).step_by(8) {
            // The last block's columns past `depth` are read from the row (they are the rest
            // of its vector, or of the next head's columns) and not stored.
            let block: [V; 8] = if whole_rows {
                std::array::from_fn(|r| V::load(&m[(j + r) * stride + d..]))
            } else {
                std::array::from_fn(|r| {
                    if j + r < rows {
                        V::load(&m[(j + r) * stride + d..])
                    } else {
                        V::zero()
                    }
                })
            };
            for (c, col) in V::transpose8(block).into_iter().enumerate().take(depth - d) {
                col.store(&mut out[(d + c) * ld + j..]);
            }
        }
    }
    // The lanes past the last block of eight (where `ld` is rounded up to sixteen).
    let written = rows.div_ceil(8) * 8;
    if written < ld {
        for d in 0..depth {
            out[d * ld + written..(d + 1) * ld].fill(0.0);
        }
    }
}

/// `Σ_d a[d]·b[d]` over `len` elements: eight running sums of fused multiply-adds over whole
/// vectors of eight, added pairwise, then the rest in order (the same bits on every vector
/// type: the sums are always eight lanes wide).
#[inline(always)]
pub(super) fn dot<V: Lanes8>(a: &[f32], b: &[f32], len: usize) -> f32 {
    let whole = len / 8 * 8;
    let mut acc = V::zero();
    for d in (0..whole).step_by(8) {
        acc = V::load(&a[d..]).mul_add(V::load(&b[d..]), acc);
    }
    let l = acc.to_array();
    let mut sum = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (x, y) in a[whole..len].iter().zip(&b[whole..len]) {
        sum = x.mul_add(*y, sum);
    }
    sum
}
