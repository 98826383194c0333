"""`python -m onnxruntime_ep_mlu.regression` as a user runs it:

- from the installed wheel, in an empty folder: `--generate` uses the packaged zoo with no
  `--zoo` (python/README's command verbatim); frames written with `--write-frames` are read
  back by `--frames` alone, even with the zoo out of reach;
- every wrong argument ends in exit status 2 and one line on stderr that names the option or
  file to fix, never a traceback (these run the checkout's package: they need no wheel).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, user_env

MODULE = ["-m", "onnxruntime_ep_mlu.regression"]


def run_installed(python, args, cwd):
    return subprocess.run([python, *MODULE, *args], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=900)


def test_generate_uses_the_packaged_zoo(installed_python, tmp_path):
    out = run_installed(installed_python, ["--generate", "20"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 model(s): pointpillars, centerpoint, bevdepth, pointnet2_fp, rfcn_head; 20 generated frames" in out.stdout
    assert "every frame matches its reference on every path" in out.stdout


def test_written_frames_are_read_back_alone(installed_python, tmp_path):
    frames = tmp_path / "frames"
    out = run_installed(installed_python, ["--generate", "3", "--models", "bevdepth,rfcn_head", "--write-frames", "frames"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    for model in ("bevdepth", "rfcn_head"):
        assert sorted(p.name for p in (frames / model).iterdir()) == [
            "gen-0-00000.npz", "gen-0-00001.npz", "gen-0-00002.npz", "model.onnx", "tolerances.json",
        ]  # fmt: skip
    # A zoo that does not exist: the folder must not need one.
    out = run_installed(installed_python, ["--frames", "frames"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 model(s): bevdepth, rfcn_head; 6 frames from frames" in out.stdout
    assert "every frame matches its reference on every path" in out.stdout
    # The written tolerances are used: a golden off by 1% fails the zoo frame.
    first = frames / "rfcn_head" / "gen-0-00000.npz"
    arrays = dict(np.load(first))
    arrays["out.cls_score"] = arrays["out.cls_score"] * np.float32(1.01)
    np.savez(first, **arrays)
    out = run_installed(installed_python, ["--frames", "frames"], tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL gen-0-00000" in out.stdout and "cls_score" in out.stdout, out.stdout


def test_a_missing_zoo_file_is_named_by_the_installed_command(installed_python, tmp_path):
    out = run_installed(installed_python, ["--generate", "2", "--zoo", "nowhere/zoo.json"], tmp_path)
    assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "--zoo nowhere/zoo.json: file not found" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("frames")
    (root / "empty").mkdir()
    (root / "unknown" / "mystery").mkdir(parents=True)
    (root / "noframes" / "bevdepth").mkdir(parents=True)
    (root / "badtol" / "bevdepth").mkdir(parents=True)
    (root / "badtol" / "bevdepth" / "tolerances.json").write_text("{")
    (root / "zoo.json").write_text('{"models": {"a": {"model": "a.onnx", "data": "a.npz", "outputs": {}}}}')
    (root / "notzoo.json").write_text("[")
    (root / "noref.py").write_text("def other(model, inputs):\n    return {}\n")
    return root


# (arguments, what the one line must say). {d}: the folder of the `folders` fixture.
ERRORS = [
    (["--zoo", "{d}/missing.json"], "--zoo {d}/missing.json: file not found"),
    (["--zoo", "{d}/notzoo.json"], "is not a zoo.json"),
    (["--zoo", "{d}/zoo.json"], "{d}/a.onnx, the model file of 'a' in {d}/zoo.json, not found"),
    (["--frames", "{d}/missing"], "--frames {d}/missing: frame folder {d}/missing not found"),
    (["--frames", "{d}/empty"], "has no model folders"),
    (["--frames", "{d}/unknown"], "has no model.onnx, and 'mystery' is not a model of the zoo"),
    (["--frames", "{d}/noframes"], "no .npz frames"),
    (["--frames", "{d}/badtol"], "tolerances.json is not JSON"),
    (["--frames", "{d}/unknown", "--models", "bevdepth"], "no folder for model(s) ['bevdepth']"),
    (["--generate", "2", "--models", "nosuch"], "--models: no model nosuch in"),
    (["--generate", "0"], "argument --generate: a positive integer, not '0'"),
    (["--generate", "many"], "argument --generate: a positive integer, not 'many'"),
    (["--workers", "1,x"], "--workers takes positive counts"),
    (["--paths", "gpu"], "--paths takes cpu and/or mlu"),
    (["--library", "{d}/nolib.so"], "--library {d}/nolib.so: file not found"),
    (["--runtime-env", "{", "--ray"], "--runtime-env takes a JSON object"),
    (["--runtime-env", "{}"], "--runtime-env is for Ray runs"),
    (["--frames", "{d}/empty", "--write-frames", "{d}/out"], "--write-frames writes generated frames"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["--generate", "1", "--reference", "{d}/nosuch.py"], "--reference {d}/nosuch.py: "),
    (["--generate", "1", "--reference", "{d}/zoo.json"], "--reference {d}/zoo.json: not a Python file"),
    (["--generate", "1", "--reference", "{d}/noref.py"], "defines no goldens(model, inputs) function"),
]


@pytest.mark.parametrize(("args", "says"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_a_user_error_is_one_line_naming_what_to_pass(folders, mlu_lib, args, says):
    env = user_env() | {"PYTHONPATH": str(REPO / "python"), "MLU_EP_LIB": str(mlu_lib)}
    args = [a.replace("{d}", str(folders)) for a in args]
    out = subprocess.run([sys.executable, *MODULE, *args], env=env, cwd=folders, capture_output=True, text=True, timeout=300)
    says = says.replace("{d}", str(folders))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "", out.stdout + out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("python -m onnxruntime_ep_mlu.regression: error: ") and says in out.stderr, out.stderr


def test_no_library_is_one_line_too(folders):
    # A package without its library (the checkout's, with MLU_EP_LIB naming nothing).
    env = user_env() | {"PYTHONPATH": str(REPO / "python"), "MLU_EP_LIB": str(folders / "gone.so")}
    out = subprocess.run([sys.executable, *MODULE, "--generate", "1"], env=env, cwd=folders, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "MLU_EP_LIB" in out.stderr and "or pass --library" in out.stderr, out.stderr


def test_generated_frames_with_an_independent_reference_check_the_cpu_path(mlu_lib, tmp_path):
    """--reference: generated frames 1.. carry the numpy models' goldens, so the CPU path is
    compared with them (not with itself): a reference that differs in one element fails the
    CPU path's frames, the checkout's numpy models pass them."""
    env = user_env() | {"PYTHONPATH": str(REPO / "python"), "MLU_EP_LIB": str(mlu_lib)}
    zoo_goldens = REPO / "models" / "make_zoo_goldens.py"
    off_by_one = tmp_path / "off_by_one.py"
    off_by_one.write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('z', {str(zoo_goldens)!r})\n"
        "z = importlib.util.module_from_spec(spec); spec.loader.exec_module(z)\n"
        "def goldens(model, inputs):\n"
        "    out = z.goldens(model, inputs)\n"
        "    out['head'] = out['head'].copy(); out['head'].flat[7] += 1.0\n"
        "    return out\n"
    )
    args = ["--generate", "3", "--models", "bevdepth", "--paths", "cpu"]
    good = subprocess.run([sys.executable, *MODULE, *args, "--reference", str(zoo_goldens)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert good.returncode == 0 and f"frames 1..: goldens of {zoo_goldens}" in good.stdout, good.stdout + good.stderr
    bad = subprocess.run([sys.executable, *MODULE, *args, "--reference", str(off_by_one)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL gen-0-00001" in bad.stdout and "FAIL gen-0-00002" in bad.stdout and "FAIL gen-0-00000" not in bad.stdout, bad.stdout
