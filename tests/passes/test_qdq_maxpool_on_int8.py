"""MaxPool between QDQ pairs on the 8-bit tensor (passes/fuse_qdq_layout.py, codegen/pool.py):
ONNX Runtime's quantizer brackets MaxPool with the input's scale and zero point;
quantize(max_pool(dequantize(a))) becomes max_pool(a) on the bytes (exact: the maps are
non-decreasing, the padding is the type's least value), and the outputs equal ORT's (graph
optimizations off: the model as written) bit for bit, at x86-64-v3 (32 byte lanes) and v2 (16),
on rows with whole vectors and an overlapping last one (75, 149 outputs), and a row shorter
than a vector (10: the masked store). Another scale after the pool keeps it float."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import onnx
from conftest import X86_V2, X86_V3
from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_arch, host_features

SHAPES = {"x": [1, 3, 12, 150], "x8": [1, 5, 9, 75]}


def _model(path: Path) -> Path:
    """x (uint8 zp 131): MaxPool 3x3/2 pad 1 -> y1 [1, 3, 6, 75]; MaxPool 2x2/1 -> y2
    [1, 3, 11, 149]; MaxPool 3x3/2 pad 1 quantized to another scale (stays float) -> y3.
    x8 (int8 zp -5): MaxPool 3x3/2 pad 1 -> y4 [1, 5, 5, 38] (an odd width: the last column
    after the overlapping pair of vectors). The outputs are the quantized
    tensors (the 8-bit pools are kernels of their own, not fused into a dequantize)."""
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             h.make_node("QuantizeLinear", ["x8", "s", "z8"], ["q8"]),
             h.make_node("DequantizeLinear", ["q8", "s", "z8"], ["d8"])]
    pools = (("y1", "d", "s", "z", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
             ("y2", "d", "s", "z", dict(kernel_shape=[2, 2])),
             ("y3", "d", "s2", "z", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
             ("y4", "d8", "s", "z8", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)))
    for name, src, s, z, attrs in pools:
        nodes += [h.make_node("MaxPool", [src], [f"{name}_p"], **attrs),
                  h.make_node("QuantizeLinear", [f"{name}_p", s, z], [name])]
    inits = [nh.from_array(np.array(0.05, np.float32), "s"),
             nh.from_array(np.array(0.07, np.float32), "s2"),
             nh.from_array(np.array(131, np.uint8), "z"),
             nh.from_array(np.array(-5, np.int8), "z8")]
    outs = {"y1": ([1, 3, 6, 75], T.UINT8), "y2": ([1, 3, 11, 149], T.UINT8),
            "y3": ([1, 3, 6, 75], T.UINT8), "y4": ([1, 5, 5, 38], T.INT8)}
    graph = h.make_graph(nodes, "qdq_maxpool",
                         [h.make_tensor_value_info(k, T.FLOAT, v) for k, v in SHAPES.items()],
                         [h.make_tensor_value_info(k, t, v) for k, (v, t) in outs.items()],
                         inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return _model(tmp_path_factory.mktemp("qdq_maxpool") / "m.onnx")


def test_pools_take_the_8bit_tensor(model: Path) -> None:
    mod, _ = import_onnx(str(model))
    upto = [p.name for p in DEFAULT_PIPELINE].index("fuse_quantized_layout") + 1
    fused = run_pipeline(mod, DEFAULT_PIPELINE[:upto], options=UNPACKED)
    calls = [b.value for b in fused.functions["main"].bindings() if hasattr(b.value, "op")]
    pools = [c.type.dtype for c in calls if c.op == "nn.max_pool2d"]
    assert sorted(pools) == ["float32", "int8", "uint8", "uint8"], pools
    # quantizes: x, x8 and y3's; a dequantize for y3's float pool alone
    ops = [c.op for c in calls]
    assert ops.count("quantize") == 3 and ops.count("dequantize") == 1, ops


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_8bit_pools_equal_ort(model: Path, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from mlcpack.runtime.describe import describe

    mod, _ = import_onnx(str(model))
    path = tmp_path / "m.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v2,x86-64-v3", check=False))
    kernels = [k.get("kernel") or "" for k in describe(path)["kernels"]]
    assert sum("max pool" in k for k in kernels) >= 3, kernels     # not the generic loop
    rng = np.random.default_rng(0)
    feeds = {k: rng.normal(0, 3, v).astype(np.float32) for k, v in SHAPES.items()}  # saturates
    ref = ort_outputs(model, feeds, as_written=True)
    for flags in (X86_V3, X86_V2):
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        for threads in (1, 2):
            with load(path, threads=threads) as m:
                ours = m.run(feeds)
            for k in ("y1", "y2", "y3", "y4"):
                np.testing.assert_array_equal(ours[k], ref[k], err_msg=f"{k} {flags[-8:]}")


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_8bit_pools_with_runtime_sizes_equal_ort(tmp_path: Path) -> None:
    """H and W known at run time only: the 8-bit pools take the max pool kernel with its sizes
    read at run time (masked stores for the rows' last vectors), bit for bit ORT at sizes with
    whole and partial vectors, 1 and 2 threads."""
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             h.make_node("MaxPool", ["d"], ["p1"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1] * 4),
             h.make_node("QuantizeLinear", ["p1", "s", "z"], ["y1"]),
             h.make_node("MaxPool", ["d"], ["p2"], kernel_shape=[2, 2]),
             h.make_node("QuantizeLinear", ["p2", "s", "z"], ["y2"])]
    inits = [nh.from_array(np.array(0.05, np.float32), "s"),
             nh.from_array(np.array(131, np.uint8), "z")]
    graph = h.make_graph(nodes, "qdq_maxpool_open",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 16, "H", "W"])],
                         [h.make_tensor_value_info(k, T.UINT8, None) for k in ("y1", "y2")],
                         inits)
    src = tmp_path / "open.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8), src)
    mod, _ = import_onnx(str(src))
    path = tmp_path / "open.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v3", check=False))
    rng = np.random.default_rng(1)
    for threads in (1, 2):
        with load(path, threads=threads) as m:
            for shape in ((1, 16, 9, 7), (1, 16, 33, 70), (1, 16, 40, 129)):
                feeds = {"x": rng.normal(0, 3, shape).astype(np.float32)}
                ref = ort_outputs(src, feeds, as_written=True)
                ours = m.run(feeds)
                for k in ("y1", "y2"):
                    np.testing.assert_array_equal(ours[k], ref[k], err_msg=f"{k} {shape}")


def _row_model(path: Path) -> Path:
    """Rows shorter than a step of the widest byte vector (issue 33): xa [1, 4, 112, 112]
    (uint8, ResNet's stem pool 3x3/2 pad 1 -> 56 wide); xb [1, 3, 6, 40] (int8): 3x3/2 pad 1
    -> 20 wide, and 2x2/1 -> 39 wide."""
    shapes = {"xa": [1, 4, 112, 112], "xb": [1, 3, 6, 40]}
    nodes = [h.make_node("QuantizeLinear", ["xa", "s", "z"], ["qa"]),
             h.make_node("DequantizeLinear", ["qa", "s", "z"], ["da"]),
             h.make_node("QuantizeLinear", ["xb", "s", "z8"], ["qb"]),
             h.make_node("DequantizeLinear", ["qb", "s", "z8"], ["db"])]
    stem = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    pools = (("ya", "da", "z", stem), ("yb", "db", "z8", stem),
             ("yc", "db", "z8", dict(kernel_shape=[2, 2])))
    for name, src, z, attrs in pools:
        nodes += [h.make_node("MaxPool", [src], [f"{name}_p"], **attrs),
                  h.make_node("QuantizeLinear", [f"{name}_p", "s", z], [name])]
    inits = [nh.from_array(np.array(0.05, np.float32), "s"),
             nh.from_array(np.array(131, np.uint8), "z"),
             nh.from_array(np.array(-5, np.int8), "z8")]
    outs = {"ya": ([1, 4, 56, 56], T.UINT8), "yb": ([1, 3, 3, 20], T.INT8),
            "yc": ([1, 3, 5, 39], T.INT8)}
    graph = h.make_graph(nodes, "qdq_maxpool_rows",
                         [h.make_tensor_value_info(k, T.FLOAT, v) for k, v in shapes.items()],
                         [h.make_tensor_value_info(k, t, v) for k, (v, t) in outs.items()],
                         inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.skipif(host_arch() != "x86_64" or not {"avx2", "fma"} <= host_features(),
                    reason="runs x86-64-v3 code: needs an x86-64 host with AVX2 and FMA")
def test_8bit_pools_on_short_rows_take_narrower_vectors(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row shorter than a step of vl bytes (ResNet-18's 112-wide stem rows at x86-64-v4: 64
    lanes, stride 2) takes the widest of vl / 2, vl / 4 that fits, not bytes one by one: the v4
    kernels have no scalar byte load left (before: 3 x 112 a row), and the outputs equal ORT's
    bit for bit at v2, v3 and (where the host has AVX-512BW) v4, on 1 and 2 threads."""
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc
    from mlcpack.packager.options import UNPACKED as OPTS

    src = _row_model(tmp_path / "rows.onnx")
    mod, _ = import_onnx(str(src))
    funcs = [f for f in run_pipeline(mod, DEFAULT_PIPELINE, options=OPTS).functions.values()
             if isinstance(f, PrimFunc) and "max_pool2d" in f.name]
    assert len(funcs) == 3, [f.name for f in funcs]
    ir_text = compile_prim_funcs(funcs, resolve_target("x86-64-v4")).llvm_ir
    assert not re.findall(r"load i8, (i8\*|ptr) ", ir_text)
    path = tmp_path / "rows.mlc"
    targets = "x86-64-v2,x86-64-v3,x86-64-v4"
    export_module(mod, path, ExportOptions(target=targets, check=False))
    rng = np.random.default_rng(3)
    feeds = {"xa": rng.normal(0, 3, (1, 4, 112, 112)).astype(np.float32),
             "xb": rng.normal(0, 3, (1, 3, 6, 40)).astype(np.float32)}
    ref = ort_outputs(src, feeds, as_written=True)
    levels = [X86_V2, X86_V3] + ([None] if {"avx512bw", "avx512f"} <= host_features() else [])
    for flags in levels:
        if flags is None:
            monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
        else:
            monkeypatch.setenv("MLCPACK_CPU_FEATURES", flags)
        for threads in (1, 2):
            with load(path, threads=threads) as m:
                ours = m.run(feeds)
            for k in ("ya", "yb", "yc"):
                np.testing.assert_array_equal(ours[k], ref[k], err_msg=f"{k} {flags}")
