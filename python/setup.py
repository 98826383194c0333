"""Build steps of the wheel (the metadata is in pyproject.toml).

``pip install ./python`` (or ``pip wheel ./python``) runs ``cargo build --release --lib
--example mluops_emulated`` on the crate at the repository root and copies the
``libonnxruntime_ep_mlu.so`` cargo reports into the package, where
``onnxruntime_ep_mlu.get_library_path()`` finds it. The wheel is tagged
``py3-none-<platform>`` (``linux_x86_64`` here; scripts/wheel.sh retags it
``manylinux_2_35_x86_64`` after auditwheel's check): it holds a native library but no
Python extension, so it fits every Python 3 on that platform and no other platform.

An editable install (``pip install -e python``) builds nothing: the package then finds the
checkout's ``target/release`` or ``target/debug`` library.

The same build step copies the demo model and the model zoo from the repository's
``models/`` into the package's ``models/`` folder (``onnxruntime_ep_mlu.demo_model()``,
``demo_inputs()``, ``zoo()`` find them there), so the examples run from any folder; they are
read from ``models/`` at every build, never kept as a second copy in git.

It also builds the emulated MLU-OPS library (``cargo build --example mluops_emulated``, in the
same cargo command) into the package as ``libmluops_emulated.so``: the emulated card's
stand-in for Cambricon's libmluops.so, which ``register_execution_provider(emulate=True)``
names when no real MLU-OPS library is named (``onnxruntime_ep_mlu.emulated_mluops_path()``).

pip shows a build's output only with ``-v``, so the build step also writes what it is doing
(building the Rust library, about how long, where) to the terminal (``/dev/tty``) when there
is one. cargo builds into ``CARGO_TARGET_DIR`` when set, else into the checkout's ``target/``
when it already exists (the README's ``cargo build`` made it; a warm one rebuilds nothing),
else into a temporary folder removed after the build; setuptools' ``build/`` and
``*.egg-info`` go to a temporary folder too, so a plain ``pip install ./python`` leaves
nothing in the checkout.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
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
EMULATED_MLUOPS = "libmluops_emulated.so"
EMULATED_TARGET = "mluops_emulated"
MODELS = ROOT / "models"
DEMO_FILES = ("mluops_demo.onnx", "mluops_demo.npz")


def model_files() -> list[Path]:
    """The files of models/ the package carries: the demo model and its data, zoo.json and
    every model and data file it names (read from zoo.json, so a model added to the zoo is
    packaged without touching this file)."""
    zoo_json = MODELS / "zoo.json"
    if not zoo_json.is_file():
        raise SystemExit(f"error: {zoo_json} not found: the wheel is built from the repository checkout")
    zoo = json.loads(zoo_json.read_text())["models"]
    names = [*DEMO_FILES, "zoo.json"] + [spec[key] for spec in zoo.values() for key in ("model", "data")]
    files = [MODELS / n for n in dict.fromkeys(names)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise SystemExit(f"error: models/ lacks {', '.join(missing)}")
    return files


def say(message: str) -> None:
    """To the build's output (``pip -v``, logs) and, when there is one, to the terminal:
    without ``-v`` pip shows a build's output only when it fails."""
    line = f"onnxruntime-ep-mlu: {message}"
    print(line, flush=True)
    try:
        with open("/dev/tty", "w") as tty:
            tty.write("\n" + line + "\n")  # off the line of pip's spinner
    except OSError:  # no controlling terminal (CI, a pipe): the build's output has it
        pass


def target_dir() -> tuple[Path, bool]:
    """Where cargo builds, and whether that folder is ours to remove afterwards (see the
    module's docstring)."""
    env = os.environ.get("CARGO_TARGET_DIR")
    if env:
        return Path(env), False
    if (ROOT / "target").is_dir():
        return ROOT / "target", False
    return Path(tempfile.mkdtemp(prefix="onnxruntime-ep-mlu-target-")), True


def cargo_build(target: Path) -> dict[str, Path]:
    """Runs ``cargo build --release --lib --example mluops_emulated`` on the repository's
    crate into ``target`` and returns ``{file name: path}`` of the two shared libraries it
    built (read from cargo's JSON messages)."""
    manifest = ROOT / "Cargo.toml"
    if not manifest.is_file():
        raise SystemExit(
            f"error: {manifest} not found: the wheel is built from the repository checkout "
            "(pip install ./python, or pip wheel ./python, from the repository root)"
        )
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo) is None:
        raise SystemExit(
            f"error: {cargo!r} not found on PATH: building the package from source compiles the library with Rust "
            "(>= 1.89, https://rustup.rs) and a C++17 compiler; scripts/wheel.sh builds a binary wheel that "
            "installs without them"
        )
    cmd = [cargo, "build", "--release", "--lib", "--example", EMULATED_TARGET, "--manifest-path", str(manifest),
           "--message-format=json-render-diagnostics"]
    warm = (target / "release" / LIBRARY).is_file()
    say(f"building the Rust library ({' '.join(cmd[:6])}) into {target}: "
        + ("a warm build, seconds" if warm else "from scratch, about 2 to 5 minutes on 2 cores"))
    start = time.monotonic()
    # stdout carries cargo's JSON messages; its progress and diagnostics go to stderr.
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False,
                          env={**os.environ, "CARGO_TARGET_DIR": str(target)})
    if proc.returncode != 0:
        raise SystemExit(f"error: cargo build failed (exit status {proc.returncode}); its output is above")
    built = {}
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        name = (msg.get("target") or {}).get("name")
        if msg.get("reason") == "compiler-artifact" and name in (CRATE_TARGET, EMULATED_TARGET):
            built.update({Path(f).name: Path(f) for f in msg.get("filenames", []) if Path(f).name in (LIBRARY, EMULATED_MLUOPS)})
    missing = {LIBRARY, EMULATED_MLUOPS} - built.keys()
    if missing:
        raise SystemExit(f"error: cargo build reported no {', '.join(sorted(missing))}")
    say(f"built in {time.monotonic() - start:.0f} s")
    return built


class BuildPyWithLibrary(build_py):
    """build_py, then the Rust library and models/'s demo and zoo files into the package (not
    in editable mode: the package then reads the checkout's target/ and models/)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            print(f"onnxruntime-ep-mlu: editable install: no {LIBRARY} built into the package; "
                  "get_library_path() finds the checkout's target/release or target/debug build")
            return
        target, temporary = target_dir()
        try:
            for name, library in cargo_build(target).items():
                dest = Path(self.build_lib) / PACKAGE / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(library, dest)
                os.chmod(dest, 0o755)
                print(f"onnxruntime-ep-mlu: {library} -> {dest}", flush=True)
        finally:
            if temporary:
                shutil.rmtree(target, ignore_errors=True)
        models = Path(self.build_lib) / PACKAGE / "models"
        # A fresh folder each build: a file dropped from the zoo must not linger in build/.
        shutil.rmtree(models, ignore_errors=True)
        models.mkdir(parents=True)
        for f in model_files():
            shutil.copyfile(f, models / f.name)
        print(f"onnxruntime-ep-mlu: {MODELS} (demo model and zoo, {len(model_files())} files) -> {models}", flush=True)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs += [str(Path(self.build_lib) / PACKAGE / name) for name in (LIBRARY, EMULATED_MLUOPS)]
            outputs += [str(Path(self.build_lib) / PACKAGE / "models" / f.name) for f in model_files()]
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


# build/ and *.egg-info outside the checkout (see the module's docstring), removed when this
# build step's process ends (pip runs each step in a process of its own).
_scratch = tempfile.mkdtemp(prefix="onnxruntime-ep-mlu-build-")
atexit.register(shutil.rmtree, _scratch, True)
setup(
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
    options={"build": {"build_base": os.path.join(_scratch, "build")}, "egg_info": {"egg_base": _scratch}},
)
