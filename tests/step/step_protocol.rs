//! One training loop, written once against `StepProtocol`, runs with a `GradScaler`, with
//! `LossScalers` and with `DataParallel` (over `SingleProcess`; over MPI in `data_parallel.rs`'s
//! worker): each gives bit for bit the weights, scale and skipped steps of the same iteration
//! written out stage by stage.

use typed_amp::distributed::{master_digest, DataParallel, SingleProcess};
use typed_amp::prelude::*;
use typed_amp::scaler::LossScalers;
use typed_amp::step::StepProtocol;
use typed_amp::{loss::Loss, tape::MixedGradients};

type Mlp = (Linear<6, 16>, ReLU, Linear<16, 3>);
type Model = MasterWeights<
    <Mlp as BuildOnDevice<Cpu, f32>>::Built,
    <Mlp as BuildOnDevice<Cpu, f16>>::Built,
    Cpu,
>;

const STEPS: usize = 12;

/// Step `step`'s batch: its inputs and, per loss, its weight. Loss 1 is so large at some steps
/// that FP16 overflows, so that the scalers back off and a step is skipped.
fn batch(dev: &Cpu, step: usize) -> (Tensor<Rank2<8, 6>, f16, Cpu>, [f32; 2]) {
    let x: Tensor<Rank2<8, 6>, f32, Cpu> = dev.sample_normal();
    let blow_up = if step % 5 == 2 { 1e9 } else { 10.0 };
    (x.to_dtype::<f16>(), [1.0, blow_up])
}

/// Loss `index` of a forward pass traced into `grads`.
fn loss(
    dev: &Cpu,
    model: &Model,
    x: Tensor<Rank2<8, 6>, f16, Cpu>,
    weight: f32,
    grads: MixedGradients<Cpu>,
) -> Loss<Cpu> {
    let out = model.working().forward(x.traced_mixed(grads));
    mse_loss(out.to_f32(), dev.ones()) * weight
}

/// The one loop: `STEPS` iterations through `protocol`, each with as many losses as it takes.
/// Returns the master weights' digest.
fn train<P: StepProtocol<Cpu>>(protocol: &mut P) -> Result<u64, AmpError> {
    let dev = Cpu::seed_from_u64(7);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    protocol.sync_model(&mut model)?;
    let mut grads = model.alloc_grads()?;
    for step in 0..STEPS {
        let (x, weights) = batch(&dev, step);
        grads = protocol.train_step(&mut model, &mut opt, grads, |model, index, grads| {
            Ok::<_, AmpError>(loss(&dev, model, x.clone(), weights[index], grads))
        })?;
    }
    protocol.sync_buffers(&mut model)?;
    protocol.check_in_sync(&model)?;
    master_digest(&model)
}

/// The same iterations with one scaler, stage by stage.
fn by_stages(scaler: &mut GradScaler) -> Result<u64, AmpError> {
    let dev = Cpu::seed_from_u64(7);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut grads = model.alloc_grads()?;
    for step in 0..STEPS {
        let (x, weights) = batch(&dev, step);
        let loss = loss(&dev, &model, x, weights[0], grads);
        let scaled = scaler.scale(loss).backward()?;
        let unscaled = scaler.unscale(&mut model, scaled)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        grads = scaler.update(outcome)?;
    }
    master_digest(&model)
}

/// The same iterations with one scaler per loss, stage by stage.
fn by_stages_per_loss(scalers: &mut LossScalers) -> Result<u64, AmpError> {
    let dev = Cpu::seed_from_u64(7);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut grads = Some(model.alloc_grads()?);
    for step in 0..STEPS {
        let (x, weights) = batch(&dev, step);
        let first = grads.take().expect("the last update's gradients");
        let loss0 = loss(&dev, &model, x.clone(), weights[0], first);
        let scaled0 = scalers.get(0).expect("0").scale(loss0).backward()?;
        let loss1 = loss(&dev, &model, x, weights[1], model.alloc_grads()?);
        let scaled1 = scalers.get(1).expect("1").scale(loss1).backward()?;
        let (scaler0, scaler1) = (scalers.get(0).expect("0"), scalers.get(1).expect("1"));
        let mut total = scaler0.unscale(&mut model, scaled0)?;
        total.merge(scaler1, scaled1)?;
        let outcome = scaler0.step(&mut opt, total)?;
        grads = Some(scalers.update(outcome)?);
    }
    master_digest(&model)
}

fn scaler() -> GradScaler {
    GradScaler::new(1024.0, 2.0, 0.5, 3).unwrap()
}

#[test]
fn the_loop_through_a_grad_scaler_is_the_stages_bit_for_bit() -> Result<(), AmpError> {
    let (mut looped, mut staged) = (scaler(), scaler());
    assert_eq!(train(&mut looped)?, by_stages(&mut staged)?);
    assert_eq!(looped.state(), staged.state());
    // Loss 0 alone (weight 1) never overflows.
    assert_eq!(looped.skipped_steps(), 0);
    Ok(())
}

#[test]
fn the_loop_through_loss_scalers_is_the_stages_bit_for_bit() -> Result<(), AmpError> {
    let (mut looped, mut staged) = (LossScalers::new(2, scaler()), LossScalers::new(2, scaler()));
    assert_eq!(StepProtocol::<Cpu>::losses(&looped), 2);
    assert_eq!(train(&mut looped)?, by_stages_per_loss(&mut staged)?);
    assert_eq!(looped, staged);
    // Loss 1 overflowed at steps 2 and 7 and its scaler alone backed off.
    let (s0, s1) = (looped.get(0).expect("0"), looped.get(1).expect("1"));
    assert_eq!((s0.skipped_steps(), s1.skipped_steps()), (0, 2));
    assert!(s1.get_scale() < s0.get_scale());
    Ok(())
}

#[test]
fn the_loop_through_data_parallel_on_one_process_is_the_grad_scalers() -> Result<(), AmpError> {
    let mut dist = DataParallel::new(scaler(), SingleProcess)?;
    let mut alone = scaler();
    assert_eq!(train(&mut dist)?, train(&mut alone)?);
    assert_eq!(dist.state(), alone.state());
    Ok(())
}

#[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
struct Bf16Mlp {
    fc1: Linear<6, 16>,
    act: ReLU,
    fc2: Linear<16, 3>,
}

/// A BF16 model in a data-parallel run, stepped the README's scaler-free way (or with a
/// single-process scaler), would never average its gradients across ranks: each rank would step
/// on its own shard. Once a `DataParallel` synced it, those steps are refused before anything
/// changes, and the data-parallel step trains it.
#[test]
fn a_model_synced_for_data_parallel_is_not_stepped_without_its_all_reduce() {
    let dev = Cpu::seed_from_u64(9);
    let mut model = Bf16Mlp::build(&dev).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut dist = DataParallel::new(GradScaler::disabled(), SingleProcess).unwrap();
    dist.sync_model(&mut model).unwrap();
    let x: Tensor<Rank2<8, 6>, f32, Cpu> = dev.sample_normal();
    let before = master_digest(&model).unwrap();

    let logits = model
        .working()
        .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
    let raw = mse_loss(logits, dev.ones()).backward().unwrap();
    let err = raw.check(&mut model).unwrap_err();
    assert!(matches!(err, AmpError::NotAllReduced), "{err}");
    assert!(err.to_string().contains("all-reduce"), "{err}");

    let scaler = GradScaler::disabled();
    let logits = model
        .working()
        .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
    let scaled = scaler
        .scale(mse_loss(logits, dev.ones()))
        .backward()
        .unwrap();
    let err = scaler.unscale(&mut model, scaled).unwrap_err();
    assert!(matches!(err, AmpError::NotAllReduced), "{err}");
    assert_eq!(master_digest(&model).unwrap(), before, "nothing changed");

    let logits = model
        .working()
        .forward(x.traced_mixed(model.alloc_grads().unwrap()));
    let scaled = dist.scale(mse_loss(logits, dev.ones())).backward().unwrap();
    let local = dist.unscale(&mut model, scaled).unwrap();
    let averaged = dist.all_reduce(local).unwrap();
    let outcome = dist.step(&mut opt, averaged).unwrap();
    dist.update(outcome).unwrap();
    assert_ne!(
        master_digest(&model).unwrap(),
        before,
        "the data-parallel step trains"
    );
}

// The one-call step with its options (`train_step_with`, `StepOptions`): the same iterations as
// the stage-by-stage loop with an accumulation window and clipping, bit for bit.

/// An O2-FP16 model (FP16 working copy, FP32 masters, dynamic loss scaling).
#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct O2Mlp {
    fc1: Linear<6, 16>,
    act: ReLU,
    fc2: Linear<16, 3>,
}

const SHORT_STEPS: usize = 6;
const MICRO_BATCHES: usize = 3;
const MAX_NORM: f32 = 0.05;

/// Micro-batch `micro` of step `step`: inputs, targets and a weight that overflows FP16 at
/// step 2's last micro-batch (so that one step is skipped and the scale backs off).
fn micro_batch(
    dev: &Cpu,
    step: usize,
    micro: usize,
) -> (
    Tensor<Rank2<8, 6>, f32, Cpu>,
    Tensor<Rank2<8, 3>, f32, Cpu>,
    f32,
) {
    let x: Tensor<Rank2<8, 6>, f32, Cpu> = dev.sample_normal();
    let y: Tensor<Rank2<8, 3>, f32, Cpu> = dev.sample_normal();
    let weight = if step == 2 && micro == MICRO_BATCHES - 1 {
        1e9
    } else {
        1.0
    };
    (x, y, weight)
}

/// `SHORT_STEPS` iterations of `MICRO_BATCHES` micro-batches through the one-call step with
/// `options`. Returns the master weights' digest.
fn short_form<P: StepProtocol<Cpu>>(protocol: &mut P, options: &StepOptions) -> u64 {
    let dev = Cpu::seed_from_u64(11);
    let mut model = O2Mlp::build(&dev).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut grads = model.alloc_grads().unwrap();
    for step in 0..SHORT_STEPS {
        grads = protocol
            .train_step_with(
                &mut model,
                &mut opt,
                grads,
                options,
                |model, micro, grads| {
                    let (x, y, weight) = micro_batch(&dev, step, micro);
                    let logits = model.working().forward(x.traced_mixed(grads));
                    mse_loss(logits, y) * weight
                },
            )
            .unwrap();
    }
    master_digest(&model).unwrap()
}

/// The same iterations stage by stage: an accumulation window (each loss weighted by
/// `1 / MICRO_BATCHES`), unscale, `clip_grad_norm`, step, update. Returns the master weights'
/// digest and how many steps clipping shrank.
fn short_form_by_stages(scaler: &mut GradScaler) -> (u64, usize) {
    let dev = Cpu::seed_from_u64(11);
    let mut model = O2Mlp::build(&dev).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut grads = model.alloc_grads().unwrap();
    let mut clipped = 0;
    for step in 0..SHORT_STEPS {
        let mut window = scaler.accumulate(grads);
        for micro in 0..MICRO_BATCHES {
            let (x, y, weight) = micro_batch(&dev, step, micro);
            let logits = model.working().forward(window.trace(x).unwrap());
            let loss = mse_loss(logits, y) * weight;
            window
                .backward(loss * (1.0 / MICRO_BATCHES as f32))
                .unwrap();
        }
        let scaled = window.finish().unwrap();
        let mut unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let norm = clip_grad_norm(&mut unscaled, MAX_NORM).unwrap();
        clipped += usize::from(norm.is_finite() && norm > MAX_NORM);
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
    (master_digest(&model).unwrap(), clipped)
}

fn short_options() -> StepOptions {
    StepOptions::new()
        .clip_grad_norm(MAX_NORM)
        .accumulate(MICRO_BATCHES)
}

#[test]
fn the_one_call_step_with_clipping_and_accumulation_is_the_stages_bit_for_bit() {
    let (mut short, mut staged) = (O2Mlp::scaler(), O2Mlp::scaler());
    let (digest, clipped) = short_form_by_stages(&mut staged);
    assert_eq!(short_form(&mut short, &short_options()), digest);
    assert_eq!(short.state(), staged.state());
    // The comparison covers a skipped step and steps that clipping shrank.
    assert_eq!(short.skipped_steps(), 1);
    assert!(clipped >= 1, "no step was clipped");

    // Each option changes the result: without clipping, or without accumulation, the weights
    // differ from the stages' (so the comparison above can fail).
    let no_clip = StepOptions::new().accumulate(MICRO_BATCHES);
    assert_ne!(short_form(&mut O2Mlp::scaler(), &no_clip), digest);
    let no_accumulation = StepOptions::new().clip_grad_norm(MAX_NORM);
    assert_ne!(short_form(&mut O2Mlp::scaler(), &no_accumulation), digest);
}

#[test]
fn the_one_call_step_through_data_parallel_on_one_process_is_the_grad_scalers() {
    let mut dist = DataParallel::new(O2Mlp::scaler(), SingleProcess).unwrap();
    let mut alone = O2Mlp::scaler();
    assert_eq!(
        short_form(&mut dist, &short_options()),
        short_form(&mut alone, &short_options())
    );
    assert_eq!(dist.state(), alone.state());
    assert_eq!(
        dist.reductions(),
        SHORT_STEPS as u64,
        "one all-reduce per step"
    );
}

#[test]
fn the_scale_free_one_call_step_is_the_stages_bit_for_bit() {
    let options = StepOptions::new().clip_grad_value(1e-3).accumulate(2);
    let dev = Cpu::seed_from_u64(5);
    let mut short = Bf16Mlp::build(&Cpu::seed_from_u64(5)).unwrap();
    let mut staged = Bf16Mlp::build(&Cpu::seed_from_u64(5)).unwrap();
    assert_eq!(
        master_digest(&short).unwrap(),
        master_digest(&staged).unwrap()
    );
    let mut opt_short = typed_amp::optim::adam(short.master(), AdamConfig::default());
    let mut opt_staged = typed_amp::optim::adam(staged.master(), AdamConfig::default());
    let batches: Vec<Vec<Tensor<Rank2<8, 6>, f32, Cpu>>> = (0..3)
        .map(|_| (0..2).map(|_| dev.sample_normal()).collect())
        .collect();

    let mut no_scaler = NoScaler::new();
    let mut grads = short.alloc_grads().unwrap();
    for batch in &batches {
        grads = no_scaler
            .train_step_with(
                &mut short,
                &mut opt_short,
                grads,
                &options,
                |model, i, grads| {
                    let logits = model
                        .working()
                        .forward(batch[i].clone().traced_mixed(grads));
                    mse_loss(logits, dev.ones())
                },
            )
            .unwrap();
    }

    let mut next = Some(staged.alloc_grads().unwrap());
    for batch in &batches {
        // Each micro-batch traces the gradients of the one before (a copy of its raw ones).
        let mut raw: Option<typed_amp::step::RawGrads<Cpu>> = None;
        for x in batch {
            let grads = match raw.take() {
                Some(raw) => raw.grads().clone(),
                None => next.take().unwrap(),
            };
            let logits = staged.working().forward(x.clone().traced_mixed(grads));
            raw = Some((mse_loss(logits, dev.ones()) * 0.5).backward().unwrap());
        }
        let mut unscaled = raw.unwrap().check(&mut staged).unwrap();
        clip_grad_value(&mut unscaled, 1e-3).unwrap();
        next = Some(unscaled.step(&mut opt_staged).unwrap().into_grads());
    }
    assert_eq!(
        master_digest(&short).unwrap(),
        master_digest(&staged).unwrap()
    );
}

#[test]
fn invalid_step_options_are_refused_before_anything_runs() {
    let dev = Cpu::seed_from_u64(3);
    let mut model = O2Mlp::build(&dev).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scaler = O2Mlp::scaler();
    let before = master_digest(&model).unwrap();
    for (options, what) in [
        (StepOptions::new().accumulate(0), "at least one micro-batch"),
        (StepOptions::new().clip_grad_norm(-1.0), "max_norm"),
        (StepOptions::new().clip_grad_value(f32::NAN), "clip_value"),
    ] {
        let mut ran = false;
        let grads = model.alloc_grads().unwrap();
        let err = scaler
            .train_step_with(&mut model, &mut opt, grads, &options, |model, _, grads| {
                ran = true;
                let x: Tensor<Rank2<8, 6>, f32, Cpu> = dev.sample_normal();
                mse_loss(model.working().forward(x.traced_mixed(grads)), dev.ones())
            })
            .unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
        assert!(!ran, "the forward pass ran");
    }
    assert_eq!(master_digest(&model).unwrap(), before);
    assert_eq!(scaler.state(), O2Mlp::scaler().state());
}

/// One scaler per loss with accumulation: each loss's micro-batches in a window of its own
/// scaler (forward index `loss * micro_batches + micro`), unscaled and merged, clipped, one step.
#[test]
fn the_one_call_step_through_loss_scalers_with_accumulation_is_the_stages_bit_for_bit() {
    const MICRO: usize = 2;
    let options = StepOptions::new().clip_grad_value(0.01).accumulate(MICRO);
    let (mut short, mut staged) = (LossScalers::new(2, scaler()), LossScalers::new(2, scaler()));
    let dev = Cpu::seed_from_u64(13);
    let inputs: Vec<Tensor<Rank2<8, 6>, f16, Cpu>> = (0..STEPS * 2 * MICRO)
        .map(|_| {
            let x: Tensor<Rank2<8, 6>, f32, Cpu> = dev.sample_normal();
            x.to_dtype::<f16>()
        })
        .collect();
    // Loss 1 overflows FP16 in its last micro-batch of steps 2 and 7.
    let weight = |step: usize, loss: usize, micro: usize| match (loss, step % 5, micro) {
        (1, 2, m) if m == MICRO - 1 => 1e9,
        (1, _, _) => 10.0,
        _ => 1.0,
    };
    let x = |step: usize, index: usize| inputs[step * 2 * MICRO + index].clone();

    let mut model = MasterWeights::build::<Mlp>(&Cpu::seed_from_u64(7)).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut grads = model.alloc_grads().unwrap();
    for step in 0..STEPS {
        grads = short
            .train_step_with(
                &mut model,
                &mut opt,
                grads,
                &options,
                |model, index, grads| {
                    let w = weight(step, index / MICRO, index % MICRO);
                    loss(&dev, model, x(step, index), w, grads)
                },
            )
            .unwrap();
    }
    let short_digest = master_digest(&model).unwrap();

    let mut model = MasterWeights::build::<Mlp>(&Cpu::seed_from_u64(7)).unwrap();
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut next = Some(model.alloc_grads().unwrap());
    for step in 0..STEPS {
        let mut scaled = Vec::new();
        for l in 0..2 {
            let grads = match next.take() {
                Some(grads) => grads,
                None => model.alloc_grads().unwrap(),
            };
            let mut window = staged.get(l).unwrap().accumulate(grads);
            for m in 0..MICRO {
                let out = model
                    .working()
                    .forward(window.trace(x(step, l * MICRO + m)).unwrap());
                let loss = mse_loss(out.to_f32(), dev.ones()) * weight(step, l, m);
                window.backward(loss * (1.0 / MICRO as f32)).unwrap();
            }
            scaled.push(window.finish().unwrap());
        }
        let scaled1 = scaled.pop().unwrap();
        let scaled0 = scaled.pop().unwrap();
        let (s0, s1) = (staged.get(0).unwrap(), staged.get(1).unwrap());
        let mut total = s0.unscale(&mut model, scaled0).unwrap();
        total.merge(s1, scaled1).unwrap();
        clip_grad_value(&mut total, 0.01).unwrap();
        let outcome = s0.step(&mut opt, total).unwrap();
        next = Some(staged.update(outcome).unwrap());
    }
    assert_eq!(short_digest, master_digest(&model).unwrap());
    assert_eq!(short, staged);
    // Loss 1 overflowed at steps 2 and 7 and its scaler alone backed off.
    let (s0, s1) = (short.get(0).unwrap(), short.get(1).unwrap());
    assert_eq!((s0.skipped_steps(), s1.skipped_steps()), (0, 2));
}
