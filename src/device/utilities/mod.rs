//! What the kernels share, below every kernel: the stats buffer capability ([`StatsDevice`])
//! and the CPU and CUDA helpers (chunks, the GEMMs, NVRTC modules). A leaf: it imports nothing of
//! typed-amp's but [`crate::precision`], so every kernel, the device bundle ([`crate::device`])
//! and the ops' fused kernels can import it.

pub(crate) mod cpu;
pub(crate) mod cpu_gemm;
pub(crate) mod cpu_scratch;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_gemm;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_gemm_fp8;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_multi;

/// A device that keeps small per-tensor results (non-finite flags, sums of squares) in a buffer
/// of its own until they are read back, once per step.
#[doc(hidden)] // a device's machinery, behind `AmpDevice`/`Kernels`/`AmpOps`.
pub trait StatsDevice: dfdx::prelude::HasErr + Clone + 'static {
    /// One `f32` per tensor, kept on the device.
    type Stats: 'static;

    /// Allocates a stats buffer of `slots` zeros.
    fn try_alloc_stats(&self, slots: usize) -> Result<Self::Stats, Self::Err>;

    /// Reads a stats buffer back to the host (the one device→host transfer of a step).
    fn try_read_stats(&self, stats: &Self::Stats) -> Result<Vec<f32>, Self::Err>;
}

impl StatsDevice for dfdx::prelude::Cpu {
    type Stats = Vec<f32>;

    fn try_alloc_stats(&self, slots: usize) -> Result<Vec<f32>, Self::Err> {
        Ok(vec![0.0; slots])
    }

    fn try_read_stats(&self, stats: &Vec<f32>) -> Result<Vec<f32>, Self::Err> {
        Ok(stats.clone())
    }
}
