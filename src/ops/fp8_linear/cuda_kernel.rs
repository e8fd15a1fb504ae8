//! The FP8 linear op's CUDA kernels: quantising a tensor of any working precision to E4M3 or
//! E5M2 codes with its amax found in the same launch (the scale known before the data is read:
//! delayed scaling from a history), the amax alone (current scaling, whose scale comes from the
//! tensor itself), the transpose of a matrix of codes (cuBLASLt's FP8 products read both
//! operands "TN", so the backward's operands are kept transposed), and the store of an FP32
//! product into the working precision with the bias added, rounded once.
//!
//! The codes are `typed_amp_kernels::convert::quantize_fp8`'s bit for bit: the source widened
//! to FP32 exactly, one FP32 multiplication by the scale (`__fmul_rn`, never contracted), then
//! the same integer arithmetic as the CPU's `encode` (saturating at the format's largest finite
//! value, nearest-even, subnormals by an exact power-of-two scaling and a nearest-even
//! conversion to an integer). A NaN is encoded from the source's own bits, quieted, as the
//! CPU's multiplication leaves them (the GPU's would replace them with its canonical NaN); so
//! NaN codes match wherever the working precision's load keeps the NaN's bits (f32, bf16); an
//! f16 NaN is widened by the hardware conversion, which may give the canonical NaN, sign
//! included, so its code is a NaN of either sign. The integer arithmetic was checked on the
//! host (compiled with g++ and shims for the four intrinsics) against `quantize_fp8` on every
//! 13th f32 bit pattern at four scales: identical codes.
//!
//! The amax is the largest `|x|` of the source's FP32 bits: a block's tree in shared memory,
//! then one `atomicMax` per block on the unsigned bits, which order as the magnitudes do for
//! non-negative floats (and put every NaN above inf, as the CPU's amax does).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig};
use dfdx::prelude::{Cuda, Storage};
use dfdx::tensor::{CpuError, CudaError};

use crate::device::utilities::cuda::{
    launch, launch_with, no_pair, raw, raw_mut, CudaElem, OpSource,
};
use crate::fp8::{Fp8Element, Fp8Kind};

pub(super) const SOURCE: OpSource = OpSource {
    module: "typed_amp_fp8_linear",
    templates: r#"
// The FP8 code of an FP32 value (bits), as typed_amp_kernels::convert::fp8_format::encode:
// M mantissa bits, exponent bias BIAS, infinities or not, MAX_BITS the FP32 bits of the
// format's largest finite value.
template <u32 M, u32 BIAS, u32 HAS_INF, u32 MAX_BITS>
__device__ __forceinline__ unsigned char amp_fp8_encode(u32 x) {
    const u32 SHIFT = 23u - M;
    const u32 QUIET = 1u << (M - 1u);
    const u32 SPECIAL = HAS_INF ? (0x7fu & ~((1u << M) - 1u)) : 0x7fu;
    u32 sign = (x >> 24) & 0x80u;
    u32 abs = x & 0x7fffffffu;
    u32 mag;
    if (abs > 0x7f800000u) {
        mag = HAS_INF ? (SPECIAL | QUIET | ((x >> SHIFT) & (QUIET - 1u))) : 0x7fu;
    } else {
        u32 a = abs < MAX_BITS ? abs : MAX_BITS;
        if (a < ((128u - BIAS) << 23)) {
            // Exact: a scaling by 2^(BIAS - 1 + M); then the nearest integer, ties to even.
            float s = __uint_as_float((127u + BIAS - 1u + M) << 23);
            mag = __float2uint_rn(__fmul_rn(__uint_as_float(a), s));
        } else {
            // Half an ulp less one plus the kept LSB: a carry exactly where nearest-even rounds
            // up; into the next binade at most, and `a <= MAX_BITS` keeps it finite.
            u32 r = a + ((1u << (SHIFT - 1u)) - 1u) + ((a >> SHIFT) & 1u);
            mag = (r >> SHIFT) - ((127u - BIAS) << M);
        }
    }
    return (unsigned char)(sign | mag);
}

// `x * scale` as the CPU computes it: a NaN keeps its sign and payload, quieted (x86's rule;
// the GPU's multiplication would return its canonical NaN).
__device__ __forceinline__ u32 amp_fp8_scaled(float v, float scale) {
    u32 b = __float_as_uint(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) return b | 0x00400000u;
    return __float_as_uint(__fmul_rn(v, scale));
}

// One block's largest value of `m` into *amax (skipped where it is 0: nothing to raise).
__device__ __forceinline__ void amp_fp8_block_max(u32 m, u32 *amax) {
    __shared__ u32 tree[BLOCK];
    tree[threadIdx.x] = m;
    __syncthreads();
    for (u32 s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && tree[threadIdx.x + s] > tree[threadIdx.x]) {
            tree[threadIdx.x] = tree[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && tree[0] != 0u) atomicMax(amax, tree[0]);
}

// dst[i] = code(src[i] * scale), and the largest |src[i]| bits into *amax.
template <u32 M, u32 BIAS, u32 HAS_INF, u32 MAX_BITS, typename T>
__device__ void amp_fp8_quantize(u64 n, const T *src, float scale, unsigned char *dst, u32 *amax) {
    u32 m = 0u;
    FOR_EACH(i, n) {
        float v = load(src, i);
        u32 b = __float_as_uint(v) & 0x7fffffffu;
        m = b > m ? b : m;
        dst[i] = amp_fp8_encode<M, BIAS, HAS_INF, MAX_BITS>(amp_fp8_scaled(v, scale));
    }
    amp_fp8_block_max(m, amax);
}

// The largest |src[i]| bits into *amax.
template <typename T>
__device__ void amp_fp8_amax(u64 n, const T *src, u32 *amax) {
    u32 m = 0u;
    FOR_EACH(i, n) {
        u32 b = __float_as_uint(load(src, i)) & 0x7fffffffu;
        m = b > m ? b : m;
    }
    amp_fp8_block_max(m, amax);
}

// y[r, c] = round(acc[r, c] + bias[c]) (no bias where `bias` is null): the FP32 product and the
// bias, rounded once, as the CPU's FP8 GEMM stores.
template <typename T>
__device__ void amp_fp8_store(u64 n, u64 cols, const float *acc, const T *bias, T *y) {
    FOR_EACH(i, n) store(y, i, bias ? acc[i] + load(bias, i % cols) : acc[i]);
}

// dst (cols x rows) = src (rows x cols) transposed, codes; 32 x 32 tiles through shared memory
// so that reads and writes are both coalesced.
extern "C" __global__ void tamp_fp8_transpose(u64 rows, u64 cols, const unsigned char *src,
                                              unsigned char *dst) {
    __shared__ unsigned char tile[32][33];
    u64 r0 = (u64)blockIdx.y * 32, c0 = (u64)blockIdx.x * 32;
    u32 tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (u32 k = ty; k < 32; k += BLOCK / 32) {
        u64 r = r0 + k, c = c0 + tx;
        if (r < rows && c < cols) tile[k][tx] = src[r * cols + c];
    }
    __syncthreads();
    for (u32 k = ty; k < 32; k += BLOCK / 32) {
        u64 c = c0 + k, r = r0 + tx;
        if (r < rows && c < cols) dst[c * rows + r] = tile[tx][k];
    }
}
"#,
    one: |tag, ty| {
        // E4M3: 3 mantissa bits, bias 7, no infinities, 448 = 0x43e00000. E5M2: 2, 15,
        // infinities, 57344 = 0x47600000 (the kernels' Fp8Format constants; a test checks them).
        let source = format!(
            r#"
extern "C" __global__ void tamp_fp8_quantize_e4m3_{tag}(u64 n, const {ty} *src, float scale, unsigned char *dst, u32 *amax) {{ amp_fp8_quantize<3u, 7u, 0u, 0x43e00000u>(n, src, scale, dst, amax); }}
extern "C" __global__ void tamp_fp8_quantize_e5m2_{tag}(u64 n, const {ty} *src, float scale, unsigned char *dst, u32 *amax) {{ amp_fp8_quantize<2u, 15u, 1u, 0x47600000u>(n, src, scale, dst, amax); }}
extern "C" __global__ void tamp_fp8_amax_{tag}(u64 n, const {ty} *src, u32 *amax) {{ amp_fp8_amax(n, src, amax); }}
extern "C" __global__ void tamp_fp8_store_{tag}(u64 n, u64 cols, const float *acc, const {ty} *bias, {ty} *y) {{ amp_fp8_store(n, cols, acc, bias, y); }}
"#
        );
        let mut names: Vec<String> = [
            "fp8_quantize_e4m3",
            "fp8_quantize_e5m2",
            "fp8_amax",
            "fp8_store",
        ]
        .map(|k| format!("tamp_{k}_{tag}"))
        .to_vec();
        // The transpose moves bytes whatever the precision: listed once, with the FP32 kernels.
        if tag == "f32" {
            names.push("tamp_fp8_transpose".to_string());
        }
        (source, names)
    },
    pair: no_pair,
    arch: None,
};

fn wrong() -> CudaError {
    CudaError::Cpu(CpuError::WrongNumElements)
}

/// The largest `|x|` as the CPU's amax gives it from the FP32 bits of the largest `|x|`: NaN
/// above inf's bits.
fn amax_of(bits: u32) -> f32 {
    if bits > 0x7F80_0000 {
        f32::NAN
    } else {
        f32::from_bits(bits)
    }
}

/// A fresh zeroed amax slot (one u32, the FP32 bits of the largest `|x|`).
fn amax_slot(dev: &Cuda) -> Result<CudaSlice<u32>, CudaError> {
    Ok(dev.cuda_device().alloc_zeros::<u32>(1)?)
}

/// Reads an amax slot back (waits for the stream).
fn read_amax(dev: &Cuda, slot: &CudaSlice<u32>) -> Result<f32, CudaError> {
    let bits = dev.cuda_device().dtoh_sync_copy(slot)?;
    Ok(amax_of(bits.first().copied().unwrap_or(0)))
}

/// The amax of `src` (current scaling: the scale comes from it). Waits for the stream.
pub(super) fn amax<E: CudaElem>(
    dev: &Cuda,
    src: &<Cuda as Storage<E>>::Vec,
) -> Result<f32, CudaError> {
    let s = raw(dev, &**src)?;
    let slot = amax_slot(dev)?;
    launch(
        dev,
        &SOURCE,
        &format!("tamp_fp8_amax_{}", E::TAG),
        s.len,
        (s.len as u64, s.ptr, *slot.device_ptr()),
    )?;
    read_amax(dev, &slot)
}

/// `src` quantised to format `F` with `scale`, and its amax (read back: waits for the stream).
pub(super) fn quantize<F: Fp8Element, E: CudaElem>(
    dev: &Cuda,
    src: &<Cuda as Storage<E>>::Vec,
    scale: f32,
) -> Result<(CudaSlice<u8>, f32), CudaError> {
    let s = raw(dev, &**src)?;
    let format = match F::KIND {
        Fp8Kind::E4M3 => "e4m3",
        Fp8Kind::E5M2 => "e5m2",
    };
    let slot = amax_slot(dev)?;
    let mut codes = dev.cuda_device().alloc_zeros::<u8>(s.len.max(1))?;
    launch(
        dev,
        &SOURCE,
        &format!("tamp_fp8_quantize_{format}_{}", E::TAG),
        s.len,
        (
            s.len as u64,
            s.ptr,
            scale,
            *codes.device_ptr_mut(),
            *slot.device_ptr(),
        ),
    )?;
    let a = read_amax(dev, &slot)?;
    Ok((codes, a))
}

/// `src` (`rows × cols` codes) transposed into a new buffer (`cols × rows`).
pub(super) fn transpose(
    dev: &Cuda,
    src: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<CudaSlice<u8>, CudaError> {
    if src.len() < rows * cols {
        return Err(wrong());
    }
    let mut dst = dev.cuda_device().alloc_zeros::<u8>((rows * cols).max(1))?;
    let grid = |n: usize| u32::try_from(n.div_ceil(32)).map_err(|_| wrong());
    launch_with(
        dev,
        &SOURCE,
        "tamp_fp8_transpose",
        LaunchConfig {
            grid_dim: (grid(cols)?, grid(rows)?, 1),
            block_dim: (crate::device::utilities::cuda::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        (
            rows as u64,
            cols as u64,
            *src.device_ptr(),
            *dst.device_ptr_mut(),
        ),
    )?;
    Ok(dst)
}

/// `y = round(acc + bias)` (`rows × cols`, the bias per column), one rounding.
pub(super) fn store<E: CudaElem>(
    dev: &Cuda,
    cols: usize,
    acc: &CudaSlice<f32>,
    bias: Option<&<Cuda as Storage<E>>::Vec>,
    y: &mut <Cuda as Storage<E>>::Vec,
) -> Result<(), CudaError> {
    let (a, yr) = (raw(dev, acc)?, raw_mut(dev, &mut **y)?);
    let b = bias.map(|b| raw(dev, &**b)).transpose()?;
    if a.len != yr.len || b.is_some_and(|b| b.len != cols) || (cols > 0 && yr.len % cols != 0) {
        return Err(wrong());
    }
    launch(
        dev,
        &SOURCE,
        &format!("tamp_fp8_store_{}", E::TAG),
        yr.len,
        (
            yr.len as u64,
            cols as u64,
            a.ptr,
            b.map_or(0, |b| b.ptr),
            yr.ptr,
        ),
    )
}

#[cfg(test)]
mod tests {
    use crate::fp8::{Fp8Format, E4M3, E5M2};

    #[test]
    fn nvrtc_compiles_the_kernels() {
        crate::device::utilities::cuda::check_program(&super::SOURCE);
    }

    /// The constants written into the entry points are the formats' own.
    #[test]
    fn the_entry_points_carry_the_formats_constants() {
        let (source, _) = crate::device::utilities::cuda::program(&super::SOURCE);
        for (name, m, bias, inf, max) in [
            (
                "e4m3",
                E4M3::MANTISSA_BITS,
                E4M3::BIAS,
                E4M3::HAS_INFINITY,
                E4M3::MAX,
            ),
            (
                "e5m2",
                E5M2::MANTISSA_BITS,
                E5M2::BIAS,
                E5M2::HAS_INFINITY,
                E5M2::MAX,
            ),
        ] {
            let args = format!(
                "<{m}u, {bias}u, {}u, {:#010x}u>",
                u32::from(inf),
                max.to_bits()
            );
            assert!(
                source.lines().any(|l| l.contains(&format!("tamp_fp8_quantize_{name}_")) && l.contains(&args)),
                "{name}: {args}"
            );
        }
    }

    /// Every f32 pattern the encoding distinguishes: zeros, subnormals of f32 and of each
    /// format, ties between codes, values either side of the largest finite code, infinities,
    /// NaNs with payloads, both signs; then a sweep of exponents and mantissas.
    fn specials() -> Vec<f32> {
        let mut v = vec![
            0.0,
            1e-45,
            1e-40,
            1.0,
            1.5,
            0.0625,
            1.0 / 512.0,
            3.0 / 1024.0,
            1.0 / 131072.0,
            448.0,
            464.0,
            480.0,
            57344.0,
            61440.0,
            1e30,
            f32::INFINITY,
            f32::from_bits(0x7fc0_0000),
            f32::from_bits(0x7fa0_0001),
            f32::from_bits(0x7ff0_0000),
        ];
        // Ties: halfway between consecutive E4M3 and E5M2 codes.
        v.extend([
            1.0625,
            1.1875,
            1.125,
            1.375,
            2.0f32.powi(-10) * 1.5,
            2.0f32.powi(-17) * 1.5,
        ]);
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..4000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Exponents around both formats' ranges, any mantissa.
            let e = 100 + (s >> 32) as u32 % 60;
            v.push(f32::from_bits((e << 23) | (s as u32 & 0x007f_ffff)));
        }
        let neg: Vec<f32> = v.iter().map(|x| -x).collect();
        v.extend(neg);
        v
    }

    fn gpu() -> Option<dfdx::prelude::Cuda> {
        match std::panic::catch_unwind(|| dfdx::prelude::Cuda::try_build(0, 0)) {
            Ok(Ok(dev)) => Some(dev),
            _ => {
                println!("skipping: no CUDA device");
                None
            }
        }
    }

    /// The kernels' codes and amax against `quantize_fp8`'s, per source precision and format,
    /// at several scales (one that saturates, one that makes subnormals).
    fn codes_case<E, F>(dev: &dfdx::prelude::Cuda)
    where
        E: super::CudaElem + crate::fp8::Fp8Source + cudarc::driver::DeviceRepr,
        F: crate::fp8::Fp8Element,
    {
        let src: Vec<E> = specials()
            .into_iter()
            .map(<E as crate::precision::AmpElem>::from_f32)
            .collect();
        let n = src.len();
        let on_gpu: dfdx::prelude::Tensor<(usize,), E, _> =
            dfdx::prelude::TensorFromVec::tensor_from_vec(dev, src.clone(), (n,));
        let on_gpu = on_gpu.storage();
        for scale in [1.0f32, 0.75, 1.0 / 448.0, 300.0] {
            let mut cpu = vec![F::default(); src.len()];
            let amax = typed_amp_kernels::convert::quantize_fp8(&src, scale, &mut cpu);
            let (codes, gpu_amax) = super::quantize::<F, E>(dev, on_gpu, scale).unwrap();
            let gpu_codes = dev.cuda_device().dtoh_sync_copy(&codes).unwrap();
            for (i, (c, g)) in cpu.iter().zip(&gpu_codes).enumerate() {
                let (c, g) = (c.to_bits(), *g);
                // f16's NaN payloads follow the GPU's conversion (see the module documentation).
                let both_nan = F::from_bits(c).is_nan() && F::from_bits(g).is_nan();
                assert!(
                    c == g || (<E as super::CudaElem>::TAG == "f16" && both_nan),
                    "{} from {} at scale {scale}: element {i} ({:?}): CPU {c:#04x}, CUDA {g:#04x}",
                    F::NAME,
                    <E as super::CudaElem>::TAG,
                    crate::precision::AmpElem::to_f32(src[i]),
                );
            }
            assert_eq!(
                amax.to_bits(),
                gpu_amax.to_bits(),
                "amax, {} from {}",
                F::NAME,
                <E as super::CudaElem>::TAG
            );
            let only = super::amax::<E>(dev, on_gpu).unwrap();
            assert_eq!(
                amax.to_bits(),
                only.to_bits(),
                "amax alone, {}",
                <E as super::CudaElem>::TAG
            );
        }
    }

    #[test]
    fn the_codes_are_the_cpus() {
        let Some(dev) = gpu() else {
            return;
        };
        codes_case::<f32, E4M3>(&dev);
        codes_case::<f32, E5M2>(&dev);
        codes_case::<half::bf16, E4M3>(&dev);
        codes_case::<half::bf16, E5M2>(&dev);
        codes_case::<half::f16, E4M3>(&dev);
        codes_case::<half::f16, E5M2>(&dev);
    }

    #[test]
    fn the_transpose_moves_every_code() {
        let Some(dev) = gpu() else {
            return;
        };
        for (rows, cols) in [(1, 1), (5, 3), (33, 70), (64, 32)] {
            let src: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 251) as u8).collect();
            let on_gpu = dev.cuda_device().htod_sync_copy(&src).unwrap();
            let t = super::transpose(&dev, &on_gpu, rows, cols).unwrap();
            let t = dev.cuda_device().dtoh_sync_copy(&t).unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        src[r * cols + c],
                        "{rows} × {cols} at ({r}, {c})"
                    );
                }
            }
        }
    }
}
