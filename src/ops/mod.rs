//! The ops mixed precision adds to dfdx, one per folder, each with its CPU kernel and its CUDA
//! kernel side by side (dfdx's `tensor_ops/<op>/` layout):
//!
//! - [`cast`]: differentiable precision casts ([`cast::to_f16`], [`cast::to_f32`], ...), and the
//!   buffer casts they and the master weights run on ([`cast::CastKernel`]);
//! - [`unscale`]: dividing gradients by the loss scale fused with the inf/NaN check
//!   ([`unscale::UnscaleKernel`]);
//! - [`reduce`]: Σx² and max|x| per tensor, for clipping and layer probes
//!   ([`reduce::ReduceKernel`]);
//! - [`fill`]: fill, scale and clamp in place ([`fill::FillKernel`]);
//! - [`host`]: exact copies between device buffers and the host ([`host::HostKernel`]).
//!
//! The kernels' traits are the device capabilities [`crate::device::Kernels`] bundles.

pub mod cast;
pub mod fill;
pub mod host;
pub mod reduce;
pub mod unscale;
