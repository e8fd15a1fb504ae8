//! `gemm_epilogue_uninit` (a product into a new buffer's spare capacity) against
//! `gemm_epilogue_slices` into an initialised C: the same call underneath, so the bits must be
//! identical. The spare capacity is first filled with NaN (all-ones bits): a kernel that read
//! C's old value, or left an element unwritten, shows up as a NaN or a mismatch.

mod common;

use std::mem::MaybeUninit;

use common::{at_each_level, panic_message, Elem, Layout, Mat};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::Rng;
use typed_amp_kernels::{
    gemm_epilogue_slices, gemm_epilogue_uninit, level, Activation, Epilogue, GemmElem, GemmOut,
    MatMut,
};

/// All-ones bits: NaN in every float format.
fn poison<C: Copy>() -> C {
    // SAFETY: every output type (f32, f16, bf16) is plain bits, and all-ones is a NaN of each.
    unsafe { std::mem::transmute_copy(&[u8::MAX; 4]) }
}

fn check<T: Elem + GemmElem, C: Elem + GemmOut<T>>(
    rng: &mut StdRng,
    (m, n, k): (usize, usize, usize),
    option: usize,
    threads: usize,
) {
    let a = Mat::<T>::random(rng, m, k, [Layout::RowMajor, Layout::ColMajor][option % 2]);
    let b = Mat::<T>::random(
        rng,
        k,
        n,
        [Layout::ColMajor, Layout::RowMajor][option / 2 % 2],
    );
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let epi = Epilogue {
        alpha: [1.0, 0.25][option / 4 % 2],
        accumulate: false,
        bias: option.is_multiple_of(3).then_some(&bias[..]),
        activation: [Activation::None, Activation::Relu][option / 8 % 2],
        report_non_finite: true,
    };
    let mut want = vec![C::default(); m * n];
    let want_report = gemm_epilogue_slices(
        a.view(),
        b.view(),
        MatMut {
            data: &mut want,
            rows: m,
            cols: n,
            rs: n,
            cs: 1,
        },
        &epi,
        threads,
    );
    let mut got: Vec<C> = Vec::with_capacity(m * n + 3);
    let spare = got.spare_capacity_mut();
    spare.fill(MaybeUninit::new(poison::<C>()));
    let report = gemm_epilogue_uninit(a.view(), b.view(), spare, &epi, threads);
    // SAFETY: the call initialised the first m·n elements (its contract, checked below).
    unsafe { got.set_len(m * n) };
    let ctx = || {
        format!(
            "{}→{} {:?} {m}×{n}×{k} option {option}",
            T::NAME,
            C::NAME,
            level()
        )
    };
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.bits(), w.bits(), "{}: element {i}", ctx());
    }
    assert_eq!(report, want_report, "{}", ctx());
    // The elements past C's are the caller's: untouched.
    // SAFETY: the three spare elements were initialised (to the poison) before the call.
    let tail = unsafe { std::slice::from_raw_parts(got.as_ptr().add(m * n), 3) };
    assert!(
        tail.iter().all(|x| x.bits() == poison::<C>().bits()),
        "{}",
        ctx()
    );
}

#[test]
fn a_new_buffer_gets_the_bits_of_an_initialised_one() {
    at_each_level(
        "a_new_buffer_gets_the_bits_of_an_initialised_one",
        |rng, _| {
            // k = 0 (the epilogue alone), one k, the f32 and the 16-bit k blocks crossed (an FP32
            // C's running sum across blocks reads back what its first block wrote), a thin C
            // (computed transposed) and a split over two threads.
            let shapes = [
                (5, 9, 0, 1),
                (1, 1, 1, 1),
                (17, 33, 29, 1),
                (37, 45, 600, 1),
                (300, 7, 513, 2),
                (130, 140, 300, 2),
            ];
            for (s, &(m, n, k, threads)) in shapes.iter().enumerate() {
                for option in [s, s + 5, s + 10] {
                    check::<f32, f32>(rng, (m, n, k), option, threads);
                    check::<f16, f16>(rng, (m, n, k), option, threads);
                    check::<bf16, bf16>(rng, (m, n, k), option, threads);
                    check::<f16, f32>(rng, (m, n, k), option, threads);
                    check::<bf16, f32>(rng, (m, n, k), option, threads);
                }
            }
        },
    );
}

#[test]
fn accumulating_into_a_new_buffer_or_a_short_one_is_refused() {
    let a = [1.0f32; 6];
    let view = |d| typed_amp_kernels::MatRef {
        data: d,
        rows: 2,
        cols: 3,
        rs: 3,
        cs: 1,
    };
    let b = typed_amp_kernels::MatRef {
        data: &a[..],
        rows: 3,
        cols: 2,
        rs: 2,
        cs: 1,
    };
    let mut c: Vec<f32> = Vec::with_capacity(4);
    let accumulate = panic_message(|| {
        gemm_epilogue_uninit(
            view(&a[..]),
            b,
            &mut c.spare_capacity_mut()[..4],
            &Epilogue::ACCUMULATE,
            1,
        );
    });
    assert!(accumulate.is_some_and(|m| m.contains("accumulate")));
    let short = panic_message(|| {
        gemm_epilogue_uninit(
            view(&a[..]),
            b,
            &mut c.spare_capacity_mut()[..3],
            &Epilogue::STORE,
            1,
        );
    });
    assert!(short.is_some_and(|m| m.contains("needs 4 elements")));
}
