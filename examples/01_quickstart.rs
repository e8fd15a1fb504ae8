//! Quickstart: train a small MLP with FP16 layers and FP32 master weights.
//!
//! The data are four Gaussian clusters in 32 dimensions, the labels their cluster. Each
//! iteration is one call, `scaler.train_step_with(..)`, as PyTorch's `autocast` + `GradScaler`
//! loop: it takes the forward pass as a closure returning the FP32 loss, and runs the
//! mixed-precision recipe under it in the order the compiler enforces:
//! scale → backward → unscale → clip → step → update. The last iterations are the same steps
//! written out stage by stage, which give the same bits, for loops that need to look inside.
//!
//! Run with `cargo run --release --example 01_quickstart`.

use rand::{rngs::StdRng, Rng, SeedableRng};
use rand_distr::StandardNormal;
use typed_amp::dfdx::optim::Sgd;
use typed_amp::prelude::*;

const DIM: usize = 32;
const CLASSES: usize = 4;
const BATCH: usize = 64;
const STEPS: usize = 300;

type Mlp = (
    Linear<DIM, 64>,
    ReLU,
    Linear<64, 64>,
    ReLU,
    Linear<64, CLASSES>,
);

/// A batch drawn around fixed, well-separated cluster centres.
struct Clusters {
    centres: Vec<[f32; DIM]>,
    rng: StdRng,
}

impl Clusters {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let centres = (0..CLASSES)
            .map(|_| std::array::from_fn(|_| 0.35 * rng.sample::<f32, _>(StandardNormal)))
            .collect();
        Self { centres, rng }
    }

    fn batch(
        &mut self,
        dev: &Cpu,
    ) -> (
        Tensor<Rank2<BATCH, DIM>, f16, Cpu>,
        Tensor<Rank2<BATCH, CLASSES>, f32, Cpu>,
    ) {
        let mut x = Vec::with_capacity(BATCH * DIM);
        let mut y = vec![0.0f32; BATCH * CLASSES];
        for i in 0..BATCH {
            let class = self.rng.gen_range(0..CLASSES);
            y[i * CLASSES + class] = 1.0;
            for c in self.centres[class] {
                x.push(f16::from_f32(c + self.rng.sample::<f32, _>(StandardNormal)));
            }
        }
        (
            dev.tensor_from_vec(x, (Const, Const)),
            dev.tensor_from_vec(y, (Const, Const)),
        )
    }
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(0);
    let mut data = Clusters::new(1);

    // FP32 master weights, and an FP16 working copy for forward and backward.
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    // The optimizer is built on the FP32 master: building it on `model.working()` (FP16) would
    // not compile when passed to `scaler.train_step_with` or `scaler.step`.
    let mut opt = Sgd::new(
        model.master(),
        SgdConfig {
            lr: 0.02,
            momentum: Some(Momentum::Classic(0.9)),
            weight_decay: None,
        },
    );
    let mut scaler = GradScaler::dynamic();
    // Clipping acts on the unscaled gradients (clipping scaled ones would not compile).
    let options = StepOptions::new().clip_grad_norm(5.0);
    let mut grads = model.alloc_grads()?;

    println!("step   loss     scale  skipped");
    for step in 1..=STEPS {
        let mut loss_value = 0.0;
        grads =
            scaler.train_step_with(&mut model, &mut opt, grads, &options, |model, _, grads| {
                let (x, y) = data.batch(&dev);
                let logits = model.working().forward(x.traced_mixed(grads));
                // Losses are FP32 only: `cross_entropy_with_logits_loss(logits, y)` on the FP16
                // logits would not compile.
                let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
                loss_value = loss.value();
                loss
            })?;
        if step == 1 || step % 50 == 0 {
            println!(
                "{step:>4}  {loss_value:.4}  {:>8}  {}",
                scaler.get_scale(),
                scaler.skipped_steps()
            );
        }
    }

    // What `train_step_with` runs, stage by stage: a few more steps written out.
    for _ in 0..10 {
        let (x, y) = data.batch(&dev);
        let logits = model.working().forward(x.traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits.to_f32(), y);
        let scaled = scaler.scale(loss).backward()?; // gradients × scale
        let mut unscaled = scaler.unscale(&mut model, scaled)?; // ÷ scale, inf/NaN checked
        clip_grad_norm(&mut unscaled, 5.0)?; // on unscaled gradients only
        let outcome = scaler.step(&mut opt, unscaled)?; // skipped on inf/NaN
        grads = scaler.update(outcome)?; // the next iteration's gradients
    }
    let _ = grads;

    let (x, y) = data.batch(&dev);
    let predicted = model.working().forward(x).to_f32().array();
    let correct = predicted
        .iter()
        .zip(y.array())
        .filter(|(p, t)| argmax(&p[..]) == argmax(&t[..]))
        .count();
    println!("held-out accuracy: {correct}/{BATCH}");
    println!(
        "weights: {} KiB (FP32 master + FP16 working copy)",
        model.size_in_bytes() / 1024
    );
    Ok(())
}

fn argmax(values: &[f32]) -> usize {
    values
        .iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |best, (i, v)| if *v > best.1 { (i, *v) } else { best },
        )
        .0
}
