//! Per-thread FP32 scratch for the CPU kernels' parallel tasks.
//!
//! A parallel task's working rows (a row widened to FP32, a gradient row) used to be a fresh
//! `vec![0f32; width]` per task. `vec!` of zeros is `calloc`, which glibc serves without its
//! per-thread cache, under the arena's lock; and the binaries keep one arena for every thread
//! ([`keep_freed_memory`](crate::device::keep_freed_memory)), so the pool's two threads queued
//! for it and slept on it: about 5% of the ViT's step in `perf` (layer norm's tasks, session 50).
//! A buffer kept per thread between calls costs one allocation per thread for the whole run.

use std::cell::RefCell;

thread_local! {
    static F32_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `N` disjoint FP32 buffers of `len` elements each, carved from this thread's
/// scratch. Their contents are unspecified (whatever the last task left): write before reading.
///
/// Re-entrant: a call made inside `f` on the same thread finds the scratch taken and allocates
/// its own, and the larger of the two buffers is kept afterwards.
pub(crate) fn with_f32_scratch<const N: usize, R>(
    len: usize,
    f: impl FnOnce([&mut [f32]; N]) -> R,
) -> R {
    let mut buf = F32_SCRATCH.with(RefCell::take);
    let total = N * len;
    if buf.len() < total {
        buf.resize(total, 0.0);
    }
    let mut rest = &mut buf[..total];
    let parts: [&mut [f32]; N] = std::array::from_fn(|_| {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        part
    });
    let result = f(parts);
    F32_SCRATCH.with(|cell| {
        if cell.borrow().len() < buf.len() {
            cell.replace(buf);
        }
    });
    result
}

#[cfg(test)]
mod tests {
    use super::with_f32_scratch;

    #[test]
    fn parts_are_disjoint_and_sized() {
        with_f32_scratch::<3, _>(5, |[a, b, c]| {
            assert_eq!((a.len(), b.len(), c.len()), (5, 5, 5));
            a.fill(1.0);
            b.fill(2.0);
            c.fill(3.0);
            assert!(a.iter().all(|&v| v == 1.0) && b.iter().all(|&v| v == 2.0));
        });
    }

    #[test]
    fn nested_calls_get_their_own_buffers() {
        with_f32_scratch::<1, _>(4, |[outer]| {
            outer.fill(7.0);
            with_f32_scratch::<2, _>(8, |[x, y]| {
                x.fill(1.0);
                y.fill(2.0);
            });
            assert!(outer.iter().all(|&v| v == 7.0));
        });
    }

    #[test]
    fn zero_length_parts() {
        assert_eq!(with_f32_scratch::<2, _>(0, |[a, b]| a.len() + b.len()), 0);
    }
}
