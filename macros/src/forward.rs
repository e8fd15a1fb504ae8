//! The forward pass: the steps of the layers (tuples flattened) and the `Module`/`ModuleMut`
//! impl with casts at the entry, at the exit and at every pinned layer.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{Ident, Index};

use crate::ast::{Layer, Model};
use crate::attr::Prec;
use crate::layer_types::{marker, plan_ty, policy_ty};
use crate::valid::{plan_layer, LayerPlan, Recipe, Row};

/// One step of the forward pass: a layer (tuples are flattened), where it is in the struct, its
/// type parameter (with tuple indices), and its plan if pinned.
pub(crate) struct Step {
    /// The layer's path in the struct (`stem.0`), for layer probes.
    pub(crate) name: String,
    /// The struct field (`self.stem`).
    pub(crate) field: TokenStream,
    /// Tuple elements to descend into: each element's tuple type and index.
    pub(crate) path: Vec<(TokenStream, Index)>,
    pub(crate) module_ty: TokenStream,
    /// A pinned layer's plan; `None` runs the layer by its `AmpLayer` row.
    pub(crate) pinned: Option<LayerPlan>,
}

impl Step {
    /// An expression borrowing the layer, through `TupleField` for tuple elements (the field's
    /// type is a generic parameter, so `.0` cannot be written).
    fn borrow(&self, mutable: bool) -> TokenStream {
        let field = &self.field;
        let mut expr = if mutable {
            quote!(&mut #field)
        } else {
            quote!(&#field)
        };
        for (tuple, i) in &self.path {
            expr = if mutable {
                quote!(<#tuple as ::typed_amp::__private::TupleField<#i>>::field_mut(#expr))
            } else {
                quote!(<#tuple as ::typed_amp::__private::TupleField<#i>>::field(#expr))
            };
        }
        expr
    }
}

/// The type parameter naming field `i` of the generic layers struct.
pub(crate) fn layer_param(i: usize) -> Ident {
    format_ident!("L{}", i)
}

/// The forward's steps, and the bounds that name the element types of tuple fields.
pub(crate) fn steps(recipe: &Recipe, model: &Model) -> (Vec<Step>, Vec<TokenStream>) {
    #[allow(clippy::too_many_arguments)]
    fn walk(
        recipe: &Recipe,
        name: String,
        field: &TokenStream,
        path: Vec<(TokenStream, Index)>,
        module_ty: TokenStream,
        layer: &Layer,
        pin: Option<Prec>,
        out: &mut Vec<Step>,
        bounds: &mut Vec<TokenStream>,
    ) {
        match layer {
            Layer::Tuple(elems) => {
                for (i, (_, l)) in elems.iter().enumerate() {
                    let i = Index::from(i);
                    bounds.push(quote!(#module_ty: ::typed_amp::__private::TupleField<#i>));
                    let ty = quote!(<#module_ty as ::typed_amp::__private::TupleField<#i>>::Field);
                    let mut path = path.clone();
                    let element = format!("{name}.{}", i.index);
                    path.push((module_ty.clone(), i));
                    walk(recipe, element, field, path, ty, l, pin, out, bounds);
                }
            }
            Layer::Single => out.push(Step {
                name,
                field: field.clone(),
                path,
                module_ty,
                pinned: pin.map(|p| plan_layer(recipe, Row::Elementwise, Some(p))),
            }),
        }
    }
    let (mut out, mut bounds) = (Vec::new(), Vec::new());
    for (i, field) in model.fields.iter().enumerate() {
        let ident = &field.ident;
        let param = layer_param(i);
        walk(
            recipe,
            ident.to_string(),
            &quote!(self.#ident),
            Vec::new(),
            quote!(#param),
            &field.layer,
            field.pin.map(|p| p.value),
            &mut out,
            &mut bounds,
        );
    }
    (out, bounds)
}

/// `Module` (or `ModuleMut`) for the layers struct: casts at the entry and (if asked) at the
/// exit, each layer run by its row of the policy table (or its pin) and watched. Each
/// intermediate activation's type is a parameter of the impl, so the bounds grow linearly with
/// the number of layers.
pub(crate) fn forward_impl(
    recipe: &Recipe,
    model: &Model,
    layers: &Ident,
    mutable: bool,
) -> TokenStream {
    let (steps, tuple_bounds) = steps(recipe, model);
    let params: Vec<Ident> = (0..model.fields.len()).map(layer_param).collect();
    let (trait_path, method, receiver) = if mutable {
        (
            quote!(::typed_amp::dfdx::nn::ModuleMut),
            quote!(try_forward_mut),
            quote!(&mut self),
        )
    } else {
        (
            quote!(::typed_amp::dfdx::nn::Module),
            quote!(try_forward),
            quote!(&self),
        )
    };
    let (run_layer, run_planned, run, run_planned_fn) = if mutable {
        (
            quote!(::typed_amp::__private::RunLayerMut),
            quote!(::typed_amp::__private::RunPlannedMut),
            quote!(try_run_mut),
            quote!(try_run_planned_mut),
        )
    } else {
        (
            quote!(::typed_amp::__private::RunLayer),
            quote!(::typed_amp::__private::RunPlanned),
            quote!(try_run),
            quote!(try_run_planned),
        )
    };
    let policy = policy_ty(recipe);
    let entry = marker(recipe.entry());
    let err = quote!(AmpErr);
    let mut activations: Vec<Ident> = Vec::new();
    let next = |activations: &mut Vec<Ident>| {
        let y = format_ident!("AmpY{}", activations.len());
        activations.push(y.clone());
        y
    };
    let mut bounds = tuple_bounds;
    bounds.push(quote!(#err: ::core::fmt::Debug));
    let mut current = next(&mut activations);
    bounds.push(quote!(AmpX: ::typed_amp::amp::CastTo<#entry, Output = #current, Error = #err>));
    let mut body =
        vec![quote!(let x = <AmpX as ::typed_amp::amp::CastTo<#entry>>::try_cast_to(x)?;)];

    let watch = |name: &str,
                 current: &Ident,
                 bounds: &mut Vec<TokenStream>,
                 body: &mut Vec<TokenStream>| {
        bounds.push(quote!(#current: ::typed_amp::__private::Watch<Error = #err>));
        body.push(quote!(let x = ::typed_amp::__private::Watch::try_watch(x, #name)?;));
    };
    watch("input", &current, &mut bounds, &mut body);

    for step in &steps {
        let module_ty = &step.module_ty;
        let layer = step.borrow(mutable);
        let output = next(&mut activations);
        match step.pinned {
            None => {
                bounds.push(quote!(#current: #run_layer<#module_ty, #policy, Output = #output, Error = #err>));
                body.push(quote!(let x = #run_layer::<#module_ty, #policy>::#run(x, #layer)?;));
            }
            Some(plan) => {
                let plan = plan_ty(plan);
                bounds.push(quote!(#current: #run_planned<#module_ty, #plan, Output = #output, Error = #err>));
                body.push(
                    quote!(let x = #run_planned::<#module_ty, #plan>::#run_planned_fn(x, #layer)?;),
                );
            }
        }
        current = output;
        watch(&step.name, &current, &mut bounds, &mut body);
    }
    if let Some(out) = recipe.cast_model_outputs {
        let m = marker(out);
        let output = next(&mut activations);
        bounds.push(quote!(#current: ::typed_amp::amp::CastTo<#m, Output = #output, Error = #err>));
        body.push(quote!(let x = <_ as ::typed_amp::amp::CastTo<#m>>::try_cast_to(x)?;));
        current = output;
    }
    quote! {
        impl<AmpX, #err, #(#activations,)* #(#params),*> #trait_path<AmpX> for #layers<#(#params),*>
        where
            #(#bounds,)*
        {
            type Output = #current;
            type Error = #err;

            fn #method(#receiver, x: AmpX) -> ::core::result::Result<Self::Output, Self::Error> {
                #(#body)*
                ::core::result::Result::Ok(x)
            }
        }
    }
}
