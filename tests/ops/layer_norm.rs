//! The mixed layer norm ([`typed_amp::ops::layernorm`]: 16-bit activations, FP32 parameters and
//! statistics) against an f64 reference on the same 16-bit input, and against the path it
//! replaces (dfdx's FP32 `LayerNorm1D` between two casts).
//!
//! # Tolerances
//!
//! The op computes each row's mean and variance in f64 from the exact widened inputs and rounds
//! them to f32 once, then `(x − mean)·rstd·γ + β` in f32 (four roundings of at most u₃₂ = 2⁻²⁴
//! relative each, on values bounded by `M = |x̂·γ| + |β| + |γ|·rstd·|mean|`), and rounds the
//! result once to the working precision (u relative). So `|y − y₆₄| ≤ u·|y₆₄| + 8·u₃₂·M`.
//! The backward's f32 products and f64 sums make the same few roundings per term, on
//! magnitudes the bounds below name term by term; the input gradient is rounded once to the
//! working precision.

use typed_amp::amp::norm::MixedNorm;
use typed_amp::dfdx::nn::modules::LayerNorm1D;
use typed_amp::loss::Loss;
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;

const M: usize = 24;
const U32: f64 = 1.0 / 16_777_216.0;

/// Unit roundoff of `E`.
fn unit<E: AmpElem>() -> f64 {
    f64::from(typed_amp::precision::dtype_of::<E>().unit_roundoff())
}

/// `n` values of `E` (as f32) around `offset`.
fn sample<E: AmpElem>(dev: &Cpu, n: usize, scale: f32, offset: f32) -> Vec<f32> {
    let t: Tensor<(usize,), f32, Cpu> = dev.sample_normal_like(&(n,));
    t.as_vec()
        .into_iter()
        .map(|v| <E as AmpElem>::from_f32(v * scale + offset).to_f32())
        .collect()
}

fn tensor<E: AmpElem>(dev: &Cpu, v: &[f32]) -> Tensor<(usize, Const<M>), E, Cpu>
where
    Cpu: typed_amp::device::Kernels<E>,
{
    dev.tensor_from_vec(
        v.iter().map(|x| <E as AmpElem>::from_f32(*x)).collect(),
        (v.len() / M, Const::<M>),
    )
}

fn f32s<S: Shape, E: AmpElem>(t: &Tensor<S, E, Cpu>) -> Vec<f32> {
    t.as_vec().into_iter().map(AmpElem::to_f32).collect()
}

fn layer(dev: &Cpu) -> LayerNorm1D<M, f32, Cpu> {
    let mut ln: LayerNorm1D<M, f32, Cpu> =
        dev.build_module::<typed_amp::dfdx::nn::builders::LayerNorm1D<M>, f32>();
    ln.gamma = dev.tensor_from_vec(sample::<f32>(dev, M, 0.5, 1.0), (Const::<M>,));
    ln.beta = dev.tensor_from_vec(sample::<f32>(dev, M, 0.5, 0.0), (Const::<M>,));
    ln
}

/// Forward and backward (`loss = Σ y·r`) of the mixed op: output, input gradient, γ's and β's.
fn mixed<E: AmpElem>(
    ln: &LayerNorm1D<M, f32, Cpu>,
    x: &Tensor<(usize, Const<M>), E, Cpu>,
    r: &Tensor<(usize, Const<M>), E, Cpu>,
) -> [Vec<f32>; 4]
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let y = ln
        .try_forward_mixed(x.clone().leaky_traced_mixed())
        .unwrap();
    let yv = f32s(&y.retaped::<NoneTape>());
    let grads = Loss::new((y * r.clone()).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    // The fused op ran: it writes γ's gradient straight into an FP32 parameter buffer (the
    // FP32 layer between casts leaves it in dfdx's store).
    assert!(
        grads.param_grad(ln.gamma.id()).is_some(),
        "the mixed op ran"
    );
    [
        yv,
        f32s(&grads.get(x).unwrap()),
        grads.get(&ln.gamma).unwrap().as_vec(),
        grads.get(&ln.beta).unwrap().as_vec(),
    ]
}

fn check(what: &str, i: usize, got: f32, exact: f64, bound: f64) {
    let got = f64::from(got);
    assert!(
        (got - exact).abs() <= bound,
        "{what}[{i}]: {got} vs {exact} (bound {bound})"
    );
}

fn layer_norm_case<E: AmpElem>(seed: u64)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let dev = Cpu::seed_from_u64(seed);
    let rows = 77; // more than one parallel task of 32 rows, and a partial one
                   // An offset mean, so that the centred values are small beside the raw ones.
    let xv = sample::<E>(&dev, rows * M, 2.0, 3.0);
    let rv = sample::<E>(&dev, rows * M, 1.0, 0.0);
    let ln = layer(&dev);
    let (x, r) = (tensor::<E>(&dev, &xv), tensor::<E>(&dev, &rv));
    let [y, dx, dg, db] = mixed(&ln, &x, &r);
    let (g, b) = (ln.gamma.as_vec(), ln.beta.as_vec());
    let (g, b): (Vec<f64>, Vec<f64>) = (
        g.iter().map(|v| f64::from(*v)).collect(),
        b.iter().map(|v| f64::from(*v)).collect(),
    );
    let what = std::any::type_name::<E>();
    let u = unit::<E>();
    let (mut dg64, mut db64, mut dg_mag, mut db_mag) =
        (vec![0f64; M], vec![0f64; M], vec![0f64; M], vec![0f64; M]);
    for row in 0..rows {
        let xs: Vec<f64> = (0..M).map(|c| f64::from(xv[row * M + c])).collect();
        let dy: Vec<f64> = (0..M).map(|c| f64::from(rv[row * M + c])).collect();
        let mean = xs.iter().sum::<f64>() / M as f64;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / M as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let xh: Vec<f64> = xs.iter().map(|v| (v - mean) * rstd).collect();
        for c in 0..M {
            let exact = xh[c] * g[c] + b[c];
            let mag = (xh[c] * g[c]).abs() + b[c].abs() + g[c].abs() * rstd * mean.abs();
            check(
                &format!("{what} y"),
                row * M + c,
                y[row * M + c],
                exact,
                u * exact.abs() + 8.0 * U32 * mag,
            );
            dg64[c] += dy[c] * xh[c];
            db64[c] += dy[c];
            // x̂ in f32 errs by about 4·u₃₂·(|x̂| + rstd·|mean|).
            dg_mag[c] += dy[c].abs() * (xh[c].abs() + rstd * mean.abs());
            db_mag[c] += dy[c].abs();
        }
        // dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = dy·γ.
        let gh: Vec<f64> = (0..M).map(|c| dy[c] * g[c]).collect();
        let mg = gh.iter().sum::<f64>() / M as f64;
        let mgx = gh.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / M as f64;
        let mag_g = gh.iter().map(|v| v.abs()).sum::<f64>() / M as f64;
        let mag_gx = gh
            .iter()
            .zip(&xh)
            .map(|(a, b)| a.abs() * (b.abs() + rstd * mean.abs()))
            .sum::<f64>()
            / M as f64;
        for c in 0..M {
            let exact = rstd * (gh[c] - mg - xh[c] * mgx);
            let mag = rstd
                * (gh[c].abs() + mag_g + (xh[c].abs() + rstd * mean.abs()) * (mgx.abs() + mag_gx));
            check(
                &format!("{what} dx"),
                row * M + c,
                dx[row * M + c],
                exact,
                u * exact.abs() + 16.0 * U32 * mag,
            );
        }
    }
    for c in 0..M {
        check(
            &format!("{what} dgamma"),
            c,
            dg[c],
            dg64[c],
            8.0 * U32 * dg_mag[c],
        );
        check(
            &format!("{what} dbeta"),
            c,
            db[c],
            db64[c],
            4.0 * U32 * db_mag[c],
        );
    }
}

#[test]
fn the_mixed_layer_norm_matches_an_f64_reference() {
    layer_norm_case::<f16>(31);
    layer_norm_case::<bf16>(32);
    layer_norm_case::<f32>(33);
}

/// The mixed op and the path it replaces (FP32 layer norm between two casts) round the same
/// formula's FP32 values once: outputs and input gradients within one rounding of `E` of each
/// other plus both paths' f32 roundings, parameter gradients (FP32 in both) within the f32
/// roundings of their sums (bounds below).
fn against_cast_around<E: AmpElem>(seed: u64)
where
    Cpu: typed_amp::device::Kernels<E>,
{
    let dev = Cpu::seed_from_u64(seed);
    let rows = 40;
    let xv = sample::<E>(&dev, rows * M, 1.0, 0.5);
    let rv = sample::<E>(&dev, rows * M, 1.0, 0.0);
    let ln = layer(&dev);
    let (x, r) = (tensor::<E>(&dev, &xv), tensor::<E>(&dev, &rv));
    let [y, dx, dg, db] = mixed(&ln, &x, &r);

    let y2 = ln
        .try_forward(x.clone().leaky_traced_mixed().to_f32())
        .unwrap()
        .cast::<E::Precision>();
    let yv2 = f32s(&y2.retaped::<NoneTape>());
    let grads = Loss::new((y2 * r.clone()).to_f32().sum())
        .backward()
        .unwrap()
        .grads()
        .clone();
    let dx2 = f32s(&grads.get(&x).unwrap());
    let dg2 = grads.get(&ln.gamma).unwrap().as_vec();
    let db2 = grads.get(&ln.beta).unwrap().as_vec();
    let u = unit::<E>();
    let what = std::any::type_name::<E>();
    // Magnitudes each f32 rounding is relative to, from the f64 statistics of each row: the
    // output's (`|x̂·γ| + |β| + |γ|·rstd·|mean|`, as in the f64 test) and the input gradient's
    // (`rstd·(|ĝ| + mean|ĝ| + (|x̂| + rstd·|mean|)·mean|ĝ·x̂|)`), and per column the parameter
    // gradients' sums of `|dy|·(|x̂| + rstd·|mean|)` and `|dy|`.
    let (g, b): (Vec<f64>, Vec<f64>) = (
        ln.gamma.as_vec().iter().map(|v| f64::from(*v)).collect(),
        ln.beta.as_vec().iter().map(|v| f64::from(*v)).collect(),
    );
    let (mut mag_y, mut mag_dx) = (vec![0f64; rows * M], vec![0f64; rows * M]);
    let (mut mag_dg, mut mag_db) = (vec![0f64; M], vec![0f64; M]);
    for row in 0..rows {
        let xs: Vec<f64> = (0..M).map(|c| f64::from(xv[row * M + c])).collect();
        let dy: Vec<f64> = (0..M).map(|c| f64::from(rv[row * M + c])).collect();
        let mean = xs.iter().sum::<f64>() / M as f64;
        let var = xs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / M as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        let xh: Vec<f64> = xs
            .iter()
            .map(|v| ((v - mean) * rstd).abs() + rstd * mean.abs())
            .collect();
        let gh: Vec<f64> = (0..M).map(|c| (dy[c] * g[c]).abs()).collect();
        let mg = gh.iter().sum::<f64>() / M as f64;
        let mgx = gh.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / M as f64;
        for c in 0..M {
            mag_y[row * M + c] = xh[c] * g[c].abs() + b[c].abs();
            mag_dx[row * M + c] = rstd * (gh[c] + mg + xh[c] * mgx);
            mag_dg[c] += dy[c].abs() * xh[c];
            mag_db[c] += dy[c].abs();
        }
    }
    // Each path evaluates its formula in f32 and rounds the result to E once (the parameter
    // gradients stay FP32). The mixed op's f32 error is below 16·u₃₂ of the magnitude; the
    // FP32 layer norm's f32 sums of M terms (the mean, the variance, and in its backward the
    // row sums) add up to 2M + 16 more roundings; rounding two such values to E puts them at
    // most one rounding of each (2u relative) further apart.
    let near = |name: &str, a: &[f32], b: &[f32], rel: f64, mag: &[f64], roundings: f64| {
        for (i, ((a, b), m)) in a.iter().zip(b).zip(mag).enumerate() {
            let (a, b) = (f64::from(*a), f64::from(*b));
            let bound = rel * a.abs().max(b.abs()) + roundings * U32 * m;
            assert!(
                (a - b).abs() <= bound,
                "{what} {name}[{i}]: mixed {a} vs cast-around {b} (bound {bound})"
            );
        }
    };
    let paths = (2 * M + 32) as f64;
    near("y", &y, &yv2, 2.0 * u, &mag_y, paths);
    near("dx", &dx, &dx2, 2.0 * u, &mag_dx, paths);
    // Summed over the rows too: one more rounding per row on each side.
    near("dgamma", &dg, &dg2, 0.0, &mag_dg, paths + 2.0 * rows as f64);
    near("dbeta", &db, &db2, 0.0, &mag_db, paths + 2.0 * rows as f64);
}

#[test]
fn the_mixed_layer_norm_matches_the_cast_around_path() {
    against_cast_around::<f16>(41);
    against_cast_around::<bf16>(42);
}

/// A NaN or an infinity in a row reaches that row's output and the parameters' gradients (so
/// the step's inf/NaN check skips it), and leaves the other rows finite.
#[test]
fn a_non_finite_input_of_the_mixed_layer_norm_reaches_its_gradients() {
    for bad in [f32::NAN, f32::INFINITY] {
        let dev = Cpu::seed_from_u64(5);
        let mut xv = sample::<f16>(&dev, 4 * M, 1.0, 0.0);
        xv[M + 3] = bad;
        let rv = sample::<f16>(&dev, 4 * M, 1.0, 0.0);
        let ln = layer(&dev);
        let (x, r) = (tensor::<f16>(&dev, &xv), tensor::<f16>(&dev, &rv));
        let [y, dx, dg, db] = mixed(&ln, &x, &r);
        assert!(
            y[M..2 * M].iter().all(|v| !v.is_finite()),
            "row 1 carries {bad}"
        );
        assert!(y[..M].iter().chain(&y[2 * M..]).all(|v| v.is_finite()));
        assert!(dx[M..2 * M].iter().any(|v| !v.is_finite()));
        assert!(dg.iter().any(|v| !v.is_finite()), "dgamma carries {bad}");
        assert!(db.iter().all(|v| v.is_finite()), "dbeta sums dy only");
    }
}

#[typed_amp::amp(policy = "O0")]
struct NormO0 {
    norm: typed_amp::dfdx::nn::builders::LayerNorm1D<M>,
}

/// Under O0 (FP32 parameters and activations) an `#[amp]` model's layer norm runs the fused
/// op, as O2's does on 16-bit activations: the model's output is the op's bit for bit (and not
/// dfdx's composed layer's, which rounds its f32 sums differently on these rows), and its
/// backward writes γ's gradient into the FP32 parameter buffer, as only the fused op does.
#[test]
fn an_o0_layer_norm_runs_the_fused_op() {
    let dev = Cpu::seed_from_u64(34);
    let mut model = NormO0::build(&dev).unwrap();
    let rows = 9;
    let x = tensor::<f32>(&dev, &sample::<f32>(&dev, rows * M, 2.0, 3.0));
    let ln = model.working().norm.clone();
    let fused = ln.try_forward_mixed(x.clone()).unwrap().as_vec();
    let composed = ln.forward(x.clone()).as_vec();
    assert_ne!(fused, composed, "the rows tell the two paths apart");
    assert_eq!(model.working().forward(x.clone()).as_vec(), fused);

    let y = model.working_mut().forward_mut(x.leaky_traced_mixed());
    let grads = Loss::new(y.sum()).backward().unwrap().grads().clone();
    assert!(
        grads.param_grad(ln.gamma.id()).is_some(),
        "the fused op ran in training"
    );
}
