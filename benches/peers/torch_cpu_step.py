#!/usr/bin/env python3
"""PyTorch's CPU training step, the peer of typed-amp's `cargo bench --bench cpu_step`.

Same models, batch sizes, data shapes, loss, optimizer and timing method as
`benches/cpu_step.rs`:

- mlp: MLP 784-512-512-10 with ReLU, batch 256;
- cnn: conv(1->16, 3x3, pad 1)-BN-ReLU-maxpool 2, conv(16->32, 3x3, pad 1)-BN-ReLU-maxpool 2,
  flatten, linear 1568->10; batch 128 of 1x28x28;
- vit: 28x28 images as 16 patches of 7x7, linear 49->64, a class token and learned position
  embedding, 4 `nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0,
  activation="gelu", norm_first=True, batch_first=True)`, layer norm and linear 64->10 on the
  class token; batch 128 of 784.

Loss: cross-entropy with logits in FP32 (`F.cross_entropy` on `logits.float()`, class-index
targets: the same value as typed-amp's one-hot form). Optimizer: `torch.optim.Adam`, lr 1e-3,
PyTorch's defaults otherwise. One fixed random batch, generated once; training mode.

Configurations: `torch-fp32`; `torch-bf16-autocast` (`torch.autocast("cpu", dtype=torch.bfloat16)`);
`torch-fp16-autocast` with `torch.amp.GradScaler("cpu")`, where this PyTorch supports FP16
autocast on the CPU (otherwise a line on stderr says why it is skipped). And `torch.mm` on
square matrices, 256^3 and 1024^3, in fp32, bf16 and fp16.

Timing: warm-up steps, then timed steps (at least --steps, more until each configuration has
run --min-time seconds, at most --max-steps), in blocks of 10 that alternate between
configurations. A configuration whose steps are so slow that --steps of them would take longer
than --max-time seconds stops there with at least --min-steps samples (its `steps` field and a
line on stderr say so). The figure is the median ms per step (GFLOP/s of the median time for
products).

Output: a table, or with --json one JSON object per line with `model`, `config`, `ms_per_step`
(and `gflops` for products), like the Rust bench.

    python3 benches/peers/torch_cpu_step.py [--json] [--only mlp|cnn|vit|matmul] [--threads 2]
        [--steps 30] [--warmup 5] [--min-time 2] [--max-steps 300] [--max-time 60]
        [--min-steps 5] [--no-fp16]
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
warnings.filterwarnings("ignore", message="CUDA initialization")
# CPU only: keep a CUDA build of PyTorch from probing for a GPU (and warning about drivers).
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models import cnn, mlp, vit  # noqa: E402 - shared with torch_gpu_step.py

CLASSES = 10
MLP_BATCH = 256
CNN_BATCH = 128
VIT_BATCH = 128
BLOCK = 10


def fp16_autocast_support():
    """None if FP16 autocast works on the CPU, else the reason it does not."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast("cpu", dtype=torch.float16):
                enabled = torch.is_autocast_enabled("cpu") if _takes_device() else \
                    torch.is_autocast_cpu_enabled()
                y = nn.Linear(4, 4)(torch.randn(2, 4))
        if not enabled or y.dtype != torch.float16:
            msgs = "; ".join(str(w.message) for w in caught)
            return f"torch.autocast('cpu', dtype=torch.float16) is not enabled in torch " \
                   f"{torch.__version__}{': ' + msgs if msgs else ''}"
        torch.amp.GradScaler("cpu")
    except Exception as e:  # noqa: BLE001 - any failure means "not supported here"
        return f"FP16 autocast or GradScaler('cpu') fails in torch {torch.__version__}: {e}"
    return None


def _takes_device():
    try:
        torch.is_autocast_enabled("cpu")
        return True
    except TypeError:
        return False


class Config:
    """One model under one precision; `step()` runs one training step."""

    def __init__(self, model_name, name, build, shape, seed, dtype=None):
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.model_name = model_name
        self.name = name
        self.model = build().train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(*shape, generator=gen)
        self.y = torch.randint(0, CLASSES, (shape[0],), generator=gen)
        self.dtype = dtype
        self.scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
        self.skipped = 0
        self.last_loss = float("nan")

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        if self.dtype is None:
            logits = self.model(self.x)
            loss = F.cross_entropy(logits.float(), self.y)
        else:
            with torch.autocast("cpu", dtype=self.dtype):
                logits = self.model(self.x)
                loss = F.cross_entropy(logits.float(), self.y)
        if self.scaler is None:
            loss.backward()
            self.opt.step()
        else:
            before = self.scaler.get_scale()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
            if self.scaler.get_scale() < before:
                self.skipped += 1
        self.last_loss = loss.item()


class Product:
    """`torch.mm` of two square matrices of one dtype."""

    def __init__(self, dtype_name, dtype, n):
        gen = torch.Generator().manual_seed(n)
        self.name = f"{dtype_name}-{n}"
        self.n = n
        self.a = torch.randn(n, n, generator=gen).to(dtype)
        self.b = torch.randn(n, n, generator=gen).to(dtype)

    def step(self):
        torch.mm(self.a, self.b)


class Samples:
    def __init__(self):
        self.times = []
        self.total = 0.0
        self.cpu = 0.0
        self.capped = False

    def median_ms(self):
        return statistics.median(self.times) * 1e3

    def quantile_ms(self, q):
        s = sorted(self.times)
        return s[round((len(s) - 1) * q)] * 1e3


def time_interleaved(entries, args):
    """Warm-up, then blocks of BLOCK timed steps per entry in turn, as the Rust bench does."""
    samples = [Samples() for _ in entries]
    for entry, s in zip(entries, samples):
        for _ in range(args.warmup):
            t = time.perf_counter()
            entry.step()
            warm = time.perf_counter() - t
            # Slow configurations (FP16 on CPUs without FP16 arithmetic) keep one warm-up step.
            if warm * args.steps > args.max_time:
                break

    def done(s):
        if len(s.times) >= args.max_steps:
            return True
        if len(s.times) >= args.steps and s.total >= args.min_time:
            return True
        # Too slow for --steps samples in --max-time: stop at --min-steps.
        if s.times and len(s.times) >= args.min_steps and s.total >= args.max_time:
            s.capped = True
            return True
        return False

    while not all(done(s) for s in samples):
        for entry, s in zip(entries, samples):
            if done(s):
                continue
            if s.total >= args.min_time:
                left = max(args.steps - len(s.times), 1)
            else:
                left = BLOCK
            n = min(left, BLOCK, args.max_steps - len(s.times))
            cpu0 = time.process_time()
            for _ in range(n):
                t = time.perf_counter()
                entry.step()
                dt = time.perf_counter() - t
                s.times.append(dt)
                s.total += dt
                if s.total >= args.max_time and len(s.times) >= args.min_steps:
                    break
            s.cpu += time.process_time() - cpu0
    return samples


def row(model, config, s, **extra):
    r = {
        "model": model,
        "config": config,
        "ms_per_step": round(s.median_ms(), 4),
        "p10_ms": round(s.quantile_ms(0.1), 4),
        "p90_ms": round(s.quantile_ms(0.9), 4),
        "steps": len(s.times),
        "cpu_ms_per_step": round(s.cpu / len(s.times) * 1e3, 4),
    }
    r.update(extra)
    r["threads"] = torch.get_num_threads()
    r["impl"] = "torch"
    r["torch_version"] = torch.__version__
    r["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "default")
    if s.capped:
        r["capped"] = True
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--only", choices=["mlp", "cnn", "vit", "matmul"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--steps", type=int, default=30, help="timed steps at least (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps (default 5)")
    p.add_argument("--min-time", type=float, default=2.0,
                   help="keep timing until a configuration has run this many seconds (default 2)")
    p.add_argument("--max-steps", type=int, default=300, help="timed steps at most (default 300)")
    p.add_argument("--max-time", type=float, default=60.0,
                   help="seconds after which a slow configuration stops at --min-steps samples")
    p.add_argument("--min-steps", type=int, default=5,
                   help="samples a configuration cut short by --max-time still takes (default 5)")
    p.add_argument("--no-fp16", action="store_true", help="skip the FP16 configurations")
    p.add_argument("--fp32-only", action="store_true",
                   help="time FP32 only (autocast on a CPU without AVX512-BF16/AMX runs 16-bit "
                   "arithmetic in emulation)")
    args = p.parse_args()
    args.steps = max(args.steps, 1)
    args.min_steps = max(1, min(args.min_steps, args.steps))
    args.max_steps = max(args.max_steps, args.steps)

    torch.set_num_threads(args.threads)
    fp16_problem = "--no-fp16" if args.no_fp16 else fp16_autocast_support()
    if fp16_problem:
        print(f"torch-fp16-autocast and fp16 products skipped: {fp16_problem}", file=sys.stderr)

    rows = []
    for model_name, build, shape, seed in [
        ("mlp", mlp, (MLP_BATCH, 784), 1),
        ("cnn", cnn, (CNN_BATCH, 1, 28, 28), 2),
        ("vit", vit, (VIT_BATCH, 784), 3),
    ]:
        if args.only not in (None, model_name):
            continue
        configs = [Config(model_name, "torch-fp32", build, shape, seed)]
        if not args.fp32_only:
            configs.append(
                Config(model_name, "torch-bf16-autocast", build, shape, seed, torch.bfloat16))
        if not fp16_problem and not args.fp32_only:
            configs.append(
                Config(model_name, "torch-fp16-autocast", build, shape, seed, torch.float16))
        for c, s in zip(configs, time_interleaved(configs, args)):
            extra = {"final_loss": round(c.last_loss, 5) if math.isfinite(c.last_loss)
                     else str(c.last_loss)}
            if c.scaler is not None:
                extra["skipped_steps"] = c.skipped
            rows.append(row(model_name, c.name, s, **extra))
            if s.capped:
                print(f"{model_name} {c.name}: {len(s.times)} timed steps only "
                      f"(over --max-time {args.max_time} s)", file=sys.stderr)

    if args.only in (None, "matmul"):
        dtypes = [("f32", torch.float32)]
        if not args.fp32_only:
            dtypes.append(("bf16", torch.bfloat16))
        if not fp16_problem and not args.fp32_only:
            dtypes.append(("f16", torch.float16))
        products = [Product(name, dt, n) for n in (256, 1024) for name, dt in dtypes]
        margs = argparse.Namespace(**vars(args))
        margs.steps = max(args.steps, 30)
        margs.warmup = max(args.warmup, 3)
        margs.min_time = min(args.min_time, 1.0)
        margs.max_steps = max(args.max_steps, 1000)
        for prod, s in zip(products, time_interleaved(products, margs)):
            gflops = 2 * prod.n ** 3 / (s.median_ms() * 1e-3) / 1e9
            rows.append(row("matmul", prod.name, s, gflops=round(gflops, 2)))
            if s.capped:
                print(f"matmul {prod.name}: {len(s.times)} timed products only "
                      f"(over --max-time {args.max_time} s)", file=sys.stderr)

    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print_table(rows, args)


def print_table(rows, args):
    print(f"PyTorch {torch.__version__} CPU training step ({torch.get_num_threads()} threads; "
          f"warm-up {args.warmup}, then at least {args.steps} timed steps and {args.min_time} s "
          f"per configuration; median, p10-p90)")
    titles = {
        "mlp": f"MLP 784-512-512-10, batch {MLP_BATCH}, Adam, cross-entropy",
        "cnn": "CNN conv16-BN-ReLU-pool, conv32-BN-ReLU-pool, linear 1568-10, "
               f"batch {CNN_BATCH}, Adam",
        "vit": "ViT 7x7 patches, width 64, 4 heads, 4 pre-norm blocks, MLP 128, GELU, "
               f"batch {VIT_BATCH}, Adam",
        "matmul": "torch.mm, square n x n x n",
    }
    model = None
    for r in rows:
        if r["model"] != model:
            model = r["model"]
            print()
            print(titles[model])
            if model == "matmul":
                print(f"  {'product':<10} {'ms':>10} {'p10-p90':>19} {'GFLOP/s':>9} {'calls':>7}")
            else:
                print(f"  {'config':<20} {'ms/step':>10} {'p10-p90':>19} {'steps':>7} "
                      f"{'final loss':>11} {'skipped':>8}")
        spread = f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}"
        if model == "matmul":
            print(f"  {r['config']:<10} {r['ms_per_step']:>10.3f} {spread:>19} "
                  f"{r['gflops']:>9.1f} {r['steps']:>7}")
        else:
            loss = r["final_loss"]
            loss = f"{loss:.4f}" if isinstance(loss, float) else loss
            print(f"  {r['config']:<20} {r['ms_per_step']:>10.2f} {spread:>19} {r['steps']:>7} "
                  f"{loss:>11} {r.get('skipped_steps', 0):>8}")


if __name__ == "__main__":
    main()
