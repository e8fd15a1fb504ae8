//! GPU benchmark: milliseconds per training step and peak GPU memory under O0 (FP32), O1 and O2
//! (FP16), and O2-BF16, for an MLP 4096-4096-4096-10 at batch 1024, the main job's CNN at batch
//! 256 and ViT at batch 128, and the baby GPT (nanoGPT's `train_shakespeare_char`: 6 layers,
//! width 384, context 256) at batch 64 with its recipe (AdamW, decay on matrices, clipping at
//! 1.0; also O2-BF16 with FP8 linear layers, `#[amp(fp8 = "hybrid")]`), with typed-amp's bookkeeping (unscale and check, clipping, the optimizer and the
//! working copy's refresh) timed apart; plus the FP16 and BF16 matrix-multiply throughput the MLP
//! reaches. Prints a Markdown section for `BENCHMARKS.md`; `--only mlp|cnn|vit|gpt` runs one.
//!
//! ```sh
//! cargo bench -p typed-amp-cli --features cuda --bench gpu_step
//! ```

use std::time::Instant;

use bench_timing::Samples;
use typed_amp::amp::{AmpModel, MasterOf, WorkingOf};
use typed_amp::dfdx::nn::builders::Linear;
use typed_amp::dfdx::optim::Adam;
use typed_amp::dfdx::prelude::WeightDecay;
use typed_amp::optim::MasterOptimizer;
use typed_amp::prelude::*;
use typed_amp::tape::MixedTape;
use typed_amp_cli::models::gpt::{
    init_gpt, GptBabyO0, GptBabyO2, GptBabyO2Bf16, GptBabyO2Bf16Fp8, GptModel, GptSize, VOCAB,
};
use typed_amp_cli::models::{CnnO0, CnnO1, CnnO2, CnnO2Bf16, VitO0, VitO2, VitO2Bf16};

const MLP_BATCH: usize = 1024;
const CNN_BATCH: usize = 256;
const VIT_BATCH: usize = 128;
const GPT_BATCH: usize = 64;
const WARMUP: usize = 5;
const STEPS: usize = 30;

macro_rules! big_mlp {
    ($name:ident, $($policy:tt)*) => {
        #[typed_amp::amp($($policy)*, cast_model_outputs = "fp32")]
        pub struct $name {
            fc1: Linear<4096, 4096>,
            act1: ReLU,
            fc2: Linear<4096, 4096>,
            act2: ReLU,
            fc3: Linear<4096, 10>,
        }
    };
}

big_mlp!(BigMlpO0, policy = "O0");
big_mlp!(BigMlpO1, policy = "O1");
big_mlp!(BigMlpO2, policy = "O2");
big_mlp!(BigMlpO2Bf16, policy = "O2", dtype = "bf16");

/// Memory in use on the device, in bytes.
fn used_memory() -> usize {
    cudarc::driver::result::mem_get_info().map_or(0, |(free, total)| total - free)
}

struct Figures {
    ms_per_step: f64,
    peak_bytes: usize,
}

/// Times the typed training step on inputs of shape `S`.
fn bench<M, S>(dev: &Cuda, shape: S) -> Figures
where
    M: AmpModel<Cuda>,
    S: Shape,
    WorkingOf<M, Cuda>: ModuleMut<
        Tensor<S, f32, Cuda, MixedTape<Cuda>>,
        Output = Tensor<(usize, Const<10>), f32, Cuda, MixedTape<Cuda>>,
        Error = CudaError,
    >,
    Adam<MasterOf<M, Cuda>, f32, Cuda>: MasterOptimizer<MasterOf<M, Cuda>, Cuda>,
{
    // Memory the last model's run left in dfdx's cache is free memory to this one.
    dev.empty_cache();
    dev.synchronize();
    let baseline = used_memory();
    let mut peak = baseline;
    let mut model = M::try_build(dev).expect("the model builds on the GPU");
    let mut opt: Adam<MasterOf<M, Cuda>, f32, Cuda> =
        Adam::new(model.master(), AdamConfig::default());
    let mut scaler = M::scaler();
    let x: Tensor<S, f32, Cuda> = dev.sample_normal_like(&shape);
    let batch = shape.concrete().into_iter().next().unwrap_or(1);
    let y: Tensor<(usize, Const<10>), f32, Cuda> = dev.zeros_like(&(batch, Const));
    let mut grads = model.alloc_grads().expect("gradients fit");
    let mut steps = Samples::new();
    for step in 0..WARMUP + STEPS {
        dev.synchronize();
        let started = Instant::now();
        let logits = model
            .working_mut()
            .forward_mut(x.clone().traced_mixed(grads));
        let loss = cross_entropy_with_logits_loss(logits, y.clone());
        let scaled = scaler.scale(loss).backward().expect("backward");
        peak = peak.max(used_memory());
        let unscaled = scaler.unscale(&mut model, scaled).expect("unscale");
        let outcome = scaler.step(&mut opt, unscaled).expect("step");
        grads = scaler.update(outcome).expect("update");
        dev.synchronize();
        if step >= WARMUP {
            steps.push(started.elapsed());
        }
    }
    Figures {
        ms_per_step: steps.mean_ms(),
        peak_bytes: peak - baseline,
    }
}

/// Times the baby GPT's training step with its recipe; the second figure is the bookkeeping's
/// share (unscale and check, clipping, optimizer, refresh), in ms per step.
fn bench_gpt<M>(dev: &Cuda) -> (Figures, f64)
where
    M: GptModel<Cuda>,
    Adam<MasterOf<M, Cuda>, f32, Cuda>: MasterOptimizer<MasterOf<M, Cuda>, Cuda>,
{
    // Memory the last model's run left in dfdx's cache is free memory to this one.
    dev.empty_cache();
    dev.synchronize();
    let baseline = used_memory();
    let mut peak = baseline;
    let mut model = M::try_build(dev).expect("the model builds on the GPU");
    init_gpt(&mut model, M::SIZE).expect("the model initialises");
    let config = AdamConfig {
        lr: 1e-3,
        betas: [0.9, 0.99],
        eps: 1e-8,
        weight_decay: Some(WeightDecay::DecoupledMatrices(0.1)),
    };
    let mut opt: Adam<MasterOf<M, Cuda>, f32, Cuda> = Adam::new(model.master(), config);
    let mut scaler = M::scaler();
    let context = M::SIZE.context();
    // Fixed pseudo-random characters (the step's cost does not depend on which).
    let ids = |offset: usize| -> Vec<usize> {
        (0..GPT_BATCH * context)
            .map(|i| (i * 7919 + offset * 104_729 + i / 13) % 65)
            .collect()
    };
    let x: Tensor<(usize, usize), usize, Cuda> = dev.tensor_from_vec(ids(0), (GPT_BATCH, context));
    let y: Tensor<(usize, usize), usize, Cuda> = dev.tensor_from_vec(ids(1), (GPT_BATCH, context));
    let mut grads = model.alloc_grads().expect("gradients fit");
    let (mut steps, mut bookkeeping) = (Samples::new(), Samples::new());
    for step in 0..WARMUP + STEPS {
        dev.synchronize();
        let started = Instant::now();
        let loss =
            M::try_loss(model.working_mut(), x.clone().traced_mixed(grads), &y).expect("forward");
        let scaled = scaler.scale(loss).backward().expect("backward");
        peak = peak.max(used_memory());
        dev.synchronize();
        let books = Instant::now();
        let mut unscaled = scaler.unscale(&mut model, scaled).expect("unscale");
        clip_grad_norm(&mut unscaled, 1.0).expect("clip");
        let outcome = scaler.step(&mut opt, unscaled).expect("step");
        grads = scaler.update(outcome).expect("update");
        dev.synchronize();
        if step >= WARMUP {
            steps.push(started.elapsed());
            bookkeeping.push(books.elapsed());
        }
    }
    (
        Figures {
            ms_per_step: steps.mean_ms(),
            peak_bytes: peak - baseline,
        },
        bookkeeping.mean_ms(),
    )
}

fn device_description(dev: &Cuda) -> String {
    use cudarc::driver::sys;
    let cuda = dev.cuda_device();
    let mut name = [0 as std::ffi::c_char; 128];
    let mut driver = 0;
    // SAFETY: the buffer outlives the call and its length is passed; the device handle is the
    // live device's own.
    let name = unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, *cuda.cu_device());
        sys::cuDriverGetVersion(&mut driver);
        std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned()
    };
    let cc = |a| cuda.attribute(a).unwrap_or(0);
    let major = cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    let minor = cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    format!(
        "{name} (compute capability {major}.{minor}), CUDA driver API {}.{}",
        driver / 1000,
        (driver % 1000) / 10
    )
}

fn main() {
    let dev = match Cuda::try_build(0, 0) {
        Ok(dev) => dev,
        Err(err) => {
            eprintln!("skipping: no CUDA device ({err})");
            return;
        }
    };
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .unwrap_or_default();
    let runs = |name: &str| only.is_empty() || only == name;
    println!("## GPU: {}\n", device_description(&dev));
    println!("`cargo bench -p typed-amp-cli --features cuda --bench gpu_step`, {STEPS} timed steps after {WARMUP} warm-up steps, Adam.\n");
    println!("| model | policy | ms / step | peak GPU memory |");
    println!("| --- | --- | --- | --- |");
    if runs("gpt") {
        let size = GptSize::Baby;
        let flops = size.step_product_flops(GPT_BATCH);
        let tokens = (GPT_BATCH * size.context()) as f64;
        let mut o0 = None;
        for (policy, (f, books)) in [
            ("O0", bench_gpt::<GptBabyO0>(&dev)),
            ("O2", bench_gpt::<GptBabyO2>(&dev)),
            ("O2-BF16", bench_gpt::<GptBabyO2Bf16>(&dev)),
            // FP8 linear layers (cuBLASLt; on a GPU below compute capability 8.9, 16-bit).
            ("O2-BF16-FP8", bench_gpt::<GptBabyO2Bf16Fp8>(&dev)),
        ] {
            let base = *o0.get_or_insert(f.ms_per_step);
            println!(
                "| baby GPT L6 H6 C384 T256 V{VOCAB}, batch {GPT_BATCH} | {policy} | {:.2} | {:.0} MiB |",
                f.ms_per_step,
                f.peak_bytes as f64 / 1048576.0
            );
            println!(
                "|   (tokens/s {:.0}, products {:.0} TFLOP/s, bookkeeping {:.2} ms = {:.1}%, {:.2}x O0) | | | |",
                tokens / (f.ms_per_step * 1e-3),
                flops / (f.ms_per_step * 1e-3) / 1e12,
                books,
                100.0 * books / f.ms_per_step,
                base / f.ms_per_step,
            );
        }
    }
    if runs("vit") {
        let vit_shape = (VIT_BATCH, Const::<784>);
        for (policy, f) in [
            ("O0", bench::<VitO0, _>(&dev, vit_shape)),
            ("O2", bench::<VitO2, _>(&dev, vit_shape)),
            ("O2-BF16", bench::<VitO2Bf16, _>(&dev, vit_shape)),
        ] {
            println!(
                "| main job's ViT, batch {VIT_BATCH} | {policy} | {:.2} | {:.0} MiB |",
                f.ms_per_step,
                f.peak_bytes as f64 / 1048576.0
            );
        }
    }
    if !(runs("mlp") || runs("cnn")) {
        return;
    }
    let mlp_shape = (MLP_BATCH, Const::<4096>);
    let mlp = [
        ("O0", bench::<BigMlpO0, _>(&dev, mlp_shape)),
        ("O1", bench::<BigMlpO1, _>(&dev, mlp_shape)),
        ("O2", bench::<BigMlpO2, _>(&dev, mlp_shape)),
        ("O2-BF16", bench::<BigMlpO2Bf16, _>(&dev, mlp_shape)),
    ];
    for (policy, f) in &mlp {
        println!(
            "| MLP 4096-4096-4096-10, batch {MLP_BATCH} | {policy} | {:.2} | {:.0} MiB |",
            f.ms_per_step,
            f.peak_bytes as f64 / 1048576.0
        );
    }
    let cnn_shape = (CNN_BATCH, Const::<1>, Const::<28>, Const::<28>);
    for (policy, f) in [
        ("O0", bench::<CnnO0, _>(&dev, cnn_shape)),
        ("O1", bench::<CnnO1, _>(&dev, cnn_shape)),
        ("O2", bench::<CnnO2, _>(&dev, cnn_shape)),
        ("O2-BF16", bench::<CnnO2Bf16, _>(&dev, cnn_shape)),
    ] {
        println!(
            "| main job's CNN, batch {CNN_BATCH} | {policy} | {:.2} | {:.0} MiB |",
            f.ms_per_step,
            f.peak_bytes as f64 / 1048576.0
        );
    }
    // Forward and backward of the MLP's three matrix products: 3 × 2·B·(4096·4096·2 + 4096·10).
    let flops = 3.0 * 2.0 * MLP_BATCH as f64 * (4096.0 * 4096.0 * 2.0 + 4096.0 * 10.0);
    let tflops = |f: &Figures| flops / (f.ms_per_step * 1e-3) / 1e12;
    let (o2, bf16) = (&mlp[2].1, &mlp[3].1);
    println!(
        "\nO2 vs O0 on the MLP: {:.2}× faster (O2-BF16: {:.2}×). The O2 step runs the MLP's matrix products at {:.0} TFLOP/s \
         (O2-BF16: {:.0}; an H100 SXM's dense FP16/BF16 peak is 989 TFLOP/s; PCIe 756), a lower bound on the 16-bit matmul rate since the \
         step also casts, unscales and updates.",
        mlp[0].1.ms_per_step / o2.ms_per_step,
        mlp[0].1.ms_per_step / bf16.ms_per_step,
        tflops(o2),
        tflops(bf16),
    );
}
