//! The walk itself: dfdx's [`ModuleVisitor`] adapted to typed-amp's parameter visitors, with
//! each parameter's path; one walker for both modes ([`Shared`], [`Mutable`]).

use dfdx::nn::{ModuleVisitor, ScalarOptions, TensorCollection, TensorOptions};
use dfdx::prelude::{Shape, Tensor};
use num_traits::NumCast;

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;

use super::visitor::{Access, Mutable, ParamPath, ParamVisitor, Shared};

/// Adapts a [`ParamVisitor`] of mode `A` to dfdx's [`ModuleVisitor`], keeping track of the
/// path: it holds the module by `A`'s reference (a lifetime of its own: a reborrow of a mode's
/// reference is not known to shorten like `&'m T` does) and hands each field and tensor on by the
/// accessor of that mode (dfdx passes both, `get_refs` and `get_muts`).
struct Walker<'m, 'w, T: 'm, A: Access, V> {
    module: A::Ref<'m, T>,
    path: &'w mut ParamPath,
    visitor: &'w mut V,
}

impl<'m, T: 'm, E, D, A, V> ModuleVisitor<T, E, D> for Walker<'m, '_, T, A, V>
where
    T: TensorCollection<E, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    A: Access,
    V: ParamVisitor<D, A>,
{
    type Err = V::Error;
    type E2 = E;
    type D2 = D;

    fn visit_module<Field, GetRef, GetMut>(
        &mut self,
        name: &str,
        get_refs: GetRef,
        get_muts: GetMut,
    ) -> Result<Option<Field::To<E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Field,
        GetMut: FnMut(&mut T) -> &mut Field,
        Field: TensorCollection<E, D>,
    {
        let module = A::project(A::reborrow(&mut self.module), get_refs, get_muts);
        let visitor = &mut *self.visitor;
        self.path.within(name, |path| {
            Field::iter_tensors(&mut Walker::<'_, '_, Field, A, V> {
                module,
                path,
                visitor,
            })
        })?;
        Ok(None)
    }

    fn visit_tensor<S: Shape, GetRef, GetMut>(
        &mut self,
        name: &str,
        get_refs: GetRef,
        get_muts: GetMut,
        opts: TensorOptions<S, E, D>,
    ) -> Result<Option<Tensor<S, E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Tensor<S, E, D>,
        GetMut: FnMut(&mut T) -> &mut Tensor<S, E, D>,
    {
        let tensor = A::project(A::reborrow(&mut self.module), get_refs, get_muts);
        let visitor = &mut *self.visitor;
        self.path.within(name, |path| {
            visitor.visit(path.as_str(), tensor, opts.do_gradient_update)
        })?;
        Ok(None)
    }

    fn visit_scalar<N, GetRef, GetMut>(
        &mut self,
        _name: &str,
        _get_refs: GetRef,
        _get_muts: GetMut,
        _opts: ScalarOptions<N>,
    ) -> Result<Option<N>, Self::Err>
    where
        N: NumCast,
        GetRef: FnMut(&T) -> &N,
        GetMut: FnMut(&mut T) -> &mut N,
    {
        Ok(None)
    }

    fn visit_fields<M: dfdx::nn::ModuleFields<T, E, D>>(
        &mut self,
        fields: M,
        _builder: impl FnOnce(M::Output<E, D>) -> T::To<E, D>,
    ) -> Result<Option<T::To<E, D>>, Self::Err> {
        fields.visit_fields(self)?;
        Ok(None)
    }
}

/// Visits the parameters of a single-precision dfdx [`TensorCollection`] in its own dtype.
///
/// This is how a layer implements [`Parameters`](crate::params::Parameters); `#[amp]` also uses it for its fields.
pub fn visit_collection<M, E, D, V>(
    module: &M,
    path: &mut ParamPath,
    visitor: &mut V,
) -> Result<(), V::Error>
where
    M: TensorCollection<E, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    V: ParamVisitor<D>,
{
    M::iter_tensors(&mut Walker::<'_, '_, M, Shared, V> {
        module,
        path,
        visitor,
    })?;
    Ok(())
}

/// Mutable counterpart of [`visit_collection`].
pub fn visit_collection_mut<M, E, D, V>(
    module: &mut M,
    path: &mut ParamPath,
    visitor: &mut V,
) -> Result<(), V::Error>
where
    M: TensorCollection<E, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    V: ParamVisitor<D, Mutable>,
{
    M::iter_tensors(&mut Walker::<'_, '_, M, Mutable, V> {
        module,
        path,
        visitor,
    })?;
    Ok(())
}
