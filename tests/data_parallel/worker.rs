//! One rank of the data-parallel tests (`tests/data_parallel.rs` runs it under `mpirun -n 2`).
//!
//! `typed-amp-dp-worker SCENARIO` runs one scenario on every rank; rank 0 prints lines
//! `RESULT key=value` with what the test checks. Every scenario also checks, after every step, that
//! the ranks hold the same master weights and loss scale bit for bit
//! (`DataParallel::check_in_sync`), and fails (non-zero exit) otherwise.
//!
//! Scenarios:
//! - `equivalence`: an FP32 linear regression trained on 2 ranks with batch `B` per rank, then,
//!   on rank 0 alone, the same run in one process with batch `2B`, and again with two
//!   accumulated micro-batches of `B`; prints the largest master-weight differences and the
//!   tolerance derived from FP32 summation order (see [`tolerance_step`]).
//! - `overflow`: an FP16 MLP with a dynamic scaler; rank 1 alone gets an inf in its gradients at
//!   one step; prints every rank's skipped steps and scales.
//! - `accumulate`: windows of several micro-batches; prints how many gradient all-reduces ran.

use std::cell::Cell;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use typed_amp::device::HostKernel;
use typed_amp::distributed::mpi::MpiCollective;
use typed_amp::distributed::{master_digest, AllReduce, Collective, DataParallel};
use typed_amp::precision::AmpElem;
use typed_amp::prelude::*;
use typed_amp::{device::AmpDevice, master::Fp32Weights, tape::MixedGradients};

/// Rows per rank and step.
const B: usize = 8;
/// Inputs and outputs of the linear regression.
const IN: usize = 16;
const OUT: usize = 4;
/// Steps of the equivalence run.
const STEPS: usize = 20;
/// SGD's learning rate.
const LR: f64 = 0.05;
/// FP32's unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;

type Regression = Linear<IN, OUT>;
type Mlp = (Linear<IN, 32>, ReLU, Linear<32, OUT>);

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let comm = MpiCollective::init().expect("MPI initialises");
    let result = match scenario.as_str() {
        "equivalence" => equivalence(&comm),
        "overflow" => overflow(&comm),
        "accumulate" => accumulate(&comm),
        other => panic!("unknown scenario `{other}`: equivalence, overflow or accumulate"),
    };
    match result {
        Ok(lines) => {
            for (key, value) in lines {
                println!("RESULT {key}={value}");
            }
        }
        Err(e) => {
            eprintln!("rank {}: {e}", comm.rank());
            std::process::exit(1);
        }
    }
}

/// The data: `rows` inputs in [-1, 1] and targets of a fixed linear map plus noise, also in
/// about [-1, 1].
fn data(rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let truth: Vec<f32> = (0..IN * OUT).map(|_| rng.gen_range(-0.3..0.3)).collect();
    let x: Vec<f32> = (0..rows * IN).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut y = vec![0.0f32; rows * OUT];
    for r in 0..rows {
        for j in 0..OUT {
            let dot: f32 = (0..IN).map(|k| truth[j * IN + k] * x[r * IN + k]).sum();
            y[r * OUT + j] = (dot / 2.0 + rng.gen_range(-0.1..0.1)).clamp(-1.0, 1.0);
        }
    }
    (x, y)
}

fn rows(values: &[f32], width: usize, from: usize, count: usize) -> Vec<f32> {
    values[from * width..(from + count) * width].to_vec()
}

type Batch = (
    Tensor<(usize, Const<IN>), f32, Cpu>,
    Tensor<(usize, Const<OUT>), f32, Cpu>,
);

fn batch(dev: &Cpu, x: &[f32], y: &[f32], from: usize, count: usize) -> Batch {
    (
        dev.tensor_from_vec(rows(x, IN, from, count), (count, Const)),
        dev.tensor_from_vec(rows(y, OUT, from, count), (count, Const)),
    )
}

/// Weights then bias of the regression's master.
fn regression_weights(
    model: &Fp32Weights<typed_amp::dfdx::nn::modules::Linear<IN, OUT, f32, Cpu>, Cpu>,
) -> Vec<f32> {
    let mut w = model.master().weight.as_vec();
    w.extend(model.master().bias.as_vec());
    w
}

fn sgd_config() -> SgdConfig {
    SgdConfig {
        lr: LR,
        momentum: None,
        weight_decay: None,
    }
}

fn scaler() -> GradScaler {
    GradScaler::new(1024.0, 2.0, 0.5, 2000).expect("valid settings")
}

/// One step's growth of the bound on the difference between the master weights of the 2-rank
/// run (batch `B` per rank) and the one-process run (batch `2B`), computed in f64 from the
/// one-process run's weights before the step; returns `(growth, lr·λ_max)`.
///
/// The two runs compute the same quantities and differ only in the order of FP32 sums.
/// `γ(n) = n·u / (1 − n·u)` (u = 2^-24) bounds the relative error of summing `n` terms in any
/// order, so two orders of the same sum differ by at most `(γ(p) + γ(q))·Σ|terms|`:
/// - forward, `ŷ = W·x + b`: `IN + 1` terms per output, summed in whatever order the matrix
///   kernel picks for `B` or `2B` rows: `|Δŷ| ≤ 2·γ(IN + 1)·(Σ|W·x| + |b|)`;
/// - backward, `∂W = Σ_rows dy·xᵀ` and `∂b = Σ_rows dy` with `dy = 2(ŷ − y)/(rows·OUT)`: one
///   sum of `2B` terms against two of `B` added by the all-reduce:
///   `|Δg| ≤ (γ(2B) + γ(B + 1))·Σ|dy·x| + Σ|Δdy|·|x|` (the loss scale and the mean's
///   `1/(rows·OUT)` are powers of two and the all-reduce's halving is exact, so they round
///   nothing);
/// - SGD's update `w − lr·g`, rounded in each run: `lr·|Δg| + 2u·(|w| + lr·|g|)` per element.
///
/// A difference `ΔW` the runs start a step with is carried on as `ΔW·(I − lr·H)`, with
/// `H = 2/(rows·OUT)·Σ x̃x̃ᵀ` (`x̃ = (x, 1)`) the loss's Hessian for each output's weights; when
/// `lr·λ_max(H) ≤ 2` that map does not grow the Frobenius norm, so the Frobenius norm of the
/// difference (which bounds its largest element) grows by at most the new errors of the step,
/// `√(parameters)` times their largest element. `e` (the bound so far) widens the residuals
/// the error terms are computed from, so that they hold for the other run's weights as well.
fn tolerance_step(weights: &[f32], x: &[f32], y: &[f32], from: usize, e: f64) -> (f64, f64) {
    let gamma = |n: usize| n as f64 * U / (1.0 - n as f64 * U);
    let n = 2 * B;
    let (w, b) = weights.split_at(IN * OUT);
    let row = |r: usize| &x[(from + r) * IN..(from + r + 1) * IN];
    let mean = 2.0 / (n * OUT) as f64;
    // Per row and output: |dy| (widened by e) and the bound on |Δdy| from the forward sums.
    let mut dy_abs = vec![0.0f64; n * OUT];
    let mut ddy = vec![0.0f64; n * OUT];
    let mut g = vec![0.0f64; (IN + 1) * OUT];
    for r in 0..n {
        let xr = row(r);
        let x1: f64 = xr.iter().map(|v| f64::from(v.abs())).sum();
        for j in 0..OUT {
            let (mut pred, mut abs) = (f64::from(b[j]), f64::from(b[j].abs()));
            for k in 0..IN {
                let t = f64::from(w[j * IN + k]) * f64::from(xr[k]);
                pred += t;
                abs += t.abs();
            }
            let residual = pred - f64::from(y[(from + r) * OUT + j]);
            dy_abs[r * OUT + j] = mean * (residual.abs() + (x1 + 1.0) * e);
            ddy[r * OUT + j] = mean * 2.0 * gamma(IN + 1) * (abs + (x1 + 1.0) * e);
            for k in 0..=IN {
                let xk = if k < IN { f64::from(xr[k]) } else { 1.0 };
                g[j * (IN + 1) + k] += mean * residual * xk;
            }
        }
    }
    let order = gamma(n) + gamma(B + 1);
    let mut new_error: f64 = 0.0;
    for j in 0..OUT {
        for k in 0..=IN {
            let xk = |r: usize| {
                if k < IN {
                    f64::from(row(r)[k].abs())
                } else {
                    1.0
                }
            };
            let terms: f64 = (0..n).map(|r| dy_abs[r * OUT + j] * xk(r)).sum();
            let forward: f64 = (0..n).map(|r| ddy[r * OUT + j] * xk(r)).sum();
            let dg = order * terms + forward;
            let wk = if k < IN { w[j * IN + k] } else { b[j] };
            let grad = g[j * (IN + 1) + k].abs();
            let update = LR * dg + 2.0 * U * (f64::from(wk.abs()) + e + LR * (grad + dg));
            new_error = new_error.max(update);
        }
    }
    // λ_max of H by power iteration (H is symmetric positive semi-definite, 17 × 17).
    let mut h = vec![0.0f64; (IN + 1) * (IN + 1)];
    for r in 0..n {
        let xr = row(r);
        let xt = |k: usize| if k < IN { f64::from(xr[k]) } else { 1.0 };
        for a in 0..=IN {
            for c in 0..=IN {
                h[a * (IN + 1) + c] += mean * xt(a) * xt(c);
            }
        }
    }
    let mut v = vec![1.0f64; IN + 1];
    let mut lambda = 0.0;
    for _ in 0..200 {
        let hv: Vec<f64> = (0..=IN)
            .map(|a| (0..=IN).map(|c| h[a * (IN + 1) + c] * v[c]).sum())
            .collect();
        let norm = hv.iter().map(|t| t * t).sum::<f64>().sqrt();
        lambda = norm / v.iter().map(|t| t * t).sum::<f64>().sqrt();
        v = hv.iter().map(|t| t / norm).collect();
    }
    // Power iteration approaches λ_max from below: 1% of margin.
    let lr_lambda = LR * lambda * 1.01;
    let parameters = ((IN + 1) * OUT) as f64;
    (parameters.sqrt() * new_error, lr_lambda)
}

/// One process, batch `2B` per step (with the tolerance), or two accumulated micro-batches of
/// `B`.
fn single_process(
    x: &[f32],
    y: &[f32],
    accumulate: bool,
) -> Result<(Vec<f32>, f64, f64), AmpError> {
    let dev = Cpu::seed_from_u64(7);
    let mut model = Fp32Weights::build::<Regression>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), sgd_config());
    let mut scaler = scaler();
    let mut grads = model.alloc_grads()?;
    let (mut tolerance, mut lr_lambda) = (0.0, 0.0f64);
    for step in 0..STEPS {
        let from = step * 2 * B;
        let (growth, contraction) =
            tolerance_step(&regression_weights(&model), x, y, from, tolerance);
        tolerance += growth;
        lr_lambda = lr_lambda.max(contraction);
        let scaled = if accumulate {
            let mut window = scaler.accumulate(grads);
            for half in 0..2 {
                let (xb, yb) = batch(&dev, x, y, from + half * B, B);
                let pred = model.working().forward(window.trace(xb)?);
                window.backward(mse_loss(pred, yb) * 0.5)?;
            }
            window.finish()?
        } else {
            let (xb, yb) = batch(&dev, x, y, from, 2 * B);
            let pred = model.working().forward(xb.traced_mixed(grads));
            scaler.scale(mse_loss(pred, yb)).backward()?
        };
        let unscaled = scaler.unscale(&mut model, scaled)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        grads = scaler.update(outcome)?;
    }
    if lr_lambda > 2.0 {
        return Err(AmpError::InvalidClip(format!(
            "the tolerance assumes lr·λ_max(H) ≤ 2, and it is {lr_lambda}"
        )));
    }
    Ok((regression_weights(&model), tolerance, lr_lambda))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(p, q)| (f64::from(*p) - f64::from(*q)).abs())
        .fold(0.0, f64::max)
}

/// Every rank's `value`, on every rank, in rank order.
fn gather_text(comm: &impl Collective, value: String) -> Result<Vec<String>, AmpError> {
    let mut all = Vec::new();
    for root in 0..comm.size() {
        let mut bytes = if comm.rank() == root {
            value.clone().into_bytes()
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(root, &mut bytes)?;
        all.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    Ok(all)
}

fn equivalence(comm: &MpiCollective) -> Result<Vec<(String, String)>, AmpError> {
    assert_eq!(comm.size(), 2, "the equivalence scenario runs on two ranks");
    let (x, y) = data(STEPS * 2 * B, 11);
    let dev = Cpu::seed_from_u64(7);
    let mut model = Fp32Weights::build::<Regression>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), sgd_config());
    let mut dist = DataParallel::new(scaler(), comm)?;
    dist.broadcast_master(&mut model)?;
    let mut grads = model.alloc_grads()?;
    for step in 0..STEPS {
        let (xb, yb) = batch(&dev, &x, &y, step * 2 * B + comm.rank() * B, B);
        let pred = model.working().forward(xb.traced_mixed(grads));
        let scaled = dist.scale(mse_loss(pred, yb)).backward()?;
        let local = dist.unscale(&mut model, scaled)?;
        let averaged = dist.all_reduce(local)?;
        let outcome = dist.step(&mut opt, averaged)?;
        grads = dist.update(outcome)?;
        dist.check_in_sync(&model)?;
    }
    let fingerprints = gather_text(comm, format!("{:016x}", dist.fingerprint(&model)?))?;
    if !comm.is_root() {
        return Ok(Vec::new());
    }
    let ranks = regression_weights(&model);
    let (batch_2b, tolerance, lr_lambda) = single_process(&x, &y, false)?;
    let (accumulated, _, _) = single_process(&x, &y, true)?;
    let scale = ranks.iter().map(|v| f64::from(v.abs())).fold(0.0, f64::max);
    Ok(vec![
        ("steps".into(), STEPS.to_string()),
        ("rows_per_rank".into(), B.to_string()),
        ("max_abs_master".into(), format!("{scale:e}")),
        (
            "max_diff_vs_batch_2b".into(),
            format!("{:e}", max_abs_diff(&ranks, &batch_2b)),
        ),
        ("tolerance".into(), format!("{tolerance:e}")),
        ("lr_lambda_max".into(), format!("{lr_lambda:.3}")),
        (
            "max_diff_vs_accumulation".into(),
            format!("{:e}", max_abs_diff(&ranks, &accumulated)),
        ),
        ("fingerprints".into(), fingerprints.join(",")),
    ])
}

/// Puts inf into the first element of the first layer's FP16 weight gradient.
fn inject_inf(grads: &mut MixedGradients<Cpu>, param: &Tensor<Rank2<32, IN>, f16, Cpu>) {
    let buf = grads.store_mut::<f16>().get_or_alloc_mut(param).unwrap();
    let dev = param.device();
    let mut values = HostKernel::<f16>::try_read(dev, buf).unwrap();
    values[0] = <f16 as AmpElem>::from_f32(f32::INFINITY);
    HostKernel::<f16>::try_write(dev, buf, &values).unwrap();
}

const OVERFLOW_STEPS: usize = 12;
const OVERFLOW_AT: usize = 5;

fn overflow(comm: &MpiCollective) -> Result<Vec<(String, String)>, AmpError> {
    let (x, y) = data(OVERFLOW_STEPS * comm.size() * B, 5);
    let dev = Cpu::seed_from_u64(3);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::adam(model.master(), AdamConfig::default());
    // Growth every 3 clean steps, so the run grows the scale as well as backing it off.
    let mut dist = DataParallel::new(GradScaler::new(256.0, 2.0, 0.5, 3)?, comm)?;
    dist.broadcast_master(&mut model)?;
    let mut grads = model.alloc_grads()?;
    let mut trace = Vec::new();
    for step in 0..OVERFLOW_STEPS {
        let before = master_digest(&model)?;
        let (xb, yb) = batch(&dev, &x, &y, (step * comm.size() + comm.rank()) * B, B);
        let pred = model.working().forward(xb.to_f16().traced_mixed(grads));
        let mut scaled = dist.scale(mse_loss(pred.to_f32(), yb)).backward()?;
        if step == OVERFLOW_AT && comm.rank() == 1 {
            inject_inf(scaled.grads_mut(), &model.working().0.weight);
        }
        let local = dist.unscale(&mut model, scaled)?;
        let local_inf = local.found_inf();
        let averaged = dist.all_reduce(local)?;
        let outcome = dist.step(&mut opt, averaged)?;
        let skipped = outcome.skipped();
        grads = dist.update(outcome)?;
        dist.check_in_sync(&model)?;
        let unchanged = master_digest(&model)? == before;
        // step:local_inf:skipped:scale:masters_unchanged
        trace.push(format!(
            "{step}:{local_inf}:{skipped}:{}:{unchanged}",
            dist.get_scale()
        ));
    }
    let traces = gather_text(comm, trace.join(" "))?;
    if !comm.is_root() {
        return Ok(Vec::new());
    }
    let mut lines = vec![
        ("overflow_at".to_string(), OVERFLOW_AT.to_string()),
        (
            "skipped_steps".to_string(),
            dist.skipped_steps().to_string(),
        ),
    ];
    for (rank, t) in traces.into_iter().enumerate() {
        lines.push((format!("rank{rank}"), t));
    }
    Ok(lines)
}

/// A collective that counts gradient all-reduces.
struct Counting<'c, C> {
    inner: &'c C,
    calls: Cell<usize>,
}

impl<C: Collective> Collective for Counting<'_, C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn any(&self, flag: bool) -> Result<bool, AmpError> {
        self.inner.any(flag)
    }
    fn sum_f64(&self, values: &mut [f64]) -> Result<(), AmpError> {
        self.inner.sum_f64(values)
    }
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), AmpError> {
        self.inner.broadcast_bytes(root, bytes)
    }
    fn barrier(&self) -> Result<(), AmpError> {
        self.inner.barrier()
    }
}

impl<D: AmpDevice, C: AllReduce<D>> AllReduce<D> for Counting<'_, C> {
    fn all_reduce_sum(
        &self,
        dev: &D,
        bufs: &mut [<D as Storage<f32>>::Vec],
    ) -> Result<(), AmpError> {
        self.calls.set(self.calls.get() + 1);
        self.inner.all_reduce_sum(dev, bufs)
    }
}

const WINDOWS: usize = 3;
const MICRO_BATCHES: usize = 4;

fn accumulate(comm: &MpiCollective) -> Result<Vec<(String, String)>, AmpError> {
    let rows_per_window = MICRO_BATCHES * B;
    let (x, y) = data(WINDOWS * comm.size() * rows_per_window, 9);
    let dev = Cpu::seed_from_u64(5);
    let mut model = MasterWeights::build::<Mlp>(&dev)?;
    let mut opt = typed_amp::optim::sgd(model.master(), sgd_config());
    let counting = Counting {
        inner: comm,
        calls: Cell::new(0),
    };
    let mut dist = DataParallel::new(GradScaler::default(), &counting)?;
    dist.broadcast_master(&mut model)?;
    let mut grads = model.alloc_grads()?;
    let mut micro_batches = 0;
    for w in 0..WINDOWS {
        let first = (w * comm.size() + comm.rank()) * rows_per_window;
        let mut window = dist.accumulate(grads);
        for m in 0..MICRO_BATCHES {
            let (xb, yb) = batch(&dev, &x, &y, first + m * B, B);
            let pred = model.working().forward(window.trace(xb.to_f16())?);
            window.backward(mse_loss(pred.to_f32(), yb) * (1.0 / MICRO_BATCHES as f32))?;
            micro_batches += 1;
        }
        let scaled = window.finish()?;
        let local = dist.unscale(&mut model, scaled)?;
        let averaged = dist.all_reduce(local)?;
        let outcome = dist.step(&mut opt, averaged)?;
        grads = dist.update(outcome)?;
        dist.check_in_sync(&model)?;
    }
    if !comm.is_root() {
        return Ok(Vec::new());
    }
    Ok(vec![
        ("windows".into(), WINDOWS.to_string()),
        ("micro_batches".into(), micro_batches.to_string()),
        (
            "gradient_all_reduces".into(),
            counting.calls.get().to_string(),
        ),
        ("reductions".into(), dist.reductions().to_string()),
    ])
}
