//! The walk itself: dfdx's [`ModuleVisitor`] adapted to typed-amp's parameter visitors, with
//! each parameter's path.

use dfdx::nn::{ModuleVisitor, ScalarOptions, TensorCollection, TensorOptions};
use dfdx::prelude::{Shape, Tensor};
use num_traits::NumCast;

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;

use super::visitor::{ParamPath, ParamVisitor, ParamVisitorMut};

/// Adapts a [`ParamVisitor`] to dfdx's [`ModuleVisitor`], keeping track of the path.
struct RefWalker<'w, T, V> {
    module: &'w T,
    path: &'w mut ParamPath,
    visitor: &'w mut V,
}

impl<T, E, D, V> ModuleVisitor<T, E, D> for RefWalker<'_, T, V>
where
    T: TensorCollection<E, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    V: ParamVisitor<D>,
{
    type Err = V::Error;
    type E2 = E;
    type D2 = D;

    fn visit_module<Field, GetRef, GetMut>(
        &mut self,
        name: &str,
        mut get_refs: GetRef,
        _get_muts: GetMut,
    ) -> Result<Option<Field::To<E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Field,
        GetMut: FnMut(&mut T) -> &mut Field,
        Field: TensorCollection<E, D>,
    {
        let module = get_refs(self.module);
        let visitor = &mut *self.visitor;
        self.path.within(name, |path| {
            Field::iter_tensors(&mut RefWalker {
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
        mut get_refs: GetRef,
        _get_muts: GetMut,
        opts: TensorOptions<S, E, D>,
    ) -> Result<Option<Tensor<S, E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Tensor<S, E, D>,
        GetMut: FnMut(&mut T) -> &mut Tensor<S, E, D>,
    {
        let tensor = get_refs(self.module);
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

/// Adapts a [`ParamVisitorMut`] to dfdx's [`ModuleVisitor`].
struct MutWalker<'w, T, V> {
    module: &'w mut T,
    path: &'w mut ParamPath,
    visitor: &'w mut V,
}

impl<T, E, D, V> ModuleVisitor<T, E, D> for MutWalker<'_, T, V>
where
    T: TensorCollection<E, D>,
    E: AmpElem,
    D: AmpDevice + Kernels<E>,
    V: ParamVisitorMut<D>,
{
    type Err = V::Error;
    type E2 = E;
    type D2 = D;

    fn visit_module<Field, GetRef, GetMut>(
        &mut self,
        name: &str,
        _get_refs: GetRef,
        mut get_muts: GetMut,
    ) -> Result<Option<Field::To<E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Field,
        GetMut: FnMut(&mut T) -> &mut Field,
        Field: TensorCollection<E, D>,
    {
        let module = get_muts(self.module);
        let visitor = &mut *self.visitor;
        self.path.within(name, |path| {
            Field::iter_tensors(&mut MutWalker {
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
        _get_refs: GetRef,
        mut get_muts: GetMut,
        opts: TensorOptions<S, E, D>,
    ) -> Result<Option<Tensor<S, E, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Tensor<S, E, D>,
        GetMut: FnMut(&mut T) -> &mut Tensor<S, E, D>,
    {
        let tensor = get_muts(self.module);
        let visitor = &mut *self.visitor;
        self.path.within(name, |path| {
            visitor.visit_mut(path.as_str(), tensor, opts.do_gradient_update)
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
    M::iter_tensors(&mut RefWalker {
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
    V: ParamVisitorMut<D>,
{
    M::iter_tensors(&mut MutWalker {
        module,
        path,
        visitor,
    })?;
    Ok(())
}
