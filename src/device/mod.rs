//! The devices typed-amp trains on, as capabilities.
//!
//! Mixed precision needs a few buffer-level kernels beyond dfdx's ops, each a trait of its own,
//! defined with its CPU and CUDA kernels side by side in [`crate::ops`]:
//!
//! | capability | kernels | op |
//! | --- | --- | --- |
//! | [`StatsDevice`] | per-tensor results kept on the device, read back once a step | here |
//! | [`CastKernel`] | `dst = src`, `dst += src` across precisions | [`crate::ops::cast`] |
//! | [`UnscaleKernel`] | `x / scale` with the non-finite check, fused | [`crate::ops::unscale`] |
//! | [`ReduceKernel`] | Σx² and max\|x\| (clipping, layer probes) | [`crate::ops::reduce`] |
//! | [`FillKernel`] | fill, scale, clamp in place | [`crate::ops::fill`] |
//! | [`HostKernel`] | exact copies to and from the host (checkpoints) | [`crate::ops::host`] |
//! | [`LinearKernel`] | the linear layer fused (bias, ReLU, FP32 weight gradient) | [`crate::ops::linear`] |
//! | [`MixedBatchNormKernel`] | batch norm over 16-bit activations with FP32 statistics | [`crate::ops::batchnorm`] |
//! | [`ReluKernel`] | ReLU in place and its mask, for fusing it into the op before it | [`crate::ops::relu`] |
//! | [`UpdateKernel`] | the optimizer's update fused with the working copy's refresh | [`crate::ops::update`] |
//!
//! [`Kernels<E>`] bundles them, with dfdx's `Device<E>` and `ConvDevice<E>`, for one element type,
//! and [`AmpDevice`] is `Kernels<E>` for every precision of
//! [`with_precisions!`](crate::with_precisions). Both are implemented for every device that has
//! the capabilities: dfdx's `Cpu` and, with the `cuda` feature, `Cuda`.

mod allocator;
pub use allocator::keep_freed_memory;

pub use crate::ops::batchnorm::MixedBatchNormKernel;
pub use crate::ops::cast::CastKernel;
pub use crate::ops::fill::FillKernel;
pub use crate::ops::host::HostKernel;
pub use crate::ops::linear::LinearKernel;
pub use crate::ops::reduce::ReduceKernel;
pub use crate::ops::relu::ReluKernel;
pub use crate::ops::unscale::UnscaleKernel;
pub use crate::ops::update::UpdateKernel;

#[cfg(feature = "cuda")]
pub(crate) mod cuda;

/// A device that keeps small per-tensor results (non-finite flags, sums of squares) in a buffer
/// of its own until they are read back, once per step.
pub trait StatsDevice: dfdx::prelude::HasErr + Clone + 'static {
    /// One `f32` per tensor, kept on the device.
    type Stats: 'static;

    /// Allocates a stats buffer of `slots` zeros.
    fn try_alloc_stats(&self, slots: usize) -> Result<Self::Stats, Self::Err>;

    /// Reads a stats buffer back to the host (the one device→host transfer of a step).
    fn try_read_stats(&self, stats: &Self::Stats) -> Result<Vec<f32>, Self::Err>;
}

macro_rules! define_capabilities {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// Everything typed-amp needs from a device for tensors of element type `E`: dfdx's ops
        /// (`Device<E>`, `ConvDevice<E>`) and typed-amp's kernels, casts to and from every
        /// precision included.
        #[diagnostic::on_unimplemented(
            message = "`{Self}` cannot run typed-amp's kernels on `{E}` tensors",
            note = "train on `dfdx::prelude::Cpu`, or on `dfdx::prelude::Cuda` with typed-amp's `cuda` feature"
        )]
        pub trait Kernels<E: crate::precision::AmpElem>:
            dfdx::prelude::Device<E>
            + dfdx::tensor_ops::ConvDevice<E>
            + StatsDevice
            + FillKernel<E>
            + ReduceKernel<E>
            + UnscaleKernel<E>
            + HostKernel<E>
            + CastKernel<E, E>
            + UpdateKernel<E>
            + LinearKernel<E>
            + ReluKernel<E>
            + MixedBatchNormKernel<E>
            $(
                + CastKernel<E, $elem>
                + CastKernel<$elem, E>
                + dfdx::tensor_ops::ToDtypeKernel<E, $elem>
                + dfdx::tensor_ops::ToDtypeKernel<$elem, E>
            )*
        {
        }

        impl<E, D> Kernels<E> for D
        where
            E: crate::precision::AmpElem,
            D: dfdx::prelude::Device<E>
                + dfdx::tensor_ops::ConvDevice<E>
                + StatsDevice
                + FillKernel<E>
                + ReduceKernel<E>
                + UnscaleKernel<E>
                + HostKernel<E>
                + CastKernel<E, E>
                + UpdateKernel<E>
                + LinearKernel<E>
                + ReluKernel<E>
                + MixedBatchNormKernel<E>
                $(
                    + CastKernel<E, $elem>
                    + CastKernel<$elem, E>
                    + dfdx::tensor_ops::ToDtypeKernel<E, $elem>
                    + dfdx::tensor_ops::ToDtypeKernel<$elem, E>
                )*,
        {
        }

        /// A dfdx device that runs every precision and typed-amp's kernels: [`Kernels<E>`] for
        /// each precision of [`with_precisions!`](crate::with_precisions).
        ///
        /// Implemented for [`dfdx::prelude::Cpu`] and, with the `cuda` feature, for
        /// `dfdx::prelude::Cuda`, whose kernels run on dfdx's own stream and keep
        /// [`StatsDevice::Stats`] in GPU memory until [`StatsDevice::try_read_stats`].
        ///
        /// Its error type converts from [`dfdx::tensor::CpuError`], so that layers report an
        /// input of the wrong size as an error (`WrongNumElements`) on every device.
        #[diagnostic::on_unimplemented(
            message = "`{Self}` is not a device typed-amp can train on",
            note = "train on `dfdx::prelude::Cpu`, or on `dfdx::prelude::Cuda` with typed-amp's `cuda` feature"
        )]
        pub trait AmpDevice:
            StatsDevice<Err: From<dfdx::tensor::CpuError>> $(+ Kernels<$elem>)*
        {
        }

        impl<D: StatsDevice<Err: From<dfdx::tensor::CpuError>> $(+ Kernels<$elem>)*> AmpDevice for D {}
    };
}

crate::with_precisions!(define_capabilities);

impl StatsDevice for dfdx::prelude::Cpu {
    type Stats = Vec<f32>;

    fn try_alloc_stats(&self, slots: usize) -> Result<Vec<f32>, Self::Err> {
        Ok(vec![0.0; slots])
    }

    fn try_read_stats(&self, stats: &Vec<f32>) -> Result<Vec<f32>, Self::Err> {
        Ok(stats.clone())
    }
}

/// CPU helpers shared by the ops' CPU kernels.
pub(crate) mod cpu {
    use dfdx::prelude::CpuError;

    use crate::precision::AmpElem;

    /// Elements converted per chunk: 4 KiB of FP32, small enough to stay in L1.
    pub(crate) const CHUNK: usize = 1024;

    /// Exponent bits of an FP32 value; all set means inf or NaN.
    const F32_EXPONENT: u32 = 0x7f80_0000;

    /// Whether any value is inf or NaN, written so that the loop vectorises.
    #[inline]
    pub(crate) fn any_non_finite(values: &[f32]) -> bool {
        values.iter().fold(0u32, |acc, v| {
            acc | u32::from(v.to_bits() & F32_EXPONENT == F32_EXPONENT)
        }) != 0
    }

    /// Calls `f` on consecutive FP32 chunks of a buffer of any precision (FP32 buffers are
    /// passed through without a copy).
    #[inline]
    pub(crate) fn for_each_f32_chunk<E: AmpElem>(src: &[E], mut f: impl FnMut(usize, &[f32])) {
        if let Some(src) = as_f32(src) {
            for (i, chunk) in src.chunks(CHUNK).enumerate() {
                f(i * CHUNK, chunk);
            }
            return;
        }
        let mut tmp = [0f32; CHUNK];
        for (i, chunk) in src.chunks(CHUNK).enumerate() {
            let tmp = &mut tmp[..chunk.len()];
            E::slice_to_f32(chunk, tmp);
            f(i * CHUNK, tmp);
        }
    }

    /// Applies `f` to FP32 chunks of a buffer of any precision, in place.
    #[inline]
    pub(crate) fn map_f32_chunks<E: AmpElem>(buf: &mut [E], mut f: impl FnMut(&mut [f32])) {
        if let Some(buf) = as_f32_mut(buf) {
            for chunk in buf.chunks_mut(CHUNK) {
                f(chunk);
            }
            return;
        }
        let mut tmp = [0f32; CHUNK];
        for chunk in buf.chunks_mut(CHUNK) {
            let tmp = &mut tmp[..chunk.len()];
            E::slice_to_f32(chunk, tmp);
            f(tmp);
            E::slice_from_f32(tmp, chunk);
        }
    }

    /// The buffer itself when `E` is `f32`, so FP32 buffers skip the conversion copy.
    #[inline]
    pub(crate) fn as_f32<E: AmpElem>(buf: &[E]) -> Option<&[f32]> {
        if std::any::TypeId::of::<E>() == std::any::TypeId::of::<f32>() {
            // SAFETY: `E` is `f32`, so the slice already is an `[f32]` of the same length.
            Some(unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<f32>(), buf.len()) })
        } else {
            None
        }
    }

    /// The buffer itself when `E` is `f32`, mutably.
    #[inline]
    pub(crate) fn as_f32_mut<E: AmpElem>(buf: &mut [E]) -> Option<&mut [f32]> {
        if std::any::TypeId::of::<E>() == std::any::TypeId::of::<f32>() {
            // SAFETY: as in `as_f32`; the unique borrow is carried over.
            Some(unsafe {
                std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<f32>(), buf.len())
            })
        } else {
            None
        }
    }

    /// The stats slot `slot`, or an error if the buffer has no such slot.
    pub(crate) fn slot_of(stats: &mut [f32], slot: usize) -> Result<&mut f32, CpuError> {
        stats.get_mut(slot).ok_or(CpuError::WrongNumElements)
    }

    /// Buffers are paired by typed-amp itself; a length mismatch is a bug, reported rather than
    /// read out of bounds.
    pub(crate) fn check_lengths(src: usize, dst: usize) -> Result<(), CpuError> {
        if src == dst {
            Ok(())
        } else {
            Err(CpuError::WrongNumElements)
        }
    }
}
