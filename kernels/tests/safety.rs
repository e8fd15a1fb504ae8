//! The safe entry points (`gemm_slices`, `gemm_epilogue_slices`) under hostile views: every
//! call either panics cleanly or computes the right product (against a naive f64 one) without
//! touching any slot of C outside the view; a view that reaches outside its slice, or whose
//! last offset overflows `usize`, or a C whose distinct elements share a slot, must panic.
//!
//! Tolerance: an f32 result of `k` products plus C's old value is within `γₙ·S` of the exact
//! sum (`n = k + 1`, `γₙ = n·u/(1 − n·u)`, `u = 2⁻²⁴`, `S` the sum of magnitudes; Higham §3.1),
//! and a 16-bit store adds `u_T` times the value (see tests/gemm.rs).

mod common;

use std::collections::HashSet;

use common::{panic_message, Elem};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use typed_amp_kernels::{
    gemm_epilogue_slices, gemm_slices, Epilogue, GemmElem, GemmOut, MatMut, MatRef,
};

/// A view's shape and strides over a buffer of `len` elements.
#[derive(Clone, Copy, Debug)]
struct View {
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
    len: usize,
}

/// The exact last offset, or `None` for an empty view (u128 cannot overflow here).
fn last_offset(v: &View) -> Option<u128> {
    if v.rows == 0 || v.cols == 0 {
        return None;
    }
    Some((v.rows as u128 - 1) * v.rs as u128 + (v.cols as u128 - 1) * v.cs as u128)
}

fn in_bounds(v: &View) -> bool {
    last_offset(v).is_none_or(|l| l < v.len as u128)
}

/// Brute force: do distinct (i, j) map to distinct offsets?
fn injective(v: &View) -> bool {
    let mut seen = HashSet::new();
    for i in 0..v.rows {
        for j in 0..v.cols {
            if !seen.insert(i as u128 * v.rs as u128 + j as u128 * v.cs as u128) {
                return false;
            }
        }
    }
    true
}

/// Strides a hostile caller might pass for a `rows × cols` view, with a buffer usually just
/// long enough for them, sometimes one element short, and short whatever the length when the
/// last offset overflows.
fn hostile(rng: &mut StdRng, rows: usize, cols: usize) -> View {
    let (rs, cs) = match rng.gen_range(0..11) {
        0 => (cols, 1),                             // row-major
        1 => (1, rows),                             // column-major (transposed)
        2 => (cols + 3, 1),                         // padded rows
        3 => (2, 2 * rows + 1),                     // sparse
        4 => (if rows <= 1 { 0 } else { cols }, 1), // zero stride on a length-1 dimension
        5 => (1, if cols <= 1 { 0 } else { rows }),
        6 => (if rows <= 1 { usize::MAX } else { cols }, 1), // huge stride, length 1: harmless
        // Zero stride on a longer dimension: fine to read (a broadcast), a race to write.
        7 => (0, 1),
        8 => (1, 0),
        // Strides whose last offset overflows usize (it would wrap to a small index).
        9 => (usize::MAX / 2 + 7, usize::MAX / 2 + 7),
        _ => (cols, cols), // overlapping for a writable view with rows, cols > 1
    };
    let len = if rows == 0 || cols == 0 {
        rng.gen_range(0..3)
    } else if let Some(l) = (rows - 1)
        .checked_mul(rs)
        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)))
    {
        if l > 1 << 20 {
            // A huge stride that does not overflow: no buffer here is that long.
            16
        } else if rng.gen_range(0..6) == 0 {
            // Usually exactly long enough, sometimes one short (must panic).
            l
        } else {
            l + 1 + rng.gen_range(0..3)
        }
    } else {
        16
    };
    View {
        rows,
        cols,
        rs,
        cs,
        len,
    }
}

fn mr<T>(d: &[T], v: View) -> MatRef<'_, T> {
    MatRef {
        data: d,
        rows: v.rows,
        cols: v.cols,
        rs: v.rs,
        cs: v.cs,
    }
}

fn fill<T: Elem>(rng: &mut StdRng, len: usize) -> Vec<T> {
    (0..len)
        .map(|_| T::from_f32(rng.gen_range(-1.0f32..1.0)))
        .collect()
}

/// One random call of either entry point; checks the outcome against the oracle.
/// Returns whether the call panicked.
fn one_case<T: Elem + GemmElem, C: Elem + GemmOut<T>>(rng: &mut StdRng, epilogue: bool) -> bool {
    const DIMS: [usize; 8] = [0, 1, 1, 2, 3, 5, 17, 33];
    let (m, n, k) = (
        DIMS[rng.gen_range(0..8)],
        DIMS[rng.gen_range(0..8)],
        DIMS[rng.gen_range(0..8)],
    );
    let (va, vb, vc) = (hostile(rng, m, k), hostile(rng, k, n), hostile(rng, m, n));
    let a = fill::<T>(rng, va.len);
    let b = fill::<T>(rng, vb.len);
    let c0 = fill::<C>(rng, vc.len);
    let mut c = c0.clone();
    let accumulate = rng.gen_bool(0.5);
    let threads = rng.gen_range(1..=3);
    let outcome = panic_message(|| {
        if epilogue {
            let e = Epilogue {
                accumulate,
                ..Epilogue::STORE
            };
            let cv = MatMut {
                data: &mut c,
                rows: m,
                cols: n,
                rs: vc.rs,
                cs: vc.cs,
            };
            let r = gemm_epilogue_slices::<T, C>(mr(&a, va), mr(&b, vb), cv, &e, threads);
            assert!(!r.non_finite);
        } else {
            // gemm_slices writes T: only called with C = T (checked by the caller).
            // SAFETY: C and T are the same type here, so this is the same vector.
            let ct: &mut Vec<T> = unsafe { &mut *(&mut c as *mut Vec<C> as *mut Vec<T>) };
            gemm_slices(
                mr(&a, va),
                mr(&b, vb),
                ct,
                vc.rs,
                vc.cs,
                accumulate,
                threads,
            );
        }
    });
    let ctx = format!(
        "{}→{} epilogue {epilogue} m {m} n {n} k {k} A {va:?} B {vb:?} C {vc:?}",
        T::NAME,
        C::NAME
    );
    let must_panic = !in_bounds(&va) || !in_bounds(&vb) || !in_bounds(&vc) || !injective(&vc);
    let panicked = outcome.is_some();
    match outcome {
        Some(msg) => {
            assert!(msg.starts_with("gemm: "), "{ctx}: unexpected panic {msg:?}");
            // The only panic allowed on a valid call: the conservative overlap check on
            // interleaved strides (none of the layouts above is one, except equal strides).
            if !must_panic {
                assert!(
                    msg.contains("one location") && vc.rs == vc.cs && m > 1 && n > 1,
                    "{ctx}: panicked on a valid call: {msg}"
                );
            }
        }
        None => {
            assert!(!must_panic, "{ctx}: an invalid call did not panic");
            let u = 2f64.powi(-24);
            let nt = (k + 1) as f64;
            let gamma = nt * u / (1.0 - nt * u);
            let mut touched = vec![false; c.len()];
            for i in 0..m {
                for j in 0..n {
                    let idx = i * vc.rs + j * vc.cs;
                    touched[idx] = true;
                    let old = if accumulate { c0[idx].to_f64() } else { 0.0 };
                    let (mut s, mut mag) = (old, old.abs());
                    for p in 0..k {
                        let x =
                            a[i * va.rs + p * va.cs].to_f64() * b[p * vb.rs + j * vb.cs].to_f64();
                        s += x;
                        mag += x.abs();
                    }
                    // + n·2⁻¹²⁶ for vdpbf16ps's flushed subnormals, + the f64 reference's own
                    // error.
                    let tol = gamma * mag
                        + C::U * (s.abs() + gamma * mag)
                        + C::ABS
                        + nt * 2f64.powi(-126)
                        + 2f64.powi(-49) * nt * mag;
                    let got = c[idx].to_f64();
                    assert!(
                        (got - s).abs() <= tol,
                        "{ctx}: C[{i},{j}] = {got}, want {s} ± {tol}"
                    );
                }
            }
            for (idx, t) in touched.iter().enumerate() {
                if !t {
                    assert_eq!(
                        c[idx].bits(),
                        c0[idx].bits(),
                        "{ctx}: wrote outside C at {idx}"
                    );
                }
            }
        }
    }
    panicked
}

/// Silences the expected panics' messages (but not any other panic's).
fn quiet_expected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(|s| s.as_str())
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !msg.starts_with("gemm: ") {
            default(info);
        }
    }));
}

#[test]
fn hostile_views_panic_or_compute_correctly() {
    quiet_expected_panics();
    let mut rng = StdRng::seed_from_u64(0x5afe);
    let mut panicked = 0;
    let total = 5 * 3000;
    for _ in 0..3000 {
        panicked += one_case::<f32, f32>(&mut rng, false) as usize;
        panicked += one_case::<bf16, bf16>(&mut rng, false) as usize;
        panicked += one_case::<f32, f32>(&mut rng, true) as usize;
        panicked += one_case::<bf16, f32>(&mut rng, true) as usize;
        panicked += one_case::<half::f16, half::f16>(&mut rng, true) as usize;
    }
    println!("{total} calls, {panicked} rejected");
    // Both outcomes must be well represented for the test to mean anything.
    assert!(panicked > total / 10 && panicked < total * 9 / 10);
}

/// The two holes the old checks had, directly.
#[test]
fn wrapping_strides_and_zero_stride_c_are_rejected() {
    quiet_expected_panics();
    let a = [1.0f32; 4];
    let v = |rs, cs| MatRef {
        data: &a,
        rows: 2,
        cols: 2,
        rs,
        cs,
    };
    // (2 − 1)·usize::MAX + (2 − 1)·1 wraps to 0 in release: must not pass as "index 0".
    let msg = panic_message(|| {
        let mut c = [0.0f32; 4];
        gemm_slices(v(usize::MAX, 1), v(2, 1), &mut c, 2, 1, false, 1)
    });
    assert!(msg.is_some_and(|m| m.contains("overflow")));
    // C with a zero stride on its length-5 dimension (and the other of length 1): five
    // elements in one slot.
    let b5 = [1.0f32; 10];
    let msg = panic_message(|| {
        let mut c = [0.0f32; 5];
        let b = MatRef {
            data: &b5,
            rows: 2,
            cols: 5,
            rs: 5,
            cs: 1,
        };
        let a1 = MatRef {
            data: &a,
            rows: 1,
            cols: 2,
            rs: 0,
            cs: 1,
        };
        gemm_slices(a1, b, &mut c, 0, 0, false, 2)
    });
    assert!(msg.is_some_and(|m| m.contains("one location")));
    // The same C with its row stride zero on its single row is fine.
    let mut c = [0.0f32; 5];
    let b = MatRef {
        data: &b5,
        rows: 2,
        cols: 5,
        rs: 5,
        cs: 1,
    };
    let a1 = MatRef {
        data: &a,
        rows: 1,
        cols: 2,
        rs: usize::MAX,
        cs: 1,
    };
    gemm_slices(a1, b, &mut c, 0, 1, false, 2);
    assert_eq!(c, [2.0; 5]);
}

#[test]
#[should_panic(expected = "overflow")]
fn huge_stride_in_the_epilogue_wrapper_panics() {
    let a = [1.0f32; 8];
    let mut c = [0.0f32; 4];
    let r = MatRef {
        data: &a,
        rows: 2,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    let cv = MatMut {
        data: &mut c,
        rows: 2,
        cols: 2,
        rs: usize::MAX / 2 + 1,
        cs: usize::MAX / 2 + 1,
    };
    gemm_epilogue_slices(r, r, cv, &Epilogue::STORE, 1);
}

#[test]
#[should_panic(expected = "C is 3 × 2")]
fn epilogue_c_of_the_wrong_shape_panics() {
    let a = [1.0f32; 4];
    let mut c = [0.0f32; 6];
    let r = MatRef {
        data: &a,
        rows: 2,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    let cv = MatMut {
        data: &mut c,
        rows: 3,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    gemm_epilogue_slices(r, r, cv, &Epilogue::STORE, 1);
}
