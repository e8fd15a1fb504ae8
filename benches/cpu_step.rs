//! Training-step speed on the CPU, for side-by-side comparison with PyTorch
//! (`benches/peers/torch_cpu_step.py`; `benches/compare_cpu.sh` runs both and prints one table).
//!
//! Models (the same in the PyTorch script):
//!
//! - `mlp`: MLP 784-512-512-10 with ReLU, batch 256;
//! - `cnn`: the main job's CNN (`typed-amp-models`): conv(1→16, 3×3, pad 1)-BN-ReLU-maxpool 2,
//!   conv(16→32, 3×3, pad 1)-BN-ReLU-maxpool 2, flatten, linear 1568→10; batch 128 of 1×28×28;
//! - `vit`: the main job's ViT (`typed-amp-models`): 28×28 images as 16 patches of 7×7, a
//!   linear embedding 49→64, a class token and learned position embedding, 4 pre-norm blocks
//!   (layer norm, 4-head self-attention, layer norm, MLP 64→128→64 with exact GELU), layer norm
//!   and linear 64→10 on the class token; batch 128 (PyTorch: `nn.TransformerEncoderLayer` with
//!   `norm_first=True`, `activation="gelu"`, dropout 0);
//! - `gpt-small`, `gpt-baby`: the Shakespeare job's GPTs (`typed-amp-models`' `gpt`: nanoGPT's
//!   `model.py` with `bias=False`, tied head; small: 4 layers, 4 heads, width 128, context 64,
//!   batch 12; baby: 6 layers, 6 heads, width 384, context 256, batch 64, dropout 0.2) with
//!   their recipe (AdamW lr 1e-3, betas (0.9, 0.99), decay 0.1 on matrices, clipping at 1.0), on
//!   one fixed batch of random characters (PyTorch: `benches/peers/torch_gpt.py step`).
//!
//! Loss: cross-entropy with logits, in FP32. Optimizer: Adam (lr 1e-3, PyTorch's defaults).
//! One fixed random batch, generated once (for `#[amp]` models, in the model's entry precision,
//! as the main job's loader gives it); forward in training mode (`forward_mut`: batch norm uses
//! and updates batch statistics).
//!
//! Configurations per model:
//!
//! - `dfdx-fp32`: plain dfdx (`OwnedTape`, `loss.backward()`, `Adam::update`, `zero_grads`);
//!   not for `vit`, whose attention is typed-amp's;
//! - `O0`, `O2-FP16`, `O2-BF16`, `O1-BF16`: `#[typed_amp::amp]` models trained with the typed
//!   step as the main job does (`scale` → `backward` → `unscale` → `step` → `update`); `vit`
//!   has `O0`, `O2-FP16` and `O2-BF16`; `gpt` adds `O2-BF16+FP8` (`#[amp(fp8 = "hybrid")]`:
//!   FP8 products in its linear layers).
//!
//! and matrix products through dfdx's `matmul` on `(usize, usize)` tensors, 256³ and 1024³, in
//! f32, f16 and bf16.
//!
//! Timing: warm-up steps, then timed steps (at least `--steps`, more until each configuration
//! has run `--min-time` seconds, at most `--max-steps`), taken in blocks of 10 that alternate
//! between configurations so that drifting machine load affects them alike. The figure is the
//! median milliseconds per step (GFLOP/s of the median product time for matmul).
//!
//! ```text
//! cargo bench --bench cpu_step [-- [--json] [--breakdown] [--only mlp|cnn|vit|gpt-small|gpt-baby|matmul] [--config NAME[,NAME...]]
//!                                   [--steps N] [--warmup W] [--min-time SECONDS] [--max-steps N]
//!                                   [--default-malloc]]
//! ```
//!
//! `--breakdown` runs each configuration for `--steps` steps in a row (no interleaving) and
//! splits each step's wall time by phase with `typed_amp_kernels::timing`: forward products,
//! backward products (matrix products and convolutions), attention (the fused op's forward and
//! backward), casts, unscale + check, optimizer + refresh, and norms/elementwise (everything else: activations, norms, pooling, the loss,
//! allocation); then the products that took longest, by shape, with the rate each ran at.
//! `--config NAME` runs only the configurations of that name (several names,
//! comma-separated, run alternately as usual: `--config O2-BF16,O2-BF16+FP8`).
//!
//! Like the main job, the bench first makes glibc keep freed memory for reuse
//! ([`typed_amp::device::keep_freed_memory`]); `--default-malloc` leaves the allocator as it is.
//!
//! `--json` prints one JSON object per line (`model`, `config`, `ms_per_step`, and `gflops` for
//! matmul) instead of the table. The figures are not checked against anything: this bench only
//! measures.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use typed_amp::amp::{AmpModel, MasterOf, WorkingOf};
use typed_amp::dfdx::nn::builders::BatchNorm2D;
use typed_amp::dfdx::optim::Adam;
use typed_amp::nn::builders::{Conv2D, Flatten, MaxPool2D};
use typed_amp::prelude::*;
use typed_amp::tape::MixedTape;
use typed_amp::{error::AmpError, master::TrainTarget, optim::MasterOptimizer};
use typed_amp_kernels::timing::{self, Phase};
use typed_amp_models::gpt::{
    init_gpt, GptBabyO0, GptBabyO2, GptBabyO2Bf16, GptBabyO2Bf16Fp8, GptModel, GptSize, GptSmallO0,
    GptSmallO2, GptSmallO2Bf16, GptSmallO2Bf16Fp8,
};

const CLASSES: usize = 10;
const MLP_BATCH: usize = 256;
const CNN_BATCH: usize = 128;
const VIT_BATCH: usize = 128;
/// Timed steps in a row for one configuration before the next one's turn.
const BLOCK: usize = 10;

// ---------------------------------------------------------------------------------------------
// Models

/// Plain dfdx's MLP.
type DfdxMlp = (
    Linear<784, 512>,
    ReLU,
    Linear<512, 512>,
    ReLU,
    Linear<512, 10>,
);

/// Plain dfdx's CNN (typed-amp's stable conv, pool and flatten layers; dfdx's batch norm).
type DfdxCnn = (
    (Conv2D<1, 16, 3, 1, 1>, BatchNorm2D<16>, ReLU, MaxPool2D<2>),
    (Conv2D<16, 32, 3, 1, 1>, BatchNorm2D<32>, ReLU, MaxPool2D<2>),
    Flatten<{ 32 * 7 * 7 }>,
    Linear<{ 32 * 7 * 7 }, 10>,
);

macro_rules! mlp {
    ($name:ident, $($policy:tt)*) => {
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        struct $name {
            fc1: Linear<784, 512>,
            act1: ReLU,
            fc2: Linear<512, 512>,
            act2: ReLU,
            fc3: Linear<512, 10>,
        }
    };
}

mlp!(MlpO0, policy = "O0");
mlp!(MlpO2, policy = "O2");
mlp!(MlpO2Bf16, policy = "O2", dtype = "bf16");
mlp!(MlpO1Bf16, policy = "O1", dtype = "bf16");

// The CNN and the ViT are the main job's (`typed-amp-models`); the MLP above is wider than the
// main job's (784-512-512-10, the PyTorch peer's).
use typed_amp_models::{CnnO0, CnnO1Bf16, CnnO2, CnnO2Bf16, VitO0, VitO2, VitO2Bf16};

// ---------------------------------------------------------------------------------------------
// Data

type MlpShape = (usize, Const<784>);
type CnnShape = (usize, Const<1>, Const<28>, Const<28>);
type Logits<T> = Tensor<(usize, Const<CLASSES>), f32, Cpu, T>;
/// The element type an `#[amp]` model's entry casts its input to.
type InputElem<M> = <<M as AmpModel<Cpu>>::Input as typed_amp::precision::Precision>::Elem;

/// One fixed batch: standard-normal inputs and one-hot labels drawn uniformly.
struct Batch<S: Shape> {
    x: Tensor<S, f32, Cpu>,
    y: Tensor<(usize, Const<CLASSES>), f32, Cpu>,
}

fn batch<S: Shape>(dev: &Cpu, shape: S, seed: u64) -> Batch<S> {
    let rows = shape.concrete().into_iter().next().unwrap_or(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut y = vec![0.0f32; rows * CLASSES];
    for row in y.chunks_mut(CLASSES) {
        row[rng.gen_range(0..CLASSES)] = 1.0;
    }
    Batch {
        x: dev.sample_normal_like(&shape),
        y: dev.tensor_from_vec(y, (rows, Const)),
    }
}

fn adam() -> AdamConfig {
    // lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay: PyTorch's defaults.
    AdamConfig {
        lr: 1e-3,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Steps

/// What one training step reports.
struct StepInfo {
    loss: f32,
}

/// A configuration ready to run: one call is one training step.
struct Config {
    name: &'static str,
    step: Box<dyn FnMut() -> StepInfo>,
    /// Skipped steps so far (dynamic loss scaling), where the configuration has a scaler.
    skipped: Box<dyn Fn() -> u64>,
    /// The loss of the latest step.
    last_loss: f32,
}

/// Plain dfdx: `OwnedTape`, `loss.backward()`, `Adam::update`, `zero_grads`.
fn dfdx_config<A, S>(dev: &Cpu, data: Batch<S>) -> Config
where
    S: Shape + 'static,
    A: BuildOnDevice<Cpu, f32>,
    A::Built: ModuleMut<Tensor<S, f32, Cpu, OwnedTape<f32, Cpu>>, Output = Logits<OwnedTape<f32, Cpu>>>
        + TensorCollection<f32, Cpu>
        + 'static,
{
    let mut model = dev.build_module::<A, f32>();
    let mut opt: Adam<A::Built, f32, Cpu> = Adam::new(&model, adam());
    let mut grads = Some(model.alloc_grads());
    Config {
        name: "dfdx-fp32",
        step: Box::new(move || {
            let g = grads
                .take()
                .expect("gradients are put back after each step");
            let logits = model.forward_mut(data.x.clone().traced(g));
            let loss =
                typed_amp::dfdx::losses::cross_entropy_with_logits_loss(logits, data.y.clone());
            let value = loss.array();
            // dfdx's own tape does not mark its backward pass for the breakdown: this does.
            let was_backward = timing::set_backward(true);
            let mut g = loss.backward();
            timing::set_backward(was_backward);
            opt.update(&mut model, &g)
                .expect("every parameter has a gradient");
            model.zero_grads(&mut g);
            grads = Some(g);
            StepInfo { loss: value }
        }),
        skipped: Box::new(|| 0),
        last_loss: f32::NAN,
    }
}

/// A GPT trained with its recipe and the typed step, as the main job does (with clipping).
fn gpt_config<M>(name: &'static str, dev: &Cpu) -> Config
where
    M: GptModel<Cpu>,
    M::Weights: 'static,
    Adam<MasterOf<M, Cpu>, f32, Cpu>: MasterOptimizer<MasterOf<M, Cpu>, Cpu> + 'static,
{
    let size = M::SIZE;
    let (b, t) = (size.batch(), size.context());
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let ids: Vec<usize> = (0..b * (t + 1)).map(|_| rng.gen_range(0..65)).collect();
    let (x, y): (Vec<usize>, Vec<usize>) = (0..b * t)
        .map(|i| {
            let (row, col) = (i / t, i % t);
            (ids[row * (t + 1) + col], ids[row * (t + 1) + col + 1])
        })
        .unzip();
    let x: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(x, (b, t));
    let y: Tensor<(usize, usize), usize, Cpu> = dev.tensor_from_vec(y, (b, t));
    let mut model = M::try_build(dev).expect("the model builds");
    init_gpt(&mut model, size).expect("the model initialises");
    let mut opt: Adam<MasterOf<M, Cpu>, f32, Cpu> = Adam::new(
        model.master(),
        AdamConfig {
            lr: 1e-3,
            betas: [0.9, 0.99],
            eps: 1e-8,
            weight_decay: Some(WeightDecay::DecoupledMatrices(0.1)),
        },
    );
    let scaler = std::rc::Rc::new(std::cell::RefCell::new(M::scaler()));
    let mut grads = Some(model.alloc_grads().expect("gradients allocate"));
    let counter = scaler.clone();
    let mut step = move || -> Result<StepInfo, AmpError> {
        let mut scaler = scaler.borrow_mut();
        let g = grads
            .take()
            .expect("gradients are put back after each step");
        let loss = M::try_loss(model.working_mut(), x.clone().traced_mixed(g), &y)
            .map_err(AmpError::device)?;
        let value = loss.value();
        let scaled = scaler.scale(loss).backward()?;
        let mut unscaled = scaler.unscale(&mut model, scaled)?;
        clip_grad_norm(&mut unscaled, 1.0)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        grads = Some(scaler.update(outcome)?);
        Ok(StepInfo { loss: value })
    };
    Config {
        name,
        step: Box::new(move || step().expect("the typed step runs")),
        skipped: Box::new(move || counter.borrow().skipped_steps()),
        last_loss: f32::NAN,
    }
}

fn gpt_configs(dev: &Cpu, size: GptSize) -> Vec<Config> {
    match size {
        GptSize::Small => vec![
            gpt_config::<GptSmallO0>("O0", dev),
            gpt_config::<GptSmallO2>("O2-FP16", dev),
            gpt_config::<GptSmallO2Bf16>("O2-BF16", dev),
            gpt_config::<GptSmallO2Bf16Fp8>("O2-BF16+FP8", dev),
        ],
        GptSize::Baby => vec![
            gpt_config::<GptBabyO0>("O0", dev),
            gpt_config::<GptBabyO2>("O2-FP16", dev),
            gpt_config::<GptBabyO2Bf16>("O2-BF16", dev),
            gpt_config::<GptBabyO2Bf16Fp8>("O2-BF16+FP8", dev),
        ],
    }
}

/// An `#[amp]` model trained with the typed step, as `cli/src/run.rs` does.
fn amp_config<M, S, O>(
    name: &'static str,
    dev: &Cpu,
    data: Batch<S>,
    make_optimizer: impl FnOnce(&MasterOf<M, Cpu>) -> O,
) -> Config
where
    S: Shape + 'static,
    M: AmpModel<Cpu>,
    M::Weights: 'static,
    WorkingOf<M, Cpu>: ModuleMut<
        Tensor<S, InputElem<M>, Cpu, MixedTape<Cpu>>,
        Output = Logits<MixedTape<Cpu>>,
        Error = <Cpu as HasErr>::Err,
    >,
    O: MasterOptimizer<MasterOf<M, Cpu>, Cpu> + 'static,
    Cpu: typed_amp::device::Kernels<InputElem<M>>,
{
    // The batch in the model's entry precision, as the main job's loader makes it (16 bits
    // under O2): the forward's entry cast then has nothing to do.
    let x = data.x.cast::<M::Input>();
    let mut model = M::try_build(dev).expect("the model builds");
    let mut opt = make_optimizer(model.master());
    let scaler = std::rc::Rc::new(std::cell::RefCell::new(M::scaler()));
    let mut grads = Some(model.alloc_grads().expect("gradients allocate"));
    let counter = scaler.clone();
    let step = move || -> Result<StepInfo, AmpError> {
        let mut scaler = scaler.borrow_mut();
        let g = grads
            .take()
            .expect("gradients are put back after each step");
        let logits = model
            .working_mut()
            .try_forward_mut(x.clone().traced_mixed(g))
            .map_err(AmpError::device)?;
        let loss = cross_entropy_with_logits_loss(logits, data.y.clone());
        let value = loss.value();
        let scaled = scaler.scale(loss).backward()?;
        let unscaled = scaler.unscale(&mut model, scaled)?;
        let outcome = scaler.step(&mut opt, unscaled)?;
        grads = Some(scaler.update(outcome)?);
        Ok(StepInfo { loss: value })
    };
    let mut step = step;
    Config {
        name,
        step: Box::new(move || step().expect("the typed step runs")),
        skipped: Box::new(move || counter.borrow().skipped_steps()),
        last_loss: f32::NAN,
    }
}

fn mlp_configs(dev: &Cpu) -> Vec<Config> {
    let data = || batch(dev, (MLP_BATCH, Const::<784>), 1);
    vec![
        dfdx_config::<DfdxMlp, MlpShape>(dev, data()),
        amp_config::<MlpO0, MlpShape, _>("O0", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<MlpO2, MlpShape, _>("O2-FP16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<MlpO2Bf16, MlpShape, _>("O2-BF16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<MlpO1Bf16, MlpShape, _>("O1-BF16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
    ]
}

fn cnn_configs(dev: &Cpu) -> Vec<Config> {
    let data = || batch(dev, (CNN_BATCH, Const::<1>, Const::<28>, Const::<28>), 2);
    vec![
        dfdx_config::<DfdxCnn, CnnShape>(dev, data()),
        amp_config::<CnnO0, CnnShape, _>("O0", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<CnnO2, CnnShape, _>("O2-FP16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<CnnO2Bf16, CnnShape, _>("O2-BF16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<CnnO1Bf16, CnnShape, _>("O1-BF16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
    ]
}

fn vit_configs(dev: &Cpu) -> Vec<Config> {
    let data = || batch(dev, (VIT_BATCH, Const::<784>), 3);
    vec![
        amp_config::<VitO0, MlpShape, _>("O0", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<VitO2, MlpShape, _>("O2-FP16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
        amp_config::<VitO2Bf16, MlpShape, _>("O2-BF16", dev, data(), |m| {
            Adam::<_, f32, Cpu>::new(m, adam())
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Timing

struct Options {
    json: bool,
    /// Keep freed memory for reuse, as the main job does
    /// (`typed_amp::device::keep_freed_memory`; off with `--default-malloc`).
    keep_freed_memory: bool,
    only: Option<String>,
    /// Run only the configurations of this name (`O0`, `O2-BF16`, ...).
    config: Option<String>,
    /// Report where each step's time goes instead of timing steps.
    breakdown: bool,
    steps: usize,
    warmup: usize,
    min_time: f64,
    max_steps: usize,
}

impl Options {
    fn parse() -> Options {
        let mut o = Options {
            json: false,
            keep_freed_memory: true,
            only: None,
            config: None,
            breakdown: false,
            steps: 30,
            warmup: 5,
            min_time: 2.0,
            max_steps: 300,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .unwrap_or_else(|| usage(&format!("{name} needs a value")))
            };
            match arg.as_str() {
                "--json" => o.json = true,
                "--breakdown" => o.breakdown = true,
                "--default-malloc" => o.keep_freed_memory = false,
                "--only" => {
                    let v = value("--only");
                    if !["mlp", "cnn", "vit", "gpt-small", "gpt-baby", "matmul"]
                        .contains(&v.as_str())
                    {
                        usage(&format!(
                            "--only {v}: expected mlp, cnn, vit, gpt-small, gpt-baby or matmul"
                        ));
                    }
                    o.only = Some(v);
                }
                "--config" => o.config = Some(value("--config")),
                "--steps" => o.steps = number(&value("--steps"), "--steps"),
                "--warmup" => o.warmup = number(&value("--warmup"), "--warmup"),
                "--max-steps" => o.max_steps = number(&value("--max-steps"), "--max-steps"),
                "--min-time" => {
                    let v = value("--min-time");
                    o.min_time = v
                        .parse()
                        .unwrap_or_else(|_| usage(&format!("--min-time {v}: expected seconds")));
                }
                "-h" | "--help" => usage(""),
                // `cargo bench` passes `--bench`; ignore anything else it may add.
                _ => {}
            }
        }
        o.steps = o.steps.max(1);
        o.max_steps = o.max_steps.max(o.steps);
        o
    }

    fn runs(&self, what: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == what)
    }
}

fn number(v: &str, name: &str) -> usize {
    v.parse()
        .unwrap_or_else(|_| usage(&format!("{name} {v}: expected a whole number")))
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!(
        "usage: cargo bench --bench cpu_step -- [--json] [--breakdown] [--only mlp|cnn|vit|gpt-small|gpt-baby|matmul] \
         [--config NAME[,NAME...]] [--steps N] [--warmup W] [--min-time SECONDS] [--max-steps N]"
    );
    std::process::exit(if problem.is_empty() { 0 } else { 2 });
}

/// CPU time this process has used so far, all threads, in seconds (Linux's `/proc/self/stat`,
/// in clock ticks of 10 ms; `None` elsewhere). On a loaded machine it wanders less than wall
/// time; summed over blocks of steps, the tick is fine enough.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at the state, field 3;
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Timing samples of one configuration, with the CPU time they took.
struct Samples {
    timed: bench_timing::Samples,
    /// CPU seconds over the timed blocks.
    cpu: Option<f64>,
}

impl Samples {
    fn new() -> Self {
        Samples {
            timed: bench_timing::Samples::new(),
            cpu: Some(0.0),
        }
    }

    fn cpu_ms(&self) -> Option<f64> {
        self.cpu.map(|c| c / self.timed.len() as f64 * 1e3)
    }
}

/// Runs `work` for each entry in turn, `BLOCK` timed calls at a time, until every entry has
/// at least `opts.steps` samples and `opts.min_time` seconds of them (or `opts.max_steps`).
fn time_interleaved<T>(
    entries: &mut [T],
    opts: &Options,
    mut work: impl FnMut(&mut T) -> Duration,
) -> Vec<Samples> {
    for entry in entries.iter_mut() {
        for _ in 0..opts.warmup {
            work(entry);
        }
    }
    let mut samples: Vec<Samples> = entries.iter().map(|_| Samples::new()).collect();
    let done = |s: &Samples| {
        s.timed.len() >= opts.max_steps
            || (s.timed.len() >= opts.steps && s.timed.total().as_secs_f64() >= opts.min_time)
    };
    while !samples.iter().all(done) {
        for (entry, s) in entries.iter_mut().zip(samples.iter_mut()) {
            if done(s) {
                continue;
            }
            // Up to the block, without going past the minimum count when time is not the
            // limit, nor past the maximum.
            let left = if s.timed.total().as_secs_f64() >= opts.min_time {
                opts.steps.saturating_sub(s.timed.len()).max(1)
            } else {
                BLOCK
            };
            let n = left.min(BLOCK).min(opts.max_steps - s.timed.len());
            let cpu_before = cpu_seconds();
            for _ in 0..n {
                s.timed.push(work(entry));
            }
            s.cpu = match (s.cpu, cpu_before, cpu_seconds()) {
                (Some(sum), Some(a), Some(b)) => Some(sum + (b - a)),
                _ => None,
            };
        }
    }
    samples
}

/// One result line.
struct Row {
    model: &'static str,
    config: String,
    ms: f64,
    p10: f64,
    p90: f64,
    steps: usize,
    cpu_ms: Option<f64>,
    gflops: Option<f64>,
    loss: Option<f32>,
    skipped: Option<u64>,
    /// Milliseconds per step by phase (`--breakdown`).
    phases: Vec<(Phase, f64)>,
    /// The recording thread's products by shape, over all the steps (`--breakdown`).
    shapes: Vec<(timing::ProductShape, timing::ShapeTotal)>,
}

impl Row {
    fn json(&self) -> String {
        let mut s = format!(
            "{{\"model\": \"{}\", \"config\": \"{}\", \"ms_per_step\": {:.4}, \"p10_ms\": {:.4}, \
             \"p90_ms\": {:.4}, \"steps\": {}",
            self.model, self.config, self.ms, self.p10, self.p90, self.steps
        );
        if let Some(c) = self.cpu_ms {
            s += &format!(", \"cpu_ms_per_step\": {c:.4}");
        }
        if let Some(g) = self.gflops {
            s += &format!(", \"gflops\": {g:.2}");
        }
        if let Some(l) = self.loss {
            if l.is_finite() {
                s += &format!(", \"final_loss\": {l:.5}");
            } else {
                s += &format!(", \"final_loss\": \"{l}\"");
            }
        }
        if let Some(k) = self.skipped {
            s += &format!(", \"skipped_steps\": {k}");
        }
        if !self.phases.is_empty() {
            let phases: Vec<String> = self
                .phases
                .iter()
                .map(|(p, ms)| format!("\"{}\": {ms:.4}", p.name()))
                .collect();
            s += &format!(", \"breakdown_ms\": {{{}}}", phases.join(", "));
        }
        s += &format!(", \"threads\": {}, \"impl\": \"typed-amp\"}}", threads());
        s
    }
}

fn run_models(model: &'static str, mut configs: Vec<Config>, opts: &Options, out: &mut Vec<Row>) {
    if let Some(only) = &opts.config {
        configs.retain(|c| only.split(',').any(|name| c.name == name));
    }
    if opts.breakdown {
        return breakdown(model, configs, opts, out);
    }
    let samples = time_interleaved(&mut configs, opts, |config| {
        let t = Instant::now();
        let info = (config.step)();
        let elapsed = t.elapsed();
        config.last_loss = info.loss;
        elapsed
    });
    for (config, s) in configs.iter().zip(&samples) {
        out.push(Row {
            model,
            config: config.name.to_string(),
            ms: s.timed.median_ms(),
            p10: s.timed.quantile_ms(0.1),
            p90: s.timed.quantile_ms(0.9),
            steps: s.timed.len(),
            cpu_ms: s.cpu_ms(),
            gflops: None,
            loss: Some(config.last_loss),
            skipped: Some((config.skipped)()),
            phases: Vec::new(),
            shapes: Vec::new(),
        });
    }
}

/// `--breakdown`: each configuration in turn, `opts.steps` steps after the warm-up, with the
/// time of every step split by phase (`typed_amp_kernels::timing`): what the kernels claim as
/// products, casts, unscaling and the optimizer, and the rest of the step.
fn breakdown(model: &'static str, mut configs: Vec<Config>, opts: &Options, out: &mut Vec<Row>) {
    for config in &mut configs {
        for _ in 0..opts.warmup {
            config.last_loss = (config.step)().loss;
        }
        let mut times = Vec::with_capacity(opts.steps);
        timing::start();
        for _ in 0..opts.steps {
            let t = Instant::now();
            {
                let _step = timing::scope(timing::Kind::Other);
                config.last_loss = (config.step)().loss;
            }
            times.push(t.elapsed());
        }
        let shapes = timing::products_by_shape();
        let phases = timing::stop();
        let s: bench_timing::Samples = times.into_iter().collect();
        let per_step = |d: Duration| d.as_secs_f64() * 1e3 / opts.steps as f64;
        out.push(Row {
            model,
            config: config.name.to_string(),
            ms: s.mean_ms(),
            p10: s.quantile_ms(0.1),
            p90: s.quantile_ms(0.9),
            steps: opts.steps,
            cpu_ms: None,
            gflops: None,
            loss: Some(config.last_loss),
            skipped: Some((config.skipped)()),
            phases: phases.iter().map(|&(p, d)| (p, per_step(d))).collect(),
            shapes,
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Matrix products

/// `a.matmul(b)` on square `(usize, usize)` tensors of one dtype, allocating its output as
/// training does.
struct Matmul {
    name: String,
    n: usize,
    run: Box<dyn FnMut() -> Duration>,
}

fn matmul<E>(dev: &Cpu, dtype: &str, n: usize) -> Matmul
where
    E: Dtype,
    Cpu: Device<E>,
{
    let a = <Cpu as SampleTensor<f32>>::sample_normal_like(dev, &(n, n));
    let b = <Cpu as SampleTensor<f32>>::sample_normal_like(dev, &(n, n));
    let (a, b) = (a.to_dtype::<E>(), b.to_dtype::<E>());
    Matmul {
        name: format!("{dtype}-{n}"),
        n,
        run: Box::new(move || {
            let t = Instant::now();
            let c = a.clone().matmul(b.clone());
            let elapsed = t.elapsed();
            std::hint::black_box(&c);
            elapsed
        }),
    }
}

fn run_matmul(dev: &Cpu, opts: &Options, out: &mut Vec<Row>) {
    let mut products = Vec::new();
    for n in [256, 1024] {
        products.push(matmul::<f32>(dev, "f32", n));
        products.push(matmul::<f16>(dev, "f16", n));
        products.push(matmul::<bf16>(dev, "bf16", n));
    }
    // Products are quick: take more of them, at least the step count and a second each.
    let opts = Options {
        json: opts.json,
        keep_freed_memory: opts.keep_freed_memory,
        only: None,
        config: None,
        breakdown: false,
        steps: opts.steps.max(30),
        warmup: opts.warmup.max(3),
        min_time: opts.min_time.min(1.0),
        max_steps: opts.max_steps.max(1000),
    };
    let samples = time_interleaved(&mut products, &opts, |p| (p.run)());
    for (p, s) in products.iter().zip(&samples) {
        let flops = 2.0 * (p.n as f64).powi(3);
        let ms = s.timed.median_ms();
        out.push(Row {
            model: "matmul",
            config: p.name.clone(),
            ms,
            p10: s.timed.quantile_ms(0.1),
            p90: s.timed.quantile_ms(0.9),
            steps: s.timed.len(),
            cpu_ms: s.cpu_ms(),
            gflops: Some(flops / (ms * 1e-3) / 1e9),
            loss: None,
            skipped: None,
            phases: Vec::new(),
            shapes: Vec::new(),
        });
    }
}

// ---------------------------------------------------------------------------------------------

fn threads() -> usize {
    // dfdx's matmul runs on rayon's global pool: RAYON_NUM_THREADS, else one per core.
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn print_table(rows: &[Row], opts: &Options) {
    println!(
        "typed-amp CPU training step ({} threads; warm-up {}, then at least {} timed steps and {} s per configuration; median, p10-p90)",
        threads(),
        opts.warmup,
        opts.steps,
        opts.min_time
    );
    let mut model = "";
    for row in rows {
        if row.model != model {
            model = row.model;
            println!();
            match model {
                "mlp" => println!("MLP 784-512-512-10, batch {MLP_BATCH}, Adam, cross-entropy"),
                "cnn" => println!(
                    "CNN conv16-BN-ReLU-pool, conv32-BN-ReLU-pool, linear 1568-10, batch {CNN_BATCH}, Adam"
                ),
                "vit" => println!(
                    "ViT 7x7 patches, width 64, 4 heads, 4 pre-norm blocks, MLP 128, GELU, batch {VIT_BATCH}, Adam"
                ),
                "gpt-small" | "gpt-baby" => {
                    let size = if model == "gpt-small" { GptSize::Small } else { GptSize::Baby };
                    println!(
                        "{}, batch {}, AdamW, clipping 1.0; products {:.2} GFLOP a step",
                        size.describe(),
                        size.batch(),
                        size.step_product_flops(size.batch()) / 1e9
                    )
                }
                _ => println!("dfdx matmul, square n x n x n"),
            }
            if model == "matmul" {
                println!(
                    "  {:<10} {:>10} {:>19} {:>9} {:>7}",
                    "product", "ms", "p10-p90", "GFLOP/s", "calls"
                );
            } else {
                println!(
                    "  {:<10} {:>10} {:>19} {:>7} {:>11} {:>8}",
                    "config", "ms/step", "p10-p90", "steps", "final loss", "skipped"
                );
            }
        }
        let spread = format!("{:.2}-{:.2}", row.p10, row.p90);
        if !row.phases.is_empty() {
            print_breakdown(row);
            continue;
        }
        match row.gflops {
            Some(g) => println!(
                "  {:<10} {:>10.3} {:>19} {:>9.1} {:>7}",
                row.config, row.ms, spread, g, row.steps
            ),
            None => println!(
                "  {:<10} {:>10.2} {:>19} {:>7} {:>11.4} {:>8}",
                row.config,
                row.ms,
                spread,
                row.steps,
                row.loss.unwrap_or(f32::NAN),
                row.skipped.unwrap_or(0)
            ),
        }
    }
}

/// One configuration's breakdown: ms per step by phase, and the products' share.
fn print_breakdown(row: &Row) {
    let products: f64 = row
        .phases
        .iter()
        .filter(|(p, _)| matches!(p, Phase::ForwardProducts | Phase::BackwardProducts))
        .map(|(_, ms)| ms)
        .sum();
    println!(
        "  {:<10} {:>7.2} ms/step (mean of {}), products {:.2}, outside products {:.2}",
        row.config,
        row.ms,
        row.steps,
        products,
        row.ms - products
    );
    for (phase, ms) in &row.phases {
        println!(
            "      {:<22} {:>7.3} ms {:>5.1}%",
            phase.name(),
            ms,
            100.0 * ms / row.ms
        );
    }
    print_shapes(row);
}

/// The products that took longest, by shape: what each costs a step and the rate it runs at.
/// Only the recording thread's products are timed: those split across the pool count once at
/// the whole pool's rate; attention's per-head products, one per pool task, only where that task
/// ran on the recording thread, at one thread's rate.
fn print_shapes(row: &Row) {
    const SHOWN: usize = 12;
    if row.shapes.is_empty() {
        return;
    }
    let steps = row.steps.max(1) as f64;
    println!(
        "      products by shape (the recording thread's, the {} longest): calls/step, ms/step, \
         GFLOP/s, m x n x k, strides of A, B, C, accumulate",
        SHOWN.min(row.shapes.len())
    );
    for (shape, total) in row.shapes.iter().take(SHOWN) {
        let secs = total.time.as_secs_f64();
        let rate = if secs > 0.0 {
            shape.flops() * total.calls as f64 / secs / 1e9
        } else {
            0.0
        };
        println!(
            "      {:>8.1} {:>8.3} {:>7.1}  {}x{}x{}  A {:?} B {:?} C {:?}{}",
            total.calls as f64 / steps,
            secs * 1e3 / steps,
            rate,
            shape.m,
            shape.n,
            shape.k,
            shape.a,
            shape.b,
            shape.c,
            if shape.accumulate { "  +=" } else { "" }
        );
    }
}

fn main() {
    let opts = Options::parse();
    // Before any worker allocates (the setting covers the arenas made after it).
    if opts.keep_freed_memory {
        typed_amp::device::keep_freed_memory();
    }
    // As the CLI does: the steps run on one of the CPU kernels' worker threads.
    typed_amp::device::on_cpu_pool(move || run(opts))
}

fn run(opts: Options) {
    let dev = Cpu::seed_from_u64(0);
    let mut rows = Vec::new();
    if opts.runs("mlp") {
        run_models("mlp", mlp_configs(&dev), &opts, &mut rows);
    }
    if opts.runs("cnn") {
        run_models("cnn", cnn_configs(&dev), &opts, &mut rows);
    }
    if opts.runs("vit") {
        run_models("vit", vit_configs(&dev), &opts, &mut rows);
    }
    if opts.runs("gpt-small") {
        run_models(
            "gpt-small",
            gpt_configs(&dev, GptSize::Small),
            &opts,
            &mut rows,
        );
    }
    // The baby GPT takes seconds a step on two cores: only when asked for by name.
    if opts.only.as_deref() == Some("gpt-baby") {
        run_models(
            "gpt-baby",
            gpt_configs(&dev, GptSize::Baby),
            &opts,
            &mut rows,
        );
    }
    if opts.runs("matmul") {
        run_matmul(&dev, &opts, &mut rows);
    }
    if opts.json {
        for row in &rows {
            println!("{}", row.json());
        }
    } else {
        print_table(&rows, &opts);
    }
}
