"""docs/USAGE.md's Rust example is examples/usage.rs, shown verbatim, and it runs two ways:
`cargo run --example usage` from the repository root (the library of target/release, which
the test command builds first, and models/bevdepth.onnx: its defaults), and USAGE.md's
```sh lines for a pip user, as written, in an empty folder holding only the built example
binary, with `python` the one of the fresh virtual environment into which conftest.py's
`installed_python` pip-installed this checkout's wheel: ONNX Runtime's library, the library
(`get_library_path()`, the wheel's copy inside that environment) and the model
(`models_dir()`, the wheel's models/) all come from there, nothing of the checkout is set.
Each run prints one line, checked against the same model run from Python. A missing path
(ORT_DYLIB_PATH, MLU_EP_LIB, the model) is said in one line naming what to set, exit 2.
Its C++ example's link lines for the PyPI wheel's library link and run a program (always),
and the example itself by them when ONNX Runtime's release headers are present (else NOT
RUN, said in pytest's -rs summary)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from conftest import REPO, user_env

EXAMPLE = REPO / "examples" / "usage.rs"


def ort_dylib() -> str:
    # What scripts/setup.sh exports; computed here too, so pytest alone runs this test.
    lib = Path(onnxruntime.__file__).parent / "capi" / f"libonnxruntime.so.{onnxruntime.__version__}"
    return os.environ.get("ORT_DYLIB_PATH") or str(lib)


def cargo_run(env):
    return subprocess.run(
        ["cargo", "run", "--quiet", "--example", "usage"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )


def test_usage_md_shows_the_example_verbatim():
    blocks = re.findall(r"^```rust\n(.*?)^```", (REPO / "docs" / "USAGE.md").read_text(), re.S | re.M)
    assert EXAMPLE.read_text() in blocks, "docs/USAGE.md's ```rust block is not examples/usage.rs"


def bev_feat_line(python, lib: str, model: str, cwd) -> str:
    """The example's line computed from Python by `python`: the model on the example's inputs
    (made by the same formulas) through the custom-op library."""
    code = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "so = ort.SessionOptions(); so.register_custom_ops_library(sys.argv[1])\n"
        "sess = ort.InferenceSession(sys.argv[2], so)\n"
        "i = np.arange(4 * 32 * 8 * 22)\n"
        "img = ((i * 7919 % 1000).astype(np.float32) / np.float32(1000) - np.float32(0.5)).reshape(4, 32, 8, 22)\n"
        "p = np.arange(2 * 5632)\n"
        "geom = np.stack([p % 34 - 1, p // 34 % 34 - 1, 0 * p], 1).astype(np.int32).reshape(2, 5632, 3)\n"
        "outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {'img_feats': img, 'geom_xyz': geom})))\n"
        "bev = outs['bev_feat']\n"
        "print(f'bev_feat: float32 {list(bev.shape)}, sum of |x| {np.abs(bev.astype(np.float64)).sum():.3f}')\n"
    )
    p = subprocess.run([str(python), "-c", code, lib, model], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout


def assert_the_line(stdout: str, want: str):
    # One line; the sum to 3 decimals may differ in the last digit only (f64 sums in another
    # order), so it is compared as a number.
    head, _, value = stdout.rstrip("\n").rpartition(" ")
    want_head, _, want_value = want.rstrip("\n").rpartition(" ")
    assert stdout.count("\n") == 1 and head == want_head, (stdout, want)
    assert head == "bev_feat: float32 [2, 24, 32, 32], sum of |x|", stdout
    assert abs(float(value) - float(want_value)) <= 2e-3 and float(value) > 0, (stdout, want)


def test_the_example_runs():
    lib = REPO / "target" / "release" / "libonnxruntime_ep_mlu.so"
    assert lib.is_file(), "run `cargo build --release --lib` first"
    out = cargo_run(os.environ | {"ORT_DYLIB_PATH": ort_dylib()})
    assert out.returncode == 0, out.stdout + out.stderr
    assert_the_line(out.stdout, bev_feat_line(sys.executable, str(lib), str(REPO / "models" / "bevdepth.onnx"), REPO))


def test_without_ort_dylib_path_it_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    out = cargo_run(env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ORT_DYLIB_PATH is not set"), out.stderr


@pytest.fixture(scope="module")
def example_binary() -> Path:
    """The example built by cargo (as `cargo_run` builds it), run below as a plain program."""
    out = subprocess.run(["cargo", "build", "--quiet", "--example", "usage", "--message-format=json"], cwd=REPO,
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr
    (exe,) = [m["executable"] for m in map(json.loads, out.stdout.splitlines())
              if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "usage" and m.get("executable")]
    return Path(exe)


def pip_lines() -> str:
    """docs/USAGE.md's ```sh block for a pip user: the one that runs `./usage`."""
    text = (REPO / "docs" / "USAGE.md").read_text()
    (block,) = [b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if "./usage \"" in b]
    return block


def test_usage_mds_pip_lines_run_the_example_from_an_empty_folder(installed_python, example_binary, tmp_path):
    lines = pip_lines()
    assert "get_library_path()" in lines and "MLU_EP_LIB" in lines, lines
    folder = tmp_path / "empty"
    folder.mkdir()
    shutil.copy(example_binary, folder / "usage")
    # user_env: no ORT_DYLIB_PATH, MLU_EP_LIB, PYTHONPATH; `python` is the installed one.
    env = user_env() | {"PATH": f"{installed_python.parent}:{os.environ['PATH']}"}
    script = lines + 'echo "MLU_EP_LIB=$MLU_EP_LIB"\n'
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    *result, used = out.stdout.splitlines(keepends=True)
    # The library is the wheel's, inside the installed environment, not the checkout's.
    venv = installed_python.parent.parent
    lib = used.strip().removeprefix("MLU_EP_LIB=")
    assert lib.startswith(str(venv)) and lib.endswith("/onnxruntime_ep_mlu/libonnxruntime_ep_mlu.so"), used
    model = subprocess.run([installed_python, "-c", "import onnxruntime_ep_mlu as m; print(m.models_dir() / 'bevdepth.onnx')"],
                           cwd=folder, env=user_env(), capture_output=True, text=True).stdout.strip()
    assert model.startswith(str(venv)), model
    assert_the_line("".join(result), bev_feat_line(installed_python, lib, model, folder))
    assert sorted(p.name for p in folder.iterdir()) == ["usage"], "the example wrote into its folder"


@pytest.mark.parametrize("missing", ["ORT_DYLIB_PATH", "MLU_EP_LIB", "model"])
def test_from_an_empty_folder_a_missing_path_is_named(installed_python, example_binary, tmp_path, missing):
    """Outside the repository the defaults do not exist: each missing path is said in one
    line naming what to set and the Python line that gives it, exit 2 (no panic)."""
    env = user_env() | {"ORT_DYLIB_PATH": ort_dylib(), "MLU_EP_LIB": str(REPO / "target" / "release" / "libonnxruntime_ep_mlu.so")}
    args = [str(REPO / "models" / "bevdepth.onnx")]
    if missing == "model":
        args = []
    else:
        del env[missing]
    out = subprocess.run([example_binary, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "panicked" not in out.stderr, out.stderr
    want = {
        "ORT_DYLIB_PATH": "error: ORT_DYLIB_PATH is not set: set it to ONNX Runtime's libonnxruntime.so",
        "MLU_EP_LIB": f"error: no MLU_EP_LIB given, and no target/release/libonnxruntime_ep_mlu.so in {tmp_path}: "
        "set MLU_EP_LIB to libonnxruntime_ep_mlu.so's path, e.g. the pip package's "
        "`python -c 'import onnxruntime_ep_mlu as m; print(m.get_library_path())'`",
        "model": f"error: no model argument given, and no models/bevdepth.onnx in {tmp_path}: give bevdepth.onnx's "
        "path as the first argument",
    }[missing]
    assert out.stderr.startswith(want), out.stderr
    # The Python line the message gives works with the installed package.
    if missing != "ORT_DYLIB_PATH":
        code = re.search(r"`python -c '(.*)'`", out.stderr).group(1)
        p = subprocess.run([installed_python, "-c", code], cwd=tmp_path, env=user_env(), capture_output=True, text=True)
        assert p.returncode == 0 and Path(p.stdout.strip()).is_file(), p.stdout + p.stderr


# ----------------------------------------------------------------------------- C++
def cpp_blocks():
    """docs/USAGE.md's first ```cpp block (the complete program) and the ```sh block that
    links it against the PyPI wheel's library."""
    text = (REPO / "docs" / "USAGE.md").read_text()
    program = re.findall(r"^```cpp\n(.*?)^```", text, re.S | re.M)[0]
    (wheel,) = [b for b in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M) if "ortlib" in b]
    return program, wheel


def run_sh(script, cwd, env):
    # The venv's python first: the block finds the wheel through `python3`.
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env | {"PATH": path},
                          capture_output=True, text=True, timeout=600)


#: ONNX Runtime's entry point as its public header declares it (onnxruntime_c_api.h, struct
#: OrtApiBase: GetApi, then GetVersionString), so the link needs no header.
PROBE = """#include <cstdint>
#include <cstdio>
struct OrtApiBase {
  const void* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};
extern "C" const OrtApiBase* OrtGetApiBase();
int main() { std::printf("onnxruntime %s\\n", OrtGetApiBase()->GetVersionString()); }
"""


def test_usage_mds_wheel_link_lines_link_a_program_against_the_wheels_library(tmp_path):
    """The wheel's link recipe, always: the block with the example swapped for a program
    that needs no ONNX Runtime header (the g++ line's flags otherwise as written)."""
    _, wheel = cpp_blocks()
    (tmp_path / "probe.cpp").write_text(PROBE)
    script = wheel.replace('usage.cpp -I"$ORT/include"', "probe.cpp").replace("-o usage && ./usage", "-o probe && ./probe")
    assert "probe.cpp" in script and "./probe" in script, wheel
    out = run_sh(script, tmp_path, dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == f"onnxruntime {onnxruntime.__version__}\n", out.stdout


def test_usage_mds_cpp_example_against_the_release_headers(tmp_path):
    """The complete C++ program, built by the wheel's link lines as written, run from a
    folder that sees the repository's target/ and models/ (its relative paths), when `ORT`
    names an unpacked release tarball; otherwise reported as NOT RUN (pytest -rs)."""
    ort = os.environ.get("ORT")
    header = Path(ort or "/nonexistent") / "include" / "onnxruntime_cxx_api.h"
    if not header.is_file():
        pytest.skip(
            f"C++ example NOT RUN: {'ORT is not set' if ort is None else f'no {header}'}; no package registry "
            f"ships ONNX Runtime's headers (docs/USAGE.md): set ORT to an unpacked "
            f"onnxruntime-linux-x64-{onnxruntime.__version__}.tgz to run it"
        )
    assert (REPO / "target" / "release" / "libonnxruntime_ep_mlu.so").is_file(), "run `cargo build --release --lib` first"
    program, wheel = cpp_blocks()
    (tmp_path / "usage.cpp").write_text(program)
    for name in ("target", "models"):
        (tmp_path / name).symlink_to(REPO / name)
    out = run_sh(wheel, tmp_path, dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "bev_feat: 49152 values\n", out.stdout
