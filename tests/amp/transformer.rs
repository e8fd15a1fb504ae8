//! A transformer's parts under the policy table, against FP32 and f64 references: layer norm
//! with FP32 statistics on 16-bit activations, exact GELU and its derivative, self-attention
//! with its softmax in FP32, and one pre-norm attention block's gradients under O2 in FP16 and
//! BF16. Tolerances follow from the format's unit roundoff `u` (2^-24 FP32, 2^-11 FP16, 2^-8
//! BF16) and the length of the sums involved.

use typed_amp::dfdx::nn::builders::{LayerNorm1D, Residual, Softmax};
use typed_amp::nn::builders::SelfAttention;
use typed_amp::params::ParamVisitor;
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp::{params::Parameters, tape::MixedGradients};

const U32: f64 = f32::EPSILON as f64 / 2.0;
const U16: f64 = 1.0 / 2048.0;
const UBF16: f64 = 1.0 / 256.0;

fn layer_norm_f64(row: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    row.iter()
        .zip(gamma.iter().zip(beta))
        .map(|(x, (g, b))| (x - mean) * inv * g + b)
        .collect()
}

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct NormO2 {
    norm: LayerNorm1D<37>,
}

#[typed_amp::amp(policy = "O3", allow_fp16_updates, cast_model_outputs = "fp32")]
struct NormO3 {
    norm: LayerNorm1D<37>,
}

#[test]
fn layer_norm_keeps_fp32_parameters_and_statistics_on_fp16_activations() {
    let dev = Cpu::seed_from_u64(1);
    let mut model = NormO2::build(&dev).unwrap();
    // FP32 parameters in the working copy: O2's `keep_batchnorm_fp32` row.
    let norm: &mut typed_amp::dfdx::nn::modules::LayerNorm1D<37, f32, Cpu> =
        &mut model.working_mut().diverging_from_master_mut().norm;
    norm.gamma = dev.sample_normal();
    norm.beta = dev.sample_normal();
    let (gamma, beta) = (norm.gamma.as_vec(), norm.beta.as_vec());
    let gamma: Vec<f64> = gamma.iter().map(|v| *v as f64).collect();
    let beta: Vec<f64> = beta.iter().map(|v| *v as f64).collect();

    // Rows of 37 (odd), one of them huge: (x − mean)² overflows FP16 there, not FP32.
    let mut x: Vec<f32> = dev.sample_normal::<Rank2<5, 37>>().as_vec();
    for v in &mut x[37..74] {
        *v = *v * 2000.0 + 30000.0;
    }
    let x: Tensor<Rank2<5, 37>, f32, _> = dev.tensor(x);
    let y = model.working().forward(x.clone()).as_vec();
    let x16: Vec<f64> = x
        .as_vec()
        .iter()
        .map(|v| half::f16::from_f32(*v).to_f64())
        .collect();
    for r in 0..5 {
        let want = layer_norm_f64(&x16[r * 37..(r + 1) * 37], &gamma, &beta, 1e-5);
        for c in 0..37 {
            let got = y[r * 37 + c] as f64;
            // One rounding of the output to FP16, FP32 sums of 37 terms before it.
            let scale = gamma[c].abs() * 4.0 + beta[c].abs();
            let bound = U16 * want[c].abs() + (37.0 + 10.0) * U32 * scale;
            assert!(
                (got - want[c]).abs() <= bound,
                "row {r} col {c}: {got} vs {}",
                want[c]
            );
        }
    }

    // The same row in FP16 statistics (O3's row, no keep_batchnorm_fp32) overflows.
    let model16 = NormO3::build(&dev).unwrap();
    let y16 = model16.working().forward(x.clone()).as_vec();
    assert!(
        y16[37..74].iter().any(|v| !v.is_finite()),
        "{:?}",
        &y16[37..74]
    );

    // A NaN in one row reaches that row only.
    let mut bad = x.as_vec();
    bad[3 * 37 + 5] = f32::NAN;
    let y = model
        .working()
        .forward({
            let t: Tensor<Rank2<5, 37>, f32, _> = dev.tensor(bad);
            t
        })
        .as_vec();
    assert!(y[3 * 37..4 * 37].iter().all(|v| v.is_nan()));
    assert!(y[..3 * 37]
        .iter()
        .chain(&y[4 * 37..])
        .all(|v| v.is_finite()));
}

fn gelu_f64(x: f64, dev: &Cpu) -> f64 {
    dev.tensor([x]).accurate_gelu().as_vec()[0]
}

#[test]
fn gelu_and_its_derivative_match_finite_differences_and_an_f64_reference() {
    let dev = Cpu::default();
    let xs: Vec<f64> = (-40..=40).map(|i| i as f64 * 0.15 + 0.013).collect();
    let x: Tensor<Rank1<81>, f64, _> = dev.tensor(xs.clone());
    let grads = x.leaky_trace().accurate_gelu().sum().backward();
    let d64 = grads.get(&x).as_vec();
    for (i, &x) in xs.iter().enumerate() {
        // Central differences: error O(h²·f''') + O(u64/h), both below 1e-9 here.
        let h = 1e-5;
        let fd = (gelu_f64(x + h, &dev) - gelu_f64(x - h, &dev)) / (2.0 * h);
        assert!((d64[i] - fd).abs() < 1e-8, "x = {x}: {} vs {fd}", d64[i]);
    }

    // FP32 against the f64 reference: erf and exp to a few ulps, a handful of operations.
    let x32: Tensor<Rank1<81>, f32, _> =
        dev.tensor(xs.iter().map(|v| *v as f32).collect::<Vec<_>>());
    let y32 = x32.leaky_trace().accurate_gelu();
    let v32 = y32.as_vec();
    let g32 = y32.sum().backward().get(&x32).as_vec();
    let x32v = x32.as_vec();
    let xr: Tensor<Rank1<81>, f64, _> =
        dev.tensor(x32v.iter().map(|v| *v as f64).collect::<Vec<_>>());
    let yr = xr.leaky_trace().accurate_gelu();
    let vr = yr.as_vec();
    let gr = yr.sum().backward().get(&xr).as_vec();
    for i in 0..81 {
        let x = x32v[i].abs() as f64;
        assert!(
            (v32[i] as f64 - vr[i]).abs() <= 16.0 * U32 * (x + 1.0),
            "{i}"
        );
        assert!(
            (g32[i] as f64 - gr[i]).abs() <= 16.0 * U32 * (x * x + 1.0),
            "{i}"
        );
    }
}

/// f64 self-attention with the FP32 layer's weights: the reference.
fn attention_f64<const M: usize, const H: usize>(
    layer: &typed_amp::nn::modules::SelfAttention<
        H,
        typed_amp::dfdx::nn::modules::Linear<M, M, f32, Cpu>,
    >,
    x: &[f64],
    tokens: usize,
) -> Vec<f64> {
    let lin = |l: &typed_amp::dfdx::nn::modules::Linear<M, M, f32, Cpu>, x: &[f64]| {
        let (w, b) = (l.weight.as_vec(), l.bias.as_vec());
        let mut y = vec![0.0; tokens * M];
        for t in 0..tokens {
            for o in 0..M {
                y[t * M + o] = b[o] as f64
                    + (0..M)
                        .map(|i| w[o * M + i] as f64 * x[t * M + i])
                        .sum::<f64>();
            }
        }
        y
    };
    let (q, k, v) = (lin(&layer.q, x), lin(&layer.k, x), lin(&layer.v, x));
    let d = M / H;
    let mut ctx = vec![0.0; tokens * M];
    for h in 0..H {
        for i in 0..tokens {
            let s: Vec<f64> = (0..tokens)
                .map(|j| {
                    (0..d)
                        .map(|c| q[i * M + h * d + c] * k[j * M + h * d + c])
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - max).exp()).sum();
            for c in 0..d {
                ctx[i * M + h * d + c] = (0..tokens)
                    .map(|j| (s[j] - max).exp() / z * v[j * M + h * d + c])
                    .sum();
            }
        }
    }
    lin(&layer.o, &ctx)
}

#[test]
fn attention_matches_an_f64_reference_and_propagates_non_finite_input() {
    let dev = Cpu::seed_from_u64(3);
    let layer = dev.build_module::<SelfAttention<24, 3>, f32>();
    let x: Tensor<Rank3<2, 13, 24>, f32, _> = dev.sample_normal();
    let y = layer.forward(x.clone()).as_vec();
    let xv: Vec<f64> = x.as_vec().iter().map(|v| *v as f64).collect();
    for b in 0..2 {
        let want = attention_f64::<24, 3>(&layer, &xv[b * 13 * 24..(b + 1) * 13 * 24], 13);
        for (i, w) in want.iter().enumerate() {
            let got = y[b * 13 * 24 + i] as f64;
            // Sums of 24 (projections), 8 (scores), 13 (softmax, context) and 24 (output)
            // terms of magnitude ≲ 1 each: γ_n·Σ|terms| for each, twice over for safety.
            let bound = 2.0 * (24.0 * 2.0 + 8.0 + 13.0 * 2.0 + 10.0) * U32 * 4.0;
            assert!((got - w).abs() <= bound, "{got} vs {w}");
        }
    }
    // A NaN in one token of one sequence reaches every token of that sequence (through the
    // softmax over keys) and nothing in the other.
    let mut bad = x.as_vec();
    bad[5 * 24 + 2] = f32::NAN;
    let y = layer
        .forward({
            let t: Tensor<Rank3<2, 13, 24>, f32, _> = dev.tensor(bad);
            t
        })
        .as_vec();
    assert!(y[..13 * 24].iter().all(|v| v.is_nan()));
    assert!(y[13 * 24..].iter().all(|v| v.is_finite()));
}

#[typed_amp::amp(policy = "O2", cast_model_outputs = "fp32")]
struct Probs {
    scores: Linear<1000, 1000>,
    softmax: Softmax,
}

#[test]
fn the_policy_runs_a_softmax_over_a_thousand_elevens_in_fp32() {
    let dev = Cpu::default();
    let mut model = Probs::build(&dev).unwrap();
    // FP16 scores of 11 from an FP16 product (the identity: exact), as attention's QKᵀ gives
    // them; the Fp32Op row casts them to FP32 for the softmax.
    let mut identity = vec![0.0f32; 1000 * 1000];
    for i in 0..1000 {
        identity[i * 1000 + i] = 1.0;
    }
    let identity: Tensor<Rank2<1000, 1000>, f32, _> = dev.tensor(identity);
    let scores = &mut model.working_mut().diverging_from_master_mut().scores;
    scores.weight = identity.to_dtype::<f16>();
    scores.bias = dev.zeros();
    let x: Tensor<Rank2<1, 1000>, f32, _> = dev.ones() * 11.0;
    let p = model.working().forward(x).as_vec();
    for v in p {
        assert!(
            (v as f64 - 1e-3).abs() <= (1000.0 + 4.0) * U32 * 1e-3,
            "{v}"
        );
    }
}

macro_rules! block {
    ($name:ident, $($policy:tt)*) => {
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        struct $name {
            block: Residual<(LayerNorm1D<24>, SelfAttention<24, 3>)>,
        }
    };
}

block!(BlockO0, policy = "O0");
block!(BlockO2, policy = "O2");
block!(BlockO2Bf16, policy = "O2", dtype = "bf16");

/// Every master parameter's gradient, by path.
struct Collect<'g>(&'g MixedGradients<Cpu>, Vec<(String, Vec<f64>)>);

impl ParamVisitor<Cpu> for Collect<'_> {
    type Error = std::convert::Infallible;
    fn visit<S: Shape, E: AmpElem>(
        &mut self,
        path: &str,
        param: &Tensor<S, E, Cpu>,
        trainable: bool,
    ) -> Result<(), Self::Error>
    where
        Cpu: typed_amp::device::Kernels<E>,
    {
        if trainable {
            let g = self.0.get(param).expect("a gradient for every parameter");
            let g = g
                .as_vec()
                .iter()
                .map(|v| AmpElem::to_f32(*v) as f64)
                .collect();
            self.1.push((path.to_string(), g));
        }
        Ok(())
    }
}

fn batch(
    dev: &Cpu,
) -> (
    Tensor<Rank3<4, 17, 24>, f32, Cpu>,
    Tensor<Rank3<4, 17, 24>, f32, Cpu>,
) {
    (dev.sample_normal(), dev.sample_normal())
}

#[test]
fn an_attention_blocks_gradients_under_o2_match_fp32_within_the_formats_bounds() {
    // Same seed, same build order: the same FP32 master weights.
    let (x, target) = batch(&Cpu::seed_from_u64(11));
    let reference = {
        let dev = Cpu::seed_from_u64(5);
        let mut model = BlockO0::build(&dev).unwrap();
        let y = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let grads = mse_loss(y, target.clone())
            .backward()
            .unwrap()
            .check(&mut model)
            .unwrap();
        let mut c = Collect(grads.master_grads(), Vec::new());
        grads.target().master().visit_params(&mut c).unwrap();
        c.1
    };
    assert_eq!(reference.len(), 10); // norm γ, β; q, k, v, o weight and bias

    let fp16 = {
        let dev = Cpu::seed_from_u64(5);
        let mut model = BlockO2::build(&dev).unwrap();
        let scaler = GradScaler::with_static_scale(1024.0).unwrap();
        let y = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let scaled = scaler
            .scale(mse_loss(y, target.clone()))
            .backward()
            .unwrap();
        let grads = scaler.unscale(&mut model, scaled).unwrap();
        let mut c = Collect(grads.master_grads(), Vec::new());
        grads.target().master().visit_params(&mut c).unwrap();
        c.1
    };
    let bf16 = {
        let dev = Cpu::seed_from_u64(5);
        let mut model = BlockO2Bf16::build(&dev).unwrap();
        let y = model
            .working()
            .forward(x.clone().traced_mixed(model.alloc_grads().unwrap()));
        let grads = mse_loss(y, target.clone())
            .backward()
            .unwrap()
            .check(&mut model)
            .unwrap();
        let mut c = Collect(grads.master_grads(), Vec::new());
        grads.target().master().visit_params(&mut c).unwrap();
        c.1
    };

    // Each gradient passes through about L = 12 roundings to the working precision (inputs,
    // weights, products, the softmax's cast back, and as many backward), each a relative error
    // of at most u, accumulating like a random walk over sums of up to 17 tokens: a norm-wise
    // relative error of about u·√(L·17) (measured: 1.5u in both formats).
    for (name, got, u) in [("FP16", &fp16, U16), ("BF16", &bf16, UBF16)] {
        let bound = u * (12.0f64 * 17.0).sqrt();
        let key_weight = &reference
            .iter()
            .find(|(p, _)| p.ends_with("k.weight"))
            .unwrap()
            .1;
        let key_weight_norm = key_weight.iter().map(|b| b * b).sum::<f64>().sqrt();
        for ((path, g), (ref_path, r)) in got.iter().zip(&reference) {
            assert_eq!(path, ref_path);
            if path.ends_with("k.bias") {
                // A bias added to every key shifts a query's scores by one constant: the
                // softmax, and so the loss, do not depend on it. Its gradient is zero but for
                // rounding, in every precision.
                let norm = g.iter().map(|b| b * b).sum::<f64>().sqrt();
                assert!(norm <= bound * key_weight_norm, "{name} {path}: {norm}");
                continue;
            }
            let diff = g
                .iter()
                .zip(r)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
                .sqrt();
            let norm = r.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(norm > 0.0, "{path}");
            assert!(
                diff <= bound * norm,
                "{name} {path}: relative error {} > {bound}",
                diff / norm
            );
        }
    }
}
