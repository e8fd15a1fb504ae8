//! Several optimizers sharing one scaler: a tiny GAN. The discriminator and the generator each
//! have their own FP32 master weights and optimizer; each optimizer skips its step on its own
//! overflow, and the scaler is updated once per iteration, backing off if either overflowed (as
//! PyTorch documents for GANs).
//!
//! Run with `cargo run --release --example 04_two_optimizers`.

use rand::{rngs::StdRng, Rng, SeedableRng};
use typed_amp::prelude::*;

type Generator = (Linear<4, 16>, Tanh, Linear<16, 2>);
type Discriminator = (Linear<2, 16>, ReLU, Linear<16, 1>);

fn main() -> Result<(), AmpError> {
    let dev = Cpu::seed_from_u64(1);
    let mut generator = MasterWeights::build::<Generator>(&dev)?;
    let mut discriminator = MasterWeights::build::<Discriminator>(&dev)?;
    let mut opt_g = typed_amp::optim::adam(generator.master(), AdamConfig::default());
    let mut opt_d = typed_amp::optim::adam(discriminator.master(), AdamConfig::default());
    let mut scaler = GradScaler::dynamic();

    let mut rng = StdRng::seed_from_u64(3);
    for iteration in 1..=300 {
        // Real samples: points on a circle of radius 2.
        let real: Vec<f16> = (0..32)
            .flat_map(|_| {
                let angle = rng.gen_range(0.0..std::f32::consts::TAU);
                [
                    f16::from_f32(2.0 * angle.cos()),
                    f16::from_f32(2.0 * angle.sin()),
                ]
            })
            .collect();
        let real: Tensor<Rank2<32, 2>, f16, _> = dev.tensor_from_vec(real, (Const, Const));
        let z: Tensor<Rank2<32, 4>, f32, _> = dev.sample_normal();
        let z = z.to_dtype::<f16>();

        // Discriminator: two losses (real -> 1, fake -> 0), backward one after the other into
        // one accumulation window. The generator runs without a tape here.
        let fake = generator.working().forward(z.clone());
        let mut window = scaler.accumulate(discriminator.alloc_grads()?);
        let on_real = discriminator.working().forward(window.trace(real)?);
        window.backward(binary_cross_entropy_with_logits_loss(
            on_real.to_f32(),
            dev.ones(),
        ))?;
        let on_fake = discriminator.working().forward(window.trace(fake)?);
        window.backward(binary_cross_entropy_with_logits_loss(
            on_fake.to_f32(),
            dev.zeros(),
        ))?;
        let unscaled_d = scaler.unscale(&mut discriminator, window.finish()?)?;
        let outcome_d = scaler.step(&mut opt_d, unscaled_d)?;

        // Generator: make the discriminator say 1; only the generator's gradients are kept.
        let fake = generator
            .working()
            .forward(z.traced_mixed(generator.alloc_grads()?));
        let verdict = discriminator.working().forward(fake);
        let loss_g = binary_cross_entropy_with_logits_loss(verdict.to_f32(), dev.ones());
        let loss_g_value = loss_g.value();
        let unscaled_g = scaler.unscale(&mut generator, scaler.scale(loss_g).backward()?)?;
        let outcome_g = scaler.step(&mut opt_g, unscaled_g)?;

        // One update per iteration, taking both outcomes: it backs off if either optimizer
        // found inf or NaN. (The gradients it hands back go unused: this loop allocates each
        // model's gradients where it traces.)
        let _ = scaler.update((outcome_d, outcome_g))?;
        if iteration % 50 == 0 {
            println!(
                "iteration {iteration}: generator loss {loss_g_value:.3}, scale {}, skipped {}",
                scaler.get_scale(),
                scaler.skipped_steps()
            );
        }
    }
    let z: Tensor<Rank2<4, 4>, f32, _> = dev.sample_normal();
    let samples = generator
        .working()
        .forward(z.to_dtype::<f16>())
        .to_f32()
        .array();
    for [x, y] in samples {
        println!(
            "generated ({x:+.2}, {y:+.2}), radius {:.2}",
            (x * x + y * y).sqrt()
        );
    }
    Ok(())
}
