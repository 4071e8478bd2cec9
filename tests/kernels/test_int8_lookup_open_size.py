"""The ``lut8`` kernel with run-time extents (``codegen/qelementwise.py``
``emit_qelementwise_sized``): batch, height and width open, a table per channel or one row,
uint8 and int8 inputs. One portable bundle (x86-64-v2 + x86-64-v3) of both, each level run
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


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """One portable bundle of two lookups: uint8 x through a table per channel (y0), int8 x
    through one row (y1); with the two tables."""
    rng = np.random.default_rng(7)
    per_channel = rng.integers(0, 256, (CHANNELS, 256)).astype(np.uint8)
    one_row = rng.integers(0, 256, (1, 256)).astype(np.uint8)
    dims = (size_var("n"), CHANNELS, size_var("h"), size_var("w"))
    bb = BlockBuilder()
    xu = bb.input("xu", dims, "uint8")
    xs = bb.input("xs", dims, "int8")
    tu, ts = bb.constant(per_channel, "per_channel"), bb.constant(one_row, "one_row")
    with bb.function("main", [xu, xs]):
        with bb.dataflow():
            y0 = bb.emit_output(bb.emit_op("lut8", xu, tu, axis=1))
            y1 = bb.emit_output(bb.emit_op("lut8", xs, ts, axis=-1))
        bb.emit_func_output([y0, y1], names=["y0", "y1"])
    path = tmp_path_factory.mktemp("lut_open") / "lut.mlc"
    export_module(bb.get(), path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    return path, per_channel, one_row


@pytest.mark.parametrize("level", ["x86-64-v2", "x86-64-v3"])
def test_lut8_with_run_time_extents(bundle, level: str, monkeypatch) -> None:
    path, per_channel, one_row = bundle
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2 if level == "x86-64-v2" else X86_V3)
    rng = np.random.default_rng(3)
    for threads in (1, 2):
        with load(path, threads=threads) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert kinds == ["integer elementwise"] * 2, kinds
            for n, h, w in SIZES:
                xu = rng.integers(0, 256, (n, CHANNELS, h, w)).astype(np.uint8)
                xs = rng.integers(-128, 128, (n, CHANNELS, h, w)).astype(np.int8)
                xu.reshape(-1)[:2] = (0, 255)
                xs.reshape(-1)[:2] = (-128, 127)
                got = model.run({"xu": xu, "xs": xs})
                np.testing.assert_array_equal(got["y0"], lut8(xu, per_channel, 1))
                np.testing.assert_array_equal(got["y1"], lut8(xs, one_row, -1))
