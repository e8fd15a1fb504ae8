//! What a walk over parameters calls ([`ParamVisitor`]), how it hands each parameter over
//! ([`Shared`] or [`Mutable`]), and the dotted path it keeps ([`ParamPath`]).

use dfdx::prelude::{Shape, Tensor};

use crate::device::{AmpDevice, Kernels};
use crate::precision::AmpElem;

/// Visits parameters: by shared reference (`A` = [`Shared`], the default, for
/// [`Parameters::visit_params`](super::Parameters::visit_params)) or by mutable reference
/// (`A` = [`Mutable`], for [`Parameters::visit_params_mut`](super::Parameters::visit_params_mut)).
///
/// `param` is `&Tensor<S, E, D>` for a [`Shared`] visitor and `&mut Tensor<S, E, D>` for a
/// [`Mutable`] one; an implementation writes the reference type itself:
///
/// ```rust
/// # use typed_amp::prelude::*;
/// use typed_amp::device::{AmpDevice, Kernels};
/// use typed_amp::params::{Mutable, ParamVisitor, Parameters};
/// use typed_amp::precision::AmpElem;
///
/// /// Counts elements (reads).
/// struct Count(usize);
/// impl<D: AmpDevice> ParamVisitor<D> for Count {
///     type Error = std::convert::Infallible;
///     fn visit<S: Shape, E: AmpElem>(
///         &mut self,
///         _path: &str,
///         param: &Tensor<S, E, D>,
///         _trainable: bool,
///     ) -> Result<(), Self::Error>
///     where
///         D: Kernels<E>,
///     {
///         self.0 += param.shape().num_elements();
///         Ok(())
///     }
/// }
///
/// /// Zeroes every trainable parameter (writes).
/// struct Zero;
/// impl<D: AmpDevice> ParamVisitor<D, Mutable> for Zero {
///     type Error = D::Err;
///     fn visit<S: Shape, E: AmpElem>(
///         &mut self,
///         _path: &str,
///         param: &mut Tensor<S, E, D>,
///         trainable: bool,
///     ) -> Result<(), Self::Error>
///     where
///         D: Kernels<E>,
///     {
///         if trainable {
///             param.try_fill_with_zeros()?;
///         }
///         Ok(())
///     }
/// }
///
/// let dev = Cpu::default();
/// let mut layer = dev.build_module::<Linear<3, 2>, f32>();
/// let mut count = Count(0);
/// Parameters::<Cpu>::visit_params(&layer, &mut count).unwrap();
/// assert_eq!(count.0, 8);
/// Parameters::<Cpu>::visit_params_mut(&mut layer, &mut Zero).unwrap();
/// assert_eq!(layer.bias.array(), [0.0; 2]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not visit parameters of `{D}` by this kind of reference (`{A}`)",
    note = "`visit_params` takes a `ParamVisitor<D>` (each parameter by `&Tensor`), `visit_params_mut` a `ParamVisitor<D, typed_amp::params::Mutable>` (each by `&mut Tensor`)"
)]
pub trait ParamVisitor<D: AmpDevice, A: Access = Shared> {
    /// The error a visit can return.
    type Error;

    /// Called once per parameter or buffer, in visiting order, with its dotted path. `param`
    /// is `&Tensor<S, E, D>` ([`Shared`]) or `&mut Tensor<S, E, D>` ([`Mutable`]).
    /// `trainable` is false for buffers such as batch norm's running statistics, which no
    /// optimizer updates.
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: A::Ref<'_, Tensor<S, E, D>>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        D: Kernels<E>;
}

/// A walk that hands each parameter over by shared reference (`&Tensor`): the default mode of
/// [`ParamVisitor`].
#[derive(Debug, Clone, Copy)]
pub struct Shared;

/// A walk that hands each parameter over by mutable reference (`&mut Tensor`):
/// `ParamVisitor<D, Mutable>`, for [`Parameters::visit_params_mut`](super::Parameters::visit_params_mut).
#[derive(Debug, Clone, Copy)]
pub struct Mutable;

/// How a walk hands over what it visits: `&T` ([`Shared`]) or `&mut T` ([`Mutable`]). One
/// walker serves both, by reborrowing and projecting the reference it holds.
///
/// Sealed (implemented by those two only). Users pick a mode; the trait is the walk's
/// machinery, hidden from the documentation.
#[doc(hidden)]
pub trait Access: sealed::Sealed {
    /// The reference a walk in this mode holds: `&'a T` or `&'a mut T`.
    type Ref<'a, T: ?Sized + 'a>;

    /// A shorter-lived copy of `r`, so that a walk can hand it on and keep it.
    fn reborrow<'a, T: ?Sized>(r: &'a mut Self::Ref<'_, T>) -> Self::Ref<'a, T>;

    /// The part of `*r` that `shared` (this mode [`Shared`]) or `exclusive` ([`Mutable`])
    /// selects: a field of a module, by the accessor of its mode.
    fn project<'a, T, U>(
        r: Self::Ref<'a, T>,
        shared: impl FnOnce(&T) -> &U,
        exclusive: impl FnOnce(&mut T) -> &mut U,
    ) -> Self::Ref<'a, U>
    where
        T: ?Sized + 'a,
        U: ?Sized + 'a;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Shared {}
    impl Sealed for super::Mutable {}
}

impl Access for Shared {
    type Ref<'a, T: ?Sized + 'a> = &'a T;

    fn reborrow<'a, T: ?Sized>(r: &'a mut &T) -> &'a T {
        r
    }

    fn project<'a, T, U>(
        r: &'a T,
        shared: impl FnOnce(&T) -> &U,
        _exclusive: impl FnOnce(&mut T) -> &mut U,
    ) -> &'a U
    where
        T: ?Sized + 'a,
        U: ?Sized + 'a,
    {
        shared(r)
    }
}

impl Access for Mutable {
    type Ref<'a, T: ?Sized + 'a> = &'a mut T;

    fn reborrow<'a, T: ?Sized>(r: &'a mut &mut T) -> &'a mut T {
        r
    }

    fn project<'a, T, U>(
        r: &'a mut T,
        _shared: impl FnOnce(&T) -> &U,
        exclusive: impl FnOnce(&mut T) -> &mut U,
    ) -> &'a mut U
    where
        T: ?Sized + 'a,
        U: ?Sized + 'a,
    {
        exclusive(r)
    }
}

/// A dotted parameter path under construction (`"block.0.weight"`).
#[derive(Debug, Default, Clone)]
pub struct ParamPath {
    path: String,
    marks: Vec<usize>,
}

impl ParamPath {
    /// Descends into `segment`.
    pub fn push(&mut self, segment: &str) {
        self.marks.push(self.path.len());
        if !self.path.is_empty() && !segment.is_empty() {
            self.path.push('.');
        }
        self.path.push_str(segment);
    }

    /// Returns to the parent of the last [`ParamPath::push`].
    pub fn pop(&mut self) {
        if let Some(mark) = self.marks.pop() {
            self.path.truncate(mark);
        }
    }

    /// The path so far.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// Runs `f` one segment further down.
    pub fn within<R>(&mut self, segment: &str, f: impl FnOnce(&mut Self) -> R) -> R {
        self.push(segment);
        let result = f(self);
        self.pop();
        result
    }
}
