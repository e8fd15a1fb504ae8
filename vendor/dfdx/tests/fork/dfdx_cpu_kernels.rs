//! The fork's rewritten CPU kernels (rows in `TYPED_AMP_PATCH.md`) against the composition or
//! definition they replace.
//!
//! - Softmax along the last axis of a contiguous f32 tensor is one fused pass per row; along
//!   another axis, or on a permuted tensor, upstream's composition runs. Both perform the same
//!   operations on each row in the same order (maximum, `exp(x − max)`, the sum in order,
//!   division), so their outputs are the same bits. Against an f64 reference, with u = 2⁻²⁴ and
//!   rows of n: `exp` within an ulp, the sum's n − 1 additions and the division keep
//!   `|y − y₆₄| ≤ (n + 4)·u·y₆₄`; the input gradient `y·(dy − Σ dy·y)` (fused) or the backward
//!   ops of division, sum and exp (composed) each add a sum of n terms and a few roundings:
//!   `|dx − dx₆₄| ≤ (2n + 12)·u·y₆₄·(|dy| + Σ|dy·y₆₄|)`.
//! - Reshape copies a permuted tensor and adds its gradient back exactly (each element is copied,
//!   or its gradient added, once), on tensors large enough for the parallel path; a broadcast
//!   input (elements sharing an offset) takes the serial path, its gradients sums within the
//!   bound of an f32 sum.

use typed_amp_dfdx::prelude::*;

const N: usize = 33;
const U: f64 = 1.0 / 16_777_216.0;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|x| f64::from(*x)).collect()
}

#[test]
fn the_fused_softmax_gives_the_compositions_output_and_both_gradients_meet_the_f64_bound() {
    let dev = Cpu::seed_from_u64(7);
    let rows = 3000; // several parallel pieces
    let x: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));
    let x = x * 4.0;
    let dy: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));

    let fused = x.leaky_trace().softmax::<Axis<1>>();
    // The same softmax along axis 0 of the transposed tensor: upstream's composition.
    let composed = x
        .leaky_trace()
        .permute::<_, Axes2<1, 0>>()
        .softmax::<Axis<0>>()
        .permute::<_, Axes2<1, 0>>();
    let y = fused.as_vec();
    assert_eq!(
        y,
        composed.as_vec(),
        "the fused forward is the composition's"
    );
    let g_fused = (fused * dy.clone()).sum().backward().get(&x).as_vec();
    let g_composed = (composed * dy.clone()).sum().backward().get(&x).as_vec();

    let (xv, dyv, y) = (f64s(&x.as_vec()), f64s(&dy.as_vec()), f64s(&y));
    let n = N as f64;
    for r in 0..rows {
        let (xs, dys) = (&xv[r * N..(r + 1) * N], &dyv[r * N..(r + 1) * N]);
        let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = xs.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let y64: Vec<f64> = e.iter().map(|v| v / sum).collect();
        let dot: f64 = dys.iter().zip(&y64).map(|(g, y)| g * y).sum();
        let mag: f64 = dys.iter().zip(&y64).map(|(g, y)| (g * y).abs()).sum();
        for c in 0..N {
            let i = r * N + c;
            assert!((y[i] - y64[c]).abs() <= (n + 4.0) * U * y64[c], "y[{i}]");
            let exact = y64[c] * (dys[c] - dot);
            let bound = (2.0 * n + 12.0) * U * y64[c] * (dys[c].abs() + mag);
            for (path, g) in [("fused", g_fused[i]), ("composed", g_composed[i])] {
                let g = f64::from(g);
                assert!(
                    (g - exact).abs() <= bound,
                    "{path} dx[{i}]: {g} vs {exact} (bound {bound})"
                );
            }
        }
    }
}

#[test]
fn a_large_permuted_reshape_copies_values_and_adds_gradients_back_exactly() {
    let dev = Cpu::seed_from_u64(3);
    let x: Tensor<Rank3<8, 96, 100>, f32, _> = dev.sample_normal();
    let p = x.leaky_trace().permute::<_, Axes3<0, 2, 1>>();
    let want = p.as_vec();
    let r = p.reshape::<Rank2<800, 96>>();
    assert_eq!(r.as_vec(), want);
    let w: Tensor<Rank2<800, 96>, f32, _> = dev.sample_normal();
    let g = (r * w.clone()).sum().backward();
    let (gx, wv) = (g.get(&x).as_vec(), w.as_vec());
    for b in 0..8 {
        for i in 0..96 {
            for j in 0..100 {
                assert_eq!(gx[b * 9600 + i * 100 + j], wv[(b * 100 + j) * 96 + i]);
            }
        }
    }
}

#[test]
fn a_large_reshape_of_a_broadcast_input_sums_each_elements_gradients() {
    let dev = Cpu::seed_from_u64(4);
    let x: Tensor<Rank1<100>, f32, _> = dev.sample_normal();
    let r = x
        .leaky_trace()
        .broadcast::<Rank2<800, 100>, _>()
        .reshape::<Rank1<80_000>>();
    let xv = x.as_vec();
    assert!(r
        .as_vec()
        .iter()
        .enumerate()
        .all(|(k, v)| *v == xv[k % 100]));
    let w: Tensor<Rank1<80_000>, f32, _> = dev.sample_normal();
    let gx = (r * w.clone()).sum().backward().get(&x).as_vec();
    let wv = f64s(&w.as_vec());
    for (j, g) in gx.iter().enumerate() {
        let terms = (0..800).map(|i| wv[i * 100 + j]);
        let exact: f64 = terms.clone().sum();
        // An f32 sum of 800 terms: within γ₈₀₀ = 800·u/(1 − 800·u) of the sum of their sizes.
        let bound = 800.0 * U / (1.0 - 800.0 * U) * terms.map(f64::abs).sum::<f64>();
        assert!((f64::from(*g) - exact).abs() <= bound, "dx[{j}]");
    }
}

/// `(max, Σ exp(x − max))` of one row, in f64.
fn shifted_sum(xs: &[f64]) -> (f64, f64) {
    let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (max, xs.iter().map(|v| (v - max).exp()).sum())
}

/// dfdx's `log_softmax` and `logsumexp` subtract the maximum off the tape under the input's
/// id, as its softmax did: on a permuted input their gradients must still come back in the
/// input's order. Each runs along axis 0 of the transposed tensor (rows of n = 33), against f64:
/// `log_softmax`'s output `x − max − ln s` is off by the subtraction's rounding, `ln`'s, and
/// the sum's relative error (n + 2)·u carried through `ln`, so by at most
/// `u·((n + 2) + |ln s| + 2·|x − max| + |y|)`; its gradient `dy − p·Σdy` and `logsumexp`'s
/// `dz·p` are off by a sum of n terms and a few roundings: `(2n + 12)·u·(|dy| + p·Σ|dy|)` and
/// `(n + 8)·u·p·|dz|`.
#[test]
fn log_softmax_and_logsumexp_of_a_permuted_tensor_return_gradients_in_its_order() {
    let dev = Cpu::seed_from_u64(11);
    let rows = 500;
    let x: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));
    let x = x * 4.0;
    let dy: Tensor<(usize, Const<N>), f32, _> = dev.sample_normal_like(&(rows, Const));
    let dz: Tensor<(usize,), f32, _> = dev.sample_normal_like(&(rows,));

    let y = x
        .leaky_trace()
        .permute::<_, Axes2<1, 0>>()
        .log_softmax::<Axis<0>>()
        .permute::<_, Axes2<1, 0>>();
    let yv = f64s(&y.as_vec());
    let g_y = f64s(&(y * dy.clone()).sum().backward().get(&x).as_vec());
    let z = x
        .leaky_trace()
        .permute::<_, Axes2<1, 0>>()
        .logsumexp::<(usize,), Axis<0>>();
    let zv = f64s(&z.as_vec());
    let g_z = f64s(&(z * dz.clone()).sum().backward().get(&x).as_vec());

    let (xv, dyv, dzv) = (f64s(&x.as_vec()), f64s(&dy.as_vec()), f64s(&dz.as_vec()));
    let n = N as f64;
    for r in 0..rows {
        let (xs, dys) = (&xv[r * N..(r + 1) * N], &dyv[r * N..(r + 1) * N]);
        let (max, s) = shifted_sum(xs);
        let lse = max + s.ln();
        let z_bound = U * ((n + 2.0) + s.ln().abs() + 2.0 * max.abs() + lse.abs());
        assert!((zv[r] - lse).abs() <= z_bound, "z[{r}]: {} vs {lse}", zv[r]);
        let sum_dy: f64 = dys.iter().sum();
        let mag: f64 = dys.iter().map(|g| g.abs()).sum();
        for c in 0..N {
            let i = r * N + c;
            let p = (xs[c] - lse).exp();
            let y64 = xs[c] - lse;
            let y_bound = U * ((n + 2.0) + s.ln().abs() + 2.0 * (xs[c] - max).abs() + y64.abs());
            assert!((yv[i] - y64).abs() <= y_bound, "y[{i}]: {} vs {y64}", yv[i]);
            let exact = dys[c] - p * sum_dy;
            let bound = (2.0 * n + 12.0) * U * (dys[c].abs() + p * mag);
            assert!(
                (g_y[i] - exact).abs() <= bound,
                "log_softmax dx[{i}]: {} vs {exact} (bound {bound})",
                g_y[i]
            );
            let exact = dzv[r] * p;
            let bound = (n + 8.0) * U * (p * dzv[r]).abs();
            assert!(
                (g_z[i] - exact).abs() <= bound,
                "logsumexp dx[{i}]: {} vs {exact} (bound {bound})",
                g_z[i]
            );
        }
    }
}

/// dfdx's f32 `accurate_gelu` runs `typed_amp_kernels::math`'s slice forms a block at a time,
/// in parallel pieces: each output is `math::gelu(x)`'s bits and each input gradient
/// `0 + gelu'(x)·dy` (one rounding of the product), for a borrowed input (kept for the
/// backward) and an owned one (overwritten in place).
#[test]
fn f32_gelu_runs_the_kernels_formulas_element_for_element() {
    use typed_amp_kernels::math::{gelu, gelu_derivative};
    let dev = Cpu::seed_from_u64(3);
    let n = 200_003; // several parallel pieces and a ragged block
    let x: Tensor<(usize,), f32, _> = dev.sample_normal_like(&(n,));
    let x = x * 3.0;
    let dy: Tensor<(usize,), f32, _> = dev.sample_normal_like(&(n,));
    let xs = x.as_vec();
    let y = x.leaky_trace().accurate_gelu();
    let owned = x.clone().accurate_gelu().as_vec();
    let yv = y.as_vec();
    let g = (y * dy.clone()).sum().backward().get(&x).as_vec();
    let dys = dy.as_vec();
    for i in 0..n {
        let want = gelu(xs[i]);
        assert_eq!(yv[i].to_bits(), want.to_bits(), "gelu({})", xs[i]);
        assert_eq!(owned[i].to_bits(), want.to_bits(), "owned gelu({})", xs[i]);
        let d = gelu_derivative(xs[i]) * dys[i];
        assert_eq!(g[i].to_bits(), d.to_bits(), "gelu'({}) · {}", xs[i], dys[i]);
    }
}

/// SGD (plain, classic and Nesterov momentum) and RMSprop (plain, centered, with momentum) over
/// f16 weights compute each update in f32 registers (the fork's `OptimCompute`, as Adam's
/// kernel does since issue 34) and round the weight and each state once per step: two steps of
/// the f16 kernel give, bit for bit, the same steps computed here in f32 from the same f16
/// values with one rounding of each result. They used to compute in f16, rounding at every
/// operation, with momentum 0.9 as 0.8999, `1 − alpha` for alpha 0.99 as 0.0100021 and
/// RMSprop's default eps of 1e-8 as 0.
#[cfg(feature = "f16")]
#[test]
fn sgd_and_rmsprop_over_f16_weights_compute_in_f32_and_round_once() {
    use typed_amp_dfdx::dtypes::f16;
    use typed_amp_dfdx::nn::builders::Linear;
    use typed_amp_dfdx::optim::{Momentum, Optimizer, RMSprop, RMSpropConfig, Sgd, SgdConfig};
    use typed_amp_dfdx::prelude::Gradients;

    const I: usize = 16;
    const O: usize = 8;
    let n = O * I + O;
    // Small weights and a gradient of order 1 with some zeros, all f16 numbers: each update is
    // larger than its weight, so the weight's one rounding does not hide how the update was
    // computed (on weights of order 1 an update of a few of their ulps mostly rounds to the same
    // f16 number either way).
    let dev = Cpu::seed_from_u64(3);
    let w: Tensor<Rank1<{ O * I + O }>, f32, Cpu> = dev.sample_normal();
    let w0: Vec<f16> = w
        .as_vec()
        .into_iter()
        .map(|v| f16::from_f32(v * 1e-3))
        .collect();
    let g: Tensor<Rank1<{ O * I + O }>, f32, Cpu> = dev.sample_normal();
    let g: Vec<f16> = g
        .as_vec()
        .into_iter()
        .enumerate()
        .map(|(i, v)| f16::from_f32(if i % 5 == 0 { 0.0 } else { v }))
        .collect();

    // Two steps of `opt` on a linear layer whose weights and gradient are `w0` and `g`, every
    // value read back in f32.
    type Layer = typed_amp_dfdx::nn::modules::Linear<I, O, f16, Cpu>;
    let run = |opt: &mut dyn FnMut(&mut Layer, &Gradients<f16, Cpu>)| {
        let mut lin = dev.build_module::<Linear<I, O>, f16>();
        lin.weight = dev.tensor_from_vec(w0[..O * I].to_vec(), (Const::<O>, Const::<I>));
        lin.bias = dev.tensor_from_vec(w0[O * I..].to_vec(), (Const::<O>,));
        let mut grads = Gradients::leaky();
        grads
            .get_or_alloc_mut(&lin.weight)
            .unwrap()
            .copy_from_slice(&g[..O * I]);
        grads
            .get_or_alloc_mut(&lin.bias)
            .unwrap()
            .copy_from_slice(&g[O * I..]);
        opt(&mut lin, &grads);
        opt(&mut lin, &grads);
        let mut out: Vec<f32> = lin.weight.as_vec().iter().map(|v| v.to_f32()).collect();
        out.extend(lin.bias.as_vec().iter().map(|v| v.to_f32()));
        out
    };
    let rnd = |v: f32| f16::from_f32(v).to_f32();
    let check = |name: &str, got: Vec<f32>, want: Vec<f32>| {
        assert_eq!(got.len(), n);
        assert!(got.iter().all(|v| v.is_finite()), "{name}: {got:?}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}, element {i}: {a} against {b}"
            );
        }
    };

    let lr = 0.1;
    for momentum in [
        None,
        Some(Momentum::Classic(0.9)),
        Some(Momentum::Nesterov(0.9)),
    ] {
        let cfg = SgdConfig {
            lr,
            momentum,
            weight_decay: None,
        };
        // One optimizer for both steps: the second step reads the f16 velocity the first wrote.
        let mut opt = None;
        let got = run(&mut |lin, grads| {
            let opt = opt.get_or_insert_with(|| Sgd::new(lin, cfg));
            opt.update(lin, grads).unwrap();
        });
        // The kernel's formulas in f32, each result rounded once.
        let lr = lr as f32;
        let want: Vec<f32> = (0..n)
            .map(|i| {
                let (mut p, mut v) = (w0[i].to_f32(), 0.0f32);
                for _ in 0..2 {
                    let mut gi = g[i].to_f32();
                    match momentum {
                        Some(Momentum::Classic(u)) => {
                            v = gi + u as f32 * v;
                            gi = v * lr;
                        }
                        Some(Momentum::Nesterov(u)) => {
                            let u = u as f32;
                            v = gi + u * v;
                            gi = (gi + u * v) * lr;
                        }
                        None => gi *= lr,
                    }
                    p = rnd(p - gi);
                    v = rnd(v);
                }
                p
            })
            .collect();
        check(&format!("sgd {momentum:?}"), got, want);
    }

    // RMSprop, likewise.
    for (centered, momentum) in [(false, None), (true, None), (false, Some(0.9))] {
        let cfg = RMSpropConfig {
            lr: 1e-2,
            centered,
            momentum,
            ..Default::default()
        };
        let mut opt = None;
        let got = run(&mut |lin, grads| {
            let opt = opt.get_or_insert_with(|| RMSprop::new(lin, cfg));
            opt.update(lin, grads).unwrap();
        });
        let (alpha, eps, lr) = (cfg.alpha as f32, cfg.eps as f32, cfg.lr as f32);
        let want: Vec<f32> = (0..n)
            .map(|i| {
                // dfdx starts the square average at 1 (as TensorFlow does), the others at 0.
                let (mut p, mut s, mut ga, mut m) = (w0[i].to_f32(), 1.0f32, 0.0f32, 0.0f32);
                for _ in 0..2 {
                    let mut gi = g[i].to_f32();
                    s += (1.0 - alpha) * (gi * gi - s);
                    let avg = if centered {
                        ga += (1.0 - alpha) * (gi - ga);
                        (s - ga.powi(2) + eps).sqrt()
                    } else {
                        (s + eps).sqrt()
                    };
                    gi /= avg;
                    match momentum {
                        Some(u) => {
                            m = m * u as f32 + gi;
                            gi = m * lr;
                        }
                        None => gi *= lr,
                    }
                    p = rnd(p - gi);
                    (s, ga, m) = (rnd(s), rnd(ga), rnd(m));
                }
                p
            })
            .collect();
        check(
            &format!("rmsprop centered {centered}, momentum {momentum:?}"),
            got,
            want,
        );
    }
}

/// f32 Adam (the fork's kernel on typed-amp-kernels' vectorised update, in parallel pieces on
/// tensors of 16,384 elements or more) gives, bit for bit, upstream's loop written out here:
/// two steps on a 300 × 300 linear layer (its weight split into pieces, its bias not), with
/// each kind of weight decay (`DecoupledMatrices` decays the weight and not the bias).
#[test]
fn f32_adam_gives_the_scalar_loops_bits() {
    use typed_amp_dfdx::nn::builders::Linear;
    use typed_amp_dfdx::optim::{Adam, Optimizer};
    use typed_amp_dfdx::prelude::{AdamConfig, Gradients, WeightDecay};

    const D: usize = 300;
    let dev = Cpu::seed_from_u64(11);
    let w0: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(D * D + D,));
    let w0 = w0.as_vec();
    let g: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(D * D + D,));
    let g: Vec<f32> = g
        .as_vec()
        .into_iter()
        .enumerate()
        .map(|(i, v)| if i % 7 == 0 { 0.0 } else { v })
        .collect();
    // Upstream's f32 loop over one tensor, both steps.
    let reference = |p: &mut [f32], g: &[f32], cfg: &AdamConfig| {
        let (mut m, mut v) = (vec![0f32; p.len()], vec![0f32; p.len()]);
        let b = cfg.betas.map(|b| b as f32);
        let (eps, lr) = (cfg.eps as f32, cfg.lr as f32);
        for t in 1..=2 {
            for i in 0..p.len() {
                let mut gi = g[i];
                if let Some(WeightDecay::L2(wd)) = cfg.weight_decay {
                    gi += wd as f32 * p[i];
                }
                m[i] = m[i] * b[0] + gi * (1.0 - b[0]);
                v[i] = v[i] * b[1] + gi.powi(2) * (1.0 - b[1]);
                let m_hat = m[i] * (1.0 - b[0].powi(t)).recip();
                let v_hat = v[i] * (1.0 - b[1].powi(t)).recip();
                gi = lr * m_hat / (v_hat.sqrt() + eps);
                if let Some(WeightDecay::Decoupled(wd)) = cfg.weight_decay {
                    gi += (wd * cfg.lr) as f32 * p[i];
                }
                p[i] -= gi;
            }
        }
    };
    for weight_decay in [
        None,
        Some(WeightDecay::L2(0.01)),
        Some(WeightDecay::Decoupled(0.1)),
        Some(WeightDecay::DecoupledMatrices(0.1)),
    ] {
        let cfg = AdamConfig {
            lr: 1e-3,
            betas: [0.9, 0.99],
            eps: 1e-8,
            weight_decay,
        };
        let mut lin = dev.build_module::<Linear<D, D>, f32>();
        lin.weight = dev.tensor_from_vec(w0[..D * D].to_vec(), (Const::<D>, Const::<D>));
        lin.bias = dev.tensor_from_vec(w0[D * D..].to_vec(), (Const::<D>,));
        let mut grads = Gradients::leaky();
        grads
            .get_or_alloc_mut(&lin.weight)
            .unwrap()
            .copy_from_slice(&g[..D * D]);
        grads
            .get_or_alloc_mut(&lin.bias)
            .unwrap()
            .copy_from_slice(&g[D * D..]);
        let mut opt = Adam::new(&lin, cfg);
        opt.update(&mut lin, &grads).unwrap();
        opt.update(&mut lin, &grads).unwrap();
        // The reference applies `L2` and `Decoupled`: matrices-only decay resolved by rank.
        let by_rank = |rank| AdamConfig {
            weight_decay: WeightDecay::for_rank(weight_decay, rank),
            ..cfg
        };
        let (mut w, mut b) = (w0[..D * D].to_vec(), w0[D * D..].to_vec());
        reference(&mut w, &g[..D * D], &by_rank(2));
        reference(&mut b, &g[D * D..], &by_rank(1));
        for (name, got, want) in [
            ("weight", lin.weight.as_vec(), w),
            ("bias", lin.bias.as_vec(), b),
        ] {
            for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    e.to_bits(),
                    "{weight_decay:?}, {name}[{i}]: {a} against {e}"
                );
            }
        }
    }
}
