//! A user's layer that does not say which row of the policy table it is in: `#[amp]` cannot
//! give it a precision. (Implement `AmpLayer` for it, or pin the field.)
use typed_amp::device::Kernels;
use typed_amp::dfdx::nn::{BuildModule, BuildOnDevice, ModuleVisitor, NonMutableModule};
use typed_amp::dfdx::nn::{TensorCollection, TensorOptions};
use typed_amp::params::{visit_collection, visit_collection_mut, ParamPath};
use typed_amp::params::{Mutable, ParamVisitor};
use typed_amp::prelude::*;
use typed_amp::{device::AmpDevice, params::Parameters, precision::AmpElem};

#[derive(Debug)]
pub struct Shift;

#[derive(Debug, Clone)]
pub struct ShiftLayer<E: Dtype, D: Storage<E>> {
    pub by: Tensor<Rank1<4>, E, D>,
}

impl<E: Dtype, D: Device<E>> BuildOnDevice<D, E> for Shift
where
    ShiftLayer<E, D>: BuildModule<D, E>,
{
    type Built = ShiftLayer<E, D>;
}

impl<E: Dtype, D: Device<E>> TensorCollection<E, D> for ShiftLayer<E, D> {
    type To<E2: Dtype, D2: Device<E2>> = ShiftLayer<E2, D2>;
    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            Self::tensor("by", |s| &s.by, |s| &mut s.by, TensorOptions::reset_to_zeros()),
            |by| ShiftLayer { by },
        )
    }
}

impl<E: Dtype, D: Storage<E>> NonMutableModule for ShiftLayer<E, D> {}

impl<B: Dim, E: Dtype, D: Device<E>, T: Tape<E, D>> Module<Tensor<(B, Const<4>), E, D, T>>
    for ShiftLayer<E, D>
{
    type Output = Tensor<(B, Const<4>), E, D, T>;
    type Error = D::Err;
    fn try_forward(&self, x: Tensor<(B, Const<4>), E, D, T>) -> Result<Self::Output, D::Err> {
        let shape = *x.shape();
        x.try_add(self.by.retaped::<T>().try_broadcast_like(&shape)?)
    }
}

impl<E: AmpElem, D: AmpDevice + Kernels<E>> Parameters<D> for ShiftLayer<E, D> {
    fn visit_params_at<V: ParamVisitor<D>>(
        &self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        visit_collection::<Self, E, D, V>(self, path, visitor)
    }
    fn visit_params_mut_at<V: ParamVisitor<D, Mutable>>(
        &mut self,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        visit_collection_mut::<Self, E, D, V>(self, path, visitor)
    }
}

// Missing: `impl AmpLayer for ShiftLayer<E, D> { type Kind = typed_amp::amp::kind::Elementwise; }`
#[typed_amp::amp(policy = "O2")]
struct Mlp {
    fc: Linear<4, 4>,
    shift: Shift,
}

fn main() {
    let _ = Mlp::build(&Cpu::default());
}
