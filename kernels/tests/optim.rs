//! Adam's update (`typed_amp_kernels::optim`) at every instruction-set level against a scalar
//! reference written out here, bit for bit, and its step against an f64 reference.

use typed_amp_kernels::optim::AdamStep;
use typed_amp_kernels::{detected_level, force_level, Level};

fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503);
            (h as f32 / u32::MAX as f32 - 0.5) * scale
        })
        .collect()
}

/// dfdx's f32 Adam (`vendor/dfdx/src/tensor_ops/adam/cpu_kernel.rs`) one element at a time,
/// with its constants as dfdx converts them.
#[allow(clippy::too_many_arguments)]
fn reference(
    t: i32,
    betas: [f64; 2],
    (eps, lr): (f64, f64),
    (l2, decoupled): (Option<f64>, Option<f64>),
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    g: &[f32],
) {
    let b = betas.map(|b| b as f32);
    for i in 0..p.len() {
        let mut gi = g[i];
        if let Some(wd) = l2 {
            gi += wd as f32 * p[i];
        }
        m[i] = m[i] * b[0] + gi * (1.0 - b[0]);
        v[i] = v[i] * b[1] + gi.powi(2) * (1.0 - b[1]);
        let m_hat = m[i] * (1.0 - b[0].powi(t)).recip();
        let v_hat = v[i] * (1.0 - b[1].powi(t)).recip();
        gi = lr as f32 * m_hat / (v_hat.sqrt() + eps as f32);
        if let Some(wd) = decoupled {
            gi += (wd * lr) as f32 * p[i];
        }
        p[i] -= gi;
    }
}

/// Every level, every kind of decay, lengths around the vectors' widths (the loops' tails), and
/// zero, tiny and large gradients: the same bits as the scalar reference.
#[test]
fn every_level_gives_the_reference_bits() {
    let decays = [
        (None, None),
        (Some(0.01), None),
        (None, Some(0.1)),
        (Some(0.01), Some(0.1)),
    ];
    let mut ran = Vec::new();
    for level in Level::ALL {
        if level > detected_level() {
            continue;
        }
        for n in [1, 7, 15, 16, 17, 63, 64, 1000] {
            for (t, decay) in [1, 2, 1000]
                .into_iter()
                .zip(decays.iter().cycle().skip(n % 4))
            {
                let p0 = values(n, 1, 2.0);
                let (m0, v0) = (values(n, 2, 0.1), values(n, 3, 0.01).map_abs());
                let mut g = values(n, 4, 1.0);
                g[0] = 0.0;
                if n > 2 {
                    g[1] = 1e-30;
                    g[2] = 3e5;
                }
                let (betas, eps, lr) = ([0.9, 0.99], 1e-8, 1e-3);
                let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
                reference(t, betas, (eps, lr), *decay, &mut p, &mut m, &mut v, &g);
                let step = AdamStep::new(t, betas, eps, lr, decay.0, decay.1);
                let (mut p2, mut m2, mut v2) = (p0.clone(), m0.clone(), v0.clone());
                force_level(Some(level));
                step.update(&mut p2, &mut m2, &mut v2, &g);
                force_level(None);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    (bits(&p2), bits(&m2), bits(&v2)),
                    (bits(&p), bits(&m), bits(&v)),
                    "{level:?}, n = {n}, t = {t}, decay {decay:?}"
                );
            }
        }
        ran.push(level.name());
    }
    println!("every_level_gives_the_reference_bits: ran {ran:?}");
}

/// The first step from zero moments moves each parameter by about `lr·sign(g)` (m̂ = g,
/// v̂ = g²): against f64, within the few f32 roundings of the chain (each relative `u`, with
/// `ε` negligible beside `|g|`).
#[test]
fn the_first_step_is_lr_times_the_sign_of_the_gradient() {
    let n = 100;
    let p0 = values(n, 5, 1.0);
    let g: Vec<f32> = values(n, 6, 1.0).into_iter().map(|x| x + 1.0).collect();
    let (mut p, mut m, mut v) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
    let lr = 1e-3;
    AdamStep::new(1, [0.9, 0.999], 1e-8, lr, None, None).update(&mut p, &mut m, &mut v, &g);
    let u = f64::from(f32::EPSILON) / 2.0;
    for i in 0..n {
        let (gi, p0i) = (f64::from(g[i]), f64::from(p0[i]));
        let exact = p0i - lr * gi / (gi.abs() + 1e-8);
        // About ten roundings in the step (each ≤ u relative of lr), one in the subtraction.
        let bound = 12.0 * u * lr + u * exact.abs();
        assert!(
            (f64::from(p[i]) - exact).abs() <= bound,
            "[{i}]: {} vs {exact}",
            p[i]
        );
    }
}

/// Slices of different lengths are refused before anything is written.
#[test]
#[should_panic(expected = "different lengths")]
fn slices_of_different_lengths_panic() {
    let (mut p, mut m, mut v) = (vec![0f32; 4], vec![0f32; 4], vec![0f32; 3]);
    AdamStep::new(1, [0.9, 0.999], 1e-8, 1e-3, None, None)
        .update(&mut p, &mut m, &mut v, &[0.0; 4]);
}

trait MapAbs {
    fn map_abs(self) -> Self;
}

impl MapAbs for Vec<f32> {
    fn map_abs(self) -> Self {
        self.into_iter().map(f32::abs).collect()
    }
}
