"""The session fuzz harness's cases (tests/fuzz/fuzz_cases.py) cover the registry: every
operator of the library has a case generator, and each makes a case of its operator."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "fuzz"))
import fuzz_cases  # noqa: E402


def test_every_operator_of_the_registry_has_a_case_generator(mlu_lib):
    missing = [op for op in fuzz_cases.OPS if op not in fuzz_cases.GENERATORS]
    assert not missing, f"operators without a case generator in tests/fuzz/fuzz_cases.py (GENERATORS): {missing}"
    stale = sorted(set(fuzz_cases.GENERATORS) - set(fuzz_cases.OPS))
    assert not stale, f"case generators of operators the registry lacks: {stale}"
    for op in fuzz_cases.OPS:
        case = fuzz_cases.make_case(1, op, 0)
        assert case.op == op and case.feeds, (op, case)
