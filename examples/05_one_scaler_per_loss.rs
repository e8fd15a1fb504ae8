//! One loss scaler per loss (Apex's `num_losses`): a model with two objectives of very
//! different magnitude scales, backs off and grows each loss's scale on its own, and sums the
//! unscaled gradients for one step.
//!
//! Run with `cargo run --release --example 05_one_scaler_per_loss`.

use typed_amp::prelude::*;
use typed_amp::scaler::LossScalers;

type Mlp = (Linear<8, 32>, ReLU, Linear<32, 4>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(2);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    let mut scalers = LossScalers::new(2, GradScaler::new(65536.0, 2.0, 0.5, 50)?);

    for step in 1..=200 {
        let x: Tensor<Rank2<16, 8>, f32, _> = dev.sample_normal();
        let target: Tensor<Rank2<16, 4>, f32, _> = dev.sample_normal();
        // Loss 0: a regression loss. Loss 1: a large auxiliary penalty on the outputs. Each is
        // scaled and backward with its own scaler.
        let mut scaled = Vec::new();
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
            scaled.push(scaler.scale(loss).backward()?);
        }
        // Unscaled into one sum, each by its own scaler; one step.
        let mut scaled = scaled.into_iter();
        let (first, second) = (
            scaled.next().expect("loss 0"),
            scaled.next().expect("loss 1"),
        );
        let (scaler0, scaler1) = (scalers.get(0).expect("0"), scalers.get(1).expect("1"));
        let mut total = scaler0.unscale(&mut model, first)?;
        total.merge(scaler1, second)?;
        let outcome = scaler0.step(&mut opt, total)?;
        let skipped = outcome.skipped();
        // Each scaler backs off only if its own loss overflowed.
        let _ = scalers.update(outcome)?;
        if step % 50 == 0 {
            println!(
                "step {step}: scales {} / {}, skipped {}",
                scalers.get(0).map_or(0.0, GradScaler::get_scale),
                scalers.get(1).map_or(0.0, GradScaler::get_scale),
                skipped
            );
        }
    }
    Ok(())
}
