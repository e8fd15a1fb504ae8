#!/usr/bin/env bash
# Memory of the main job under O0, O2-FP16 and O2-BF16, each in a `typed-amp train` process of
# its own (so no run inherits another's freed memory), one epoch on the full Fashion-MNIST:
# the training loop's peak heap (`loop_peak_bytes` of `--json`: the peak of live heap bytes
# while the loop ran, less what was live when it started) and the process's peak RSS, with the
# ratios O2 / O0 that issue 20's targets use.
#
#   benches/memory_cpu.sh [--out DIR] [CASE ...]
#
#   CASE     MODEL:BATCH (default: cnn:2048 mlp:4096)
#   --out    where each run's JSON goes (default target/memory_cpu)
#
# Builds the CLI in release mode first. Needs only python3's standard library for the table.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/target/memory_cpu"
cases=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
[[ ${#cases[@]} -gt 0 ]] || cases=(cnn:2048 mlp:4096)

cd "$root"
echo "building the CLI ..." >&2
cargo build --release -q -p typed-amp-cli
mkdir -p "$out"
for case in "${cases[@]}"; do
    model="${case%%:*}"
    batch="${case##*:}"
    for run in "O0 fp16" "O2 fp16" "O2 bf16"; do
        set -- $run
        name="$model-$batch-$1-$2"
        echo "running $name ..." >&2
        target/release/typed-amp train --model "$model" --batch "$batch" --policy "$1" \
            --dtype "$2" --epochs 1 --quiet --json > "$out/$name.json"
    done
done

python3 - "$out" "${cases[@]}" <<'EOF'
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
mib = 1 << 20
print("memory of one epoch of `typed-amp train`, each run in its own process")
print(f"{'case':<16}{'run':<9}{'loop peak heap':>16}{'/ O0':>7}{'peak RSS':>12}{'/ O0':>7}{'accuracy':>10}")
for case in sys.argv[2:]:
    model, batch = case.split(":")
    rows = {}
    for policy, dtype, label in [("O0", "fp16", "O0"), ("O2", "fp16", "O2-FP16"), ("O2", "bf16", "O2-BF16")]:
        rows[label] = json.loads((out / f"{model}-{batch}-{policy}-{dtype}.json").read_text())
    base = rows["O0"]
    for label, r in rows.items():
        loop, rss = r["loop_peak_bytes"], r["peak_rss_bytes"]
        print(
            f"{model + ' b' + batch:<16}{label:<9}{loop / mib:>12.1f} MiB{loop / base['loop_peak_bytes']:>7.2f}"
            f"{rss / mib:>8.1f} MiB{rss / base['peak_rss_bytes']:>7.2f}{100 * r['test_accuracy']:>9.2f}%"
        )
EOF
