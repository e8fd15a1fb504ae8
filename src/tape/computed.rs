//! [`ComputedPrecisions`]: the precisions a backward pass computed gradients in, so that a step
//! decides whether it needs a loss scale by what the gradients went through, not by the
//! precision a model declares.

use crate::precision::{DType, PRECISIONS};

/// Which precisions backward passes computed gradients in since the gradients were last
/// unscaled (every pass of an accumulation window counts).
///
/// A backward op that writes a gradient of precision `E` creates or opens the store of `E`
/// ([`MixedGradients::store_mut`](super::MixedGradients::store_mut)), which notes `E` here while a
/// pass runs: an FP16 op anywhere on the tape (an FP16 layer, a `ToF16` layer inside an FP32
/// model, a `.to_f16()` cast) leaves FP16 noted, whatever the model declares.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ComputedPrecisions {
    /// Whether a backward pass is running (only its writes count).
    in_pass: bool,
    /// Per precision, in the order of [`DType::ALL`]: whether a pass wrote a gradient in it.
    seen: [bool; PRECISIONS],
}

impl ComputedPrecisions {
    /// A backward pass starts.
    pub(crate) fn begin_pass(&mut self) {
        self.in_pass = true;
    }

    /// The backward pass ended.
    pub(crate) fn end_pass(&mut self) {
        self.in_pass = false;
    }

    /// A gradient of the precision at `index` is being written (counts only inside a pass).
    pub(crate) fn note(&mut self, index: usize) {
        if self.in_pass {
            self.seen[index] = true;
        }
    }

    /// The gradients were unscaled: the next iteration's passes start from nothing.
    pub(crate) fn clear(&mut self) {
        self.seen = [false; PRECISIONS];
    }

    /// The first precision without FP32's exponent range (FP16) a pass computed gradients in,
    /// if any: such gradients need a loss scale.
    pub(crate) fn narrow_range(&self) -> Option<DType> {
        DType::ALL
            .iter()
            .zip(self.seen)
            .find(|(dtype, seen)| *seen && !dtype.has_full_range())
            .map(|(dtype, _)| *dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Indexed;

    #[test]
    fn only_writes_inside_a_pass_count_until_cleared() {
        let mut computed = ComputedPrecisions::default();
        computed.note(<half::f16 as Indexed>::INDEX);
        assert_eq!(computed.narrow_range(), None, "outside a pass");
        computed.begin_pass();
        computed.note(<half::bf16 as Indexed>::INDEX);
        computed.note(<f32 as Indexed>::INDEX);
        assert_eq!(
            computed.narrow_range(),
            None,
            "BF16 and FP32 have full range"
        );
        computed.note(<half::f16 as Indexed>::INDEX);
        computed.end_pass();
        assert_eq!(computed.narrow_range(), Some(DType::F16));
        computed.clear();
        assert_eq!(computed.narrow_range(), None);
    }
}
