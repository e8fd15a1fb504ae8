//! Code generation: the master and working models, their parameter walks, the forward with
//! casts at precision boundaries, and the `AmpModel` impl that builds and pairs them.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, Index, Type};

use crate::ast::{Field, Layer, Model};
use crate::attr::{OptLevel, Prec};
use crate::valid::{plan_layer, Compute, LayerPlan, LossScale, Recipe, Row, Target};

/// The marker type of a precision.
fn marker(p: Prec) -> TokenStream {
    match p {
        Prec::F16 => quote!(::typed_amp::F16),
        Prec::BF16 => quote!(::typed_amp::BF16),
        Prec::F32 => quote!(::typed_amp::F32),
    }
}

/// The element type of a precision.
fn elem(p: Prec) -> TokenStream {
    let marker = marker(p);
    quote!(<#marker as ::typed_amp::Precision>::Elem)
}

/// A plan as a type (`typed_amp::amp::layer::plan`).
fn plan_ty(plan: LayerPlan) -> TokenStream {
    match plan.compute {
        Compute::In(p) => {
            let p = marker(p);
            quote!(::typed_amp::amp::layer::plan::In<#p>)
        }
        Compute::Autocast(p) => {
            let p = marker(p);
            quote!(::typed_amp::amp::layer::plan::Autocast<#p>)
        }
        Compute::Pass => {
            let p = marker(plan.storage);
            quote!(::typed_amp::amp::layer::plan::Pass<#p>)
        }
        Compute::KeepFp32(p) => {
            let p = marker(p);
            quote!(::typed_amp::amp::layer::plan::KeepFp32<#p>)
        }
    }
}

/// The recipe's policy table as a type: one plan per row.
fn policy_ty(recipe: &Recipe) -> TokenStream {
    let plans = Row::ALL
        .iter()
        .map(|row| plan_ty(plan_layer(recipe, *row, None)));
    quote!(::typed_amp::amp::layer::Table<#(#plans),*>)
}

/// The FP32 master type of a layer.
fn master_ty(ty: &Type, layer: &Layer) -> TokenStream {
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
fn working_ty(recipe: &Recipe, ty: &Type, layer: &Layer, pin: Option<Prec>) -> TokenStream {
    match layer {
        Layer::Single => {
            let master = master_ty(ty, layer);
            match pin {
                None => {
                    // Spanned on the field's type: a layer without `AmpLayer` is reported there.
                    let policy = policy_ty(recipe);
                    quote_spanned!(ty.span()=> <#master as ::typed_amp::amp::layer::WorkingUnder<#policy, D>>::Working)
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
fn build_master(ty: &Type, layer: &Layer) -> TokenStream {
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
fn working_from(
    recipe: &Recipe,
    src: TokenStream,
    layer: &Layer,
    pin: Option<Prec>,
) -> TokenStream {
    match layer {
        Layer::Single => match pin {
            None => {
                let policy = policy_ty(recipe);
                quote!(::typed_amp::amp::layer::WorkingUnder::<#policy, D>::try_working_from(&#src)?)
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

/// One step of the forward pass: a layer (tuples are flattened), where it is in the struct, its
/// type parameter (with tuple indices), and its plan if pinned.
struct Step {
    /// The layer's path in the struct (`stem.0`), for layer probes.
    name: String,
    /// The struct field (`self.stem`).
    field: TokenStream,
    /// Tuple elements to descend into: each element's tuple type and index.
    path: Vec<(TokenStream, Index)>,
    module_ty: TokenStream,
    /// A pinned layer's plan; `None` runs the layer by its `AmpLayer` row.
    pinned: Option<LayerPlan>,
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
                quote!(<#tuple as ::typed_amp::amp::TupleField<#i>>::field_mut(#expr))
            } else {
                quote!(<#tuple as ::typed_amp::amp::TupleField<#i>>::field(#expr))
            };
        }
        expr
    }
}

/// The type parameter naming field `i` of the generic layers struct.
fn layer_param(i: usize) -> Ident {
    format_ident!("L{}", i)
}

/// The forward's steps, and the bounds that name the element types of tuple fields.
fn steps(recipe: &Recipe, model: &Model) -> (Vec<Step>, Vec<TokenStream>) {
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
                    bounds.push(quote!(#module_ty: ::typed_amp::amp::TupleField<#i>));
                    let ty = quote!(<#module_ty as ::typed_amp::amp::TupleField<#i>>::Field);
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
fn forward_impl(recipe: &Recipe, model: &Model, layers: &Ident, mutable: bool) -> TokenStream {
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
            quote!(::typed_amp::amp::layer::RunLayerMut),
            quote!(::typed_amp::amp::layer::RunPlannedMut),
            quote!(try_run_mut),
            quote!(try_run_planned_mut),
        )
    } else {
        (
            quote!(::typed_amp::amp::layer::RunLayer),
            quote!(::typed_amp::amp::layer::RunPlanned),
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
        bounds.push(quote!(#current: ::typed_amp::watch::Watch<Error = #err>));
        body.push(quote!(let x = ::typed_amp::watch::Watch::try_watch(x, #name)?;));
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

/// The struct of layers, generic over each field's type, with `Clone`, `Debug`,
/// `Parameters` and dfdx's `TensorCollection`. The master and working models are aliases of it.
fn layers_struct(model: &Model, name: &Ident) -> TokenStream {
    let vis = &model.vis;
    let ident = &model.ident;
    let idents: Vec<&Ident> = model.fields.iter().map(|f| &f.ident).collect();
    let names: Vec<String> = idents.iter().map(|i| i.to_string()).collect();
    let params: Vec<Ident> = (0..model.fields.len()).map(layer_param).collect();
    let working_params: Vec<Ident> = (0..model.fields.len())
        .map(|i| format_ident!("AmpW{}", i))
        .collect();
    let field_defs = model.fields.iter().zip(&params).map(|(f, param)| {
        let (fvis, ident) = (&f.vis, &f.ident);
        let docs = f.attrs.iter().filter(|a| a.path().is_ident("doc"));
        quote!(#(#docs)* #fvis #ident: #param)
    });
    let doc = format!(
        "The layers of [`{ident}`], generated by `#[amp]`: one type parameter per field. \
         [`{ident}Master`] and [`{ident}Working`] name its FP32 master and its working model."
    );
    // dfdx's `visit_fields` takes up to six fields per tuple: group them.
    let chunks: Vec<&[&Ident]> = idents.chunks(6).collect();
    let visits = chunks.iter().map(|chunk| {
        let fields = chunk.iter().map(|ident| {
            let n = ident.to_string();
            quote!(Self::module(#n, |s| &s.#ident, |s| &mut s.#ident))
        });
        quote!((#(#fields,)*))
    });
    let pattern = chunks.iter().map(|chunk| quote!((#(#chunk,)*)));
    quote! {
        #[doc = #doc]
        #[derive(Debug, Clone)]
        #vis struct #name<#(#params),*> {
            #(#field_defs,)*
        }

        impl<D: ::typed_amp::AmpDevice, #(#params: ::typed_amp::Parameters<D>),*> ::typed_amp::Parameters<D> for #name<#(#params),*> {
            fn visit_params_at<V: ::typed_amp::params::ParamVisitor<D>>(
                &self,
                path: &mut ::typed_amp::params::ParamPath,
                visitor: &mut V,
            ) -> ::core::result::Result<(), V::Error> {
                #(path.within(#names, |path| ::typed_amp::Parameters::<D>::visit_params_at(&self.#idents, path, visitor))?;)*
                ::core::result::Result::Ok(())
            }

            fn visit_params_mut_at<V: ::typed_amp::params::ParamVisitorMut<D>>(
                &mut self,
                path: &mut ::typed_amp::params::ParamPath,
                visitor: &mut V,
            ) -> ::core::result::Result<(), V::Error> {
                #(path.within(#names, |path| ::typed_amp::Parameters::<D>::visit_params_mut_at(&mut self.#idents, path, visitor))?;)*
                ::core::result::Result::Ok(())
            }
        }

        impl<D: ::typed_amp::AmpDevice, #(#params,)* #(#working_params),*>
            ::typed_amp::master::CompositePaired<#name<#(#working_params),*>, D> for #name<#(#params),*>
        where
            #(#params: ::typed_amp::master::Paired<#working_params, D>,)*
        {
            fn visit_pairs_at<V: ::typed_amp::master::PairVisitor<D>>(
                &mut self,
                working: &mut #name<#(#working_params),*>,
                path: &mut ::typed_amp::params::ParamPath,
                visitor: &mut V,
            ) -> ::core::result::Result<(), V::Error> {
                #(path.within(#names, |path| ::typed_amp::master::Paired::<#working_params, D>::visit_pairs_at(&mut self.#idents, &mut working.#idents, path, visitor))?;)*
                ::core::result::Result::Ok(())
            }
        }

        impl<
            E: ::typed_amp::dfdx::prelude::Dtype,
            D: ::typed_amp::dfdx::prelude::Device<E>,
            #(#params: ::typed_amp::dfdx::nn::TensorCollection<E, D>),*
        > ::typed_amp::dfdx::nn::TensorCollection<E, D> for #name<#(#params),*> {
            type To<E2: ::typed_amp::dfdx::prelude::Dtype, D2: ::typed_amp::dfdx::prelude::Device<E2>> =
                #name<#(#params::To<E2, D2>),*>;

            fn iter_tensors<V: ::typed_amp::dfdx::nn::ModuleVisitor<Self, E, D>>(
                visitor: &mut V,
            ) -> ::core::result::Result<::core::option::Option<Self::To<V::E2, V::D2>>, V::Err> {
                visitor.visit_fields((#(#visits,)*), |(#(#pattern,)*)| #name { #(#idents,)* })
            }
        }
    }
}

fn config_tokens(recipe: &Recipe) -> TokenStream {
    let level = format_ident!("{}", recipe.opt_level.name());
    let master = recipe.target == Target::MasterWeights;
    let keep = recipe.keep_batchnorm_fp32;
    let scale = match recipe.loss_scale {
        LossScale::None => quote!(::typed_amp::amp::LossScale::None),
        LossScale::Dynamic => quote!(::typed_amp::amp::LossScale::Dynamic),
        LossScale::Static(s) => quote!(::typed_amp::amp::LossScale::Static(#s)),
    };
    let dtype = |p: Option<Prec>| match p {
        None => quote!(::core::option::Option::None),
        Some(p) => {
            let marker = marker(p);
            quote!(::core::option::Option::Some(<#marker as ::typed_amp::Precision>::DTYPE))
        }
    };
    let outputs = dtype(recipe.cast_model_outputs);
    let low = dtype((recipe.opt_level != OptLevel::O0).then_some(recipe.low));
    let allow = recipe.target == Target::LowPrecision;
    quote! {
        ::typed_amp::amp::AmpConfig {
            opt_level: ::typed_amp::amp::OptLevel::#level,
            dtype: #low,
            master_weights: #master,
            keep_batchnorm_fp32: #keep,
            loss_scale: #scale,
            cast_model_outputs: #outputs,
            low_precision_updates: #allow,
        }
    }
}

/// Everything `#[amp]` generates for a model.
pub fn expand(recipe: &Recipe, model: &Model) -> TokenStream {
    let ident = &model.ident;
    let vis = &model.vis;
    let master_name = format_ident!("{}Master", ident);
    let working_name = format_ident!("{}Working", ident);

    let layers_name = format_ident!("{}Layers", ident);
    let layers = layers_struct(model, &layers_name);

    let master_tys = model.fields.iter().map(|f| master_ty(&f.ty, &f.layer));
    let master_doc =
        format!("FP32 master model of [`{ident}`], generated by `#[amp]`: every layer in FP32.");
    let master_alias = quote! {
        #[doc = #master_doc]
        #vis type #master_name<D> = #layers_name<#(#master_tys),*>;
    };
    let working_alias = if recipe.separate_working() {
        let tys = model
            .fields
            .iter()
            .map(|f| working_ty(recipe, &f.ty, &f.layer, f.pin.map(|p| p.value)));
        let doc = format!("Working model of [`{ident}`], generated by `#[amp]`: each layer in the precision its policy gives it.");
        quote! {
            #[doc = #doc]
            #vis type #working_name<D> = #layers_name<#(#tys),*>;
        }
    } else {
        let doc =
            format!("Working model of [`{ident}`]: under this policy, the FP32 master itself.");
        quote! {
            #[doc = #doc]
            #vis type #working_name<D> = #master_name<D>;
        }
    };

    let forward = if recipe.custom_forward {
        TokenStream::new()
    } else {
        let immutable = forward_impl(recipe, model, &layers_name, false);
        let mutable = forward_impl(recipe, model, &layers_name, true);
        quote!(#immutable #mutable)
    };

    let field_idents: Vec<&Ident> = model.fields.iter().map(|f| &f.ident).collect();
    let layer_params: Vec<Ident> = (0..model.fields.len()).map(layer_param).collect();
    let builds = model.fields.iter().map(|f| build_master(&f.ty, &f.layer));
    let working_from_master = if recipe.separate_working() {
        let fields = model.fields.iter().map(|f: &Field| {
            let ident = &f.ident;
            let value = working_from(
                recipe,
                quote!(master.#ident),
                &f.layer,
                f.pin.map(|p| p.value),
            );
            quote!(#ident: #value)
        });
        quote!(::core::result::Result::Ok(#layers_name { #(#fields,)* }))
    } else {
        quote!(::core::result::Result::Ok(::core::clone::Clone::clone(
            master
        )))
    };
    // The narrowest precision the model computes in decides whether its step needs a loss
    // scaler (FP16) or not (BF16, FP32).
    let narrowest = marker(recipe.narrowest);
    let (weights_ty, build) = match recipe.target {
        Target::Fp32 => (
            quote!(::typed_amp::Fp32Weights<#master_name<D>, D, #narrowest>),
            quote!(::core::result::Result::Ok(
                ::typed_amp::SinglePrecision::with_compute(Self::try_build_master(device)?, device)
            )),
        ),
        Target::MasterWeights => (
            quote!(::typed_amp::MasterWeights<#master_name<D>, #working_name<D>, D, #narrowest>),
            quote! {
                let master = Self::try_build_master(device)?;
                let working = Self::try_working_from(&master)?;
                ::typed_amp::MasterWeights::pair(master, working, device)
            },
        ),
        Target::LowPrecision => {
            let low = elem(recipe.low);
            (
                quote!(::typed_amp::SinglePrecision<#working_name<D>, #low, D>),
                quote! {
                    // Initialised in FP32, like every policy, then converted.
                    let master = Self::try_build_master(device)?;
                    ::core::result::Result::Ok(::typed_amp::SinglePrecision::new(Self::try_working_from(&master)?, device))
                },
            )
        }
    };
    let input = marker(recipe.entry());
    let config = config_tokens(recipe);
    let weights_name = format_ident!("{}Weights", ident);
    let weights_doc = format!("What the optimizer trains for [`{ident}`] under its policy (what `{ident}::build` returns).");

    let mut arch = model.item.clone();
    arch.attrs.push(syn::parse_quote!(#[allow(dead_code)]));
    let arch = arch.into_token_stream();

    quote! {
        #arch

        #layers

        #master_alias

        #working_alias

        #forward

        impl<D: ::typed_amp::AmpDevice> ::typed_amp::amp::AmpModel<D> for #ident {
            type Master = #master_name<D>;
            type Working = #working_name<D>;
            type Weights = #weights_ty;
            type Input = #input;

            const CONFIG: ::typed_amp::amp::AmpConfig = #ident::AMP_CONFIG;

            fn try_build_master(device: &D) -> ::core::result::Result<#master_name<D>, ::typed_amp::AmpError> {
                <#ident as ::typed_amp::dfdx::nn::BuildOnDevice<D, f32>>::try_build_on_device(device)
                    .map_err(::typed_amp::AmpError::device)
            }

            fn try_working_from(master: &#master_name<D>) -> ::core::result::Result<#working_name<D>, ::typed_amp::AmpError> {
                #working_from_master
            }

            fn try_build(device: &D) -> ::core::result::Result<Self::Weights, ::typed_amp::AmpError> {
                #build
            }
        }

        #[doc = #weights_doc]
        #vis type #weights_name<D> = #weights_ty;

        // The architecture builds its FP32 master like any dfdx layer, so an `#[amp]` model can
        // be a field, a tuple element or a `Repeated` block of another.
        impl<D: ::typed_amp::AmpDevice> ::typed_amp::dfdx::nn::BuildOnDevice<D, f32> for #ident {
            type Built = #master_name<D>;

            fn try_build_on_device(device: &D) -> ::core::result::Result<#master_name<D>, D::Err> {
                ::core::result::Result::Ok(#layers_name { #(#field_idents: #builds,)* })
            }
        }

        // Inside another `#[amp]` model, these layers run under this model's own policy.
        impl<#(#layer_params),*> ::typed_amp::amp::AmpLayer for #layers_name<#(#layer_params),*> {
            type Kind = ::typed_amp::amp::kind::Nested<#ident>;
        }

        impl #ident {
            /// The mixed-precision recipe this model was declared with.
            pub const AMP_CONFIG: ::typed_amp::amp::AmpConfig = #config;

            /// Builds the model on `device`, ready to train under its policy.
            pub fn build<D: ::typed_amp::AmpDevice>(
                device: &D,
            ) -> ::core::result::Result<#weights_name<D>, ::typed_amp::AmpError> {
                <Self as ::typed_amp::amp::AmpModel<D>>::try_build(device)
            }

            /// A loss scaler for this model's policy.
            pub fn scaler() -> ::typed_amp::GradScaler {
                // `valid` accepted only finite, positive static scales below FP16's overflow.
                ::typed_amp::amp::AmpConfig::try_scaler(&Self::AMP_CONFIG)
                    .expect("#[amp] validated the loss scale")
            }
        }
    }
}
