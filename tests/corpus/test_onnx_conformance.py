"""ONNX's backend test suite (the data shipped in the pinned onnx wheel) through mlcpack.

Every case listed in ``tests/conformance/passing.txt`` must still pass (export, run, match within
the suite's tolerances), binding as constants exactly the inputs ``frozen.txt`` records for it
(a converter that starts demanding a constant fails here). Every other case must be refused
cleanly (a one-line ``ExportError``), or be a known numeric failure listed in
``docs/conformance.md`` — never crash. The model-zoo networks that take tens of seconds each
run in ``test_onnx_model_zoo.py`` under the ``slow`` marker (CI runs them, in the other
xdist worker; ``-m "not slow"`` leaves them out locally). Regenerate
the lists and the report with ``python tests/conformance/harness.py`` (``--frozen-only``: just
``frozen.txt`` and the table, in seconds).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))

from harness import FAILING_LIST, PASSING_LIST, discover, read_frozen, run_case  # noqa: E402

CASES = {c.key: c for c in discover()}
PASSING = [k for k in PASSING_LIST.read_text().split() if k] if PASSING_LIST.is_file() else []
FROZEN = read_frozen()
OTHERS = sorted(set(CASES) - set(PASSING))
# Known wrong-number cases (see docs/conformance.md); kept visible, not run in CI.
KNOWN_FAILURES = set(FAILING_LIST.read_text().split()) if FAILING_LIST.is_file() else set()
# Model-zoo networks (224x224 convolutions) that take tens of seconds each to export.
SLOW = {"light/test_vgg19", "light/test_densenet121", "light/test_inception_v1",
        "light/test_inception_v2", "light/test_resnet50", "light/test_bvlc_alexnet",
        "light/test_zfnet512", "light/test_shufflenet"}


def check_case_passes(key: str, tmp_path: Path) -> None:
    """The case passes, binding as constants the inputs ``frozen.txt`` records, no others."""
    result = run_case(CASES[key], tmp_path)
    assert result.status == "passed", result.reason
    frozen, constant = FROZEN.get(key, ((), False))
    assert tuple(result.frozen) == frozen, (
        f"{key} now binds {result.frozen or 'no inputs'} as constants at export, "
        f"frozen.txt says {list(frozen) or 'none'}")
    assert result.constant == constant, (
        f"{key}: {'no' if result.constant else 'a'} run-time input is left, frozen.txt says "
        f"{'constant' if constant else 'not constant'}")


def test_passing_list_names_real_cases() -> None:
    assert PASSING, "tests/conformance/passing.txt is missing: run tests/conformance/harness.py"
    assert not set(PASSING) - set(CASES)
    assert SLOW <= set(PASSING)


def test_frozen_list_names_passing_cases() -> None:
    assert FROZEN, "tests/conformance/frozen.txt is missing: run harness.py --frozen-only"
    assert not set(FROZEN) - set(PASSING)


@pytest.mark.parametrize("key", [k for k in PASSING if k not in SLOW])
def test_conformance_case_passes(key: str, tmp_path: Path) -> None:
    check_case_passes(key, tmp_path)


@pytest.mark.parametrize("key", [k for k in OTHERS if k not in KNOWN_FAILURES and k not in SLOW])
def test_conformance_case_refused_cleanly(key: str, tmp_path: Path) -> None:
    result = run_case(CASES[key], tmp_path)
    if result.status == "passed":
        return  # better than recorded: regenerate passing.txt
    assert result.status == "unsupported", f"{key} failed instead of being refused: {result.reason}"
    assert "\n" not in result.reason
