//! Checkpoints restore master weights, optimizer state and scaler state exactly, are readable
//! by name with any safetensors reader, and refuse files that are not theirs.

use std::collections::BTreeMap;

use typed_amp::checkpoint::{self, CheckpointError};
use typed_amp::dfdx::nn::builders::{BatchNorm1D, Linear};
use typed_amp::dfdx::optim::Adam;
use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
pub struct Net {
    fc1: Linear<6, 8>,
    bn: BatchNorm1D<8>,
    act: ReLU,
    fc2: Linear<8, 3>,
}

mod common;
use common::TempDir;

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
