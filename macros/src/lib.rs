//! Procedural macros for [typed-amp](https://docs.rs/typed-amp): the `#[amp(policy = ...)]`
//! attribute. Its documentation, with the policy table, is on `typed_amp::amp`.
//!
//! The entry point only dispatches: `attr` parses the attribute, `ast` the struct and its
//! layers, `valid` turns both into a checked recipe, and `expand` generates code. Every error
//! is a `syn::Error` on the offending tokens.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod ast;
mod attr;
mod expand;
mod forward;
mod layer_types;
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

    /// The policy table `#[amp]` writes for a recipe, as the expansion spells it.
    fn table(plans: [&str; 5]) -> String {
        let plans: Vec<String> = plans
            .iter()
            .map(|p| {
                let (plan, prec) = p.split_once(' ').unwrap();
                format!(":: typed_amp :: __private :: plan :: {plan} < :: typed_amp :: precision :: {prec} >")
            })
            .collect();
        format!(
            ":: typed_amp :: __private :: Table < {} >",
            plans.join(" , ")
        )
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
        // Rows: matmul, norm, FP32 ops, elementwise, neutral.
        let o2 = table(["In F16", "KeepFp32 F16", "In F32", "In F16", "Pass F16"]);
        // Each layer's working type comes from its `AmpLayer` row under that table.
        assert!(
            out.contains(&format!(
                "pub type CnnWorking < D > = CnnLayers < < :: typed_amp :: amp :: Built < Conv2D < 1 , 4 , 3 > , f32 , D > as :: typed_amp :: __private :: WorkingUnder < {o2} , D >> :: Working"
            )),
            "{out}"
        );
        assert!(out.contains("type Weights = :: typed_amp :: master :: MasterWeights < CnnMaster < D > , CnnWorking < D > , D , :: typed_amp :: precision :: F16 >"));
        // Input cast to FP16 at entry; each layer run by its row.
        assert!(out.contains(
            "AmpX : :: typed_amp :: amp :: CastTo < :: typed_amp :: precision :: F16 , Output = AmpY0"
        ));
        assert!(
            out.contains(&format!(
                "AmpY1 : :: typed_amp :: __private :: RunLayer < L1 , {o2} , Output = AmpY2"
            )),
            "{out}"
        );
        // Nested in another model, the layers keep this model's policy; the architecture
        // builds like a dfdx layer.
        assert!(out.contains("type Kind = :: typed_amp :: amp :: kind :: Nested < Cnn >"));
        assert!(out.contains("BuildOnDevice < D , f32 > for Cnn"));
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
        let o1 = table(["Autocast F16", "In F32", "In F32", "In F32", "Pass F32"]);
        assert!(out.contains(&o1), "{out}");
        assert!(out.contains("type Weights = :: typed_amp :: master :: Fp32Weights < MlpMaster < D > , D , :: typed_amp :: precision :: F16 >"));
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
        assert!(out.contains("type Weights = :: typed_amp :: master :: SinglePrecision < MlpWorking < D > , < :: typed_amp :: precision :: F16 as :: typed_amp :: precision :: Precision > :: Elem , D >"), "{out}");
        let o3 = table(["In F16", "In F16", "In F16", "In F16", "Pass F16"]);
        assert!(out.contains(&o3), "{out}");
    }

    #[test]
    fn pinned_fields_take_their_plan_whatever_their_row() {
        let out = expand(
            quote!(policy = "O2"),
            quote!(
                struct Mlp {
                    fc: Linear<4, 4>,
                    #[amp(fp32)]
                    head: MyHead,
                }
            ),
        );
        assert!(out.contains(
            "RunPlanned < L1 , :: typed_amp :: __private :: plan :: In < :: typed_amp :: precision :: F32 > , Output = AmpY2"
        ), "{out}");
        // Stored in FP32: the working layer is the master's clone, needing no `AmpLayer`.
        assert!(
            !out.contains(
                "Built < MyHead , f32 , D > as :: typed_amp :: __private :: WorkingUnder"
            ),
            "{out}"
        );
    }

    #[test]
    fn forward_bounds_grow_linearly_with_the_number_of_layers() {
        let forward_len = |layers: usize| {
            let fields = (0..layers).map(|i| {
                let name = quote::format_ident!("fc{i}");
                quote!(#name: Linear<8, 8>,)
            });
            let out = expand(
                quote!(policy = "O2", cast_model_outputs = "fp32"),
                quote!(struct Deep { #(#fields)* }),
            );
            let start = out.find("ModuleMut < AmpX >").unwrap();
            out[start..].len()
        };
        let (ten, forty) = (forward_len(10), forward_len(40));
        // Four times the layers: about four times the code (a quadratic expansion gives 16).
        let ratio = forty as f64 / ten as f64;
        println!("40 layers: {ratio:.2}× the forward code of 10");
        assert!(
            ratio < 4.5,
            "40 layers expand to {ratio:.1}× the code of 10"
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
