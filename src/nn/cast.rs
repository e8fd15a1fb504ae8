//! Differentiable casts as layers, to place inside tuples at the boundary between layers of
//! different precisions. They run [`Cast::cast`](crate::ops::cast::Cast::cast).

use dfdx::nn::{NonMutableModule, ZeroSizedModule};
use dfdx::prelude::*;

use crate::device::AmpDevice;
use crate::ops::cast::CastDevice;
use crate::precision::{AmpElem, Precision};
use crate::tape::AmpTape;

/// A layer that casts its input to one precision.
#[doc(hidden)] // the cast layers' row machinery: users name `ToF16`, `ToBf16` and `ToF32`.
pub trait CastLayer {
    /// The precision it casts to.
    type To: Precision;
}

macro_rules! cast_layers {
    ($($layer:ident => $marker:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $layer;

        impl CastLayer for $layer {
            type To = crate::precision::$marker;
        }

        impl ZeroSizedModule for $layer {}
        impl NonMutableModule for $layer {}

        impl<S: Shape, E: AmpElem, D, T: AmpTape<D>> Module<Tensor<S, E, D, T>> for $layer
        where
            D: AmpDevice + CastDevice<E, <crate::precision::$marker as Precision>::Elem>,
        {
            type Output = Tensor<S, <crate::precision::$marker as Precision>::Elem, D, T>;
            type Error = D::Err;

            fn try_forward(&self, x: Tensor<S, E, D, T>) -> Result<Self::Output, D::Err> {
                crate::ops::cast::try_cast_to::<crate::precision::$marker, _, _, _, _>(x)
            }
        }

        crate::params::parameterless_params!([] $layer;);
    )*};
}

cast_layers! {
    ToF16 => F16, "Casts its input to FP16 (see [`crate::ops::cast::to_f16`]).";
    ToBf16 => BF16, "Casts its input to BF16 (see [`crate::ops::cast::to_bf16`]).";
    ToF32 => F32, "Casts its input to FP32 (see [`crate::ops::cast::to_f32`]).";
}
