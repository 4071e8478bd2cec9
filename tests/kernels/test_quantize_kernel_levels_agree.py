"""A model input's quantize large enough to split between threads: the AVX2 kernel
(codegen/qelementwise.py ``_QQuantize``) splits where the generic loop nest of the other levels
does, so the portable default (x86-64-v2 beside x86-64-v3) exports. Before, ONNX Runtime's QDQ
copy of MobileNetV3-small (1x3x224x224 input) failed the default export with "kernel quantize
differs between targets x86-64-v2, x86-64-v3; export them apart"."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers import build_op_module
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ops.quant import quantize
from mlcpack.runtime import load


def test_large_input_quantize_exports_for_every_level_and_splits(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((1, 3, 96, 97)) * 3).astype(np.float32)   # 27936 values: a tail
    s, z = np.array(0.0186, np.float32), np.array(128, np.uint8)
    mod = build_op_module("quantize", [x, s, z], [False, True, True], dtype="uint8")
    path = tmp_path / "q.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    expect = quantize(x, s, z, "uint8")
    for threads in (1, 3):
        with load(path, threads=threads) as m:
            np.testing.assert_array_equal(m.run({"x0": x})["y"], expect)
