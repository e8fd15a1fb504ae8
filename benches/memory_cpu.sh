#!/usr/bin/env bash
# Memory of the main job under O0, O2-FP16 and O2-BF16 (and the GPT's O2-BF16 with FP8 linear
# layers), each in a `typed-amp train` process of its own (so no run inherits another's freed
# memory): the training loop's peak heap (`loop_peak_bytes` of `--json`: the peak of live heap
# bytes while the loop ran, less what was live when it started) and the process's peak RSS,
# with the ratios to O0 that issue 20's targets use and, for the GPT, FP8 / O2-BF16 (issue 33).
#
#   benches/memory_cpu.sh [--out DIR] [--bin PATH] [CASE ...]
#
#   CASE     MODEL:BATCH, MODEL one of cnn, mlp (one epoch on the full Fashion-MNIST), gpt-small,
#            gpt-baby (2 iterations, 1 validation window) (default: cnn:2048 mlp:4096)
#   --out    where each run's JSON goes (default $CARGO_TARGET_DIR or target, /memory_cpu)
#   --bin    the typed-amp binary to run (default: build the CLI in release mode first)
#
# Needs only python3's standard library for the table.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/memory_cpu"
bin=""
cases=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
[[ ${#cases[@]} -gt 0 ]] || cases=(cnn:2048 mlp:4096)

cd "$root"
if [[ -z "$bin" ]]; then
    echo "building the CLI ..." >&2
    cargo build --release -q -p typed-amp-cli
    bin="$target/release/typed-amp"
fi
mkdir -p "$out"
for case in "${cases[@]}"; do
    model="${case%%:*}"
    batch="${case##*:}"
    runs=("O0 fp16" "O2 fp16" "O2 bf16")
    case "$model" in
        gpt-*)
            what=(--model gpt --gpt-size "${model#gpt-}" --iters 2 --eval-windows 1)
            runs+=("O2 bf16 --fp8")
            ;;
        *) what=(--model "$model" --epochs 1) ;;
    esac
    for run in "${runs[@]}"; do
        read -r policy dtype extra <<< "$run"
        name="$model-$batch-$policy-$dtype${extra:-}"
        flags=()
        [[ -z "${extra:-}" ]] || flags=("$extra")
        echo "running $name ..." >&2
        "$bin" train "${what[@]}" --batch "$batch" --policy "$policy" --dtype "$dtype" \
            "${flags[@]}" --quiet --json > "$out/$name.json"
    done
done

python3 - "$out" "${cases[@]}" <<'EOF'
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
mib = 1 << 20
print("memory of `typed-amp train`, each run in its own process")
print(f"{'case':<16}{'run':<13}{'loop peak heap':>16}{'/ O0':>7}{'/ BF16':>8}{'peak RSS':>12}{'/ O0':>7}{'quality':>10}")
for case in sys.argv[2:]:
    model, batch = case.split(":")
    runs = [("O0", "fp16", "", "O0"), ("O2", "fp16", "", "O2-FP16"), ("O2", "bf16", "", "O2-BF16")]
    if model.startswith("gpt-"):
        runs.append(("O2", "bf16", "--fp8", "O2-BF16+FP8"))
    rows = {}
    for policy, dtype, extra, label in runs:
        rows[label] = json.loads((out / f"{model}-{batch}-{policy}-{dtype}{extra}.json").read_text())
    base, bf16 = rows["O0"], rows["O2-BF16"]
    for label, r in rows.items():
        loop, rss = r["loop_peak_bytes"], r["peak_rss_bytes"]
        # The main job's test accuracy; the GPT's validation loss (2 iterations: a smoke value).
        quality = f"{100 * r['test_accuracy']:.2f}%" if "test_accuracy" in r else f"{r['val_loss']:.4f}"
        print(
            f"{model + ' b' + batch:<16}{label:<13}{loop / mib:>12.1f} MiB{loop / base['loop_peak_bytes']:>7.2f}"
            f"{loop / bf16['loop_peak_bytes']:>8.3f}{rss / mib:>8.1f} MiB{rss / base['peak_rss_bytes']:>7.2f}{quality:>10}"
        )
EOF
