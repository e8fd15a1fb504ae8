//! Overflow blame and clipping: a layer whose weights are far too large makes FP16 gradients
//! overflow; each skipped step says which parameters' gradients were inf or NaN and which layer
//! overflowed, the dynamic scale backs off until steps succeed, and gradients are clipped by
//! global norm before each step.
//!
//! Run with `cargo run --release --example 03_overflow_blame`.

use typed_amp::prelude::*;

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct Net {
    fc1: Linear<8, 32>,
    act1: ReLU,
    fc2: Linear<32, 32>,
    act2: ReLU,
    fc3: Linear<32, 4>,
}

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(6);
    let mut model = Net::build(&dev)?;
    // Sabotage: fc2's weights 64 times too large.
    model.master_mut().fc2.weight = model.master().fc2.weight.clone() * 64.0;
    model.reload_working()?;
    let mut opt = typed_amp::optim::sgd(model.master(), SgdConfig::default());
    let mut scaler = Net::scaler();
    let x: Tensor<Rank2<32, 8>, f32, _> = dev.sample_normal();
    let y: Tensor<Rank2<32, 4>, f32, _> = dev.sample_normal();

    for step in 1..=12 {
        let mut grads = model.alloc_grads()?;
        grads.watch_layers(true);
        let logits = model.working().forward(x.clone().traced_mixed(grads));
        let loss = mse_loss(logits, y.clone());
        let loss_value = loss.value();
        let scaled = scaler.scale(loss).backward()?;
        let mut unscaled = scaler.unscale(&mut model, scaled)?;
        let norm = clip_grad_norm(&mut unscaled, 1.0)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        if outcome.skipped() {
            println!(
                "step {step:>2}: skipped at scale {:>7}: non-finite gradients in {:?}",
                scaler.get_scale(),
                outcome.non_finite_params()
            );
            // The probes see layer outputs and their gradients; when only a weight gradient
            // (activations times output gradient) overflowed, the parameters above say where.
            if let Some(overflow) = outcome.overflow() {
                println!("         {overflow}");
            }
        }
        let skipped = outcome.skipped();
        // A fresh, watched set of gradients is allocated each step above, so these go unused.
        let _ = scaler.update(outcome)?;
        if !skipped {
            println!("step {step:>2}: loss {loss_value:.3}, gradient norm {norm:.3} (clipped to 1), scale {}", scaler.get_scale());
        }
    }
    println!("skipped steps: {}", scaler.skipped_steps());
    Ok(())
}
