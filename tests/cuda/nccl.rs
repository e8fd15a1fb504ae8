//! The NCCL backend for real, on one GPU: a world of one rank, its communicator built in-process
//! (`NcclCollective::unique_id` and `NcclCollective::from_id(&dev, 0, 1, id)`), under
//! `DataParallel`, training `#[amp]` models (O2 FP16, O2 BF16) through every stage.
//!
//! With one rank the reduction is the identity (a sum of one, divided by one): the data-parallel
//! run must give the master weights, loss scale and skipped steps of the same steps taken with a
//! plain `GradScaler` on the same GPU, bit for bit, an overflowing step skipped by both. The
//! collectives themselves (NCCL's all-reduce of FP32 buffers, the flag, host sums, broadcasts)
//! are checked to return their inputs, since `DataParallel` exchanges no gradients when there is
//! one rank (only the overflow flag goes through NCCL then).
//!
//! Each test first opens GPU 0 and, where that fails, prints why and passes (as `tests/cuda/kernels.rs`
//! does); likewise, where NCCL cannot make a communicator, it prints `skipping: NCCL unavailable`
//! and passes, unless `TYPED_AMP_REQUIRE_NCCL` is set (`.gpu/run.sh` sets it), in which case the
//! test fails. The binary links `libnccl.so.2` (cudarc links `-lnccl`): without it the loader
//! refuses to start the binary at all.
#![cfg(all(feature = "cuda", feature = "nccl"))]

use std::panic::{catch_unwind, AssertUnwindSafe};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use typed_amp::amp::AmpModel;
use typed_amp::device::{FillKernel, HostKernel, Kernels};
use typed_amp::distributed::nccl::NcclCollective;
use typed_amp::distributed::{master_digest, AllReduce, Collective, DataParallel};
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp::scaler::ScalerState;
use typed_amp::step::StepProtocol;
use typed_amp::tape::MixedGradients;

/// The seed of every run's device: the runs' models start from the same weights.
const SEED: u64 = 7;
const BATCH: usize = 8;
const IN: usize = 16;
const OUT: usize = 4;
const STEPS: usize = 8;
/// The step whose gradients are made to overflow.
const OVERFLOW_AT: usize = 4;
/// The clip of the staged runs: within the gradients' norms (about 0.21 to 0.24 on the CPU),
/// so that it clips some steps and not others.
const MAX_NORM: f32 = 0.22;

// Layers of at most 512 elements: typed-amp's Σx² kernel adds one partial sum per block of 256
// with an atomic add, and two partial sums add up alike in either order, so the clipping norm
// has the same bits in every run.
#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct Fp16Mlp {
    fc1: Linear<IN, 32>,
    act: ReLU,
    fc2: Linear<32, OUT>,
}

#[typed_amp::amp(policy = "O2", dtype = "bf16", cast_model_outputs = "fp32")]
struct Bf16Mlp {
    fc1: Linear<IN, 32>,
    act: ReLU,
    fc2: Linear<32, OUT>,
}

/// Opens GPU 0 with `seed`, or says why not and returns `None` (cudarc panics, rather than
/// erring, when the driver or the device is missing: panics count as "no device" too).
fn open_cuda(seed: u64) -> Option<Cuda> {
    match catch_unwind(|| Cuda::try_build(0, seed)) {
        Ok(Ok(dev)) => Some(dev),
        Ok(Err(err)) => {
            println!("skipping: no CUDA device ({err})");
            None
        }
        Err(panic) => {
            println!("skipping: no CUDA device ({})", panic_text(&*panic));
            None
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("it panicked")
}

/// A world of one on `dev`'s GPU: rank 0 of 1, its id made here. `None` (after a `skipping:`
/// line) where NCCL cannot make it, unless `TYPED_AMP_REQUIRE_NCCL` is set.
fn world_of_one(dev: &Cuda) -> Option<NcclCollective> {
    let joined = catch_unwind(AssertUnwindSafe(|| {
        let id = NcclCollective::unique_id()?;
        NcclCollective::from_id(dev, 0, 1, id)
    }));
    let why = match joined {
        Ok(Ok(comm)) => return Some(comm),
        Ok(Err(err)) => err.to_string(),
        Err(panic) => panic_text(&*panic).to_string(),
    };
    assert!(
        std::env::var_os("TYPED_AMP_REQUIRE_NCCL").is_none(),
        "NCCL could not make a communicator of one rank: {why}"
    );
    println!("skipping: NCCL unavailable ({why})");
    None
}

/// GPU 0 and a world of one on it, or a `skipping:` line and a return.
macro_rules! gpu_and_nccl_or_skip {
    () => {{
        let Some(dev) = open_cuda(SEED) else {
            return;
        };
        let Some(comm) = world_of_one(&dev) else {
            return;
        };
        (dev, comm)
    }};
}

/// A new device on GPU 0 seeded with `SEED`, for another run from the same initial weights (the
/// device initialises weights from a CPU generator seeded with it).
fn another_device() -> Cuda {
    Cuda::try_build(0, SEED).expect("GPU 0 opened once already")
}

/// Step `step`'s batch: inputs in [-1, 1], targets in [-0.5, 0.5].
fn batch(
    dev: &Cuda,
    step: usize,
) -> (
    Tensor<Rank2<BATCH, IN>, f32, Cuda>,
    Tensor<Rank2<BATCH, OUT>, f32, Cuda>,
) {
    let mut rng = StdRng::seed_from_u64(1000 + step as u64);
    let x: Vec<f32> = (0..BATCH * IN).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let y: Vec<f32> = (0..BATCH * OUT).map(|_| rng.gen_range(-0.5..0.5)).collect();
    (
        dev.tensor_from_vec(x, (Const, Const)),
        dev.tensor_from_vec(y, (Const, Const)),
    )
}

/// Sets every element of `param`'s working gradient to +inf.
fn poison<E: AmpElem, S: Shape>(
    dev: &Cuda,
    grads: &mut MixedGradients<Cuda>,
    param: &Tensor<S, E, Cuda>,
) where
    Cuda: Kernels<E>,
{
    let buf = grads.store_mut::<E>().get_or_alloc_mut(param).unwrap();
    FillKernel::<E>::try_fill(dev, buf, f32::INFINITY).unwrap();
}

/// What one step of a staged run did: overflow found, step skipped, the clipping norm's bits
/// (`None` when not finite), the scale after the update, and the master weights' digest.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StepRecord {
    found_inf: bool,
    skipped: bool,
    norm_bits: Option<u32>,
    scale: f32,
    master: u64,
}

/// A run: the initial master digest, each step's record, and the scaler's final state.
#[derive(Debug, PartialEq)]
struct Run {
    initial: u64,
    steps: Vec<StepRecord>,
    state: ScalerState,
}

/// The dynamic scaler of every run: growth every 3 clean steps, so that the run grows the scale
/// as well as backing it off.
fn scaler() -> GradScaler {
    GradScaler::new(1024.0, 2.0, 0.5, 3).unwrap()
}

/// Trains `$model` on `$dev` for `STEPS` steps stage by stage with `$s` (a `GradScaler` or a
/// `DataParallel`): scale, backward, (+inf into the first layer's gradient at `OVERFLOW_AT`),
/// unscale, `$reduce` (the all-reduce, or nothing), clip, step, update, and the protocol's
/// `sync_model` before and `check_in_sync` after every step. Evaluates to a [`Run`]. A macro so
/// that no function restates the model's bounds.
macro_rules! by_stages {
    ($model:ty, $dev:expr, $s:ident, |$g:ident| $reduce:expr) => {{
        let dev: &Cuda = $dev;
        let mut model = <$model as AmpModel<Cuda>>::try_build(dev).unwrap();
        let initial = master_digest(&model).unwrap();
        let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
        StepProtocol::<Cuda>::sync_model(&$s, &mut model).unwrap();
        let mut grads = model.alloc_grads().unwrap();
        let mut steps = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(dev, step);
            let out = model.working().forward(x.traced_mixed(grads));
            let mut scaled = $s.scale(mse_loss(out, y)).backward().unwrap();
            if step == OVERFLOW_AT {
                poison(dev, scaled.grads_mut(), &model.working().fc1.weight);
            }
            let $g = $s.unscale(&mut model, scaled).unwrap();
            let found_inf = $g.found_inf();
            let mut ready = $reduce;
            let norm = clip_grad_norm(&mut ready, MAX_NORM).unwrap();
            let outcome = $s.step(&mut opt, ready).unwrap();
            let skipped = outcome.skipped();
            grads = $s.update(outcome).unwrap();
            StepProtocol::<Cuda>::check_in_sync(&$s, &model).unwrap();
            steps.push(StepRecord {
                found_inf,
                skipped,
                norm_bits: norm.is_finite().then_some(norm.to_bits()),
                scale: $s.get_scale(),
                master: master_digest(&model).unwrap(),
            });
        }
        Run {
            initial,
            steps,
            state: $s.state(),
        }
    }};
}

/// Trains `$model` on `$dev` for `STEPS` steps through `StepProtocol::train_step` of `$p` (a
/// `&mut` `GradScaler` or `DataParallel`), the loss weighted by +inf at `OVERFLOW_AT`; then
/// `sync_buffers` and `check_in_sync`. Evaluates to the master digest after each step.
macro_rules! by_protocol {
    ($model:ty, $dev:expr, $p:expr) => {{
        let dev: &Cuda = $dev;
        let protocol = $p;
        let mut model = <$model as AmpModel<Cuda>>::try_build(dev).unwrap();
        let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
        protocol.sync_model(&mut model).unwrap();
        let mut grads = model.alloc_grads().unwrap();
        let mut digests = Vec::new();
        for step in 0..STEPS {
            let (x, y) = batch(dev, step);
            let weight = if step == OVERFLOW_AT {
                f32::INFINITY
            } else {
                1.0
            };
            grads = protocol
                .train_step(&mut model, &mut opt, grads, |model, _loss, grads| {
                    let out = model.working().forward(x.clone().traced_mixed(grads));
                    Ok::<_, AmpError>(mse_loss(out, y.clone()) * weight)
                })
                .unwrap();
            digests.push(master_digest(&model).unwrap());
        }
        protocol.sync_buffers(&mut model).unwrap();
        protocol.check_in_sync(&model).unwrap();
        digests
    }};
}

/// The data-parallel run over a world of one against the plain scaler's, stage by stage and
/// through `train_step`.
macro_rules! nccl_world_of_one_is_a_grad_scaler {
    ($name:ident, $model:ty) => {
        #[test]
        fn $name() {
            let (dev, comm) = gpu_and_nccl_or_skip!();
            assert_eq!((comm.rank(), comm.size()), (0, 1));

            // Stage by stage, with clipping.
            let mut dist = DataParallel::new(scaler(), comm).unwrap();
            let nccl = by_stages!($model, &dev, dist, |local| dist.all_reduce(local).unwrap());
            assert_eq!(dist.reductions(), STEPS as u64, "one all-reduce per step");
            assert_eq!(dist.skipped_steps(), 1);
            let mut alone = scaler();
            let plain = by_stages!($model, &another_device(), alone, |unscaled| unscaled);

            assert_eq!(
                nccl.initial, plain.initial,
                "the runs start from the same weights"
            );
            for (step, (n, p)) in nccl.steps.iter().zip(&plain.steps).enumerate() {
                assert_eq!(n, p, "step {step}: NCCL world of one vs plain GradScaler");
                let overflow = step == OVERFLOW_AT;
                assert_eq!(
                    (n.found_inf, n.skipped),
                    (overflow, overflow),
                    "step {step}"
                );
                let before = if step == 0 {
                    nccl.initial
                } else {
                    nccl.steps[step - 1].master
                };
                assert_eq!(
                    n.master == before,
                    overflow,
                    "step {step}: the masters change exactly when the step is taken"
                );
            }
            let scales: Vec<f32> = nccl.steps.iter().map(|s| s.scale).collect();
            assert_eq!(
                scales[OVERFLOW_AT],
                scales[OVERFLOW_AT - 1] / 2.0,
                "backed off"
            );
            assert!(scales.iter().any(|s| *s > 1024.0), "grew too: {scales:?}");
            let clipped = nccl.steps.iter().filter_map(|s| s.norm_bits);
            assert!(
                clipped.map(f32::from_bits).any(|n| n > MAX_NORM),
                "the clip clipped some step"
            );
            assert_eq!(nccl.state, plain.state);
            println!(
                "{}: {STEPS} steps, NCCL world of one = GradScaler bit for bit; scales {scales:?}",
                stringify!($model)
            );

            // Through the step protocol, with a fresh communicator on a device of its own.
            let dev = another_device();
            let Some(comm) = world_of_one(&dev) else {
                return;
            };
            let mut dist = DataParallel::new(scaler(), comm).unwrap();
            let nccl = by_protocol!($model, &dev, &mut dist);
            let mut alone = scaler();
            let plain = by_protocol!($model, &another_device(), &mut alone);
            assert_eq!(
                nccl, plain,
                "train_step: NCCL world of one vs plain GradScaler"
            );
            assert_eq!(
                nccl[OVERFLOW_AT],
                nccl[OVERFLOW_AT - 1],
                "the inf step skipped"
            );
            assert_eq!(dist.state(), alone.state());
            assert_eq!(dist.skipped_steps(), 1);
        }
    };
}

nccl_world_of_one_is_a_grad_scaler!(
    o2_fp16_mlp_through_nccl_data_parallel_is_a_grad_scaler,
    Fp16Mlp
);
nccl_world_of_one_is_a_grad_scaler!(
    o2_bf16_mlp_through_nccl_data_parallel_is_a_grad_scaler,
    Bf16Mlp
);

/// NCCL's collectives over one rank return their inputs: FP32 device buffers summed (bit for
/// bit, inf included), flags, host sums, broadcasts of any length, the barrier.
#[test]
fn nccl_collectives_over_one_rank_are_the_identity() {
    let (dev, comm) = gpu_and_nccl_or_skip!();
    assert_eq!((comm.rank(), comm.size(), comm.is_root()), (0, 1, true));

    let values: Vec<Vec<f32>> = vec![
        vec![1.5, -2.25, 3.0e-38, 65504.0, f32::INFINITY],
        (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e3).collect(),
        vec![f32::MIN_POSITIVE / 4.0, -7.0],
    ];
    let mut bufs: Vec<<Cuda as Storage<f32>>::Vec> = values
        .iter()
        .map(|v| {
            let mut buf = Storage::<f32>::try_alloc_len(&dev, v.len()).unwrap();
            HostKernel::<f32>::try_write(&dev, &mut buf, v).unwrap();
            buf
        })
        .collect();
    comm.all_reduce_sum(&dev, &mut bufs).unwrap();
    for (i, (buf, v)) in bufs.iter().zip(&values).enumerate() {
        let back = HostKernel::<f32>::try_read(&dev, buf).unwrap();
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(v), "buffer {i}");
    }

    assert!(!comm.any(false).unwrap());
    assert!(comm.any(true).unwrap());
    let mut sums = [0.1, -3.5, 1e300];
    comm.sum_f64(&mut sums).unwrap();
    assert_eq!(sums, [0.1, -3.5, 1e300]);
    for len in [0usize, 1, 8, 4097] {
        let sent: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut bytes = sent.clone();
        comm.broadcast_bytes(0, &mut bytes).unwrap();
        assert_eq!(bytes, sent, "{len} bytes");
    }
    assert!(
        comm.broadcast_bytes(1, &mut Vec::new()).is_err(),
        "no rank 1"
    );
    comm.barrier().unwrap();
}
