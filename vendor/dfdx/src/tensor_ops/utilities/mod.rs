mod backward;
pub(crate) mod cpu_f32; // typed-amp patch
pub(crate) mod cpu_kernels;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_kernels;
mod device;
pub(crate) mod ops;
pub(crate) mod reduction_utils;

pub use backward::Backward;
pub use device::Device;
