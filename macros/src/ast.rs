//! The model struct `#[amp]` is applied to: its fields, and what kind of layer each field is.

use syn::spanned::Spanned;
use syn::{Attribute, Error, Fields, Ident, Item, ItemStruct, Result, Type, Visibility};

use crate::attr::{take_field_pin, Prec, Spanned as At};

/// A field's layer. What kind of layer it is (its row of the policy table) is not read from
/// its name: the generated code asks the layer's `AmpLayer` impl, so aliases, user layers and
/// composite layers work alike.
#[derive(Debug, Clone)]
pub enum Layer {
    /// One layer (possibly a composite one behind an alias, `Repeated`, `Residual`, or another
    /// `#[amp]` model).
    Single,
    /// A tuple of layers written out in the field's type: each part runs, and is watched for
    /// overflow, on its own.
    Tuple(Vec<(Type, Layer)>),
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
            if NOT_LAYERS.contains(&name.as_str()) {
                Err(Error::new_spanned(
                    ty,
                    format!("`{name}` is not a layer: every field of an #[amp] struct is a layer (a dfdx or typed-amp layer, a tuple of layers, or another #[amp] struct)"),
                ))
            } else {
                Ok(Layer::Single)
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
        let layer = classify(&field.ty)?;
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
    fn tuples_are_split_and_everything_else_is_one_layer() {
        assert!(matches!(
            classify(&syn::parse_quote!(Linear<784, 512>)).unwrap(),
            Layer::Single
        ));
        assert!(matches!(
            classify(&syn::parse_quote!(MyBlock)).unwrap(),
            Layer::Single
        ));
        let Layer::Tuple(elems) =
            classify(&syn::parse_quote!((Linear<2, 2>, (ReLU, Tanh)))).unwrap()
        else {
            panic!("a tuple")
        };
        assert_eq!(elems.len(), 2);
        assert!(matches!(elems[1].1, Layer::Tuple(_)));
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
