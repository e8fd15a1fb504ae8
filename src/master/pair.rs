//! Walking a master model and its working copy together, parameter by parameter, by type.
//!
//! [`Paired<W, D>`] says that a model is the master of the working copy `W`: tuples pair with
//! tuples element by element, [`Repeated`] with [`Repeated`] block by block, [`Residual`] with
//! [`Residual`], the structs `#[amp]` generates field by field, and a layer with its working copy
//! (the same layer in another precision) tensor by tensor, in the order the layer's own
//! `TensorCollection` visits them. The composition is checked by the compiler: a working copy of
//! another shape of model does not pair. Inside a layer, the two tensors of a pair are checked
//! for the same name, size and trainability as they are visited, so a layer of another size is
//! refused by name (`ParamMismatch`).
//!
//! A walk hands each pair to a [`PairVisitor`] with both tensors in their own types: the
//! master's FP32 tensor and the working copy's tensor of whatever precision its layer runs in.

use dfdx::nn::modules::{Repeated, Residual};
use dfdx::nn::{ModuleVisitor, ScalarOptions, TensorCollection, TensorOptions};
use dfdx::prelude::{HasShape, Shape, Tensor};
use num_traits::NumCast;

use crate::device::{AmpDevice, Kernels};
use crate::error::AmpError;
use crate::params::{Mutable, ParamPath, ParamVisitor, Parameters};
use crate::precision::AmpElem;

/// Visits the (master, working) pairs of parameters of a [`Paired`] walk.
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait PairVisitor<D: AmpDevice> {
    /// The error a visit can return; pairing mismatches are reported as [`AmpError`]s.
    type Error: From<AmpError>;

    /// Called once per parameter or buffer (`trainable == false`: batch norm's running
    /// statistics), with the FP32 master tensor and its working copy.
    fn visit_pair<Sm: Shape, Sw: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        master: &mut Tensor<Sm, f32, D>,
        working: &mut Tensor<Sw, E, D>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Kernels<E>;
}

/// A model that is the FP32 master of the working copy `W`: the two are walked together
/// ([`Paired::visit_pairs`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the master of `{W}`",
    label = "no working copy of this shape",
    note = "a working copy is the master model with each layer in its working precision: the same tuple, `Repeated`, `Residual` or `#[amp]` struct, layer for layer; every layer needs `typed_amp::amp::AmpLayer`"
)]
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait Paired<W, D: AmpDevice> {
    /// Visits every (master, working) pair below `path`.
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error>;

    /// Visits every (master, working) pair, paths starting at the model's root.
    fn visit_pairs<V: PairVisitor<D>>(
        &mut self,
        working: &mut W,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        self.visit_pairs_at(working, &mut ParamPath::default(), visitor)
    }
}

/// Pairing for [`kind::Composite`](crate::amp::kind::Composite) and
/// [`kind::Nested`](crate::amp::kind::Nested) layers: part by part.
#[doc(hidden)] // `#[amp]`'s generated code and typed-amp's own machinery: see `typed_amp::__private`.
pub trait CompositePaired<W, D: AmpDevice> {
    /// See [`Paired::visit_pairs_at`].
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut W,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error>;
}

macro_rules! tuple_pairs {
    ($([$($m:ident $w:ident $idx:tt),+];)*) => {$(
        impl<D: AmpDevice, $($m: Paired<$w, D>, $w),+> CompositePaired<($($w,)+), D> for ($($m,)+) {
            fn visit_pairs_at<V: PairVisitor<D>>(
                &mut self,
                working: &mut ($($w,)+),
                path: &mut ParamPath,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                $(path.within(stringify!($idx), |path| {
                    self.$idx.visit_pairs_at(&mut working.$idx, path, visitor)
                })?;)+
                Ok(())
            }
        }
    )*};
}

tuple_pairs! {
    [A WA 0];
    [A WA 0, B WB 1];
    [A WA 0, B WB 1, C WC 2];
    [A WA 0, B WB 1, C WC 2, F WF 3];
    [A WA 0, B WB 1, C WC 2, F WF 3, G WG 4];
    [A WA 0, B WB 1, C WC 2, F WF 3, G WG 4, H WH 5];
}

impl<D: AmpDevice, T: Paired<W, D>, W, const N: usize> CompositePaired<Repeated<W, N>, D>
    for Repeated<T, N>
{
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut Repeated<W, N>,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        for (i, (m, w)) in self
            .modules
            .iter_mut()
            .zip(working.modules.iter_mut())
            .enumerate()
        {
            path.within(&i.to_string(), |path| m.visit_pairs_at(w, path, visitor))?;
        }
        Ok(())
    }
}

impl<D: AmpDevice, F: Paired<W, D>, W> CompositePaired<Residual<W>, D> for Residual<F> {
    fn visit_pairs_at<V: PairVisitor<D>>(
        &mut self,
        working: &mut Residual<W>,
        path: &mut ParamPath,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        // dfdx names a residual's module "0", as `Parameters` does.
        path.within("0", |path| {
            self.0.visit_pairs_at(&mut working.0, path, visitor)
        })
    }
}

/// Pairs one layer's FP32 tensors with its working copy's, in the order the layer's own
/// `TensorCollection` visits them, checking each pair's name, size and trainability.
#[doc(hidden)] // `#[amp]`'s machinery: see `typed_amp::__private`.
pub fn zip_layer<M, W, D, V>(
    master: &mut M,
    working: &mut W,
    path: &mut ParamPath,
    visitor: &mut V,
) -> Result<(), V::Error>
where
    M: TensorCollection<f32, D>,
    W: Parameters<D>,
    D: AmpDevice,
    V: PairVisitor<D>,
{
    let prefix = path.clone();
    let mut side = WorkingSide {
        master,
        prefix: &prefix,
        visitor,
        index: 0,
    };
    working.visit_params_mut_at(path, &mut side)?;
    let paired = side.index;
    // A master tensor past the working copy's last one has no partner.
    let mut probe = MasterSide::<Probe<V>> {
        target: paired,
        count: 0,
        path: prefix.clone(),
        pair: None,
        found: None,
    };
    M::iter_tensors(&mut MasterWalker {
        module: side.master,
        state: &mut probe,
    })?;
    match probe.found {
        Some(path) => Err(mismatch(&path, "only the master has this parameter").into()),
        None => Ok(()),
    }
}

fn mismatch(path: &str, detail: &str) -> AmpError {
    AmpError::ParamMismatch {
        path: path.to_string(),
        detail: detail.to_string(),
    }
}

/// The working side of [`zip_layer`]: each working tensor, in order, finds its master.
struct WorkingSide<'a, M, V> {
    master: &'a mut M,
    prefix: &'a ParamPath,
    visitor: &'a mut V,
    index: usize,
}

impl<M, D, V> ParamVisitor<D, Mutable> for WorkingSide<'_, M, V>
where
    M: TensorCollection<f32, D>,
    D: AmpDevice,
    V: PairVisitor<D>,
{
    type Error = V::Error;

    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        working: &mut Tensor<S, E, D>,
        trainable: bool,
    ) -> Result<(), V::Error>
    where
        D: Kernels<E>,
    {
        let index = self.index;
        self.index += 1;
        let mut state = MasterSide {
            target: index,
            count: 0,
            path: self.prefix.clone(),
            pair: Some(Pair::<S, E, D, V> {
                working,
                path,
                trainable,
                visitor: &mut *self.visitor,
            }),
            found: None,
        };
        M::iter_tensors(&mut MasterWalker {
            module: &mut *self.master,
            state: &mut state,
        })?;
        match state.found {
            Some(_) => Ok(()),
            None => Err(mismatch(path, "only the working copy has this parameter").into()),
        }
    }
}

/// The working tensor waiting for its master, and where to send the pair.
struct Pair<'a, Sw: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, V> {
    working: &'a mut Tensor<Sw, E, D>,
    path: &'a str,
    trainable: bool,
    visitor: &'a mut V,
}

/// The master side of [`zip_layer`]: counts the master's tensors up to number `target`.
struct MasterSide<W> {
    target: usize,
    count: usize,
    path: ParamPath,
    pair: Option<W>,
    /// The path of tensor number `target`, once found.
    found: Option<String>,
}

/// Hands a master tensor to a waiting pair.
trait Partner<D: AmpDevice> {
    type Visitor: PairVisitor<D>;
    fn meet<S: Shape>(
        self,
        master_path: &str,
        master: &mut Tensor<S, f32, D>,
        trainable: bool,
    ) -> Result<(), <Self::Visitor as PairVisitor<D>>::Error>;
}

impl<Sw: Shape, E: AmpElem, D: AmpDevice + Kernels<E>, V: PairVisitor<D>> Partner<D>
    for Pair<'_, Sw, E, D, V>
{
    type Visitor = V;
    fn meet<S: Shape>(
        self,
        master_path: &str,
        master: &mut Tensor<S, f32, D>,
        trainable: bool,
    ) -> Result<(), V::Error> {
        let detail = if master_path != self.path {
            Some(format!("the master has `{master_path}` here"))
        } else if master.shape().num_elements() != self.working.shape().num_elements() {
            Some(format!(
                "{} elements in the master, {} in the working copy",
                master.shape().num_elements(),
                self.working.shape().num_elements()
            ))
        } else if trainable != self.trainable {
            Some("trainable in one model, a buffer in the other".to_string())
        } else {
            None
        };
        if let Some(detail) = detail {
            return Err(mismatch(self.path, &detail).into());
        }
        self.visitor
            .visit_pair(self.path, master, self.working, trainable)
    }
}

/// A probe that only looks for a tensor past the working copy's last: it pairs with nothing.
struct Probe<V>(std::marker::PhantomData<V>);

impl<D: AmpDevice, V: PairVisitor<D>> Partner<D> for Probe<V> {
    type Visitor = V;
    fn meet<S: Shape>(self, _: &str, _: &mut Tensor<S, f32, D>, _: bool) -> Result<(), V::Error> {
        Ok(())
    }
}

/// Walks a master layer (FP32) with dfdx's visitor, for [`MasterSide`].
struct MasterWalker<'a, T, W> {
    module: &'a mut T,
    state: &'a mut MasterSide<W>,
}

impl<T, D, W> ModuleVisitor<T, f32, D> for MasterWalker<'_, T, W>
where
    T: TensorCollection<f32, D>,
    D: AmpDevice,
    W: Partner<D>,
{
    type Err = <W::Visitor as PairVisitor<D>>::Error;
    type E2 = f32;
    type D2 = D;

    fn visit_module<Field, GetRef, GetMut>(
        &mut self,
        name: &str,
        _get_refs: GetRef,
        mut get_muts: GetMut,
    ) -> Result<Option<Field::To<f32, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Field,
        GetMut: FnMut(&mut T) -> &mut Field,
        Field: TensorCollection<f32, D>,
    {
        if self.state.found.is_some() {
            return Ok(None);
        }
        let module = get_muts(self.module);
        self.state.path.push(name);
        let result = Field::iter_tensors(&mut MasterWalker {
            module,
            state: &mut *self.state,
        });
        self.state.path.pop();
        result.map(|_| None)
    }

    fn visit_tensor<S: Shape, GetRef, GetMut>(
        &mut self,
        name: &str,
        _get_refs: GetRef,
        mut get_muts: GetMut,
        opts: TensorOptions<S, f32, D>,
    ) -> Result<Option<Tensor<S, f32, D>>, Self::Err>
    where
        GetRef: FnMut(&T) -> &Tensor<S, f32, D>,
        GetMut: FnMut(&mut T) -> &mut Tensor<S, f32, D>,
    {
        if self.state.found.is_some() {
            return Ok(None);
        }
        let index = self.state.count;
        self.state.count += 1;
        if index != self.state.target {
            return Ok(None);
        }
        self.state.path.push(name);
        let path = self.state.path.as_str().to_string();
        self.state.path.pop();
        let tensor = get_muts(self.module);
        let result = match self.state.pair.take() {
            Some(pair) => pair.meet(&path, tensor, opts.do_gradient_update),
            None => Ok(()),
        };
        self.state.found = Some(path);
        result.map(|()| None)
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

    fn visit_fields<F: dfdx::nn::ModuleFields<T, f32, D>>(
        &mut self,
        fields: F,
        _builder: impl FnOnce(F::Output<f32, D>) -> T::To<f32, D>,
    ) -> Result<Option<T::To<f32, D>>, Self::Err> {
        fields.visit_fields(self)?;
        Ok(None)
    }
}
