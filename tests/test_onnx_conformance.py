"""ONNX's backend test suite (the data shipped in the pinned onnx wheel) through mlcpack.

Every case listed in ``tests/conformance/passing.txt`` must still pass (export, run, match within
the suite's tolerances). Every other case must be refused cleanly (a one-line ``ExportError``),
or be a known numeric failure listed in ``docs/conformance.md`` — never crash. Regenerate the
list and the report with ``python tests/conformance/harness.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "conformance"))

from harness import FAILING_LIST, PASSING_LIST, discover, run_case  # noqa: E402

CASES = {c.key: c for c in discover()}
PASSING = [k for k in PASSING_LIST.read_text().split() if k] if PASSING_LIST.is_file() else []
OTHERS = sorted(set(CASES) - set(PASSING))
# Known wrong-number cases (see docs/conformance.md); kept visible, not run in CI.
KNOWN_FAILURES = set(FAILING_LIST.read_text().split()) if FAILING_LIST.is_file() else set()
# Light model-zoo models take seconds each (224x224 convolutions); one is enough in CI.
SLOW = {"light/test_vgg19", "light/test_densenet121", "light/test_inception_v1",
        "light/test_inception_v2", "light/test_resnet50", "light/test_bvlc_alexnet",
        "light/test_zfnet512", "light/test_shufflenet"}


def test_passing_list_names_real_cases() -> None:
    assert PASSING, "tests/conformance/passing.txt is missing: run tests/conformance/harness.py"
    assert not set(PASSING) - set(CASES)


@pytest.mark.parametrize("key", [k for k in PASSING if k not in SLOW])
def test_conformance_case_passes(key: str, tmp_path: Path) -> None:
    result = run_case(CASES[key], tmp_path)
    assert result.status == "passed", result.reason


@pytest.mark.parametrize("key", [k for k in OTHERS if k not in KNOWN_FAILURES and k not in SLOW])
def test_conformance_case_refused_cleanly(key: str, tmp_path: Path) -> None:
    result = run_case(CASES[key], tmp_path)
    if result.status == "passed":
        return  # better than recorded: regenerate passing.txt
    assert result.status == "unsupported", f"{key} failed instead of being refused: {result.reason}"
    assert "\n" not in result.reason
