//! Parsing `#[amp(policy = "O2", property = value, ...)]` and the field attributes
//! `#[amp(fp16)]` / `#[amp(fp32)]`.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned as _;
use syn::{Attribute, Error, Lit, LitStr, Result};

/// Apex's optimisation levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptLevel {
    O0,
    O1,
    O2,
    O3,
}

impl OptLevel {
    const ALL: [OptLevel; 4] = [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3];

    /// `"O0"`, `"O1"`, `"O2"` or `"O3"`: the policy as written.
    pub fn name(self) -> &'static str {
        match self {
            OptLevel::O0 => "O0",
            OptLevel::O1 => "O1",
            OptLevel::O2 => "O2",
            OptLevel::O3 => "O3",
        }
    }
}

/// A precision named in an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prec {
    F16,
    F32,
}

/// A value together with the tokens it came from, for errors.
#[derive(Debug, Clone, Copy)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

/// `loss_scale = "dynamic"` or `loss_scale = <number>`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScaleSpec {
    Dynamic,
    Static(f64),
}

/// The struct-level attribute, as written.
#[derive(Debug, Default)]
pub struct AmpArgs {
    pub policy: Option<Spanned<OptLevel>>,
    pub keep_batchnorm_fp32: Option<Spanned<bool>>,
    pub master_weights: Option<Spanned<bool>>,
    pub loss_scale: Option<Spanned<LossScaleSpec>>,
    pub cast_model_outputs: Option<Spanned<Prec>>,
    pub allow_fp16_updates: Option<Spanned<bool>>,
    pub custom_forward: Option<Spanned<bool>>,
}

/// The properties an `#[amp]` attribute accepts, for error messages.
pub const PROPERTIES: &str = "policy, keep_batchnorm_fp32, master_weights, loss_scale, \
                              cast_model_outputs, allow_fp16_updates, custom_forward";

impl AmpArgs {
    /// Parses one `key = value` (or bare flag) of the attribute.
    pub fn parse_meta(&mut self, meta: ParseNestedMeta<'_>) -> Result<()> {
        let key = meta
            .path
            .get_ident()
            .map(|i| i.to_string())
            .unwrap_or_default();
        let span = meta.path.span();
        match key.as_str() {
            "policy" => {
                let lit: LitStr = meta.value()?.parse()?;
                let name = lit.value();
                let Some(value) = OptLevel::ALL.into_iter().find(|l| l.name() == name) else {
                    return Err(Error::new_spanned(
                        &lit,
                        format!(
                            "unknown policy `{name}`: expected \"O0\", \"O1\", \"O2\" or \"O3\""
                        ),
                    ));
                };
                set(&mut self.policy, value, lit.span(), &meta)
            }
            "keep_batchnorm_fp32" => {
                let value = parse_bool(&meta)?;
                set(&mut self.keep_batchnorm_fp32, value, span, &meta)
            }
            "master_weights" => {
                let value = parse_bool(&meta)?;
                set(&mut self.master_weights, value, span, &meta)
            }
            "allow_fp16_updates" => {
                let value = parse_flag(&meta)?;
                set(&mut self.allow_fp16_updates, value, span, &meta)
            }
            "custom_forward" => {
                let value = parse_flag(&meta)?;
                set(&mut self.custom_forward, value, span, &meta)
            }
            "loss_scale" => {
                let lit: Lit = meta.value()?.parse()?;
                let value =
                    match &lit {
                        Lit::Str(s) if s.value() == "dynamic" => LossScaleSpec::Dynamic,
                        Lit::Float(f) => LossScaleSpec::Static(f.base10_parse()?),
                        Lit::Int(i) => LossScaleSpec::Static(i.base10_parse::<u64>()? as f64),
                        _ => return Err(Error::new_spanned(
                            &lit,
                            "`loss_scale` is \"dynamic\" or a number, e.g. `loss_scale = 128.0`",
                        )),
                    };
                set(&mut self.loss_scale, value, lit.span(), &meta)
            }
            "cast_model_outputs" => {
                let lit: LitStr = meta.value()?.parse()?;
                let value = parse_prec(&lit)?;
                set(&mut self.cast_model_outputs, value, lit.span(), &meta)
            }
            _ => Err(Error::new_spanned(
                &meta.path,
                format!(
                    "unknown #[amp] property `{}`: expected one of {PROPERTIES}",
                    path_text(&meta)
                ),
            )),
        }
    }
}

fn path_text(meta: &ParseNestedMeta<'_>) -> String {
    meta.path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

fn set<T>(
    slot: &mut Option<Spanned<T>>,
    value: T,
    span: Span,
    meta: &ParseNestedMeta<'_>,
) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new_spanned(
            &meta.path,
            format!("`{}` is given twice", path_text(meta)),
        ));
    }
    *slot = Some(Spanned { value, span });
    Ok(())
}

fn parse_bool(meta: &ParseNestedMeta<'_>) -> Result<bool> {
    let lit: Lit = meta.value()?.parse()?;
    match lit {
        Lit::Bool(b) => Ok(b.value),
        other => Err(Error::new_spanned(
            other,
            format!("`{}` takes `true` or `false`", path_text(meta)),
        )),
    }
}

/// A flag may be written bare (`allow_fp16_updates`) or with a value.
fn parse_flag(meta: &ParseNestedMeta<'_>) -> Result<bool> {
    if meta.input.peek(syn::Token![=]) {
        parse_bool(meta)
    } else {
        Ok(true)
    }
}

fn parse_prec(lit: &LitStr) -> Result<Prec> {
    match lit.value().to_ascii_lowercase().as_str() {
        "fp16" | "f16" => Ok(Prec::F16),
        "fp32" | "f32" => Ok(Prec::F32),
        other => Err(Error::new_spanned(
            lit,
            format!("unknown precision `{other}`: expected \"fp16\" or \"fp32\""),
        )),
    }
}

/// Reads and removes a field's `#[amp(fp16)]` / `#[amp(fp32)]` attribute.
pub fn take_field_pin(attrs: &mut Vec<Attribute>) -> Result<Option<Spanned<Prec>>> {
    let mut pin: Option<Spanned<Prec>> = None;
    let mut result = Ok(());
    attrs.retain(|attr| {
        if !attr.path().is_ident("amp") {
            return true;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            let prec = if meta.path.is_ident("fp16") {
                Prec::F16
            } else if meta.path.is_ident("fp32") {
                Prec::F32
            } else {
                return Err(Error::new_spanned(
                    &meta.path,
                    format!(
                        "unknown field property `{}`: a field takes `#[amp(fp16)]` or `#[amp(fp32)]`",
                        path_text(&meta)
                    ),
                ));
            };
            if let Some(first) = pin {
                let msg = if first.value == prec {
                    "this field's precision is pinned twice"
                } else {
                    "a field is pinned to one precision: `fp16` and `fp32` conflict"
                };
                return Err(Error::new_spanned(&meta.path, msg));
            }
            pin = Some(Spanned {
                value: prec,
                span: meta.path.span(),
            });
            Ok(())
        });
        if let Err(e) = parsed {
            if result.is_ok() {
                result = Err(e);
            }
        }
        false
    });
    result.map(|()| pin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse::Parser;

    fn parse(tokens: proc_macro2::TokenStream) -> Result<AmpArgs> {
        let mut args = AmpArgs::default();
        syn::meta::parser(|meta| args.parse_meta(meta)).parse2(tokens)?;
        Ok(args)
    }

    #[test]
    fn parses_every_property() {
        let args = parse(quote::quote!(
            policy = "O2",
            keep_batchnorm_fp32 = false,
            master_weights = true,
            loss_scale = 128.0,
            cast_model_outputs = "fp32",
            custom_forward
        ))
        .unwrap();
        assert_eq!(args.policy.unwrap().value, OptLevel::O2);
        assert!(!args.keep_batchnorm_fp32.unwrap().value);
        assert!(args.master_weights.unwrap().value);
        assert_eq!(args.loss_scale.unwrap().value, LossScaleSpec::Static(128.0));
        assert_eq!(args.cast_model_outputs.unwrap().value, Prec::F32);
        assert!(args.custom_forward.unwrap().value);
        let args = parse(quote::quote!(
            policy = "O1",
            loss_scale = "dynamic",
            loss_scale_ok = 1
        ))
        .unwrap_err();
        assert!(args
            .to_string()
            .contains("unknown #[amp] property `loss_scale_ok`"));
    }

    #[test]
    fn rejects_bad_values_and_duplicates() {
        let err = parse(quote::quote!(policy = "O4")).unwrap_err();
        assert!(err.to_string().contains("unknown policy `O4`"));
        let err = parse(quote::quote!(policy = "O1", policy = "O2")).unwrap_err();
        assert!(err.to_string().contains("given twice"));
        let err = parse(quote::quote!(policy = "O2", master_weights = "yes")).unwrap_err();
        assert!(err.to_string().contains("takes `true` or `false`"));
        let err = parse(quote::quote!(policy = "O2", loss_scale = "huge")).unwrap_err();
        assert!(err.to_string().contains("\"dynamic\" or a number"));
    }

    #[test]
    fn field_pins_are_taken_and_checked() {
        let mut attrs: Vec<Attribute> = vec![
            syn::parse_quote!(#[doc = "kept"]),
            syn::parse_quote!(#[amp(fp32)]),
        ];
        let pin = take_field_pin(&mut attrs).unwrap().unwrap();
        assert_eq!(pin.value, Prec::F32);
        assert_eq!(
            attrs.len(),
            1,
            "the #[amp] field attribute is removed, others kept"
        );
        let mut attrs: Vec<Attribute> = vec![syn::parse_quote!(#[amp(fp16, fp32)])];
        assert!(take_field_pin(&mut attrs)
            .unwrap_err()
            .to_string()
            .contains("conflict"));
        let mut attrs: Vec<Attribute> = vec![syn::parse_quote!(#[amp(bf16)])];
        assert!(take_field_pin(&mut attrs)
            .unwrap_err()
            .to_string()
            .contains("unknown field property"));
    }
}
