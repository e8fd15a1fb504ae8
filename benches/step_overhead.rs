//! What typed-amp's training step costs on the CPU, for an MLP 784-512-512-10 at batch 256:
//!
//! 1. plain dfdx in FP32 (`OwnedTape`, `loss.backward()`, `Sgd::update`, `zero_grads`);
//! 2. typed-amp in FP32 (`Fp32Weights`, the mixed tape, the typed step, scaling disabled);
//! 3. typed-amp with FP16 layers and FP32 master weights (`MasterWeights`, dynamic scaling);
//!
//! and, for 3, the share of the step spent in mixed-precision bookkeeping: unscaling the FP16
//! gradients into FP32 master gradients with the non-finite check, and refreshing the FP16
//! working weights from the master.
//!
//! Run with `cargo bench --bench step_overhead` (add `-- --steps N --repetitions R` to change
//! the number of timed steps per repetition and of repetitions). Prints milliseconds per step (median over repetitions).

use std::time::{Duration, Instant};

use bench_timing::median_ms;
use typed_amp::dfdx::optim::Sgd;
use typed_amp::master::Fp32Weights;
use typed_amp::prelude::*;

const BATCH: usize = 256;
type Mlp = (
    Linear<784, 512>,
    ReLU,
    Linear<512, 512>,
    ReLU,
    Linear<512, 10>,
);

struct Data {
    x32: Tensor<Rank2<BATCH, 784>, f32, Cpu>,
    x16: Tensor<Rank2<BATCH, 784>, f16, Cpu>,
    y: Tensor<Rank2<BATCH, 10>, f32, Cpu>,
}

fn data(dev: &Cpu) -> Data {
    let x32: Tensor<Rank2<BATCH, 784>, f32, Cpu> = dev.sample_uniform();
    let labels: Vec<f32> = (0..BATCH * 10)
        .map(|i| if i % 10 == (i / 10) % 10 { 1.0 } else { 0.0 })
        .collect();
    Data {
        x16: x32.clone().to_dtype::<f16>(),
        x32,
        y: dev.tensor_from_vec(labels, (Const, Const)),
    }
}

fn sgd() -> SgdConfig {
    SgdConfig {
        lr: 1e-3,
        momentum: Some(Momentum::Classic(0.9)),
        weight_decay: None,
    }
}

/// Phases of one typed-amp step, accumulated over a repetition.
#[derive(Default, Clone, Copy)]
struct Phases {
    unscale: Duration,
    refresh: Duration,
}

fn plain_dfdx(dev: &Cpu, data: &Data, steps: usize) -> Duration {
    let mut model = dev.build_module::<Mlp, f32>();
    let mut opt = Sgd::new(&model, sgd());
    let mut grads = model.alloc_grads();
    let start = Instant::now();
    for _ in 0..steps {
        let logits = model.forward(data.x32.clone().traced(grads));
        let loss = typed_amp::dfdx::losses::cross_entropy_with_logits_loss(logits, data.y.clone());
        grads = loss.backward();
        opt.update(&mut model, &grads).unwrap();
        model.zero_grads(&mut grads);
    }
    start.elapsed()
}

fn typed_fp32(dev: &Cpu, data: &Data, steps: usize) -> Duration {
    let mut model = Fp32Weights::build::<Mlp>(dev).unwrap();
    let mut opt = Sgd::new(model.master(), sgd());
    let mut scaler = GradScaler::disabled();
    let mut grads = model.alloc_grads().unwrap();
    let start = Instant::now();
    for _ in 0..steps {
        let logits = model
            .working()
            .forward(data.x32.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, data.y.clone());
        let scaled = scaler.scale(loss).backward().unwrap();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
    }
    start.elapsed()
}

fn typed_fp16(dev: &Cpu, data: &Data, steps: usize) -> (Duration, Phases) {
    let mut model = MasterWeights::build::<Mlp>(dev).unwrap();
    let mut opt = Sgd::new(model.master(), sgd());
    let mut scaler = GradScaler::dynamic();
    let mut grads = model.alloc_grads().unwrap();
    let mut phases = Phases::default();
    let mut excluded = Duration::ZERO;
    let start = Instant::now();
    for _ in 0..steps {
        let logits = model
            .working()
            .forward(data.x16.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), data.y.clone());
        let scaled = scaler.scale(loss).backward().unwrap();
        let t = Instant::now();
        let unscaled = scaler.unscale(&mut model, scaled).unwrap();
        phases.unscale += t.elapsed();
        let outcome = scaler.step(&mut opt, unscaled).unwrap();
        grads = scaler.update(outcome).unwrap();
        // `step` refreshed the working copy after the update; time one more refresh, in the
        // same conditions, and leave it out of the step's total.
        let t = Instant::now();
        model.refresh().unwrap();
        let refresh = t.elapsed();
        phases.refresh += refresh;
        excluded += refresh;
    }
    let total = start.elapsed() - excluded;
    (total, phases)
}

fn main() {
    let mut steps = 20;
    let mut repetitions = 5;
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
            _ => {} // cargo bench passes `--bench`
        }
    }
    let dev = Cpu::seed_from_u64(0);
    let data = data(&dev);
    // Warm up caches, the allocator and the thread pool.
    plain_dfdx(&dev, &data, 3);
    typed_fp32(&dev, &data, 3);
    typed_fp16(&dev, &data, 3);

    let (mut plain, mut fp32, mut fp16, mut unscale, mut refresh) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..repetitions {
        // Interleaved, so that drifting machine load affects every configuration alike.
        plain.push(plain_dfdx(&dev, &data, steps) / steps as u32);
        fp32.push(typed_fp32(&dev, &data, steps) / steps as u32);
        let (total, phases) = typed_fp16(&dev, &data, steps);
        fp16.push(total / steps as u32);
        unscale.push(phases.unscale / steps as u32);
        refresh.push(phases.refresh / steps as u32);
    }
    let (plain, fp32, fp16) = (median_ms(&plain), median_ms(&fp32), median_ms(&fp16));
    let (unscale, refresh) = (median_ms(&unscale), median_ms(&refresh));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("MLP 784-512-512-10, batch {BATCH}, CPU ({threads} threads), {steps} steps x {repetitions} repetitions, median ms/step");
    println!("  plain dfdx FP32                         {plain:8.2} ms");
    println!(
        "  typed-amp FP32 (O0)                     {fp32:8.2} ms  ({:+.1}% vs plain dfdx)",
        (fp32 / plain - 1.0) * 100.0
    );
    println!("  typed-amp FP16 layers + FP32 master     {fp16:8.2} ms");
    println!(
        "    unscale + non-finite check            {unscale:8.3} ms  ({:.2}% of the step)",
        unscale / fp16 * 100.0
    );
    println!(
        "    master -> working refresh             {refresh:8.3} ms  ({:.2}% of the step)",
        refresh / fp16 * 100.0
    );
    println!(
        "    bookkeeping total                     {:8.3} ms  ({:.2}% of the step)",
        unscale + refresh,
        (unscale + refresh) / fp16 * 100.0
    );
}
