//! The model struct `#[amp]` is applied to: its fields, and what kind of layer each field is.

use syn::spanned::Spanned;
use syn::{Attribute, Error, Fields, Ident, Item, ItemStruct, Result, Type, Visibility};

use crate::attr::{take_field_pin, Prec, Spanned as At};

/// How a layer takes part in mixed precision, recognised from its type's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Matrix products (linear, convolution): FP16 compute under O1, O2 and O3.
    Matmul,
    /// Batch norm and layer norm: FP32 under O1, and under O2 unless `keep_batchnorm_fp32 = false`.
    Norm,
    /// Softmax, log-softmax, exp and log: FP32 except under O3.
    Fp32Op,
    /// Elementwise layers with parameters (PReLU, bias): follow the model's storage precision.
    Elementwise,
    /// Parameterless layers that compute in whatever precision they receive.
    Neutral,
    /// An explicit cast layer (`ToF16`, `ToF32`).
    Cast(Prec),
}

/// A field's layer.
#[derive(Debug, Clone)]
pub enum Layer {
    /// A layer `#[amp]` recognises (or one pinned to a precision).
    Known(Kind),
    /// A tuple of layers run in order.
    Tuple(Vec<(Type, Layer)>),
    /// Another `#[amp]` model (or an unknown layer: the trait bound will say so).
    Nested,
}

/// One field of the model.
#[derive(Debug, Clone)]
pub struct Field {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub ident: Ident,
    pub ty: Type,
    pub pin: Option<At<Prec>>,
    pub layer: Layer,
}

/// The model struct, with `#[amp]` field attributes removed.
#[derive(Debug, Clone)]
pub struct Model {
    pub item: ItemStruct,
    pub vis: Visibility,
    pub ident: Ident,
    pub fields: Vec<Field>,
}

const MATMUL: &[&str] = &["Linear", "UnbiasedLinear", "Conv2D", "ConvTrans2D"];
const NORM: &[&str] = &["BatchNorm1D", "BatchNorm2D", "LayerNorm1D"];
const FP32_OPS: &[&str] = &["Softmax", "LogSoftmax", "Exp", "Ln"];
const ELEMENTWISE: &[&str] = &["PReLU", "PReLU1D", "Bias2D"];
const NEUTRAL: &[&str] = &[
    "ReLU",
    "GeLU",
    "FastGeLU",
    "AccurateGeLU",
    "Sigmoid",
    "Tanh",
    "Sin",
    "Cos",
    "Square",
    "Sqrt",
    "Abs",
    "LeakyReLU",
    "Dropout",
    "DropoutOneIn",
    "MaxPool2D",
    "AvgPoolGlobal",
    "MaxPoolGlobal",
    "MinPoolGlobal",
    "Flatten",
    "Flatten2D",
];
/// Types that are plainly not layers.
const NOT_LAYERS: &[&str] = &[
    "bool",
    "char",
    "str",
    "String",
    "f16",
    "bf16",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "Vec",
    "Option",
    "Box",
    "Rc",
    "Arc",
    "HashMap",
    "BTreeMap",
    "Tensor",
    "PhantomData",
];

/// Classifies a field's type.
pub fn classify(ty: &Type) -> Result<Layer> {
    match ty {
        Type::Paren(inner) => classify(&inner.elem),
        Type::Group(inner) => classify(&inner.elem),
        Type::Tuple(tuple) => {
            if tuple.elems.is_empty() {
                return Err(Error::new_spanned(ty, "`()` is not a layer"));
            }
            tuple
                .elems
                .iter()
                .map(|elem| Ok((elem.clone(), classify(elem)?)))
                .collect::<Result<_>>()
                .map(Layer::Tuple)
        }
        Type::Path(path) if path.qself.is_none() => {
            let Some(last) = path.path.segments.last() else {
                return Err(Error::new_spanned(ty, "expected a layer type"));
            };
            let name = last.ident.to_string();
            let is = |list: &[&str]| list.contains(&name.as_str());
            if is(NOT_LAYERS) {
                Err(Error::new_spanned(
                    ty,
                    format!("`{name}` is not a layer: every field of an #[amp] struct is a layer (a dfdx or typed-amp layer, a tuple of layers, or another #[amp] struct)"),
                ))
            } else if is(MATMUL) {
                Ok(Layer::Known(Kind::Matmul))
            } else if is(NORM) {
                Ok(Layer::Known(Kind::Norm))
            } else if is(FP32_OPS) {
                Ok(Layer::Known(Kind::Fp32Op))
            } else if is(ELEMENTWISE) {
                Ok(Layer::Known(Kind::Elementwise))
            } else if is(NEUTRAL) {
                Ok(Layer::Known(Kind::Neutral))
            } else if name == "ToF16" {
                Ok(Layer::Known(Kind::Cast(Prec::F16)))
            } else if name == "ToBf16" {
                Ok(Layer::Known(Kind::Cast(Prec::BF16)))
            } else if name == "ToF32" {
                Ok(Layer::Known(Kind::Cast(Prec::F32)))
            } else {
                Ok(Layer::Nested)
            }
        }
        _ => Err(Error::new_spanned(
            ty,
            "not a layer: every field of an #[amp] struct is a layer (a dfdx or typed-amp layer, a tuple of layers, or another #[amp] struct)",
        )),
    }
}

/// Reads the struct `#[amp]` is applied to.
pub fn parse_model(item: Item) -> Result<Model> {
    let mut item = match item {
        Item::Struct(s) => s,
        Item::Enum(e) => {
            return Err(Error::new_spanned(
                e.enum_token,
                "#[amp] applies to a struct whose named fields are layers, not to an enum",
            ))
        }
        Item::Union(u) => {
            return Err(Error::new_spanned(
                u.union_token,
                "#[amp] applies to a struct whose named fields are layers, not to a union",
            ))
        }
        other => {
            return Err(Error::new(
                other.span(),
                "#[amp] applies to a struct whose named fields are layers",
            ))
        }
    };
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        return Err(Error::new_spanned(
            &item.generics,
            "#[amp] structs cannot be generic: the macro chooses the element type of every layer and makes the device `D` the only parameter of the generated models",
        ));
    }
    let named = match &mut item.fields {
        Fields::Named(named) => named,
        Fields::Unnamed(unnamed) => {
            return Err(Error::new_spanned(
                &*unnamed,
                "#[amp] needs named fields (`struct Net { fc1: Linear<784, 128>, .. }`): the names become parameter paths such as `fc1.weight`",
            ))
        }
        Fields::Unit => {
            return Err(Error::new_spanned(
                &item.ident,
                "an #[amp] struct needs at least one layer field",
            ))
        }
    };
    if named.named.is_empty() {
        return Err(Error::new_spanned(
            &item.ident,
            "an #[amp] struct needs at least one layer field",
        ));
    }
    let mut fields = Vec::new();
    for field in named.named.iter_mut() {
        let pin = take_field_pin(&mut field.attrs)?;
        let mut layer = classify(&field.ty)?;
        if pin.is_some() && matches!(layer, Layer::Nested) {
            // A pinned layer whose name #[amp] does not know is taken as a layer of the pinned
            // precision (a type alias, or a user's own dfdx layer).
            layer = Layer::Known(Kind::Elementwise);
        }
        fields.push(Field {
            attrs: field.attrs.clone(),
            vis: field.vis.clone(),
            ident: field.ident.clone().expect("named fields have names"),
            ty: field.ty.clone(),
            pin,
            layer,
        });
    }
    Ok(Model {
        vis: item.vis.clone(),
        ident: item.ident.clone(),
        item,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_classified_by_name() {
        let kind = |ty: Type| match classify(&ty).unwrap() {
            Layer::Known(k) => Some(k),
            _ => None,
        };
        assert_eq!(
            kind(syn::parse_quote!(Linear<784, 512>)),
            Some(Kind::Matmul)
        );
        assert_eq!(
            kind(syn::parse_quote!(typed_amp::nn::builders::Conv2D<1, 8, 3>)),
            Some(Kind::Matmul)
        );
        assert_eq!(kind(syn::parse_quote!(BatchNorm2D<8>)), Some(Kind::Norm));
        assert_eq!(kind(syn::parse_quote!(Softmax)), Some(Kind::Fp32Op));
        assert_eq!(kind(syn::parse_quote!(ReLU)), Some(Kind::Neutral));
        assert_eq!(kind(syn::parse_quote!(ToF32)), Some(Kind::Cast(Prec::F32)));
        assert!(matches!(
            classify(&syn::parse_quote!(MyBlock)).unwrap(),
            Layer::Nested
        ));
        let Layer::Tuple(elems) = classify(&syn::parse_quote!((Linear<2, 2>, ReLU))).unwrap()
        else {
            panic!("a tuple")
        };
        assert_eq!(elems.len(), 2);
    }

    #[test]
    fn non_layers_are_rejected_on_their_type() {
        for ty in [
            syn::parse_quote!(usize),
            syn::parse_quote!(Vec<Linear<2, 2>>),
            syn::parse_quote!(&'static Linear<2, 2>),
            syn::parse_quote!([Linear<2, 2>; 3]),
            syn::parse_quote!(()),
        ] {
            let ty: Type = ty;
            assert!(classify(&ty).is_err(), "{}", quote::quote!(#ty));
        }
    }

    #[test]
    fn struct_shapes_are_checked() {
        let err = |item: Item| parse_model(item).unwrap_err().to_string();
        assert!(err(syn::parse_quote!(
            struct Net(Linear<2, 2>);
        ))
        .contains("named fields"));
        assert!(err(syn::parse_quote!(
            struct Net<E> {
                a: Linear<2, 2>,
                e: E,
            }
        ))
        .contains("cannot be generic"));
        assert!(err(syn::parse_quote!(
            enum Net {
                A,
            }
        ))
        .contains("not to an enum"));
        assert!(err(syn::parse_quote!(
            struct Net;
        ))
        .contains("at least one layer"));
        let model = parse_model(syn::parse_quote!(
            pub struct Net {
                #[amp(fp32)]
                head: Linear<2, 2>,
            }
        ))
        .unwrap();
        assert_eq!(model.fields[0].pin.unwrap().value, Prec::F32);
    }
}
