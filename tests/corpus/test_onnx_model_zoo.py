"""The model-zoo networks of ONNX's backend test suite (``light/``: VGG-19, DenseNet-121,
Inception v1/v2, ResNet-50, AlexNet, ZFNet-512, ShuffleNet) that take tens of seconds each to
export: the same check as ``test_onnx_conformance.py``, under the ``slow`` marker. A module of
their own, so that pytest-xdist (``--dist loadscope``) runs them beside the 1,600 fast cases
instead of after them. Measured 2026-11-24 one after another under a load of ~10: 343 s in all
(DenseNet-121 97 s, Inception v2 76 s, v1 63 s, the others 15-28 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_onnx_conformance import PASSING, SLOW, check_case_passes

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("key", [k for k in PASSING if k in SLOW])
def test_model_zoo_case_passes(key: str, tmp_path: Path) -> None:
    check_case_passes(key, tmp_path)
