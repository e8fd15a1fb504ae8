//! Procedural macros for [typed-amp](https://docs.rs/typed-amp): the `#[amp(policy = ...)]`
//! attribute. Its documentation, with the policy table, is on `typed_amp::amp`.
//!
//! The entry point only dispatches: `attr` parses the attribute, `ast` the struct and its
//! layers, `valid` turns both into a checked recipe, and `expand` generates code. Every error
//! is a `syn::Error` on the offending tokens.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;
use syn::parse::Parser;

/// Declares a model whose layers get their precision from a mixed-precision policy.
///
/// ```ignore
/// #[amp(policy = "O2")]
/// struct Mlp {
///     fc1: Linear<784, 512>,
///     act: ReLU,
///     fc2: Linear<512, 10>,
/// }
/// ```
///
/// See `typed_amp::amp` for the policies, properties and what is generated.
#[proc_macro_attribute]
pub fn amp(args: TokenStream, item: TokenStream) -> TokenStream {
    amp_impl(args.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn amp_impl(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    let mut parsed = attr::AmpArgs::default();
    syn::meta::parser(|meta| parsed.parse_meta(meta)).parse2(args)?;
    let model = ast::parse_model(syn::parse2(item)?)?;
    let recipe = valid::recipe(&parsed, &model)?;
    Ok(expand::expand(&recipe, &model))
}

#[cfg(test)]
mod tests {
    use super::amp_impl;
    use quote::quote;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        amp_impl(args, item).unwrap().to_string()
    }

    #[test]
    fn o2_keeps_norms_fp32_and_pairs_master_weights() {
        let out = expand(
            quote!(policy = "O2"),
            quote!(
                pub struct Cnn {
                    conv: Conv2D<1, 4, 3>,
                    bn: BatchNorm2D<4>,
                    fc: Linear<4, 2>,
                }
            ),
        );
        assert!(out.contains("pub struct CnnLayers < L0 , L1 , L2 >"));
        // Conv and linear are converted to FP16 in the working model; batch norm is not.
        assert!(out.contains(
            "pub type CnnWorking < D > = CnnLayers < :: typed_amp :: amp :: Converted < :: typed_amp :: amp :: Built < Conv2D < 1 , 4 , 3 > , f32 , D > , < :: typed_amp :: F16 as :: typed_amp :: Precision > :: Elem , D > , :: typed_amp :: amp :: Built < BatchNorm2D < 4 > , f32 , D > , :: typed_amp :: amp :: Converted <"
        ), "{out}");
        assert!(out.contains("type Weights = :: typed_amp :: MasterWeights < CnnMaster < D > , CnnWorking < D > , D , :: typed_amp :: F16 >"));
        // Input cast to FP16 at entry; batch norm cast to FP32 and back.
        assert!(out.contains("CastTo < :: typed_amp :: F16 >"));
        assert!(out.contains("CastTo < :: typed_amp :: F32 >"));
    }

    #[test]
    fn o1_autocasts_matmuls_on_the_fp32_model() {
        let out = expand(
            quote!(policy = "O1"),
            quote!(
                struct Mlp {
                    fc: Linear<4, 2>,
                    sm: Softmax,
                }
            ),
        );
        assert!(out.contains("type MlpWorking < D > = MlpMaster < D >"));
        assert!(out.contains("AutocastForward"));
        assert!(out.contains("type Weights = :: typed_amp :: Fp32Weights < MlpMaster < D > , D , :: typed_amp :: F16 >"));
    }

    #[test]
    fn o3_opt_in_updates_fp16_weights() {
        let out = expand(
            quote!(policy = "O3", allow_fp16_updates),
            quote!(
                struct Mlp {
                    fc: Linear<4, 2>,
                }
            ),
        );
        assert!(out.contains("type Weights = :: typed_amp :: SinglePrecision < MlpWorking < D > , < :: typed_amp :: F16 as :: typed_amp :: Precision > :: Elem , D >"), "{out}");
        assert!(out.contains("type MlpWorking < D > = MlpLayers <"), "{out}");
        assert!(
            out.contains("< :: typed_amp :: F16 as :: typed_amp :: Precision > :: Elem , D > >"),
            "{out}"
        );
    }

    #[test]
    fn errors_point_at_the_offending_tokens() {
        let err = amp_impl(
            quote!(policy = "O9"),
            quote!(
                struct Mlp {
                    fc: Linear<4, 2>,
                }
            ),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown policy `O9`: expected \"O0\", \"O1\", \"O2\" or \"O3\""
        );
        let err = amp_impl(
            quote!(policy = "O2"),
            quote!(
                struct Mlp {
                    n: usize,
                }
            ),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("`usize` is not a layer"));
    }
}
