#!/usr/bin/env python3
"""PyTorch's side of `cargo bench -p typed-amp-cli --features cuda --bench gpu_step`.

The same MLP 4096-4096-4096-10 (ReLU) at batch 1024, Adam with default settings, random
input, one training step timed as ours is (forward, cross-entropy, backward, optimizer step,
synchronised), 5 warm-up steps then 30 timed: FP32, `torch.autocast` FP16 with `GradScaler`
(PyTorch's O1: FP32 weights, products cast per op) and autocast BF16. Peak memory is the
allocator's high-water mark above what was allocated before the model was built
(`torch.cuda.max_memory_allocated`). Prints one Markdown row per configuration.

    python3 benches/peers/torch_gpu_step.py
"""
import time

import torch

BATCH, WARMUP, STEPS = 1024, 5, 30


def bench(dtype):
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 10),
    ).to(dev)
    opt = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    x = torch.randn(BATCH, 4096, device=dev)
    y = torch.zeros(BATCH, dtype=torch.long, device=dev)
    elapsed = 0.0
    for step in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        if step >= WARMUP:
            elapsed += time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    return elapsed * 1e3 / STEPS, peak / 2**20


def main():
    print(f"## PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("| model | configuration | ms / step | peak allocated |")
    print("| --- | --- | --- | --- |")
    for name, dtype in [("FP32", None), ("autocast FP16 + GradScaler", torch.float16),
                        ("autocast BF16", torch.bfloat16)]:
        ms, mib = bench(dtype)
        print(f"| MLP 4096-4096-4096-10, batch {BATCH} | {name} | {ms:.2f} | {mib:.0f} MiB |")


if __name__ == "__main__":
    main()
