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

struct Recorder {
    totals: [Duration; 7],
    /// Per open scope: its phase and the time its children took.
    stack: Vec<(Phase, Duration)>,
}

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    static BACKWARD: Cell<bool> = const { Cell::new(false) };
    static RECORDER: RefCell<Recorder> = const {
        RefCell::new(Recorder { totals: [Duration::ZERO; 7], stack: Vec::new() })
    };
}

/// Starts recording on the calling thread, from zero.
pub fn start() {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        r.totals = [Duration::ZERO; 7];
        r.stack.clear();
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
    let phase = match kind {
        Kind::Products if BACKWARD.with(Cell::get) => Phase::BackwardProducts,
        Kind::Products => Phase::ForwardProducts,
        Kind::Attention => Phase::Attention,
        Kind::Casts => Phase::Casts,
        Kind::UnscaleCheck => Phase::UnscaleCheck,
        Kind::OptimizerRefresh => Phase::OptimizerRefresh,
        Kind::Other => Phase::Other,
    };
    RECORDER.with(|r| r.borrow_mut().stack.push((phase, Duration::ZERO)));
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
            let Some((phase, children)) = r.stack.pop() else {
                return;
            };
            r.totals[phase.index()] += elapsed.saturating_sub(children);
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
}
