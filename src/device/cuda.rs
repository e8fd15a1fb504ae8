//! CUDA kernels: grid-stride loops over whole buffers, launched on dfdx's own stream so that they
//! run in order with dfdx's ops and need no synchronisation of their own.
//!
//! The kernels are CUDA C++ compiled at run time with NVRTC (once per process) and loaded into
//! each device at first use. They include no headers, because NVRTC may not find them: FP16 is
//! carried as its bit pattern (`unsigned short`) and converted with the PTX instructions that
//! hardware casts use, which round to nearest-even and overflow to ±inf exactly as `half` does on
//! the CPU. Every kernel computes in FP32, so results match the CPU implementation bit for bit,
//! NaN payloads and the order of the additions in [`AmpDevice::try_sum_squares`] aside.
//!
//! Per-tensor results go to one slot each of a [`CudaSlice<f32>`] that stays on the device until
//! [`AmpDevice::try_read_stats`] copies it back, once per step.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaDevice, CudaFunction, CudaSlice, DevicePtr, DeviceSlice, DriverError, LaunchAsync,
    LaunchConfig,
};
use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys::nvrtcResult;
use cudarc::nvrtc::{compile_ptx, CompileError, Ptx};
use dfdx::tensor::{CpuError, Cuda, CudaError};
use half::f16;

use super::AmpDevice;
use crate::precision::{AmpElem, AnyBuf, AnyBufMut};

/// Threads per block. The reductions' shared-memory trees are sized by it (`BLOCK` in the
/// source), so every launch must use exactly this many.
const BLOCK: u32 = 256;

/// At most this many blocks: enough to fill a large GPU several times over, while the
/// grid-stride loops cover any length and the reductions issue few atomics.
const MAX_BLOCKS: u32 = 2048;

/// Module name under which the kernels are registered on a [`CudaDevice`].
const MODULE: &str = "typed_amp";

/// Kernels over one buffer, indexed by [`Prec`].
const FILL: [&str; 2] = ["tamp_fill_f32", "tamp_fill_f16"];
const UNSCALE_IN_PLACE: [&str; 2] = ["tamp_unscale_in_place_f32", "tamp_unscale_in_place_f16"];
const SUM_SQUARES: [&str; 2] = ["tamp_sum_squares_f32", "tamp_sum_squares_f16"];
const MAX_ABS: [&str; 2] = ["tamp_max_abs_f32", "tamp_max_abs_f16"];
const SCALE: [&str; 2] = ["tamp_scale_f32", "tamp_scale_f16"];
const CLAMP: [&str; 2] = ["tamp_clamp_f32", "tamp_clamp_f16"];

/// Kernels from one buffer into another, indexed by [`pair`].
const ADD_CAST: [&str; 4] = [
    "tamp_add_cast_f32_f32",
    "tamp_add_cast_f32_f16",
    "tamp_add_cast_f16_f32",
    "tamp_add_cast_f16_f16",
];
const UNSCALE: [&str; 4] = [
    "tamp_unscale_f32_f32",
    "tamp_unscale_f32_f16",
    "tamp_unscale_f16_f32",
    "tamp_unscale_f16_f16",
];

/// Copies between precisions; copies within one are `dtod_copy`s.
const COPY_CAST_F32_F16: &str = "tamp_copy_cast_f32_f16";
const COPY_CAST_F16_F32: &str = "tamp_copy_cast_f16_f32";

/// Every kernel in [`SOURCE`], all loaded together.
const FUNCS: [&str; 22] = [
    FILL[0],
    FILL[1],
    UNSCALE_IN_PLACE[0],
    UNSCALE_IN_PLACE[1],
    SUM_SQUARES[0],
    SUM_SQUARES[1],
    MAX_ABS[0],
    MAX_ABS[1],
    SCALE[0],
    SCALE[1],
    CLAMP[0],
    CLAMP[1],
    ADD_CAST[0],
    ADD_CAST[1],
    ADD_CAST[2],
    ADD_CAST[3],
    UNSCALE[0],
    UNSCALE[1],
    UNSCALE[2],
    UNSCALE[3],
    COPY_CAST_F32_F16,
    COPY_CAST_F16_F32,
];

/// The kernels. `n` is a 64-bit count so that no buffer is too long for the index arithmetic.
const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short h16;

#define BLOCK 256

// FP16 -> FP32 is exact.
__device__ __forceinline__ float h2f(h16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// FP32 -> FP16 rounds to nearest-even and overflows to +-inf, as a hardware cast does.
__device__ __forceinline__ h16 f2h(float f) {
    h16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float load(const float *p, u64 i) { return p[i]; }
__device__ __forceinline__ float load(const h16 *p, u64 i) { return h2f(p[i]); }
__device__ __forceinline__ void store(float *p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(h16 *p, u64 i, float v) { p[i] = f2h(v); }

// All exponent bits set: inf or NaN. FP16 inf and NaN convert to FP32 inf and NaN, so testing
// after the conversion tests the FP16 bits.
__device__ __forceinline__ int non_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)gridDim.x * blockDim.x)

template <typename T>
__device__ void amp_fill(u64 n, T *buf, float value) {
    FOR_EACH(i, n) store(buf, i, value);
}

template <typename S, typename D>
__device__ void amp_add_cast(u64 n, const S *src, D *dst) {
    FOR_EACH(i, n) store(dst, i, load(dst, i) + load(src, i));
}

template <typename S, typename D>
__device__ void amp_copy_cast(u64 n, const S *src, D *dst) {
    FOR_EACH(i, n) store(dst, i, load(src, i));
}

// `src` and `dst` may be the same buffer: each element is read before it is written, by the same
// thread. `flag` was zeroed in stream order before this launch and is only ever set, so blocks
// need not agree on who writes it.
template <typename S, typename D>
__device__ void amp_unscale(u64 n, const S *src, D *dst, float inv_scale, float *flag) {
    int bad = 0;
    FOR_EACH(i, n) {
        float x = load(src, i);
        bad |= non_finite(x);
        store(dst, i, x * inv_scale);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1.0f;
}

// `out` was zeroed before this launch; each block adds its partial sum. inf and NaN propagate
// through the additions.
template <typename T>
__device__ void amp_sum_squares(u64 n, const T *buf, float *out) {
    __shared__ float part[BLOCK];
    float acc = 0.0f;
    FOR_EACH(i, n) {
        float x = load(buf, i);
        acc += x * x;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

// With the sign bit cleared, the bits of non-negative floats order as the floats do, and every
// NaN orders above inf: an unsigned max over the bits is the max of |x|, and NaN if any element
// is NaN. `out` was zeroed (the bits of 0.0) before this launch.
template <typename T>
__device__ void amp_max_abs(u64 n, const T *buf, float *out) {
    __shared__ u32 part[BLOCK];
    u32 m = 0;
    FOR_EACH(i, n) {
        u32 a = __float_as_uint(load(buf, i)) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    part[threadIdx.x] = m;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && part[threadIdx.x + s] > part[threadIdx.x])
            part[threadIdx.x] = part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicMax((u32 *)out, part[0]);
}

template <typename T>
__device__ void amp_scale(u64 n, T *buf, float factor) {
    FOR_EACH(i, n) store(buf, i, load(buf, i) * factor);
}

// Comparisons with NaN are false, so NaN passes through, as with Rust's `f32::clamp`.
template <typename T>
__device__ void amp_clamp(u64 n, T *buf, float limit) {
    FOR_EACH(i, n) {
        float x = load(buf, i);
        store(buf, i, x > limit ? limit : (x < -limit ? -limit : x));
    }
}

#define ONE(N, T) \
    extern "C" __global__ void tamp_fill_##N(u64 n, T *buf, float value) { \
        amp_fill(n, buf, value); \
    } \
    extern "C" __global__ void tamp_unscale_in_place_##N(u64 n, T *buf, float inv_scale, \
                                                       float *flag) { \
        amp_unscale(n, buf, buf, inv_scale, flag); \
    } \
    extern "C" __global__ void tamp_sum_squares_##N(u64 n, const T *buf, float *out) { \
        amp_sum_squares(n, buf, out); \
    } \
    extern "C" __global__ void tamp_max_abs_##N(u64 n, const T *buf, float *out) { \
        amp_max_abs(n, buf, out); \
    } \
    extern "C" __global__ void tamp_scale_##N(u64 n, T *buf, float factor) { \
        amp_scale(n, buf, factor); \
    } \
    extern "C" __global__ void tamp_clamp_##N(u64 n, T *buf, float limit) { \
        amp_clamp(n, buf, limit); \
    }

#define PAIR(SN, S, DN, D) \
    extern "C" __global__ void tamp_add_cast_##SN##_##DN(u64 n, const S *src, D *dst) { \
        amp_add_cast(n, src, dst); \
    } \
    extern "C" __global__ void tamp_unscale_##SN##_##DN(u64 n, const S *src, D *dst, \
                                                      float inv_scale, float *flag) { \
        amp_unscale(n, src, dst, inv_scale, flag); \
    }

ONE(f32, float)
ONE(f16, h16)
PAIR(f32, float, f32, float)
PAIR(f32, float, f16, h16)
PAIR(f16, h16, f32, float)
PAIR(f16, h16, f16, h16)

extern "C" __global__ void tamp_copy_cast_f32_f16(u64 n, const float *src, h16 *dst) {
    amp_copy_cast(n, src, dst);
}
extern "C" __global__ void tamp_copy_cast_f16_f32(u64 n, const h16 *src, float *dst) {
    amp_copy_cast(n, src, dst);
}
"#;

/// The compiled [`SOURCE`], shared by every device of the process. The lock also serialises
/// loading, so that two threads never compile or load the module twice.
static PTX: Mutex<Option<Ptx>> = Mutex::new(None);

/// Precision of a buffer; the discriminant indexes the kernel tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prec {
    F32 = 0,
    F16 = 1,
}

/// A buffer reduced to what a launch needs.
///
/// Launching with the bare device pointer is as safe as passing `&CudaSlice`, which cudarc also
/// turns into the pointer: the borrow it came from lasts until the launch is queued, and dfdx
/// frees or reuses memory only by operations queued after it on the same stream.
#[derive(Debug, Clone, Copy)]
struct Raw {
    ptr: u64,
    len: usize,
    prec: Prec,
}

/// Index of a (source, destination) precision pair in [`ADD_CAST`] and [`UNSCALE`].
fn pair(src: Raw, dst: Raw) -> usize {
    src.prec as usize * 2 + dst.prec as usize
}

fn driver_error(code: CUresult) -> CudaError {
    CudaError::Driver(DriverError(code))
}

/// A buffer of another GPU would be an illegal address on this one, which poisons the context.
fn check_device(dev: &Cuda, owner: &Arc<CudaDevice>) -> Result<(), CudaError> {
    if owner.ordinal() == dev.cuda_device().ordinal() {
        Ok(())
    } else {
        Err(driver_error(CUresult::CUDA_ERROR_INVALID_VALUE))
    }
}

fn raw(dev: &Cuda, buf: &AnyBuf<'_, Cuda>) -> Result<Raw, CudaError> {
    let (owner, raw) = match buf {
        AnyBuf::F32(b) => (
            b.device(),
            Raw {
                ptr: *b.device_ptr(),
                len: b.len(),
                prec: Prec::F32,
            },
        ),
        AnyBuf::F16(b) => (
            b.device(),
            Raw {
                ptr: *b.device_ptr(),
                len: b.len(),
                prec: Prec::F16,
            },
        ),
    };
    check_device(dev, &owner)?;
    Ok(raw)
}

/// As [`raw`]; taking `&mut` keeps the kernel's writes behind a unique borrow.
fn raw_mut(dev: &Cuda, buf: &mut AnyBufMut<'_, Cuda>) -> Result<Raw, CudaError> {
    raw(dev, &buf.as_buf())
}

fn check_lengths(src: Raw, dst: Raw) -> Result<(), CudaError> {
    if src.len == dst.len {
        Ok(())
    } else {
        // Buffers are paired by typed-amp itself; a mismatch is a bug, reported rather than
        // read or written out of bounds. dfdx reports its own length mismatches on CUDA the same
        // way.
        Err(CudaError::Cpu(CpuError::WrongNumElements))
    }
}

/// Zeroes `stats[slot]` in stream order and returns its address for a kernel to write.
///
/// Slots are reused from step to step, and the kernels only ever accumulate into a slot (set a
/// flag, add a partial sum, take a max) because their blocks cannot agree on who goes first, so
/// each result must start from zero; a 4-byte memset queued before the
/// kernel does that without a host round trip.
fn reset_slot(dev: &Cuda, stats: &mut CudaSlice<f32>, slot: usize) -> Result<u64, CudaError> {
    check_device(dev, &stats.device())?;
    if slot >= stats.len() {
        // Too few slots for the tensors visited: a bug in the caller, and a write out of bounds
        // if launched.
        return Err(CudaError::Cpu(CpuError::WrongNumElements));
    }
    let mut cell = stats.slice_mut(slot..slot + 1);
    dev.cuda_device().memset_zeros(&mut cell)?;
    Ok(*cell.device_ptr())
}

/// Maps an NVRTC failure onto [`CudaError`], which has no variant for it.
///
/// The source is fixed, so a compile failure means this NVRTC rejects it: the driver's code for
/// "device kernel source is invalid" says exactly that. NVRTC's log cannot travel in the error;
/// the `nvrtc_compiles_the_kernels` test prints it.
fn compile_error(err: CompileError) -> CudaError {
    let code = match err {
        CompileError::CompileError { .. } => CUresult::CUDA_ERROR_INVALID_SOURCE,
        CompileError::CreationError(NvrtcError(nvrtcResult::NVRTC_ERROR_OUT_OF_MEMORY))
        | CompileError::GetPtxError(NvrtcError(nvrtcResult::NVRTC_ERROR_OUT_OF_MEMORY)) => {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY
        }
        _ => CUresult::CUDA_ERROR_UNKNOWN,
    };
    driver_error(code)
}

/// Compiles (once per process) and loads (once per device) the kernels.
fn load_module(dev: &Arc<CudaDevice>) -> Result<(), CudaError> {
    let mut cached = PTX.lock().unwrap_or_else(PoisonError::into_inner);
    if dev.has_func(MODULE, FUNCS[0]) {
        // Another thread loaded it while this one waited for the lock.
        return Ok(());
    }
    let ptx = match &*cached {
        Some(ptx) => ptx.clone(),
        None => cached
            .insert(compile_ptx(SOURCE).map_err(compile_error)?)
            .clone(),
    };
    dev.load_ptx(ptx, MODULE, &FUNCS)?;
    Ok(())
}

fn kernel(dev: &Arc<CudaDevice>, name: &'static str) -> Result<CudaFunction, CudaError> {
    if let Some(f) = dev.get_func(MODULE, name) {
        return Ok(f);
    }
    load_module(dev)?;
    dev.get_func(MODULE, name)
        .ok_or_else(|| driver_error(CUresult::CUDA_ERROR_NOT_FOUND))
}

/// Queues `name` over `n` elements on dfdx's stream.
fn launch<P>(dev: &Cuda, name: &'static str, n: usize, params: P) -> Result<(), CudaError>
where
    CudaFunction: LaunchAsync<P>,
{
    if n == 0 {
        // A grid of zero blocks is an invalid launch, and there is nothing to do.
        return Ok(());
    }
    let f = kernel(dev.cuda_device(), name)?;
    let blocks = n.div_ceil(BLOCK as usize).min(MAX_BLOCKS as usize) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: each kernel in SOURCE declares exactly the parameters, in order and size (u64 for
    // counts and pointers, f32 for scalars), that its caller below passes; every pointer
    // addresses at least `n` elements of the kernel's element type on this device (lengths and
    // owners are checked first), or one f32 stats slot.
    unsafe { f.launch(cfg, params) }?;
    Ok(())
}

/// Reduces `buf` into stats slot `slot` (reset first) with the kernel for its precision.
fn reduce(
    dev: &Cuda,
    table: [&'static str; 2],
    buf: AnyBuf<'_, Cuda>,
    stats: &mut CudaSlice<f32>,
    slot: usize,
) -> Result<(), CudaError> {
    let b = raw(dev, &buf)?;
    let out = reset_slot(dev, stats, slot)?;
    launch(
        dev,
        table[b.prec as usize],
        b.len,
        (b.len as u64, b.ptr, out),
    )
}

/// Applies an elementwise kernel taking one scalar, `x`, to `buf` in place.
fn map_scalar(
    dev: &Cuda,
    table: [&'static str; 2],
    mut buf: AnyBufMut<'_, Cuda>,
    x: f32,
) -> Result<(), CudaError> {
    let b = raw_mut(dev, &mut buf)?;
    launch(dev, table[b.prec as usize], b.len, (b.len as u64, b.ptr, x))
}

impl AmpDevice for Cuda {
    type Stats = CudaSlice<f32>;

    fn try_alloc_stats(&self, slots: usize) -> Result<Self::Stats, CudaError> {
        let dev = self.cuda_device();
        // `null` is cudarc's own empty allocation; it skips a memset of zero bytes.
        Ok(if slots == 0 {
            dev.null()?
        } else {
            dev.alloc_zeros(slots)?
        })
    }

    fn try_read_stats(&self, stats: &Self::Stats) -> Result<Vec<f32>, CudaError> {
        check_device(self, &stats.device())?;
        if stats.len() == 0 {
            return Ok(Vec::new());
        }
        Ok(self.cuda_device().dtoh_sync_copy(stats)?)
    }

    fn try_read_f32(&self, buf: AnyBuf<'_, Self>) -> Result<Vec<f32>, CudaError> {
        let r = raw(self, &buf)?;
        if r.len == 0 {
            return Ok(Vec::new());
        }
        match buf {
            AnyBuf::F32(b) => Ok(self.cuda_device().dtoh_sync_copy(b)?),
            AnyBuf::F16(b) => {
                // Copying the FP16 bits and widening on the host moves half the bytes of widening
                // on the device, and the conversion is exact either way.
                let half = self.cuda_device().dtoh_sync_copy(b)?;
                let mut out = vec![0f32; half.len()];
                f16::slice_to_f32(&half, &mut out);
                Ok(out)
            }
        }
    }

    fn try_write_f32(&self, mut buf: AnyBufMut<'_, Self>, values: &[f32]) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut buf)?;
        if values.len() != b.len {
            // As `check_lengths`: a mismatch is reported, never copied past the buffer's end.
            return Err(CudaError::Cpu(CpuError::WrongNumElements));
        }
        if b.len == 0 {
            return Ok(());
        }
        // The copies are synchronous because `values` is only borrowed. FP16 is narrowed on the
        // host (with `half`, which rounds as the device's conversion does) so that half the
        // bytes cross the bus.
        let dev = self.cuda_device();
        match buf {
            AnyBufMut::F32(b) => dev.htod_sync_copy_into(values, b)?,
            AnyBufMut::F16(b) => {
                let mut half = vec![f16::ZERO; values.len()];
                f16::slice_from_f32(values, &mut half);
                dev.htod_sync_copy_into(&half, b)?;
            }
        }
        Ok(())
    }

    fn try_fill(&self, mut buf: AnyBufMut<'_, Self>, value: f32) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut buf)?;
        if b.len == 0 {
            return Ok(());
        }
        if value.to_bits() == 0 {
            // +0.0 is all-zero bits in both precisions: a memset, as dfdx zeroes its buffers.
            let dev = self.cuda_device();
            return match buf {
                AnyBufMut::F32(b) => dev.memset_zeros(b),
                AnyBufMut::F16(b) => dev.memset_zeros(b),
            }
            .map_err(CudaError::from);
        }
        launch(
            self,
            FILL[b.prec as usize],
            b.len,
            (b.len as u64, b.ptr, value),
        )
    }

    fn try_add_cast(
        &self,
        src: AnyBuf<'_, Self>,
        mut dst: AnyBufMut<'_, Self>,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &src)?, raw_mut(self, &mut dst)?);
        check_lengths(s, d)?;
        launch(
            self,
            ADD_CAST[pair(s, d)],
            s.len,
            (s.len as u64, s.ptr, d.ptr),
        )
    }

    fn try_copy_cast(
        &self,
        src: AnyBuf<'_, Self>,
        mut dst: AnyBufMut<'_, Self>,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &src)?, raw_mut(self, &mut dst)?);
        check_lengths(s, d)?;
        if s.len == 0 {
            return Ok(());
        }
        let dev = self.cuda_device();
        match (src, dst) {
            (AnyBuf::F32(s), AnyBufMut::F32(d)) => Ok(dev.dtod_copy(s, d)?),
            (AnyBuf::F16(s), AnyBufMut::F16(d)) => Ok(dev.dtod_copy(s, d)?),
            (AnyBuf::F32(_), AnyBufMut::F16(_)) => {
                launch(self, COPY_CAST_F32_F16, s.len, (s.len as u64, s.ptr, d.ptr))
            }
            (AnyBuf::F16(_), AnyBufMut::F32(_)) => {
                launch(self, COPY_CAST_F16_F32, s.len, (s.len as u64, s.ptr, d.ptr))
            }
        }
    }

    fn try_unscale(
        &self,
        src: AnyBuf<'_, Self>,
        mut dst: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CudaError> {
        let (s, d) = (raw(self, &src)?, raw_mut(self, &mut dst)?);
        check_lengths(s, d)?;
        let flag = reset_slot(self, stats, slot)?;
        launch(
            self,
            UNSCALE[pair(s, d)],
            s.len,
            (s.len as u64, s.ptr, d.ptr, inv_scale, flag),
        )
    }

    fn try_unscale_in_place(
        &self,
        mut buf: AnyBufMut<'_, Self>,
        inv_scale: f32,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CudaError> {
        let b = raw_mut(self, &mut buf)?;
        let flag = reset_slot(self, stats, slot)?;
        launch(
            self,
            UNSCALE_IN_PLACE[b.prec as usize],
            b.len,
            (b.len as u64, b.ptr, inv_scale, flag),
        )
    }

    fn try_sum_squares(
        &self,
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CudaError> {
        reduce(self, SUM_SQUARES, buf, stats, slot)
    }

    fn try_max_abs(
        &self,
        buf: AnyBuf<'_, Self>,
        stats: &mut Self::Stats,
        slot: usize,
    ) -> Result<(), CudaError> {
        reduce(self, MAX_ABS, buf, stats, slot)
    }

    fn try_scale(&self, buf: AnyBufMut<'_, Self>, factor: f32) -> Result<(), CudaError> {
        map_scalar(self, SCALE, buf, factor)
    }

    fn try_clamp(&self, buf: AnyBufMut<'_, Self>, limit: f32) -> Result<(), CudaError> {
        map_scalar(self, CLAMP, buf, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs NVRTC but no GPU; on failure prints NVRTC's log, which errors cannot carry.
    #[test]
    fn nvrtc_compiles_the_kernels() {
        match compile_ptx(SOURCE) {
            Ok(ptx) => {
                let ptx = ptx.to_src();
                for name in FUNCS {
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{name} missing from the PTX"
                    );
                }
            }
            Err(CompileError::CompileError { log, .. }) => {
                panic!("NVRTC rejected the kernels:\n{}", log.to_string_lossy())
            }
            Err(err) => panic!("NVRTC failed: {err:?}"),
        }
    }

    #[test]
    fn kernel_tables_agree_with_the_source() {
        let mut names = FUNCS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FUNCS.len(), "a kernel is listed twice");
        // The reductions' shared arrays are sized by the source's BLOCK, launches by ours.
        assert!(SOURCE.contains(&format!("#define BLOCK {BLOCK}\n")));
    }
}
