//! Matrix products over buffers of any precision on `typed_amp_kernels`' GEMM, for the ops' CPU
//! kernels: the buffers' element type mapped to the GEMM's (the same layout), strided views, and
//! the thread count.

use std::mem::MaybeUninit;

use dfdx::prelude::CpuError;
use typed_amp_kernels::{
    gemm_epilogue_slices, gemm_epilogue_uninit, gemm_packed_b, gemm_slices, Epilogue, GemmElem,
    GemmOut, MatMut, MatRef, PackedB,
};

use crate::precision::{AmpElem, Indexed};

/// `typed_amp_kernels`' element type for `E` (the same layout).
fn gemm_view<E: AmpElem, K: GemmElem>(buf: &[E]) -> &[K] {
    debug_assert_eq!(std::mem::size_of::<E>(), std::mem::size_of::<K>());
    // SAFETY: callers pass `K` of `E`'s layout (see `with_gemm_elem`): `f32` for `f32`,
    // `half::f16` and `half::bf16` for themselves.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<K>(), buf.len()) }
}

fn gemm_view_mut<E: AmpElem, K: Copy>(buf: &mut [E]) -> &mut [K] {
    debug_assert_eq!(std::mem::size_of::<E>(), std::mem::size_of::<K>());
    // SAFETY: as in `gemm_view`; the unique borrow is carried over.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<K>(), buf.len()) }
}

/// A strided view of `rows × cols` elements of a buffer of `E` as `K`.
fn mat_ref<E: AmpElem, K: GemmElem>(
    (data, rs, cs): (&[E], usize, usize),
    rows: usize,
    cols: usize,
) -> MatRef<'_, K> {
    MatRef {
        data: gemm_view::<E, K>(data),
        rows,
        cols,
        rs,
        cs,
    }
}

/// `$run::<E, F, K, C>(args)` with the GEMM's operand type `K` for `E` and its output type `C`
/// for `F` (`E` itself, or FP32 for 16-bit operands), chosen by their places in the list of
/// precisions (`with_precisions!`).
macro_rules! by_gemm_types {
    ($e:ident, $f:ident, $run:ident($($arg:expr),* $(,)?)) => {{
        let f16 = <half::f16 as Indexed>::INDEX;
        let bf16 = <half::bf16 as Indexed>::INDEX;
        match ($e::INDEX, $f::INDEX == $e::INDEX) {
            (i, true) if i == f16 => $run::<$e, $f, half::f16, half::f16>($($arg),*),
            (i, false) if i == f16 => $run::<$e, $f, half::f16, f32>($($arg),*),
            (i, true) if i == bf16 => $run::<$e, $f, half::bf16, half::bf16>($($arg),*),
            (i, false) if i == bf16 => $run::<$e, $f, half::bf16, f32>($($arg),*),
            _ => $run::<$e, $f, f32, f32>($($arg),*),
        }
    }};
}

/// `C = A·B` (or `C += A·B`) for buffers of `E`, on `typed_amp_kernels::gemm_slices`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<E: AmpElem>(
    (m, k, n): (usize, usize, usize),
    a: (&[E], usize, usize),
    b: (&[E], usize, usize),
    c: (&mut [E], usize, usize),
    accumulate: bool,
) {
    fn run<E: AmpElem, K: GemmElem>(
        (m, k, n): (usize, usize, usize),
        a: (&[E], usize, usize),
        b: (&[E], usize, usize),
        c: (&mut [E], usize, usize),
        accumulate: bool,
    ) {
        let (cdata, c_rs, c_cs) = c;
        gemm_slices::<K>(
            mat_ref::<E, K>(a, m, k),
            mat_ref::<E, K>(b, k, n),
            gemm_view_mut::<E, K>(cdata),
            c_rs,
            c_cs,
            accumulate,
            rayon::current_num_threads(),
        );
    }
    // The element type by its place in the list of precisions (`with_precisions!`).
    match E::INDEX {
        i if i == <half::f16 as Indexed>::INDEX => {
            run::<E, half::f16>((m, k, n), a, b, c, accumulate)
        }
        i if i == <half::bf16 as Indexed>::INDEX => {
            run::<E, half::bf16>((m, k, n), a, b, c, accumulate)
        }
        _ => run::<E, f32>((m, k, n), a, b, c, accumulate),
    }
}

/// `C = epilogue(A·B)` for operands of `E` into a C of `F` (`E`, or FP32 for 16-bit operands),
/// on `typed_amp_kernels::gemm_epilogue_slices`.
pub(crate) fn gemm_into<E: AmpElem, F: AmpElem>(
    dims: (usize, usize, usize),
    a: (&[E], usize, usize),
    b: (&[E], usize, usize),
    c: (&mut [F], usize, usize),
    epilogue: &Epilogue<'_>,
) {
    gemm_into_on(rayon::current_num_threads(), dims, a, b, c, epilogue);
}

/// [`gemm_into`] on at most `threads` threads (1 inside a task that is already one of many
/// parallel ones, as attention's per-head products are).
pub(crate) fn gemm_into_on<E: AmpElem, F: AmpElem>(
    threads: usize,
    (m, k, n): (usize, usize, usize),
    a: (&[E], usize, usize),
    b: (&[E], usize, usize),
    c: (&mut [F], usize, usize),
    epilogue: &Epilogue<'_>,
) {
    fn run<E: AmpElem, F: AmpElem, K: GemmElem, C: GemmOut<K>>(
        threads: usize,
        (m, k, n): (usize, usize, usize),
        a: (&[E], usize, usize),
        b: (&[E], usize, usize),
        (cdata, c_rs, c_cs): (&mut [F], usize, usize),
        epilogue: &Epilogue<'_>,
    ) {
        gemm_epilogue_slices::<K, C>(
            mat_ref::<E, K>(a, m, k),
            mat_ref::<E, K>(b, k, n),
            MatMut {
                data: gemm_view_mut::<F, C>(cdata),
                rows: m,
                cols: n,
                rs: c_rs,
                cs: c_cs,
            },
            epilogue,
            threads,
        );
    }
    by_gemm_types!(E, F, run(threads, (m, k, n), a, b, c, epilogue))
}

/// `C = epilogue(A·B)` (the epilogue must not accumulate) into a new row-major `m × n` buffer
/// of `F` that the product writes whole: no zero fill first, which for a training step's
/// large outputs was a pass over memory as long as the store itself.
pub(crate) fn gemm_new<E: AmpElem, F: AmpElem>(
    (m, k, n): (usize, usize, usize),
    a: (&[E], usize, usize),
    b: (&[E], usize, usize),
    epilogue: &Epilogue<'_>,
) -> Result<Vec<F>, CpuError> {
    fn run<E: AmpElem, F: AmpElem, K: GemmElem, C: GemmOut<K>>(
        (m, k, n): (usize, usize, usize),
        a: (&[E], usize, usize),
        b: (&[E], usize, usize),
        c: &mut [MaybeUninit<F>],
        epilogue: &Epilogue<'_>,
    ) {
        // `F` is `E` or FP32 (the callers'); anything else would be a misuse caught here.
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<C>());
        // SAFETY: `C` has `F`'s layout (see `gemm_view`); the unique borrow is carried over,
        // and nothing is read through the view before the product writes it.
        let c = unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast(), c.len()) };
        gemm_epilogue_uninit::<K, C>(
            mat_ref::<E, K>(a, m, k),
            mat_ref::<E, K>(b, k, n),
            c,
            epilogue,
            rayon::current_num_threads(),
        );
    }
    let len = m.checked_mul(n).ok_or(CpuError::OutOfMemory)?;
    let mut out: Vec<F> = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| CpuError::OutOfMemory)?;
    let c = &mut out.spare_capacity_mut()[..len];
    by_gemm_types!(E, F, run((m, k, n), a, b, c, epilogue));
    // SAFETY: `gemm_epilogue_uninit` initialised the first `len` elements (its contract).
    unsafe { out.set_len(len) };
    Ok(out)
}

/// Packs the `rows × cols` view `b` of a buffer of `E` into `packed`, for
/// [`gemm_packed_into`]'s products with an A of `E`.
pub(crate) fn pack_b<E: AmpElem>(
    packed: &mut PackedB,
    b: (&[E], usize, usize),
    (rows, cols): (usize, usize),
) {
    match E::INDEX {
        i if i == <half::f16 as Indexed>::INDEX => {
            packed.pack(mat_ref::<E, half::f16>(b, rows, cols))
        }
        i if i == <half::bf16 as Indexed>::INDEX => {
            packed.pack(mat_ref::<E, half::bf16>(b, rows, cols))
        }
        _ => packed.pack(mat_ref::<E, f32>(b, rows, cols)),
    }
}

/// `C = epilogue(A · B)` on the calling thread for an `m × k` A of `E`, B the `k × n` block at
/// `(k0, j0)` of `packed` (packed by [`pack_b`] from `E`), into an FP32 C, on
/// `typed_amp_kernels::gemm_packed_b`.
pub(crate) fn gemm_packed_into<E: AmpElem>(
    (m, k, n): (usize, usize, usize),
    a: (&[E], usize, usize),
    packed: &PackedB,
    at: (usize, usize),
    (cdata, c_rs, c_cs): (&mut [f32], usize, usize),
    epilogue: &Epilogue<'_>,
) {
    fn run<E: AmpElem, K: GemmElem>(
        (m, k): (usize, usize),
        a: (&[E], usize, usize),
        packed: &PackedB,
        at: (usize, usize),
        c: MatMut<'_, f32>,
        epilogue: &Epilogue<'_>,
    ) where
        f32: GemmOut<K>,
    {
        gemm_packed_b::<K, f32>(mat_ref::<E, K>(a, m, k), packed, at, c, epilogue);
    }
    let c = MatMut {
        data: cdata,
        rows: m,
        cols: n,
        rs: c_rs,
        cs: c_cs,
    };
    match E::INDEX {
        i if i == <half::f16 as Indexed>::INDEX => {
            run::<E, half::f16>((m, k), a, packed, at, c, epilogue)
        }
        i if i == <half::bf16 as Indexed>::INDEX => {
            run::<E, half::bf16>((m, k), a, packed, at, c, epilogue)
        }
        _ => run::<E, f32>((m, k), a, packed, at, c, epilogue),
    }
}
