#!/usr/bin/env bash
# Builds typed-amp's CUDA executables here (no GPU, no CUDA toolkit needed: benches/gpu/cuda_env.sh
# installs CUDA 13.0 from NVIDIA's PyPI wheels) and assembles them in .gpu/ at the repository root,
# for a lent GPU machine that has no Rust toolchain and no network: there, `bash
# benches/gpu/run.sh` runs them.
#
#   bash benches/gpu/build.sh            # the CUDA tests, the NVRTC tests, gpu_step, the CLI
#   bash benches/gpu/build.sh --nccl     # the same with NCCL (features typed-amp/nccl,
#                                        # typed-amp-cli/nccl): tests/cuda/nccl.rs runs too
#
# .gpu/ gets, the executables stripped of their symbol tables (panics keep their messages,
# backtraces lose function names) and compressed with gzip (70 MiB stripped, 15 MiB compressed;
# run.sh unpacks them into a temporary folder):
#   bin/cuda_tests.gz  tests/cuda (kernels::, fused::, and nccl:: with --nccl), release
#   bin/nvrtc_tests.gz the library's unit tests with `cuda` (run.sh filters them to `nvrtc`)
#   bin/gpu_step.gz    cli/benches/gpu_step.rs
#   bin/typed-amp.gz   the CLI with `cuda` (`--device cuda:0`; 37 MiB stripped, most of it the
#                      embedded data)
#   include/           the CUDA headers dfdx's run-time NVRTC kernels include (cuda_fp16.h,
#                      cuda_bf16.h): dfdx bakes the build's include directory into its binaries,
#                      and run.sh links that path to these where it does not exist
#   lib/               the CUDA libraries that fit (see below)
#   stub/libcuda.so.1  the link-time stub of the driver library, used by run.sh only on a machine
#                      without a driver, so that the binaries start there and their tests skip
#   peers/             the PyTorch peer (benches/peers/torch_gpu_step.py and what it imports)
#   MANIFEST           what was built, from which commit, with which CUDA, and which libraries
#                      the GPU machine must provide
#
# Size: the device tool carries at most 64 MiB, the checkout's tracked files included, so .gpu/
# gets what is left (less a margin). The libraries do not fit: libnvrtc.so.13 is 105 MiB,
# libcublasLt.so.13 515 MiB (with libcublas.so.13, 52 MiB: one library in two files that must be
# of the same version; the executables name libcublas only, which loads libcublasLt),
# libnccl.so.2 208 MiB, and stripping them saves nothing (they are device code). Each such group
# is copied only where it fits whole; otherwise the GPU machine's own copy is used: its image
# holds PyTorch built for CUDA 13.0 with NVIDIA's wheels (nvidia-cublas, nvidia-cuda-nvrtc,
# nvidia-nccl-cu13) and the CUDA 13.0 toolkit, which run.sh finds and whose paths it prints.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

nccl=0
for arg in "$@"; do
    case $arg in
        --nccl) nccl=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "build.sh: unknown argument $arg (--nccl, --help)" >&2
            exit 2
            ;;
    esac
done

export CUDA_WITH_NCCL=$nccl
# shellcheck source=benches/gpu/cuda_env.sh
source benches/gpu/cuda_env.sh

if [ "$nccl" = 1 ]; then
    lib_features=nccl
    cli_features=nccl
else
    lib_features=cuda
    cli_features=cuda
fi

# The executables of one cargo command, from its JSON messages: the `executable` of each
# compiler-artifact whose target is named $1 (hashes in file names are never guessed).
executable_of() {
    local target=$1 json=$2
    jq -r --arg t "$target" \
        'select(.reason == "compiler-artifact" and .target.name == $t and .executable != null) | .executable' \
        "$json" | tail -n 1
}

json_dir=$(mktemp -d)
trap 'rm -rf "$json_dir"' EXIT

build() {
    local name=$1
    shift
    echo "==> cargo $*" >&2
    cargo "$@" --message-format=json-render-diagnostics >"$json_dir/$name.json"
}

build cuda_tests test --release -p typed-amp --features "$lib_features" --test cuda --no-run
build nvrtc_tests test --release -p typed-amp --features "$lib_features" --lib --no-run
build gpu_step bench -p typed-amp-cli --features "$cli_features" --bench gpu_step --no-run
build cli build --release -p typed-amp-cli --features "$cli_features" --bin typed-amp

declare -A exes=(
    [cuda_tests]=$(executable_of cuda "$json_dir/cuda_tests.json")
    [nvrtc_tests]=$(executable_of typed_amp "$json_dir/nvrtc_tests.json")
    [gpu_step]=$(executable_of gpu_step "$json_dir/gpu_step.json")
    [typed-amp]=$(executable_of typed-amp "$json_dir/cli.json")
)

out=$repo/.gpu
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/include" "$out/stub" "$out/peers"
for name in "${!exes[@]}"; do
    exe=${exes[$name]}
    if [ -z "$exe" ] || [ ! -x "$exe" ]; then
        echo "build.sh: cargo named no executable for $name" >&2
        exit 1
    fi
    strip --strip-all -o "$json_dir/$name" "$exe"
    gzip -6 -n -c "$json_dir/$name" >"$out/bin/$name.gz"
    stripped_total=$((${stripped_total:-0} + $(stat -c %s "$json_dir/$name")))
done

for header in cuda_fp16.h cuda_fp16.hpp cuda_bf16.h cuda_bf16.hpp; do
    cp -L "$CUDA_ROOT/include/$header" "$out/include/"
done
cp -L "$CUDA_ROOT/lib64/stubs/libcuda.so.1" "$out/stub/"
cp benches/peers/torch_gpu_step.py benches/peers/models.py benches/peers/torch_gpt.py "$out/peers/"

# What is left of the 64 MiB the device tool carries: the tracked files travel too, and a margin
# of 2 MiB for files added before the run.
limit=$((64 * 1024 * 1024))
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
budget=$((limit - tracked - 2 * 1024 * 1024))
used() { du -sb "$out" | cut -f1; }

# The CUDA libraries the executables need (their NEEDED entries, libcuda aside: the driver's),
# in groups that must travel together. NVRTC loads libnvrtc-builtins of its own version at run
# time.
needed=$(for name in "${!exes[@]}"; do readelf -d "$json_dir/$name"; done |
    sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
groups=()
grep -q '^libnvrtc\.' <<<"$needed" && groups+=("nvrtc:libnvrtc.so.13 libnvrtc-builtins.so.13.0")
grep -q '^libcublas\.' <<<"$needed" && groups+=("cublas:libcublas.so.13 libcublasLt.so.13")
grep -q '^libcudart' <<<"$needed" && groups+=("cudart:libcudart.so.13")
grep -q '^libnccl' <<<"$needed" && groups+=("nccl:libnccl.so.2")
shipped=()
from_machine=()
for group in "${groups[@]}"; do
    gname=${group%%:*}
    files=${group#*:}
    size=0
    for f in $files; do
        size=$((size + $(stat -L -c %s "$CUDA_ROOT/lib64/$f")))
    done
    if [ $(($(used) + size)) -le "$budget" ]; then
        for f in $files; do cp -L "$CUDA_ROOT/lib64/$f" "$out/lib/"; done
        shipped+=("$gname ($files, $((size / 1048576)) MiB)")
    else
        from_machine+=("$gname ($files, $((size / 1048576)) MiB: over the $((budget / 1048576)) MiB left)")
    fi
done

total=$(used)
{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo ' (with uncommitted changes)')"
    echo "features: typed-amp/$lib_features typed-amp-cli/$cli_features"
    echo "nccl: $nccl"
    echo "cuda: $(nvcc --version | tail -n 2 | head -n 1)"
    echo "compute_cap: sm_$CUDA_COMPUTE_CAP (dfdx's PTX and its run-time NVRTC kernels)"
    echo "cuda_include_dir: $CUDA_ROOT/include"
    echo "needed: $(tr '\n' ' ' <<<"$needed")"
    echo "executables: ${!exes[*]} ($((stripped_total / 1048576)) MiB stripped, gzip'd in bin/)"
    for s in "${shipped[@]}"; do echo "shipped: $s"; done
    for s in "${from_machine[@]}"; do echo "from the GPU machine: $s"; done
    echo "size: $total bytes ($((total / 1048576)) MiB of the $((budget / 1048576)) MiB left by the tracked files' $((tracked / 1048576)) MiB)"
} >"$out/MANIFEST"

if [ "$total" -gt "$budget" ]; then
    cat "$out/MANIFEST" >&2
    echo "build.sh: .gpu/ is $((total / 1048576)) MiB, over the $((budget / 1048576)) MiB the device tool can carry" >&2
    exit 1
fi
echo
cat "$out/MANIFEST"
du -sh "$out"/* | sed 's/^/  /'
