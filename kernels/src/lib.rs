//! CPU kernels for typed-amp's mixed-precision training step.
//!
//! * [`gemm()`]: `C = A·B` or `C += A·B` for `f32`, [`half::f16`] and [`half::bf16`], with
//!   arbitrary element strides on every operand. Half-precision products are accumulated in
//!   `f32` and rounded once, when stored.
//! * [`gemm_epilogue`]: the same product with an [`Epilogue`] fused into its store (`alpha`,
//!   `+ C_old`, a per-column bias, ReLU, then the one rounding), into a C of the operands' type
//!   or, for 16-bit operands, into an `f32` C; it reports whether anything stored is inf or NaN.
//!   [`gemm_slices`] and [`gemm_epilogue_slices`] are the safe, bounds-checked forms.
//! * [`PackedB`] and [`gemm_packed_b`]: a right-hand operand packed once for many products of
//!   any block of it, on the calling thread, with [`gemm_epilogue_slices`]' bits (attention's
//!   per-head keys and values).
//! * [`convert`]: the one conversion layer between `f32` and the two 16-bit formats (slices and
//!   scalars), bit-exact with `half`'s scalar conversions, with one NaN rule for every path;
//!   and the two FP8 formats, [`convert::E4M3`] and [`convert::E5M2`] (saturating narrowing
//!   from f32, bf16 and f16; exact widening to f32 and bf16; see [`convert::fp8`]).
//! * [`gemm_fp8_epilogue`]: the product of two FP8 matrices (E4M3 or E5M2) whose codes the
//!   packing widens exactly to bf16, at the bf16 product's rate, with the [`Epilogue`] (the
//!   dequantising scales in its `alpha`) into a bf16 or f32 C; [`gemm_fp8`] is its form with
//!   per-tensor or per-row scales into an f32 C.
//! * [`math`]: `erf` and `exp` for f32 without branches or calls, and GELU, its derivative and
//!   `exp` over slices on whole AVX-512 or AVX2 registers.
//! * [`dropout`]: dropout's counter-based mask (SplitMix64 per element, the CUDA kernel's
//!   formula), applied eight elements at a time on AVX-512.
//! * [`norm`]: layer norm's row arithmetic (statistics and sums in f64, in fixed lanes).
//! * [`optim`]: Adam's elementwise update on f32 slices, in AVX-512 or AVX2 registers with the
//!   scalar loop's bits.
//! * [`attention`]: one short head's attention (at most [`attention::MAX_KEYS`] keys) in FP32,
//!   forward and backward, row by row in vectors, without the GEMM's packing; and the blocked
//!   attention's online-softmax passes over a block of scores ([`attention::shift_block`],
//!   [`attention::finish_block`], [`attention::probabilities_block`],
//!   [`attention::score_grads_block`]).
//!
//! Every vectorised routine is chosen at run time from the CPU's features (see [`Level`]);
//! nothing depends on `-C target-cpu` (the default, [`default_level`], leaves AVX512-BF16's
//! `vdpbf16ps` out on CPUs where it is slower than widening to f32, and runs bf16 products on
//! AMX's tiles where the CPU and the system allow them). The environment variable
//! `TYPED_AMP_KERNELS` (`portable`, `avx2`, `avx512`, `avx512bf16`, `amx`; read once, and an
//! unrecognised value means `portable`) names the instruction set (never above what the CPU
//! has), and [`force_level`] does the same from code.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod attention;
pub mod convert;
pub mod dropout;
mod fp8_gemm;
mod gemm;
mod level;
pub mod math;
pub mod norm;
pub mod optim;
pub mod timing;

pub use fp8_gemm::gemm_fp8;
pub use gemm::{
    gemm, gemm_epilogue, gemm_epilogue_slices, gemm_epilogue_uninit, gemm_fp8_epilogue,
    gemm_packed_b, gemm_slices, Activation, Epilogue, GemmElem, GemmOut, GemmReport, MatMut,
    MatRef, PackedB,
};
pub use level::{default_level, detected_level, force_level, level, Level};

#[doc(hidden)]
pub use gemm::set_a_rows_in_place;
#[doc(hidden)]
pub use gemm::set_bf16_pair_emulation;
#[doc(hidden)]
pub use gemm::set_k_halves;
#[doc(hidden)]
pub use gemm::set_small_products;
