//! Training-loop patterns: gradient accumulation, clipping, several optimizers sharing a scaler,
//! one scaler per loss, overflow blame, a scale floor, and FP32 batch-norm statistics under O2.

use typed_amp::dfdx::nn::builders::{BatchNorm1D, Linear};
use typed_amp::params::Parameters;
use typed_amp::prelude::*;
use typed_amp::watch::Overflow;
use typed_amp::{precision::DType, scaler::LossScalers, step::UnscaledGrads};

/// FP16's machine epsilon, 2^-10.
const F16_EPS: f32 = 1.0 / 1024.0;

type Mlp = (Linear<8, 16>, ReLU, Linear<16, 16>, ReLU, Linear<16, 4>);
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

/// Inputs (FP16) and one-hot labels.
type Batch = (
    Tensor<(usize, Const<8>), f16, Cpu>,
    Tensor<(usize, Const<4>), f32, Cpu>,
);

fn data(dev: &Cpu, n: usize) -> Batch {
    let x: Tensor<(usize, Const<8>), f32, Cpu> = dev.sample_normal_like(&(n, Const));
    let labels: Vec<f32> = (0..n * 4)
        .map(|i| if i % 4 == (i / 4) % 4 { 1.0 } else { 0.0 })
        .collect();
    (x.to_dtype::<f16>(), dev.tensor_from_vec(labels, (n, Const)))
}

fn rows<E: Unit>(
    t: &Tensor<(usize, Const<8>), E, Cpu>,
    from: usize,
    to: usize,
) -> Tensor<(usize, Const<8>), E, Cpu> {
    let v = t.as_vec();
    t.device()
        .tensor_from_vec(v[from * 8..to * 8].to_vec(), (to - from, Const))
}

fn label_rows(
    t: &Tensor<(usize, Const<4>), f32, Cpu>,
    from: usize,
    to: usize,
) -> Tensor<(usize, Const<4>), f32, Cpu> {
    let v = t.as_vec();
    t.device()
        .tensor_from_vec(v[from * 4..to * 4].to_vec(), (to - from, Const))
}

fn host_grads(mut grads: UnscaledGrads<'_, Model, Cpu>) -> Vec<(String, Vec<f32>)> {
    grads.to_host().unwrap()
}

#[test]
fn four_micro_batches_of_64_update_like_one_batch_of_256() {
    let (dev, mut model) = model(1);
    let (x, y) = data(&dev, 256);
    let scaler = GradScaler::with_static_scale(1024.0).unwrap();

    let logits = model
        .working()
        .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), y.clone());
    let scaled = scaler.scale(loss).backward().unwrap();
    let whole = host_grads(scaler.unscale(&mut model, scaled).unwrap());

    let mut window = scaler.accumulate(model.alloc_grads().unwrap());
    for k in 0..4 {
        let (lo, hi) = (k * 64, (k + 1) * 64);
        let logits = model
            .working()
            .forward(window.trace(rows(&x, lo, hi)).unwrap());
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), label_rows(&y, lo, hi));
        window.backward(loss * 0.25).unwrap();
    }
    assert_eq!(window.micro_batches(), 4);
    let scaled = window.finish().unwrap();
    let accumulated = host_grads(scaler.unscale(&mut model, scaled).unwrap());

    // Same FP16 forward and backward either way, except that the accumulated gradients are
    // summed in FP16: three more roundings, each within ε/2 of the running sum, on top of the
    // 2·3 + 1 = 7 of a three-layer FP16 network (see tests/amp/mixed_gradients.rs): R = 10.
    assert_eq!(accumulated.len(), whole.len());
    for ((path, a), (whole_path, b)) in accumulated.iter().zip(&whole) {
        assert_eq!(path, whole_path);
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            approx::assert_abs_diff_eq!(*x, *y, epsilon = 10.0 * F16_EPS * scale);
        }
        assert!(scale > 0.0, "{path}");
    }
}

#[test]
fn accumulation_windows_used_out_of_order_are_errors() {
    let (dev, model) = model(2);
    let scaler = GradScaler::default();
    let (x, _) = data(&dev, 4);
    let mut window = scaler.accumulate(model.alloc_grads().unwrap());
    let _traced = window.trace(x.clone()).unwrap();
    assert!(window.trace(x).is_err(), "a second trace before backward");
    assert!(
        window.finish().is_err(),
        "finishing with a pending micro-batch"
    );

    let mut window = scaler.accumulate(model.alloc_grads().unwrap());
    let loss = typed_amp::loss::Loss::new(dev.tensor(1.0f32).leaky_traced_mixed());
    assert!(
        window.backward(loss).is_err(),
        "backward without a traced micro-batch"
    );
}

#[test]
fn clipping_reports_a_non_finite_norm_after_an_overflow() {
    let (dev, mut model) = model(3);
    let scaler = GradScaler::default();
    let (x, y) = data(&dev, 8);
    let logits = model
        .working()
        .forward(x.traced_mixed(model.alloc_grads().unwrap()));
    let mut scaled = scaler
        .scale(cross_entropy_with_logits_loss(logits.to_f32(), y))
        .backward()
        .unwrap();
    let buf = scaled
        .grads_mut()
        .store_mut::<f16>()
        .get_or_alloc_mut(&model.working().2.weight)
        .unwrap();
    buf[3] = f16::INFINITY;
    let mut unscaled = scaler.unscale(&mut model, scaled).unwrap();
    let norm = clip_grad_norm(&mut unscaled, 1.0).unwrap();
    assert!(
        !norm.is_finite(),
        "PyTorch's clip_grad_norm_ returns inf or NaN here; got {norm}"
    );
    assert!(unscaled.found_inf());
}

/// A generator and a discriminator, each with its own optimizer, sharing one scaler.
#[test]
fn two_optimizers_share_a_scaler_and_skip_on_their_own_overflow() {
    let dev = Cpu::seed_from_u64(4);
    let mut generator = MasterWeights::build::<(Linear<4, 8>, Tanh, Linear<8, 8>)>(&dev).unwrap();
    let mut discriminator =
        MasterWeights::build::<(Linear<8, 8>, ReLU, Linear<8, 1>)>(&dev).unwrap();
    let mut opt_g = typed_amp::optim::adam(generator.master(), AdamConfig::default());
    let mut opt_d = typed_amp::optim::adam(discriminator.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();
    let start_scale = scaler.get_scale();

    // Discriminator step on generated samples (the generator runs without a tape).
    let z: Tensor<Rank2<6, 4>, f32, Cpu> = dev.sample_normal();
    let z = z.to_dtype::<f16>();
    let fake = generator.working().forward(z.clone());
    let d_out = discriminator
        .working()
        .forward(fake.traced_mixed(discriminator.alloc_grads().unwrap()));
    let loss_d = binary_cross_entropy_with_logits_loss(d_out.to_f32(), dev.zeros());
    let mut scaled_d = scaler.scale(loss_d).backward().unwrap();
    // The discriminator's gradients overflow this iteration.
    let buf = scaled_d
        .grads_mut()
        .store_mut::<f16>()
        .get_or_alloc_mut(&discriminator.working().0.weight)
        .unwrap();
    buf[0] = f16::INFINITY;
    let d_before = discriminator.master().0.weight.as_vec();
    let unscaled_d = scaler.unscale(&mut discriminator, scaled_d).unwrap();
    let outcome_d = scaler.step(&mut opt_d, unscaled_d).unwrap();

    // Generator step through the discriminator; only the generator's gradients are kept.
    let fake = generator
        .working()
        .forward(z.traced_mixed(generator.alloc_grads().unwrap()));
    let d_out = discriminator.working().forward(fake);
    let loss_g = binary_cross_entropy_with_logits_loss(d_out.to_f32(), dev.ones());
    let scaled_g = scaler.scale(loss_g).backward().unwrap();
    assert!(scaled_g
        .grads()
        .get(&discriminator.working().0.weight)
        .is_none());
    let g_before = generator.master().0.weight.as_vec();
    let unscaled_g = scaler.unscale(&mut generator, scaled_g).unwrap();
    let outcome_g = scaler.step(&mut opt_g, unscaled_g).unwrap();

    assert!(outcome_d.skipped() && !outcome_g.skipped());
    assert_eq!(discriminator.master().0.weight.as_vec(), d_before);
    assert_ne!(generator.master().0.weight.as_vec(), g_before);
    // One update per iteration, taking both outcomes, backing off because one found inf.
    let (grads_d, grads_g) = scaler.update((outcome_d, outcome_g)).unwrap();
    assert_eq!(scaler.get_scale(), start_scale / 2.0);
    // Each model gets its own gradients back, zeroed, for the next iteration.
    assert!(grads_d.get(&discriminator.working().0.weight).is_some());
    assert!(grads_g.get(&generator.working().0.weight).is_some());
}

#[test]
fn one_scaler_per_loss_sums_gradients_and_backs_off_only_the_overflowing_loss() {
    let (dev, mut model) = model(5);
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scalers = LossScalers::new(2, GradScaler::new(1024.0, 2.0, 0.5, 2000).unwrap());
    let (x, y) = data(&dev, 16);

    let mut scaled = Vec::new();
    for (i, weight) in [(0, 1.0f32), (1, 0.5)] {
        let scaler = scalers.get(i).unwrap();
        let logits = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), y.clone()) * weight;
        let mut grads = scaler.scale(loss).backward().unwrap();
        if i == 1 {
            let buf = grads
                .grads_mut()
                .store_mut::<f16>()
                .get_or_alloc_mut(&model.working().4.bias)
                .unwrap();
            buf[0] = f16::NAN;
        }
        scaled.push(grads);
    }
    let second = scaled.pop().unwrap();
    let first = scaled.pop().unwrap();
    let (scaler0, scaler1) = (scalers.get(0).unwrap(), scalers.get(1).unwrap());
    // Gradients scaled by one scaler are not another's to unscale, and nothing changes.
    let logits = model
        .working()
        .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), y.clone());
    let probe = scaler0.scale(loss).backward().unwrap();
    let master_before = model.master().0.weight.as_vec();
    let err = scaler1.unscale(&mut model, probe).unwrap_err();
    assert!(matches!(err, AmpError::ScalerMismatch(_)), "{err}");
    assert_eq!(model.master().0.weight.as_vec(), master_before);
    let mut unscaled = scaler0.unscale(&mut model, first).unwrap();
    assert!(!unscaled.found_inf());
    let only_first = unscaled.to_host().unwrap();
    unscaled.merge(scaler1, second).unwrap();
    assert!(unscaled.found_inf(), "the merged step is skipped");
    assert_eq!(unscaled.non_finite_params(), ["4.bias".to_string()]);
    // The second loss is half the first, at the same power-of-two scale: its FP16 backward
    // pass computes exactly half of every value the first computes (halving commutes with
    // rounding; FP16 subnormals aside, which these gradients do not reach), so summed gradients
    // are 1.5 times the first's up to the FP32 rounding of the sum and of the product.
    let merged = unscaled.to_host().unwrap();
    assert_eq!(merged.len(), only_first.len());
    for ((path, a), (first_path, b)) in merged.iter().zip(&only_first) {
        assert_eq!(path, first_path);
        if path == "4.bias" {
            continue;
        }
        for (m, f) in a.iter().zip(b) {
            approx::assert_relative_eq!(*m, 1.5 * f, max_relative = 2.0 * f32::EPSILON);
        }
    }
    let outcome = scaler0.step(&mut opt, unscaled).unwrap();
    assert!(outcome.skipped());
    let grads = scalers.update(outcome).unwrap();
    assert_eq!(scalers.get(0).unwrap().get_scale(), 1024.0);
    assert_eq!(scalers.get(1).unwrap().get_scale(), 512.0);

    // An iteration that leaves a loss out cannot step, let alone update the scalers (one flag
    // per loss): it is refused at the step, before the weights change.
    let scaler0 = scalers.get(0).unwrap();
    let logits = model.working().forward(x.traced_mixed(grads));
    let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
    let master_before = model.master().0.weight.as_vec();
    let unscaled = scaler0
        .unscale(&mut model, scaler0.scale(loss).backward().unwrap())
        .unwrap();
    let err = scaler0.step(&mut opt, unscaled).unwrap_err();
    assert!(
        matches!(err, AmpError::LossNotMerged { loss: 1, losses: 2 }),
        "one flag per loss: {err}"
    );
    assert_eq!(model.master().0.weight.as_vec(), master_before);
}

/// A deliberately exploding layer is named: the parameters whose gradients overflow are its
/// neighbours, and the layer probes find the layer itself.
#[test]
fn exploding_activations_are_blamed_on_the_layer_by_name() {
    #[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
    struct Net {
        fc1: Linear<8, 16>,
        act1: ReLU,
        fc2: Linear<16, 16>,
        act2: ReLU,
        fc3: Linear<16, 4>,
    }
    let dev = Cpu::seed_from_u64(6);
    let mut model = Net::build(&dev).unwrap();
    // fc2's weights times 512: its activations reach thousands, and the gradients it passes
    // back are 512 times larger than they should be.
    model.master_mut().fc2.weight = model.master().fc2.weight.clone() * 512.0;
    model.reload_working().unwrap();
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = Net::scaler();
    let (x, y) = data(&dev, 32);
    let mut skipped = Vec::new();
    let mut recovered = false;
    for _ in 0..20 {
        let mut grads = model.alloc_grads().unwrap();
        grads.watch_layers(true);
        let logits = model.working().forward(x.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let scaled = scaler.scale(loss).backward().unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        if !outcome.skipped() {
            assert_eq!(outcome.overflow(), None);
            let layers: Vec<&str> = outcome.layers().iter().map(|l| l.layer).collect();
            assert_eq!(layers, ["input", "fc1", "act1", "fc2", "act2", "fc3"]);
            recovered = true;
            scaler.update(outcome).unwrap();
            break;
        }
        skipped.push((
            outcome.non_finite_params().to_vec(),
            outcome.overflow().cloned(),
            outcome.layers().to_vec(),
        ));
        scaler.update(outcome).unwrap();
    }
    assert!(!skipped.is_empty(), "the first steps overflow");
    assert!(recovered, "the scaler backed off until a step succeeded");
    let (non_finite, overflow, layers) = &skipped[0];
    // The overflow spreads to the gradients behind fc2, not its own... (fc3's weight gradient,
    // product of fc2's huge activations, overflowed FP16 when it was rounded to it; it is
    // accumulated and kept in FP32 now, where it is finite.)
    assert_eq!(non_finite, &["fc1.weight", "fc1.bias"]);
    // ...and the probes name fc2: finite gradient at its output, inf at its input.
    assert_eq!(overflow, &Some(Overflow::Backward("fc2")));
    let layer = |name| layers.iter().find(|l| l.layer == name).unwrap();
    let (fc1, fc2) = (layer("fc1"), layer("fc2"));
    assert!(
        fc2.activation_max_abs > 100.0 * fc1.activation_max_abs,
        "fc2's activations explode: {fc2:?} after {fc1:?}"
    );
    assert_eq!(scaler.skipped_steps(), skipped.len() as u64);
}

#[test]
fn a_model_that_always_overflows_hits_the_floor_and_says_so() {
    let (dev, mut model) = model(7);
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default()
        .with_min_scale(1.0)
        .unwrap()
        .with_floor_patience(3)
        .unwrap();
    let (x, y) = data(&dev, 8);
    let mut bad = x.as_vec();
    bad[0] = f16::NAN; // NaN input: no scale can help
    let x = dev.tensor_from_vec(bad, (8, Const));
    let mut error = None;
    for _ in 0..40 {
        let logits = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let scaled = scaler
            .scale(cross_entropy_with_logits_loss(logits.to_f32(), y.clone()))
            .backward()
            .unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        if let Err(e) = scaler.update(outcome) {
            error = Some(e);
            break;
        }
    }
    let error = error.expect("the floor is reported");
    assert!(matches!(error, AmpError::ScaleFloor { .. }));
    assert_eq!(scaler.get_scale(), 1.0);
    // 2^16 down to 1 takes 16 backoffs; then 3 steps at the floor.
    assert_eq!(scaler.skipped_steps(), 16 + 3);
}

#[test]
fn batch_norm_statistics_stay_fp32_under_o2_and_reach_the_master() {
    #[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
    struct Net {
        fc: Linear<8, 16>,
        bn: BatchNorm1D<16>,
        act: ReLU,
        head: Linear<16, 4>,
    }
    let dev = Cpu::seed_from_u64(8);
    let mut model = Net::build(&dev).unwrap();
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = Net::scaler();
    let (x, y) = data(&dev, 32);
    let _: &Tensor<Rank1<16>, f32, Cpu> = &model.working().bn.running_mean;
    for p in model.working().param_summary() {
        if p.path.starts_with("bn.") {
            assert_eq!(p.dtype, DType::F32, "{}", p.path);
        }
    }
    let grads = model.alloc_grads().unwrap();
    let logits = model
        .working_mut()
        .forward_mut(x.clone().traced_mixed(grads));
    let scaled = scaler
        .scale(cross_entropy_with_logits_loss(logits, y.clone()))
        .backward()
        .unwrap();
    let unscaled = scaler.unscale(&mut model, scaled).unwrap();
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    scaler.update(outcome).unwrap();
    let running = model.working().bn.running_mean.as_vec();
    assert!(
        running.iter().any(|v| *v != 0.0),
        "the training forward updated the statistics"
    );
    assert_eq!(
        model.master().bn.running_mean.as_vec(),
        running,
        "the master holds them too"
    );

    // One NaN batch: its step is skipped, and its trace in the running statistics is undone
    // (beyond PyTorch, which keeps NaN statistics and evaluates every input to NaN afterwards).
    let (mean, var) = (running, model.working().bn.running_var.as_vec());
    let mut values = x.as_vec();
    values[0] = f16::NAN;
    let poisoned = dev.tensor_from_vec(values, (32, Const::<8>));
    let grads = model.alloc_grads().unwrap();
    let logits = model
        .working_mut()
        .forward_mut(poisoned.traced_mixed(grads));
    let scaled = scaler
        .scale(cross_entropy_with_logits_loss(logits, y))
        .backward()
        .unwrap();
    let unscaled = scaler.unscale(&mut model, scaled).unwrap();
    let outcome = scaler.step(&mut opt, unscaled).unwrap();
    assert!(outcome.skipped());
    scaler.update(outcome).unwrap();
    assert_eq!(model.working().bn.running_mean.as_vec(), mean);
    assert_eq!(model.working().bn.running_var.as_vec(), var);
    let eval = model.working().forward(x.clone());
    assert!(
        eval.as_vec().iter().all(|v| v.is_finite()),
        "evaluation after the NaN batch"
    );
}
