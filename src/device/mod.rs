//! The devices typed-amp trains on, as capabilities: what a device does on buffers, below every
//! op on tensors.
//!
//! Mixed precision needs a few buffer-level kernels beyond dfdx's ops, each a trait of its own,
//! defined here with its CPU and CUDA kernels side by side (`device/<kernel>/`), and the fused
//! ops on tensors of [`crate::ops`] run kernels of their own (`ops/<op>/kernel.rs`):
//!
//! | capability | kernels | where |
//! | --- | --- | --- |
//! | [`StatsDevice`] | per-tensor results kept on the device, read back once a step | `device/utilities` |
//! | [`CastKernel`] | `dst = src`, `dst += src` across precisions (the tensor casts: [`crate::ops::cast`]) | `device/cast` |
//! | [`UnscaleKernel`] | `x / scale` with the non-finite check, fused | `device/unscale` |
//! | [`UnscaleBatchKernel`] | every gradient's unscale and check in as few launches as possible | `device/unscale` |
//! | [`ReduceKernel`] | Σx² and max\|x\| (clipping, layer probes) | `device/reduce` |
//! | [`FillKernel`] | fill, scale, clamp in place | `device/fill` |
//! | [`HostKernel`] | exact copies to and from the host (checkpoints) | `device/host` |
//! | [`UpdateKernel`] | the optimizer's update fused with the working copy's refresh | `device/update` |
//! | [`UpdateBatchKernel`] | every parameter's fused update in as few launches as possible | `device/update` |
//! | [`LinearOp`](crate::ops::linear::LinearOp) | the linear layer, fused (bias, ReLU or GELU, FP32 weight gradient) | [`crate::ops::linear`] |
//! | [`LayerNormOp`](crate::ops::layernorm::LayerNormOp) | layer norm over 16-bit activations with FP32 statistics, fused | [`crate::ops::layernorm`] |
//! | [`AttentionOp`](crate::ops::attention::AttentionOp) | multi-head attention, fused where the scores are FP32 | [`crate::ops::attention`] |
//! | [`EmbeddingOp`](crate::ops::embedding::EmbeddingOp) | a GPT's token and position embedding, fused | [`crate::ops::embedding`] |
//! | [`LmHeadOp`](crate::ops::lm_head::LmHeadOp) | a language model's head and FP32 cross-entropy, fused | [`crate::ops::lm_head`] |
//! | [`ReluOp`](crate::ops::relu::ReluOp) | ReLU, fused into the op before it | [`crate::ops::relu`] |
//! | [`GeluOp`](crate::ops::gelu::GeluOp) | exact GELU, fused into the linear op before it | [`crate::ops::gelu`] |
//!
//! The `…Op` rows are tensor-level ops (each with a composed default that a device overrides
//! with its fused kernel), bundled by [`Ops<E>`](crate::ops::Ops) and
//! [`AmpOps`](crate::ops::AmpOps) above this module. [`Kernels<E>`] bundles the buffer-level
//! kernels, with dfdx's `Device<E>` and `ConvDevice<E>`, for one element type,
//! and [`AmpDevice`] is `Kernels<E>` for every precision of
//! [`with_precisions!`](crate::with_precisions). Both are implemented for every device that has
//! the capabilities: dfdx's `Cpu` and, with the `cuda` feature, `Cuda`.

mod allocator;
mod cast;
mod fill;
mod host;
mod pool;
mod reduce;
pub(crate) mod unscale;
mod update;
pub(crate) mod utilities;

pub use allocator::keep_freed_memory;
pub use pool::on_cpu_pool;

pub use cast::CastKernel;
pub use fill::FillKernel;
pub use host::HostKernel;
pub use reduce::ReduceKernel;
pub use unscale::{UnscaleBatchKernel, UnscaleKernel};
pub use update::{UpdateBatchKernel, UpdateKernel};
pub use utilities::StatsDevice;

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
            StatsDevice<Err: From<dfdx::tensor::CpuError>> + UnscaleBatchKernel $(+ Kernels<$elem>)*
        {
        }

        impl<D: StatsDevice<Err: From<dfdx::tensor::CpuError>> + UnscaleBatchKernel $(+ Kernels<$elem>)*> AmpDevice for D {}
    };
}

crate::with_precisions!(define_capabilities);
