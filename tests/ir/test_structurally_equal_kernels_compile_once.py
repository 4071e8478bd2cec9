"""Primitive functions that differ only in names compile to one kernel (packager/ir/structure.py,
packager/codegen/build.py), and the bundle still computes the right thing."""

from __future__ import annotations

import numpy as np

from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.ir import BlockBuilder, te
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ir.structure import structural_key
from mlcpack.packager.passes import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.bundle import BundleReader


def _scale_add(name: str, n: int = 5, c: float = 2.0, names: tuple[str, str] = ("a", "b"),
               dtype: str = "float32") -> PrimFunc:
    a = te.placeholder((n,), dtype, names[0])
    b = te.placeholder((n,), dtype, names[1])
    out = te.compute((n,), lambda i: a[i] * c + b[i], "out")
    return PrimFunc(name, [a, b], [out], {"op_kind": "elemwise"})


def test_key_ignores_names_only():
    base = structural_key(_scale_add("f"))
    assert structural_key(_scale_add("g", names=("x", "y"))) == base
    assert structural_key(_scale_add("f", n=6)) != base           # shape
    assert structural_key(_scale_add("f", c=3.0)) != base         # constant
    assert structural_key(_scale_add("f", dtype="float64")) != base
    # the same body with its arguments swapped is another function
    a, b = te.placeholder((5,), "float32", "a"), te.placeholder((5,), "float32", "b")
    swapped = PrimFunc("f", [b, a], [te.compute((5,), lambda i: a[i] * 2.0 + b[i], "out")],
                       {"op_kind": "elemwise"})
    assert structural_key(swapped) != base


def _tower(depth: int, width: int = 24):
    """x -> (matmul W_k -> add b_k -> relu) x depth: same-shaped layers, different weights."""
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((width, width)).astype(np.float32) / 5,
                rng.standard_normal(width).astype(np.float32)) for _ in range(depth)]
    bb = BlockBuilder()
    x = bb.input("x", (3, width))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for k, (w, b) in enumerate(weights):
                h = bb.emit_op("matmul", h, bb.constant(w, f"w{k}"))
                h = bb.emit_op("relu", bb.emit_op("add", h, bb.constant(b, f"b{k}")))
            out = bb.emit_output(h)
        bb.emit_func_output(out, names=["y"])
    return bb.get(), weights


def test_repeated_layers_share_one_kernel_and_stay_correct(tmp_path):
    mod, weights = _tower(4)
    funcs = run_pipeline(mod, DEFAULT_PIPELINE, options=UNPACKED).prim_funcs()
    assert len(funcs) == 4                                   # one fused kernel per layer
    path = tmp_path / "tower.mlc"
    export_module(mod, path, ExportOptions())
    with BundleReader(path) as reader:
        header = reader.header
    symbols = {k["symbol"] for k in header["kernels"]}
    assert len(header["kernels"]) == 4 and len(symbols) == 1
    x = np.random.default_rng(1).standard_normal((3, 24)).astype(np.float32)
    ref = x
    for w, b in weights:
        ref = np.maximum(ref @ w + b, 0)
    with load(path) as model:
        np.testing.assert_allclose(model.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
