//! The ops on tensors mixed precision adds to dfdx, one per folder, each fused op with its CPU
//! kernel and its CUDA kernel side by side (dfdx's `tensor_ops/<op>/` layout); the buffer-level
//! kernels they and the step run on are [`crate::device`]'s:
//!
//! - [`attention`]: multi-head attention over packed `[q | k | v]` rows, causal or not, with
//!   its scores in the softmax row's precision ([`attention::AttentionOp`]; the CPU fuses it);
//! - [`batchnorm`]: batch norm with 16-bit activations and FP32 parameters and statistics
//!   ([`batchnorm::BatchNormOp`]; the CPU and CUDA fuse it);
//! - [`cast`]: differentiable precision casts ([`cast::to_f16`], [`cast::to_f32`], ...), on the
//!   buffer casts the master weights run on too ([`CastKernel`](crate::device::CastKernel));
//! - [`embedding`]: a GPT's token and position embedding as one op, its gradients into the
//!   tables' FP32 gradients ([`embedding::EmbeddingOp`]; the CPU fuses it);
//! - [`fp8_linear`]: the linear layer with FP8 products, the op of an `#[amp(fp8 = ...)]`
//!   model's linear layers ([`fp8_linear::Fp8LinearOp`]; the CPU's, through `gemm_fp8`);
//! - [`gelu`]: exact GELU, fused into the linear op before it where it can be;
//! - [`layernorm`]: layer norm with 16-bit activations and FP32 parameters and statistics
//!   ([`layernorm::MixedLayerNormKernel`]);
//! - [`lm_head`]: a language model's head (`h · Wᵀ`, `W` tied to the token embedding) and its
//!   FP32 cross-entropy as one op ([`lm_head::LmHeadOp`]; the CPU fuses it);
//! - [`linear`]: the linear layer as one op, with its bias (and a following ReLU or GELU) in the
//!   product's store and its weight gradient straight into FP32 ([`linear::LinearKernel`]);
//! - [`relu`]: ReLU, fused into the linear op before it where it can be;
//! - [`residual`]: the residual connection's sum, its backward writing only the skip's gradient;
//! - [`softmax`]: softmax and log-softmax in FP32 only (rule [`softmax::SoftmaxPrecision`]).
//!
//! The fused ops' kernel traits are bundled, with the tensor-level traits, by [`Ops<E>`] and
//! [`AmpOps`].

pub mod attention;
pub mod batchnorm;
pub mod cast;
pub mod embedding;
pub mod fp8_linear;
pub(crate) mod fused_activation;
pub mod gelu;
pub mod layernorm;
pub mod linear;
pub mod lm_head;
pub mod relu;
pub mod residual;
pub mod softmax;
pub(crate) mod tokens;

use crate::precision::AmpElem;

pub use attention::AttentionOp;
pub use batchnorm::BatchNormOp;
pub use embedding::EmbeddingOp;
pub use gelu::GeluOp;
pub use layernorm::LayerNormOp;
pub use linear::LinearOp;
pub use lm_head::LmHeadOp;
pub use relu::ReluOp;

macro_rules! define_op_bundles {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// Every op on tensors for element type `E`: how a device runs typed-amp's layers (each
        /// op's trait has the composed computation as its default; the CPU and CUDA fuse them).
        #[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
        pub trait Ops<E: AmpElem>:
            LinearOp<E> + ReluOp<E> + GeluOp<E> + LayerNormOp<E> + BatchNormOp<E> + AttentionOp<E> + LmHeadOp<E> + EmbeddingOp<E>
        {
        }

        impl<E: AmpElem, D> Ops<E> for D where
            D: LinearOp<E>
                + ReluOp<E>
                + GeluOp<E>
                + LayerNormOp<E>
                + BatchNormOp<E>
                + AttentionOp<E>
                + LmHeadOp<E>
                + EmbeddingOp<E>
        {
        }

        /// A device that trains typed-amp's models: [`AmpDevice`](crate::device::AmpDevice) (the
        /// buffer kernels) and [`Ops<E>`] for every precision of
        /// [`with_precisions!`](crate::with_precisions). What code generic over the device
        /// names (`fn train<D: AmpOps>(..)`); `Cpu` and, with the `cuda` feature, `Cuda` are.
        #[diagnostic::on_unimplemented(
            message = "`{Self}` cannot run typed-amp's ops",
            note = "train on `dfdx::prelude::Cpu`, or on `dfdx::prelude::Cuda` with typed-amp's `cuda` feature"
        )]
        pub trait AmpOps: crate::device::AmpDevice $(+ Ops<$elem>)* {}

        impl<D: crate::device::AmpDevice $(+ Ops<$elem>)*> AmpOps for D {}
    };
}

crate::with_precisions!(define_op_bundles);
