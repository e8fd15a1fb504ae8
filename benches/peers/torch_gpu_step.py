#!/usr/bin/env python3
"""PyTorch's side of `cargo bench -p typed-amp-cli --features cuda --bench gpu_step`.

One training step timed as ours is (forward, cross-entropy on FP32 logits, backward, optimizer
step, synchronised: `torch.cuda.synchronize()` around `time.perf_counter()`), --warmup (5) warm-up
steps then --steps (30) timed, eager mode, random data generated once, in three configurations:
FP32, `torch.autocast` FP16 with `GradScaler` (PyTorch's O1: FP32 weights, products cast per op)
and autocast BF16. FP32 means FP32: TF32 is off for matmuls and cuDNN convolutions unless --tf32.
Models:

- mlp: MLP 4096-4096-4096-10 (ReLU), batch 1024, Adam with default settings;
- cnn: the main job's CNN (conv16-BN-ReLU-pool, conv32-BN-ReLU-pool, linear 1568-10), batch 256
  of 1x28x28, Adam (defaults, as the MLP's: lr 1e-3);
- vit: the main job's ViT (7x7 patches, width 64, 4 heads, 4 pre-norm blocks, MLP 128, GELU),
  batch 128 of 784, Adam (defaults) (both from `models.py`, shared with `torch_cpu_step.py`);
- gpt: the baby GPT of `torch_gpt.py` (L=6, H=6, C=384, T=256, dropout 0.2), batch 64, its full
  step: FP32 cross-entropy, gradient clipping at 1.0 (after `unscale_` under FP16), fused AdamW
  with the spec's parameter groups, constant lr 1e-3; also reports tokens per second and the
  rate of its matrix products (`torch_gpt.product_flop`, 1,104.8 GFLOP per step).

Peak memory is the allocator's high-water mark above what was allocated before the model was
built (`torch.cuda.max_memory_allocated` - `memory_allocated`). Prints one Markdown row per
configuration, or with --json one JSON object per line (`model`, `config`, `batch`,
`ms_per_step`, `peak_mib`, and for gpt `tokens_per_s`, `product_gflop`, `product_tflops`).
All of it takes well under a minute on an H100.

    python3 benches/peers/torch_gpu_step.py [--only mlp|cnn|vit|gpt] [--json] [--steps 30]
        [--warmup 5] [--tf32]
"""
import argparse
import gc
import json
import sys
import time

import torch
import torch.nn.functional as F

from models import cnn, vit
from torch_gpt import SIZES, Trainer as GptTrainer, VOCAB, product_flop

MLP_BATCH, CNN_BATCH, VIT_BATCH, GPT_BATCH = 1024, 256, 128, 64
CLASSES = 10

CONFIGS = [
    ("FP32", "torch-fp32", None),
    ("autocast FP16 + GradScaler", "torch-fp16-autocast", torch.float16),
    ("autocast BF16", "torch-bf16-autocast", torch.bfloat16),
]


def mlp4096():
    return torch.nn.Sequential(
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    )


def classifier(build, shape, zero_targets=False):
    """A step function for a classification model: the MLP's step, as it always was."""

    def setup(dtype, dev):
        model = build().to(dev).train()
        opt = torch.optim.Adam(model.parameters())  # lr 1e-3, PyTorch's defaults
        scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
        x = torch.randn(*shape, device=dev)
        if zero_targets:
            y = torch.zeros(shape[0], dtype=torch.long, device=dev)
        else:
            y = torch.randint(0, CLASSES, (shape[0],), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        return step

    return setup


def gpt_setup(dtype, dev):
    cfg = SIZES["baby"]
    assert cfg.batch == GPT_BATCH
    trainer = GptTrainer(cfg, dev, dtype, seed=0)
    data = torch.randint(VOCAB, (cfg.batch, cfg.block_size + 1), device=dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        trainer.step(x, y)

    return step


MODELS = [
    ("mlp", f"MLP 4096-4096-4096-10, batch {MLP_BATCH}", MLP_BATCH,
     classifier(mlp4096, (MLP_BATCH, 4096), zero_targets=True)),
    ("cnn", f"CNN conv16-BN-pool, conv32-BN-pool, linear, batch {CNN_BATCH}", CNN_BATCH,
     classifier(cnn, (CNN_BATCH, 1, 28, 28))),
    ("vit", f"ViT 7x7 patches, width 64, 4 heads, 4 blocks, batch {VIT_BATCH}", VIT_BATCH,
     classifier(vit, (VIT_BATCH, 784))),
    ("gpt", f"baby GPT L6 H6 C384 T256, batch {GPT_BATCH}", GPT_BATCH, gpt_setup),
]


def bench(setup, dtype, args):
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step = setup(dtype, dev)
    elapsed = 0.0
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            elapsed += time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    del step
    return elapsed * 1e3 / args.steps, peak / 2**20


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=[m[0] for m in MODELS])
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps (default 5)")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 in FP32 matmuls and convolutions (default off)")
    args = p.parse_args()
    args.steps = max(args.steps, 1)
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_step.py: no CUDA device (torch.cuda.is_available() is False)")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    device = torch.cuda.get_device_name(0)

    if not args.json:
        print(f"## PyTorch {torch.__version__} on {device}"
              f"{' (TF32 allowed)' if args.tf32 else ''}")
        print("| model | configuration | ms / step | tokens / s | peak allocated |")
        print("| --- | --- | --- | --- | --- |")
    for key, title, batch, setup in MODELS:
        if args.only not in (None, key):
            continue
        for name, config, dtype in CONFIGS:
            ms, mib = bench(setup, dtype, args)
            r = {"model": key if key != "gpt" else "gpt-baby", "config": config, "batch": batch,
                 "ms_per_step": round(ms, 4), "peak_mib": round(mib, 1)}
            tokens = "-"
            if key == "gpt":
                cfg = SIZES["baby"]
                flop = product_flop(cfg)
                r["tokens_per_s"] = round(cfg.batch * cfg.block_size / (ms * 1e-3), 1)
                r["product_gflop"] = round(flop / 1e9, 4)
                r["product_tflops"] = round(flop / (ms * 1e-3) / 1e12, 2)
                tokens = f"{r['tokens_per_s']:,.0f}"
            if args.json:
                r.update(warmup=args.warmup, steps=args.steps, tf32=args.tf32, device=device,
                         impl="torch", torch_version=torch.__version__)
                print(json.dumps(r), flush=True)
            else:
                print(f"| {title} | {name} | {ms:.2f} | {tokens} | {mib:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
