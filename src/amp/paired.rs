//! How each row of the policy table pairs a master layer with its working copy: the bridge from
//! [`AmpLayer`] to [`Paired`], by the layer's kind (a leaf tensor by tensor, a composite part by
//! part). Here, above [`crate::master`], so that the walk over pairs needs nothing of `amp`.

use dfdx::nn::TensorCollection;

use crate::amp::{kind, AmpLayer};
use crate::device::AmpDevice;
use crate::master::{zip_layer, CompositePaired, PairVisitor, Paired};
use crate::params::{ParamPath, Parameters};

/// How a kind of layer pairs a master layer `M` with its working copy `W`.
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait KindPaired<M, W, D: AmpDevice> {
    /// See [`Paired::visit_pairs_at`].
    fn visit_pairs_at<V: PairVisitor<D>>(
        master: &mut M,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error>;
}

impl<M: AmpLayer, W, D: AmpDevice> Paired<W, D> for M
where
    M::Kind: KindPaired<M, W, D>,
{
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        <M::Kind as KindPaired<M, W, D>>::visit_pairs_at(self, working, path, visitor)
    }
}

macro_rules! leaf_pairs {
    ($($kind:ty $(, $param:ident)?;)*) => {$(
        impl<M, W, D $(, $param)?> KindPaired<M, W, D> for $kind
        where
            M: TensorCollection<f32, D>,
            W: Parameters<D>,
            D: AmpDevice,
        {
            fn visit_pairs_at<V: PairVisitor<D>>(
                master: &mut M,
                working: &mut W,
                path: &mut ParamPath,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                zip_layer(master, working, path, visitor)
            }
        }
    )*};
}

leaf_pairs! {
    kind::Matmul;
    kind::Linear;
    kind::Activation;
    kind::Norm;
    kind::LayerNorm;
    kind::Fp32Op;
    kind::Softmax;
    kind::Elementwise;
    kind::Neutral;
    kind::Cast<P>, P;
}

impl<M: CompositePaired<W, D>, W, D: AmpDevice> KindPaired<M, W, D> for kind::Composite {
    fn visit_pairs_at<V: PairVisitor<D>>(
        master: &mut M,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        master.visit_pairs_at(working, path, visitor)
    }
}

impl<M: CompositePaired<W, D>, W, D: AmpDevice, A> KindPaired<M, W, D> for kind::Nested<A> {
    fn visit_pairs_at<V: PairVisitor<D>>(
        master: &mut M,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        master.visit_pairs_at(working, path, visitor)
    }
}
