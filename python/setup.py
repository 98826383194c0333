"""Build steps of the wheel (the metadata is in pyproject.toml).

``pip install ./python`` (or ``pip wheel ./python``) runs ``cargo build --release --lib`` on
the crate at the repository root, exactly the command of the README and scripts/run.sh, so a
warm ``target/`` (or ``CARGO_TARGET_DIR``) rebuilds nothing, and copies the
``libonnxruntime_ep_mlu.so`` cargo reports into the package, where
``onnxruntime_ep_mlu.get_library_path()`` finds it. The wheel is tagged
``py3-none-<platform>`` (``linux_x86_64`` here): it holds a native library but no Python
extension, so it fits every Python 3 on that platform and no other platform.

An editable install (``pip install -e python``) builds nothing: the package then finds the
checkout's ``target/release`` or ``target/debug`` library.

cargo's progress goes to the build's output: ``pip install -v ./python`` shows it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools with the `wheel` package
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGE = "onnxruntime_ep_mlu"
LIBRARY = "libonnxruntime_ep_mlu.so"
CRATE_TARGET = "onnxruntime_ep_mlu"


def cargo_build() -> Path:
    """Runs ``cargo build --release --lib`` on the repository's crate and returns the path
    of the cdylib cargo built (read from cargo's JSON messages, so CARGO_TARGET_DIR and
    build.target-dir are honoured)."""
    manifest = ROOT / "Cargo.toml"
    if not manifest.is_file():
        raise SystemExit(
            f"error: {manifest} not found: the wheel is built from the repository checkout "
            "(pip install ./python, or pip wheel ./python, from the repository root)"
        )
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo) is None:
        raise SystemExit(
            f"error: {cargo!r} not found on PATH: building the wheel compiles the library with Rust "
            "(>= 1.89, https://rustup.rs) and a C++20 compiler"
        )
    cmd = [cargo, "build", "--release", "--lib", "--manifest-path", str(manifest), "--message-format=json-render-diagnostics"]
    print("onnxruntime-ep-mlu:", " ".join(cmd[:4]), "(in", ROOT, ")", flush=True)
    # stdout carries cargo's JSON messages; its progress and diagnostics go to stderr.
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"error: cargo build failed (exit status {proc.returncode}); its output is above")
    built = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        target = msg.get("target") or {}
        if msg.get("reason") == "compiler-artifact" and target.get("name") == CRATE_TARGET and "cdylib" in target.get("kind", []):
            built += [Path(f) for f in msg.get("filenames", []) if Path(f).name == LIBRARY]
    if not built:
        raise SystemExit(f"error: cargo build reported no {LIBRARY}")
    return built[-1]


class BuildPyWithLibrary(build_py):
    """build_py, then the Rust library into the package (not in editable mode)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            print(f"onnxruntime-ep-mlu: editable install: no {LIBRARY} built into the package; "
                  "get_library_path() finds the checkout's target/release or target/debug build")
            return
        library = cargo_build()
        dest = Path(self.build_lib) / PACKAGE / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, dest)
        os.chmod(dest, 0o755)
        print(f"onnxruntime-ep-mlu: {library} -> {dest}", flush=True)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(str(Path(self.build_lib) / PACKAGE / LIBRARY))
        return outputs


class NativeDistribution(Distribution):
    """Holds native code (the library), though no Python extension: installed into platlib,
    and its wheel is not pure (Root-Is-Purelib: false)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A platform wheel for any Python 3: py3-none-<platform> (the library does not use the
    Python C API, so neither the interpreter nor its ABI matters)."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
