"""``quantize(x, 1.0, zp, unit_scale=True)``, what passes/fuse_qdq.py's float32-exact chains
write after a float convolution: no division in the compiled code (x / 1.0 is x), the same
bytes as the reference, on the AVX2 vector kernel (``_QQuantize``, static shapes) and the
generic loop nest (x86-64-v2), values past the 8-bit range and ties included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import build_op_module
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ops.quant import quantize
from mlcpack.runtime import load

from conftest import X86_V2, X86_V3


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_unit_scale_quantize_equals_the_reference(dtype: str, tmp_path: Path,
                                                  monkeypatch) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((1, 5, 9, 13)) * 90).astype(np.float32)
    x.flat[:6] = [0.5, 1.5, -2.5, 1e9, -1e9, 127.5]   # ties round to even, saturation
    one, z = np.array(1.0, np.float32), np.array(7 if dtype == "int8" else 120, dtype)
    mod = build_op_module("quantize", [x, one, z], [False, True, True], dtype=dtype,
                          unit_scale=True)
    path = tmp_path / "q.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    expect = quantize(x, one, z, dtype)
    for flags in (X86_V2, X86_V3):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        with load(path, threads=1) as m:
            np.testing.assert_array_equal(m.run({"x0": x})["y"], expect)
