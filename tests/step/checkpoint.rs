//! Checkpoints restore master weights, optimizer state and scaler state exactly, are readable
//! by name with any safetensors reader, and refuse files that are not theirs, in FP16 and in
//! BF16 (whose O3 weights are saved as BF16).

use std::collections::BTreeMap;

use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::dfdx::nn::builders::{BatchNorm1D, Linear};
use typed_amp::dfdx::optim::Adam;
use typed_amp::prelude::*;
use typed_amp::tape::MixedTape;
use typed_amp::{optim::LowPrecisionUpdates, optim::MasterOptimizer, precision::DType};

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
pub struct Net {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

use crate::common;
use common::{optimizer_bytes, param_bytes, rewrite, RawMetadata, RawTensors, TempDir};

type Model = <Net as typed_amp::amp::AmpModel<Cpu>>::Weights;

fn batch(dev: &Cpu, i: u64) -> (Tensor<Rank2<5, 6>, f32, Cpu>, Tensor<Rank2<5, 3>, f32, Cpu>) {
    let x: Tensor<Rank2<5, 6>, f32, Cpu> = Cpu::seed_from_u64(i).sample_normal();
    let y = dev.tensor([
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
    ]);
    (x, y)
}

fn train_steps(
    model: &mut Model,
    opt: &mut Adam<NetMaster<Cpu>, f32, Cpu>,
    scaler: &mut GradScaler,
    steps: std::ops::Range<u64>,
) {
    let dev = Cpu::default();
    let mut grads = model.alloc_grads().unwrap();
    for i in steps {
        let (x, y) = batch(&dev, i);
        let logits = model.working_mut().forward_mut(x.traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, y);
        let scaled = scaler.scale(loss).backward().unwrap();
        let unscaled = scaler.unscale(model, scaled).unwrap();
        let outcome = scaler.step(opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
}

fn master_bits(model: &Model) -> Vec<u32> {
    let m = model.master();
    [
        m.fc1.weight.as_vec(),
        m.fc1.bias.as_vec(),
        m.bn.scale.as_vec(),
        m.bn.bias.as_vec(),
        m.bn.running_mean.as_vec(),
        m.bn.running_var.as_vec(),
        m.fc2.weight.as_vec(),
        m.fc2.bias.as_vec(),
    ]
    .concat()
    .into_iter()
    .map(f32::to_bits)
    .collect()
}

#[test]
fn a_resumed_run_matches_the_uninterrupted_one_bit_for_bit() {
    let dev = Cpu::seed_from_u64(0);
    let dir = TempDir::new("checkpoint-resume");
    let path = dir.join("model.safetensors");

    let mut model = Net::build(&dev).unwrap();
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::new(256.0, 2.0, 0.5, 3).unwrap();
    train_steps(&mut model, &mut opt, &mut scaler, 0..5);
    let extra = BTreeMap::from([("step".to_string(), "5".to_string())]);
    let size = checkpoint::save(&path, &mut model, &opt, &scaler, &extra).unwrap();
    assert_eq!(size, std::fs::metadata(&path).unwrap().len());
    train_steps(&mut model, &mut opt, &mut scaler, 5..12);

    // A fresh process's worth of state, initialised differently, then restored.
    let mut resumed = Net::build(&Cpu::seed_from_u64(99)).unwrap();
    let mut resumed_opt = Adam::new(resumed.master(), AdamConfig::default());
    let mut resumed_scaler = GradScaler::default();
    let meta =
        checkpoint::load(&path, &mut resumed, &mut resumed_opt, &mut resumed_scaler).unwrap();
    assert_eq!(meta, extra);
    assert_eq!(resumed_opt.step_count(), 5);
    train_steps(&mut resumed, &mut resumed_opt, &mut resumed_scaler, 5..12);

    assert_eq!(master_bits(&resumed), master_bits(&model));
    assert_eq!(resumed_scaler.state(), scaler.state());
    assert_eq!(
        resumed.working().fc1.weight.as_vec(),
        model.working().fc1.weight.as_vec()
    );
}

#[test]
fn tensors_are_readable_by_name_with_any_safetensors_reader() {
    let dev = Cpu::seed_from_u64(1);
    let dir = TempDir::new("checkpoint-names");
    let path = dir.join("model.safetensors");
    let mut model = Net::build(&dev).unwrap();
    let opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    checkpoint::save(
        &path,
        &mut model,
        &opt,
        &GradScaler::default(),
        &BTreeMap::new(),
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let weight = file.tensor("master.fc1.weight").unwrap();
    assert_eq!(weight.shape(), &[8, 6]);
    assert_eq!(weight.dtype(), safetensors::Dtype::F32);
    let first = f32::from_le_bytes(weight.data()[..4].try_into().unwrap());
    assert_eq!(first, model.master().fc1.weight.as_vec()[0]);
    assert!(file.tensor("master.bn.running_var").is_ok());
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().as_ref().unwrap();
    assert_eq!(meta["format"], checkpoint::FORMAT);
    assert_eq!(meta["scaler.mode"], "dynamic");
    assert_eq!(
        f32::from_bits(meta["scaler.scale_bits"].parse().unwrap()),
        65536.0
    );
}

#[test]
fn foreign_or_damaged_files_are_refused_without_touching_the_model() {
    let dev = Cpu::seed_from_u64(2);
    let dir = TempDir::new("checkpoint-bad");
    let path = dir.join("model.safetensors");
    let mut model = Net::build(&dev).unwrap();
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::default();
    let before = master_bits(&model);

    std::fs::write(&path, b"not a checkpoint").unwrap();
    let err = checkpoint::load(&path, &mut model, &mut opt, &mut scaler).unwrap_err();
    assert!(matches!(err, CheckpointError::Format { .. }), "{err}");

    let missing = path.with_file_name("missing.safetensors");
    let err = checkpoint::load(&missing, &mut model, &mut opt, &mut scaler).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Io { .. })
            && err.to_string().contains("missing.safetensors")
    );

    // A checkpoint of an Adam run cannot restore an SGD optimizer.
    let adam = typed_amp::optim::adam(model.master(), AdamConfig::default());
    checkpoint::save(&path, &mut model, &adam, &scaler, &BTreeMap::new()).unwrap();
    let err = checkpoint::load(&path, &mut model, &mut opt, &mut scaler).unwrap_err();
    assert!(err.to_string().contains("optimizer `adam`"), "{err}");
    assert_eq!(master_bits(&model), before);
}

#[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
pub struct NetBf16 {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

#[typed_amp::amp(
    policy = "O3",
    dtype = "bf16",
    allow_bf16_updates,
    cast_model_outputs = "fp32"
)]
pub struct NetO3Bf16 {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

type ModelBf16 = <NetBf16 as typed_amp::amp::AmpModel<Cpu>>::Weights;
type ModelO3Bf16 = <NetO3Bf16 as typed_amp::amp::AmpModel<Cpu>>::Weights;

/// Training steps of a BF16 model: no loss scaler, `loss.backward()?.check(..)?.step(..)?`.
fn train_steps_scale_free<T, O>(model: &mut T, opt: &mut O, steps: std::ops::Range<u64>)
where
    T: TrainTarget<Cpu>,
    T::Precision: typed_amp::precision::FullRange,
    T::Working: ModuleMut<
        Tensor<Rank2<5, 6>, f32, Cpu, MixedTape<Cpu>>,
        Output = Tensor<Rank2<5, 3>, f32, Cpu, MixedTape<Cpu>>,
    >,
    O: MasterOptimizer<T::Master, Cpu>,
{
    let dev = Cpu::default();
    let mut grads = model.alloc_grads().unwrap();
    for i in steps {
        let (x, y) = batch(&dev, i);
        let logits = model
            .working_mut()
            .try_forward_mut(x.traced_mixed(grads))
            .unwrap();
        let loss = cross_entropy_with_logits_loss(logits, y);
        let outcome = loss
            .backward()
            .unwrap()
            .check(model)
            .unwrap()
            .step(opt)
            .unwrap();
        assert!(!outcome.skipped());
        grads = outcome.into_grads();
    }
}

#[test]
fn a_resumed_bf16_run_matches_the_uninterrupted_one_bit_for_bit() {
    let dev = Cpu::seed_from_u64(0);
    let dir = TempDir::new("checkpoint-resume-bf16");
    let path = dir.join("model.safetensors");

    let mut model: ModelBf16 = NetBf16::build(&dev).unwrap();
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    // BF16 trains without a loss scale: the checkpoint stores a disabled scaler.
    let scaler = NetBf16::scaler();
    assert!(!scaler.is_enabled());
    train_steps_scale_free(&mut model, &mut opt, 0..5);
    let extra = BTreeMap::from([("step".to_string(), "5".to_string())]);
    checkpoint::save(&path, &mut model, &opt, &scaler, &extra).unwrap();

    // The file holds the FP32 masters bit for bit, and says the model trains in BF16.
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (p, dtype, values) in param_bytes(model.master()) {
        assert_eq!(dtype, DType::F32, "{p}");
        let view = file.tensor(&format!("master.{p}")).unwrap();
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "master.{p}");
        assert_eq!(view.data(), values.as_slice(), "master.{p}");
    }
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        header.metadata().as_ref().unwrap()["model.precision"],
        "BF16"
    );

    train_steps_scale_free(&mut model, &mut opt, 5..12);

    let mut resumed: ModelBf16 = NetBf16::build(&Cpu::seed_from_u64(99)).unwrap();
    let mut resumed_opt = Adam::new(resumed.master(), AdamConfig::default());
    // A BF16 model's scaler is off; the checkpoint's mode must match this run's.
    let mut resumed_scaler = NetBf16::scaler();
    assert_ne!(param_bytes(resumed.master()), param_bytes(model.master()));
    let meta =
        checkpoint::load(&path, &mut resumed, &mut resumed_opt, &mut resumed_scaler).unwrap();
    assert_eq!(meta, extra);
    assert_eq!(resumed_opt.step_count(), 5);
    assert_eq!(
        resumed_scaler.state(),
        scaler.state(),
        "the disabled scaler"
    );
    train_steps_scale_free(&mut resumed, &mut resumed_opt, 5..12);

    // Master weights (batch norm's running statistics included), the BF16 working copy and
    // Adam's state, bit for bit.
    assert_eq!(param_bytes(resumed.master()), param_bytes(model.master()));
    assert_eq!(param_bytes(resumed.working()), param_bytes(model.working()));
    assert_eq!(
        optimizer_bytes(&resumed_opt, resumed.master()),
        optimizer_bytes(&opt, model.master())
    );
    let working = param_bytes(model.working());
    assert!(working.iter().any(|(_, d, _)| *d == DType::BF16));
    assert!(working.iter().all(|(p, d, _)| *d
        == if p.starts_with("bn") {
            DType::F32
        } else {
            DType::BF16
        }));
}

#[test]
fn o3_bf16_weights_are_saved_in_bf16_and_restored_exactly() {
    let dev = Cpu::seed_from_u64(3);
    let dir = TempDir::new("checkpoint-o3-bf16");
    let path = dir.join("model.safetensors");

    let mut model: ModelO3Bf16 = NetO3Bf16::build(&dev).unwrap();
    let mut opt = LowPrecisionUpdates(Adam::<_, bf16, _>::new(
        model.master(),
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    ));
    train_steps_scale_free(&mut model, &mut opt, 0..4);
    checkpoint::save(
        &path,
        &mut model,
        &opt,
        &NetO3Bf16::scaler(),
        &BTreeMap::new(),
    )
    .unwrap();

    // Every tensor in the file is BF16, bit for bit the model's (and Adam's BF16 moments).
    let saved = param_bytes(model.master());
    assert!(saved.iter().all(|(_, d, _)| *d == DType::BF16));
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, view) in file.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::BF16, "{name}");
    }
    for (p, _, values) in &saved {
        let view = file.tensor(&format!("master.{p}")).unwrap();
        assert_eq!(view.data(), values.as_slice(), "master.{p}");
    }
    let weight = file.tensor("master.fc1.weight").unwrap();
    let first = bf16::from_le_bytes([weight.data()[0], weight.data()[1]]);
    assert_eq!(
        first.to_bits(),
        model.master().fc1.weight.as_vec()[0].to_bits()
    );
    assert!(file.tensor("master.bn.running_var").is_ok());
    assert!(file.tensor("optim.moment2.fc2.weight").is_ok());

    let mut resumed: ModelO3Bf16 = NetO3Bf16::build(&Cpu::seed_from_u64(98)).unwrap();
    let mut resumed_opt = LowPrecisionUpdates(Adam::<_, bf16, _>::new(
        resumed.master(),
        AdamConfig {
            lr: 1e-2,
            ..Default::default()
        },
    ));
    let mut scaler = NetO3Bf16::scaler();
    checkpoint::load(&path, &mut resumed, &mut resumed_opt, &mut scaler).unwrap();
    assert_eq!(param_bytes(resumed.master()), saved);
    assert_eq!(
        optimizer_bytes(&resumed_opt, resumed.master()),
        optimizer_bytes(&opt, model.master())
    );
    assert!(!scaler.is_enabled());

    // And they continue alike.
    train_steps_scale_free(&mut model, &mut opt, 4..8);
    train_steps_scale_free(&mut resumed, &mut resumed_opt, 4..8);
    assert_eq!(param_bytes(resumed.master()), param_bytes(model.master()));
}

#[test]
fn a_bf16_checkpoint_is_refused_by_an_fp16_model_without_touching_it() {
    let dir = TempDir::new("checkpoint-bf16-into-fp16");
    let path = dir.join("bf16.safetensors");
    let mut bf16_model: ModelBf16 = NetBf16::build(&Cpu::seed_from_u64(6)).unwrap();
    let mut bf16_opt = Adam::new(bf16_model.master(), AdamConfig::default());
    train_steps_scale_free(&mut bf16_model, &mut bf16_opt, 0..3);
    checkpoint::save(
        &path,
        &mut bf16_model,
        &bf16_opt,
        &NetBf16::scaler(),
        &BTreeMap::new(),
    )
    .unwrap();

    // The FP32 masters of O2-BF16 and O2-FP16 have the same parameters: only the checkpoint's
    // precision tells them apart.
    let dev = Cpu::seed_from_u64(7);
    let mut model = Net::build(&dev).unwrap();
    let mut opt = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::new(256.0, 2.0, 0.5, 3).unwrap();
    train_steps(&mut model, &mut opt, &mut scaler, 0..3);
    let (master, working) = (param_bytes(model.master()), param_bytes(model.working()));
    let state = optimizer_bytes(&opt, model.master());
    let scaler_state = scaler.state();

    let err = checkpoint::load(&path, &mut model, &mut opt, &mut scaler).unwrap_err();
    let message = err.to_string();
    eprintln!("{message}");
    assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err:?}");
    assert!(message.contains("BF16"), "names BF16: {message}");
    assert!(
        message.replace("BF16", "").contains("F16"),
        "names F16: {message}"
    );
    assert_eq!(param_bytes(model.master()), master);
    assert_eq!(param_bytes(model.working()), working);
    assert_eq!(optimizer_bytes(&opt, model.master()), state);
    assert_eq!(scaler.state(), scaler_state);

    // And the other way round.
    let fp16_path = dir.join("fp16.safetensors");
    checkpoint::save(&fp16_path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    let before = param_bytes(bf16_model.master());
    let mut bf16_scaler = NetBf16::scaler();
    let err =
        checkpoint::load(&fp16_path, &mut bf16_model, &mut bf16_opt, &mut bf16_scaler).unwrap_err();
    assert!(err.to_string().contains("BF16"), "{err}");
    assert_eq!(param_bytes(bf16_model.master()), before);
}

#[test]
fn incomplete_non_finite_or_out_of_range_state_is_refused_before_anything_changes() {
    let dev = Cpu::seed_from_u64(3);
    let dir = TempDir::new("checkpoint-invalid");
    let path = dir.join("run.safetensors");
    let mut model = Net::build(&dev).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();
    train_steps(&mut model, &mut opt, &mut scaler, 0..3);
    // A killed earlier write (a process that no longer runs) left its temporary file behind.
    let stale = dir.join(".run.safetensors.tmp-4294967294");
    std::fs::write(&stale, b"partial").unwrap();
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    assert!(!stale.exists(), "the stale temporary file was not removed");
    let saved = std::fs::read(&path).unwrap();

    let mut fresh = Net::build(&Cpu::seed_from_u64(4)).unwrap();
    let mut fresh_opt: Adam<NetMaster<Cpu>, f32, Cpu> =
        Adam::new(fresh.master(), AdamConfig::default());
    let mut fresh_scaler = GradScaler::default();
    let before = master_bits(&fresh);
    let mut refused = |edit: &dyn Fn(&mut RawTensors, &mut RawMetadata)| -> String {
        std::fs::write(&path, &saved).unwrap();
        rewrite(&path, |t, m| edit(t, m));
        let err = checkpoint::load(&path, &mut fresh, &mut fresh_opt, &mut fresh_scaler)
            .expect_err("an invalid checkpoint loaded");
        assert_eq!(
            master_bits(&fresh),
            before,
            "a refused load changed the model"
        );
        assert_eq!(fresh_scaler.get_scale(), 65536.0);
        let err = err.to_string();
        assert!(
            err.contains(path.to_str().unwrap()),
            "every refusal names the file: {err}"
        );
        err
    };

    // One parameter's Adam moment missing while the others are there.
    let err = refused(&|t, _| t.retain(|(name, ..)| name != "optim.moment2.fc2.bias"));
    assert!(
        err.contains("optim.moment2.fc2.bias") && err.contains("missing"),
        "{err}"
    );
    // A NaN in a master tensor (written after the other tensors have been checked).
    let err = refused(&|t, _| {
        let w = t
            .iter_mut()
            .find(|(name, ..)| name == "master.fc2.weight")
            .unwrap();
        w.3[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    assert!(
        err.contains("master.fc2.weight") && err.contains("non-finite"),
        "{err}"
    );
    // A negative Adam step count.
    let err = refused(&|_, m| {
        m.insert("optim.scalar.step_count".into(), "-5".into());
    });
    assert!(err.contains("cannot be negative"), "{err}");
    // A scale whose inverse overflows in FP32.
    let err = refused(&|_, m| {
        m.insert(
            "scaler.scale_bits".into(),
            (typed_amp::scaler::SMALLEST_SCALE / 4.0)
                .to_bits()
                .to_string(),
        );
    });
    assert!(err.contains("2^-126"), "{err}");
    // A checkpoint whose scaler is off (an O0 run's) would switch this run's dynamic scaling off.
    let err = refused(&|_, m| {
        m.insert("scaler.mode".into(), "disabled".into());
        m.insert("scaler.scale_bits".into(), 1f32.to_bits().to_string());
    });
    assert!(err.contains("Disabled") && err.contains("Dynamic"), "{err}");
    // A static scale above FP16's largest value, which no constructor accepts, is refused as
    // the same rule (before the mode is compared).
    let err = refused(&|_, m| {
        m.insert("scaler.mode".into(), "static".into());
        m.insert("scaler.scale_bits".into(), 70000f32.to_bits().to_string());
    });
    assert!(err.contains("70000") && err.contains("65504"), "{err}");
    // A finite negative value in Adam's second moment (one of 30 random byte flips hit this):
    // `sqrt(v)` would put NaN into the master on the first step. It used to be accepted.
    let err = refused(&|t, _| {
        let v = t
            .iter_mut()
            .find(|(name, ..)| name == "optim.moment2.fc1.weight")
            .unwrap();
        v.3[4..8].copy_from_slice(&(-1.5f32).to_le_bytes());
    });
    assert!(
        err.contains("tensor `optim.moment2.fc1.weight`")
            && err.contains("holds a negative value (-1.5 at element 1)"),
        "{err}"
    );
    // A negative first moment is a valid state (a mean of signed gradients); inf is not.
    let err = refused(&|t, _| {
        let v = t
            .iter_mut()
            .find(|(name, ..)| name == "optim.moment1.fc2.bias")
            .unwrap();
        v.3[..4].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    });
    assert!(
        err.contains("optim.moment1.fc2.bias") && err.contains("non-finite value (-inf"),
        "{err}"
    );
    // A step count of 0 beside moments that three updates wrote.
    let err = refused(&|_, m| {
        m.insert("optim.scalar.step_count".into(), "0".into());
    });
    assert!(
        err.contains("inconsistent") && err.contains("Adam's step count is 0"),
        "{err}"
    );
    // One moment removed whole, its recorded count edited to match.
    let err = refused(&|t, m| {
        t.retain(|(name, ..)| !name.starts_with("optim.moment1."));
        m.insert("optim.entries.moment1".into(), "0".into());
    });
    assert!(
        err.contains("`moment1` holds state for 0 parameters and its `moment2` for 6"),
        "{err}"
    );

    // The untouched file still loads.
    std::fs::write(&path, &saved).unwrap();
    checkpoint::load(&path, &mut fresh, &mut fresh_opt, &mut fresh_scaler).unwrap();
    assert_eq!(master_bits(&fresh), master_bits(&model));
}

/// `save` refuses to write what `load` would refuse to read: a non-finite master or optimizer
/// value, or a negative Adam second moment (a run whose loss is not finite used to save its
/// NaN weights over its last good checkpoint). The earlier file stays as it was.
#[test]
fn state_that_breaks_its_invariants_is_not_saved_over_an_earlier_checkpoint() {
    use typed_amp::device::HostKernel;
    use typed_amp::master::TrainTarget;
    let dev = Cpu::seed_from_u64(8);
    let dir = TempDir::new("checkpoint-save-invalid");
    let path = dir.join("run.safetensors");
    let mut model = Net::build(&dev).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();
    train_steps(&mut model, &mut opt, &mut scaler, 0..2);
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    let good = std::fs::read(&path).unwrap();

    // A negative second moment.
    let weight = model.master().fc1.weight.clone();
    let m2 = opt.moments_mut().1.get_or_alloc_mut(&weight).unwrap();
    let saved_m2 = HostKernel::<f32>::try_read(&dev, m2).unwrap();
    let mut bad = saved_m2.clone();
    bad[2] = -0.25;
    HostKernel::<f32>::try_write(&dev, m2, &bad).unwrap();
    let err = checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new())
        .expect_err("a negative second moment was saved")
        .to_string();
    assert!(
        err.contains(path.to_str().unwrap())
            && err.contains("tensor `optim.moment2.fc1.weight`: not saved")
            && err.contains("negative value (-0.25 at element 2)"),
        "{err}"
    );
    assert!(std::fs::read(&path).unwrap() == good, "the file changed");
    let m2 = opt.moments_mut().1.get_or_alloc_mut(&weight).unwrap();
    HostKernel::<f32>::try_write(&dev, m2, &saved_m2).unwrap();

    // A NaN master weight.
    let mut values = model.master().fc2.bias.as_vec();
    values[0] = f32::NAN;
    HostKernel::<f32>::try_write(&dev, model.master_mut().fc2.bias.storage_mut(), &values).unwrap();
    let err = checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new())
        .expect_err("a NaN master was saved")
        .to_string();
    assert!(
        err.contains("tensor `master.fc2.bias`: not saved") && err.contains("non-finite"),
        "{err}"
    );
    assert!(std::fs::read(&path).unwrap() == good, "the file changed");
}

#[test]
fn a_checkpoint_stripped_of_all_optimizer_state_is_refused_but_one_saved_before_any_step_loads() {
    use typed_amp::optim::OptimizerState;
    let dev = Cpu::seed_from_u64(5);
    let dir = TempDir::new("checkpoint-no-state");
    let path = dir.join("run.safetensors");
    let mut model = Net::build(&dev).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();
    let mut fresh = Net::build(&Cpu::seed_from_u64(6)).unwrap();
    let mut fresh_opt: Adam<NetMaster<Cpu>, f32, Cpu> =
        Adam::new(fresh.master(), AdamConfig::default());
    let mut fresh_scaler = GradScaler::default();
    let optim_tensors = |path: &std::path::Path| {
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        file.names()
            .into_iter()
            .filter(|n| n.starts_with("optim."))
            .count()
    };

    // Saved before the optimizer's first update: it has no state yet, and none loads.
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    assert_eq!(optim_tensors(&path), 0);
    checkpoint::load(&path, &mut fresh, &mut fresh_opt, &mut fresh_scaler).unwrap();
    assert_eq!(master_bits(&fresh), master_bits(&model));

    // After three steps it has: a file with all of it removed is refused, naming the file and
    // a missing tensor, before anything changes (it used to load with a fresh Adam).
    train_steps(&mut model, &mut opt, &mut scaler, 0..3);
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    assert!(optim_tensors(&path) > 0);
    rewrite(&path, |tensors, _| {
        tensors.retain(|(name, ..)| !name.starts_with("optim."))
    });
    let mut fresh = Net::build(&Cpu::seed_from_u64(6)).unwrap();
    let mut fresh_opt: Adam<NetMaster<Cpu>, f32, Cpu> =
        Adam::new(fresh.master(), AdamConfig::default());
    let before = master_bits(&fresh);
    let err = checkpoint::load(&path, &mut fresh, &mut fresh_opt, &mut fresh_scaler)
        .expect_err("a checkpoint without its optimizer state loaded");
    let message = err.to_string();
    assert!(
        matches!(&err, CheckpointError::Tensor { name, .. } if name.starts_with("optim.moment1.")),
        "{err:?}"
    );
    assert!(
        message.starts_with(&path.display().to_string())
            && message.contains("missing")
            && message.contains("adam"),
        "{message}"
    );
    assert_eq!(
        master_bits(&fresh),
        before,
        "a refused load changed the model"
    );
    assert_eq!(fresh_opt.scalars(), [("step_count", 0)]);
    assert_eq!(fresh_scaler.get_scale(), 65536.0);
}

#[test]
fn damaged_files_are_refused_in_sentences_that_name_the_file() {
    let dev = Cpu::seed_from_u64(8);
    let dir = TempDir::new("checkpoint-sentences");
    let path = dir.join("x.st");
    let mut model = Net::build(&dev).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::default();
    checkpoint::save(&path, &mut model, &opt, &scaler, &BTreeMap::new()).unwrap();
    let saved = std::fs::read(&path).unwrap();
    let before = master_bits(&model);

    // A header length no file this size can hold, under and over safetensors' 100 MB limit.
    let mut small_lie = 1000u64.to_le_bytes().to_vec();
    small_lie.extend_from_slice(b"{}");
    let mut huge_lie = (1u64 << 40).to_le_bytes().to_vec();
    huge_lie.extend_from_slice(b"{}");
    let mut not_json = 4u64.to_le_bytes().to_vec();
    not_json.extend_from_slice(b"abcd");
    let cases: [(&str, Vec<u8>, &str); 7] = [
        ("truncated", saved[..saved.len() - 8].to_vec(), "truncated"),
        (
            "cut in its header",
            saved[..saved.len() / 2].to_vec(),
            "larger than the file",
        ),
        ("four bytes", saved[..4].to_vec(), "too short"),
        ("small lie", small_lie, "larger than the file"),
        ("huge lie", huge_lie, "larger than the file"),
        ("not json", not_json, "header is not"),
        (
            "text",
            b"not a checkpoint at all".to_vec(),
            "larger than the file",
        ),
    ];
    for (case, bytes, says) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let errors = [
            checkpoint::load(&path, &mut model, &mut opt, &mut scaler).unwrap_err(),
            checkpoint::read_metadata(&path).unwrap_err(),
        ];
        for err in errors {
            let message = err.to_string();
            eprintln!("{case}: {message}");
            assert!(
                matches!(err, CheckpointError::Format { .. }),
                "{case}: {err:?}"
            );
            assert!(
                message.starts_with(&format!(
                    "{} is not a safetensors checkpoint: ",
                    path.display()
                )),
                "{case}: {message}"
            );
            assert!(message.contains(says), "{case}: {message}");
            assert_eq!(
                common::camel_case_word(&message),
                None,
                "{case}: an enum name in `{message}`"
            );
        }
    }
    assert_eq!(master_bits(&model), before);
}

#[typed_amp::amp(policy = "O1", cast_model_outputs = "fp32")]
pub struct NetO1 {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

#[typed_amp::amp(policy = "O3", allow_fp16_updates, cast_model_outputs = "fp32")]
pub struct NetO3 {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

#[typed_amp::amp(
    policy = "O2",
    keep_batchnorm_fp32 = false,
    cast_model_outputs = "fp32"
)]
pub struct NetFp16Norms {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

#[typed_amp::amp(policy = "O2")]
pub struct NetFp16Outputs {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

/// Loads `path` into a fresh `M` with the optimizer `make_opt` builds, with and without its
/// policy; both loads must be refused without changing the model. Returns the two messages.
fn refused_into<M, O>(
    path: &std::path::Path,
    make_opt: impl Fn(&typed_amp::amp::MasterOf<M, Cpu>) -> O,
) -> [String; 2]
where
    M: typed_amp::amp::AmpModel<Cpu>,
    O: typed_amp::optim::OptimizerState<Cpu>,
{
    let attempt = |policy: Option<&typed_amp::amp::AmpConfig>| {
        let mut model = M::try_build(&Cpu::seed_from_u64(11)).unwrap();
        let mut opt = make_opt(model.master());
        let mut scaler = M::scaler();
        let (master, working) = (param_bytes(model.master()), param_bytes(model.working()));
        let scaler_state = scaler.state();
        let err = match policy {
            Some(policy) => {
                checkpoint::load_with_policy(path, &mut model, &mut opt, &mut scaler, policy)
            }
            None => checkpoint::load(path, &mut model, &mut opt, &mut scaler),
        }
        .expect_err("a checkpoint of another policy loaded");
        assert!(matches!(err, CheckpointError::Mismatch { .. }), "{err:?}");
        assert_eq!(param_bytes(model.master()), master);
        assert_eq!(param_bytes(model.working()), working);
        assert_eq!(scaler.state(), scaler_state);
        eprintln!("{}", err);
        err.to_string()
    };
    [attempt(Some(&M::CONFIG)), attempt(None)]
}

fn adam<M: typed_amp::dfdx::nn::TensorCollection<f32, Cpu>>(master: &M) -> Adam<M, f32, Cpu> {
    Adam::new(master, AdamConfig::default())
}

#[test]
fn a_checkpoint_of_another_policy_is_refused_naming_both_settings() {
    let dir = TempDir::new("checkpoint-policy");
    let (with_policy, without) = (dir.join("o2.st"), dir.join("o2-plain.st"));
    let mut model = Net::build(&Cpu::seed_from_u64(10)).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = Net::scaler();
    train_steps(&mut model, &mut opt, &mut scaler, 0..2);
    let extra = BTreeMap::new();
    checkpoint::save_with_policy(
        &with_policy,
        &mut model,
        &opt,
        &scaler,
        &Net::AMP_CONFIG,
        &extra,
    )
    .unwrap();
    checkpoint::save(&without, &mut model, &opt, &scaler, &extra).unwrap();

    // O2 into O1: the same FP32 masters, precision and scaler; only the policy differs.
    let [named, plain] = refused_into::<NetO1, _>(&with_policy, adam);
    assert!(
        named.contains("opt_level is O2 in the checkpoint, O1 here"),
        "{named}"
    );
    assert!(
        named.contains("master_weights is true in the checkpoint, false here"),
        "{named}"
    );
    assert!(
        plain.contains("F16 in the checkpoint's working copy, F32 in this model's"),
        "{plain}"
    );
    assert!(plain.contains("it was saved under O2-FP16"), "{plain}");
    // A checkpoint saved without its policy is still told apart by its working copy.
    let [named, plain] = refused_into::<NetO1, _>(&without, adam);
    for message in [named, plain] {
        assert!(
            message.contains("`fc1.weight` is F16 in the checkpoint's working copy, F32"),
            "{message}"
        );
    }

    // O2 into O3: FP16 weights and no master copy.
    let [named, plain] = refused_into::<NetO3, _>(&with_policy, |m: &_| {
        LowPrecisionUpdates(Adam::<_, f16, Cpu>::new(m, AdamConfig::default()))
    });
    assert!(
        named.contains("opt_level is O2 in the checkpoint, O3 here"),
        "{named}"
    );
    assert!(
        plain.contains("is F32 in the checkpoint's master weights, F16 in this model's"),
        "{plain}"
    );

    // keep_batchnorm_fp32 on into off: batch norm in FP32 or in FP16 in the working copy.
    let [named, plain] = refused_into::<NetFp16Norms, _>(&with_policy, adam);
    assert!(
        named.contains("keep_batchnorm_fp32 is true in the checkpoint, false here"),
        "{named}"
    );
    assert!(!named.contains("opt_level"), "{named}");
    assert!(
        plain.contains("`bn.scale` is F32 in the checkpoint's working copy, F16 in this model's"),
        "{plain}"
    );

    // A setting that changes nothing stored is still the policy's: refused when both name one.
    let mut other = NetFp16Outputs::build(&Cpu::seed_from_u64(12)).unwrap();
    let mut other_opt = adam(other.master());
    let mut other_scaler = NetFp16Outputs::scaler();
    let err = checkpoint::load_with_policy(
        &with_policy,
        &mut other,
        &mut other_opt,
        &mut other_scaler,
        &NetFp16Outputs::AMP_CONFIG,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("cast_model_outputs is F32 in the checkpoint, none here"),
        "{err}"
    );
    // The same policy loads, with or without naming it.
    checkpoint::load_with_policy(
        &with_policy,
        &mut model,
        &mut opt,
        &mut scaler,
        &Net::AMP_CONFIG,
    )
    .unwrap();
    checkpoint::load(&with_policy, &mut model, &mut opt, &mut scaler).unwrap();
}
