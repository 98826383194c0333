"""docs/USAGE.md's Rust example is examples/usage.rs, shown verbatim, and it runs: `cargo run
--example usage` from the repository root (the library of target/release, which the test
command builds first) prints every output of models/bevdepth.onnx; without ORT_DYLIB_PATH
it says so in one line and exits 2, instead of `ort`'s bare `Error: NotPresent`. Its C++
example's link lines for the PyPI wheel's library link and run a program (always), and the
example itself by them when ONNX Runtime's release headers are present (else NOT RUN, said
in pytest's -rs summary)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from conftest import REPO

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


def test_the_example_runs():
    assert (REPO / "target" / "release" / "libonnxruntime_ep_mlu.so").is_file(), "run `cargo build --release --lib` first"
    out = cargo_run(os.environ | {"ORT_DYLIB_PATH": ort_dylib()})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["depth", "bev_feat", "pos_memo", "head"], out.stdout
    assert "bev_feat: float32 [2, 24, 32, 32]" in out.stdout, out.stdout


def test_without_ort_dylib_path_it_says_what_to_set():
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    out = cargo_run(env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ORT_DYLIB_PATH is not set"), out.stderr


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
