"""The ``lut8`` kernel with run-time extents (``codegen/qelementwise.py``
``emit_qelementwise_sized``): batch, height and width open, a table per channel or one row,
uint8 and int8 inputs. One portable bundle (x86-64-v2 + x86-64-v3) per case, each level run
here with its features pinned (v3: ``vpshufb`` 32 bytes a step, v2: byte by byte), at sizes
with and without a 32-byte remainder per row, on 1 and 2 threads, bit for bit against the
op's numpy definition; the bundle's kernel is the table kernel, not the generic loop nest."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from conftest import X86_V2, X86_V3
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.builder import BlockBuilder
from mlcpack.packager.ir.sym import size_var
from mlcpack.packager.ops.qlinear import lut8
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

CHANNELS = 40
SIZES = ((1, 3, 5), (2, 7, 32), (1, 16, 33), (3, 9, 70))   # batch, H, W


def _bundle(folder: Path, dtype: str, per_channel: bool) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(7)
    table = rng.integers(0, 256, (CHANNELS if per_channel else 1, 256)).astype(np.uint8)
    bb = BlockBuilder()
    x = bb.input("x", (size_var("n"), CHANNELS, size_var("h"), size_var("w")), dtype)
    t = bb.constant(table, "table")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit_op("lut8", x, t, axis=1 if per_channel else -1))
        bb.emit_func_output(y, names=["y"])
    path = folder / f"lut_{dtype}_{per_channel}.mlc"
    export_module(bb.get(), path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    return path, table


@pytest.fixture(scope="module", params=[("uint8", True), ("int8", False)],
                ids=["uint8_per_channel", "int8_one_row"])
def case(request, tmp_path_factory):
    dtype, per_channel = request.param
    path, table = _bundle(tmp_path_factory.mktemp("lut_open"), dtype, per_channel)
    return path, table, dtype, per_channel


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_lut8_with_run_time_extents(case, level: str, monkeypatch) -> None:
    path, table, dtype, per_channel = case
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert kinds == ["integer elementwise"], kinds
            for n, h, w in SIZES:
                x = rng.integers(info.min, info.max + 1, (n, CHANNELS, h, w)).astype(dtype)
                x.reshape(-1)[:2] = (info.min, info.max)
                got = model.run({"x": x})["y"]
                np.testing.assert_array_equal(got, lut8(x, table, 1 if per_channel else -1))
