//! From the attribute as written to the recipe: the policy's defaults (Apex's table), the
//! properties that override them, the conflicts between them, and each layer's precision.

use syn::{Error, Result};

use crate::ast::{Field, Model};
use crate::attr::{AmpArgs, Fp8Spec, LossScaleSpec, OptLevel, Prec};

/// FP16's largest finite value, and the largest static scale `GradScaler` accepts (for any
/// model: the scaler does not know the model's precision).
const MAX_STATIC_SCALE: f32 = 65504.0;

/// The rows of the policy table: how a layer takes part in mixed precision. Which row a layer
/// is in is its `typed_amp::amp::AmpLayer::Kind`; the macro only decides what each row does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// Matrix products (linear, convolution): 16-bit compute under O1, O2 and O3.
    Matmul,
    /// Batch norm and layer norm: FP32 under O1, and under O2 unless `keep_batchnorm_fp32 = false`.
    Norm,
    /// Softmax, log-softmax, exp and log: FP32 except under O3.
    Fp32Op,
    /// Layers with parameters that follow the model's storage precision.
    Elementwise,
    /// Parameterless layers that compute in whatever precision they receive.
    Neutral,
}

impl Row {
    /// The rows in the order of `typed_amp::amp::layer::Table`'s parameters.
    pub const ALL: [Row; 5] = [
        Row::Matmul,
        Row::Norm,
        Row::Fp32Op,
        Row::Elementwise,
        Row::Neutral,
    ];
}

/// How the loss is scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    None,
    Dynamic,
    /// The scale as the generated code holds it (checked after the conversion to `f32`).
    Static(f32),
}

/// What the optimizer trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// FP32 weights and nothing else (O0, O1): `Fp32Weights`.
    Fp32,
    /// FP32 master weights behind a working copy (O2): `MasterWeights`.
    MasterWeights,
    /// 16-bit weights updated directly (O3's opt-in): `SinglePrecision` in the model's dtype.
    LowPrecision,
}

/// The recipe the model is compiled with.
#[derive(Debug, Clone)]
pub struct Recipe {
    pub opt_level: OptLevel,
    /// The 16-bit precision of O1's compute and of O2's and O3's layers (`dtype`, FP16 by
    /// default).
    pub low: Prec,
    /// The narrowest precision any layer computes in: whether the step needs a loss scaler
    /// (FP16) or not (BF16, FP32).
    pub narrowest: Prec,
    pub keep_batchnorm_fp32: bool,
    pub loss_scale: LossScale,
    pub cast_model_outputs: Option<Prec>,
    pub custom_forward: bool,
    pub target: Target,
    /// The FP8 recipe of the linear layers, if any (O2 with master weights and BF16 only).
    pub fp8: Option<Fp8Spec>,
}

impl Recipe {
    /// Inputs are cast to this precision at the model's entry (Apex casts O2 and O3 inputs to
    /// the model's 16-bit precision; O0 and O1 take FP32).
    pub fn entry(&self) -> Prec {
        match self.opt_level {
            OptLevel::O0 | OptLevel::O1 => Prec::F32,
            OptLevel::O2 | OptLevel::O3 => self.low,
        }
    }

    /// Whether the working model is a separate struct (a copy in other precisions) rather than
    /// the FP32 master itself.
    pub fn separate_working(&self) -> bool {
        matches!(self.opt_level, OptLevel::O2 | OptLevel::O3)
    }
}

/// How a layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// In whatever precision it receives (no cast before it).
    Pass,
    /// In this precision, its parameters stored in it.
    In(Prec),
    /// In this 16-bit precision from FP32 parameters cast for the pass (O1).
    Autocast(Prec),
    /// Activations in this 16-bit precision, parameters and arithmetic in FP32 (a norm under
    /// `keep_batchnorm_fp32`).
    KeepFp32(Prec),
    /// Parameters and activations in this 16-bit precision, linear layers' products with FP8
    /// operands by the recipe (`fp8 = ...`).
    Fp8(Prec, Fp8Spec),
}

/// A layer's storage and compute precision under the recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPlan {
    pub storage: Prec,
    pub compute: Compute,
}

/// Applies the policy's defaults and the properties, rejecting conflicts.
pub fn recipe(args: &AmpArgs, model: &Model) -> Result<Recipe> {
    let Some(policy) = args.policy else {
        return Err(Error::new_spanned(
            &model.ident,
            "#[amp] needs a policy: `#[amp(policy = \"O0\" | \"O1\" | \"O2\" | \"O3\")]`",
        ));
    };
    let level = policy.value;
    let name = level.name();
    let low = match (level, args.dtype) {
        (OptLevel::O0, Some(dtype)) => {
            return Err(Error::new(
                dtype.span,
                format!("O0 trains in FP32 only: `dtype = \"{}\"` chooses the 16-bit precision of O1, O2 and O3", dtype.value.name()),
            ))
        }
        (_, Some(dtype)) => dtype.value,
        (_, None) => Prec::F16,
    };
    // Both end up in `target`, which is all the expansion reads.
    let mut master_weights = level == OptLevel::O2;
    let allow_updates = args.allow_updates.is_some_and(|a| a.value.0);
    let mut recipe = Recipe {
        opt_level: level,
        low,
        narrowest: Prec::F32,
        keep_batchnorm_fp32: level != OptLevel::O3,
        loss_scale: LossScale::None,
        cast_model_outputs: args.cast_model_outputs.map(|c| c.value),
        custom_forward: args.custom_forward.is_some_and(|a| a.value),
        target: Target::Fp32,
        fp8: None,
    };

    if let Some(keep) = args.keep_batchnorm_fp32 {
        match level {
            OptLevel::O0 if !keep.value => {
                return Err(Error::new(keep.span, "O0 keeps every layer in FP32: `keep_batchnorm_fp32 = false` conflicts with it"))
            }
            OptLevel::O1 if !keep.value => {
                return Err(Error::new(keep.span, "O1 runs norms in FP32 by its op lists: `keep_batchnorm_fp32 = false` conflicts with it (pin a norm with `#[amp(fp16)]` instead)"))
            }
            _ => recipe.keep_batchnorm_fp32 = keep.value,
        }
    }
    if let Some(master) = args.master_weights {
        if master.value && matches!(level, OptLevel::O0 | OptLevel::O1) {
            return Err(Error::new(
                master.span,
                format!("{name} keeps the weights in FP32: there is no 16-bit copy for `master_weights = true` to back"),
            ));
        }
        master_weights = master.value;
    }
    if let Some(allow) = args.allow_updates.filter(|a| a.value.0) {
        let named = allow.value.1;
        let property = format!("allow_{}_updates", named.name());
        if matches!(level, OptLevel::O0 | OptLevel::O1) {
            return Err(Error::new(
                allow.span,
                format!("{name} keeps the weights in FP32: `{property}` has nothing to allow"),
            ));
        }
        if master_weights {
            return Err(Error::new(
                allow.span,
                format!("`{property}` conflicts with FP32 master weights: with master weights the optimizer updates FP32, so drop one of the two"),
            ));
        }
        if named != low {
            return Err(Error::new(
                allow.span,
                format!(
                    "the model's dtype is {}: its opt-in to 16-bit updates is `allow_{}_updates`",
                    low.upper(),
                    low.name()
                ),
            ));
        }
    }
    recipe.target = if matches!(level, OptLevel::O0 | OptLevel::O1) {
        Target::Fp32
    } else if master_weights {
        Target::MasterWeights
    } else if allow_updates {
        Target::LowPrecision
    } else {
        let span = args.master_weights.map_or(policy.span, |m| m.span);
        return Err(Error::new(
            span,
            format!("{name} without master weights would have the optimizer update {} weights, breaking the rule that optimizers update only FP32 master weights (small updates round away in 16 bits); add `allow_{}_updates` to opt in explicitly, or `master_weights = true`", low.upper(), low.name()),
        ));
    };
    if recipe.target == Target::LowPrecision && recipe.keep_batchnorm_fp32 {
        let span = args.keep_batchnorm_fp32.map_or(policy.span, |k| k.span);
        return Err(Error::new(
            span,
            format!("without master weights every layer is {} and updated as such: `keep_batchnorm_fp32 = true` needs `master_weights = true`", low.upper()),
        ));
    }
    for field in &model.fields {
        check_pins(&recipe, field)?;
    }
    if let Some(fp8) = args.fp8 {
        // The recipes' other half is O2-BF16: FP32 masters (an FP8 product's rounding would
        // swallow small updates of anything narrower), BF16 activations between the products
        // (FP32's range, so no loss scale on top of the FP8 scales).
        if level != OptLevel::O2 || recipe.target != Target::MasterWeights || low != Prec::BF16 {
            return Err(Error::new(
                fp8.span,
                format!("FP8 linear layers are a recipe on top of O2-BF16 (FP32 master weights, BF16 activations, FP32 norms, softmax and loss): `fp8` needs `policy = \"O2\", dtype = \"bf16\"` with master weights, not {name}{}{}", if low == Prec::BF16 || level == OptLevel::O0 { "" } else { "-FP16" }, if recipe.target == Target::MasterWeights || level != OptLevel::O2 { "" } else { " without master weights" }),
            ));
        }
        recipe.fp8 = Some(fp8.value);
    }
    // FP16 anywhere (the dtype, or a layer pinned to it) needs a dynamic loss scale; BF16 and
    // FP32 have FP32's exponent range and need none.
    recipe.narrowest = match level {
        OptLevel::O0 => Prec::F32,
        _ if low == Prec::F16 => Prec::F16,
        _ if model
            .fields
            .iter()
            .any(|f| f.pin.is_some_and(|p| p.value == Prec::F16)) =>
        {
            Prec::F16
        }
        _ => low,
    };
    recipe.loss_scale = match (level, recipe.narrowest) {
        (OptLevel::O0, _) | (_, Prec::BF16 | Prec::F32) => LossScale::None,
        (OptLevel::O3, _) => LossScale::Static(1.0),
        _ => LossScale::Dynamic,
    };
    if let Some(scale) = args.loss_scale {
        recipe.loss_scale = match scale.value {
            LossScaleSpec::Dynamic => LossScale::Dynamic,
            LossScaleSpec::Static(value) => {
                // Checked as the generated code holds it: `1e-50` is positive as written but
                // 0 in `f32`, and `65519.999` rounds up to 65520.
                let v = value as f32;
                // A finite literal beyond `f32`'s range becomes inf: that one overflows FP16.
                if !(value.is_finite() && v > 0.0) {
                    return Err(Error::new(
                        scale.span,
                        "a static loss scale must be finite and positive",
                    ));
                }
                if v > MAX_STATIC_SCALE {
                    let message = if recipe.narrowest == Prec::F16 {
                        format!("a static loss scale of {value} overflows FP16 (largest finite value 65504): every FP16 gradient it multiplies becomes inf and every step is skipped; use a scale of at most 65504 or `loss_scale = \"dynamic\"`")
                    } else {
                        // `GradScaler::with_static_scale` refuses it whatever the model: refused
                        // here, `AmpModel::scaler()` cannot fail at run time.
                        format!("a static loss scale of {value} is above 65504, FP16's largest finite value, which `GradScaler` refuses as a static scale; a BF16 model needs no loss scale: use a scale of at most 65504 or `loss_scale = \"dynamic\"`")
                    };
                    return Err(Error::new(scale.span, message));
                }
                LossScale::Static(v)
            }
        };
    }
    Ok(recipe)
}

fn check_pins(recipe: &Recipe, field: &Field) -> Result<()> {
    let Some(pin) = field.pin else { return Ok(()) };
    match (recipe.opt_level, recipe.target, pin.value) {
        (OptLevel::O0, _, p) if p.is_low() => Err(Error::new(
            pin.span,
            format!(
                "O0 trains in FP32 only: pinning a layer to {} needs O1 or O2",
                p.upper()
            ),
        )),
        (_, Target::LowPrecision, p) if p != recipe.low => Err(Error::new(
            pin.span,
            format!(
                "without master weights every layer is {} and updated as such: a {} layer needs `master_weights = true`",
                recipe.low.upper(),
                p.upper()
            ),
        )),
        _ => Ok(()),
    }
}

/// The storage and compute precision of a layer in row `kind`, or of a layer pinned to `pin`
/// (whatever its row).
pub fn plan_layer(recipe: &Recipe, kind: Row, pin: Option<Prec>) -> LayerPlan {
    use OptLevel::*;
    let level = recipe.opt_level;
    let low = recipe.low;
    let at = |p: Prec| LayerPlan {
        storage: p,
        compute: Compute::In(p),
    };
    if let Some(p) = pin {
        return match (level, p) {
            // O1 keeps weights in FP32; a 16-bit pin means 16-bit compute from FP32 weights.
            (O1, Prec::F16 | Prec::BF16) => LayerPlan {
                storage: Prec::F32,
                compute: Compute::Autocast(p),
            },
            (O0 | O1, _) => at(Prec::F32),
            _ => at(p),
        };
    }
    match (level, kind) {
        (O0 | O1, Row::Neutral) => LayerPlan {
            storage: Prec::F32,
            compute: Compute::Pass,
        },
        (O0, _) => at(Prec::F32),
        (O1, Row::Matmul) => LayerPlan {
            storage: Prec::F32,
            compute: Compute::Autocast(low),
        },
        (O1, _) => at(Prec::F32),
        (O2 | O3, Row::Norm) if recipe.keep_batchnorm_fp32 => LayerPlan {
            storage: Prec::F32,
            compute: Compute::KeepFp32(low),
        },
        (O2 | O3, Row::Norm) => at(low),
        (O2, Row::Fp32Op) => at(Prec::F32),
        (O2 | O3, Row::Neutral) => LayerPlan {
            storage: low,
            compute: Compute::Pass,
        },
        (O2, Row::Matmul) if recipe.fp8.is_some() => LayerPlan {
            storage: low,
            compute: Compute::Fp8(low, recipe.fp8.unwrap_or(Fp8Spec::Hybrid)),
        },
        (O2 | O3, _) => at(low),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::parse_model;
    use syn::parse::Parser;

    fn recipe_of(args: proc_macro2::TokenStream) -> Result<Recipe> {
        let mut parsed = AmpArgs::default();
        syn::meta::parser(|meta| parsed.parse_meta(meta)).parse2(args)?;
        let model = parse_model(syn::parse_quote!(
            struct Net {
                fc: Linear<2, 2>,
                bn: BatchNorm1D<2>,
            }
        ))?;
        recipe(&parsed, &model)
    }

    #[test]
    fn policies_follow_apex_defaults() {
        let o2 = recipe_of(quote::quote!(policy = "O2")).unwrap();
        assert_eq!(
            (o2.target, o2.keep_batchnorm_fp32, o2.loss_scale),
            (Target::MasterWeights, true, LossScale::Dynamic)
        );
        assert_eq!(o2.entry(), Prec::F16);
        let o0 = recipe_of(quote::quote!(policy = "O0")).unwrap();
        assert_eq!((o0.target, o0.loss_scale), (Target::Fp32, LossScale::None));
        let o3 = recipe_of(quote::quote!(policy = "O3", allow_fp16_updates)).unwrap();
        assert_eq!(
            (o3.target, o3.keep_batchnorm_fp32, o3.loss_scale),
            (Target::LowPrecision, false, LossScale::Static(1.0))
        );
        let o3m = recipe_of(quote::quote!(policy = "O3", master_weights = true)).unwrap();
        assert_eq!(o3m.target, Target::MasterWeights);
    }

    #[test]
    fn layers_get_the_tables_precisions() {
        let o2 = recipe_of(quote::quote!(policy = "O2")).unwrap();
        assert_eq!(
            plan_layer(&o2, Row::Matmul, None),
            LayerPlan {
                storage: Prec::F16,
                compute: Compute::In(Prec::F16)
            }
        );
        assert_eq!(
            plan_layer(&o2, Row::Norm, None),
            LayerPlan {
                storage: Prec::F32,
                compute: Compute::KeepFp32(Prec::F16)
            }
        );
        assert_eq!(
            plan_layer(&o2, Row::Fp32Op, None).compute,
            Compute::In(Prec::F32)
        );
        let o1 = recipe_of(quote::quote!(policy = "O1")).unwrap();
        assert_eq!(
            plan_layer(&o1, Row::Matmul, None),
            LayerPlan {
                storage: Prec::F32,
                compute: Compute::Autocast(Prec::F16)
            }
        );
        assert_eq!(
            plan_layer(&o1, Row::Norm, None).compute,
            Compute::In(Prec::F32)
        );
        let o2_fp16_bn =
            recipe_of(quote::quote!(policy = "O2", keep_batchnorm_fp32 = false)).unwrap();
        assert_eq!(plan_layer(&o2_fp16_bn, Row::Norm, None).storage, Prec::F16);
        assert_eq!(
            plan_layer(&o2, Row::Matmul, Some(Prec::F32)).storage,
            Prec::F32
        );
    }

    #[test]
    fn bf16_models_need_no_loss_scale_unless_a_layer_is_fp16() {
        let o2 = recipe_of(quote::quote!(policy = "O2", dtype = "bf16")).unwrap();
        assert_eq!(
            (o2.low, o2.narrowest, o2.loss_scale),
            (Prec::BF16, Prec::BF16, LossScale::None)
        );
        assert_eq!(o2.entry(), Prec::BF16);
        assert_eq!(plan_layer(&o2, Row::Matmul, None).storage, Prec::BF16);
        assert_eq!(plan_layer(&o2, Row::Norm, None).storage, Prec::F32);
        let o1 = recipe_of(quote::quote!(policy = "O1", dtype = "bf16")).unwrap();
        assert_eq!(
            plan_layer(&o1, Row::Matmul, None).compute,
            Compute::Autocast(Prec::BF16)
        );
        assert_eq!(o1.loss_scale, LossScale::None);
        let o3 = recipe_of(quote::quote!(
            policy = "O3",
            dtype = "bf16",
            allow_bf16_updates
        ))
        .unwrap();
        assert_eq!(
            (o3.target, o3.loss_scale),
            (Target::LowPrecision, LossScale::None)
        );
        // A BF16 model may run a layer in FP16 (with the casts the forward inserts): then it
        // needs the loss scaler.
        let mut parsed = AmpArgs::default();
        syn::meta::parser(|meta| parsed.parse_meta(meta))
            .parse2(quote::quote!(policy = "O2", dtype = "bf16"))
            .unwrap();
        let model = parse_model(syn::parse_quote!(
            struct Net {
                #[amp(fp16)]
                fc: Linear<2, 2>,
                head: Linear<2, 2>,
            }
        ))
        .unwrap();
        let mixed = recipe(&parsed, &model).unwrap();
        assert_eq!(
            (mixed.narrowest, mixed.loss_scale),
            (Prec::F16, LossScale::Dynamic)
        );
    }

    #[test]
    fn conflicts_are_errors() {
        let msg = |args| recipe_of(args).unwrap_err().to_string();
        assert!(msg(quote::quote!(policy = "O3")).contains("allow_fp16_updates"));
        assert!(
            msg(quote::quote!(policy = "O2", master_weights = false)).contains("breaking the rule")
        );
        assert!(msg(quote::quote!(policy = "O1", master_weights = true)).contains("no 16-bit copy"));
        assert!(
            msg(quote::quote!(policy = "O0", keep_batchnorm_fp32 = false))
                .contains("O0 keeps every layer")
        );
        assert!(msg(quote::quote!(policy = "O2", allow_fp16_updates))
            .contains("conflicts with FP32 master weights"));
        assert!(msg(quote::quote!(
            policy = "O3",
            allow_fp16_updates,
            keep_batchnorm_fp32 = true
        ))
        .contains("needs `master_weights = true`"));
        assert!(msg(quote::quote!(policy = "O2", loss_scale = 65536.0)).contains("overflows FP16"));
        assert!(recipe_of(quote::quote!(policy = "O2", loss_scale = 65504)).is_ok());
        // Checked in f32, as the generated code holds it.
        assert!(
            msg(quote::quote!(policy = "O2", loss_scale = 1e-50)).contains("finite and positive")
        );
        assert!(
            msg(quote::quote!(policy = "O2", loss_scale = 65519.999)).contains("overflows FP16")
        );
        assert!(msg(quote::quote!(policy = "O2", loss_scale = 1e40)).contains("overflows FP16"));
        // Above 65504 but below 65520 (the first value FP16 rounds to inf): `GradScaler` refuses it.
        assert!(msg(quote::quote!(policy = "O2", loss_scale = 65505)).contains("overflows FP16"));
        assert!(msg(quote::quote!(
            policy = "O2",
            dtype = "bf16",
            loss_scale = 70000.0
        ))
        .contains("is above 65504"));
        assert!(msg(quote::quote!(loss_scale = 8.0)).contains("needs a policy"));
        assert!(
            msg(quote::quote!(policy = "O0", dtype = "bf16")).contains("O0 trains in FP32 only")
        );
        assert!(msg(quote::quote!(
            policy = "O3",
            dtype = "bf16",
            allow_fp16_updates
        ))
        .contains("`allow_bf16_updates`"));
        assert!(msg(quote::quote!(policy = "O3", dtype = "bf16")).contains("update BF16 weights"));
    }
}
