pub use super::build_module::BuildModule;
pub use super::to_device::*;

use crate::{shapes::Dtype, tensor_ops::Device};

use super::tensor_collection::*;

/// Immutable forward of `Input` that produces [Module::Output].
/// See [ModuleMut] for mutable forward.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no forward for an input of type `{Input}`",
    label = "this layer cannot take that input",
    note = "a layer takes tensors of its own precision (and shape); where layers of different precisions meet (FP32, FP16, BF16), cast at the boundary to the next layer's precision with typed-amp's `.to_f16()`, `.to_bf16()` or `.to_f32()`",
    note = "batch norm and layer norm under O2 (`keep_batchnorm_fp32`, O2's default) keep FP32 parameters and statistics and take 16-bit activations through typed-amp's mixed forward, not this one: call `typed_amp::amp::norm::MixedNorm::try_forward_mixed` (what an `#[amp]` model's forward does), or cast in with `.to_f32()` and back out"
)]
pub trait Module<Input> {
    /// The type that this unit produces given `Input`.
    type Output;
    type Error: core::fmt::Debug;

    fn try_forward(&self, input: Input) -> Result<Self::Output, Self::Error>;

    /// Forward `Input` through the module and produce [Module::Output].
    ///
    /// **See [ModuleMut::forward_mut()] for version that can mutate `self`.**
    fn forward(&self, input: Input) -> Self::Output {
        self.try_forward(input).unwrap()
    }
}

/// Mutable forward of `Input` that produces [ModuleMut::Output].
/// See [Module] for immutable forward.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no training forward for an input of type `{Input}`",
    label = "this layer cannot take that input",
    note = "a layer takes tensors of its own precision (and shape); where layers of different precisions meet (FP32, FP16, BF16), cast at the boundary to the next layer's precision with typed-amp's `.to_f16()`, `.to_bf16()` or `.to_f32()`",
    note = "batch norm and layer norm under O2 (`keep_batchnorm_fp32`, O2's default) keep FP32 parameters and statistics and take 16-bit activations through typed-amp's mixed forward, not this one: call `typed_amp::amp::norm::MixedNormMut::try_forward_mixed_mut` (what an `#[amp]` model's training forward does), or cast in with `.to_f32()` and back out"
)]
pub trait ModuleMut<Input> {
    /// The type that this unit produces given `Input`.
    type Output;
    type Error: core::fmt::Debug;

    fn try_forward_mut(&mut self, input: Input) -> Result<Self::Output, Self::Error>;

    /// Forward `Input` through the module and produce [ModuleMut::Output].
    ///
    /// **See [Module::forward()] for immutable version**
    fn forward_mut(&mut self, input: Input) -> Self::Output {
        self.try_forward_mut(input).unwrap()
    }
}

/// Something that can be built on a different device
/// than it is on.
///
/// Related to [BuildModule]
pub trait BuildOnDevice<D: Device<E>, E: Dtype> {
    type Built: BuildModule<D, E>;
    fn build_on_device(device: &D) -> Self::Built {
        Self::try_build_on_device(device).unwrap()
    }
    fn try_build_on_device(device: &D) -> Result<Self::Built, D::Err> {
        Self::Built::try_build(device)
    }
}

/// An extension trait that allows you to build a module with a device
/// method. Also allows easy specification of Dtype.
pub trait DeviceBuildExt {
    fn build_module<M: BuildOnDevice<Self, E>, E: Dtype>(&self) -> M::Built
    where
        Self: Device<E>,
    {
        M::build_on_device(self)
    }
    fn try_build_module<M: BuildOnDevice<Self, E>, E: Dtype>(&self) -> Result<M::Built, Self::Err>
    where
        Self: Device<E>,
    {
        M::try_build_on_device(self)
    }
}
impl DeviceBuildExt for crate::tensor::Cpu {}
#[cfg(feature = "cuda")]
impl DeviceBuildExt for crate::tensor::Cuda {}

/// Marker trait for modules with no updatable parameters. These have
/// blanket impls for, and [ModuleMut]
// typed-amp patch: the message a built module (or a type alias of one) gets where an
// architecture is expected, e.g. as a field of an `#[amp]` model.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is a built module, not an architecture to build: it has parameters, so only a builder can make it",
    label = "a built module (or an alias of one) where an architecture is expected",
    note = "models are built from architectures (`Linear<4, 2>` from `dfdx::nn::builders`, which typed-amp's prelude exports), each built in the precision its caller or its `#[amp]` policy gives it; a built module such as `modules::Linear<4, 2, f16, Cpu>` has its precision fixed already: name the architecture instead (and pin a field with `#[amp(fp16)]`/`#[amp(fp32)]` where the policy allows)"
)]
pub trait ZeroSizedModule: Default {}

impl<T: ZeroSizedModule + BuildModule<D, E>, D: Device<E>, E: Dtype> BuildOnDevice<D, E> for T {
    type Built = T;
}

impl<E: Dtype, D: Device<E>, T: ZeroSizedModule> TensorCollection<E, D> for T {
    type To<E2: Dtype, D2: Device<E2>> = T;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields((), |_| Default::default())
    }
}

/// Marker trait for modules that don't have different behavior between
/// mutable forwards and non-mutable forwards
pub trait NonMutableModule {}

impl<M: NonMutableModule, T> ModuleMut<T> for M
where
    Self: Module<T>,
{
    type Output = <Self as Module<T>>::Output;
    type Error = <Self as Module<T>>::Error;

    fn try_forward_mut(&mut self, input: T) -> Result<Self::Output, Self::Error> {
        self.try_forward(input)
    }
}
