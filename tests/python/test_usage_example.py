"""docs/USAGE.md's Rust example is examples/usage.rs, shown verbatim, and it runs: `cargo run
--example usage` from the repository root (the library of target/release, which the test
command builds first) prints every output of models/bevdepth.onnx; without ORT_DYLIB_PATH
it says so in one line and exits 2, instead of `ort`'s bare `Error: NotPresent`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import onnxruntime

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
