//! Parsing `#[amp(policy = "O2", property = value, ...)]` and the field attributes
//! `#[amp(fp16)]` / `#[amp(bf16)]` / `#[amp(fp32)]`.

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

/// A precision named in an attribute. The macro's own list of typed-amp's precisions: the
/// generated code names their markers and element types (see `expand::marker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prec {
    F16,
    BF16,
    F32,
}

impl Prec {
    /// Every precision, with the names attributes spell it by (the first is canonical).
    const NAMES: [(Prec, &'static [&'static str]); 3] = [
        (Prec::F16, &["fp16", "f16"]),
        (Prec::BF16, &["bf16"]),
        (Prec::F32, &["fp32", "f32"]),
    ];

    /// The canonical name, as in `#[amp(fp16)]`.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(p, _)| *p == self)
            .map_or("?", |(_, names)| names[0])
    }

    /// The name in messages (`FP16`, `BF16`, `FP32`).
    pub fn upper(self) -> &'static str {
        match self {
            Prec::F16 => "FP16",
            Prec::BF16 => "BF16",
            Prec::F32 => "FP32",
        }
    }

    /// Whether it is a 16-bit precision.
    pub fn is_low(self) -> bool {
        self != Prec::F32
    }

    fn parse(name: &str) -> Option<Prec> {
        let name = name.to_ascii_lowercase();
        Self::NAMES
            .iter()
            .find(|(_, names)| names.contains(&name.as_str()))
            .map(|(p, _)| *p)
    }
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
    pub dtype: Option<Spanned<Prec>>,
    /// `allow_fp16_updates` or `allow_bf16_updates`: the value and the precision it names.
    pub allow_updates: Option<Spanned<(bool, Prec)>>,
    pub custom_forward: Option<Spanned<bool>>,
    /// `fp8 = "hybrid"` or `fp8 = "hybrid-current"`: the FP8 recipe of the linear layers.
    pub fp8: Option<Spanned<Fp8Spec>>,
}

/// An FP8 recipe named by `fp8 = "..."`: `typed_amp::fp8::Hybrid` or `HybridCurrent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Spec {
    Hybrid,
    HybridCurrent,
}

impl Fp8Spec {
    /// The recipe's type name in `typed_amp::fp8`.
    pub fn type_name(self) -> &'static str {
        match self {
            Fp8Spec::Hybrid => "Hybrid",
            Fp8Spec::HybridCurrent => "HybridCurrent",
        }
    }
}

/// The properties an `#[amp]` attribute accepts, for error messages.
pub const PROPERTIES: &str = "policy, dtype, keep_batchnorm_fp32, master_weights, loss_scale, \
                              cast_model_outputs, allow_fp16_updates, allow_bf16_updates, \
                              custom_forward, fp8";

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
            "allow_fp16_updates" | "allow_bf16_updates" => {
                let value = parse_flag(&meta)?;
                let prec = if key == "allow_fp16_updates" {
                    Prec::F16
                } else {
                    Prec::BF16
                };
                if self.allow_updates.is_some() {
                    return Err(Error::new_spanned(
                        &meta.path,
                        "the opt-in to 16-bit updates is given twice",
                    ));
                }
                set(&mut self.allow_updates, (value, prec), span, &meta)
            }
            "dtype" => {
                let lit: LitStr = meta.value()?.parse()?;
                let value = parse_prec(&lit)?;
                if !value.is_low() {
                    return Err(Error::new_spanned(
                        &lit,
                        "`dtype` names the 16-bit precision of O1, O2 and O3: \"fp16\" or \"bf16\"; for FP32 training use policy \"O0\"",
                    ));
                }
                set(&mut self.dtype, value, lit.span(), &meta)
            }
            "fp8" => {
                let lit: LitStr = meta.value()?.parse()?;
                let value = match lit.value().as_str() {
                    "hybrid" => Fp8Spec::Hybrid,
                    "hybrid-current" => Fp8Spec::HybridCurrent,
                    other => {
                        return Err(Error::new_spanned(
                            &lit,
                            format!("unknown FP8 recipe `{other}`: expected \"hybrid\" (E4M3 forward, E5M2 backward, delayed scaling) or \"hybrid-current\" (the same formats, current scaling)"),
                        ))
                    }
                };
                set(&mut self.fp8, value, lit.span(), &meta)
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
    Prec::parse(&lit.value()).ok_or_else(|| {
        Error::new_spanned(
            lit,
            format!(
                "unknown precision `{}`: expected \"fp16\", \"bf16\" or \"fp32\"",
                lit.value()
            ),
        )
    })
}

/// Reads and removes a field's `#[amp(fp16)]` / `#[amp(bf16)]` / `#[amp(fp32)]` attribute.
pub fn take_field_pin(attrs: &mut Vec<Attribute>) -> Result<Option<Spanned<Prec>>> {
    let mut pin: Option<Spanned<Prec>> = None;
    let mut result = Ok(());
    attrs.retain(|attr| {
        if !attr.path().is_ident("amp") {
            return true;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            let prec = match meta.path.get_ident().map(|i| i.to_string()) {
                Some(name) if ["fp16", "bf16", "fp32"].contains(&name.as_str()) => {
                    Prec::parse(&name).expect("listed")
                }
                _ => {
                    return Err(Error::new_spanned(
                        &meta.path,
                        format!(
                            "unknown field property `{}`: a field takes `#[amp(fp16)]`, `#[amp(bf16)]` or `#[amp(fp32)]`",
                            path_text(&meta)
                        ),
                    ))
                }
            };
            if let Some(first) = pin {
                let msg = if first.value == prec {
                    "this field's precision is pinned twice".to_string()
                } else {
                    format!(
                        "a field is pinned to one precision: `{}` and `{}` conflict",
                        first.value.name(),
                        prec.name()
                    )
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
        assert_eq!(
            take_field_pin(&mut attrs).unwrap().unwrap().value,
            Prec::BF16
        );
        let mut attrs: Vec<Attribute> = vec![syn::parse_quote!(#[amp(fp8)])];
        assert!(take_field_pin(&mut attrs)
            .unwrap_err()
            .to_string()
            .contains("unknown field property"));
    }
}
