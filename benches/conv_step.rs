//! What the main job's CNN costs on the CPU, step by step and op by op, with plain dfdx
//! (`OwnedTape`, `loss.backward()`, Adam), in FP32 and in FP16 (every tensor FP16), batch 128:
//!
//! conv(1→16, 3×3, pad 1) → BN(16) → ReLU → max-pool 2 → conv(16→32, 3×3, pad 1) → BN(32) → ReLU
//! → max-pool 2 → flatten → linear(1568→10), on `[128, 1, 28, 28]` images.
//!
//! Prints, for each precision, the median of the whole training step (forward, cross-entropy,
//! backward, Adam update, zeroing the gradients), and of each op alone at the shapes the CNN
//! feeds it: its forward, and its backward. The convolutions appear alone, with their bias fused
//! as typed-amp's `Conv2D` runs them, and the bias as the separate broadcast add it used to be. An op's backward is timed as `loss.backward()` on
//! `op(x).sum()` minus the same for `x.sum()` of the op's output shape (the sum's own backward),
//! so it includes allocating the input gradients, as in the step. Each op's line gives the median
//! and the minimum: on a shared machine the minimum is the steadier measure of the op itself.
//!
//! Run with `cargo bench --bench conv_step` (add `-- --steps N --repetitions R` to change the
//! number of timed steps per repetition and of repetitions, `-- --only f32` or `--only f16` for
//! one precision, `-- --no-ops` or `--no-step` to skip a part, `-- --op conv2` for the ops whose
//! name contains `conv2`).

use std::time::{Duration, Instant};

use bench_timing::{median_ms, min_ms};
use num_traits::Float;
use rand_distr::uniform::SampleUniform;
use typed_amp::dfdx::nn::builders::{BatchNorm2D, Linear};
use typed_amp::dfdx::optim::Adam;
use typed_amp::dfdx::tensor_ops::{Pool2DKind, TryPool2D};
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;

const BATCH: usize = 128;

type Cnn = (
    (Conv2D<1, 16, 3, 1, 1>, BatchNorm2D<16>, ReLU, MaxPool2D<2>),
    (Conv2D<16, 32, 3, 1, 1>, BatchNorm2D<32>, ReLU, MaxPool2D<2>),
    (Flatten<{ 32 * 7 * 7 }>, Linear<{ 32 * 7 * 7 }, 10>),
);

/// The element types the bench runs: FP32 and FP16.
trait Elem: Dtype + Float + SampleUniform + std::fmt::Display
where
    Cpu: Device<Self> + typed_amp::dfdx::tensor_ops::ConvDevice<Self>,
{
    const NAME: &'static str;
}
impl Elem for f32 {
    const NAME: &'static str = "FP32";
}
impl Elem for f16 {
    const NAME: &'static str = "FP16";
}

type Img<E> = Tensor<(Const<BATCH>, Const<1>, Const<28>, Const<28>), E, Cpu>;

/// Standard normal samples of shape `shape`, drawn in FP32 and rounded to `E`.
fn randn<E: Elem, S: Shape>(dev: &Cpu, shape: S) -> Tensor<S, E, Cpu>
where
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
{
    let x: Tensor<S, f32, Cpu> = SampleTensor::<f32>::sample_normal_like(dev, &shape);
    let v: Vec<E> = x
        .as_vec()
        .into_iter()
        .map(|v| E::from_f32(v).unwrap())
        .collect();
    dev.tensor_from_vec(v, shape)
}

fn data<E: Elem>(dev: &Cpu) -> (Img<E>, Tensor<Rank2<BATCH, 10>, E, Cpu>)
where
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
{
    let x: Img<E> = randn(dev, Default::default());
    let labels: Vec<f32> = (0..BATCH * 10)
        .map(|i| {
            if i % 10 == (i * 7 / 10) % 10 {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let labels = labels
        .into_iter()
        .map(|v| E::from_f32(v).unwrap())
        .collect();
    (x, dev.tensor_from_vec(labels, (Const, Const)))
}

/// dfdx's `cross_entropy_with_logits_loss` (which takes f32 and f64 only, the fork's
/// `SoftmaxDtype` rule) by its named 16-bit log-softmax: this bench times plain dfdx in `E`.
fn cross_entropy_16bit<S, E, D, T>(
    logits: Tensor<S, E, D, T>,
    target_probs: Tensor<S, E, D>,
) -> Tensor<Rank0, E, D, T>
where
    S: Shape + ReduceShape<S::LastAxis>,
    E: Dtype,
    D: Device<E>,
    T: Tape<E, D>,
{
    let classes = <S as HasAxes<S::LastAxis>>::size(logits.shape()) as f64;
    let classes = E::from_f64(classes).unwrap();
    (logits.log_softmax_16bit::<S::LastAxis>() * target_probs)
        .mean()
        .negate()
        * classes
}

/// Times `steps` whole training steps; returns the time per step of each, and of the forward
/// and backward alone.
fn train_steps<E: Elem>(dev: &Cpu, steps: usize) -> (Vec<Duration>, Vec<Duration>, Vec<Duration>)
where
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
{
    let (x, y) = data::<E>(dev);
    let mut model = dev.build_module::<Cnn, E>();
    let mut opt = Adam::new(&model, AdamConfig::default());
    let mut grads = model.alloc_grads();
    let (mut step, mut fwd, mut bwd) = (vec![], vec![], vec![]);
    for _ in 0..steps {
        let t0 = Instant::now();
        let logits = model.forward_mut(x.clone().traced(grads));
        let loss = cross_entropy_16bit(logits, y.clone());
        let t1 = Instant::now();
        grads = loss.backward();
        let t2 = Instant::now();
        opt.update(&mut model, &grads).unwrap();
        model.zero_grads(&mut grads);
        let t3 = Instant::now();
        step.push(t3 - t0);
        fwd.push(t1 - t0);
        bwd.push(t2 - t1);
    }
    (step, fwd, bwd)
}

/// Forward and backward times of one op, `reps` times.
struct OpTimes {
    fwd: Vec<Duration>,
    bwd: Vec<Duration>,
}

/// Times `f` (forward) and the backward of `f(x).sum()`.
fn time_op<E, S, S2, F>(x: &Tensor<S, E, Cpu>, reps: usize, mut f: F) -> OpTimes
where
    E: Elem,
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
    S: Shape,
    S2: Shape,
    F: FnMut(Tensor<S, E, Cpu, OwnedTape<E, Cpu>>) -> Tensor<S2, E, Cpu, OwnedTape<E, Cpu>>,
{
    let mut t = OpTimes {
        fwd: vec![],
        bwd: vec![],
    };
    for _ in 0..reps {
        let xt = x.clone().leaky_trace();
        let t0 = Instant::now();
        let y = f(xt);
        let t1 = Instant::now();
        let loss = y.sum();
        let t2 = Instant::now();
        let g = loss.backward();
        let t3 = Instant::now();
        drop(g);
        t.fwd.push(t1 - t0);
        t.bwd.push(t3 - t2);
    }
    t
}

/// Backward of `x.sum()` alone (median, minimum), to subtract from [`time_op`]'s backward.
fn time_sum<E, S>(dev: &Cpu, shape: S, reps: usize) -> [f64; 2]
where
    E: Elem,
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
    S: Shape,
{
    let x: Tensor<S, E, Cpu> = randn(dev, shape);
    let t = time_op(&x, reps, |x| x).bwd;
    [median_ms(&t), min_ms(&t)]
}

/// Only ops whose name contains this run (`--op NAME`).
static OP_FILTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn wanted(name: &str) -> bool {
    OP_FILTER.get().is_none_or(|f| name.contains(f.as_str()))
}

fn report(name: &str, t: OpTimes, sum_bwd: [f64; 2]) {
    let (fwd_min, bwd_min) = (min_ms(&t.fwd), min_ms(&t.bwd) - sum_bwd[1]);
    let fwd = median_ms(&t.fwd);
    let bwd = median_ms(&t.bwd) - sum_bwd[0];
    println!(
        "    {name:<30} fwd {fwd:7.3} ms (min {fwd_min:7.3})   bwd {bwd:7.3} ms (min {bwd_min:7.3})"
    );
}

fn ops<E: Elem>(dev: &Cpu, reps: usize)
where
    Cpu: Device<E> + typed_amp::dfdx::tensor_ops::ConvDevice<E>,
{
    let b = Const::<BATCH>;
    let s1 = (b, Const::<16>, 28usize, 28usize);
    let s2 = (b, Const::<32>, 14usize, 14usize);
    let x0 = randn::<E, _>(dev, (b, Const::<1>, 28usize, 28usize));
    let x1 = randn::<E, _>(dev, s1);
    let x2 = randn::<E, _>(dev, (b, Const::<16>, 14usize, 14usize));
    let y2 = randn::<E, _>(dev, s2);
    let w1 = randn::<E, _>(dev, (Const::<16>, Const::<1>, Const::<3>, Const::<3>));
    let w2 = randn::<E, _>(dev, (Const::<32>, Const::<16>, Const::<3>, Const::<3>));
    let b1 = randn::<E, _>(dev, (Const::<16>,));
    let b2 = randn::<E, _>(dev, (Const::<32>,));
    println!("  ops alone, {}, median of {reps}:", E::NAME);
    let sum1 = time_sum::<E, _>(dev, s1, reps);
    let sum2 = time_sum::<E, _>(dev, s2, reps);
    let sum_p1 = time_sum::<E, _>(dev, (b, Const::<16>, 14usize, 14usize), reps);
    let sum_p2 = time_sum::<E, _>(dev, (b, Const::<32>, 7usize, 7usize), reps);
    println!(
        "    backward of sum (subtracted, median): {:.3} ms ({s1:?}), {:.3} ms ({s2:?})",
        sum1[0], sum2[0]
    );

    if wanted("conv1 1->16 3x3 @28x28") {
        let t = time_op(&x0, reps, |x| {
            (x, w1.clone()).conv2d(Const::<1>, Const::<1>, Const::<1>, Const::<1>)
        });
        report("conv1 1->16 3x3 @28x28", t, sum1);
    }
    if wanted("conv2 16->32 3x3 @14x14") {
        let t = time_op(&x2, reps, |x| {
            (x, w2.clone()).conv2d(Const::<1>, Const::<1>, Const::<1>, Const::<1>)
        });
        report("conv2 16->32 3x3 @14x14", t, sum2);
    }

    if wanted("conv1+bias (fused) @28x28") {
        let t = time_op(&x0, reps, |x| {
            (x, w1.clone(), b1.clone()).conv2d(Const::<1>, Const::<1>, Const::<1>, Const::<1>)
        });
        report("conv1+bias (fused) @28x28", t, sum1);
    }
    if wanted("conv2+bias (fused) @14x14") {
        let t = time_op(&x2, reps, |x| {
            (x, w2.clone(), b2.clone()).conv2d(Const::<1>, Const::<1>, Const::<1>, Const::<1>)
        });
        report("conv2+bias (fused) @14x14", t, sum2);
    }

    if wanted("bias add 16 @28x28") {
        let t = time_op(&x1, reps, |x| {
            let s = *x.shape();
            x + b1.clone().broadcast_like::<_, Axes3<0, 2, 3>>(&s)
        });
        report("bias add 16 @28x28", t, sum1);
    }
    if wanted("bias add 32 @14x14") {
        let t = time_op(&y2, reps, |x| {
            let s = *x.shape();
            x + b2.clone().broadcast_like::<_, Axes3<0, 2, 3>>(&s)
        });
        report("bias add 32 @14x14", t, sum2);
    }

    let mut bn1 = dev.build_module::<BatchNorm2D<16>, E>();
    if wanted("batch norm 16 @28x28 (train)") {
        let t = time_op(&x1, reps, |x| bn1.forward_mut(x));
        report("batch norm 16 @28x28 (train)", t, sum1);
    }
    let mut bn2 = dev.build_module::<BatchNorm2D<32>, E>();
    if wanted("batch norm 32 @14x14 (train)") {
        let t = time_op(&y2, reps, |x| bn2.forward_mut(x));
        report("batch norm 32 @14x14 (train)", t, sum2);
    }

    if wanted("relu 16 @28x28") {
        let t = time_op(&x1, reps, |x| x.relu());
        report("relu 16 @28x28", t, sum1);
    }
    if wanted("relu 32 @14x14") {
        let t = time_op(&y2, reps, |x| x.relu());
        report("relu 32 @14x14", t, sum2);
    }

    if wanted("max pool 2 16 @28x28") {
        let t = time_op(&x1, reps, |x| {
            x.pool2d(
                Pool2DKind::Max,
                Const::<2>,
                Const::<2>,
                Const::<0>,
                Const::<1>,
            )
        });
        report("max pool 2 16 @28x28", t, sum_p1);
    }
    if wanted("max pool 2 32 @14x14") {
        let t = time_op(&y2, reps, |x| {
            x.pool2d(
                Pool2DKind::Max,
                Const::<2>,
                Const::<2>,
                Const::<0>,
                Const::<1>,
            )
        });
        report("max pool 2 32 @14x14", t, sum_p2);
    }
}

fn main() {
    let mut steps = 10;
    let mut repetitions = 5;
    let mut only: Option<String> = None;
    let (mut run_ops, mut run_step) = (true, true);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--steps" => steps = args.next().and_then(|s| s.parse().ok()).unwrap_or(steps),
            "--repetitions" => {
                repetitions = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(repetitions)
            }
            "--only" => only = args.next(),
            "--no-ops" => run_ops = false,
            "--no-step" => run_step = false,
            "--op" => {
                if let Some(f) = args.next() {
                    let _ = OP_FILTER.set(f);
                }
            }
            _ => {} // cargo bench passes `--bench`
        }
    }
    let dev = Cpu::seed_from_u64(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "CNN conv16-BN-ReLU-pool, conv32-BN-ReLU-pool, linear; batch {BATCH}; CPU ({threads} threads); plain dfdx OwnedTape + Adam"
    );
    let want = |name: &str| only.as_deref().is_none_or(|o| o.eq_ignore_ascii_case(name));
    if run_step {
        // Warm up caches, the allocator and the thread pool.
        if want("f32") {
            train_steps::<f32>(&dev, 2);
        }
        if want("f16") {
            train_steps::<f16>(&dev, 2);
        }
        let mut samples: [[Vec<Duration>; 3]; 2] = Default::default();
        for _ in 0..repetitions {
            // Interleaved, so that drifting machine load affects both precisions alike.
            for (i, run) in [
                want("f32").then_some(train_steps::<f32> as fn(&Cpu, usize) -> _),
                want("f16").then_some(train_steps::<f16> as fn(&Cpu, usize) -> _),
            ]
            .into_iter()
            .enumerate()
            {
                if let Some(run) = run {
                    let (s, f, b) = run(&dev, steps);
                    samples[i][0].extend(s);
                    samples[i][1].extend(f);
                    samples[i][2].extend(b);
                }
            }
        }
        println!("  training step, median of {repetitions} x {steps} steps:");
        for (i, name) in ["FP32", "FP16"].into_iter().enumerate() {
            let [s, f, b] = std::mem::take(&mut samples[i]);
            if s.is_empty() {
                continue;
            }
            println!(
                "    {name}: step {:8.2} ms (min {:7.2})   forward {:7.2} ms, backward {:7.2} ms",
                median_ms(&s),
                min_ms(&s),
                median_ms(&f),
                median_ms(&b)
            );
        }
    }
    if run_ops {
        let reps = repetitions * steps;
        if want("f32") {
            ops::<f32>(&dev, reps);
        }
        if want("f16") {
            ops::<f16>(&dev, reps);
        }
    }
}
