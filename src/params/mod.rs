//! Walking a model's parameters in both precisions, by name.
//!
//! dfdx's [`TensorCollection`] visits the tensors of one dtype. A mixed-precision working model
//! (FP16 linear layers beside FP32 norms) has both, so typed-amp walks models through
//! [`Parameters`], which visits every parameter whatever its precision, with its dotted path
//! (`"0.weight"`, `"fc2.bias"`). Any dfdx layer implements it by delegating to its
//! `TensorCollection` in its own dtype; tuples, [`Repeated`] and the residual wrappers implement
//! it field by field, so their fields may differ in precision. Two models built from the same
//! architecture visit their parameters in the same order under the same names, which is how a
//! master model and its working copy are paired (see [`crate::master::MasterWeights`]).

use dfdx::nn::modules::*;
use dfdx::prelude::{ConstDim, ConstShape, HasShape, Shape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;

mod visitor;
mod walker;

pub use visitor::{Access, Mutable, ParamPath, ParamVisitor, Shared};
pub use walker::{visit_collection, visit_collection_mut};

/// A model (or layer) whose parameters typed-amp can walk in both precisions.
///
/// Implemented for dfdx's layers, tuples of layers (whose elements may differ in precision),
/// [`Repeated`], [`Residual`], [`GeneralizedResidual`], [`AddInto`] and [`SplitInto`], a bare
/// tensor, typed-amp's own layers, and the structs `#[amp]` generates.
#[diagnostic::on_unimplemented(
    message = "typed-amp cannot walk the parameters of `{Self}`",
    note = "models are built from dfdx layers, tuples of them, typed-amp's layers and `#[amp]` structs; for your own layer, implement `typed_amp::params::Parameters` by visiting each field with `visit_params_at`"
)]
pub trait Parameters<D: AmpDevice> {
    /// Visits every parameter below `path`.
    fn visit_params_at<V: ParamVisitor<D>>(
        &self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error>;

    /// Visits every parameter below `path`, mutably.
    fn visit_params_mut_at<V: ParamVisitor<D, Mutable>>(
        &mut self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error>;

    /// Visits every parameter, paths starting at the model's root.
    fn visit_params<V: ParamVisitor<D>>(&self, visitor: &mut V) -> Result<(), V::Error> {
        self.visit_params_at(&mut ParamPath::default(), visitor)
    }

    /// Visits every parameter mutably, paths starting at the model's root.
    fn visit_params_mut<V: ParamVisitor<D, Mutable>>(
        &mut self,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        self.visit_params_mut_at(&mut ParamPath::default(), visitor)
    }

    /// Path, precision, element count and trainability of every parameter, in visiting order.
    fn param_summary(&self) -> Vec<ParamInfo> {
        struct Collect(Vec<ParamInfo>);
        impl<D: AmpDevice> ParamVisitor<D> for Collect {
            type Error = std::convert::Infallible;
            fn visit<S: Shape, E: AmpElem>(
                &mut self,
                path: &str,
                param: &Tensor<S, E, D>,
                trainable: bool,
            ) -> Result<(), Self::Error>
            where
                D: Kernels<E>,
            {
                self.0.push(ParamInfo {
                    path: path.to_string(),
                    dtype: crate::precision::dtype_of::<E>(),
                    numel: param.shape().num_elements(),
                    trainable,
                });
                Ok(())
            }
        }
        let mut collect = Collect(Vec::new());
        match self.visit_params(&mut collect) {
            Ok(()) => collect.0,
            Err(never) => match never {},
        }
    }
}

/// One parameter as [`Parameters::param_summary`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Dotted path, e.g. `"2.weight"`.
    pub path: String,
    /// Precision the parameter is stored in.
    pub dtype: crate::precision::DType,
    /// Number of elements.
    pub numel: usize,
    /// False for buffers (batch norm running statistics).
    pub trainable: bool,
}

impl ParamInfo {
    /// Bytes the parameter occupies.
    pub fn size_in_bytes(&self) -> usize {
        self.numel * self.dtype.size_in_bytes()
    }
}

/// Implements [`Parameters`] for dfdx layers generic over their dtype `E` and device `D`.
macro_rules! collection_params {
    ($([$($generics:tt)*] $layer:ty;)*) => {$(
        impl<
            $($generics)*
            E: $crate::precision::AmpElem,
            D: $crate::device::AmpDevice + $crate::device::Kernels<E>,
        > $crate::params::Parameters<D> for $layer
        where
            Self: $crate::dfdx::nn::TensorCollection<E, D>,
        {
            fn visit_params_at<V: $crate::params::ParamVisitor<D>>(
                &self,
                path: &mut $crate::params::ParamPath,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                $crate::params::visit_collection::<Self, E, D, V>(self, path, visitor)
            }

            fn visit_params_mut_at<V: $crate::params::ParamVisitor<D, $crate::params::Mutable>>(
                &mut self,
                path: &mut $crate::params::ParamPath,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                $crate::params::visit_collection_mut::<Self, E, D, V>(self, path, visitor)
            }
        }
    )*};
}

pub(crate) use collection_params;

collection_params! {
    [const I: usize, const O: usize,] Linear<I, O, E, D>;
    [const I: usize, const O: usize,] UnbiasedLinear<I, O, E, D>;
    [const C: usize,] BatchNorm1D<C, E, D>;
    [const C: usize,] BatchNorm2D<C, E, D>;
    [const M: usize,] LayerNorm1D<M, E, D>;
    [const VOCAB: usize, const M: usize,] Embedding<VOCAB, M, E, D>;
    [const C: usize,] Bias2D<C, E, D>;
    [] dfdx::nn::prelu::PReLU<E, D>;
    [C: ConstDim,] dfdx::nn::prelu::PReLU1D<C, E, D>;
    [S: ConstShape,] Tensor<S, E, D>;
}

/// Implements [`Parameters`] for layers without parameters.
macro_rules! parameterless_params {
    ($([$($generics:tt)*] $layer:ty;)*) => {$(
        impl<$($generics)* D: $crate::device::AmpDevice> $crate::params::Parameters<D> for $layer {
            fn visit_params_at<V: $crate::params::ParamVisitor<D>>(
                &self,
                _path: &mut $crate::params::ParamPath,
                _visitor: &mut V,
            ) -> Result<(), V::Error> {
                Ok(())
            }

            fn visit_params_mut_at<V: $crate::params::ParamVisitor<D, $crate::params::Mutable>>(
                &mut self,
                _path: &mut $crate::params::ParamPath,
                _visitor: &mut V,
            ) -> Result<(), V::Error> {
                Ok(())
            }
        }
    )*};
}

pub(crate) use parameterless_params;

parameterless_params! {
    [] ();
    [] ReLU;
    [] FastGeLU;
    [] AccurateGeLU;
    [] Sigmoid;
    [] Tanh;
    [] Sin;
    [] Cos;
    [] Ln;
    [] Exp;
    [] Square;
    [] Sqrt;
    [] Abs;
    [] Softmax;
    [] LogSoftmax;
    [E: dfdx::prelude::Dtype,] LeakyReLU<E>;
    [] Dropout;
    [const N: usize,] DropoutOneIn<N>;
    [] AvgPoolGlobal;
    [] MaxPoolGlobal;
    [] MinPoolGlobal;
}

// dfdx's deprecated `GeLU` (`FastGeLU` under its older name) is a correct layer without
// parameters, as its row of the policy table says (`amp::layer_kind`).
#[allow(deprecated)]
mod deprecated_gelu {
    super::parameterless_params! {
        [] dfdx::nn::modules::GeLU;
    }
}

macro_rules! tuple_params {
    ($([$($name:ident $idx:tt),+])*) => {$(
        impl<D: AmpDevice, $($name: Parameters<D>),+> Parameters<D> for ($($name,)+) {
            fn visit_params_at<Vis: ParamVisitor<D>>(
                &self,
                path: &mut ParamPath,
                visitor: &mut Vis,
            ) -> Result<(), Vis::Error> {
                $(path.within(stringify!($idx), |path| self.$idx.visit_params_at(path, visitor))?;)+
                Ok(())
            }

            fn visit_params_mut_at<Vis: ParamVisitor<D, Mutable>>(
                &mut self,
                path: &mut ParamPath,
                visitor: &mut Vis,
            ) -> Result<(), Vis::Error> {
                $(path.within(stringify!($idx), |path| self.$idx.visit_params_mut_at(path, visitor))?;)+
                Ok(())
            }
        }
    )*};
}

tuple_params! {
    [A 0]
    [A 0, B 1]
    [A 0, B 1, C 2]
    [A 0, B 1, C 2, F 3]
    [A 0, B 1, C 2, F 3, G 4]
    [A 0, B 1, C 2, F 3, G 4, H 5]
    [A 0, B 1, C 2, F 3, G 4, H 5, I 6]
    [A 0, B 1, C 2, F 3, G 4, H 5, I 6, J 7]
}

/// Implements [`Parameters`] for layers whose named fields are layers: each field visited under
/// its name, in the order listed (dfdx's wrappers here; typed-amp's attention layers in `nn`).
macro_rules! field_params {
    ($([$($generics:tt)*] $wrapper:ty { $($field:tt => $name:literal),+ };)*) => {$(
        impl<$($generics)* D: $crate::device::AmpDevice> $crate::params::Parameters<D> for $wrapper {
            fn visit_params_at<Vis: $crate::params::ParamVisitor<D>>(
                &self,
                path: &mut $crate::params::ParamPath,
                visitor: &mut Vis,
            ) -> Result<(), Vis::Error> {
                $(path.within($name, |path| self.$field.visit_params_at(path, visitor))?;)+
                Ok(())
            }

            fn visit_params_mut_at<Vis: $crate::params::ParamVisitor<D, $crate::params::Mutable>>(
                &mut self,
                path: &mut $crate::params::ParamPath,
                visitor: &mut Vis,
            ) -> Result<(), Vis::Error> {
                $(path.within($name, |path| self.$field.visit_params_mut_at(path, visitor))?;)+
                Ok(())
            }
        }
    )*};
}

pub(crate) use field_params;

field_params! {
    [F: Parameters<D>,] Residual<F> { 0 => "0" };
    [T: Parameters<D>,] AddInto<T> { 0 => "0" };
    [T: Parameters<D>,] SplitInto<T> { 0 => "0" };
    [F: Parameters<D>, R: Parameters<D>,] GeneralizedResidual<F, R> { f => "f", r => "r" };
}

impl<D: AmpDevice, T: Parameters<D>, const N: usize> Parameters<D> for Repeated<T, N> {
    fn visit_params_at<V: ParamVisitor<D>>(
        &self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        for (i, module) in self.modules.iter().enumerate() {
            path.within(&i.to_string(), |path| module.visit_params_at(path, visitor))?;
        }
        Ok(())
    }

    fn visit_params_mut_at<V: ParamVisitor<D, Mutable>>(
        &mut self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        for (i, module) in self.modules.iter_mut().enumerate() {
            path.within(&i.to_string(), |path| {
                module.visit_params_mut_at(path, visitor)
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::DType;
    use dfdx::prelude::*;
    use half::f16;

    #[test]
    fn mixed_precision_tuples_list_every_parameter_by_path() {
        let dev = Cpu::default();
        let model = (
            dev.build_module::<dfdx::nn::builders::Linear<3, 4>, f16>(),
            ReLU,
            dev.build_module::<dfdx::nn::builders::BatchNorm1D<4>, f32>(),
        );
        let summary = Parameters::<Cpu>::param_summary(&model);
        let listed: Vec<(&str, DType, usize, bool)> = summary
            .iter()
            .map(|p| (p.path.as_str(), p.dtype, p.numel, p.trainable))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("0.weight", DType::F16, 12, true),
                ("0.bias", DType::F16, 4, true),
                ("2.scale", DType::F32, 4, true),
                ("2.bias", DType::F32, 4, true),
                ("2.running_mean", DType::F32, 4, false),
                ("2.running_var", DType::F32, 4, false),
            ]
        );
        assert_eq!(summary[0].size_in_bytes(), 24);
    }

    #[test]
    fn paths_nest_and_unwind() {
        let mut path = ParamPath::default();
        path.push("a");
        path.push("0");
        assert_eq!(path.as_str(), "a.0");
        path.pop();
        path.within("weight", |p| assert_eq!(p.as_str(), "a.weight"));
        path.pop();
        assert_eq!(path.as_str(), "");
    }
}
