#!/usr/bin/env python3
"""Execute the evcxr notebooks headless and check every code cell.

    python3 examples/notebooks/run.py [--write] [NOTEBOOK ...]

Runs each notebook (by default every *.ipynb beside this file) with nbclient on the evcxr
Jupyter kernel, then judges each code cell by its outputs, because evcxr reports a panic or an
error returned through `?` as a successful execution:

* a cell tagged `expect-compile-error` passes only if it failed to compile (and, when its
  metadata has `expected_error`, only if the compiler's message contains that text);
* any other cell fails on an error output (a compile error, or an error from evcxr itself),
  on anything written to stderr (a panic message, or the error a `?` returned: evcxr prints it
  there with no prefix), and on a panic message anywhere. Tag a cell `allow-stderr` to let it
  write to stderr; it still fails on an error marker there.

Prints one line per cell and `cells: N passed, M failed`; exits 1 if any cell failed.
Without --write the notebooks are not modified; with --write each notebook that passed is
stored back with its fresh outputs.

The kernel is evcxr_jupyter: `--kernel NAME` uses an installed kernel spec; without it a
private spec is written for the `evcxr_jupyter` found in $EVCXR_JUPYTER, on PATH or in
~/.cargo/bin. Needs `pip install nbclient`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

EXPECT_COMPILE_ERROR = "expect-compile-error"
ALLOW_STDERR = "allow-stderr"
# Text that marks an error in a stream output.
ERROR_MARKERS = ("error[E", "error:", "panicked at", "Error:", "Error(")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str) -> str:
    return ANSI.sub("", text)


def find_evcxr_jupyter() -> str | None:
    candidates = [os.environ.get("EVCXR_JUPYTER"), shutil.which("evcxr_jupyter")]
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    candidates.append(str(cargo_home / "bin" / "evcxr_jupyter"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def private_kernel_spec(evcxr: str) -> tuple[str, tempfile.TemporaryDirectory]:
    """Writes a kernel spec named `typed-amp-rust` into a temporary Jupyter path."""
    tmp = tempfile.TemporaryDirectory(prefix="typed-amp-kernels-")
    spec_dir = Path(tmp.name) / "kernels" / "typed-amp-rust"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [evcxr, "--control_file", "{connection_file}"],
        "display_name": "Rust (evcxr)",
        "language": "rust",
        "interrupt_mode": "message",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [tmp.name] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    )
    return "typed-amp-rust", tmp


def rust_lib_dir() -> str | None:
    """The directory of the Rust toolchain's shared libraries (libstd-*.so)."""
    try:
        sysroot = subprocess.run(
            ["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True
        ).stdout.strip()
        host = re.search(
            r"^host: (\S+)$",
            subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout,
            re.M,
        ).group(1)
    except (OSError, subprocess.CalledProcessError, AttributeError):
        return None
    return str(Path(sysroot) / "lib" / "rustlib" / host / "lib")


def first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip():
            return line.strip()[:60]
    return ""


def judge(cell) -> str | None:
    """None if the cell passed, else why it failed."""
    tags = cell.get("metadata", {}).get("tags", [])
    outputs = cell.get("outputs", [])
    errors = [
        plain("\n".join([o.get("evalue", "")] + list(o.get("traceback", []))))
        for o in outputs
        if o.get("output_type") == "error"
    ]
    stderr = plain("".join(o.get("text", "") for o in outputs if o.get("name") == "stderr"))
    stdout = plain("".join(o.get("text", "") for o in outputs if o.get("name") == "stdout"))
    if cell.get("execution_count") is None and not outputs:
        return "not executed"

    if EXPECT_COMPILE_ERROR in tags:
        if not errors:
            return "expected a compile error, but the cell compiled"
        expected = cell.get("metadata", {}).get("expected_error")
        if expected and not any(expected in e for e in errors):
            return f"compile error does not mention {expected!r}: {errors[0].strip()[:200]}"
        return None

    if errors:
        return "error: " + errors[0].strip()[:400]
    if stderr.strip():
        if ALLOW_STDERR not in tags or any(m in stderr for m in ERROR_MARKERS):
            return "stderr: " + stderr.strip()[:400]
    if "panicked at" in stdout:
        return "panic: " + stdout.strip()[:400]
    return None


def run_notebook(path: Path, args, kernel: str, logs: Path, nbformat, NotebookClient):
    """Executes one notebook; returns (passed, failed, executed notebook, crash)."""
    nb = nbformat.read(path, as_version=4)
    # Stored outputs must not pass for fresh ones when the kernel stops early.
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    cwd = Path(args.cwd).resolve() if args.cwd else path.resolve().parent
    client = NotebookClient(
        nb,
        kernel_name=kernel,
        timeout=args.timeout,
        startup_timeout=120,
        allow_errors=True,
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    started = time.monotonic()
    crash = None
    # The kernel's own output (cargo's progress while it builds dependencies) goes to a log.
    log = logs / (path.stem + ".log")
    with open(log, "w") as log_file:
        try:
            client.execute(stdout=log_file, stderr=log_file)
        except Exception as exc:  # a dead kernel or a timeout: the remaining cells did not run
            lines = str(exc).strip().splitlines()
            crash = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        finally:
            atexit.unregister(client._cleanup_kernel)
    seconds = time.monotonic() - started

    print(f"{path.name}  ({seconds:.0f} s)")
    passed = failed = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        problem = judge(cell)
        if problem is None:
            passed += 1
            expected = EXPECT_COMPILE_ERROR in cell.metadata.get("tags", [])
            mark = "  [failed to compile, as expected]" if expected else ""
            print(f"  ok    cell {index:>2}  {first_line(cell.source)}{mark}")
        else:
            failed += 1
            print(f"  FAIL  cell {index:>2}  {first_line(cell.source)}")
            for line in problem.splitlines()[:12]:
                print(f"          {line}")
    if crash:
        print(f"  FAIL  the notebook stopped: {crash}")
        print(f"        kernel log {log}, last lines:")
        for line in log.read_text(errors="replace").splitlines()[-15:]:
            print(f"          {line}")
    return passed, failed, nb, crash


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="default: every *.ipynb beside this script"
    )
    parser.add_argument(
        "--write", action="store_true", help="store fresh outputs in notebooks that pass"
    )
    parser.add_argument(
        "--kernel", help="an installed kernel spec (default: a private one for evcxr_jupyter)"
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell (1200)")
    parser.add_argument(
        "--cwd", help="the kernel's working directory (default: the notebook's directory)"
    )
    args = parser.parse_args()

    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        print("run.py needs nbclient: python3 -m pip install nbclient", file=sys.stderr)
        return 2

    notebooks = args.notebooks or sorted(HERE.glob("*.ipynb"))
    if not notebooks:
        print("no notebooks to run", file=sys.stderr)
        return 2

    kernel, keep_alive = args.kernel, None
    if kernel is None:
        evcxr = find_evcxr_jupyter()
        if evcxr is None:
            print(
                "evcxr_jupyter not found: cargo install --locked evcxr_jupyter@0.22.0 "
                "(or set EVCXR_JUPYTER, or pass --kernel NAME)",
                file=sys.stderr,
            )
            return 2
        kernel, keep_alive = private_kernel_spec(evcxr)

    # init.evcxr beside this script turns on evcxr's cache of compiled dependencies. One build
    # directory for every notebook lets them share the compiled typed-amp (a path dependency,
    # which the cache leaves out). It lies outside the repository (under it, cargo would take
    # evcxr's crate for a stray member of typed-amp's workspace), and the kernel is told where
    # Rust's own shared libraries are: the relative rpath rustc gives evcxr's code points
    # elsewhere when the build directory is not directly under /tmp.
    os.environ["EVCXR_CONFIG_DIR"] = str(HERE)
    build_dir = Path(tempfile.gettempdir()) / "typed-amp-notebooks-evcxr"
    os.environ.setdefault("EVCXR_TMPDIR", str(build_dir))
    Path(os.environ["EVCXR_TMPDIR"]).mkdir(parents=True, exist_ok=True)
    rust_libs = rust_lib_dir()
    if rust_libs:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [rust_libs] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        )
    logs = Path(tempfile.gettempdir()) / "typed-amp-notebooks-logs"
    logs.mkdir(exist_ok=True)

    total_passed = total_failed = 0
    for path in notebooks:
        passed, failed, nb, crash = run_notebook(path, args, kernel, logs, nbformat, NotebookClient)
        total_passed += passed
        total_failed += failed + (1 if crash else 0)
        if args.write:
            if failed or crash:
                print(f"  not written: {path.name} failed")
            else:
                nbformat.write(nb, path)
                print(f"  written: {path}")
    del keep_alive
    print(f"cells: {total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
