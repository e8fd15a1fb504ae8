//! A step's outcome is the scaler's only news of the step: every outcome must reach the update
//! of the scaler that scaled its gradients, exactly once, before that model's next iteration.
//! An update given no outcomes, an outcome dropped or forgotten (`std::mem::forget`), and a step
//! missing a loss of one-scaler-per-loss training are typed errors raised before the scale or
//! the weights change.

use typed_amp::distributed::{AllReduced, DataParallel, SingleProcess};
use typed_amp::loss::Loss;
use typed_amp::prelude::*;
use typed_amp::tape::MixedGradients;
use typed_amp::{scaler::LossScalers, step::StepOutcome};

type Mlp = (Linear<6, 8>, ReLU, Linear<8, 3>);
type Master = <Mlp as BuildOnDevice<Cpu, f32>>::Built;
type Model = MasterWeights<Master, <Mlp as BuildOnDevice<Cpu, f16>>::Built, Cpu>;
type Opt = typed_amp::dfdx::optim::Adam<Master, f32, Cpu>;

fn setup(seed: u64) -> (Cpu, Model, Opt) {
    let dev = Cpu::seed_from_u64(seed);
    let model = MasterWeights::build::<Mlp>(&dev).unwrap();
    let opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    (dev, model, opt)
}

/// A loss of `model` traced into `grads`.
fn loss(dev: &Cpu, model: &Model, grads: MixedGradients<Cpu>) -> Loss<Cpu> {
    let x: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
    let out = model
        .working()
        .forward(x.to_dtype::<f16>().traced_mixed(grads));
    mse_loss(out.to_f32(), dev.ones())
}

fn master_bits(model: &Model) -> Vec<u32> {
    let m = model.master();
    [
        m.0.weight.as_vec(),
        m.0.bias.as_vec(),
        m.2.weight.as_vec(),
        m.2.bias.as_vec(),
    ]
    .concat()
    .into_iter()
    .map(f32::to_bits)
    .collect()
}

/// One full step with `scaler`, its outcome returned rather than updated.
fn step(dev: &Cpu, model: &mut Model, opt: &mut Opt, scaler: &GradScaler) -> StepOutcome<Cpu> {
    let grads = model.alloc_grads().unwrap();
    let scaled = scaler.scale(loss(dev, model, grads)).backward().unwrap();
    let unscaled = scaler.unscale(model, scaled).unwrap();
    scaler.step(opt, unscaled).unwrap()
}

#[test]
fn an_update_with_no_outcomes_is_refused_and_counts_no_clean_step() {
    // Growth after every clean step: a counted empty update would double the scale.
    let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
    let empty: Vec<StepOutcome<Cpu>> = Vec::new();
    let err = scaler.update(empty).unwrap_err();
    assert!(matches!(err, AmpError::NoOutcomes), "{err}");
    assert!(err.to_string().contains("no step outcomes"), "{err}");
    let none: [StepOutcome<Cpu>; 0] = [];
    assert!(matches!(scaler.update(none), Err(AmpError::NoOutcomes)));
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (1024.0, 0));

    // Data parallel.
    let mut dist =
        DataParallel::new(GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap(), SingleProcess).unwrap();
    let empty: Vec<StepOutcome<Cpu, AllReduced>> = Vec::new();
    assert!(matches!(dist.update(empty), Err(AmpError::NoOutcomes)));
    assert_eq!(dist.get_scale(), 1024.0);

    // One scaler per loss, with losses and without.
    for losses in [2, 0] {
        let mut scalers = LossScalers::new(losses, GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap());
        let empty: Vec<StepOutcome<Cpu>> = Vec::new();
        let err = scalers.update(empty).unwrap_err();
        assert!(
            matches!(err, AmpError::NoOutcomes),
            "{losses} losses: {err}"
        );
        assert!(scalers.iter().all(|s| s.get_scale() == 1024.0));
    }
}

#[test]
fn an_outcome_dropped_or_forgotten_is_an_error_at_the_next_backward_naming_its_step() {
    for forget in [false, true] {
        let (dev, mut model, mut opt) = setup(1);
        let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
        // Step 1 is updated; step 2's outcome never reaches the update.
        let outcome = step(&dev, &mut model, &mut opt, &scaler);
        scaler.update(outcome).unwrap();
        let lost = step(&dev, &mut model, &mut opt, &scaler);
        if forget {
            std::mem::forget(lost);
        } else {
            drop(lost);
        }
        let (scale, weights) = (scaler.get_scale(), master_bits(&model));

        let grads = model.alloc_grads().unwrap();
        let err = scaler
            .scale(loss(&dev, &model, grads))
            .backward()
            .unwrap_err();
        assert!(
            matches!(err, AmpError::OutcomeNotUpdated { step: 2 }),
            "{err}"
        );
        assert!(err.to_string().contains("step 2"), "{err}");
        // The same at the start of an accumulation window.
        let mut window = scaler.accumulate(model.alloc_grads().unwrap());
        let x: Tensor<Rank2<4, 6>, f32, Cpu> = dev.sample_normal();
        let out = model
            .working()
            .forward(window.trace(x.to_dtype::<f16>()).unwrap());
        let err = window
            .backward(mse_loss(out.to_f32(), dev.ones()))
            .unwrap_err();
        assert!(
            matches!(err, AmpError::OutcomeNotUpdated { step: 2 }),
            "{err}"
        );
        assert_eq!(scaler.get_scale(), scale);
        assert_eq!(master_bits(&model), weights, "nothing changed");
    }
}

#[test]
fn gradients_scaled_before_an_outcome_was_lost_are_refused_at_unscale() {
    let (dev, mut model, mut opt) = setup(2);
    let scaler = GradScaler::dynamic();
    let early = scaler
        .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    drop(step(&dev, &mut model, &mut opt, &scaler));
    let weights = master_bits(&model);
    let err = scaler.unscale(&mut model, early).unwrap_err();
    assert!(
        matches!(err, AmpError::OutcomeNotUpdated { step: 1 }),
        "{err}"
    );
    assert_eq!(master_bits(&model), weights);
}

#[test]
fn two_optimizers_sharing_a_scaler_give_both_outcomes_to_one_update() {
    let (dev, mut a, mut opt_a) = setup(3);
    let (_, mut b, mut opt_b) = setup(4);
    let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
    // Model a steps, then model b is traced, backward and stepped before the one update (the
    // order of a GAN's iteration), three times.
    for _ in 0..3 {
        let outcome_a = step(&dev, &mut a, &mut opt_a, &scaler);
        let outcome_b = step(&dev, &mut b, &mut opt_b, &scaler);
        let _grads: (MixedGradients<Cpu>, MixedGradients<Cpu>) =
            scaler.update((outcome_a, outcome_b)).unwrap();
    }
    assert_eq!(scaler.get_scale(), 8192.0, "three clean iterations");
    // One outcome left out of the update: refused before the scale changes, naming the step.
    let outcome_a = step(&dev, &mut a, &mut opt_a, &scaler);
    let outcome_b = step(&dev, &mut b, &mut opt_b, &scaler);
    drop(outcome_b);
    let err = scaler.update(outcome_a).unwrap_err();
    assert!(
        matches!(err, AmpError::OutcomeNotUpdated { step: 8 }),
        "{err}"
    );
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (8192.0, 0));
}

#[test]
fn a_data_parallel_outcome_lost_is_an_error_at_the_next_backward() {
    let (dev, mut model, mut opt) = setup(5);
    let mut dist = DataParallel::new(GradScaler::dynamic(), SingleProcess).unwrap();
    let mut grads = model.alloc_grads().unwrap();
    for _ in 0..2 {
        let scaled = dist.scale(loss(&dev, &model, grads)).backward().unwrap();
        let local = dist.unscale(&mut model, scaled).unwrap();
        let averaged = dist.all_reduce(local).unwrap();
        let outcome = dist.step(&mut opt, averaged).unwrap();
        grads = dist.update(outcome).unwrap();
    }
    let scaled = dist.scale(loss(&dev, &model, grads)).backward().unwrap();
    let local = dist.unscale(&mut model, scaled).unwrap();
    let averaged = dist.all_reduce(local).unwrap();
    std::mem::forget(dist.step(&mut opt, averaged).unwrap());
    let grads = model.alloc_grads().unwrap();
    let err = dist
        .scale(loss(&dev, &model, grads))
        .backward()
        .unwrap_err();
    assert!(
        matches!(err, AmpError::OutcomeNotUpdated { step: 3 }),
        "{err}"
    );
}

#[test]
fn a_loss_never_merged_is_refused_before_the_weights_change() {
    let (dev, mut model, mut opt) = setup(6);
    let mut scalers = LossScalers::new(2, GradScaler::dynamic());
    // A clean iteration first, so that the optimizer has state to keep.
    for _ in 0..2 {
        let (s0, s1) = (scalers.get(0).unwrap(), scalers.get(1).unwrap());
        let first = s0
            .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
            .backward()
            .unwrap();
        let second = s1
            .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
            .backward()
            .unwrap();
        let mut total = s0.unscale(&mut model, first).unwrap();
        total.merge(s1, second).unwrap();
        let outcome = s0.step(&mut opt, total).unwrap();
        scalers.update(outcome).unwrap();
    }
    let (weights, states) = (
        master_bits(&model),
        scalers.iter().map(GradScaler::state).collect::<Vec<_>>(),
    );
    let (s0, s1) = (scalers.get(0).unwrap(), scalers.get(1).unwrap());
    let first = s0
        .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    let _second = s1
        .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    // The second loss is never merged: the step is refused, and nothing has changed.
    let total = s0.unscale(&mut model, first).unwrap();
    let err = s0.step(&mut opt, total).unwrap_err();
    assert!(
        matches!(err, AmpError::LossNotMerged { loss: 1, losses: 2 }),
        "{err}"
    );
    assert!(err.to_string().contains("merge"), "{err}");
    assert_eq!(master_bits(&model), weights, "weights changed");
    assert_eq!(
        scalers.iter().map(GradScaler::state).collect::<Vec<_>>(),
        states
    );
    // A clone is a group of its own: its scalers' losses are not these.
    let copy = scalers.clone();
    let (c0, c1) = (copy.get(0).unwrap(), copy.get(1).unwrap());
    let first = c0
        .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    let second = c1
        .scale(loss(&dev, &model, model.alloc_grads().unwrap()))
        .backward()
        .unwrap();
    let mut total = c0.unscale(&mut model, first).unwrap();
    assert!(total.merge(scalers.get(1).unwrap(), second).is_err());
}

/// Issue 34, item 8: an outcome dropped in a run's last iteration has no later backward or
/// update to notice it; saving a checkpoint then would record a scaler that never counted
/// the step. `checkpoint::save` refuses it with the rule's error, naming the file and the step,
/// and writes nothing; once the outcome reaches the update, the save goes through.
#[test]
fn a_checkpoint_is_not_saved_while_a_steps_outcome_has_not_reached_the_update() {
    use std::collections::BTreeMap;
    use typed_amp::checkpoint::{self, CheckpointError};
    let dir = std::env::temp_dir().join(format!("typed-amp-outcome-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.st");
    let (dev, mut model, mut opt) = setup(7);
    let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
    let outcome = step(&dev, &mut model, &mut opt, &scaler);
    scaler.update(outcome).unwrap();
    let last = step(&dev, &mut model, &mut opt, &scaler);
    assert!(scaler.check_no_step_in_flight().is_err());
    let err = checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::Rule {
                source: AmpError::OutcomeNotUpdated { step: 2 },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(path.to_str().unwrap()) && err.to_string().contains("step 2"),
        "{err}"
    );
    assert!(!path.exists(), "a file was written");
    scaler.update(last).unwrap();
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The child process's half of the next test (set in its environment).
const DROP_WARNING_CHILD: &str = "TYPED_AMP_STEP_OUTCOMES_DROP_WARNING_CHILD";
/// The start of the warning a scaler dropped with a step in flight prints in debug builds.
const DROP_WARNING: &str = "typed-amp warning: a GradScaler was dropped";

#[test]
fn a_scaler_dropped_holding_a_step_whose_outcome_never_reached_update_warns_once_in_debug_builds() {
    if std::env::var_os(DROP_WARNING_CHILD).is_some() {
        // A scaler whose every outcome reached its update: no warning.
        let (dev, mut model, mut opt) = setup(1);
        let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
        let outcome = step(&dev, &mut model, &mut opt, &scaler);
        scaler.update(outcome).unwrap();
        drop(scaler);
        eprintln!("child: the updated scaler is gone");
        // Two models stepped with one scaler; step 1's outcome is updated, steps 2 and 3 (the
        // last iteration's) are lost: one warning, when the scaler goes, naming both.
        let (_, mut other, mut other_opt) = setup(2);
        let mut scaler = GradScaler::new(1024.0, 2.0, 0.5, 1).unwrap();
        let outcome = step(&dev, &mut model, &mut opt, &scaler);
        scaler.update(outcome).unwrap();
        let lost = step(&dev, &mut model, &mut opt, &scaler);
        let also_lost = step(&dev, &mut other, &mut other_opt, &scaler);
        drop((lost, also_lost));
        eprintln!("child: dropping the scaler with two steps in flight");
        drop(scaler);
        eprintln!("child: done");
        return;
    }
    // The warning goes to the process's stderr, which a test cannot read: run this test again
    // as a child process and read the child's.
    // The test's name in its binary: this module's path below the crate root, then the function.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let name = format!(
        "{module}::a_scaler_dropped_holding_a_step_whose_outcome_never_reached_update_warns_once_in_debug_builds"
    );
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(DROP_WARNING_CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {stderr}");
    assert!(stderr.contains("child: done"), "the child ran: {stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(DROP_WARNING))
        .collect();
    if cfg!(debug_assertions) {
        assert_eq!(warnings.len(), 1, "one warning: {stderr}");
        assert!(
            warnings[0].contains("holding steps 2, 3 "),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("scaler.update(outcome)"),
            "{}",
            warnings[0]
        );
        // Printed when the scaler with steps in flight went, not when the updated one did.
        let warned = stderr.find(DROP_WARNING).unwrap();
        let dropping = stderr.find("child: dropping the scaler").unwrap();
        assert!(warned > dropping, "{stderr}");
    } else {
        assert!(
            warnings.is_empty(),
            "release builds print nothing: {stderr}"
        );
    }
}
