//! Where a training step's time goes: an opt-in, per-thread breakdown by phase.
//!
//! The kernels (matrix products here, casts, unscaling and the optimizer in typed-amp, the
//! convolution in the vendored dfdx) open a [`scope`] for their phase. On the one thread that
//! called [`start`], each scope adds its *exclusive* wall time (its own time minus that of the
//! scopes opened inside it) to its phase; on every other thread, and on that thread after
//! [`stop`], a scope costs one thread-local read and records nothing. Work a scope hands to
//! rayon's pool is inside the scope's wall time, because the recording thread waits for it.
//!
//! Matrix products are split into forward and backward by the pass the recording thread is in
//! ([`set_backward`], which typed-amp's tape sets while it runs backward). The phases are
//! mutually exclusive, so with a scope around the whole step their sum is the step's wall time,
//! and what no kernel claimed is [`Phase::Other`] (elementwise ops, norms, losses, allocation).
//!
//! This module is a leaf: it depends on nothing else in the crate, so every crate of the
//! workspace (dfdx included) can report to it.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// A phase of the training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Matrix products and convolutions of the forward pass.
    ForwardProducts,
    /// Matrix products and convolutions of the backward pass.
    BackwardProducts,
    /// Fused attention, forward and backward (its products, softmax and bookkeeping together).
    Attention,
    /// Elementwise ops, norms, pooling, losses: whatever no other phase claims inside a pass.
    Other,
    /// Conversions between precisions (casts and their backward, batch conversions).
    Casts,
    /// Unscaling gradients and checking them for inf and NaN.
    UnscaleCheck,
    /// The optimizer's update and the refresh of the 16-bit working copy.
    OptimizerRefresh,
}

impl Phase {
    /// Every phase, in report order.
    pub const ALL: [Phase; 7] = [
        Phase::ForwardProducts,
        Phase::BackwardProducts,
        Phase::Attention,
        Phase::Other,
        Phase::Casts,
        Phase::UnscaleCheck,
        Phase::OptimizerRefresh,
    ];

    /// A short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::ForwardProducts => "forward products",
            Phase::BackwardProducts => "backward products",
            Phase::Attention => "attention",
            Phase::Other => "norms/elementwise",
            Phase::Casts => "casts",
            Phase::UnscaleCheck => "unscale + check",
            Phase::OptimizerRefresh => "optimizer + refresh",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The phases a [`scope`] can be opened for: products are attributed to the forward or the
/// backward pass by [`set_backward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A matrix product or convolution.
    Products,
    /// A fused attention pass.
    Attention,
    /// A precision conversion.
    Casts,
    /// Unscaling and the non-finite check.
    UnscaleCheck,
    /// The optimizer and the working-copy refresh.
    OptimizerRefresh,
    /// Anything else (a whole pass, a whole step): the residual phase.
    Other,
}

/// One matrix product's shape as [`product_scope`] records it: `C (m × n) = A (m × k) · B (k ×
/// n)`, the strides of A, B and C as the caller gave them (elements), and whether the product
/// adds into C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProductShape {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// A's row and column strides.
    pub a: (isize, isize),
    /// B's row and column strides; (0, 0) for a B packed beforehand
    /// ([`gemm_packed_b`](crate::gemm_packed_b)).
    pub b: (isize, isize),
    /// C's row and column strides.
    pub c: (isize, isize),
    /// `C += A·B` rather than `C = A·B`.
    pub accumulate: bool,
}

impl ProductShape {
    /// The product's floating-point operations, `2·m·n·k`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// What the recording thread's products of one shape took: calls and exclusive time.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShapeTotal {
    /// Products of this shape.
    pub calls: u64,
    /// Their time on the recording thread (with the pool's help where they split).
    pub time: Duration,
}

struct Recorder {
    totals: [Duration; 7],
    /// Per open scope: its phase, the time its children took, and a product's shape.
    stack: Vec<(Phase, Duration, Option<ProductShape>)>,
    /// Products by shape (a sorted vector: a few dozen shapes a step).
    shapes: Vec<(ProductShape, ShapeTotal)>,
}

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    static BACKWARD: Cell<bool> = const { Cell::new(false) };
    static RECORDER: RefCell<Recorder> = const {
        RefCell::new(Recorder {
            totals: [Duration::ZERO; 7],
            stack: Vec::new(),
            shapes: Vec::new(),
        })
    };
}

/// Starts recording on the calling thread, from zero.
pub fn start() {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        r.totals = [Duration::ZERO; 7];
        r.stack.clear();
        r.shapes.clear();
    });
    RECORDING.with(|c| c.set(true));
}

/// Stops recording on the calling thread and returns the time per phase, in
/// [`Phase::ALL`]'s order.
pub fn stop() -> [(Phase, Duration); 7] {
    RECORDING.with(|c| c.set(false));
    let totals = RECORDER.with(|r| r.borrow().totals);
    Phase::ALL.map(|p| (p, totals[p.index()]))
}

/// The products the calling thread recorded since [`start`], by shape, the longest total
/// first. Products that run on other threads (attention's per-head products on the pool's
/// other workers) are not among them.
pub fn products_by_shape() -> Vec<(ProductShape, ShapeTotal)> {
    let mut v = RECORDER.with(|r| r.borrow().shapes.clone());
    v.sort_by_key(|x| std::cmp::Reverse(x.1.time));
    v
}

/// Whether the calling thread records.
pub fn recording() -> bool {
    RECORDING.with(Cell::get)
}

/// Marks the calling thread as running a backward pass (products then count as backward
/// products) or not. Returns the previous value.
pub fn set_backward(on: bool) -> bool {
    BACKWARD.with(|c| c.replace(on))
}

/// An open scope; its time is recorded when it is dropped.
#[must_use = "a scope records the time until it is dropped"]
pub struct Scope {
    start: Option<Instant>,
}

/// Opens a scope of kind `kind` on the calling thread (a no-op unless it records).
#[inline]
pub fn scope(kind: Kind) -> Scope {
    if !recording() {
        return Scope { start: None };
    }
    open(kind, None)
}

/// [`scope`] for one matrix product, whose time is also recorded by its shape
/// ([`products_by_shape`]).
#[inline]
pub fn product_scope(shape: impl FnOnce() -> ProductShape) -> Scope {
    if !recording() {
        return Scope { start: None };
    }
    open(Kind::Products, Some(shape()))
}

/// Opens a recording scope (the caller has checked that this thread records).
fn open(kind: Kind, shape: Option<ProductShape>) -> Scope {
    let phase = match kind {
        Kind::Products if BACKWARD.with(Cell::get) => Phase::BackwardProducts,
        Kind::Products => Phase::ForwardProducts,
        Kind::Attention => Phase::Attention,
        Kind::Casts => Phase::Casts,
        Kind::UnscaleCheck => Phase::UnscaleCheck,
        Kind::OptimizerRefresh => Phase::OptimizerRefresh,
        Kind::Other => Phase::Other,
    };
    RECORDER.with(|r| r.borrow_mut().stack.push((phase, Duration::ZERO, shape)));
    Scope {
        start: Some(Instant::now()),
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let Some(start) = self.start else { return };
        let elapsed = start.elapsed();
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            let Some((phase, children, shape)) = r.stack.pop() else {
                return;
            };
            let own = elapsed.saturating_sub(children);
            r.totals[phase.index()] += own;
            if let Some(shape) = shape {
                let at = match r.shapes.binary_search_by(|(s, _)| s.cmp(&shape)) {
                    Ok(at) => at,
                    Err(at) => {
                        r.shapes.insert(at, (shape, ShapeTotal::default()));
                        at
                    }
                };
                let total = &mut r.shapes[at].1;
                total.calls += 1;
                total.time += own;
            }
            if let Some(parent) = r.stack.last_mut() {
                parent.1 += elapsed;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {}
    }

    #[test]
    fn nested_scopes_record_exclusive_time_and_other_threads_nothing() {
        start();
        let wall = Instant::now();
        {
            let _step = scope(Kind::Other);
            spin(Duration::from_millis(4));
            {
                let _p = scope(Kind::Products);
                spin(Duration::from_millis(6));
            }
            set_backward(true);
            {
                let _p = scope(Kind::Products);
                spin(Duration::from_millis(3));
            }
            set_backward(false);
            std::thread::spawn(|| {
                let _c = scope(Kind::Casts);
                spin(Duration::from_millis(2));
            })
            .join()
            .unwrap();
        }
        let wall = wall.elapsed().as_secs_f64() * 1e3;
        let t = stop();
        let ms = |p: Phase| t[p.index()].1.as_secs_f64() * 1e3;
        assert!(ms(Phase::ForwardProducts) >= 6.0);
        assert!(ms(Phase::BackwardProducts) >= 3.0);
        // The step's own time excludes its children's but includes the other thread's wait.
        assert!(ms(Phase::Other) >= 6.0);
        let recorded: f64 = Phase::ALL.iter().map(|&p| ms(p)).sum();
        assert!(
            recorded <= wall + 1e-6,
            "{recorded} ms recorded in {wall} ms"
        );
        assert_eq!(ms(Phase::Casts), 0.0);
        let _after = scope(Kind::Casts);
        drop(_after);
        assert_eq!(stop()[Phase::Casts.index()].1, Duration::ZERO);
    }

    /// Products are also recorded by shape: calls counted, each its exclusive time (a product
    /// inside a product's scope leaves the outer one only its own), other threads' nothing.
    #[test]
    fn products_are_recorded_by_shape() {
        let shape = |m| ProductShape {
            m,
            n: 3,
            k: 5,
            a: (5, 1),
            b: (1, 5),
            c: (3, 1),
            accumulate: false,
        };
        start();
        let wall = Instant::now();
        for _ in 0..2 {
            let _p = product_scope(|| shape(2));
            spin(Duration::from_millis(2));
            let _inner = product_scope(|| shape(7));
            spin(Duration::from_millis(3));
        }
        std::thread::spawn(move || {
            let _p = product_scope(|| shape(9));
        })
        .join()
        .unwrap();
        let wall = wall.elapsed();
        let by_shape = products_by_shape();
        stop();
        assert_eq!(by_shape.len(), 2, "{by_shape:?}");
        assert!(by_shape[0].1.time >= by_shape[1].1.time, "longest first");
        let of = |m| by_shape.iter().find(|(s, _)| s.m == m).unwrap().1;
        let (inner, outer) = (of(7), of(2));
        assert_eq!((inner.calls, outer.calls), (2, 2));
        assert!(inner.time >= Duration::from_millis(6));
        assert!(outer.time >= Duration::from_millis(4));
        // Exclusive: had the outer scope kept its inner product's time, the two would sum to
        // more than the wall time.
        assert!(
            inner.time + outer.time <= wall,
            "{inner:?} {outer:?} in {wall:?}"
        );
        assert_eq!(shape(2).flops(), 60.0);
        // Nothing is recorded once stopped (what was recorded stays readable until `start`).
        drop(product_scope(|| shape(2)));
        assert_eq!(
            products_by_shape()
                .iter()
                .find(|(s, _)| s.m == 2)
                .unwrap()
                .1
                .calls,
            2
        );
        start();
        assert!(products_by_shape().is_empty());
        stop();
    }
}
