//! The state of a model's FP8 recipe ([`Fp8Scaling`]): for every FP8 linear layer, the amax
//! histories of its three tensor roles (input activations, weights, output gradients) and the
//! amax of the step in progress; how a forward pass finds its layers' state; and the state as
//! a checkpoint stores it ([`Fp8ScalingState`]).
//!
//! A step's amaxes are *pending* until the step ends: the scales of a step come only from
//! earlier steps' amaxes (Transformer Engine's delayed scaling), so that every micro-batch of a
//! step, and every rank of a data-parallel step, quantises with the same scales. The step
//! commits them ([`Fp8Scaling::commit`]); under data parallelism they are first reduced across
//! ranks (max) by the data-parallel all-reduce stage ([`Fp8Scaling::set_reduced_amaxes`]).

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::Fp8Error;
use super::format::Fp8Element;
use super::scaling::scale_from_amax;

/// The tensor roles of a linear layer's products, each with its own amax history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The layer's input activations (forward, E4M3).
    Input,
    /// The layer's weights (forward, E4M3).
    Weight,
    /// The gradient of the layer's output (backward, E5M2 in the hybrid recipe).
    OutputGrad,
}

impl Role {
    /// The three roles, in the order a checkpoint stores them.
    pub const ALL: [Role; 3] = [Role::Input, Role::Weight, Role::OutputGrad];

    fn index(self) -> usize {
        match self {
            Role::Input => 0,
            Role::Weight => 1,
            Role::OutputGrad => 2,
        }
    }
}

/// One role's history: a ring of `len` amaxes and the amax of the step in progress.
#[derive(Debug, Clone, PartialEq)]
struct History {
    ring: Vec<f32>,
    next: usize,
    pending: f32,
}

impl History {
    fn new(len: usize) -> Self {
        History {
            ring: vec![0.0; len],
            next: 0,
            pending: 0.0,
        }
    }

    fn amax(&self) -> f32 {
        self.ring.iter().fold(0.0f32, |m, &a| m.max(a))
    }

    fn commit(&mut self) {
        if !self.ring.is_empty() {
            self.ring[self.next] = self.pending;
            self.next = (self.next + 1) % self.ring.len();
        }
        self.pending = 0.0;
    }

    /// Oldest first, then the pending amax.
    fn values(&self) -> impl Iterator<Item = f32> + '_ {
        let n = self.ring.len();
        (0..n)
            .map(move |i| self.ring[(self.next + i) % n])
            .chain(std::iter::once(self.pending))
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The history length of the recipe that made the layers (set by the first forward, or by
    /// a checkpoint).
    history_len: Option<usize>,
    layers: Vec<[History; 3]>,
    /// Whether the pending amaxes were reduced across ranks since they were last observed.
    reduced: bool,
}

/// The FP8 recipe state of a model: per FP8 linear layer (in the order the forward pass runs
/// them), the amax history of each [`Role`] and the amax of the step in progress.
///
/// A model's working copy holds one ([`WorkingCopy::fp8_scaling`](crate::master::WorkingCopy::fp8_scaling));
/// its training forward passes record into it, the step commits it, checkpoints save it. A
/// clone is a separate copy of the state.
#[derive(Debug, Default)]
pub struct Fp8Scaling(Arc<Mutex<Inner>>);

impl Clone for Fp8Scaling {
    fn clone(&self) -> Self {
        let inner = self.lock();
        Fp8Scaling(Arc::new(Mutex::new(Inner {
            history_len: inner.history_len,
            layers: inner.layers.clone(),
            reduced: inner.reduced,
        })))
    }
}

/// The state of an [`Fp8Scaling`] as values, for checkpoints: `layers × 3 × (history_len + 1)`
/// FP32 amaxes, per layer and [`Role`] the history oldest first and then the amax of the step
/// in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8ScalingState {
    /// The history length of each role.
    pub history_len: usize,
    /// The number of FP8 linear layers.
    pub layers: usize,
    /// The amaxes, `layers × 3 × (history_len + 1)`, row-major.
    pub values: Vec<f32>,
}

impl Fp8Scaling {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while the state was held leaves plain numbers behind: still usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of FP8 linear layers with state (0 before the first forward pass).
    pub fn layers(&self) -> usize {
        self.lock().layers.len()
    }

    /// The history length of each role, once a forward pass or a checkpoint has set it.
    pub fn history_len(&self) -> Option<usize> {
        self.lock().history_len
    }

    /// The largest amax in `layer`'s history of `role` (0 while it is fresh).
    pub fn history_amax(&self, layer: usize, role: Role) -> Option<f32> {
        self.lock()
            .layers
            .get(layer)
            .map(|l| l[role.index()].amax())
    }

    /// The state as values, for a checkpoint.
    pub fn state(&self) -> Fp8ScalingState {
        let inner = self.lock();
        let history_len = inner.history_len.unwrap_or(0);
        let values = inner
            .layers
            .iter()
            .flat_map(|l| l.iter().flat_map(History::values))
            .collect();
        Fp8ScalingState {
            history_len,
            layers: inner.layers.len(),
            values,
        }
    }

    /// Puts a checkpoint's state back, checked: every amax finite and not negative, the
    /// values as many as the shape says.
    ///
    /// # Errors
    /// [`Fp8Error::DamagedState`] otherwise (nothing is changed).
    pub fn restore(&self, state: &Fp8ScalingState) -> Result<(), Fp8Error> {
        let per_role = state.history_len + 1;
        let expected = state
            .layers
            .checked_mul(3 * per_role)
            .ok_or_else(|| Fp8Error::DamagedState("its shape overflows usize".into()))?;
        if state.values.len() != expected {
            return Err(Fp8Error::DamagedState(format!(
                "{} amaxes for {} layers of 3 histories of {} (+1 pending): {expected} expected",
                state.values.len(),
                state.layers,
                state.history_len
            )));
        }
        if let Some((i, v)) = state
            .values
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(Fp8Error::DamagedState(format!(
                "amax {i} is {v}: an amax is a finite magnitude"
            )));
        }
        let layers = state
            .values
            .chunks(3 * per_role)
            .map(|layer| {
                let role = |r: usize| {
                    let v = &layer[r * per_role..(r + 1) * per_role];
                    History {
                        ring: v[..state.history_len].to_vec(),
                        next: 0,
                        pending: v[state.history_len],
                    }
                };
                [role(0), role(1), role(2)]
            })
            .collect();
        let mut inner = self.lock();
        // A state saved before any forward pass has no layers: the recipe sets the length.
        inner.history_len = (state.layers > 0).then_some(state.history_len);
        inner.layers = layers;
        inner.reduced = false;
        Ok(())
    }

    /// The pending amaxes of every layer and role (`layers × 3`), for the reduction across
    /// ranks.
    pub fn pending_amaxes(&self) -> Vec<f32> {
        self.lock()
            .layers
            .iter()
            .flat_map(|l| l.iter().map(|h| h.pending))
            .collect()
    }

    /// Replaces the pending amaxes by their maximum across ranks (what
    /// [`Fp8Scaling::pending_amaxes`] gave on every rank, reduced with max), so that every rank
    /// commits the same history and computes the same scales.
    ///
    /// # Errors
    /// [`Fp8Error::DamagedState`] if the count differs from this state's or a value is not a
    /// finite magnitude.
    pub fn set_reduced_amaxes(&self, reduced: &[f32]) -> Result<(), Fp8Error> {
        let mut inner = self.lock();
        if reduced.len() != inner.layers.len() * 3 {
            return Err(Fp8Error::DamagedState(format!(
                "{} reduced amaxes for {} layers × 3 roles: the ranks' models differ",
                reduced.len(),
                inner.layers.len()
            )));
        }
        if let Some(v) = reduced.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
            return Err(Fp8Error::DamagedState(format!(
                "a reduced amax is {v}: an amax is a finite magnitude"
            )));
        }
        for (h, &a) in inner
            .layers
            .iter_mut()
            .flat_map(|l| l.iter_mut())
            .zip(reduced)
        {
            h.pending = a;
        }
        inner.reduced = true;
        Ok(())
    }

    /// Ends the step for the recipe: each role's pending amax enters its history (the oldest
    /// drops out) and the next step's scales come from the histories. `across_ranks`: the model
    /// trains data-parallel, and the pending amaxes must have been reduced across ranks first.
    ///
    /// # Errors
    /// [`Fp8Error::AmaxNotReduced`] if `across_ranks` and they were not (nothing is committed).
    pub fn commit(&self, across_ranks: bool) -> Result<(), Fp8Error> {
        let mut inner = self.lock();
        if across_ranks && !inner.reduced && !inner.layers.is_empty() {
            return Err(Fp8Error::AmaxNotReduced);
        }
        inner
            .layers
            .iter_mut()
            .flat_map(|l| l.iter_mut())
            .for_each(History::commit);
        inner.reduced = false;
        Ok(())
    }

    /// Makes this state the one the FP8 linear layers of forward passes on this thread find,
    /// in order, until the guard drops.
    pub fn enter(&self) -> ForwardScope {
        CONTEXT.with(|c| {
            c.borrow_mut().push(Context {
                scaling: Fp8Scaling(Arc::clone(&self.0)),
                cursor: 0,
            })
        });
        ForwardScope { _private: () }
    }
}

struct Context {
    scaling: Fp8Scaling,
    cursor: usize,
}

thread_local! {
    static CONTEXT: RefCell<Vec<Context>> = const { RefCell::new(Vec::new()) };
}

/// While it lives, this thread's forward passes record into the [`Fp8Scaling`] that made it
/// ([`Fp8Scaling::enter`]).
#[derive(Debug)]
#[must_use = "the state is found only while the scope lives"]
pub struct ForwardScope {
    _private: (),
}

impl Drop for ForwardScope {
    fn drop(&mut self) {
        CONTEXT.with(|c| {
            c.borrow_mut().pop();
        });
    }
}

/// One FP8 linear layer's state, as its forward pass found it: reads its roles' scales and
/// records their amaxes.
#[derive(Debug)]
pub struct LayerScaling {
    scaling: Fp8Scaling,
    index: usize,
}

impl LayerScaling {
    /// The next FP8 linear layer's state in the current forward pass on this thread, made
    /// fresh (histories of zeros) on its first pass; `None` outside
    /// [`Fp8Scaling::enter`] (a working model run directly), where each tensor is scaled by
    /// its own amax.
    pub fn next_in_forward(history_len: usize) -> Option<LayerScaling> {
        CONTEXT.with(|c| {
            let mut stack = c.borrow_mut();
            let top = stack.last_mut()?;
            let index = top.cursor;
            top.cursor += 1;
            let mut inner = top.scaling.lock();
            let len = *inner.history_len.get_or_insert(history_len);
            while inner.layers.len() <= index {
                inner
                    .layers
                    .push([History::new(len), History::new(len), History::new(len)]);
            }
            drop(inner);
            Some(LayerScaling {
                scaling: Fp8Scaling(Arc::clone(&top.scaling.0)),
                index,
            })
        })
    }

    /// The scale of `role` in format `F` with `margin` from its history, or `None` while the
    /// history holds no amax above zero (the first step: there is nothing earlier to go by,
    /// and the tensor is scaled by its own amax).
    pub fn scale<F: Fp8Element>(&self, role: Role, margin: u32) -> Option<f32> {
        let amax = self.scaling.lock().layers[self.index][role.index()].amax();
        if amax > 0.0 {
            scale_from_amax(F::MAX, amax, margin).ok()
        } else {
            None
        }
    }

    /// Records a finite amax of `role` for this step (the largest of the step's micro-batches
    /// is kept); a non-finite one is not recorded, so that an overflowing step does not poison
    /// the next scales.
    pub fn observe(&self, role: Role, amax: f32) {
        if amax.is_finite() {
            let mut inner = self.scaling.lock();
            let h = &mut inner.layers[self.index][role.index()];
            h.pending = h.pending.max(amax.abs());
            inner.reduced = false;
        }
    }
}
