#!/usr/bin/env bash
# Runs what benches/gpu/build.sh assembled in .gpu/, on the lent GPU machine (from the repository
# root; it needs no Rust toolchain and no network there):
#
#   OUT=/path RUN_BUDGET_S=420 STEPS="cuda_tests nvrtc_tests gpu_step_gpt" bash benches/gpu/run.sh
#
#   OUT           folder for the logs: <step>.log per step, summary.txt, env.log [default:
#                 .gpu/out; on the lent machine, the device tool's $OUT]
#   RUN_BUDGET_S  seconds for the whole run [default: 420]: each step gets a `timeout` of what is
#                 left (less a reserve for the summary; at most STEP_TIMEOUT_S), and no step is
#                 started with under 15 s left
#   STEPS         the steps, in order [default: cuda_tests nvrtc_tests, nccl_tests in an --nccl
#                 build, gpu_step_gpt gpu_step_gpt_cuda_cores gpu_step_mlp gpu_step_vit
#                 gpu_step_cnn torch_peer compare_gpt]
#   STEP_TIMEOUT_S  the most one step may take, so that a step that hangs leaves time for the
#                 next ones [default: 240]
#   GPT_ITERS     iterations of the baby GPT in compare_gpt, train_gpt and train_gpt_fp8 [default: 300]
#
# Steps:
#   cuda_tests     tests/cuda: every kernel against the CPU, the fused ops (not nccl::)
#   nccl_tests     tests/cuda's nccl:: alone (a build.sh --nccl build)
#   nvrtc_tests    the library's NVRTC compile tests (no GPU needed)
#   gpu_step_gpt, gpu_step_mlp, gpu_step_vit, gpu_step_cnn
#                  cli/benches/gpu_step.rs --only <model>
#   gpu_step_gpt_cuda_cores
#                  gpu_step --only gpt with the attention on CUDA cores (TYPED_AMP_CUDA_ATTENTION=fp32):
#                  beside gpu_step_gpt, what the tensor-core attention (16-bit, sm_80+) gains
#   gpu_step       cli/benches/gpu_step.rs, every model
#   torch_peer     benches/peers/torch_gpu_step.py, every model (PyTorch, the machine's python3)
#   torch_peer_gpt, torch_peer_mlp, torch_peer_vit, torch_peer_cnn: one model
#   compare_gpt    typed-amp compare --model gpt --gpt-size baby --device cuda:0, GPT_ITERS iterations
#   train_gpt      typed-amp train --model gpt --gpt-size baby --policy O2 --dtype bf16 --device cuda:0
#   train_gpt_fp8  the same with --fp8 (FP8 linear layers on cuBLASLt; sm_89+, else 16-bit)
#   compare_vit, compare_cnn, compare_mlp
#                  typed-amp compare --model <model> --device cuda:0 --epochs 1
#
# It never stops early: each step's exit status goes to summary.txt (124: stopped by its timeout;
# "skipped": not started, with the reason), and run.sh exits 0 once the summary is written.
# Without a GPU driver (no nvidia-smi, no libcuda.so.1) it loads the stub libcuda of .gpu/stub:
# the binaries start, and their tests print that they skip.
cd "$(dirname "$0")/../.." || exit 1
repo=$(pwd)
gpu=$repo/.gpu
start=$(date +%s)
budget=${RUN_BUDGET_S:-420}
reserve=5
gpt_iters=${GPT_ITERS:-300}
step_cap=${STEP_TIMEOUT_S:-240}
out=${OUT:-$gpu/out}
mkdir -p "$out" || exit 1
summary=$out/summary.txt
: >"$summary"

note() { echo "$*" | tee -a "$summary"; }

if [ ! -f "$gpu/MANIFEST" ]; then
    note "run.sh: no .gpu/MANIFEST: run 'bash benches/gpu/build.sh' on the build machine first"
    exit 1
fi

nccl_built=$(sed -n 's/^nccl: //p' "$gpu/MANIFEST")
default_steps="cuda_tests nvrtc_tests"
[ "$nccl_built" = 1 ] && default_steps+=" nccl_tests"
default_steps+=" gpu_step_gpt gpu_step_gpt_cuda_cores gpu_step_mlp gpu_step_vit gpu_step_cnn torch_peer compare_gpt"
steps=${STEPS:-$default_steps}

# The machine, the driver and CUDA first.
{
    echo "== .gpu/MANIFEST"
    cat "$gpu/MANIFEST"
    echo "== host: $(uname -srm), $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "== nvidia-smi"
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
    else
        echo "== no nvidia-smi on PATH: no NVIDIA driver here"
    fi
    command -v nvcc >/dev/null 2>&1 && echo "== the machine's nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
} 2>&1 | tee "$out/env.log"

# The executables, gzip'd by build.sh, unpacked outside .gpu/ (which must stay small enough for
# the device tool to carry).
bin=$(mktemp -d "${TMPDIR:-/tmp}/typed-amp-gpu.XXXXXX") || exit 1
trap 'rm -rf "$bin"' EXIT
for gz in "$gpu"/bin/*.gz; do
    exe=$bin/$(basename "$gz" .gz)
    if ! gzip -dc "$gz" >"$exe" 2>/dev/null; then
        python3 -c 'import gzip, shutil, sys; shutil.copyfileobj(gzip.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$gz" "$exe" ||
            echo "run.sh: could not unpack $gz" | tee -a "$out/env.log"
    fi
    chmod +x "$exe"
done

# The CUDA libraries: those build.sh shipped first, then the machine's own: PyTorch's NVIDIA
# wheels (the python3 that holds PyTorch), a toolkit in /usr/local/cuda, and a build machine's
# benches/gpu/cuda_env.sh venv (for a run on the build machine itself).
libdirs=$gpu/lib
py_libs=$(python3 - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
for base in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(base, "*", "lib"))):
        print(lib)
EOF
)
for d in $py_libs /usr/local/cuda/lib64 "${CUDA_ROOT:-/work/venv-cuda/cuda}/lib64"; do
    [ -d "$d" ] && libdirs+=:$d
done

# The driver's libcuda.so.1, or else the stub (never both: the stub would hide the driver).
have_driver() {
    command -v nvidia-smi >/dev/null 2>&1 && return 0
    ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1 ' >/dev/null && return 0
    local d
    for d in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [ -e "$d/libcuda.so.1" ] && return 0
    done
    return 1
}
if have_driver; then
    echo "libcuda: the driver's" | tee -a "$out/env.log"
else
    libdirs+=:$gpu/stub
    echo "libcuda: NO DRIVER found: the stub .gpu/stub/libcuda.so.1 (every CUDA call fails; the GPU tests skip)" |
        tee -a "$out/env.log"
fi
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# dfdx's run-time NVRTC kernels include cuda_fp16.h and cuda_bf16.h from the build machine's
# include directory, whose path is baked into the binaries: where it does not exist, it becomes a
# link to .gpu/include (outside the repository, on a machine that is given back afterwards).
include_dir=$(sed -n 's/^cuda_include_dir: //p' "$gpu/MANIFEST")
if [ -n "$include_dir" ] && [ ! -e "$include_dir/cuda_fp16.h" ]; then
    if mkdir -p "$(dirname "$include_dir")" 2>/dev/null && ln -sfn "$gpu/include" "$include_dir" 2>/dev/null; then
        echo "cuda include: linked $include_dir -> .gpu/include" | tee -a "$out/env.log"
    else
        echo "cuda include: COULD NOT link $include_dir -> .gpu/include: dfdx's run-time kernels (casts, concat, reshape, stack) will fail to compile" |
            tee -a "$out/env.log"
    fi
fi

{
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "== the libraries the binaries load"
    for exe in "$bin"/*; do
        echo "$(basename "$exe"):"
        ldd "$exe" 2>&1 | grep -E 'cuda|nvrtc|cublas|nccl|not found' | sed 's/^[[:space:]]*/  /'
    done
    for f in $(ldd "$bin/cuda_tests" 2>/dev/null | awk '/nvrtc|cublas|nccl/ {print $3}'); do
        echo "$f -> $(readlink -f "$f")"
    done
} 2>&1 | tee -a "$out/env.log"

# Each step's command, as an array in `cmd`; returns 1 for an unknown step.
step_command() {
    local step=$1 model
    case $step in
        cuda_tests) cmd=("$bin/cuda_tests" --skip nccl:: --test-threads=1) ;;
        nccl_tests)
            if [ "$nccl_built" != 1 ]; then
                cmd=()
                skip_reason="built without NCCL (benches/gpu/build.sh --nccl)"
            else
                cmd=("$bin/cuda_tests" nccl:: --test-threads=1)
            fi
            ;;
        nvrtc_tests) cmd=("$bin/nvrtc_tests" nvrtc) ;;
        gpu_step) cmd=("$bin/gpu_step") ;;
        gpu_step_gpt | gpu_step_mlp | gpu_step_vit | gpu_step_cnn)
            cmd=("$bin/gpu_step" --only "${step#gpu_step_}")
            ;;
        gpu_step_gpt_cuda_cores)
            cmd=(env TYPED_AMP_CUDA_ATTENTION=fp32 "$gpu/bin/gpu_step" --only gpt)
            ;;
        torch_peer) cmd=(python3 "$gpu/peers/torch_gpu_step.py") ;;
        torch_peer_gpt | torch_peer_mlp | torch_peer_vit | torch_peer_cnn)
            cmd=(python3 "$gpu/peers/torch_gpu_step.py" --only "${step#torch_peer_}")
            ;;
        compare_gpt)
            cmd=("$bin/typed-amp" compare --model gpt --gpt-size baby --device cuda:0
                --iters "$gpt_iters" --eval-every "$gpt_iters" --quiet)
            ;;
        train_gpt)
            cmd=("$bin/typed-amp" train --model gpt --gpt-size baby --policy O2 --dtype bf16
                --device cuda:0 --iters "$gpt_iters" --eval-every "$gpt_iters" --quiet)
            ;;
        train_gpt_fp8)
            cmd=("$bin/typed-amp" train --model gpt --gpt-size baby --policy O2 --dtype bf16 --fp8
                --device cuda:0 --iters "$gpt_iters" --eval-every "$gpt_iters" --quiet)
            ;;
        compare_vit | compare_cnn | compare_mlp)
            model=${step#compare_}
            cmd=("$bin/typed-amp" compare --model "$model" --device cuda:0 --epochs 1 --quiet)
            ;;
        *) return 1 ;;
    esac
}

printf '%-16s %-8s %s\n' step rc seconds >>"$summary"
for step in $steps; do
    cmd=()
    skip_reason=""
    if ! step_command "$step"; then
        printf '%-16s %-8s %s\n' "$step" skipped "unknown step" >>"$summary"
        continue
    fi
    if [ -n "$skip_reason" ]; then
        echo "skipped: $skip_reason" >"$out/$step.log"
        printf '%-16s %-8s %s\n' "$step" skipped "$skip_reason" >>"$summary"
        continue
    fi
    left=$((budget - ($(date +%s) - start) - reserve))
    if [ $left -lt 15 ]; then
        printf '%-16s %-8s %s\n' "$step" skipped "RUN_BUDGET_S=$budget spent" >>"$summary"
        continue
    fi
    [ $left -gt "$step_cap" ] && left=$step_cap
    echo
    echo "==> $step (timeout ${left}s): ${cmd[*]}"
    step_start=$(date +%s)
    # PYTHONUNBUFFERED: the peer's lines reach the log as they come, also if it is stopped.
    PYTHONUNBUFFERED=1 timeout --kill-after=5 "$left" "${cmd[@]}" </dev/null 2>&1 | tee "$out/$step.log"
    rc=${PIPESTATUS[0]}
    printf '%-16s %-8s %s\n' "$step" "$rc" "$(($(date +%s) - step_start))" >>"$summary"
done

echo
echo "== summary ($(($(date +%s) - start)) s of RUN_BUDGET_S=$budget; 124: timed out)"
cat "$summary"
exit 0
