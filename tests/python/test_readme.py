"""Every ```python snippet of README.md, docs/USAGE.md and python/README.md runs verbatim,
each on its own (no name carried over from another snippet), in a new process started in an
empty folder, against the wheel of this checkout installed by pip (the `installed_python`
fixture of conftest.py): what a user who ran `pip install ./python` and left the checkout
gets. README.md's and docs/USAGE.md's snippets print a one-line result, and none says "not
found" (the emulated card has the packaged emulated libmluops; the user named nothing
missing)."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO, user_env

DOCS = ("README.md", "docs/USAGE.md", "python/README.md")
#: The documents whose snippets each print one line: the result a user sees.
ONE_LINE = ("README.md", "docs/USAGE.md")
# The snippets each document must have at least: a wrong fence (```py, ```Python) must not
# make a snippet silently drop out of this test.
AT_LEAST = {"README.md": 2, "docs/USAGE.md": 5, "python/README.md": 3}


def snippets(doc: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / doc).read_text(), re.S | re.M)


CASES = [(doc, i, code) for doc in DOCS for i, code in enumerate(snippets(doc), 1)]


def test_the_readmes_have_their_snippets():
    for doc, least in AT_LEAST.items():
        fences = re.findall(r"^```(\S*)", (REPO / doc).read_text(), re.M)
        # Every Python-looking fence is a ```python one (only those are run here).
        assert not [f for f in fences if f.lower().startswith("py") and f != "python"], (doc, fences)
        assert len(snippets(doc)) >= least, f"{doc}: {len(snippets(doc))} ```python snippets, expected {least} or more"


def test_the_installed_package_is_the_wheel_not_the_checkout(installed_python, tmp_path):
    code = (
        "import onnxruntime_ep_mlu as m\n"
        "print(m.__file__); print(m.get_library_path()); print(m.demo_model()); print(m.zoo())\n"
    )
    p = subprocess.run([installed_python, "-c", code], cwd=tmp_path, env=user_env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    venv = installed_python.parent.parent
    paths = p.stdout.split()
    assert len(paths) == 4 and all(path.startswith(str(venv)) for path in paths), paths
    assert not any(path.startswith(str(REPO)) for path in paths), paths


@pytest.mark.parametrize(("doc", "index", "code"), CASES, ids=[f"{doc}#{i}" for doc, i, _ in CASES])
def test_snippet_runs_on_its_own_from_an_empty_folder(installed_python, tmp_path, doc, index, code):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    cwd = tmp_path / "empty"
    cwd.mkdir()
    p = subprocess.run(
        [installed_python, script], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, f"{doc} snippet {index} failed (exit status {p.returncode}):\n{code}\n{p.stderr[-3000:]}"
    assert "not found" not in (p.stdout + p.stderr).lower(), f"{doc} snippet {index}:\n{p.stdout}\n{p.stderr[-3000:]}"
    if doc in ONE_LINE:
        assert len(p.stdout.splitlines()) == 1, f"{doc} snippet {index} printed {p.stdout!r}, not one line"


def test_the_placement_warnings_are_as_the_readme_says(installed_python, tmp_path):
    # README: a provider session warns "Some nodes were not assigned ..." and
    # log_severity_level = 3 quiets it.
    code = (
        "import sys, onnxruntime as ort, onnxruntime_ep_mlu as mlu\n"
        "so = ort.SessionOptions()\n"
        "if sys.argv[1] != 'default': so.log_severity_level = int(sys.argv[1])\n"
        "so.add_provider_for_devices(mlu.register_execution_provider(emulate=True), {})\n"
        "ort.InferenceSession(mlu.demo_model(), so).run(None, mlu.demo_inputs())\n"
    )
    warning = "Some nodes were not assigned to the preferred execution providers"
    for level, warns in (("default", True), ("3", False)):
        p = subprocess.run([installed_python, "-c", code, level], cwd=tmp_path, env=user_env(), capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert (warning in p.stderr) == warns, (level, p.stderr)


def test_the_emulated_card_gets_the_packaged_libmluops_unless_one_is_named(installed_python, tmp_path):
    # README: emulate=True names the packaged emulated libmluops in MLU_EP_MLUOPS_LIBRARY
    # unless the user named a library (that variable, MLUOPS_HOME, NEUWARE_HOME);
    # emulate=False takes back only what it set.
    code = (
        "import os, onnxruntime_ep_mlu as mlu\n"
        "mlu.register_execution_provider(emulate=True)\n"
        "print(os.environ.get('MLU_EP_MLUOPS_LIBRARY'), mlu.emulated_mluops_path())\n"
        "mlu.register_execution_provider(emulate=False)\n"
        "print(os.environ.get('MLU_EP_MLUOPS_LIBRARY'))\n"
    )
    base = {k: v for k, v in user_env().items() if k not in ("MLU_EP_MLUOPS_LIBRARY", "MLUOPS_HOME", "NEUWARE_HOME")}
    venv = str(installed_python.parent.parent)
    for named, want in (
        ({}, None),
        ({"MLUOPS_HOME": "/opt/mluops"}, "None"),
        ({"MLU_EP_MLUOPS_LIBRARY": "/opt/mluops/lib64/libmluops.so"}, "/opt/mluops/lib64/libmluops.so"),
    ):
        p = subprocess.run([installed_python, "-c", code], cwd=tmp_path, env={**base, **named}, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        (set_, packaged), (after,) = (line.split() for line in p.stdout.splitlines())
        assert packaged.startswith(venv) and packaged.endswith("/libmluops_emulated.so"), packaged
        assert set_ == (packaged if want is None else want), (named, p.stdout)
        assert after == ("None" if want is None else want), (named, p.stdout)
