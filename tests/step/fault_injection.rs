//! Fault injection through the public API: seeded inf/NaN/huge values in inputs, targets,
//! gradients, the loss and the working copy's weights, single and in bursts longer than the 144
//! overflows that take PyTorch's scale to 2^-128, with and without a scale floor, on a model
//! with batch norm. After every step: nothing non-finite is in the master weights, the working
//! copy is the master's rounding (a damaged working weight does not outlive its step), and a
//! skipped step left the master weights (batch-norm statistics included), the working copy's
//! statistics and Adam's state bit for bit as they were.

use rand::{Rng, SeedableRng};
use typed_amp::dfdx::nn::builders::{BatchNorm1D, Linear};
use typed_amp::dfdx::optim::Adam;
use typed_amp::prelude::*;
use typed_amp::{error::AmpError, precision::DType};

use crate::common;
use common::{inject, optimizer_bytes, param_bytes};

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
pub struct Net {
    fc1: Linear<6, 16>,
    bn: BatchNorm1D<16>,
    act: ReLU,
    fc2: Linear<16, 3>,
}

type Model = <Net as typed_amp::amp::AmpModel<Cpu>>::Weights;
type Input = Tensor<Rank2<8, 6>, f32, Cpu>;
type Target = Tensor<Rank2<8, 3>, f32, Cpu>;

/// What goes wrong in one step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    NanInput,
    InfInput,
    NegInfInput,
    HugeInput,
    NanTarget,
    InfTarget,
    NanGradient,
    InfGradient,
    HugeGradient,
    NanBnGradient,
    NanLoss,
    NanWorkingWeight,
    InfWorkingWeight,
    NanWorkingBnScale,
}

const FAULTS: [Fault; 14] = [
    Fault::NanInput,
    Fault::InfInput,
    Fault::NegInfInput,
    Fault::HugeInput,
    Fault::NanTarget,
    Fault::InfTarget,
    Fault::NanGradient,
    Fault::InfGradient,
    Fault::HugeGradient,
    Fault::NanBnGradient,
    Fault::NanLoss,
    Fault::NanWorkingWeight,
    Fault::InfWorkingWeight,
    Fault::NanWorkingBnScale,
];

fn batch(dev: &Cpu, rng: &mut rand::rngs::StdRng, fault: Fault) -> (Input, Target) {
    let mut x: Vec<f32> = (0..48).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let mut y = vec![0.0f32; 24];
    for row in 0..8 {
        y[row * 3 + rng.gen_range(0..3)] = 1.0;
    }
    let at = rng.gen_range(0..48);
    match fault {
        Fault::NanInput => x[at] = f32::NAN,
        Fault::InfInput => x[at] = f32::INFINITY,
        Fault::NegInfInput => x[at] = f32::NEG_INFINITY,
        // Beyond FP16's range: the O2 model's cast at entry makes it inf.
        Fault::HugeInput => x[at] = 1e6,
        Fault::NanTarget => y[at % 24] = f32::NAN,
        Fault::InfTarget => y[at % 24] = f32::INFINITY,
        _ => {}
    }
    (
        dev.tensor_from_vec(x, (Const, Const)),
        dev.tensor_from_vec(y, (Const, Const)),
    )
}

/// Everything a skipped step must leave alone.
fn state(model: &Model, opt: &Adam<NetMaster<Cpu>, f32, Cpu>) -> impl PartialEq + std::fmt::Debug {
    let working_stats = [
        model.working().bn.running_mean.as_vec(),
        model.working().bn.running_var.as_vec(),
    ]
    .concat()
    .into_iter()
    .map(f32::to_bits)
    .collect::<Vec<_>>();
    (
        param_bytes(model.master()),
        working_stats,
        optimizer_bytes(opt, model.master()),
    )
}

/// Writes `value` into element `at` (modulo its size) of a working-copy tensor, in place: the
/// tensor keeps its identity, so the gradients allocated for it still match.
fn damage<S: Shape, E: typed_amp::precision::AmpElem>(
    param: &mut Tensor<S, E, Cpu>,
    at: usize,
    value: f32,
) where
    Cpu: typed_amp::device::Kernels<E>,
{
    let mut values = param.as_vec();
    let at = at % values.len();
    values[at] = <E as typed_amp::precision::AmpElem>::from_f32(value);
    param.copy_from(&values);
}

/// Whether every working parameter and buffer is its master's value rounded to the working
/// precision, bit for bit: what the working copy holds after any step, taken or skipped.
fn working_is_the_masters_rounding(model: &Model) -> bool {
    let master = param_bytes(model.master());
    let working = param_bytes(model.working());
    master.len() == working.len()
        && master
            .iter()
            .zip(&working)
            .all(|((path, _, m), (other, dtype, w))| {
                let rounded: Vec<u8> = m
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .flat_map(|v| match dtype {
                        DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                        DType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                        _ => v.to_le_bytes().to_vec(),
                    })
                    .collect();
                path == other && rounded == *w
            })
}

fn masters_are_finite(model: &Model) -> bool {
    param_bytes(model.master())
        .iter()
        .all(|(path, dtype, bytes)| {
            assert_eq!(*dtype, DType::F32, "master {path}");
            bytes
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
        })
}

#[derive(Default, Debug)]
struct Counts {
    injections: usize,
    steps: usize,
    skipped: usize,
    floor_errors: usize,
}

/// Trains `steps` steps; each step is faulty with probability `rate`, and with probability
/// `burst_rate` a burst of 150–170 faulty steps in a row starts.
fn campaign(seed: u64, steps: usize, rate: f64, burst_rate: f64, floor: bool, counts: &mut Counts) {
    let dev = Cpu::seed_from_u64(seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Net::build(&dev).unwrap();
    let mut opt: Adam<NetMaster<Cpu>, f32, Cpu> = Adam::new(model.master(), AdamConfig::default());
    let mut scaler = GradScaler::dynamic();
    if floor {
        scaler = scaler
            .with_min_scale(1.0 / 1024.0)
            .unwrap()
            .with_floor_patience(1000)
            .unwrap();
    }
    let mut burst = 0usize;
    let mut grads = model.alloc_grads().unwrap();
    for _ in 0..steps {
        if burst == 0 && rng.gen_bool(burst_rate) {
            burst = rng.gen_range(150..=170);
        }
        let fault = if burst > 0 || rng.gen_bool(rate) {
            burst = burst.saturating_sub(1);
            FAULTS[rng.gen_range(0..FAULTS.len())]
        } else {
            Fault::None
        };
        let before = state(&model, &opt);
        let (x, y) = batch(&dev, &mut rng, fault);
        // Between steps, as a bit flip or a stray write would: past the working copy's rule that
        // only the master is updated, on purpose.
        let at = rng.gen_range(0..128);
        let w = model.working_mut().diverging_from_master_mut();
        match fault {
            Fault::NanWorkingWeight => damage(&mut w.fc1.weight, at, f32::NAN),
            Fault::InfWorkingWeight => damage(&mut w.fc2.weight, at, f32::INFINITY),
            Fault::NanWorkingBnScale => damage(&mut w.bn.scale, at, f32::NAN),
            _ => {}
        }
        let logits = model.working_mut().forward_mut(x.traced_mixed(grads));
        let mut loss = cross_entropy_with_logits_loss(logits, y);
        if fault == Fault::NanLoss {
            loss = loss * f32::NAN;
        }
        let mut scaled = scaler.scale(loss).backward().unwrap();
        let m = model.working();
        match fault {
            Fault::NanGradient => inject(scaled.grads_mut(), &m.fc1.weight, f32::NAN),
            Fault::InfGradient => inject(scaled.grads_mut(), &m.fc2.weight, f32::INFINITY),
            Fault::HugeGradient => inject(scaled.grads_mut(), &m.fc2.bias, 6e4),
            Fault::NanBnGradient => inject(scaled.grads_mut(), &m.bn.scale, f32::NAN),
            _ => {}
        }
        counts.injections += usize::from(fault != Fault::None);
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        let skipped = outcome.skipped();
        counts.steps += 1;
        counts.skipped += usize::from(skipped);
        if skipped {
            assert_eq!(
                state(&model, &opt),
                before,
                "seed {seed}: a skipped {fault:?} step changed state"
            );
        } else {
            // Only a huge gradient that unscales to a finite value may be stepped on.
            assert!(
                matches!(fault, Fault::None | Fault::HugeGradient),
                "seed {seed}: a {fault:?} step was taken"
            );
        }
        assert!(
            masters_are_finite(&model),
            "seed {seed}: non-finite master after {fault:?}"
        );
        assert!(
            working_is_the_masters_rounding(&model),
            "seed {seed}: after a {} {fault:?} step the working copy is not the master's rounding",
            if skipped { "skipped" } else { "taken" }
        );
        grads = match scaler.update(outcome) {
            Ok(grads) => grads,
            Err(AmpError::ScaleFloor { .. }) => {
                counts.floor_errors += 1;
                return;
            }
            Err(e) => panic!("seed {seed}: {e}"),
        };
        assert!(scaler.get_scale() >= typed_amp::scaler::SMALLEST_SCALE);
    }
}

#[test]
fn ten_thousand_injected_faults_never_reach_the_masters_and_skipped_steps_change_nothing() {
    let mut counts = Counts::default();
    for seed in 0..8 {
        // Isolated faults, at every other step.
        campaign(seed, 2000, 0.5, 0.0, seed % 2 == 1, &mut counts);
        // Bursts longer than the 144 overflows in a row that underflow PyTorch's scale.
        campaign(100 + seed, 1200, 0.05, 0.01, seed % 2 == 1, &mut counts);
    }
    eprintln!("fault injection: {} kinds, {counts:?}", FAULTS.len());
    assert!(counts.injections >= 10_000, "{counts:?}");
    assert!(
        counts.skipped >= counts.injections - counts.injections / 4,
        "{counts:?}"
    );
}
