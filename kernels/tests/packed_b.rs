//! `gemm_packed_b` against `gemm_epilogue_slices` on the same block of B: the same kernels, the
//! same k blocks and the same order of each element's sum, so the bits must be identical, for
//! every element type, layout of A and C, epilogue and block position, at every level this CPU
//! supports (and the bf16-pair emulation where AVX512-BF16 is absent). Slots of C outside the
//! product must be left alone; bad blocks must panic with a message, never read past B.

mod common;

use common::{at_each_level, panic_message, Elem, Layout, Mat, LAYOUTS};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;
use typed_amp_kernels::{
    gemm_epilogue_slices, gemm_packed_b, Activation, Epilogue, GemmElem, GemmOut, MatRef, PackedB,
};

/// One product: A `m × k`, the block of B at `(k0, j0)`, `k × n`, of a packed `kb × nb`.
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    kb: usize,
    nb: usize,
    k0: usize,
    j0: usize,
}

/// Attention's shapes (64 × 64 blocks of 32- and 64-wide heads, a short last block), odd sizes,
/// one row or column, a k deeper than one k block, and blocks away from B's origin.
const CASES: [Case; 9] = [
    Case {
        m: 64,
        n: 64,
        k: 32,
        kb: 32,
        nb: 64,
        k0: 0,
        j0: 0,
    },
    Case {
        m: 64,
        n: 64,
        k: 64,
        kb: 64,
        nb: 256,
        k0: 0,
        j0: 128,
    },
    Case {
        m: 64,
        n: 32,
        k: 64,
        kb: 256,
        nb: 32,
        k0: 192,
        j0: 0,
    },
    Case {
        m: 17,
        n: 16,
        k: 17,
        kb: 81,
        nb: 16,
        k0: 64,
        j0: 0,
    },
    Case {
        m: 37,
        n: 45,
        k: 30,
        kb: 40,
        nb: 192,
        k0: 10,
        j0: 64,
    },
    Case {
        m: 1,
        n: 7,
        k: 5,
        kb: 5,
        nb: 7,
        k0: 0,
        j0: 0,
    },
    Case {
        m: 13,
        n: 1,
        k: 2,
        kb: 8,
        nb: 65,
        k0: 6,
        j0: 64,
    },
    Case {
        m: 9,
        n: 70,
        k: 600,
        kb: 640,
        nb: 134,
        k0: 40,
        j0: 64,
    },
    Case {
        m: 5,
        n: 3,
        k: 0,
        kb: 4,
        nb: 64,
        k0: 4,
        j0: 0,
    },
];

fn epilogues(bias: &[f32]) -> Vec<Epilogue<'_>> {
    vec![
        Epilogue::STORE,
        Epilogue::ACCUMULATE,
        Epilogue {
            alpha: 0.125,
            ..Epilogue::ACCUMULATE
        },
        Epilogue {
            alpha: -1.5,
            bias: Some(bias),
            activation: Activation::Relu,
            ..Epilogue::STORE
        },
    ]
}

fn check<T: Elem + GemmElem, C: Elem + GemmOut<T>>(rng: &mut StdRng, pairs: bool) {
    let mut packed = PackedB::new();
    for cs in CASES {
        // On the pair path a block starts on an even row and ends on one or at B's end.
        let (k0, k) = if pairs && T::NAME == "bf16" && (cs.k0 % 2 == 1 || cs.k % 2 == 1) {
            (cs.k0 & !1, (cs.kb - (cs.k0 & !1)).min(cs.k + 1) & !1)
        } else {
            (cs.k0, cs.k)
        };
        for lb in [Layout::RowMajor, Layout::ColMajor, Layout::Sparse] {
            let b = Mat::<T>::random(rng, cs.kb, cs.nb, lb);
            packed.pack(b.view());
            assert_eq!((packed.rows(), packed.cols()), (cs.kb, cs.nb));
            assert!(cs.j0.is_multiple_of(packed.column_align()));
            let block = MatRef {
                data: &b.data[if k == 0 { 0 } else { b.idx(k0, cs.j0) }..],
                rows: k,
                cols: cs.n,
                rs: b.rs,
                cs: b.cs,
            };
            let bias: Vec<f32> = (0..cs.n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for la in LAYOUTS {
                for lc in [Layout::RowMajor, Layout::ColMajor, Layout::PaddedRows] {
                    let a = Mat::<T>::random(rng, cs.m, k, la);
                    for (e, epi) in epilogues(&bias).iter().enumerate() {
                        let mut want = Mat::<C>::random(rng, cs.m, cs.n, lc);
                        let mut got = want.clone();
                        let r1 = gemm_epilogue_slices(a.view(), block, want.view_mut(), epi, 1);
                        let r2 = gemm_packed_b(a.view(), &packed, (k0, cs.j0), got.view_mut(), epi);
                        let what = format!(
                            "{}→{} {cs:?} k0 {k0} k {k} A {la:?} B {lb:?} C {lc:?} epilogue {e}",
                            T::NAME,
                            C::NAME
                        );
                        // Every slot, inside the product and between its elements.
                        for (i, (w, g)) in want.data.iter().zip(&got.data).enumerate() {
                            assert_eq!(w.bits(), g.bits(), "{what}: slot {i}: {w:?} vs {g:?}");
                        }
                        assert_eq!(r1.non_finite, r2.non_finite, "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn packed_b_products_match_gemm_bit_for_bit() {
    at_each_level("packed_b_products_match_gemm_bit_for_bit", |rng, pairs| {
        check::<f32, f32>(rng, pairs);
        check::<f16, f32>(rng, pairs);
        check::<f16, f16>(rng, pairs);
        check::<bf16, f32>(rng, pairs);
        check::<bf16, bf16>(rng, pairs);
    });
}

/// A plain store that asks for the non-finite check.
const REPORT: Epilogue<'static> = Epilogue {
    report_non_finite: true,
    ..Epilogue::STORE
};

/// A non-finite sum is reported, as `gemm_epilogue_slices` reports it, where the epilogue asks.
#[test]
fn packed_b_reports_non_finite() {
    let mut b = vec![0.5f32; 64 * 64];
    b[3 * 64 + 20] = f32::NAN;
    let mut packed = PackedB::new();
    packed.pack(MatRef {
        data: &b,
        rows: 64,
        cols: 64,
        rs: 64,
        cs: 1,
    });
    let a = vec![1.0f32; 8 * 64];
    let a = MatRef {
        data: &a,
        rows: 8,
        cols: 64,
        rs: 64,
        cs: 1,
    };
    let mut c = vec![0.0f32; 8 * 16];
    fn c_view(c: &mut [f32]) -> typed_amp_kernels::MatMut<'_, f32> {
        typed_amp_kernels::MatMut {
            data: c,
            rows: 8,
            cols: 16,
            rs: 16,
            cs: 1,
        }
    }
    let r = gemm_packed_b(a, &packed, (0, 16), c_view(&mut c), &REPORT);
    // Column 20 of B is column 4 of the block.
    let nan_column = c
        .iter()
        .enumerate()
        .all(|(i, x)| x.is_nan() == (i % 16 == 4));
    assert!(r.non_finite && nan_column, "{c:?}");
    let r = gemm_packed_b(a, &packed, (0, 32), c_view(&mut c), &REPORT);
    assert!(!r.non_finite && c.iter().all(|&x| x == 32.0), "{c:?}");
}

fn panics(f: impl FnOnce()) -> String {
    panic_message(f).expect("should have panicked")
}

/// Blocks outside B, columns off the panels, another element type: a clear panic, no read.
#[test]
fn packed_b_rejects_bad_blocks() {
    let b = vec![1.0f32; 40 * 70];
    let mut packed = PackedB::new();
    packed.pack(MatRef {
        data: &b,
        rows: 40,
        cols: 70,
        rs: 70,
        cs: 1,
    });
    let run = |m: usize, k: usize, n: usize, k0: usize, j0: usize| {
        let packed = &packed;
        move || {
            let a = vec![1.0f32; m * k];
            let mut c = vec![0.0f32; m * n];
            gemm_packed_b(
                MatRef {
                    data: &a,
                    rows: m,
                    cols: k,
                    rs: k,
                    cs: 1,
                },
                packed,
                (k0, j0),
                typed_amp_kernels::MatMut {
                    data: &mut c,
                    rows: m,
                    cols: n,
                    rs: n,
                    cs: 1,
                },
                &Epilogue::STORE,
            );
        }
    };
    assert!(panics(run(4, 8, 8, 33, 0)).contains("reaches past"));
    assert!(panics(run(4, 8, 8, 0, 64)).contains("reaches past"));
    assert!(panics(run(4, 8, 8, usize::MAX, 0)).contains("reaches past"));
    assert!(panics(run(4, 8, 8, 0, 3)).contains("not a multiple"));
    let packed16 = {
        let b16 = vec![f16::ONE; 16];
        let mut p = PackedB::new();
        p.pack(MatRef {
            data: &b16,
            rows: 4,
            cols: 4,
            rs: 4,
            cs: 1,
        });
        p
    };
    let msg = panics(move || {
        let a = [1.0f32; 4];
        let mut c = [0.0f32; 4];
        gemm_packed_b(
            MatRef {
                data: &a,
                rows: 1,
                cols: 4,
                rs: 4,
                cs: 1,
            },
            &packed16,
            (0, 0),
            typed_amp_kernels::MatMut {
                data: &mut c,
                rows: 1,
                cols: 4,
                rs: 4,
                cs: 1,
            },
            &Epilogue::STORE,
        );
    });
    assert!(msg.contains("packed as"), "{msg}");
    // A packed B of nothing multiplies into nothing (a 0-row C), and an empty k stores the
    // epilogue of a zero sum.
    let empty = PackedB::new();
    let mut c = [7.0f32; 2];
    gemm_packed_b(
        MatRef::<f32> {
            data: &[],
            rows: 2,
            cols: 0,
            rs: 0,
            cs: 1,
        },
        &empty,
        (0, 0),
        typed_amp_kernels::MatMut {
            data: &mut c,
            rows: 2,
            cols: 0,
            rs: 1,
            cs: 1,
        },
        &Epilogue::STORE,
    );
    assert_eq!(c, [7.0; 2]);
    // Zero strides describe a huge B over one element: its panels' size is refused, not wrapped.
    let one = [1.0f32];
    let msg = panics(move || {
        PackedB::new().pack(MatRef {
            data: &one,
            rows: 1 << 33,
            cols: 1 << 33,
            rs: 0,
            cs: 0,
        });
    });
    assert!(msg.contains("does not fit"), "{msg}");
}
