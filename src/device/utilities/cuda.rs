//! What typed-amp's CUDA kernels share: the element types' device helpers, the assembled
//! source, compilation with NVRTC (once per op and process), loading (once per op and device), launching on
//! dfdx's own stream, and the stats buffer.
//!
//! Each op's kernels live beside its CPU kernel (`ops/<op>/cuda_kernel.rs`) as a CUDA C++
//! template plus the `extern "C"` entry points generated here for every precision of
//! [`with_precisions!`](crate::with_precisions). The kernels include no headers, because NVRTC
//! may not find them: 16-bit values are carried as their bit patterns, in one struct type per
//! precision so that overloads tell them apart, and converted with the PTX instructions that
//! hardware casts use (FP16) or with exact bit arithmetic (BF16), which round to nearest-even
//! and overflow to ±inf exactly as the CPU conversions do. Every kernel computes in FP32, so
//! results match the CPU kernels bit for bit, NaN payloads and the order of the additions in
//! sums aside.
//!
//! Kernels run on dfdx's stream, in order with dfdx's ops, so they need no synchronisation of
//! their own; per-tensor results go to one slot each of a [`CudaSlice<f32>`] that stays on the
//! device until [`StatsDevice::try_read_stats`] copies it back, once per step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaDevice, CudaFunction, CudaSlice, DevicePtr, DeviceSlice, DriverError, LaunchAsync,
    LaunchConfig,
};
use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys::nvrtcResult;
use cudarc::nvrtc::{compile_ptx, compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use dfdx::tensor::{CpuError, Cuda, CudaError};

use super::StatsDevice;
use crate::precision::AmpElem;

/// Threads per block. The reductions' shared-memory trees are sized by it (`BLOCK` in the
/// source), so every launch must use exactly this many.
pub(crate) const BLOCK: u32 = 256;

/// At most this many blocks: enough to fill a large GPU several times over, while the
/// grid-stride loops cover any length and the reductions issue few atomics.
const MAX_BLOCKS: u32 = 2048;

/// An element type's device side: its name in kernel names, its type in CUDA C++, and the
/// helpers that load it into and store it from FP32. Part of what adding a precision means.
pub(crate) trait CudaElem: AmpElem {
    /// Suffix of kernel names (`tamp_fill_f16`).
    const TAG: &'static str;
    /// The CUDA C++ type that carries it.
    const C_TYPE: &'static str;
    /// CUDA C++ defining `C_TYPE` (if it is not built in) and its `load`/`store` overloads.
    const HELPERS: &'static str;
}

impl CudaElem for f32 {
    const TAG: &'static str = "f32";
    const C_TYPE: &'static str = "float";
    const HELPERS: &'static str = r#"
__device__ __forceinline__ float load(const float *p, u64 i) { return p[i]; }
__device__ __forceinline__ void store(float *p, u64 i, float v) { p[i] = v; }
"#;
}

impl CudaElem for half::f16 {
    const TAG: &'static str = "f16";
    const C_TYPE: &'static str = "tamp_f16";
    const HELPERS: &'static str = r#"
struct tamp_f16 { unsigned short bits; };
// FP16 -> FP32 is exact.
__device__ __forceinline__ float load(const tamp_f16 *p, u64 i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i].bits));
    return f;
}
// FP32 -> FP16 rounds to nearest-even and overflows to +-inf, as a hardware cast does.
__device__ __forceinline__ void store(tamp_f16 *p, u64 i, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i].bits = h;
}
"#;
}

impl CudaElem for half::bf16 {
    const TAG: &'static str = "bf16";
    const C_TYPE: &'static str = "tamp_bf16";
    // BF16 is the upper half of an FP32: widening is a shift (a NaN keeps its payload and comes
    // out quiet, as typed_amp_kernels::convert's rule says); narrowing rounds to nearest-even
    // by adding 0x7fff plus the lowest kept bit (a carry rounds up into the exponent, and to
    // inf past the largest finite value), and keeps NaN a quiet NaN. Exact bit arithmetic, so
    // any GPU gives the CPU's bits.
    const HELPERS: &'static str = r#"
struct tamp_bf16 { unsigned short bits; };
__device__ __forceinline__ float load(const tamp_bf16 *p, u64 i) {
    u32 b = ((u32)p[i].bits) << 16;
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        b |= 0x00400000u;
    }
    return __uint_as_float(b);
}
__device__ __forceinline__ void store(tamp_bf16 *p, u64 i, float v) {
    u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        p[i].bits = (unsigned short)((b >> 16) | 0x40u);
    } else {
        p[i].bits = (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
}
"#;
}

/// The element types the kernels are instantiated for, from the list of precisions.
macro_rules! cuda_elems {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// `(tag, C++ type, helpers)` of every precision, in the list's order.
        const ELEMS: &[(&str, &str, &str)] = &[
            $((<$elem as CudaElem>::TAG, <$elem as CudaElem>::C_TYPE, <$elem as CudaElem>::HELPERS),)*
        ];
    };
}

crate::with_precisions!(cuda_elems);

/// What every kernel source starts with.
const PRELUDE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

#define BLOCK 256

// All exponent bits set: inf or NaN. 16-bit inf and NaN load as FP32 inf and NaN, so testing
// after the conversion tests the 16-bit bits.
__device__ __forceinline__ int non_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)gridDim.x * blockDim.x)
"#;

/// Generated CUDA C++ and the names of the entry points it defines.
pub(crate) type Entries = (String, Vec<String>);

/// One op's kernels: a CUDA C++ template source and the `extern "C"` entry points instantiated
/// from it, per precision (`one`) or per pair of precisions (`pair`). Each op's kernels are a
/// CUDA module of their own, compiled on its first launch, so this file lists no op.
pub(crate) struct OpSource {
    /// Name under which the op's module is registered on a [`CudaDevice`].
    pub(crate) module: &'static str,
    /// The templates.
    pub(crate) templates: &'static str,
    /// Entry points of one precision: `(tag, C++ type) -> (source, names)`.
    pub(crate) one: fn(&str, &str) -> Entries,
    /// Entry points of a pair of precisions: `(src tag, src type, dst tag, dst type)`.
    pub(crate) pair: fn(&str, &str, &str, &str) -> Entries,
    /// The virtual architecture NVRTC compiles for (`compute_80` for tensor-core
    /// instructions), or NVRTC's default; launching such kernels is the caller's to guard by
    /// the device's compute capability.
    pub(crate) arch: Option<&'static str>,
}

/// Compiles an op's assembled source for its architecture.
fn compile(op: &OpSource, source: &str) -> Result<Ptx, CompileError> {
    match op.arch {
        None => compile_ptx(source),
        Some(arch) => compile_ptx_with_opts(
            source,
            CompileOptions {
                arch: Some(arch),
                ..CompileOptions::default()
            },
        ),
    }
}

/// Entry points of no precision.
pub(crate) fn none(_: &str, _: &str) -> Entries {
    (String::new(), Vec::new())
}

/// Entry points of no pair.
pub(crate) fn no_pair(_: &str, _: &str, _: &str, _: &str) -> Entries {
    (String::new(), Vec::new())
}

/// An op's complete source and the names of its kernels.
pub(crate) fn program(op: &OpSource) -> (String, Vec<String>) {
    let mut source = String::from(PRELUDE);
    let mut names = Vec::new();
    for (_, _, helpers) in ELEMS {
        source.push_str(helpers);
    }
    source.push_str(op.templates);
    for (tag, ty, _) in ELEMS {
        let (src, n) = (op.one)(tag, ty);
        source.push_str(&src);
        names.extend(n);
        for (dtag, dty, _) in ELEMS {
            let (src, n) = (op.pair)(tag, ty, dtag, dty);
            source.push_str(&src);
            names.extend(n);
        }
    }
    (source, names)
}

/// Each op's compiled program and kernel names, by module name, shared by every device of the
/// process. The lock also serialises loading, so that two threads never compile or load a
/// module twice.
static PROGRAMS: Mutex<BTreeMap<&'static str, (Ptx, Vec<&'static str>)>> =
    Mutex::new(BTreeMap::new());

/// A buffer reduced to what a launch needs.
///
/// Launching with the bare device pointer is as safe as passing `&CudaSlice`, which cudarc also
/// turns into the pointer: the borrow it came from lasts until the launch is queued, and dfdx
/// frees or reuses memory only by operations queued after it on the same stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Raw {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
}

pub(crate) fn driver_error(code: CUresult) -> CudaError {
    CudaError::Driver(DriverError(code))
}

/// A buffer of another GPU would be an illegal address on this one, which poisons the context.
pub(crate) fn check_device(dev: &Cuda, owner: &Arc<CudaDevice>) -> Result<(), CudaError> {
    if owner.ordinal() == dev.cuda_device().ordinal() {
        Ok(())
    } else {
        Err(driver_error(CUresult::CUDA_ERROR_INVALID_VALUE))
    }
}

/// The pointer and length of a buffer on `dev`.
pub(crate) fn raw<E>(dev: &Cuda, buf: &CudaSlice<E>) -> Result<Raw, CudaError>
where
    E: CudaElem + cudarc::driver::DeviceRepr,
{
    check_device(dev, &buf.device())?;
    Ok(Raw {
        ptr: *buf.device_ptr(),
        len: buf.len(),
    })
}

/// As [`raw`]; taking `&mut` keeps the kernel's writes behind a unique borrow.
pub(crate) fn raw_mut<E>(dev: &Cuda, buf: &mut CudaSlice<E>) -> Result<Raw, CudaError>
where
    E: CudaElem + cudarc::driver::DeviceRepr,
{
    raw(dev, &*buf)
}

pub(crate) fn check_lengths(src: Raw, dst: Raw) -> Result<(), CudaError> {
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
/// each result must start from zero; a 4-byte memset queued before the kernel does that without
/// a host round trip.
pub(crate) fn reset_slot(
    dev: &Cuda,
    stats: &mut CudaSlice<f32>,
    slot: usize,
) -> Result<u64, CudaError> {
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

/// Compiles (once per process) and loads (once per device) an op's kernels.
fn load_module(dev: &Arc<CudaDevice>, op: &'static OpSource) -> Result<(), CudaError> {
    let mut programs = PROGRAMS.lock().unwrap_or_else(PoisonError::into_inner);
    let (ptx, names) = match programs.get(op.module) {
        Some(compiled) => compiled.clone(),
        None => {
            let (source, names) = program(op);
            let ptx = compile(op, &source).map_err(compile_error)?;
            // cudarc registers functions by `&'static str`; the names live as long as the
            // process, and are leaked once per op.
            let names: Vec<&'static str> = names
                .into_iter()
                .map(|n| &*Box::leak(n.into_boxed_str()))
                .collect();
            programs.entry(op.module).or_insert((ptx, names)).clone()
        }
    };
    if names.first().is_some_and(|n| dev.has_func(op.module, n)) {
        // Another thread loaded it while this one waited for the lock.
        return Ok(());
    }
    dev.load_ptx(ptx, op.module, &names)?;
    Ok(())
}

fn kernel(
    dev: &Arc<CudaDevice>,
    op: &'static OpSource,
    name: &str,
) -> Result<CudaFunction, CudaError> {
    if let Some(f) = dev.get_func(op.module, name) {
        return Ok(f);
    }
    load_module(dev, op)?;
    dev.get_func(op.module, name)
        .ok_or_else(|| driver_error(CUresult::CUDA_ERROR_NOT_FOUND))
}

/// Queues `name` over `n` elements on dfdx's stream.
pub(crate) fn launch<P>(
    dev: &Cuda,
    op: &'static OpSource,
    name: &str,
    n: usize,
    params: P,
) -> Result<(), CudaError>
where
    CudaFunction: LaunchAsync<P>,
{
    if n == 0 {
        // A grid of zero blocks is an invalid launch, and there is nothing to do.
        return Ok(());
    }
    let f = kernel(dev.cuda_device(), op, name)?;
    let blocks = n.div_ceil(BLOCK as usize).min(MAX_BLOCKS as usize) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: each entry point declares exactly the parameters, in order and size (u64 for
    // counts and pointers, f32 for scalars), that its caller passes; every pointer addresses at
    // least `n` elements of the kernel's element type on this device (lengths and owners are
    // checked first), or one f32 stats slot.
    unsafe { f.launch(cfg, params) }?;
    Ok(())
}

/// Queues `name` with an explicit grid, block and shared memory on dfdx's stream (kernels that
/// tile their work: attention, row reductions).
#[allow(dead_code)] // the fused ops' CUDA kernels use it
pub(crate) fn launch_with<P>(
    dev: &Cuda,
    op: &'static OpSource,
    name: &str,
    cfg: LaunchConfig,
    params: P,
) -> Result<(), CudaError>
where
    CudaFunction: LaunchAsync<P>,
{
    if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
        // A grid of zero blocks is an invalid launch, and there is nothing to do.
        return Ok(());
    }
    let f = kernel(dev.cuda_device(), op, name)?;
    // SAFETY: as in `launch`: the caller passes exactly the parameters the entry point declares,
    // and every pointer addresses what the kernel reads and writes for this grid (the caller
    // checks lengths and owners first).
    unsafe { f.launch(cfg, params) }?;
    Ok(())
}

impl StatsDevice for Cuda {
    type Stats = CudaSlice<f32>;

    fn try_alloc_stats(&self, slots: usize) -> Result<CudaSlice<f32>, CudaError> {
        let dev = self.cuda_device();
        // `null` is cudarc's own empty allocation; it skips a memset of zero bytes.
        Ok(if slots == 0 {
            dev.null()?
        } else {
            // Counted with dfdx's own allocations (`Cuda::transfer_counts`).
            self.record_alloc(slots * std::mem::size_of::<f32>());
            dev.alloc_zeros(slots)?
        })
    }

    fn try_read_stats(&self, stats: &CudaSlice<f32>) -> Result<Vec<f32>, CudaError> {
        check_device(self, &stats.device())?;
        if stats.len() == 0 {
            return Ok(Vec::new());
        }
        // The step's one read-back, counted with dfdx's copies (`Cuda::transfer_counts`).
        self.read_to_host(stats)
    }
}

/// What each op's `nvrtc_compiles_the_kernels` test checks: NVRTC compiles the op's source
/// (needs NVRTC but no GPU; on failure prints NVRTC's log, which errors cannot carry), every
/// precision gets its kernels, and names are unique.
#[cfg(test)]
pub(crate) fn check_program(op: &OpSource) {
    let tags: Vec<&str> = ELEMS.iter().map(|(tag, _, _)| *tag).collect();
    check_program_of(op, &tags);
}

/// [`check_program`] for an op whose kernels exist for the precisions `tags` only.
#[cfg(test)]
pub(crate) fn check_program_of(op: &OpSource, tags: &[&str]) {
    let (source, names) = program(op);
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a kernel is listed twice");
    for tag in tags {
        let suffix = format!("_{tag}");
        assert!(
            names.iter().any(|n| n.ends_with(&suffix)),
            "no kernel for {tag}"
        );
    }
    // The reductions' shared arrays are sized by the source's BLOCK, launches by ours.
    assert!(source.contains(&format!("#define BLOCK {BLOCK}\n")));
    // Every entry point of the source is registered (a kernel left out of the names is never
    // loaded, and its launch fails with CUDA_ERROR_NOT_FOUND).
    for entry in source.split("__global__ ").skip(1) {
        // `void name(`, possibly `void __launch_bounds__(N) name(`.
        let mut head = entry
            .split_once("void ")
            .map_or("", |(_, rest)| rest.trim_start());
        if let Some(rest) = head.strip_prefix("__launch_bounds__") {
            head = rest
                .split_once(')')
                .map_or("", |(_, rest)| rest.trim_start());
        }
        let name = head.split('(').next().unwrap_or_default().trim();
        assert!(
            names.iter().any(|n| n == name),
            "{name} is defined but not among the kernels to load"
        );
    }
    match compile(op, &source) {
        Ok(ptx) => {
            let ptx = ptx.to_src();
            for name in names {
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
