//! Gradient accumulation: four micro-batches of 16, one step, as if the batch were 64.
//!
//! The micro-batches' scaled gradients add up in one accumulation window at one scale; the
//! window borrows the scaler, so `scaler.update(..)` cannot run (does not compile) until the
//! window is finished and the step taken.
//!
//! The one-call step does the same with `StepOptions::new().accumulate(4)`: its forward closure
//! runs four times per step, each loss weighted by 1/4, in one window (the last three steps).
//!
//! Run with `cargo run --release --example 02_gradient_accumulation`.

use typed_amp::prelude::*;

type Mlp = (Linear<16, 32>, ReLU, Linear<32, 4>);
const MICRO_BATCHES: usize = 4;

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(0);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = GradScaler::dynamic();
    let mut grads = model.alloc_grads()?;

    for step in 1..=3 {
        let mut window = scaler.accumulate(grads);
        let mut loss_sum = 0.0;
        for _ in 0..MICRO_BATCHES {
            let x: Tensor<Rank2<16, 16>, f32, _> = dev.sample_normal();
            let y: Tensor<Rank2<16, 4>, f32, _> = dev.sample_normal();
            let logits = model.working().forward(window.trace(x.to_dtype::<f16>())?);
            // Weighted so that the accumulated gradient is that of the mean over all 64.
            let loss = mse_loss(logits.to_f32(), y) * (1.0 / MICRO_BATCHES as f32);
            loss_sum += loss.value();
            window.backward(loss)?;
        }
        let micro_batches = window.micro_batches();
        let scaled = window.finish()?;
        let unscaled = scaler.unscale(&mut model, scaled)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        grads = scaler.update(outcome)?;
        println!(
            "step {step}: {micro_batches} micro-batches, loss {loss_sum:.4}, scale {}",
            scaler.get_scale()
        );
    }

    // The same accumulation in one call per step: `micro` is the micro-batch's index.
    let options = StepOptions::new().accumulate(MICRO_BATCHES);
    for step in 4..=6 {
        let mut loss_sum = 0.0;
        grads = scaler.train_step_with(
            &mut model,
            &mut opt,
            grads,
            &options,
            |model, _micro, grads| {
                let x: Tensor<Rank2<16, 16>, f32, _> = dev.sample_normal();
                let y: Tensor<Rank2<16, 4>, f32, _> = dev.sample_normal();
                let logits = model
                    .working()
                    .forward(x.to_dtype::<f16>().traced_mixed(grads));
                let loss = mse_loss(logits.to_f32(), y); // weighted by 1/4 by the step
                loss_sum += loss.value() / MICRO_BATCHES as f32;
                loss
            },
        )?;
        println!(
            "step {step}: {MICRO_BATCHES} micro-batches in one call, loss {loss_sum:.4}, scale {}",
            scaler.get_scale()
        );
    }
    Ok(())
}
