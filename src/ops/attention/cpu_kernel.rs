//! The fused attention on the CPU: the kernel trait's passes, each sequence a parallel task,
//! into an existing buffer or new memory that each task zeroes just before writing it. Heads of
//! at most 64 tokens (the ViT's, the small GPT's) run `cpu_short`'s row loops; longer ones
//! `cpu_blocked`'s blocked products and online softmax.

use std::mem::MaybeUninit;

use dfdx::prelude::{Cpu, CpuError, Storage};
use rayon::prelude::*;

use super::cpu_blocked::{self, HeadGrads, Scratch};
use super::cpu_short::{self, short_head};
use super::kernel::OutputAndLse;
use super::{AttentionDims, AttentionKernel};
use crate::device::utilities::cpu::zeroed;
use crate::precision::AmpElem;

fn check(ok: bool) -> Result<(), CpuError> {
    ok.then_some(()).ok_or(CpuError::WrongNumElements)
}

/// The shapes every pass checks: non-empty heads and buffers of the right lengths.
fn check_dims(d: &AttentionDims, qkv: usize, out: usize) -> Result<(), CpuError> {
    let rows = d.batch.checked_mul(d.tokens);
    let width = d.heads.checked_mul(d.head_dim);
    let (Some(rows), Some(width)) = (rows, width) else {
        return Err(CpuError::WrongNumElements);
    };
    check(
        d.heads > 0
            && d.head_dim > 0
            && rows.checked_mul(3 * width) == Some(qkv)
            && rows.checked_mul(width) == Some(out),
    )
}

impl<E: AmpElem> AttentionKernel<E> for Cpu {
    fn try_attention_forward(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &mut <Self as Storage<E>>::Vec,
    ) -> Result<<Self as Storage<f32>>::Vec, CpuError> {
        check_dims(&d, qkv.len(), y.len())?;
        forward(self, &d, qkv, Output::Written(y))
    }

    fn try_attention_forward_new(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
    ) -> Result<OutputAndLse<Self, E>, CpuError> {
        let len = d.rows().checked_mul(d.width());
        let len = len.ok_or(CpuError::WrongNumElements)?;
        check_dims(&d, qkv.len(), len)?;
        let mut y: Vec<E> = Vec::new();
        y.try_reserve_exact(len)
            .map_err(|_| CpuError::OutOfMemory)?;
        let lse = forward(
            self,
            &d,
            qkv,
            Output::New(&mut y.spare_capacity_mut()[..len]),
        )?;
        // SAFETY: `forward` zeroed every sequence's rows of the new buffer (and then wrote
        // them), the sequences covering `0..len`.
        unsafe { y.set_len(len) };
        Ok((self.storage_from_vec(y), lse))
    }

    fn try_attention_backward(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
        (dqkv, accumulate): (&mut <Self as Storage<E>>::Vec, bool),
    ) -> Result<(), CpuError> {
        check_backward_dims(&d, qkv, y, dy, lse, dqkv.len())?;
        let dqkv = if accumulate {
            Output::AddedTo(dqkv)
        } else {
            Output::Written(dqkv)
        };
        backward(&d, qkv, (y, dy), lse, dqkv);
        Ok(())
    }

    fn try_attention_backward_new(
        &self,
        d: AttentionDims,
        qkv: &<Self as Storage<E>>::Vec,
        y: &<Self as Storage<E>>::Vec,
        dy: &<Self as Storage<E>>::Vec,
        lse: &<Self as Storage<f32>>::Vec,
    ) -> Result<<Self as Storage<E>>::Vec, CpuError> {
        let len = qkv.len();
        check_backward_dims(&d, qkv, y, dy, lse, len)?;
        let mut dqkv: Vec<E> = Vec::new();
        dqkv.try_reserve_exact(len)
            .map_err(|_| CpuError::OutOfMemory)?;
        backward(
            &d,
            qkv,
            (y, dy),
            lse,
            Output::New(&mut dqkv.spare_capacity_mut()[..len]),
        );
        // SAFETY: `backward` zeroed every sequence's part of the new buffer (and then wrote
        // it), the sequences covering `0..len`.
        unsafe { dqkv.set_len(len) };
        Ok(self.storage_from_vec(dqkv))
    }
}

/// Where a pass puts its result.
enum Output<'a, E> {
    /// Written over an existing buffer.
    Written(&'a mut [E]),
    /// Added to an existing buffer.
    AddedTo(&'a mut [E]),
    /// Written into new memory, which each sequence's task zeroes first (in its cache, where
    /// a zero-filled buffer was a separate pass over memory).
    New(&'a mut [MaybeUninit<E>]),
}

impl<'a, E: AmpElem> Output<'a, E> {
    /// The buffer as possibly uninitialised elements, and whether its old values are added to.
    fn parts(self) -> (&'a mut [MaybeUninit<E>], bool, bool) {
        match self {
            Output::Written(b) => (as_maybe_uninit(b), false, false),
            Output::AddedTo(b) => (as_maybe_uninit(b), true, false),
            Output::New(b) => (b, false, true),
        }
    }
}

/// An initialised buffer viewed as possibly uninitialised elements, for the passes that take
/// new memory too; they write only initialised values through it (zeros, then results).
fn as_maybe_uninit<E>(b: &mut [E]) -> &mut [MaybeUninit<E>] {
    // SAFETY: `MaybeUninit<E>` has `E`'s layout, and nothing uninitialised is written through
    // the view (see above), so the buffer stays a valid `[E]` for its owner.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<MaybeUninit<E>>(), b.len()) }
}

/// One sequence's piece of an output, as elements: zeroed first if it is new memory.
fn piece<E: AmpElem>(piece: &mut [MaybeUninit<E>], new: bool) -> &mut [E] {
    if new {
        return zeroed(piece);
    }
    // SAFETY: not new, so the piece belongs to an initialised buffer (see `Output::parts`).
    unsafe { std::slice::from_raw_parts_mut(piece.as_mut_ptr().cast::<E>(), piece.len()) }
}

fn check_backward_dims<E>(
    d: &AttentionDims,
    qkv: &[E],
    y: &[E],
    dy: &[E],
    lse: &[f32],
    dqkv: usize,
) -> Result<(), CpuError> {
    check_dims(d, qkv.len(), y.len())?;
    check(dy.len() == y.len() && dqkv == qkv.len() && lse.len() == d.batch * d.heads * d.tokens)
}

/// The forward over every sequence (a parallel task each); returns the log-sum-exps.
fn forward<E: AmpElem>(
    dev: &Cpu,
    d: &AttentionDims,
    qkv: &[E],
    y: Output<'_, E>,
) -> Result<<Cpu as Storage<f32>>::Vec, CpuError> {
    let mut lse = Storage::<f32>::try_alloc_len(dev, d.batch * d.heads * d.tokens)?;
    let (y, _, new) = y.parts();
    if d.rows() == 0 {
        return Ok(lse);
    }
    let t = d.tokens;
    let sequences = qkv
        .par_chunks(t * 3 * d.width())
        .zip(y.par_chunks_mut(t * d.width()))
        .zip(lse.par_chunks_mut(d.heads * t));
    if let Some(short) = short_head(d) {
        sequences.for_each(|((qkv, y), lse)| {
            cpu_short::forward_sequence(d, &short, qkv, piece(y, new), lse);
        });
    } else {
        // One set of tiles per rayon job, not per sequence: the ViT's sequences are small
        // enough for the allocation to cost as much as their attention.
        sequences.for_each_init(
            || Scratch::<E>::new(d.head_dim),
            |scratch, ((qkv, y), lse)| {
                cpu_blocked::forward_sequence(d, qkv, piece(y, new), lse, scratch);
            },
        );
    }
    Ok(lse)
}

/// The backward over every sequence (a parallel task each) into `dqkv`.
fn backward<E: AmpElem>(
    d: &AttentionDims,
    qkv: &[E],
    (y, dy): (&[E], &[E]),
    lse: &[f32],
    dqkv: Output<'_, E>,
) {
    let (dqkv, accumulate, new) = dqkv.parts();
    if d.rows() == 0 {
        return;
    }
    let (t, width) = (d.tokens, d.width());
    let sequences = qkv
        .par_chunks(t * 3 * width)
        .zip(dqkv.par_chunks_mut(t * 3 * width))
        .zip(y.par_chunks(t * width).zip(dy.par_chunks(t * width)))
        .zip(lse.par_chunks(d.heads * t));
    if let Some(short) = short_head(d) {
        sequences.for_each(|(((qkv, dqkv), (y, dy)), lse)| {
            let dqkv = (piece(dqkv, new), accumulate);
            cpu_short::backward_sequence(d, &short, (qkv, y, dy), lse, dqkv);
        });
    } else {
        sequences.for_each_init(
            || (Scratch::<E>::new(d.head_dim), HeadGrads::new(t, d.head_dim)),
            |work, (((qkv, dqkv), (y, dy)), lse)| {
                let dqkv = (piece(dqkv, new), accumulate);
                cpu_blocked::backward_sequence(d, (qkv, y, dy), lse, dqkv, work);
            },
        );
    }
}
