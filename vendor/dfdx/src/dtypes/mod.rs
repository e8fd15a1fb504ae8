//! Module for data type related traits and structs. Contains things like [Unit], [Dtype], and [AMP].
//!
//! When the `f16` feature is enabled, this exports the [f16] and [bf16] types.
//!
//! # AMP
//!
//! [AMP](https://pytorch.org/docs/stable/amp.html) is a technique for mixed precision training.
//! This is a data type in dfdx, you can use it like any normal dtype like [`AMP<f16>`] or [`AMP<bf16>`].

mod amp;

pub use amp::AMP;

#[cfg(feature = "f16")]
pub use half::f16;

// typed-amp patch: bfloat16 as a first-class dtype, under the same `f16` feature.
#[cfg(feature = "f16")]
pub use half::bf16;

/// Represents a type where all 0 bits is a valid pattern.
#[cfg(not(feature = "cuda"))]
pub trait SafeZeros {}

/// Represents a type where all 0 bits is a valid pattern.
#[cfg(feature = "cuda")]
pub trait SafeZeros: cudarc::driver::ValidAsZeroBits + cudarc::driver::DeviceRepr {}

/// Represents a unit type, but no arithmetic.
pub trait Unit:
    'static
    + Copy
    + Clone
    + Default
    + std::fmt::Debug
    + PartialEq
    + PartialOrd
    + Send
    + Sync
    + std::marker::Unpin
    + SafeZeros
{
    const ONE: Self;
}

macro_rules! unit {
    ($type:ty, $one:expr) => {
        impl SafeZeros for $type {}
        impl Unit for $type {
            const ONE: Self = $one;
        }
    };
}

unit!(f32, 1.0);
unit!(f64, 1.0);
unit!(usize, 1);
unit!(isize, 1);
unit!(u8, 1);
unit!(i8, 1);
unit!(u16, 1);
unit!(i16, 1);
unit!(u32, 1);
unit!(i32, 1);
unit!(u64, 1);
unit!(i64, 1);
unit!(u128, 1);
unit!(i128, 1);
unit!(bool, true);
#[cfg(feature = "f16")]
unit!(f16, f16::ONE);
#[cfg(feature = "f16")]
unit!(bf16, bf16::ONE); // typed-amp patch

/// Represents something that has a [Unit].
pub trait HasUnitType {
    type Unit: Unit;
}

/// Represents a data type or element of an array that can have
/// arithmatic operations applied to it. The main difference
/// between [Dtype] and [Unit] is that [`bool`] is [Unit], but
/// not [Dtype].
pub trait Dtype:
    Unit
    + std::ops::Add<Self, Output = Self>
    + std::ops::Sub<Self, Output = Self>
    + std::ops::Mul<Self, Output = Self>
    + std::ops::Div<Self, Output = Self>
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
    + num_traits::FromPrimitive
    + num_traits::ToPrimitive
{
}
impl Dtype for f32 {}
impl Dtype for f64 {}
impl Dtype for i8 {}
impl Dtype for i16 {}
impl Dtype for i32 {}
impl Dtype for i64 {}
impl Dtype for i128 {}
impl Dtype for isize {}
impl Dtype for u8 {}
impl Dtype for u16 {}
impl Dtype for u32 {}
impl Dtype for u64 {}
impl Dtype for u128 {}
impl Dtype for usize {}
#[cfg(feature = "f16")]
impl Dtype for f16 {}
#[cfg(feature = "f16")]
impl Dtype for bf16 {} // typed-amp patch

/// The type that CPU kernels which chain or accumulate many operations (sums, optimizer updates)
/// compute in, rounding each result back to the dtype once.
///
/// typed-amp patch: bfloat16 computes in f32. With 8 significant bits a bf16 running sum stops
/// growing at 2^8 times its terms, and Adam's default `beta2 = 0.999` rounds to exactly 1.0 in
/// bf16 (so `1 - beta2 = 0` and the bias correction divides 0 by 0). Every other dtype computes
/// in itself, exactly as upstream.
pub trait CpuCompute: Sized + Copy {
    type Compute: Dtype;
    /// Whether `Compute` is wider than `Self` (kernels keep upstream's code path when not).
    const WIDENS: bool = false;
    fn widen(self) -> Self::Compute;
    fn narrow(c: Self::Compute) -> Self;
}

macro_rules! compute_in_self {
    ($($t:ty),*) => {
        $(
            impl CpuCompute for $t {
                type Compute = $t;
                #[inline(always)]
                fn widen(self) -> $t {
                    self
                }
                #[inline(always)]
                fn narrow(c: $t) -> $t {
                    c
                }
            }
        )*
    };
}
compute_in_self!(f32, f64, i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
#[cfg(feature = "f16")]
compute_in_self!(f16);

#[cfg(feature = "f16")]
compute_in_self!(AMP<f16>);

#[cfg(feature = "f16")]
impl CpuCompute for bf16 {
    type Compute = f32;
    const WIDENS: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(c: f32) -> Self {
        bf16::from_f32(c)
    }
}

/// typed-amp patch: the type an optimizer's update is computed in on the CPU: `f32` for the
/// 16-bit types (as fused Adam kernels do: weights and state stay 16-bit, the arithmetic does not
/// round at each operation, and Adam's default eps of 1e-8, which is 0 in f16, is not rounded
/// away), the type itself otherwise (upstream's arithmetic).
pub trait OptimCompute: Sized + Copy {
    type Compute: Dtype;
    fn widen(self) -> Self::Compute;
    fn narrow(c: Self::Compute) -> Self;
}

macro_rules! optim_compute_in_self {
    ($($t:ty),*) => {
        $(
            impl OptimCompute for $t {
                type Compute = $t;
                #[inline(always)]
                fn widen(self) -> $t {
                    self
                }
                #[inline(always)]
                fn narrow(c: $t) -> $t {
                    c
                }
            }
        )*
    };
}
optim_compute_in_self!(f32, f64, i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);

#[cfg(feature = "f16")]
impl OptimCompute for f16 {
    type Compute = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(c: f32) -> Self {
        f16::from_f32(c)
    }
}

#[cfg(feature = "f16")]
impl OptimCompute for bf16 {
    type Compute = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(c: f32) -> Self {
        bf16::from_f32(c)
    }
}

/// Represents something that has a [Dtype].
pub trait HasDtype {
    type Dtype: Dtype;
}

/// Marker trait for types that are **not** [AMP].
pub trait NotMixedPrecision {}
impl NotMixedPrecision for f32 {}
impl NotMixedPrecision for f64 {}
impl NotMixedPrecision for i8 {}
impl NotMixedPrecision for i16 {}
impl NotMixedPrecision for i32 {}
impl NotMixedPrecision for i64 {}
impl NotMixedPrecision for i128 {}
impl NotMixedPrecision for isize {}
impl NotMixedPrecision for u8 {}
impl NotMixedPrecision for u16 {}
impl NotMixedPrecision for u32 {}
impl NotMixedPrecision for u64 {}
impl NotMixedPrecision for u128 {}
impl NotMixedPrecision for usize {}
#[cfg(feature = "f16")]
impl NotMixedPrecision for f16 {}
#[cfg(feature = "f16")]
impl NotMixedPrecision for bf16 {} // typed-amp patch
