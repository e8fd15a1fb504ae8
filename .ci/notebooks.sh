#!/usr/bin/env bash
# Runs the example notebooks (examples/notebooks/*.ipynb) headless on the evcxr Jupyter kernel
# and fails if a cell fails (examples/notebooks/README.md says how cells are judged).
# Installs what is missing: nbclient (with pip, into a private directory) and evcxr_jupyter
# (with cargo). Needs only Rust and Python 3 with pip. Changes no notebook.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
started=$SECONDS

# evcxr compiles each cell incrementally: with CARGO_INCREMENTAL=0 (which .ci/run sets for its
# own builds) every cell after the first fails with "Subprocess terminated with status: exit
# status: 99".
unset CARGO_INCREMENTAL

cache="${XDG_CACHE_HOME:-$HOME/.cache}/typed-amp-notebooks"
mkdir -p "$cache"

step "nbclient"
# A private --target directory: no virtual environment needed (Debian's python3 has none
# without python3-venv) and no clash with a system Python that refuses pip installs (PEP 668).
pydeps="$cache/python"
export PYTHONPATH="$pydeps${PYTHONPATH:+:$PYTHONPATH}"
if python3 -c 'import nbclient' >/dev/null 2>&1; then
    echo "nbclient $(python3 -c 'import nbclient; print(nbclient.__version__)') already installed"
else
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
        --no-warn-conflicts --target "$pydeps" 'nbclient==0.11.*'
    echo "installed nbclient $(python3 -c 'import nbclient; print(nbclient.__version__)')"
fi

step "evcxr_jupyter"
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v evcxr_jupyter >/dev/null 2>&1; then
    # --locked: without it the build picks up incompatible new dependencies. Optimisation
    # level 1 builds in about 6 minutes on 2 cores instead of 9; the kernel is no slower to use.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo install --locked evcxr_jupyter@0.22.0
fi
echo "using $(command -v evcxr_jupyter)"
# evcxr's code analysis reads the standard library's sources.
if command -v rustup >/dev/null 2>&1; then
    rustup component add rust-src >/dev/null 2>&1 || echo "note: rustup could not add rust-src"
fi

step "kernel spec"
export JUPYTER_DATA_DIR="$cache/jupyter"
mkdir -p "$JUPYTER_DATA_DIR/kernels/rust"
cat >"$JUPYTER_DATA_DIR/kernels/rust/kernel.json" <<EOF
{
  "argv": ["$(command -v evcxr_jupyter)", "--control_file", "{connection_file}"],
  "display_name": "Rust",
  "language": "rust",
  "interrupt_mode": "message"
}
EOF
echo "wrote $JUPYTER_DATA_DIR/kernels/rust/kernel.json"
echo "setup took $((SECONDS - started)) s"

step "notebooks"
python3 examples/notebooks/run.py --kernel rust
echo "notebooks took $((SECONDS - started)) s in all"
