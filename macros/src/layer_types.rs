//! Per layer, the tokens the expansion is made of: precision markers and elements, plans and
//! the policy table as types, a layer's master and working types, and the expressions that
//! build a master and make a working copy from it.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Index, Type};

use crate::ast::Layer;
use crate::attr::Prec;
use crate::valid::{plan_layer, Compute, LayerPlan, Recipe, Row};

/// The marker type of a precision.
pub(crate) fn marker(p: Prec) -> TokenStream {
    match p {
        Prec::F16 => quote!(::typed_amp::precision::F16),
        Prec::BF16 => quote!(::typed_amp::precision::BF16),
        Prec::F32 => quote!(::typed_amp::precision::F32),
    }
}

/// The element type of a precision.
pub(crate) fn elem(p: Prec) -> TokenStream {
    let marker = marker(p);
    quote!(<#marker as ::typed_amp::precision::Precision>::Elem)
}

/// A plan as a type (`typed_amp::amp::layer::plan`).
pub(crate) fn plan_ty(plan: LayerPlan) -> TokenStream {
    match plan.compute {
        Compute::In(p) => {
            let p = marker(p);
            quote!(::typed_amp::__private::plan::In<#p>)
        }
        Compute::Autocast(p) => {
            let p = marker(p);
            quote!(::typed_amp::__private::plan::Autocast<#p>)
        }
        Compute::Pass => {
            let p = marker(plan.storage);
            quote!(::typed_amp::__private::plan::Pass<#p>)
        }
        Compute::KeepFp32(p) => {
            let p = marker(p);
            quote!(::typed_amp::__private::plan::KeepFp32<#p>)
        }
        Compute::Fp8(p, recipe) => {
            let p = marker(p);
            let r = quote::format_ident!("{}", recipe.type_name());
            quote!(::typed_amp::__private::plan::Fp8<#p, ::typed_amp::fp8::#r>)
        }
    }
}

/// The recipe's policy table as a type: one plan per row.
pub(crate) fn policy_ty(recipe: &Recipe) -> TokenStream {
    let plans = Row::ALL
        .iter()
        .map(|row| plan_ty(plan_layer(recipe, *row, None)));
    quote!(::typed_amp::__private::Table<#(#plans),*>)
}

/// The FP32 master type of a layer.
pub(crate) fn master_ty(ty: &Type, layer: &Layer) -> TokenStream {
    match layer {
        Layer::Single => quote!(::typed_amp::amp::Built<#ty, f32, D>),
        Layer::Tuple(elems) => {
            let elems = elems.iter().map(|(t, l)| master_ty(t, l));
            quote!((#(#elems,)*))
        }
    }
}

/// The working type of a layer under the recipe: by the layer's `AmpLayer` row, or, for a
/// pinned layer, in the pinned precision.
pub(crate) fn working_ty(
    recipe: &Recipe,
    ty: &Type,
    layer: &Layer,
    pin: Option<Prec>,
) -> TokenStream {
    match layer {
        Layer::Single => {
            let master = master_ty(ty, layer);
            match pin {
                None => {
                    // Spanned on the field's type: a layer without `AmpLayer` is reported there.
                    let policy = policy_ty(recipe);
                    quote_spanned!(ty.span()=> <#master as ::typed_amp::__private::WorkingUnder<#policy, D>>::Working)
                }
                Some(p) => match plan_layer(recipe, Row::Elementwise, Some(p)).storage {
                    Prec::F32 => master,
                    low => {
                        let low = elem(low);
                        quote!(::typed_amp::amp::Converted<#master, #low, D>)
                    }
                },
            }
        }
        Layer::Tuple(elems) => {
            let elems = elems.iter().map(|(t, l)| working_ty(recipe, t, l, pin));
            quote!((#(#elems,)*))
        }
    }
}

/// An expression building a layer's FP32 master from `device`, in the device's error type.
pub(crate) fn build_master(ty: &Type, layer: &Layer) -> TokenStream {
    match layer {
        Layer::Single => quote! {
            <#ty as ::typed_amp::dfdx::nn::BuildOnDevice<D, f32>>::try_build_on_device(device)?
        },
        Layer::Tuple(elems) => {
            let elems = elems.iter().map(|(t, l)| build_master(t, l));
            quote!((#(#elems,)*))
        }
    }
}

/// An expression making a layer's working copy from its master, `src`.
pub(crate) fn working_from(
    recipe: &Recipe,
    src: TokenStream,
    layer: &Layer,
    pin: Option<Prec>,
) -> TokenStream {
    match layer {
        Layer::Single => match pin {
            None => {
                let policy = policy_ty(recipe);
                quote!(::typed_amp::__private::WorkingUnder::<#policy, D>::try_working_from(&#src)?)
            }
            Some(p) => match plan_layer(recipe, Row::Elementwise, Some(p)).storage {
                Prec::F32 => quote!(::core::clone::Clone::clone(&#src)),
                low => {
                    let low = elem(low);
                    quote!(::typed_amp::amp::try_convert::<_, #low, D>(&#src)?)
                }
            },
        },
        Layer::Tuple(elems) => {
            let elems = elems.iter().enumerate().map(|(i, (_, l))| {
                let i = Index::from(i);
                working_from(recipe, quote!(#src.#i), l, pin)
            });
            quote!((#(#elems,)*))
        }
    }
}
