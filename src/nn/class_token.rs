//! A vision transformer's class token and learned position embedding, and the pooling that
//! reads the class token back out.

use dfdx::nn::{
    BuildModule, BuildOnDevice, Module, ModuleVisitor, NonMutableModule, TensorCollection,
    TensorOptions, ZeroSizedModule,
};
use dfdx::prelude::*;
use num_traits::Float;
use rand_distr::uniform::SampleUniform;
use rand_distr::Uniform;

/// Architecture types for [`ClassToken`] and [`ClassPool`].
pub mod builder {
    /// A learned class token before `N` tokens of width `M`, and a learned position
    /// embedding added to those `N`.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct ClassToken<const N: usize, const M: usize>;
}

impl<const N: usize, const M: usize, E: Dtype, D: Device<E>> BuildOnDevice<D, E>
    for builder::ClassToken<N, M>
where
    ClassToken<N, M, E, D>: BuildModule<D, E>,
{
    type Built = ClassToken<N, M, E, D>;
}

/// Adds a learned position embedding to `N` tokens and puts a learned class token before
/// them: `(batch, N, M)` → `(batch, N + 1, M)` (the token count a run-time dimension).
///
/// The class token's own position embedding is folded into it (the sum of two learned vectors
/// is one learned vector). Both are initialised with standard deviation 0.02, as ViT's are.
#[derive(Debug, Clone)]
pub struct ClassToken<const N: usize, const M: usize, E: Dtype, D: Storage<E>> {
    /// The class token, `(M,)`.
    pub class: Tensor<Rank1<M>, E, D>,
    /// The position embedding of the `N` tokens, `(N, M)`.
    pub position: Tensor<Rank2<N, M>, E, D>,
}

/// A uniform distribution with standard deviation 0.02.
fn init<E: Dtype + Float + SampleUniform>() -> Uniform<E> {
    let bound = E::from_f64(0.02 * 3f64.sqrt()).unwrap();
    Uniform::new(-bound, bound)
}

impl<const N: usize, const M: usize, E, D> TensorCollection<E, D> for ClassToken<N, M, E, D>
where
    E: Dtype + Float + SampleUniform,
    D: Device<E>,
{
    type To<E2: Dtype, D2: Device<E2>> = ClassToken<N, M, E2, D2>;

    fn iter_tensors<V: ModuleVisitor<Self, E, D>>(
        visitor: &mut V,
    ) -> Result<Option<Self::To<V::E2, V::D2>>, V::Err> {
        visitor.visit_fields(
            (
                Self::tensor(
                    "class",
                    |s| &s.class,
                    |s| &mut s.class,
                    TensorOptions::reset_with(|t| t.try_fill_with_distr(init::<E>())),
                ),
                Self::tensor(
                    "position",
                    |s| &s.position,
                    |s| &mut s.position,
                    TensorOptions::reset_with(|t| t.try_fill_with_distr(init::<E>())),
                ),
            ),
            |(class, position)| ClassToken { class, position },
        )
    }
}

impl<const N: usize, const M: usize, E: Dtype, D: Storage<E>> NonMutableModule
    for ClassToken<N, M, E, D>
{
}

impl<const N: usize, const M: usize, B, E, D, T> Module<Tensor<(B, Const<N>, Const<M>), E, D, T>>
    for ClassToken<N, M, E, D>
where
    B: Dim,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D> + Merge<T>,
{
    type Output = Tensor<(B, usize, Const<M>), E, D, T>;
    type Error = D::Err;

    fn try_forward(
        &self,
        x: Tensor<(B, Const<N>, Const<M>), E, D, T>,
    ) -> Result<Self::Output, D::Err> {
        let batch = x.shape().0;
        let position = self
            .position
            .retaped::<T>()
            .try_broadcast_like::<_, Axis<0>>(&(batch, Const::<N>, Const::<M>))?;
        let tokens = x
            .try_add(position)?
            .try_reshape_like(&(batch, N, Const::<M>))?;
        let class = self
            .class
            .retaped::<T>()
            .try_broadcast_like::<_, Axes2<0, 1>>(&(batch, 1usize, Const::<M>))?;
        (class, tokens).try_concat_along(Axis::<1>)
    }
}

crate::params::collection_params!([const N: usize, const M: usize,] ClassToken<N, M, E, D>;);

/// Reads the class token (the first token) out of `(batch, tokens, M)`: `(batch, M)`, what a
/// classification head takes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassPool;

impl ZeroSizedModule for ClassPool {}
impl NonMutableModule for ClassPool {}

impl<B: Dim, S: Dim, const M: usize, E: Dtype, D: Device<E>, T: Tape<E, D>>
    Module<Tensor<(B, S, Const<M>), E, D, T>> for ClassPool
{
    type Output = Tensor<(B, Const<M>), E, D, T>;
    type Error = D::Err;

    fn try_forward(&self, x: Tensor<(B, S, Const<M>), E, D, T>) -> Result<Self::Output, D::Err> {
        let batch = x.shape().0;
        x.try_slice((.., 0..1, ..))?
            .try_reshape_like(&(batch, Const::<M>))
    }
}

crate::params::parameterless_params!([] ClassPool;);
