# shellcheck shell=bash
# Source this file (`source benches/gpu/cuda_env.sh`) to build typed-amp's `cuda` feature on a
# machine without the CUDA toolkit or a GPU: it installs NVIDIA's CUDA 13.0 wheels from PyPI into a
# virtual environment outside the repository (if they are not there yet), assembles a
# CUDA_ROOT-style directory from them, and exports CUDA_ROOT, CUDA_PATH, PATH, LD_LIBRARY_PATH and
# CUDA_COMPUTE_CAP for cudarc's and dfdx's build scripts.
#
# Settings (environment, all optional):
#   CUDA_VENV         where the wheels go (default /work/venv-cuda, else ~/.cache/typed-amp/venv-cuda)
#   CUDA_WITH_NCCL=1  also install NCCL (nvidia-nccl-cu13), for the `nccl` features
#   CUDA_COMPUTE_CAP  the GPU architecture dfdx's PTX is compiled for (default 90: H100 and H200)
#
# Why each piece:
# - CUDA 13.0 (not the newest 13.x): the GPU machine's driver is 580.x, whose JIT reads PTX up to
#   CUDA 13.0's ISA; PTX from a newer nvcc or NVRTC would not load there.
# - `--no-deps` and explicit pins: only what the build links and nvcc runs (nvcc, its C runtime
#   headers, NVVM's cicc, CCCL's headers, NVRTC, the runtime's headers and cuBLAS), one version
#   each.
# - cudarc 0.9.15 links libcuda, libnvrtc, libcublas and libcublasLt at build time (its build.rs
#   emits `rustc-link-lib=dylib=...`; nothing is loaded with dlopen). No wheel ships libcuda (the
#   driver's library), so a stub of it is generated here (lib64/stubs/libcuda.so, every `cu*`
#   entry point of cuda.h returning CUDA_ERROR_STUB_LIBRARY) for the link, and for running the
#   built binaries on a machine without a driver, where opening a device then fails cleanly. It
#   is never copied to the GPU machine, where the driver's libcuda.so.1 is loaded.
# - dfdx's build.rs asks `nvidia-smi --query-gpu=compute_cap` even when CUDA_COMPUTE_CAP is set.
#   Where no nvidia-smi is on PATH, a shim that prints CUDA_COMPUTE_CAP stands in for it (in
#   $CUDA_ROOT/shim, on PATH only then).

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    echo "cuda_env.sh sets up the calling shell: source it (source benches/gpu/cuda_env.sh)" >&2
    exit 2
fi

cuda_env_main() {
    local venv
    if [ -n "${CUDA_VENV:-}" ]; then
        venv=$CUDA_VENV
    elif [ -d /work ] && [ -w /work ]; then
        venv=/work/venv-cuda
    else
        venv=${XDG_CACHE_HOME:-$HOME/.cache}/typed-amp/venv-cuda
    fi

    # CUDA 13.0 update 2's components (nvcc 13.0.88, cuBLAS 13.0.2); NCCL 2.28.9 as measured in
    # BENCHMARKS.md.
    local pins=(
        nvidia-cuda-nvcc==13.0.88
        nvidia-cuda-crt==13.0.88
        nvidia-nvvm==13.0.88
        nvidia-cuda-cccl==13.0.85
        nvidia-cuda-nvrtc==13.0.88
        nvidia-cuda-runtime==13.0.96
        nvidia-cublas==13.0.2.14
    )
    if [ "${CUDA_WITH_NCCL:-0}" = 1 ]; then
        pins+=(nvidia-nccl-cu13==2.28.9)
    fi

    local python=$venv/bin/python3
    local stamp=$venv/.typed-amp-pins
    if [ ! -x "$python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
        echo "cuda_env: installing CUDA wheels into $venv: ${pins[*]}" >&2
        if [ ! -x "$python" ]; then
            python3 -m venv "$venv" || {
                echo "cuda_env: could not create the virtual environment $venv" >&2
                return 1
            }
        fi
        "$python" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --no-cache-dir \
            "${pins[@]}" || {
            echo "cuda_env: pip could not install NVIDIA's CUDA wheels from PyPI" \
                "(network? disk?): ${pins[*]}" >&2
            return 1
        }
        echo "${pins[*]}" >"$stamp"
    fi

    local site
    site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
    local wheel_root=$site/nvidia/cu13
    if [ ! -x "$wheel_root/bin/nvcc" ] || [ ! -f "$wheel_root/include/cuda.h" ]; then
        echo "cuda_env: $wheel_root has no bin/nvcc or include/cuda.h; remove $venv and retry" >&2
        return 1
    fi

    # The CUDA_ROOT-style directory: the wheels' tree (bin, include, nvvm) by symbolic links, and
    # lib64 with the unversioned names the linker looks for (`-lnvrtc` finds libnvrtc.so).
    local root=$venv/cuda
    mkdir -p "$root/lib64/stubs" "$root/shim" || return 1
    local d
    for d in bin include nvvm; do
        ln -sfn "$wheel_root/$d" "$root/$d"
    done
    local lib name
    for lib in "$wheel_root"/lib/*.so.* "$site"/nvidia/nccl/lib/libnccl.so.*; do
        # nvrtc's `.alt` variants are a second build of the same library, unused here.
        case $lib in *.alt.so*) continue ;; esac
        [ -e "$lib" ] || continue
        name=$(basename "$lib")
        ln -sfn "$lib" "$root/lib64/$name"
        ln -sfn "$lib" "$root/lib64/${name%%.so.*}.so"
    done

    # Made again when cuda.h or this script is newer than it.
    local stub=$root/lib64/stubs/libcuda.so.1
    if [ ! -e "$stub" ] || [ "$stub" -ot "$wheel_root/include/cuda.h" ] || [ "$stub" -ot "${BASH_SOURCE[0]}" ]; then
        cuda_env_stub "$wheel_root/include" "$root/lib64/stubs" || return 1
    fi

    if ! command -v nvidia-smi >/dev/null 2>&1 || [ "$(command -v nvidia-smi)" = "$root/shim/nvidia-smi" ]; then
        cat >"$root/shim/nvidia-smi" <<'EOF'
#!/bin/sh
# Stand-in for nvidia-smi on a machine without a GPU (benches/gpu/cuda_env.sh): dfdx's build.rs
# asks `nvidia-smi --query-gpu=compute_cap --format=csv`; answer with CUDA_COMPUTE_CAP.
cap=${CUDA_COMPUTE_CAP:-90}
echo compute_cap
echo "${cap%?}.${cap#"${cap%?}"}"
EOF
        chmod +x "$root/shim/nvidia-smi"
        case ":$PATH:" in *":$root/shim:"*) ;; *) PATH=$root/shim:$PATH ;; esac
    fi

    export CUDA_ROOT=$root CUDA_PATH=$root
    export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
    case ":$PATH:" in *":$root/bin:"*) ;; *) PATH=$root/bin:$PATH ;; esac
    export PATH
    local ld=$root/lib64
    # The stub libcuda only where the dynamic loader finds no driver's libcuda.so.1: on a machine
    # with a GPU it would hide the real one.
    # (grep without -q: reading all of ldconfig's output, no SIGPIPE under a caller's pipefail)
    if ! ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1 ' >/dev/null; then
        ld=$ld:$root/lib64/stubs
    fi
    case ":${LD_LIBRARY_PATH:-}:" in
        *":$root/lib64:"*) ;;
        *) export LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
    esac
    echo "cuda_env: CUDA_ROOT=$CUDA_ROOT ($(nvcc --version | tail -n 2 | head -n 1)), CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP" >&2
}

# Writes a stub libcuda.so.1 (and libcuda.so) into $2 from the cuda.h under $1: every driver
# entry point, under the names cuda.h's macros give them (cuMemAlloc is cuMemAlloc_v2), returning
# CUDA_ERROR_STUB_LIBRARY (34), as the toolkit's own stub does; except cuGetErrorName and
# cuGetErrorString, which answer (cudarc's `Debug` of a driver error unwraps them, and a stub
# that failed there too made every error a panic inside a panic: an abort, not a skip).
cuda_env_stub() {
    local include=$1 out=$2 tmp
    tmp=$(mktemp -d) || return 1
    {
        echo '/* Generated by benches/gpu/cuda_env.sh: a stub of the CUDA driver library. */'
        echo '#define CUDA_ERROR_STUB_LIBRARY 34'
        echo "#include <cuda.h>" | cc -E -P -I"$include" -x c - |
            grep -oE '^(extern +)?CUresult +(CUDAAPI +)?cu[A-Za-z0-9_]+ *\(' |
            grep -oE 'cu[A-Za-z0-9_]+ *\($' | tr -d ' (' | sort -u |
            grep -vxE 'cuGetErrorName|cuGetErrorString' |
            sed 's/.*/int &(void) { return CUDA_ERROR_STUB_LIBRARY; }/'
        cat <<'EOF'
int cuGetErrorName(int error, const char **name) {
    *name = error == CUDA_ERROR_STUB_LIBRARY ? "CUDA_ERROR_STUB_LIBRARY" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
int cuGetErrorString(int error, const char **text) {
    *text = error == CUDA_ERROR_STUB_LIBRARY
        ? "CUDA driver is a stub library (benches/gpu/cuda_env.sh): no NVIDIA driver here"
        : "unknown error (stub CUDA driver library)";
    return 0;
}
EOF
    } >"$tmp/libcuda_stub.c" || {
        rm -rf "$tmp"
        return 1
    }
    if [ "$(grep -c '^int cu' "$tmp/libcuda_stub.c")" -lt 100 ]; then
        echo "cuda_env: found too few driver functions in cuda.h for the libcuda stub" >&2
        rm -rf "$tmp"
        return 1
    fi
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$tmp/libcuda_stub.c" || {
        echo "cuda_env: could not compile the libcuda stub (needs a C compiler, cc)" >&2
        rm -rf "$tmp"
        return 1
    }
    ln -sfn libcuda.so.1 "$out/libcuda.so"
    rm -rf "$tmp"
}

# Errors are handled where they happen (`|| return 1`), also under a caller's `set -e`, so that
# the message below is printed. `source` returns the status of the last command: `false` on a
# failure (which also stops a caller under `set -e` there).
cuda_env_main && cuda_env_failed=0 || cuda_env_failed=1
unset -f cuda_env_main cuda_env_stub
if [ "$cuda_env_failed" = 1 ]; then
    unset cuda_env_failed
    echo "cuda_env: FAILED to set up CUDA (see above)" >&2
    false
else
    unset cuda_env_failed
fi
