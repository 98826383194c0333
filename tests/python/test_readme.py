"""The README's Python snippets run as written, in order, from the repository root (the
files they name are the checkout's), with the package importable as a user who ran
`pip install ./python` has it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO


def test_the_readme_snippets_run_as_written(mlu_lib, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) >= 2, "the README shows the CPU path and the provider"
    script = tmp_path / "readme.py"
    # The snippets as one program, then a check that both sessions really ran.
    script.write_text("\n".join(blocks) + "\nassert len(outputs) == len(sess.get_outputs())\nprint('ok')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MLU_EP_EMULATE",)}
    env["PYTHONPATH"] = str(REPO / "python")
    env["MLU_EP_LIB"] = str(mlu_lib)
    p = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]
