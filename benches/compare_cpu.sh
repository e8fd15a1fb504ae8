#!/usr/bin/env bash
# typed-amp against PyTorch on the CPU, in one go: runs `cargo bench --bench cpu_step -- --json`
# and `benches/peers/torch_cpu_step.py --json`, then prints one table per model with both sides
# and the ratios the project's targets use.
#
#   benches/compare_cpu.sh [--python PATH] [--threads N] [--out DIR] [--from DIR] [ARGS...]
#
#   --python PATH  the Python with PyTorch (default: $TORCH_PYTHON, else /work/venv-torch/bin/python
#                  if it exists, else python3)
#   --threads N    threads for both sides (default 2): RAYON_NUM_THREADS for the Rust bench,
#                  torch.set_num_threads for PyTorch
#   --out DIR      where the raw JSON lines go (default target/compare_cpu)
#   --from DIR     print the table from an earlier run's DIR without running anything
#   ARGS           passed to both benches: --only mlp|cnn|vit|gpt-small|gpt-baby|matmul, --steps N,
#                  --warmup W,
#                  --min-time S, --max-steps N (and PyTorch-only ones, which the Rust bench
#                  ignores: --max-time S, --min-steps N, --no-fp16, --fp32-only)
#
# The table needs only python3's standard library. Timings on a shared machine wander: the
# table shows wall-clock medians, and CPU time per step (all threads) beside them.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${TORCH_PYTHON:-}"
if [[ -z "$python" ]]; then
    if [[ -x /work/venv-torch/bin/python ]]; then python=/work/venv-torch/bin/python; else python=python3; fi
fi
threads=2
out="$root/target/compare_cpu"
from=""
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) python="$2"; shift 2 ;;
        --threads) threads="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --from) from="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done

if [[ -z "$from" ]]; then
    mkdir -p "$out"
    cd "$root"
    echo "building the Rust bench ..." >&2
    cargo bench --bench cpu_step --no-run >&2
    echo "running typed-amp (RAYON_NUM_THREADS=$threads) ..." >&2
    RAYON_NUM_THREADS="$threads" cargo bench -q --bench cpu_step -- --json "${args[@]}" \
        > "$out/typed_amp.jsonl"
    # A GPT's step is set against its products' time at our GEMM rate: the products too.
    only=""
    for ((i = 0; i < ${#args[@]}; i++)); do
        [[ "${args[$i]}" == "--only" ]] && only="${args[$((i + 1))]:-}"
    done
    pass=()
    for ((i = 0; i < ${#args[@]}; i++)); do
        if [[ "${args[$i]}" == "--only" ]]; then i=$((i + 1)); else pass+=("${args[$i]}"); fi
    done
    if [[ "$only" == gpt-* ]]; then
        RAYON_NUM_THREADS="$threads" cargo bench -q --bench cpu_step -- --json --only matmul "${pass[@]}" \
            >> "$out/typed_amp.jsonl"
    fi
    echo "running PyTorch ($python, $threads threads) ..." >&2
    case "$only" in
        gpt-small|gpt-baby)
            "$python" "$root/benches/peers/torch_gpt.py" step --json --threads "$threads" \
                --size "${only#gpt-}" "${pass[@]}" > "$out/torch.jsonl" ;;
        *)
            "$python" "$root/benches/peers/torch_cpu_step.py" --json --threads "$threads" "${args[@]}" \
                > "$out/torch.jsonl"
            if [[ -z "$only" ]]; then
                "$python" "$root/benches/peers/torch_gpt.py" step --json --threads "$threads" \
                    --size small "${pass[@]}" >> "$out/torch.jsonl"
            fi ;;
    esac
    from="$out"
fi

python3 - "$from" <<'EOF'
import json
import pathlib
import sys

src = pathlib.Path(sys.argv[1])


def load(name):
    path = src / name
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                rows[(r["model"], r["config"])] = r
    return rows


ours, torch = load("typed_amp.jsonl"), load("torch.jsonl")
version = next((r.get("torch_version") for r in torch.values()), "?")
threads = {r.get("threads") for r in list(ours.values()) + list(torch.values())}
print(f"typed-amp vs PyTorch {version}, CPU, threads {sorted(t for t in threads if t)}; "
      "median ms per step (CPU ms per step, all threads)")


def cell(r):
    if r is None:
        return "-"
    s = f"{r['ms_per_step']:.2f}"
    if r.get("cpu_ms_per_step") is not None:
        s += f" ({r['cpu_ms_per_step']:.1f})"
    if r.get("capped"):
        s += f" [{r['steps']} steps]"
    return s


def ratio(a, b, key="ms_per_step"):
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


def fmt_ratio(a, b):
    wall = ratio(a, b)
    if wall is None:
        return "-"
    cpu = ratio(a, b, "cpu_ms_per_step")
    return f"{wall:6.2f}" + (f"   (CPU time {cpu:.2f})" if cpu is not None else "")


titles = {
    "mlp": "MLP 784-512-512-10 (ReLU), batch 256, Adam, cross-entropy",
    "cnn": "CNN conv16-BN-ReLU-pool, conv32-BN-ReLU-pool, linear 1568-10, batch 128, Adam",
    "vit": "ViT 7x7 patches, width 64, 4 heads, 4 pre-norm blocks, MLP 128, GELU, batch 128, Adam",
    "gpt-small": "GPT small: 4 layers, 4 heads, width 128, context 64, batch 12, AdamW, clipping 1.0",
    "gpt-baby": "GPT baby: 6 layers, 6 heads, width 384, context 256, batch 64, dropout 0.2, AdamW",
}
# (layers, width, context, batch) of each GPT, for its products' FLOPs: 6 · tokens ·
# (12·L·C² + V·C + L·T·C), as typed_amp_models::gpt::GptSize::step_product_flops counts them.
gpt_sizes = {"gpt-small": (4, 128, 64, 12), "gpt-baby": (6, 384, 256, 64)}
VOCAB = 84
# Rows: (precision, typed-amp config, torch config on the same row or None).
layout = [
    ("fp32", "dfdx-fp32", "torch-fp32"),
    ("fp32", "O0", None),
    ("bf16", "O2-BF16", "torch-bf16-autocast"),
    ("bf16", "O1-BF16", None),
    ("fp16", "O2-FP16", "torch-fp16-autocast"),
]
# The ViT has no plain-dfdx row (its attention is typed-amp's): O0 faces torch-fp32.
layouts = {
    "gpt-small": [
        ("fp32", "O0", "torch-fp32"),
        ("bf16", "O2-BF16", "torch-bf16-autocast"),
        ("fp16", "O2-FP16", "torch-fp16-autocast"),
    ],
    "gpt-baby": [
        ("fp32", "O0", "torch-fp32"),
        ("bf16", "O2-BF16", "torch-bf16-autocast"),
        ("fp16", "O2-FP16", "torch-fp16-autocast"),
    ],
    "vit": [
        ("fp32", "O0", "torch-fp32"),
        ("bf16", "O2-BF16", "torch-bf16-autocast"),
        ("fp16", "O2-FP16", "torch-fp16-autocast"),
    ],
}
for model, title in titles.items():
    if not any(k[0] == model for k in list(ours) + list(torch)):
        continue
    o = lambda c: ours.get((model, c))  # noqa: E731
    t = lambda c: torch.get((model, c))  # noqa: E731
    print()
    print(title)
    print(f"  {'':5} {'typed-amp':<10} {'ms (CPU ms)':>22}   {'PyTorch':<20} {'ms (CPU ms)':>22}")
    last = None
    for prec, oc, tc in layouts.get(model, layout):
        name = prec if prec != last else ""
        last = prec
        tname = tc or ""
        tval = cell(t(tc)) if tc else ""
        if tc and t(tc) is None:
            tval = "skipped"
        print(f"  {name:5} {oc:<10} {cell(o(oc)):>22}   {tname:<20} {tval:>22}")
    print("  ratios of ms per step (below 1: the first is faster)")
    for label, a, b in [
        ("O2-BF16 / our O0", o("O2-BF16"), o("O0")),
        ("O2-BF16 / torch-bf16-autocast", o("O2-BF16"), t("torch-bf16-autocast")),
        ("O2-FP16 / our O0", o("O2-FP16"), o("O0")),
        ("our O0 / torch-fp32", o("O0"), t("torch-fp32")),
    ]:
        print(f"    {label:<32} {fmt_ratio(a, b)}")
    if model in gpt_sizes:
        L, C, T, B = gpt_sizes[model]
        gflop = 6 * B * T * (12 * L * C * C + VOCAB * C + L * T * C) / 1e9
        # The limit is what the GEMM reaches: the rate of its fastest decile of 1024^3 products
        # (p10 time), not their median, which on a shared machine wandered by +-15% between runs.
        print(f"  the step's matrix products: {gflop:.2f} GFLOP; the step against their time at our GEMM rate at 1024^3 (its fastest decile)")
        for cfg, dt in [("O0", "f32"), ("O2-BF16", "bf16"), ("O2-FP16", "f16")]:
            r, g = o(cfg), ours.get(("matmul", f"{dt}-1024"))
            if r and g:
                rate = 2 * 1024**3 / (g["p10_ms"] * 1e-3) / 1e9
                limit = gflop / rate * 1e3
                print(f"    {cfg:<8} {r['ms_per_step']:8.2f} ms vs {limit:8.2f} ms at {rate:.0f} GFLOP/s ({dt}): "
                      f"{r['ms_per_step'] / limit:5.2f}x the limit")

if any(k[0] == "matmul" for k in list(ours) + list(torch)):
    print()
    print("matmul, square n^3: GFLOP/s of the median product (dfdx `a.matmul(b)` vs `torch.mm`)")
    print(f"  {'product':<10} {'typed-amp':>10} {'PyTorch':>10} {'ours/torch':>11}")
    for n in (256, 1024):
        for dt in ("f32", "bf16", "f16"):
            c = f"{dt}-{n}"
            a, b = ours.get(("matmul", c)), torch.get(("matmul", c))
            ga = f"{a['gflops']:.1f}" if a else "-"
            gb = f"{b['gflops']:.1f}" if b else "-"
            if b and b.get("capped"):
                gb += "*"
            r = f"{a['gflops'] / b['gflops']:.2f}" if a and b else "-"
            print(f"  {c:<10} {ga:>10} {gb:>10} {r:>11}")
    print("  ratios of GFLOP/s (above 1: the first is faster)")

    def g(side, c):
        r = side.get(("matmul", c))
        return r["gflops"] if r else None

    for label, a, b in [
        ("bf16 1024^3: ours / torch bf16 mm", g(ours, "bf16-1024"), g(torch, "bf16-1024")),
        ("f16 / f32, ours, 1024^3", g(ours, "f16-1024"), g(ours, "f32-1024")),
        ("f16 / f32, ours, 256^3", g(ours, "f16-256"), g(ours, "f32-256")),
        ("bf16 / f32, ours, 1024^3", g(ours, "bf16-1024"), g(ours, "f32-1024")),
    ]:
        print(f"    {label:<36} " + (f"{a / b:6.2f}" if a and b else "     -"))
    if any(r.get("capped") for r in torch.values()):
        print("  * fewer samples than asked: slower than --max-time allows")
EOF
