//! The loops a pass is made of: rows against a transposed matrix, weighted sums of rows, and
//! transposes.

use super::head::LANES;
use super::lanes::Lanes8;

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
pub(super) use with_chunks;

/// `out[r·out_ld + c·LANES + l] = Σ_d a[r·a_ld + d]·bt[d·ld + c·LANES + l]` for `rows` rows
/// of `a` and the first `C` vectors of `bt`'s rows: rows of one matrix against a transposed
/// other (a head's keys against its transposed queries: a key's scores over the queries), each
/// sum in order of `d`. Tiles of several rows share each vector of `bt` loaded (as many as keep
/// every sum in the 16 AVX registers), so that their chains of multiply-adds overlap.
#[inline(always)]
pub(super) fn rows_by_transposed<V: Lanes8, const C: usize>(
    (a, a_ld, depth): (&[f32], usize, usize),
    rows: usize,
    (bt, ld): (&[f32], usize),
    (out, out_ld): (&mut [f32], usize),
) {
    match C {
        1..=3 => rows_in_tiles::<V, C, 4>((a, a_ld, depth), rows, (bt, ld), (out, out_ld)),
        4..=6 => rows_in_tiles::<V, C, 2>((a, a_ld, depth), rows, (bt, ld), (out, out_ld)),
        _ => rows_in_tiles::<V, C, 1>((a, a_ld, depth), rows, (bt, ld), (out, out_ld)),
    }
}

/// [`rows_by_transposed`] in tiles of `R` rows, the rest one at a time.
#[inline(always)]
fn rows_in_tiles<V: Lanes8, const C: usize, const R: usize>(
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
fn tile<V: Lanes8, const C: usize, const R: usize>(
    (a, a_ld, depth): (&[f32], usize, usize),
    (bt, ld): (&[f32], usize),
    (out, out_ld): (&mut [f32], usize),
) {
    assert!(
        depth == 0 || ((depth - 1) * ld + C * LANES <= bt.len() && (R - 1) * a_ld + depth <= a.len()),
        "rows_by_transposed: {R} rows of {depth}, {a_ld} apart in {}; {depth} rows of {} lanes, {ld} apart in {}",
        a.len(),
        C * LANES,
        bt.len()
    );
    let mut acc = [[V::zero(); C]; R];
    for d in 0..depth {
        // SAFETY: `d < depth`, so `bt`'s row `d` ends at `d·ld + C·LANES ≤ bt.len()` and
        // `r·a_ld + d < a.len()` for every `r < R` (asserted above). Checked, these were a
        // bounds check per row and multiply-add group.
        let row = unsafe { bt.get_unchecked(d * ld..d * ld + C * LANES) };
        let b: [V; C] = std::array::from_fn(|c| V::load(&row[c * LANES..]));
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
            acc.store(&mut out[r * out_ld + c * LANES..]);
        }
    }
}

/// `out[..C·LANES] = Σ_{j<n} w[j·ws]·m[j·ld..][..C·LANES]`: the even and the odd `j` summed
/// apart (in order) and added at the end, twice the chains of one running sum. The weights are
/// `ws` apart: a row of a matrix (`ws = 1`) or a column (`ws` its row length), each broadcast
/// from where it lies.
#[inline(always)]
pub(super) fn weighted_rows<V: Lanes8, const C: usize>(
    (w, ws, n): (&[f32], usize, usize),
    (m, ld): (&[f32], usize),
    out: &mut [f32],
) {
    assert!(
        n == 0 || ((n - 1) * ld + C * LANES <= m.len() && (n - 1) * ws < w.len()),
        "weighted_rows: {n} rows of {} lanes {ld} apart in {}, weights {ws} apart in {}",
        C * LANES,
        m.len(),
        w.len()
    );
    // Row `j < n` and its weight, unchecked: checked per row, their bounds were a tenth of the
    // kernels' time (`perf`, `cargo bench --bench short_attention`).
    let row = |j: usize| {
        // SAFETY: `j < n`, and row `n − 1` ends at `(n − 1)·ld + C·LANES ≤ m.len()` and its
        // weight is at `(n − 1)·ws < w.len()` (asserted above).
        unsafe {
            (
                m.get_unchecked(j * ld..j * ld + C * LANES),
                V::splat(*w.get_unchecked(j * ws)),
            )
        }
    };
    let mut even = [V::zero(); C];
    let mut odd = [V::zero(); C];
    let mut j = 0;
    while j < n {
        let (r, x) = row(j);
        for (c, acc) in even.iter_mut().enumerate() {
            *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
        }
        if j + 1 < n {
            let (r, x) = row(j + 1);
            for (c, acc) in odd.iter_mut().enumerate() {
                *acc = x.mul_add(V::load(&r[c * LANES..]), *acc);
            }
        }
        j += 2;
    }
    for (c, (e, o)) in even.iter().zip(&odd).enumerate() {
        e.add(*o).store(&mut out[c * LANES..]);
    }
}

/// `out[d·ld + j] = m[j·stride + d]` for the `rows` rows of `m` (`stride` a multiple of
/// [`LANES`]) and `d < depth`, lanes `rows..` of each of `out`'s rows zero up to the next
/// multiple of [`LANES`]: blocks of 8 × 8 through registers ([`Lanes8::transpose8`]).
#[inline(always)]
pub(super) fn transpose<V: Lanes8>(
    (m, stride, rows): (&[f32], usize, usize),
    depth: usize,
    (out, ld): (&mut [f32], usize),
) {
    for j in (0..rows).step_by(LANES) {
        for d in (0..depth).step_by(LANES) {
            let block: [V; LANES] = std::array::from_fn(|r| {
                if j + r < rows {
                    V::load(&m[(j + r) * stride + d..])
                } else {
                    V::zero()
                }
            });
            for (c, col) in V::transpose8(block).into_iter().enumerate() {
                if d + c < depth {
                    col.store(&mut out[(d + c) * ld + j..]);
                }
            }
        }
    }
}
