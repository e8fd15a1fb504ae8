mod allocate;
mod device;

pub use device::{Cuda, CudaError, TransferCounts, TransferEvent, TransferKind};

/// typed-amp patch: the most dimensions a dfdx shape has (`Rank6`), and so the length of one
/// shape or one set of strides in a [SizeArray] kernel parameter.
pub(crate) const MAX_DIMS: usize = 6;

/// typed-amp patch: sizes (shapes, strides) passed to a kernel by value, as one kernel parameter:
/// `SizeArray<N>` of `cuda_utils.cuh` (`struct { size_t v[N]; }`). Before, every launch of an op
/// that indexes a strided tensor allocated a device buffer and copied its shape and strides into
/// it (`htod_copy`); a parameter costs neither, and the kernels index it in place as they indexed
/// the buffer.
///
/// The size of the type must be the size the kernel declares: pass [Dims], [Info2], [Info3] or
/// [Info4] where the kernel takes `Dims`, `Info2`, `Info3` or `Info4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SizeArray<const N: usize>(pub(crate) [usize; N]);

// SAFETY: `#[repr(C)]` `[usize; N]`, laid out as the kernel's `struct { size_t v[N]; }` (usize is
// size_t on every target CUDA supports), and passed by value: cudarc passes a pointer to it
// (`as_kernel_param`'s default), from which the driver copies the parameter's bytes.
unsafe impl<const N: usize> cudarc::driver::DeviceRepr for SizeArray<N> {}

/// One shape or one set of strides (`Dims` in the kernels).
pub(crate) type Dims = SizeArray<MAX_DIMS>;
/// Two shapes or sets of strides, packed (`Info2`).
pub(crate) type Info2 = SizeArray<{ 2 * MAX_DIMS }>;
/// Three, packed (`Info3`).
pub(crate) type Info3 = SizeArray<{ 3 * MAX_DIMS }>;
/// Four, packed (`Info4`).
pub(crate) type Info4 = SizeArray<{ 4 * MAX_DIMS }>;

impl<const N: usize> SizeArray<N> {
    /// `values` in order, then zeros.
    ///
    /// # Panics
    /// If there are more than `N` values: a shape of more than [MAX_DIMS] dimensions, which dfdx
    /// does not have.
    pub(crate) fn new<I: IntoIterator<Item = usize>>(values: I) -> Self {
        let mut v = [0; N];
        let mut len = 0;
        for x in values {
            assert!(len < N, "more than {N} sizes for one kernel parameter");
            v[len] = x;
            len += 1;
        }
        Self(v)
    }
}

pub(crate) fn launch_cfg<const NUM_THREADS: u32>(n: u32) -> cudarc::driver::LaunchConfig {
    let num_blocks = (n + NUM_THREADS - 1) / NUM_THREADS;
    cudarc::driver::LaunchConfig {
        grid_dim: (num_blocks, 1, 1),
        block_dim: (NUM_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shapes::*, tensor::*};
    use cudarc::driver::DevicePtr;

    #[test]
    fn test_empty_cache() {
        let dev: Cuda = Default::default();
        dev.enable_cache();
        let tensor: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        drop(tensor); // insert allocation into cache
        assert_eq!(dev.cache.len(), 1);
        dev.empty_cache();
        assert_eq!(dev.cache.len(), 0);
    }

    #[test]
    fn test_disabling_cache_empties_it() {
        let dev: Cuda = Default::default();
        dev.enable_cache();
        let tensor: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        drop(tensor); // insert allocation into cache
        assert_eq!(dev.cache.len(), 1);
        dev.disable_cache();
        assert_eq!(dev.cache.len(), 0);
    }

    #[test]
    fn test_reuse_allocation_on_new_tensor() {
        let dev: Cuda = Default::default();
        dev.enable_cache();
        let tensor: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        let ptr = *tensor.data.device_ptr();
        drop(tensor); // insert allocation into cache
        assert_eq!(dev.cache.len(), 1);
        let other: Tensor<Rank2<2, 3>, f64, _> = dev.zeros();
        assert_eq!(dev.cache.len(), 1);
        let tensor: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        assert_eq!(dev.cache.len(), 0);
        assert_eq!(*tensor.data.device_ptr(), ptr);
        drop(other);
    }

    #[test]
    fn test_reuse_allocation_on_clone_tensor() {
        let dev: Cuda = Default::default();
        dev.enable_cache();
        let a: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        let b: Tensor<Rank2<2, 3>, f32, _> = dev.zeros();
        drop(b); // insert allocation into cache
        assert_eq!(dev.cache.len(), 1);
        let mut b = a.clone();
        assert_eq!(dev.cache.len(), 1);
        // will actually clone the data - should reuse allocation from cache
        std::sync::Arc::make_mut(&mut b.data);
        assert_eq!(dev.cache.len(), 0);
    }
}
