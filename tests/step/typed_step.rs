//! The typed step's run-time behaviour: non-finite gradients are found wherever they arise, a
//! skipped step changes nothing, and the dynamic scaler recovers from FP16 overflow.

use typed_amp::dfdx::nn::builders::Linear;
use typed_amp::dfdx::optim::{Adam, Sgd};
use typed_amp::loss::cross_entropy_with_logits_loss;
use typed_amp::master::Fp32Weights;
use typed_amp::nn::builders::{ToF16, ToF32};
use typed_amp::params::Parameters;
use typed_amp::precision::DType;
use typed_amp::prelude::*;
use typed_amp::step::ScaledGrads;
use typed_amp::tape::MixedGradients;

use crate::common;
use common::{inject, param_bytes};

type Mlp = (Linear<6, 8>, ReLU, Linear<8, 8>, ReLU, Linear<8, 3>);
type Model = MasterWeights<
    <Mlp as BuildOnDevice<Cpu, f32>>::Built,
    <Mlp as BuildOnDevice<Cpu, f16>>::Built,
    Cpu,
>;

fn model(seed: u64) -> (Cpu, Model) {
    let dev = Cpu::seed_from_u64(seed);
    let model = MasterWeights::build::<Mlp>(&dev).unwrap();
    (dev, model)
}

fn batch(dev: &Cpu) -> (Tensor<Rank2<4, 6>, f16, Cpu>, Tensor<Rank2<4, 3>, f32, Cpu>) {
    let x: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
    let y = dev.tensor([
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
        [1.0, 0.0, 0.0],
    ]);
    (x.to_dtype::<f16>(), y)
}

fn backward(
    scaler: &GradScaler,
    model: &Model,
    x: Tensor<Rank2<4, 6>, f16, Cpu>,
    y: Tensor<Rank2<4, 3>, f32, Cpu>,
) -> ScaledGrads<Cpu> {
    let logits = model
        .working()
        .forward(x.traced_mixed(model.alloc_grads().unwrap()));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
    scaler.scale(loss).backward().unwrap()
}

fn master_bits(model: &Model) -> Vec<u32> {
    let m = model.master();
    [
        m.0.weight.as_vec(),
        m.0.bias.as_vec(),
        m.2.weight.as_vec(),
        m.2.bias.as_vec(),
        m.4.weight.as_vec(),
        m.4.bias.as_vec(),
    ]
    .concat()
    .into_iter()
    .map(f32::to_bits)
    .collect()
}

#[test]
fn inf_or_nan_in_the_input_is_found_and_the_step_skipped() {
    for bad in [f32::INFINITY, f32::NAN] {
        let (dev, mut model) = model(10);
        let mut opt = Sgd::new(model.master(), SgdConfig::default());
        let scaler = GradScaler::default();
        let (x, y) = batch(&dev);
        let mut values = x.as_vec();
        values[5] = f16::from_f32(bad);
        let x = dev.tensor_from_vec(values, (Const::<4>, Const::<6>));
        let before = master_bits(&model);
        let unscaled = {
            let grads = backward(&scaler, &model, x, y);
            scaler.unscale(&mut model, grads)
        }
        .unwrap();
        assert!(unscaled.found_inf(), "{bad} in the input");
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        assert!(outcome.skipped());
        assert_eq!(master_bits(&model), before);
    }
}

#[test]
fn a_non_finite_gradient_in_any_layer_is_found_and_blamed_by_name() {
    let (dev, mut model) = model(11);
    let scaler = GradScaler::default();
    let cases: [(&str, f32); 6] = [
        ("0.weight", f32::INFINITY),
        ("0.bias", f32::NAN),
        ("2.weight", f32::NEG_INFINITY),
        ("2.bias", f32::INFINITY),
        ("4.weight", f32::NAN),
        ("4.bias", f32::INFINITY),
    ];
    for (path, value) in cases {
        let (x, y) = batch(&dev);
        let mut grads = backward(&scaler, &model, x, y);
        let w = model.working();
        match path {
            "0.weight" => inject(grads.grads_mut(), &w.0.weight, value),
            "0.bias" => inject(grads.grads_mut(), &w.0.bias, value),
            "2.weight" => inject(grads.grads_mut(), &w.2.weight, value),
            "2.bias" => inject(grads.grads_mut(), &w.2.bias, value),
            "4.weight" => inject(grads.grads_mut(), &w.4.weight, value),
            _ => inject(grads.grads_mut(), &w.4.bias, value),
        }
        let unscaled = scaler.unscale(&mut model, grads).unwrap();
        assert!(unscaled.found_inf(), "{value} in {path}");
        assert_eq!(unscaled.non_finite_params(), [path.to_string()]);
    }
    // And a clean backward finds nothing.
    let (x, y) = batch(&dev);
    let unscaled = {
        let grads = backward(&scaler, &model, x, y);
        scaler.unscale(&mut model, grads)
    }
    .unwrap();
    assert!(!unscaled.found_inf() && unscaled.non_finite_params().is_empty());
}

#[test]
fn fp32_parameters_of_a_mixed_model_are_checked_too() {
    // An FP32 layer (as batch norm is under O2) inside an FP16 model.
    let dev = Cpu::seed_from_u64(12);
    let master = dev.build_module::<(Linear<6, 8>, Linear<8, 3>), f32>();
    let working = (
        dev.build_module::<Linear<6, 8>, f16>(),
        dev.build_module::<Linear<8, 3>, f32>(),
    );
    let mut model = MasterWeights::from_parts(master, working, &dev).unwrap();
    let scaler = GradScaler::default();
    let (x, y) = batch(&dev);
    let logits = model.working().1.forward(
        model
            .working()
            .0
            .forward(x.traced_mixed(model.alloc_grads().unwrap()))
            .to_f32(),
    );
    let mut grads = scaler
        .scale(cross_entropy_with_logits_loss(logits, y))
        .backward()
        .unwrap();
    inject(grads.grads_mut(), &model.working().1.weight, f32::NAN);
    let unscaled = scaler.unscale(&mut model, grads).unwrap();
    assert_eq!(unscaled.non_finite_params(), ["1.weight".to_string()]);
}

#[test]
fn a_skipped_step_leaves_master_weights_and_optimizer_state_untouched() {
    let (dev, mut model) = model(13);
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();

    // One real step so that Adam has moments and a step count.
    let (x, y) = batch(&dev);
    let unscaled = {
        let grads = backward(&scaler, &model, x, y);
        scaler.unscale(&mut model, grads)
    }
    .unwrap();
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    assert!(!outcome.skipped());
    scaler.update(outcome).unwrap();

    // A twin that will never see the overflowing step.
    let mut twin_model = MasterWeights::from_parts(
        model.master().clone(),
        model.working().clone().into_inner(),
        &dev,
    )
    .unwrap();
    let mut twin_opt = opt.clone();
    let before = master_bits(&model);

    let (x, y) = batch(&dev);
    let mut grads = backward(&scaler, &model, x, y);
    inject(grads.grads_mut(), &model.working().2.weight, f32::INFINITY);
    let unscaled = scaler.unscale(&mut model, grads).unwrap();
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    assert!(outcome.skipped());
    // Every outcome reaches the update before the model's next backward.
    scaler.update(outcome).unwrap();
    assert_eq!(
        master_bits(&model),
        before,
        "master weights changed on a skipped step"
    );
    let f16_bits = |m: &Model| {
        m.working()
            .2
            .weight
            .as_vec()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        f16_bits(&model),
        f16_bits(&twin_model),
        "working copy changed on a skipped step"
    );

    // If Adam's state had moved, the next real step would differ from the twin's.
    let (x, y) = batch(&dev);
    for (model, opt) in [(&mut model, &mut opt), (&mut twin_model, &mut twin_opt)] {
        let unscaled = {
            let grads = backward(&scaler, model, x.clone(), y.clone());
            scaler.unscale(model, grads)
        }
        .unwrap();
        assert!(!scaler.step(opt, unscaled).unwrap().skipped());
    }
    assert_eq!(master_bits(&model), master_bits(&twin_model));
}

#[test]
fn fp16_overflow_backs_the_scale_off_until_steps_succeed() {
    let (dev, mut model) = model(14);
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    // A scale so large that the FP16 gradients overflow.
    let mut scaler = GradScaler::new(2f32.powi(40), 2.0, 0.5, 2000).unwrap();
    let mut skipped = 0;
    for _ in 0..40 {
        let (x, y) = batch(&dev);
        let unscaled = {
            let grads = backward(&scaler, &model, x, y);
            scaler.unscale(&mut model, grads)
        }
        .unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        let skipped_now = outcome.skipped();
        scaler.update(outcome).unwrap();
        if !skipped_now {
            break;
        }
        skipped += 1;
    }
    assert!(skipped > 0, "2^40 must overflow FP16 gradients");
    assert!(skipped < 40, "no step succeeded within 40 tries");
    assert_eq!(scaler.get_scale(), 2f32.powi(40 - skipped));
    assert_eq!(scaler.skipped_steps(), skipped as u64);
    // The largest FP16 value is 65504; a working gradient scaled by the final scale fits.
    assert!(scaler.get_scale() <= 2f32.powi(30));
}

#[test]
fn clipping_works_on_unscaled_master_gradients() {
    let (dev, mut model) = model(15);
    let scaler = GradScaler::default();
    let (x, y) = batch(&dev);
    let mut unscaled = {
        let grads = backward(&scaler, &model, x, y);
        scaler.unscale(&mut model, grads)
    }
    .unwrap();
    let norm = unscaled.global_norm().unwrap();
    let by_hand: f32 = unscaled
        .to_host()
        .unwrap()
        .iter()
        .flat_map(|(_, g)| g.iter().map(|x| x * x))
        .sum::<f32>()
        .sqrt();
    approx::assert_relative_eq!(norm, by_hand, max_relative = 1e-5);

    let returned = clip_grad_norm(&mut unscaled, norm / 4.0).unwrap();
    assert_eq!(returned, norm);
    approx::assert_relative_eq!(
        unscaled.global_norm().unwrap(),
        norm / 4.0,
        max_relative = 1e-4
    );

    clip_grad_value(&mut unscaled, 1e-3).unwrap();
    let max = unscaled
        .to_host()
        .unwrap()
        .iter()
        .flat_map(|(_, g)| g.clone())
        .fold(0f32, |m, x| m.max(x.abs()));
    assert!(max <= 1e-3);
    assert!(clip_grad_norm(&mut unscaled, -1.0).is_err());
}

#[test]
fn gradients_of_temporaries_do_not_outlive_backward() {
    // An FP16 model has no FP32 parameter, yet its FP32 gradient store receives the gradients
    // of the FP32 input and logits; they must be freed, or every step leaks an input's worth.
    let (dev, model) = model(16);
    let scaler = GradScaler::default();
    let x32: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
    let y = batch(&dev).1;
    let x = x32
        .clone()
        .traced_mixed(model.alloc_grads().unwrap())
        .to_f16();
    let logits = model.working().forward(x).to_f32();
    let grads = scaler
        .scale(cross_entropy_with_logits_loss(logits, y))
        .backward()
        .unwrap();
    assert!(
        grads.grads().get(&x32).is_none(),
        "the input's gradient was kept"
    );
    assert!(grads.grads().get(&model.working().0.weight).is_some());
}

/// Gradients know their model: unscaling them into another model, or unscaling gradients no
/// model allocated, is refused before anything changes.
#[test]
fn gradients_are_unscaled_only_into_the_model_that_allocated_them() {
    let (dev, mut model) = model(16);
    let (_, mut other) = self::model(17);
    let scaler = GradScaler::default();
    let (x, y) = batch(&dev);
    let before = master_bits(&other);
    let grads = backward(&scaler, &model, x.clone(), y.clone());
    let err = scaler.unscale(&mut other, grads).unwrap_err();
    assert!(matches!(err, AmpError::ForeignGradients(_)), "{err}");
    assert!(err.to_string().contains("another model"), "{err}");
    assert_eq!(master_bits(&other), before);

    let logits = model
        .working()
        .forward(x.traced_mixed(MixedGradients::leaky()));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
    let grads = scaler.scale(loss).backward().unwrap();
    let err = scaler.unscale(&mut model, grads).unwrap_err();
    assert!(err.to_string().contains("alloc_grads"), "{err}");
}

/// The inf/NaN check runs whatever the scaler's mode: a disabled scaler (scale 1, no scale
/// changes) still skips a step whose gradients hold NaN. (Disabled scalers are for models with
/// FP32's exponent range: an FP16 model through one is refused, see
/// `fp16_gradients_without_an_enabled_scaler_are_refused_before_anything_changes`.)
#[test]
fn a_disabled_scaler_still_skips_a_non_finite_step() {
    let dev = Cpu::seed_from_u64(18);
    let mut model = Fp32Weights::build::<Mlp>(&dev).unwrap();
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::disabled();
    let (x, y) = batch(&dev);
    let x = x.to_dtype::<f32>();
    let logits = model
        .working()
        .forward(x.traced_mixed(model.alloc_grads().unwrap()));
    let loss = cross_entropy_with_logits_loss(logits, y);
    let mut grads = scaler.scale(loss).backward().unwrap();
    inject(grads.grads_mut(), &model.working().0.weight, f32::NAN);
    let before = fp32_bits(&model);
    let unscaled = scaler.unscale(&mut model, grads).unwrap();
    assert_eq!(unscaled.non_finite_params(), ["0.weight".to_string()]);
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    assert!(outcome.skipped());
    scaler.update(outcome).unwrap();
    assert_eq!(fp32_bits(&model), before);
    assert_eq!(scaler.get_scale(), 1.0, "a disabled scaler keeps scale 1");
}

/// A finite gradient whose square overflows FP32 (|g| > 2^64) used to be stepped on: Adam's
/// second moment became inf, and a checkpoint of it was refused by its own run's `--resume`.
/// Any magnitude above `GRADIENT_LIMIT` (2^62) is an overflow: the step is skipped, master
/// weights and Adam's state unchanged; one at the limit steps, its state finite.
#[test]
fn a_finite_gradient_whose_square_overflows_fp32_is_skipped_like_an_overflow() {
    use typed_amp::optim::OptimizerState;
    use typed_amp::step::GRADIENT_LIMIT;
    assert_eq!(GRADIENT_LIMIT, 2f32.powi(62));
    let dev = Cpu::seed_from_u64(19);
    let mut model = Fp32Weights::build::<Mlp>(&dev).unwrap();
    let mut opt = Adam::new(model.master(), Default::default());
    let mut scaler = GradScaler::disabled();
    let (x, y) = batch(&dev);
    let x = x.to_dtype::<f32>();
    for (value, skipped) in [(2e19f32, true), (-3e38, true), (GRADIENT_LIMIT, false)] {
        let logits = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let mut grads = scaler.scale(loss).backward().unwrap();
        inject(grads.grads_mut(), &model.working().0.weight, value);
        let before = fp32_bits(&model);
        let unscaled = scaler.unscale(&mut model, grads).unwrap();
        assert_eq!(unscaled.found_inf(), skipped, "{value}");
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        assert_eq!(outcome.skipped(), skipped, "{value}");
        if skipped {
            assert_eq!(outcome.non_finite_params(), ["0.weight".to_string()]);
            assert_eq!(
                fp32_bits(&model),
                before,
                "{value}: a skipped step changes nothing"
            );
            assert_eq!(opt.scalars(), vec![("step_count", 0)]);
        }
        scaler.update(outcome).unwrap();
    }
    assert_eq!(opt.scalars(), vec![("step_count", 1)]);
    // The step at the limit: every moment finite (its square is 2^124).
    let (m1, m2) = opt.moments();
    for store in [m1, m2] {
        let v = store.get(&model.master().0.weight).as_vec();
        assert!(v.iter().all(|x| x.is_finite()), "{v:?}");
    }
}

type Fp32Mlp = Fp32Weights<<Mlp as BuildOnDevice<Cpu, f32>>::Built, Cpu>;

fn fp32_bits<M: Parameters<Cpu>>(model: &Fp32Weights<M, Cpu>) -> Vec<(String, DType, Vec<u8>)> {
    param_bytes(model.master())
}

/// Rule `FullRange` is decided by the precision the gradients were computed in, not by what a
/// model declares: gradients that a backward pass computed in FP16 need an enabled loss scaler
/// (dynamic, or static), and without one the step is refused before anything is unscaled, so
/// weights and optimizer state are untouched. Three ways to get FP16 gradients without a scale:
/// an FP16 model through `GradScaler::disabled()`, and an FP32 model with FP16 layers inside
/// (`ToF16` … `ToF32`) through the scaler-free `check` or a disabled scaler.
#[test]
fn fp16_gradients_without_an_enabled_scaler_are_refused_before_anything_changes() {
    fn refused<T>(result: Result<T, AmpError>) -> String {
        let Err(err) = result else {
            panic!("FP16 gradients without a loss scale were accepted")
        };
        let message = err.to_string();
        assert!(
            matches!(err, AmpError::Fp16GradientsNeedALossScale { .. }),
            "{message}"
        );
        assert!(
            message.contains("rule `FullRange`") && message.contains("GradScaler::dynamic()"),
            "the message names the rule and the fix: {message}"
        );
        message
    }

    // An FP16 model through a disabled scaler.
    let (dev, mut model) = model(31);
    let scaler = GradScaler::disabled();
    let (x, y) = batch(&dev);
    let grads = backward(&scaler, &model, x.clone(), y.clone());
    let before = master_bits(&model);
    let working_before = param_bytes(model.working());
    let message = refused(scaler.unscale(&mut model, grads));
    assert!(message.contains("working precision is F16"), "{message}");
    assert_eq!(master_bits(&model), before);
    assert_eq!(param_bytes(model.working()), working_before);
    // A static scale of 1 is a scaler (it checks and skips): the same step is taken.
    let mut scaler = GradScaler::with_static_scale(1.0).unwrap();
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let grads = backward(&scaler, &model, x, y);
    let outcome = scaler
        .step(&mut opt, scaler.unscale(&mut model, grads).unwrap())
        .unwrap();
    assert!(!outcome.skipped());
    scaler.update(outcome).unwrap();
    assert_ne!(master_bits(&model), before);

    // An FP32 model (rule `FullRange` holds for its declared F32) with FP16 activations inside.
    type CastInside = (Linear<6, 8>, ToF16, ReLU, ToF32, Linear<8, 3>);
    let dev = Cpu::seed_from_u64(32);
    type CastModel = Fp32Weights<<CastInside as BuildOnDevice<Cpu, f32>>::Built, Cpu>;
    let mut model: CastModel = Fp32Weights::build::<CastInside>(&dev).unwrap();
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let (x, y) = batch(&dev);
    let x = x.to_dtype::<f32>();
    let forward = |model: &CastModel| {
        let logits = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        cross_entropy_with_logits_loss(logits, y.clone())
    };
    let before = fp32_bits(&model);
    // The scaler-free path: the compiler accepts it (F32 is `FullRange`), the gradients do not.
    let raw = forward(&model).backward().unwrap();
    assert_eq!(raw.grads().computed_in_narrow_range(), Some(DType::F16));
    let message = refused(raw.check(&mut model));
    assert!(message.contains("computed gradients in FP16"), "{message}");
    // A disabled scaler.
    let scaler = GradScaler::disabled();
    let grads = scaler.scale(forward(&model)).backward().unwrap();
    refused(scaler.unscale(&mut model, grads));
    assert_eq!(fp32_bits(&model), before, "nothing changed");
    // With a dynamic scaler it trains.
    let mut scaler = GradScaler::dynamic();
    let grads = scaler.scale(forward(&model)).backward().unwrap();
    let outcome = scaler
        .step(&mut opt, scaler.unscale(&mut model, grads).unwrap())
        .unwrap();
    assert!(!outcome.skipped());
    scaler.update(outcome).unwrap();
    assert_ne!(fp32_bits(&model), before);

    // The same FP32 model without the casts computes nothing in FP16 and steps scaler-free.
    let dev = Cpu::seed_from_u64(33);
    let mut model: Fp32Mlp = Fp32Weights::build::<Mlp>(&dev).unwrap();
    let mut opt = Sgd::new(model.master(), SgdConfig::default());
    let (x, y) = batch(&dev);
    let logits = model.working().forward(
        x.to_dtype::<f32>()
            .traced_mixed(model.alloc_grads().unwrap()),
    );
    let raw = cross_entropy_with_logits_loss(logits, y)
        .backward()
        .unwrap();
    assert_eq!(raw.grads().computed_in_narrow_range(), None);
    let outcome = raw.check(&mut model).unwrap().step(&mut opt).unwrap();
    assert!(!outcome.skipped());
}

#[test]
fn two_hundred_overflows_in_a_row_skip_every_step_and_the_scaler_recovers() {
    // PyTorch's scaler would reach 2^-144 here: 1/scale overflows to inf, and 0 · inf puts NaN
    // into every zero gradient. Backoffs stop at SMALLEST_SCALE (2^-126) instead.
    let (dev, mut model) = model(19);
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    // Growth after every clean step, so that recovery takes as many steps as the backoff did.
    let mut scaler = GradScaler::new(65536.0, 2.0, 0.5, 1).unwrap();
    let (x, y) = batch(&dev);
    let mut poisoned = x.as_vec();
    poisoned[3] = f16::NAN;
    let poisoned = dev.tensor_from_vec(poisoned, (Const::<4>, Const::<6>));
    let before = master_bits(&model);
    for step in 0..200 {
        let grads = backward(&scaler, &model, poisoned.clone(), y.clone());
        let unscaled = scaler.unscale(&mut model, grads).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        assert!(outcome.skipped(), "step {step} was not skipped");
        scaler.update(outcome).unwrap();
        assert_eq!(
            master_bits(&model),
            before,
            "step {step} changed the masters"
        );
        assert!(scaler.get_scale() >= typed_amp::scaler::SMALLEST_SCALE);
    }
    assert_eq!(scaler.get_scale(), typed_amp::scaler::SMALLEST_SCALE);
    assert_eq!(scaler.skipped_steps(), 200);

    // Clean data: the first 120 steps (scales 2^-126 to 2^-7, far below FP16's overflow) all
    // step; later ones may overflow FP16 again as the scale grows, and back off as usual.
    let mut clean_steps = 0;
    for step in 0..160 {
        let grads = backward(&scaler, &model, x.clone(), y.clone());
        let unscaled = scaler.unscale(&mut model, grads).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        clean_steps += usize::from(step < 120 && !outcome.skipped());
        scaler.update(outcome).unwrap();
        let masters = model.master();
        assert!(masters.0.weight.as_vec().iter().all(|w| w.is_finite()));
        assert!(masters.4.bias.as_vec().iter().all(|w| w.is_finite()));
    }
    assert_eq!(clean_steps, 120, "clean data after the burst must step");
    assert!(
        scaler.get_scale() >= 1.0,
        "the scale grows back: {}",
        scaler.get_scale()
    );
    assert_ne!(master_bits(&model), before, "the clean steps trained");
}

#[test]
fn scales_whose_inverse_overflows_are_refused() {
    let tiny = typed_amp::scaler::SMALLEST_SCALE / 2.0;
    assert!(GradScaler::with_static_scale(tiny).is_err());
    assert!(GradScaler::dynamic().with_min_scale(tiny).is_err());
    let mut state = GradScaler::dynamic().state();
    state.max_scale = Some(0.0);
    assert!(GradScaler::from_state(state).is_err());
    let mut state = GradScaler::dynamic().state();
    state.scale = tiny;
    assert!(GradScaler::from_state(state).is_err());
}

#[test]
fn static_scales_above_fp16_max_are_refused_by_every_constructor() {
    use typed_amp::scaler::{ScaleMode, MAX_STATIC_SCALE};
    assert_eq!(MAX_STATIC_SCALE, 65504.0);
    let refused = |result: Result<GradScaler, AmpError>| matches!(result, Err(AmpError::StaticScaleOverflowsFp16 { scale }) if scale > 65504.0);
    assert!(GradScaler::with_static_scale(65504.0).is_ok());
    for scale in [65505.0, 65536.0, 70000.0, 1e30] {
        assert!(refused(GradScaler::with_static_scale(scale)), "{scale}");
    }
    // A floor above a static scale would raise it.
    let fixed = GradScaler::with_static_scale(1024.0).unwrap();
    assert!(refused(fixed.clone().with_min_scale(70000.0)));
    assert_eq!(
        fixed.clone().with_min_scale(2048.0).unwrap().get_scale(),
        2048.0
    );
    // Saved state (a checkpoint's, or one written by hand) obeys the same rule.
    let mut state = fixed.state();
    state.scale = 70000.0;
    assert!(refused(GradScaler::from_state(state)));
    let mut loaded = fixed.clone();
    let err = loaded.load_state(state).unwrap_err();
    assert!(
        matches!(err, AmpError::StaticScaleOverflowsFp16 { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("65504"), "{err}");
    assert_eq!(
        loaded.get_scale(),
        1024.0,
        "a refused state changes nothing"
    );
    // One scaler per loss starts from a scaler, and data parallel from its state.
    let mut dist = typed_amp::distributed::DataParallel::new(
        fixed.clone(),
        typed_amp::distributed::SingleProcess,
    )
    .unwrap();
    assert!(matches!(
        dist.load_state(state),
        Err(AmpError::StaticScaleOverflowsFp16 { .. })
    ));
    // Dynamic scales may start above it (PyTorch's 2^16): they back off.
    let dynamic = GradScaler::new(65536.0, 2.0, 0.5, 2000).unwrap();
    assert_eq!(dynamic.mode(), ScaleMode::Dynamic);
    assert_eq!(GradScaler::dynamic().get_scale(), 65536.0);
    let mut state = dynamic.state();
    state.scale = 1e6;
    assert!(GradScaler::from_state(state).is_ok());
}
