"""How kernels share their work between threads: each task of a parallel kernel, called alone on
an output filled with NaN, writes its own part; the parts are disjoint, cover the output and
are about equal, and the model's outputs match ONNX Runtime at 1-3 threads, bit for bit alike.

- a matmul of one column panel and many rows (magika's one-hot Dense) splits by runs of its
  row blocks (``MatmulMixin._row_chunks``): it was one work item, all on one thread;
- a reduction with few outputs but many inputs per output (a layer norm's sums over 512 rows
  into 256 outputs) splits by its outputs (``lower._stage_work``): it stayed on one thread;
- a channel-lane convolution whose blocks of output channels are odd in number takes bands
  that split evenly on two threads (``conv_oc``: PP-OCRv4's 480 channels on 6x80, 15 items of
  which one thread had 8)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from conv_models import conv_feeds, conv_model

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _export(tmp_path, model, target="host"):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    export_module(mod, tmp_path / "m.mlc", ExportOptions(target=target))
    return path, tmp_path / "m.mlc"


def _task_shares(bundle, feeds, name: str, ntasks: int) -> list[float]:
    """Run the model once, then call the kernel whose name holds ``name`` as one task, and each
    of ``ntasks`` tasks alone on its output filled with NaN: each task's share of the output's
    elements (checked: the parts are disjoint, cover it and hold the one task's values)."""
    from mlcpack.runtime import load
    from mlcpack.runtime.header import OP_CALL_KERNEL
    from mlcpack.runtime.vm import KERNEL_SIGNATURE

    with load(bundle, threads=1) as model:
        model.run(feeds)
        executor = model._main._executor
        plan = model.schema.plan
        table = executor._table.reshape(-1, 3)
        calls = [(i, ins) for i, ins in enumerate(executor.program)
                 if ins.opcode == OP_CALL_KERNEL]
        found = [(k, i, ins) for k, (i, ins) in enumerate(calls)
                 if name in plan.kernels[ins.target].name]
        assert len(found) == 1, [plan.kernels[ins.target].name for _, ins in calls]
        k, i, ins = found[0]
        kernel = plan.kernels[ins.target]
        assert kernel.parallel, kernel.name
        out = plan.tensors[ins.operands[kernel.num_inputs]]
        assert out.dtype == "float32"
        size = int(np.prod(out.shape))
        pointer = executor._args[i][kernel.num_inputs]
        view = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                     shape=(size,))
        fn = KERNEL_SIGNATURE(int(table[k, 0]))
        fn(int(table[k, 1]), 0, 1)   # the whole kernel as one task, on the run's arena
        want = view.copy()
        written = np.zeros(size, dtype=np.int64)
        shares = []
        for t in range(ntasks):
            view[:] = np.nan
            fn(int(table[k, 1]), t, ntasks)
            mine = ~np.isnan(view)
            np.testing.assert_array_equal(view[mine], want[mine])
            written += mine
            shares.append(mine.sum() / size)
        view[:] = want
    assert (written == 1).all(), "the tasks' parts overlap or miss outputs"
    return shares


def _check_threads(path, bundle, feeds) -> None:
    from mlcpack.runtime import load

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = []
    for threads in (1, 2, 3):
        with load(bundle, threads=threads) as model:
            got.append([np.asarray(v) for v in model.run(feeds).values()])
    for a, b in zip(want, got[0]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    for other in got[1:]:
        for a, b in zip(got[0], other):
            assert a.tobytes() == b.tobytes()


def _matmul_and_reductions(batch: int, m: int, k: int, n: int):
    """x [batch, m, k] @ W [k, n], then its sum and max over the m rows (batch x n outputs of m
    inputs each)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).standard_normal((k, n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0),
             helper.make_node("ReduceMax", ["y"], ["m"], axes=[1], keepdims=0)]
    graph = helper.make_graph(
        nodes, "splits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, m, k])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [batch, n]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [batch, n])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("batch,m,k,n", [
    (1, 1024, 64, 32),   # one full column panel
    (2, 520, 48, 40),    # two matrices of one partial panel each, 520 rows: a rest block
])
def test_one_panel_matmul_and_reductions_split_evenly(tmp_path, batch, m, k, n) -> None:
    path, bundle = _export(tmp_path, _matmul_and_reductions(batch, m, k, n))
    feeds = {"x": np.random.default_rng(4).standard_normal((batch, m, k)).astype(np.float32)}
    _check_threads(path, bundle, feeds)
    # the matmul's rows split in runs of whole row blocks; the reductions split their outputs
    # on their first axis of extent over 1 (batch 2: one matrix per thread)
    for name, counts in (("matmul", (2, 8)), ("sum", (2,)), ("max", (2,))):
        for ntasks in counts:
            shares = _task_shares(bundle, feeds, name, ntasks)
            assert max(shares) <= 1 / ntasks + 0.04, (name, ntasks, shares)


def test_channel_lane_conv_bands_split_evenly_on_two_threads(tmp_path) -> None:
    """A 5x5 of 8 -> 288 channels (9 blocks) on 2x64: 9 items in one band, 5 of them on one
    of two threads; in 2 bands (of 64 pixels, BALANCE_BAND_PIXELS), 18 items, 9 each."""
    model = conv_model(1, 8, 2, 64, 288, 5, 1)
    feeds = conv_feeds(1, 8, 2, 64, 288, 5, 1)
    path, bundle = _export(tmp_path, model, target="x86-64-v3")
    from mlcpack.runtime.describe import describe

    assert any("conv2d_oc" in k["name"] for k in describe(bundle)["kernels"])
    from mlcpack.runtime.cpu import host_features

    if not {"avx2", "fma"} <= set(host_features()):
        pytest.skip("runs x86-64-v3 code")
    _check_threads(path, bundle, feeds)
    assert _task_shares(bundle, feeds, "conv2d_oc", 2) == [0.5, 0.5]


@pytest.mark.parametrize("c,hw,o,residual,design", [
    # channel-lane, read in place: 5 blocks in bands of 4 and 3 rows, items block-major
    # (``conv_oc.BLOCK_MAJOR``): 18 : 17 rows x blocks where band-major gave 20 : 15
    (576, 7, 160, False, "channel-lane direct"),
    # register-blocked, read in place, block rows innermost: 7 panels of 32 pixels, the last
    # with 4, split by pixels (``_split_last_panel``) where by items one thread had 112 of 196
    (64, 14, 384, False, "register-blocked conv: 6 channels x 32 pixels"),
    # packed: one panel in 4 chunks of 60 block rows (``EVEN_CHUNKS``) where 102, 102 and 36
    # split 102 : 138
    (160, 7, 960, False, "chunks of 60"),
])
def test_mobilenet_v2_1x1s_split_evenly_on_two_threads(tmp_path, c, hw, o, residual,
                                                       design) -> None:
    """MobileNetV2's 1x1s on 7x7 and 14x14 (AVX-512 plans): each of two tasks writes about
    half the outputs, and the outputs match ONNX Runtime at 1-3 threads, bit for bit alike."""
    from mlcpack.runtime.cpu import host_features
    from mlcpack.runtime.describe import describe

    model = conv_model(1, c, hw, hw, o, 1, 1, residual=residual)
    feeds = conv_feeds(1, c, hw, hw, o, 1, 1, residual=residual)
    path, bundle = _export(tmp_path, model, target="x86-64-v4")
    kernels = [k for k in describe(bundle)["kernels"] if "conv2d" in k["name"]]
    assert len(kernels) == 1 and design in kernels[0]["kernel"], kernels
    if not {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(host_features()):
        pytest.skip("runs x86-64-v4 code (the design is checked above)")
    _check_threads(path, bundle, feeds)
    shares = _task_shares(bundle, feeds, "conv2d", 2)
    assert max(shares) <= 0.52, shares
