use crate::shapes::{Shape, Unit};
use crate::tensor::cpu::{Cpu, CpuError};
use crate::tensor::{
    cache::TensorCache, Cache, HasErr, NoneTape, RandomU64, Storage, Synchronize, Tensor,
};

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr};
use cudarc::{
    cublas::{result::CublasError, CudaBlas},
    driver::sys::CUdeviceptr,
    driver::{CudaDevice, CudaSlice, CudaStream, DeviceSlice, DriverError},
};

use std::{
    mem::ManuallyDrop,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    vec::Vec,
};

/// A Cuda device that enables constructing tensors on GPUs
/// & running GPU kernels.
#[derive(Clone, Debug)]
pub struct Cuda {
    pub(crate) cpu: Cpu,
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) blas: Arc<CudaBlas>,
    #[cfg(feature = "cudnn")]
    #[allow(unused)]
    pub(crate) cudnn: Arc<cudarc::cudnn::Cudnn>,
    /// A second stream for kernels to optionally execute on.
    pub(crate) par_stream: Arc<CudaStream>,
    pub(crate) workspace: Arc<Mutex<CudaSlice<u8>>>,
    pub(crate) cache: Arc<TensorCache<CUdeviceptr>>,
    /// typed-amp patch: what this device (and every clone of it) asked the driver for; see
    /// [Cuda::transfer_counts].
    pub(crate) counts: Arc<Counters>,
    /// typed-amp patch: held by the device's clones only (not by its buffers): when the last
    /// clone is dropped, the cache's buffers are freed and the cache is turned off, so that
    /// buffers dropped later are freed too instead of cached for nobody.
    #[allow(unused)]
    pub(crate) cache_guard: Arc<CacheGuard>,
}

/// typed-amp patch: see `Cuda::cache_guard`.
#[derive(Debug)]
pub(crate) struct CacheGuard {
    cache: Arc<TensorCache<CUdeviceptr>>,
    dev: Arc<CudaDevice>,
}

impl Drop for CacheGuard {
    fn drop(&mut self) {
        self.cache.disable();
        empty_cache(&self.cache, &self.dev);
    }
}

/// Frees every buffer `cache` holds (upstream's `try_empty_cache`, shared with [CacheGuard]).
fn empty_cache(cache: &TensorCache<CUdeviceptr>, dev: &Arc<CudaDevice>) {
    #[cfg(not(feature = "no-std"))]
    let mut cache = cache.allocations.write().unwrap();
    #[cfg(feature = "no-std")]
    let mut cache = cache.allocations.write();
    for (&key, allocations) in cache.iter_mut() {
        for alloc in allocations.drain(..) {
            let data = unsafe { dev.upgrade_device_ptr::<u8>(alloc, key.num_bytes) };
            drop(data);
        }
    }
    cache.clear();
}

/// typed-amp patch: how many device allocations and host ↔ device copies a [Cuda] device made,
/// since it was built or since [Cuda::reset_transfer_counts]. Read with [Cuda::transfer_counts].
///
/// Every allocation and copy dfdx makes on the device is counted: tensor buffers (the ones its
/// cache could not serve), its workspace, tensors uploaded from the host or read back
/// (`tensor_from_vec`, `as_vec`, `array`, `copy_from`, `copy_into`, random initialisation,
/// `ones`), and buffer clones. Memsets are not copies and are not counted; neither is what
/// cuBLAS or cuDNN allocate for themselves, nor what code outside dfdx does with cudarc directly
/// on [Cuda::cuda_device] (it can count its work with [Cuda::record_alloc],
/// [Cuda::record_htod] and [Cuda::record_dtoh], or use [Cuda::read_to_host] and
/// [Cuda::write_from_host], which count).
///
/// A training step whose shapes do not change should, once warmed up, allocate nothing (every
/// buffer comes from the cache, see [Cache]) and read back at most what it chooses to read
/// (e.g. one flag saying whether the gradients were finite).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TransferCounts {
    /// Device allocations (`cuMemAlloc`/`cuMemAllocAsync`).
    pub allocs: u64,
    /// Bytes those allocations asked for.
    pub alloc_bytes: u64,
    /// Buffers served from the cache instead of allocated.
    pub reuses: u64,
    /// Host → device copies.
    pub htod: u64,
    /// Bytes those copies moved.
    pub htod_bytes: u64,
    /// Device → host copies; each one waits for the device to finish the work queued before it.
    pub dtoh: u64,
    /// Bytes those copies moved.
    pub dtoh_bytes: u64,
    /// Device → device copies: a tensor buffer cloned (e.g. to write into a shared one), tensors
    /// concatenated or stacked.
    pub dtod: u64,
}

impl std::ops::Sub for TransferCounts {
    type Output = TransferCounts;
    /// The counts made between two readings (`later - earlier`).
    fn sub(self, earlier: TransferCounts) -> TransferCounts {
        TransferCounts {
            allocs: self.allocs - earlier.allocs,
            alloc_bytes: self.alloc_bytes - earlier.alloc_bytes,
            reuses: self.reuses - earlier.reuses,
            htod: self.htod - earlier.htod,
            htod_bytes: self.htod_bytes - earlier.htod_bytes,
            dtoh: self.dtoh - earlier.dtoh,
            dtoh_bytes: self.dtoh_bytes - earlier.dtoh_bytes,
            dtod: self.dtod - earlier.dtod,
        }
    }
}

impl std::fmt::Display for TransferCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} allocations ({} bytes), {} reused from the cache, {} host→device copies ({} bytes), {} device→host copies ({} bytes), {} device→device copies",
            self.allocs,
            self.alloc_bytes,
            self.reuses,
            self.htod,
            self.htod_bytes,
            self.dtoh,
            self.dtoh_bytes,
            self.dtod
        )
    }
}

/// typed-amp patch: what a traced allocation or copy was (see [Cuda::trace_transfers]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferKind {
    /// A device allocation.
    Alloc,
    /// A host → device copy.
    HostToDevice,
    /// A device → host copy.
    DeviceToHost,
    /// A device → device copy.
    DeviceToDevice,
}

/// typed-amp patch: one allocation or copy counted while [Cuda::trace_transfers] was on: what it
/// was, how many bytes, and the call stack that made it.
#[derive(Debug)]
pub struct TransferEvent {
    /// What it was.
    pub kind: TransferKind,
    /// Its size in bytes.
    pub bytes: usize,
    /// Where it was made (`Backtrace::force_capture`; function names need symbols, lines debug
    /// information).
    pub backtrace: std::backtrace::Backtrace,
}

impl std::fmt::Display for TransferEvent {
    /// The kind, the size, then the backtrace's frames in this crate, typed-amp's crates and the
    /// calling test or program (`dfdx`, `typed_amp` or `tests/` in the frame), innermost first.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:?} of {} bytes, from:", self.kind, self.bytes)?;
        let bt = self.backtrace.to_string();
        let mut lines = bt.lines().peekable();
        while let Some(line) = lines.next() {
            let frame = line.trim_start();
            if frame.starts_with("at ") {
                continue;
            }
            let at = lines
                .peek()
                .map(|l| l.trim_start())
                .filter(|l| l.starts_with("at "));
            let ours = ["dfdx", "typed_amp", "tests/"]
                .iter()
                .any(|needle| frame.contains(needle) || at.is_some_and(|a| a.contains(needle)));
            let internal = frame.contains("TransferEvent") || frame.contains("Counters::");
            if ours && !internal {
                writeln!(f, "    {frame}")?;
                if let Some(at) = at {
                    writeln!(f, "        {at}")?;
                }
            }
        }
        Ok(())
    }
}

/// typed-amp patch: the counters behind [TransferCounts], shared by a [Cuda] device, its clones
/// and its buffers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    allocs: AtomicU64,
    alloc_bytes: AtomicU64,
    reuses: AtomicU64,
    htod: AtomicU64,
    htod_bytes: AtomicU64,
    dtoh: AtomicU64,
    dtoh_bytes: AtomicU64,
    dtod: AtomicU64,
    tracing: std::sync::atomic::AtomicBool,
    trace: Mutex<Vec<TransferEvent>>,
}

impl Counters {
    pub(crate) fn alloc(&self, bytes: usize) {
        self.allocs.fetch_add(1, Ordering::Relaxed);
        self.alloc_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.traced(TransferKind::Alloc, bytes);
    }
    pub(crate) fn reuse(&self) {
        self.reuses.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn htod(&self, bytes: usize) {
        self.htod.fetch_add(1, Ordering::Relaxed);
        self.htod_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.traced(TransferKind::HostToDevice, bytes);
    }
    pub(crate) fn dtoh(&self, bytes: usize) {
        self.dtoh.fetch_add(1, Ordering::Relaxed);
        self.dtoh_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.traced(TransferKind::DeviceToHost, bytes);
    }
    pub(crate) fn dtod(&self, bytes: usize) {
        self.dtod.fetch_add(1, Ordering::Relaxed);
        self.traced(TransferKind::DeviceToDevice, bytes);
    }
    fn traced(&self, kind: TransferKind, bytes: usize) {
        if self.tracing.load(Ordering::Relaxed) {
            let backtrace = std::backtrace::Backtrace::force_capture();
            self.trace.lock().unwrap().push(TransferEvent {
                kind,
                bytes,
                backtrace,
            });
        }
    }
    fn read(&self) -> TransferCounts {
        TransferCounts {
            allocs: self.allocs.load(Ordering::Relaxed),
            alloc_bytes: self.alloc_bytes.load(Ordering::Relaxed),
            reuses: self.reuses.load(Ordering::Relaxed),
            htod: self.htod.load(Ordering::Relaxed),
            htod_bytes: self.htod_bytes.load(Ordering::Relaxed),
            dtoh: self.dtoh.load(Ordering::Relaxed),
            dtoh_bytes: self.dtoh_bytes.load(Ordering::Relaxed),
            dtod: self.dtod.load(Ordering::Relaxed),
        }
    }
    fn reset(&self) {
        for c in [
            &self.allocs,
            &self.alloc_bytes,
            &self.reuses,
            &self.htod,
            &self.htod_bytes,
            &self.dtoh,
            &self.dtoh_bytes,
            &self.dtod,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

#[derive(Debug)]
pub enum CudaError {
    Blas(CublasError),
    #[cfg(feature = "cudnn")]
    Cudnn(cudarc::cudnn::CudnnError),
    Driver(DriverError),
    Cpu(CpuError),
}

impl From<CpuError> for CudaError {
    fn from(value: CpuError) -> Self {
        Self::Cpu(value)
    }
}

impl From<CublasError> for CudaError {
    fn from(value: CublasError) -> Self {
        Self::Blas(value)
    }
}

impl From<DriverError> for CudaError {
    fn from(value: DriverError) -> Self {
        Self::Driver(value)
    }
}

#[cfg(feature = "cudnn")]
impl From<cudarc::cudnn::CudnnError> for CudaError {
    fn from(value: cudarc::cudnn::CudnnError) -> Self {
        Self::Cudnn(value)
    }
}

impl Default for Cuda {
    fn default() -> Self {
        Self::seed_from_u64(0)
    }
}

impl Cuda {
    /// Constructs rng with the given seed.
    pub fn seed_from_u64(seed: u64) -> Self {
        Self::try_seed_from_u64(seed).unwrap()
    }

    /// Constructs rng with the given seed.
    pub fn try_seed_from_u64(seed: u64) -> Result<Self, CudaError> {
        Self::try_build(0, seed)
    }

    /// The cudarc device (context and stream) that every tensor of this device lives on.
    ///
    /// typed-amp patch: lets kernels outside dfdx run on dfdx's stream, in order with its ops.
    pub fn cuda_device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The cuBLAS handle dfdx's products use, bound to [Cuda::cuda_device]'s stream.
    ///
    /// typed-amp patch: lets typed-amp's fused ops call cuBLAS (`gemm_ex` with an FP32 output
    /// for 16-bit operands) in order with dfdx's ops.
    pub fn cublas(&self) -> &Arc<CudaBlas> {
        &self.blas
    }

    /// Constructs with the given seed & device ordinal
    pub fn try_build(ordinal: usize, seed: u64) -> Result<Self, CudaError> {
        let cpu = Cpu::seed_from_u64(seed);
        let dev = CudaDevice::new(ordinal)?;
        let blas = Arc::new(CudaBlas::new(dev.clone())?);
        // typed-amp patch: 16-bit products keep cuBLAS's internal reductions (split-K) in the
        // compute type, FP32: by default cuBLAS may sum split-K partials in the output's 16-bit
        // type, which rounded fp16 outputs several units in the last place away from an FP32 sum
        // rounded once (seen on an H200), and bf16 ones more. Products of f32 are unaffected.
        // SAFETY: a valid handle, just created, and a valid mode.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *blas.handle(),
                cudarc::cublas::sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        }
        .result()?;
        #[cfg(feature = "cudnn")]
        let cudnn = cudarc::cudnn::Cudnn::new(dev.clone())?;
        let par_stream = Arc::new(dev.fork_default_stream()?);
        let counts: Arc<Counters> = Default::default();
        let workspace = Arc::new(Mutex::new(dev.alloc_zeros::<u8>(0)?));
        // typed-amp patch: counted.
        counts.alloc(0);

        // typed-amp patch: the caching allocator is on from the start (upstream builds it off):
        // a dropped tensor's buffer goes to the cache and the next buffer of the same size and
        // type reuses it, so a training step whose shapes repeat allocates nothing once warmed
        // up. `disable_cache` turns it off (and frees what it holds), `empty_cache` frees what it
        // holds; an allocation that fails for lack of memory empties it and tries again.
        let cache: Arc<TensorCache<CUdeviceptr>> = Default::default();
        cache.enable();
        let cache_guard = Arc::new(CacheGuard {
            cache: cache.clone(),
            dev: dev.clone(),
        });
        Ok(Self {
            cpu,
            dev,
            blas,
            #[cfg(feature = "cudnn")]
            cudnn,
            par_stream,
            workspace,
            cache,
            counts,
            cache_guard,
        })
    }

    /// typed-amp patch: the device allocations and host ↔ device copies this device (with all
    /// its clones) made since it was built or since the last [Cuda::reset_transfer_counts]. See
    /// [TransferCounts] for what is counted.
    ///
    /// ```ignore
    /// dev.reset_transfer_counts();
    /// train_one_step(&dev);
    /// let counts = dev.transfer_counts();
    /// assert_eq!(counts.allocs, 0, "{counts}");
    /// ```
    pub fn transfer_counts(&self) -> TransferCounts {
        self.counts.read()
    }

    /// typed-amp patch: sets every count of [Cuda::transfer_counts] back to zero (for this device
    /// and all its clones).
    pub fn reset_transfer_counts(&self) {
        self.counts.reset()
    }

    /// typed-amp patch: while on, every allocation and copy that [Cuda::transfer_counts] counts
    /// (buffers reused from the cache excepted) is also recorded with the call stack that made
    /// it, for [Cuda::take_transfer_trace]: to find out who allocates or reads back. Capturing a
    /// backtrace is slow; leave it off when timing. Off when the device is built.
    pub fn trace_transfers(&self, on: bool) {
        self.counts.tracing.store(on, Ordering::Relaxed);
    }

    /// typed-amp patch: the allocations and copies recorded while [Cuda::trace_transfers] was on,
    /// oldest first, emptying the record.
    pub fn take_transfer_trace(&self) -> Vec<TransferEvent> {
        std::mem::take(&mut *self.counts.trace.lock().unwrap())
    }

    /// typed-amp patch: counts a device allocation of `bytes` made outside dfdx (with cudarc on
    /// [Cuda::cuda_device]), so that [Cuda::transfer_counts] includes it.
    pub fn record_alloc(&self, bytes: usize) {
        self.counts.alloc(bytes)
    }

    /// typed-amp patch: counts a host → device copy of `bytes` made outside dfdx.
    pub fn record_htod(&self, bytes: usize) {
        self.counts.htod(bytes)
    }

    /// typed-amp patch: counts a device → host copy of `bytes` made outside dfdx.
    pub fn record_dtoh(&self, bytes: usize) {
        self.counts.dtoh(bytes)
    }

    /// typed-amp patch: copies device memory on this device's stream into a new `Vec`, waiting
    /// for the work queued before it, and counts the copy.
    pub fn read_to_host<T: DeviceRepr>(&self, src: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        let dst = self.dev.dtoh_sync_copy(src)?;
        self.counts.dtoh(std::mem::size_of_val(dst.as_slice()));
        Ok(dst)
    }

    /// typed-amp patch: copies `src` into device memory `dst` of the same length on this device's
    /// stream, synchronously (`src` is only borrowed), and counts the copy.
    ///
    /// # Panics
    /// If the lengths differ (as cudarc's `htod_sync_copy_into`).
    pub fn write_from_host<T: DeviceRepr, Dst: DevicePtrMut<T>>(
        &self,
        src: &[T],
        dst: &mut Dst,
    ) -> Result<(), CudaError> {
        self.dev.htod_sync_copy_into(src, dst)?;
        self.counts.htod(std::mem::size_of_val(src));
        Ok(())
    }
}

impl Cuda {
    /// Allocates an empty [CudaSlice] either from the cache or by allocating new memory.
    /// In either case, the memory will have uninitialized values, meaning the user must
    /// initialize it before using it.
    ///
    /// typed-amp patch: counted ([Cuda::transfer_counts]: an allocation, or a reuse); an
    /// allocation that fails for lack of memory empties the cache (whose buffers, of other
    /// sizes, hold memory nobody uses) and tries once more.
    pub(crate) unsafe fn alloc_empty<E: DeviceRepr>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<E>, CudaError> {
        if let Some(ptr) = self.cache.try_pop::<E>(len) {
            self.counts.reuse();
            return Ok(self.dev.upgrade_device_ptr(ptr, len));
        }
        let data = match self.dev.alloc::<E>(len) {
            Err(DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))
                if self.cache.len() > 0 =>
            {
                self.try_empty_cache()?;
                self.dev.alloc::<E>(len)?
            }
            data => data?,
        };
        self.counts.alloc(len * std::mem::size_of::<E>());
        Ok(data)
    }

    /// typed-amp patch: a cached buffer (see [Cuda::alloc_empty]) that returns to the cache when
    /// dropped, as a tensor's.
    pub(crate) fn cachable<E>(&self, data: CudaSlice<E>) -> CachableCudaSlice<E> {
        CachableCudaSlice {
            data: ManuallyDrop::new(data),
            cache: self.cache.clone(),
            counts: self.counts.clone(),
        }
    }
    #[allow(unused)]
    pub(crate) unsafe fn get_workspace<E>(
        &self,
        len: usize,
    ) -> Result<MutexGuard<CudaSlice<u8>>, CudaError> {
        let num_bytes_required = len * std::mem::size_of::<E>();
        let mut workspace = self.workspace.as_ref().lock().unwrap();

        // re-allocate a larger workspace
        if workspace.num_bytes() < num_bytes_required {
            // we are about to memset this to zero, so this is still okay
            *workspace = unsafe { self.dev.alloc::<u8>(num_bytes_required) }?;
            self.counts.alloc(num_bytes_required); // typed-amp patch: counted
        }

        Ok(workspace)
    }
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl HasErr for Cuda {
    type Err = CudaError;
}

/// A [CudaSlice] that can be cloned without allocating new memory.
/// When [Drop]ed it will insert it's data into the cache.
#[derive(Debug)]
pub struct CachableCudaSlice<E> {
    /// The actual data.
    ///
    /// typed-amp patch: `ManuallyDrop`, so that [Drop] can move the allocation into the cache
    /// (upstream swapped in `CudaDevice::null()`, a zero-byte `cuMemAllocAsync` and its free on
    /// every drop; `cuMemAlloc` rejects zero bytes where there are no memory pools).
    pub(crate) data: ManuallyDrop<CudaSlice<E>>,
    /// A cache of device pointers that can be reused.
    pub(crate) cache: Arc<TensorCache<CUdeviceptr>>,
    /// typed-amp patch: the device's counts ([Cuda::transfer_counts]).
    pub(crate) counts: Arc<Counters>,
}

impl<E: cudarc::driver::DeviceRepr> Clone for CachableCudaSlice<E> {
    fn clone(&self) -> Self {
        let dev = self.data.device();
        let len = self.data.len();
        // typed-amp patch: counted.
        self.counts.dtod(len * std::mem::size_of::<E>());
        let data = self.cache.try_pop::<E>(len).map_or_else(
            || {
                self.counts.alloc(len * std::mem::size_of::<E>());
                self.data.try_clone().unwrap()
            },
            |ptr| {
                self.counts.reuse();
                // SAFETY:
                // 1. we know that ptr is valid for `num_bytes` because it was registered for that.
                // 2. we are about to set the memory with dtod_copy
                let mut slice = unsafe { dev.upgrade_device_ptr(ptr, len) };
                dev.dtod_copy(&*self.data, &mut slice).unwrap();
                slice
            },
        );
        Self {
            data: ManuallyDrop::new(data),
            cache: self.cache.clone(),
            counts: self.counts.clone(),
        }
    }
}

unsafe impl<E: DeviceRepr> DeviceRepr for &CachableCudaSlice<E> {
    #[inline(always)]
    fn as_kernel_param(&self) -> *mut std::ffi::c_void {
        self.data.device_ptr() as *const cudarc::driver::sys::CUdeviceptr as *mut std::ffi::c_void
    }
}

unsafe impl<E: DeviceRepr> DeviceRepr for &mut CachableCudaSlice<E> {
    #[inline(always)]
    fn as_kernel_param(&self) -> *mut std::ffi::c_void {
        self.data.device_ptr() as *const cudarc::driver::sys::CUdeviceptr as *mut std::ffi::c_void
    }
}

impl<E> DeviceSlice<E> for CachableCudaSlice<E> {
    fn len(&self) -> usize {
        self.data.len()
    }
}

impl<E> DevicePtr<E> for CachableCudaSlice<E> {
    fn device_ptr(&self) -> &cudarc::driver::sys::CUdeviceptr {
        self.data.device_ptr()
    }
}

impl<E> DevicePtrMut<E> for CachableCudaSlice<E> {
    fn device_ptr_mut(&mut self) -> &mut cudarc::driver::sys::CUdeviceptr {
        self.data.device_ptr_mut()
    }
}

impl<E> std::ops::Deref for CachableCudaSlice<E> {
    type Target = CudaSlice<E>;
    fn deref(&self) -> &Self::Target {
        &self.data
    }
}

impl<E> std::ops::DerefMut for CachableCudaSlice<E> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.data
    }
}

impl<E> Drop for CachableCudaSlice<E> {
    fn drop(&mut self) {
        // typed-amp patch: the field is `ManuallyDrop`; it is taken (or dropped) exactly once,
        // here.
        // SAFETY: `self.data` is not used again after this.
        let data = unsafe { ManuallyDrop::take(&mut self.data) };
        if self.cache.is_enabled() {
            let numel = data.len();
            // Get access to the raw pointer without freeing it.
            let ptr = data.leak();
            self.cache.insert::<E>(numel, ptr);
        } else {
            drop(data);
        }
    }
}

impl RandomU64 for Cuda {
    fn random_u64(&self) -> u64 {
        self.cpu.random_u64()
    }
}

impl Cache for Cuda {
    fn try_enable_cache(&self) -> Result<(), Self::Err> {
        self.cache.enable();
        Ok(())
    }

    fn try_disable_cache(&self) -> Result<(), Self::Err> {
        self.cache.disable();
        self.try_empty_cache()
    }

    fn try_empty_cache(&self) -> Result<(), Self::Err> {
        empty_cache(&self.cache, &self.dev);
        Ok(())
    }
}

impl Synchronize for Cuda {
    fn try_synchronize(&self) -> Result<(), CudaError> {
        self.dev.synchronize().map_err(CudaError::from)
    }
}

impl<E: Unit> Storage<E> for Cuda {
    type Vec = CachableCudaSlice<E>;

    fn try_alloc_len(&self, len: usize) -> Result<Self::Vec, Self::Err> {
        let mut data = unsafe { self.alloc_empty(len) }?;
        self.dev.memset_zeros(&mut data)?;
        Ok(self.cachable(data))
    }

    fn len(&self, v: &Self::Vec) -> usize {
        v.len()
    }

    fn tensor_to_vec<S: Shape, T>(&self, tensor: &Tensor<S, E, Self, T>) -> Vec<E> {
        let buf = self
            .cpu
            .try_alloc_elem(tensor.data.data.len(), Default::default())
            .unwrap();
        let mut cpu_tensor = Tensor {
            id: tensor.id,
            data: Arc::new(buf),
            shape: tensor.shape,
            strides: tensor.strides,
            device: self.cpu.clone(),
            tape: NoneTape,
        };
        let buf = std::sync::Arc::get_mut(&mut cpu_tensor.data).unwrap();
        self.dev
            .dtoh_sync_copy_into(&*tensor.data.data, &mut buf.data)
            .unwrap();
        self.counts.dtoh(std::mem::size_of_val(buf.data.as_slice())); // typed-amp patch
        self.cpu.tensor_to_vec::<S, _>(&cpu_tensor)
    }
}
