#!/usr/bin/env python3
"""PyTorch's character-level GPT on Shakespeare, the peer of typed-amp's GPT.

Follows the project's GPT spec (gpt_spec.md: data, model, recipe) with nanoGPT's `model.py` at `bias=False`:
LayerNorm without bias (eps 1e-5), the LM head tied to `wte`, `F.scaled_dot_product_attention(q, k,
v, is_causal=True, dropout_p=...)`, exact (erf) GELU; init N(0, 0.02) for `wte`, `wpe` and every
linear weight, N(0, 0.02 / sqrt(2 L)) for both `c_proj` weights, LayerNorm weights 1. Vocabulary
capacity V = 84 (the data's vocabulary must fit; unused rows stay). Sizes:

- small: L=4, H=4, C=128, T=64, batch 12, 2,000 iterations, dropout 0.0 (806,528 parameters with
  wte and wpe, 798,336 as nanoGPT counts them, without wpe);
- baby:  L=6, H=6, C=384, T=256, batch 64, 5,000 iterations, dropout 0.2.

Training step: forward, cross-entropy in FP32 (`F.cross_entropy(logits.float(), ...)`, mean over
all B*T positions), backward, gradient clipping to global L2 norm 1.0 (on unscaled gradients:
`scaler.unscale_` first under FP16), AdamW (lr 1e-3, betas (0.9, 0.99), eps 1e-8; weight decay 0.1
on parameters with >= 2 dims, 0 on the LayerNorm weights; `fused=True` on CUDA, as nanoGPT), then
`zero_grad(set_to_none=True)`. Precision: fp32; bf16 = `torch.autocast(dtype=torch.bfloat16)`;
fp16 = `torch.autocast(dtype=torch.float16)` + `torch.amp.GradScaler` (defaults: scale 2^16,
growth 2 every 2000 good steps, backoff 0.5). Weights stay FP32 under autocast (PyTorch's O1).

Subcommands:

`step`: the CPU training step, peer of `cargo bench --bench cpu_step -- --only gpt-small|gpt-baby`.
One fixed random batch of token ids (generated once), the spec's batch and dropout, constant lr
1e-3; configurations torch-fp32, torch-bf16-autocast and torch-fp16-autocast (where this PyTorch
supports FP16 autocast on the CPU). Detection, interleaved median timing and the JSON fields are
`torch_cpu_step.py`'s (imported from it), plus `tokens_per_s` (B*T / median step time) and
`product_gflop`, the FLOPs of one step's matrix products, forward and backward (3x forward):

    product_flop = 6 * N * BT + 6 * V * C * BT + 6 * L * T * C * BT

with BT = B*T tokens, N = 12 * L * C^2 the non-embedding matmul weights (c_attn 3C^2, attention
c_proj C^2, c_fc 4C^2, MLP c_proj 4C^2 per layer), 6*V*C*BT the tied LM head, and 6*L*T*C*BT the
attention products (Q K^T and P V: 4*L*T*C per token forward at full T, so 12*L*T*C forward and
backward, halved for the causal mask). Small: 3.824 GFLOP, baby: 1,104.8 GFLOP.

`train`: a full run, peer of `typed-amp compare --model gpt`. Data as the spec: the `*_gut.txt`
files of --data-dir (not `*_gut_f.txt`) concatenated in byte order of their names, each decoded as
UTF-8, else Latin-1 (a file with a NUL byte, or with more than half of its characters control
characters other than tab, LF and CR, is refused as not text); vocabulary = the sorted set of
characters; first n*9//10 characters train, the rest validation. Exactly --iters steps, it = 0 ..
iters-1 (nanoGPT's loop runs iters+1); each samples B windows uniformly from [0, len(train) - T - 1]
(`torch.randint` on a generator seeded with --seed, which also seeds the init); lr: warm-up 100
iterations then cosine decay to lr/10 at --iters (nanoGPT's get_lr). Validation loss =
mean FP32 cross-entropy over the W fixed windows starting at k * (len(val) - T - 1) // max(W - 1, 1),
k = 0..W-1, in batches of 64 windows, model in eval mode (no dropout), under the run's autocast.
Evaluates after every --eval-every steps and after the last. Reports the validation losses, the
final one, training tokens per second (B*T*iters over the training time, evaluations excluded),
and for fp16 the skipped steps (steps where the scaler's scale dropped, i.e. `scaler.step` skipped
the update) and those after the first 20 steps.

    python3 benches/peers/torch_gpt.py step [--size small|baby|all] [--json] [--threads 2]
        [--steps 30] [--warmup 5] [--min-time 2] [--max-steps 300] [--max-time 60]
        [--min-steps 5] [--no-fp16]
    python3 benches/peers/torch_gpt.py train --data-dir DIR [--size small|baby]
        [--policy fp32|fp16|bf16] [--iters N] [--eval-every 250] [--eval-windows 1024]
        [--seed 1337] [--threads 2] [--device cpu|cuda] [--json]

Needs torch only (numpy is not used). Importing this file has no side effects, so
`torch_gpu_step.py` takes its GPT from here.
"""

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 84
EVAL_BATCH = 64
WARMUP_ITERS = 100
LR = 1e-3
MIN_LR = LR / 10
BETAS = (0.9, 0.99)
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
SKIP_GRACE = 20


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    batch: int
    iters: int
    dropout: float
    vocab_size: int = VOCAB


SIZES = {
    "small": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12, iters=2000,
                       dropout=0.0),
    "baby": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=64, iters=5000,
                      dropout=0.2),
}


# ---------------------------------------------------------------------------------------------
# Model: nanoGPT's model.py, bias=False.


class LayerNorm(nn.Module):
    """LayerNorm with a weight and no bias, eps 1e-5."""

    def __init__(self, ndim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0,
            is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=False):
        """Parameters, the tied wte/lm_head counted once; nanoGPT's count leaves out wpe."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx):
        t = idx.shape[1]
        assert t <= self.cfg.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def product_flop(cfg):
    """FLOPs of one training step's matrix products (see the module doc)."""
    L, C, T, V = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    tokens = cfg.batch * T
    return 6 * 12 * L * C * C * tokens + 6 * V * C * tokens + 6 * L * T * C * tokens


def configure_optimizer(model, lr=LR, fused=False):
    """AdamW with the spec's two groups: decay 0.1 on >= 2-dim parameters, 0 on the others."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=1e-8, **extra)


def get_lr(it, max_iters):
    """nanoGPT's get_lr with warm-up 100, decay to lr/10 at max_iters."""
    if it < WARMUP_ITERS:
        return LR * (it + 1) / (WARMUP_ITERS + 1)
    if it > max_iters:
        return MIN_LR
    ratio = (it - WARMUP_ITERS) / max(max_iters - WARMUP_ITERS, 1)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


POLICY_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Trainer:
    """One model, its AdamW and its precision; `step(x, y)` runs one training step."""

    def __init__(self, cfg, device, dtype, seed, lr=LR):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.device = torch.device(device)
        self.device_type = self.device.type
        self.dtype = dtype
        self.model = GPT(cfg).to(self.device).train()
        self.opt = configure_optimizer(self.model, lr, fused=self.device_type == "cuda")
        self.scaler = torch.amp.GradScaler(self.device_type) if dtype == torch.float16 else None
        self.skipped = 0
        self.steps = 0
        self.skipped_after_grace = 0

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype or torch.float32,
                              enabled=self.dtype is not None)

    def loss(self, x, y, reduction="mean"):
        with self.autocast():
            logits = self.model(x)
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1),
                                   reduction=reduction)

    def step(self, x, y):
        """Returns the loss (a tensor: reading it synchronises)."""
        loss = self.loss(x, y)
        if self.scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
            self.opt.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
            before = self.scaler.get_scale()
            self.scaler.step(self.opt)
            self.scaler.update()
            if self.scaler.get_scale() < before:
                self.skipped += 1
                if self.steps >= SKIP_GRACE:
                    self.skipped_after_grace += 1
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        return loss.detach()

    def set_lr(self, lr):
        for g in self.opt.param_groups:
            g["lr"] = lr


# ---------------------------------------------------------------------------------------------
# Data: the spec's Shakespeare loader.

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")


def read_text_file(path):
    raw = open(path, "rb").read()
    name = os.path.basename(path)
    if b"\0" in raw:
        raise SystemExit(f"{path}: not text (contains a NUL byte)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    if text and 2 * len(_CONTROL.findall(text)) > len(text):
        raise SystemExit(f"{path}: not text (mostly control characters)")
    return name, text


def load_data(data_dir, vocab_capacity=VOCAB):
    """(ids train, ids val, vocab, file names) as the spec says."""
    names = [n for n in os.listdir(data_dir)
             if n.endswith("_gut.txt") and not n.endswith("_gut_f.txt")
             and os.path.isfile(os.path.join(data_dir, n))]
    names.sort(key=os.fsencode)
    if not names:
        raise SystemExit(f"{data_dir}: no *_gut.txt files")
    text = "".join(read_text_file(os.path.join(data_dir, n))[1] for n in names)
    vocab = sorted(set(text))
    if len(vocab) > vocab_capacity:
        raise SystemExit(f"{data_dir}: {len(vocab)} distinct characters, over the model's "
                         f"vocabulary capacity {vocab_capacity}")
    codes = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()
    ids = torch.searchsorted(torch.tensor([ord(c) for c in vocab], dtype=torch.long), codes)
    n_train = len(ids) * 9 // 10
    return ids[:n_train].clone(), ids[n_train:].clone(), vocab, names, len(text)


def train_batch(train_ids, cfg, gen):
    start = torch.randint(len(train_ids) - cfg.block_size, (cfg.batch,), generator=gen)
    idx = (start[:, None] + torch.arange(cfg.block_size)).to(train_ids.device)
    return train_ids[idx], train_ids[idx + 1]


def val_starts(n_val, block_size, windows):
    span = n_val - block_size - 1
    if span < 0:
        raise SystemExit(f"validation split of {n_val} characters is shorter than T + 1")
    return torch.tensor([k * span // max(windows - 1, 1) for k in range(windows)])


@torch.no_grad()
def evaluate(trainer, val_ids, starts):
    model = trainer.model
    model.eval()
    t = trainer.cfg.block_size
    total = torch.zeros((), dtype=torch.float64, device=trainer.device)
    for i in range(0, len(starts), EVAL_BATCH):
        idx = (starts[i:i + EVAL_BATCH, None] + torch.arange(t)).to(val_ids.device)
        x, y = val_ids[idx], val_ids[idx + 1]
        total += trainer.loss(x, y, reduction="sum").double()
    model.train()
    return total.item() / (len(starts) * t)


# ---------------------------------------------------------------------------------------------
# Subcommands.


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def cmd_train(args):
    cfg = SIZES[args.size]
    iters = args.iters if args.iters is not None else cfg.iters
    dtype = POLICY_DTYPES[args.policy]
    if args.device == "cpu":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
        torch.set_num_threads(args.threads)
        if dtype == torch.float16:
            from torch_cpu_step import fp16_autocast_support
            problem = fp16_autocast_support()
            if problem:
                raise SystemExit(f"--policy fp16 on the CPU: {problem}")
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    out = sys.stderr if args.json else sys.stdout

    t0 = time.perf_counter()
    train_ids, val_ids, vocab, names, n_chars = load_data(args.data_dir)
    train_ids = train_ids.to(args.device)
    starts = val_starts(len(val_ids), cfg.block_size, args.eval_windows)
    val_ids = val_ids.to(args.device)
    load_s = time.perf_counter() - t0

    trainer = Trainer(cfg, args.device, dtype, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    n_params = trainer.model.num_params()
    print(f"GPT {args.size}: L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} T={cfg.block_size} "
          f"batch {cfg.batch} dropout {cfg.dropout}, {n_params:,} parameters "
          f"({trainer.model.num_params(True):,} without wpe, as nanoGPT counts)", file=out)
    print(f"data: {len(names)} files, {n_chars:,} characters, vocabulary {len(vocab)}, "
          f"train {len(train_ids):,}, val {len(val_ids):,} ({load_s:.1f} s); "
          f"policy {args.policy}, {iters} iterations, device {args.device}"
          + (f", {torch.get_num_threads()} threads" if args.device == "cpu" else ""), file=out)

    evals = []
    train_s = eval_s = 0.0
    loss = None

    def run_eval(it):
        nonlocal eval_s
        e0 = time.perf_counter()
        v = evaluate(trainer, val_ids, starts)
        eval_s += time.perf_counter() - e0
        tl = loss.item() if loss is not None else float("nan")
        evals.append({"iter": it, "val_loss": v, "train_loss": tl})
        extra = f", skipped {trainer.skipped}, scale {trainer.scaler.get_scale():g}" \
            if trainer.scaler is not None else ""
        print(f"iter {it:>5}: val loss {v:.4f}, train loss {tl:.4f}, "
              f"{train_s:.1f} s training{extra}", file=out, flush=True)

    for it in range(iters):
        x, y = train_batch(train_ids, cfg, gen)
        sync(args.device)
        s0 = time.perf_counter()
        trainer.set_lr(get_lr(it, iters))
        loss = trainer.step(x, y)
        sync(args.device)
        train_s += time.perf_counter() - s0
        done = it + 1
        if (args.eval_every and done % args.eval_every == 0) or done == iters:
            run_eval(done)
    if iters == 0:
        run_eval(0)

    tokens = iters * cfg.batch * cfg.block_size
    result = {
        "model": f"gpt-{args.size}",
        "policy": args.policy,
        "config": {"fp32": "torch-fp32", "bf16": "torch-bf16-autocast",
                   "fp16": "torch-fp16-autocast"}[args.policy],
        "iters": iters,
        "seed": args.seed,
        "params": n_params,
        "val_losses": [[e["iter"], round(e["val_loss"], 5)] for e in evals],
        "final_val_loss": round(evals[-1]["val_loss"], 5),
        "final_train_loss": round(evals[-1]["train_loss"], 5),
        "train_s": round(train_s, 2),
        "eval_s": round(eval_s, 2),
        "total_s": round(time.perf_counter() - t0, 2),
        "tokens_per_s": round(tokens / train_s, 1) if train_s > 0 else None,
        "ms_per_step": round(train_s / iters * 1e3, 3) if iters else None,
        "skipped_steps": trainer.skipped,
        "skipped_after_20": trainer.skipped_after_grace,
        "eval_windows": args.eval_windows,
        "vocab": len(vocab),
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
        "threads": torch.get_num_threads() if args.device == "cpu" else None,
        "impl": "torch",
        "torch_version": torch.__version__,
    }
    if trainer.scaler is not None:
        result["final_scale"] = trainer.scaler.get_scale()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"final val loss {result['final_val_loss']:.4f}; {iters} steps in {train_s:.1f} s "
              f"({result['tokens_per_s']:,.0f} tokens/s, {result['ms_per_step']:.2f} ms/step), "
              f"evaluation {eval_s:.1f} s, total {result['total_s']:.1f} s; "
              f"skipped steps {trainer.skipped} ({trainer.skipped_after_grace} after the first "
              f"{SKIP_GRACE})")


class StepEntry:
    """One size under one precision on a fixed batch, for torch_cpu_step's interleaved timing."""

    def __init__(self, size, name, dtype, seed):
        self.cfg = SIZES[size]
        self.model_name = f"gpt-{size}"
        self.name = name
        self.trainer = Trainer(self.cfg, "cpu", dtype, seed)
        gen = torch.Generator().manual_seed(seed)
        data = torch.randint(VOCAB, (self.cfg.batch, self.cfg.block_size + 1), generator=gen)
        self.x, self.y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        self.last_loss = float("nan")

    def step(self):
        self.last_loss = self.trainer.step(self.x, self.y).item()


def cmd_step(args):
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from torch_cpu_step import fp16_autocast_support, row, time_interleaved

    args.steps = max(args.steps, 1)
    args.min_steps = max(1, min(args.min_steps, args.steps))
    args.max_steps = max(args.max_steps, args.steps)
    torch.set_num_threads(args.threads)
    fp16_problem = "--no-fp16" if args.no_fp16 else fp16_autocast_support()
    if fp16_problem:
        print(f"torch-fp16-autocast skipped: {fp16_problem}", file=sys.stderr)
    sizes = ["small", "baby"] if args.size == "all" else [args.size]
    rows = []
    for seed, size in enumerate(sizes, start=11):
        cfg = SIZES[size]
        configs = [("torch-fp32", None)]
        if not args.fp32_only:
            configs.append(("torch-bf16-autocast", torch.bfloat16))
        if not fp16_problem and not args.fp32_only:
            configs.append(("torch-fp16-autocast", torch.float16))
        entries = [StepEntry(size, name, dtype, seed) for name, dtype in configs]
        flop = product_flop(cfg)
        tokens = cfg.batch * cfg.block_size
        for e, s in zip(entries, time_interleaved(entries, args)):
            extra = {
                "tokens_per_s": round(tokens / (s.median_ms() * 1e-3), 1),
                "product_gflop": round(flop / 1e9, 4),
                "params": e.trainer.model.num_params(),
                "final_loss": round(e.last_loss, 5) if math.isfinite(e.last_loss)
                else str(e.last_loss),
            }
            if e.trainer.scaler is not None:
                extra["skipped_steps"] = e.trainer.skipped
            rows.append(row(e.model_name, e.name, s, **extra))
            if s.capped:
                print(f"{e.model_name} {e.name}: {len(s.times)} timed steps only "
                      f"(over --max-time {args.max_time} s)", file=sys.stderr)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"PyTorch {torch.__version__} CPU GPT training step ({torch.get_num_threads()} threads; "
          f"warm-up {args.warmup}, then at least {args.steps} timed steps and {args.min_time} s "
          f"per configuration; median, p10-p90)")
    model = None
    for r in rows:
        if r["model"] != model:
            model = r["model"]
            cfg = SIZES[model[4:]]
            print()
            print(f"{model}: L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} T={cfg.block_size}, "
                  f"batch {cfg.batch}, dropout {cfg.dropout}, {r['params']:,} parameters, "
                  f"AdamW, clip 1.0; "
                  f"{r['product_gflop']:.3f} GFLOP of products per step")
            print(f"  {'config':<20} {'ms/step':>10} {'p10-p90':>19} {'steps':>6} "
                  f"{'tokens/s':>10} {'GFLOP/s':>8} {'final loss':>11} {'skipped':>8}")
        spread = f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}"
        loss = r["final_loss"]
        loss = f"{loss:.4f}" if isinstance(loss, float) else loss
        rate = r["product_gflop"] / (r["ms_per_step"] * 1e-3)
        print(f"  {r['config']:<20} {r['ms_per_step']:>10.2f} {spread:>19} {r['steps']:>6} "
              f"{r['tokens_per_s']:>10.0f} {rate:>8.1f} {loss:>11} {r.get('skipped_steps', 0):>8}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("step", help="time the CPU training step (peer of cpu_step's gpt rows)")
    s.add_argument("--size", choices=["small", "baby", "all"], default="small",
                   help="model size (default small; all: small then baby)")
    s.add_argument("--only", choices=["gpt-small", "gpt-baby"],
                   help="the Rust bench's spelling of --size")
    s.add_argument("--json", action="store_true", help="one JSON object per line")
    s.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    s.add_argument("--steps", type=int, default=30, help="timed steps at least (default 30)")
    s.add_argument("--warmup", type=int, default=5, help="warm-up steps (default 5)")
    s.add_argument("--min-time", type=float, default=2.0,
                   help="keep timing until a configuration has run this many seconds (default 2)")
    s.add_argument("--max-steps", type=int, default=300, help="timed steps at most (default 300)")
    s.add_argument("--max-time", type=float, default=60.0,
                   help="seconds after which a slow configuration stops at --min-steps samples")
    s.add_argument("--min-steps", type=int, default=5,
                   help="samples a configuration cut short by --max-time still takes (default 5)")
    s.add_argument("--no-fp16", action="store_true", help="skip the FP16 configuration")
    s.add_argument("--fp32-only", action="store_true",
                   help="time FP32 only (autocast on a CPU without AVX512-BF16/AMX runs 16-bit "
                   "arithmetic in emulation, minutes per baby GPT step)")

    t = sub.add_parser("train", help="a full training run with validation loss")
    t.add_argument("--data-dir", required=True, help="the directory of the *_gut.txt files")
    t.add_argument("--size", choices=["small", "baby"], default="small")
    t.add_argument("--iters", type=int, help="iterations (default small 2000, baby 5000)")
    t.add_argument("--eval-every", type=int, default=250,
                   help="evaluate after every N steps (default 250; 0: only at the end)")
    t.add_argument("--eval-windows", type=int, default=1024,
                   help="validation windows W (default 1024)")
    t.add_argument("--policy", choices=["fp32", "fp16", "bf16"], default="fp32")
    t.add_argument("--seed", type=int, default=1337, help="init and batch sampling (default 1337)")
    t.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    t.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    t.add_argument("--json", action="store_true", help="one JSON object at the end (progress on "
                   "stderr)")
    args = p.parse_args()
    if args.cmd == "step":
        if args.only:
            args.size = args.only[4:]
        cmd_step(args)
    else:
        if args.eval_windows < 1:
            p.error("--eval-windows must be at least 1")
        cmd_train(args)


if __name__ == "__main__":
    main()
