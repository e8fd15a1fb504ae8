//! [`AmpTape`]: the tape typed-amp's ops record onto. [`MixedTape`] records (training);
//! dfdx's [`NoneTape`] records nothing (inference), so the same forward code serves both.

use dfdx::prelude::{Merge, NoneTape, Tape};
use dfdx::tensor::UniqueId;

use super::grads::MixedGradients;
use super::mixed::MixedTape;
use super::probe::ActivationRecord;
use crate::device::AmpDevice;

macro_rules! define_amp_tape {
    ($([$marker:ident, $elem:ty, $variant:ident, $name:literal, $st:ident, $index:literal])*) => {
        /// A tape that a cast can record onto: [`MixedTape`] records, [`NoneTape`] (inference)
        /// does not. It is a dfdx `Tape` for every precision of
        /// [`with_precisions!`](crate::with_precisions).
        #[diagnostic::on_unimplemented(
            message = "precision casts record onto a `MixedTape` (or nothing), not onto `{Self}`",
            note = "trace mixed-precision graphs with `x.traced_mixed(grads)`: dfdx's `OwnedTape` holds a single precision"
        )]
        pub trait AmpTape<D: AmpDevice>: Default + Merge<Self> + 'static $(+ Tape<$elem, D>)* {
            /// Records an op that reads and writes gradients of several precisions.
            fn record_mixed<F>(&mut self, op: F)
            where
                F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>;

            /// Whether layer probes record on this tape (see [`MixedGradients::watch_layers`]).
            fn watching(&self) -> bool;

            /// Marks `to`'s gradient as read by nobody if `from`'s is (a cast of the model's
            /// input), so that the first layer skips computing it.
            fn inherit_unwanted(&mut self, from: UniqueId, to: UniqueId);

            /// Records a layer's activation magnitude.
            fn record_activation(&mut self, record: ActivationRecord);

            /// Offers the op just recorded for fusion with an activation applied to its output
            /// `output` next (see [`crate::ops::relu`]); `slot` is the op's own record of it.
            /// Recording any other op withdraws the offer.
            fn offer_activation(&mut self, output: UniqueId, slot: std::rc::Rc<dyn std::any::Any>);

            /// Takes the offer of the op whose output is `output`, if it is the last op recorded.
            fn take_activation(&mut self, output: UniqueId) -> Option<std::rc::Rc<dyn std::any::Any>>;
        }
    };
}

crate::with_precisions!(define_amp_tape);

impl<D: AmpDevice> AmpTape<D> for NoneTape {
    fn record_mixed<F>(&mut self, _op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
    }

    fn watching(&self) -> bool {
        false
    }

    fn inherit_unwanted(&mut self, _from: UniqueId, _to: UniqueId) {}

    fn record_activation(&mut self, _record: ActivationRecord) {}

    fn offer_activation(&mut self, _output: UniqueId, _slot: std::rc::Rc<dyn std::any::Any>) {}

    fn take_activation(&mut self, _output: UniqueId) -> Option<std::rc::Rc<dyn std::any::Any>> {
        None
    }
}

impl<D: AmpDevice> AmpTape<D> for MixedTape<D> {
    fn record_mixed<F>(&mut self, op: F)
    where
        F: 'static + FnOnce(&mut MixedGradients<D>) -> Result<(), D::Err>,
    {
        self.add_mixed_backward_op(op);
    }

    fn watching(&self) -> bool {
        MixedTape::watching(self)
    }

    fn inherit_unwanted(&mut self, from: UniqueId, to: UniqueId) {
        if self.is_unwanted(from) {
            self.mark_unwanted(to);
        }
    }

    fn record_activation(&mut self, record: ActivationRecord) {
        MixedTape::record_activation(self, record);
    }

    fn offer_activation(&mut self, output: UniqueId, slot: std::rc::Rc<dyn std::any::Any>) {
        MixedTape::offer_activation(self, output, slot);
    }

    fn take_activation(&mut self, output: UniqueId) -> Option<std::rc::Rc<dyn std::any::Any>> {
        MixedTape::take_activation(self, output)
    }
}
