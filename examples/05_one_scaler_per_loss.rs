//! One loss scaler per loss (Apex's `num_losses`): a model with two objectives of very
//! different magnitude scales, backs off and grows each loss's scale on its own, and sums the
//! unscaled gradients for one step.
//!
//! Run with `cargo run --release --example 05_one_scaler_per_loss`.

use typed_amp::prelude::*;
use typed_amp::LossScalers;

type Mlp = (Linear<8, 32>, ReLU, Linear<32, 4>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(2);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scalers = LossScalers::new(2, GradScaler::new(65536.0, 2.0, 0.5, 50)?);

    for step in 1..=200 {
        let x: Tensor<Rank2<16, 8>, f32, _> = dev.sample_normal();
        let target: Tensor<Rank2<16, 4>, f32, _> = dev.sample_normal();
        let mut found = Vec::new();
        let mut total: Option<typed_amp::UnscaledGrads<Cpu>> = None;
        // Loss 0: a regression loss. Loss 1: a large auxiliary penalty on the outputs.
        for loss_index in 0..2 {
            let scaler = scalers.get(loss_index).expect("two scalers");
            let out = model.working().forward(
                x.clone()
                    .to_dtype::<f16>()
                    .traced_mixed(model.alloc_grads()?),
            );
            let loss = match loss_index {
                0 => mse_loss(out.to_f32(), target.clone()),
                _ => mse_loss(out.to_f32(), dev.zeros()) * 1000.0,
            };
            let unscaled = scaler.unscale(&mut model, scaler.scale(loss).backward()?)?;
            found.push(unscaled.found_inf());
            match &mut total {
                None => total = Some(unscaled),
                Some(total) => total.merge(&model, unscaled)?,
            }
        }
        let outcome = scaler_step(&mut opt, &mut model, total.expect("two losses"))?;
        scalers.update(&found)?;
        if step % 50 == 0 {
            println!(
                "step {step}: scales {} / {}, skipped {}",
                scalers.get(0).map_or(0.0, GradScaler::get_scale),
                scalers.get(1).map_or(0.0, GradScaler::get_scale),
                outcome.skipped
            );
        }
    }
    Ok(())
}

/// The step itself does not depend on a scaler's scale: any of them takes it.
fn scaler_step<T: TrainTarget<Cpu>, O: typed_amp::MasterOptimizer<T::Master, Cpu>>(
    opt: &mut O,
    model: &mut T,
    grads: typed_amp::UnscaledGrads<Cpu>,
) -> Result<typed_amp::StepOutcome<Cpu>, AmpError> {
    GradScaler::disabled().step(opt, model, grads)
}
