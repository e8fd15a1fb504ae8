//! The [`AmpModel`] trait `#[amp]` structs implement, the precision casts `#[amp]` inserts
//! ([`CastTo`]), O1's cast-for-compute ([`AutocastForward`]) and the working copies' types.

use dfdx::nn::modules::Module;
use dfdx::nn::{RecursiveWalker, TensorCollection, TensorOptions, TensorVisitor, ViewTensorRef};
use dfdx::prelude::{PutTape, Shape, SplitTape, Tensor};

use super::config::AmpConfig;
use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::master::TrainTarget;
use crate::ops::cast::{Cast, CastDevice};
use crate::params::Parameters;
use crate::precision::{AmpElem, LowPrecision, Precision};
use crate::scaler::GradScaler;
use crate::tape::AmpTape;

/// A model declared with `#[amp(policy = ...)]`: an architecture whose fields are layers, with
/// a master type, a working type and a training target chosen by its policy.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an `#[amp]` model",
    label = "not an `#[amp]` model",
    note = "declare the model with `#[typed_amp::amp(policy = \"O0\" | \"O1\" | \"O2\" | \"O3\")]` on a struct whose fields are layers"
)]
pub trait AmpModel<D: AmpDevice>: Sized {
    /// The FP32 master model.
    type Master: Parameters<D>;
    /// The model forward and backward run on, each layer in its policy's precision.
    type Working: Parameters<D>;
    /// What the optimizer trains: [`crate::master::MasterWeights`],
    /// [`crate::master::Fp32Weights`] or [`crate::master::Fp16Weights`].
    type Weights: TrainTarget<D>;
    /// The precision inputs are cast to at the model's entry.
    type Input: Precision;

    /// The recipe the model was declared with.
    const CONFIG: AmpConfig;

    /// Builds and initialises the FP32 master model.
    fn try_build_master(device: &D) -> Result<Self::Master, AmpError>;

    /// A working model holding the master's values in the working precisions.
    fn try_working_from(master: &Self::Master) -> Result<Self::Working, AmpError>;

    /// Builds the model ready to train: master and working copies initialised alike.
    fn try_build(device: &D) -> Result<Self::Weights, AmpError>;

    /// A loss scaler for the model's recipe.
    ///
    /// # Panics
    ///
    /// If [`Self::CONFIG`](AmpModel::CONFIG) holds a static loss scale that is not finite and
    /// positive, or is above 65,504 ([`MAX_STATIC_SCALE`](crate::scaler::MAX_STATIC_SCALE)),
    /// which `#[amp]` rejects at compile time.
    fn scaler() -> GradScaler {
        Self::CONFIG
            .try_scaler()
            .expect("#[amp] validated the loss scale")
    }
}

/// Casts a tensor to precision `P` (a no-op if it already is): what `#[amp]` inserts at
/// precision boundaries.
#[doc(hidden)] // `#[amp]`'s generated code; users cast with `Cast::cast` or `to_f16`/`to_bf16`/`to_f32`.
pub trait CastTo<P: Precision> {
    /// The cast tensor.
    type Output;
    /// The error a cast can return.
    type Error: std::fmt::Debug;
    /// Casts.
    fn try_cast_to(self) -> Result<Self::Output, Self::Error>;
}

impl<P, S, E, D, T> CastTo<P> for Tensor<S, E, D, T>
where
    P: Precision,
    S: Shape,
    E: AmpElem,
    D: CastDevice<E, P::Elem>,
    T: AmpTape<D>,
{
    type Output = Tensor<S, P::Elem, D, T>;
    type Error = D::Err;
    fn try_cast_to(self) -> Result<Self::Output, D::Err> {
        self.try_cast::<P>()
    }
}

// Integer tensors (token ids into an embedding) have no precision to cast: they pass as they are.
impl<P, S, D, T> CastTo<P> for Tensor<S, usize, D, T>
where
    P: Precision,
    S: Shape,
    D: AmpDevice + dfdx::prelude::Storage<usize>,
{
    type Output = Self;
    type Error = D::Err;
    fn try_cast_to(self) -> Result<Self, D::Err> {
        Ok(self)
    }
}

/// Converts an FP32 module to precision `P` for one forward pass, recording on a tape how each
/// 16-bit parameter's gradient flows back (converted) into its FP32 parameter.
struct CastModule<T, P> {
    tape: T,
    precision: std::marker::PhantomData<P>,
}

impl<D, T, P> TensorVisitor<f32, D> for CastModule<T, P>
where
    D: CastDevice<f32, P::Elem>,
    T: AmpTape<D>,
    P: LowPrecision,
{
    type Viewer = ViewTensorRef;
    type Err = D::Err;
    type E2 = P::Elem;
    type D2 = D;

    fn visit<S: Shape>(
        &mut self,
        _opts: TensorOptions<S, f32, D>,
        t: &Tensor<S, f32, D>,
    ) -> Result<Option<Tensor<S, P::Elem, D>>, D::Err> {
        let (low, piece) = t.retaped::<T>().try_cast::<P>()?.split_tape();
        self.tape = std::mem::take(&mut self.tape).merge(piece);
        Ok(Some(low))
    }
}

/// O1's cast-for-compute: runs an FP32 module `M` in the 16-bit precision `P` on this input,
/// for one forward pass.
///
/// The input and every FP32 parameter are cast to `P` (differentiably, so gradients reach the
/// FP32 parameters in FP32), and the 16-bit copy runs the forward. As with PyTorch's autocast,
/// the weights stay FP32; the 16-bit copy lives for the pass.
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait AutocastForward<M, P: LowPrecision> {
    /// The 16-bit module's output.
    type Output;
    /// The error the forward can return.
    type Error: std::fmt::Debug;
    /// Runs `module` in `P` on `self`.
    fn try_autocast_forward(self, module: &M) -> Result<Self::Output, Self::Error>;
}

impl<M, P, S, E, D, T> AutocastForward<M, P> for Tensor<S, E, D, T>
where
    P: LowPrecision,
    M: TensorCollection<f32, D>,
    M::To<P::Elem, D>: Module<Tensor<S, P::Elem, D, T>, Error = D::Err>,
    S: Shape,
    E: AmpElem,
    D: CastDevice<E, P::Elem> + CastDevice<f32, P::Elem>,
    T: AmpTape<D>,
{
    type Output = <M::To<P::Elem, D> as Module<Tensor<S, P::Elem, D, T>>>::Output;
    type Error = D::Err;

    fn try_autocast_forward(self, module: &M) -> Result<Self::Output, D::Err> {
        let mut cast = CastModule::<T, P> {
            tape: T::default(),
            precision: std::marker::PhantomData,
        };
        let low = M::iter_tensors(&mut RecursiveWalker {
            m: module,
            f: &mut cast,
        })?
        .expect("casting visits every tensor and returns the converted module");
        // The parameter casts are recorded before the layer's ops, so their backward runs after.
        let (x, tape) = self.try_cast::<P>()?.split_tape();
        low.try_forward(x.put_tape(cast.tape.merge(tape)))
    }
}

/// Element `I` of a tuple layer: how `#[amp]`'s generated forward reaches into tuple fields
/// whose type is a generic parameter.
#[doc(hidden)] // `#[amp]`'s generated code.
pub trait TupleField<const I: usize> {
    /// The element's type.
    type Field;
    /// The element.
    fn field(&self) -> &Self::Field;
    /// The element, mutably.
    fn field_mut(&mut self) -> &mut Self::Field;
}

macro_rules! tuple_field {
    ([$($all:ident),+] $idx:tt $ty:ident) => {
        impl<$($all),+> TupleField<$idx> for ($($all,)+) {
            type Field = $ty;
            fn field(&self) -> &$ty {
                &self.$idx
            }
            fn field_mut(&mut self) -> &mut $ty {
                &mut self.$idx
            }
        }
    };
}

macro_rules! tuple_fields {
    ($($all:tt => $($idx:tt $ty:ident),+;)*) => {$(
        $(tuple_field!($all $idx $ty);)+
    )*};
}

tuple_fields! {
    [A] => 0 A;
    [A, B] => 0 A, 1 B;
    [A, B, C] => 0 A, 1 B, 2 C;
    [A, B, C, F] => 0 A, 1 B, 2 C, 3 F;
    [A, B, C, F, G] => 0 A, 1 B, 2 C, 3 F, 4 G;
    [A, B, C, F, G, H] => 0 A, 1 B, 2 C, 3 F, 4 G, 5 H;
}

/// The working model of an `#[amp]` model `M` on device `D` (what forward runs on).
pub type WorkingOf<M, D> = <<M as AmpModel<D>>::Weights as TrainTarget<D>>::Working;

/// The module the optimizer of an `#[amp]` model `M` updates on device `D`.
pub type MasterOf<M, D> = <<M as AmpModel<D>>::Weights as TrainTarget<D>>::Master;

/// `<A as BuildOnDevice<D, E>>::Built`, spelled shorter for generated code.
pub type Built<A, E, D> = <A as dfdx::nn::BuildOnDevice<D, E>>::Built;

/// A module converted to element type `E` (dfdx's `TensorCollection::To`).
pub type Converted<M, E, D> = <M as TensorCollection<f32, D>>::To<E, D>;

/// Converts an FP32 module to element type `E` (used by `#[amp]` to make working copies).
pub fn try_convert<M, E, D>(module: &M) -> Result<Converted<M, E, D>, AmpError>
where
    M: TensorCollection<f32, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
{
    dfdx::nn::ToDtype::try_to_dtype::<E>(module).map_err(AmpError::device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaler::GradScaler;
    use crate::tape::TraceMixed;
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn autocast_computes_in_fp16_and_sends_fp32_gradients_to_fp32_weights() {
        let dev = Cpu::default();
        let mut linear = dev.build_module::<dfdx::nn::builders::Linear<3, 2>, f32>();
        linear.weight = dev.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.25]]);
        linear.bias = dev.tensor([0.1, -0.1]);
        let x: Tensor<Rank2<1, 3>, f32, Cpu> = dev.tensor([[1.0, 1.0, 1.0]]);
        let grads = crate::tape::MixedGradients::for_params(&linear).unwrap();
        let y: Tensor<Rank2<1, 2>, f16, Cpu, _> =
            AutocastForward::<_, crate::precision::F16>::try_autocast_forward(
                x.traced_mixed(grads),
                &linear,
            )
            .unwrap();
        assert_eq!(
            y.array()[0].map(f32::from),
            [6.1, -0.35].map(|v| f16::from_f32(v).to_f32())
        );
        let loss = crate::loss::Loss::new(y.to_f32().sum());
        let grads = GradScaler::disabled().scale(loss).backward().unwrap();
        let g = grads
            .grads()
            .get(&linear.weight)
            .expect("an FP32 weight gradient");
        assert_eq!(g.array(), [[1.0; 3]; 2]);
        assert!(grads.grads().get(&linear.bias).is_some());
    }
}
