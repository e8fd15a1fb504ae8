//! The FP8 formats as type parameters, their own list (`with_fp8_formats!`, internal to the crate), and the rule
//! that the forward pass's operands are E4M3.

pub use typed_amp_kernels::convert::{Fp8Format, E4M3, E5M2};

/// Calls the macro `$m` with the list of FP8 formats, one bracketed entry per format:
/// `[element type, Fp8Kind variant, name]`. FP8's own list, apart from
/// [`with_precisions!`](crate::with_precisions): see the [module documentation](crate::fp8).
macro_rules! with_fp8_formats {
    ($m:ident) => {
        $m! {
            [E4M3, E4M3, "E4M3"]
            [E5M2, E5M2, "E5M2"]
        }
    };
}

macro_rules! define_fp8_kind {
    ($([$elem:ident, $variant:ident, $name:literal])*) => {
        /// The FP8 formats as a value (for messages and stored metadata).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Fp8Kind {
            $(
                #[doc = concat!("[`", stringify!($elem), "`].")]
                $variant,
            )*
        }

        impl Fp8Kind {
            /// Every FP8 format, in the list's order.
            pub const ALL: &'static [Fp8Kind] = &[$(Fp8Kind::$variant),*];

            /// The format's name (`"E4M3"`, `"E5M2"`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Fp8Kind::$variant => $name,)*
                }
            }

            /// The format's largest finite value, where quantisation saturates.
            pub fn max(self) -> f32 {
                match self {
                    $(Fp8Kind::$variant => <$elem as Fp8Format>::MAX,)*
                }
            }
        }

        $(
            impl Fp8Element for $elem {
                const KIND: Fp8Kind = Fp8Kind::$variant;
            }
        )*
    };
}

/// An FP8 format typed-amp quantises to: [`E4M3`] or [`E5M2`], with its [`Fp8Kind`].
#[doc(hidden)] // a bound of the FP8 types' parameters: users name `E4M3` or `E5M2`.
pub trait Fp8Element: Fp8Format {
    /// This format as a value.
    const KIND: Fp8Kind;
}

with_fp8_formats!(define_fp8_kind);

impl std::fmt::Display for Fp8Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rule: the operands of a forward-pass product are E4M3.
///
/// E4M3 keeps one more mantissa bit than E5M2 (relative spacing 2^-3 against 2^-2) over a
/// range (2^-9 to 448) that a scaled activation or weight fits; the FP8 recipes (Transformer
/// Engine's `HYBRID`, torchao's tensorwise and rowwise) use E4M3 for activations and weights
/// and keep E5M2, whose range is 2^-16 to 57,344, for output gradients in the backward pass,
/// where magnitudes spread wider.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an operand of a forward-pass FP8 product: activations and weights are E4M3",
    label = "an `{Self}` operand where E4M3 is required",
    note = "quantise activations and weights with `Fp8Tensor::<E4M3, _, _>` (rule `typed_amp::fp8::ForwardOperand`); E5M2 is the format of output gradients, multiplied in the backward pass by `fp8::gradient_product`"
)]
pub trait ForwardOperand: Fp8Element {}

impl ForwardOperand for E4M3 {}
