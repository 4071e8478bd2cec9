"""Convolution weights packed in the register tile's row blocks (``nn.conv2d_rows``,
passes/layout.py ``pack_conv_rows``): on AVX2 exports an ungrouped, static, undilated
``nn.conv2d`` with a constant weight that the register-blocked kernel computes reads its weights
as ``[ceil(O / rows), C * KH * KW, rows]``, one stream per block row, and its tail outputs with
the block's channels on the lanes. The packing itself, which convolutions take it, and packed
against unpacked exports of the same models against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from mlcpack.packager.codegen.contraction.geometry import conv_geometry, conv_row_widths
from mlcpack.packager.codegen.target import resolve_targets
from mlcpack.packager.ops.layout import conv2d_rows, pack_row_weights, unpack_row_weights
from mlcpack.packager.ops.nn import conv2d
from mlcpack.runtime.bundle import BundleReader

from conv_models import conv_feeds, conv_model, conv_out_size

ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("register_blocked_conv")

# a portable AVX2 bundle: both widths must agree on the tile's rows for a weight to be packed
TARGET = "x86-64-v2,x86-64-v3"


@pytest.mark.parametrize("shape,rows", [((10, 3, 3, 3), 4), ((12, 5, 1, 1), 6),
                                        ((8, 7, 1, 3), 4), ((4, 1, 5, 5), 4)])
def test_packing_round_trips_and_computes_the_same_convolution(shape, rows):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(np.float32)
    wp = pack_row_weights(w, rows)
    o, c, kh, kw = shape
    assert wp.shape == (-(-o // rows), c * kh * kw, rows)
    flat = w.reshape(o, -1)
    for oc in range(o):
        np.testing.assert_array_equal(wp[oc // rows, :, oc % rows], flat[oc])
    np.testing.assert_array_equal(unpack_row_weights(wp, o, c, (kh, kw)), w)
    tail = wp.transpose(0, 2, 1).reshape(-1, c * kh * kw)[o:]
    assert not tail.any(), "rows past the last channel are zero"
    x = rng.standard_normal((2, c, 9, 8)).astype(np.float32)
    np.testing.assert_allclose(
        conv2d_rows(x, wp, o, (kh, kw), rows, strides=(2, 1), padding=(1, 0, 1, 2)),
        conv2d(x, w, strides=(2, 1), padding=(1, 0, 1, 2)), rtol=1e-6, atol=1e-6)


def test_only_avx2_exports_pack():
    assert conv_row_widths(resolve_targets("x86-64-v3")) == (8,)
    assert conv_row_widths(resolve_targets(TARGET)) == (4, 8)
    assert conv_row_widths(resolve_targets("x86-64-v2")) == ()
    assert conv_row_widths(resolve_targets("x86-64-v4")) == ()
    assert conv_row_widths(resolve_targets("aarch64")) == ()


def _mixed_model():
    """x [1, 16, 14, 14] -> 1x1 conv 16 -> 40 (packed) -> depthwise 3x3 (groups 40) -> grouped
    1x1 (groups 2) -> global average pool -> 1x1 conv on the 1x1 image (the dot product)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def init(name, *shape):
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["a1"]),
             helper.make_node("Conv", ["a1", "wd"], ["b"], kernel_shape=[3, 3], pads=[1] * 4,
                              group=40),
             helper.make_node("Conv", ["b", "wg"], ["c"], kernel_shape=[1, 1], group=2),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Conv", ["p", "wf"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 1, 1])],
        [init("w1", 40, 16, 1, 1), init("wd", 40, 1, 3, 3), init("wg", 24, 20, 1, 1),
         init("wf", 10, 24, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _export(tmp_path, model, name="m", target=TARGET, compile=None):
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / f"{name}.mlc"
    export_module(mod, bundle, ExportOptions(target=target, compile=compile))
    with BundleReader(bundle) as r:
        kernels = [k["name"] for k in r.header["kernels"]]
    return path, bundle, kernels


def test_which_convolutions_are_packed(tmp_path):
    path, bundle, kernels = _export(tmp_path, _mixed_model())
    convs = [k for k in kernels if "conv2d" in k]
    assert len(convs) == 4
    packed = [k for k in convs if "conv2d_rows" in k]
    assert len(packed) == 1 and "relu" in packed[0], "only the ungrouped 1x1 on 14x14 is packed"
    _check(path, bundle, {"x": np.random.default_rng(1).standard_normal(
        (1, 16, 14, 14)).astype(np.float32)}, threads=2)


def _check(path, bundle, feeds, threads, runs=3):
    from mlcpack.runtime import load

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with load(bundle, threads=threads) as m:
        for _ in range(runs):
            got = list(m.run(feeds).values())[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return got


CASES = [   # n, c, h, o, k, s, act, residual, threads
    (1, 96, 7, 1280 - 2, 1, 1, "hsig", False, 2),   # one tail pixel, a partial last block
    (1, 37, 10, 22, 1, 1, "silu", True, 1),         # four tail pixels, K = 37 (chains + 5)
    (1, 37, 7, 20, 1, 1, "silu", True, 1),          # one tail pixel, K = 37: the paired
                                                    # steps (_tail_block_pairs) and a last one
    (1, 20, 20, 36, 3, 2, None, True, 2),           # strided 3x3, 36 channels (not conv_oc)
    (2, 24, 28, 30, 1, 1, None, False, 3),          # a batch, 30 channels, 3 threads
    (1, 64, 16, 64, 1, 1, None, False, 2),          # planes copied a line apart (aliasing)
]


@pytest.mark.parametrize("n,c,h,o,k,s,act,residual,threads", CASES)
def test_packed_and_unpacked_match_onnxruntime(tmp_path, n, c, h, o, k, s, act, residual,
                                               threads):
    from mlcpack.packager.options import CompileOptions

    oh = conv_out_size(h, k, s)
    p = k // 2
    rows = {conv_geometry((n, c, h, h), (o, c, k, k), (n, o, oh, oh),
                          dict(strides=(s, s), padding=(p,) * 4, groups=1), vl)["mr"]
            for vl in (4, 8)}
    assert len(rows) == 1, "the case's tile rows differ between the widths: not packed"
    model = conv_model(n, c, h, h, o, k, s, act, residual, "rows")
    feeds = conv_feeds(n, c, h, h, o, k, s, residual)
    path, packed, kernels = _export(tmp_path, model, "packed")
    assert any("conv2d_rows" in name for name in kernels)
    got_packed = _check(path, packed, feeds, threads)
    path, plain, kernels = _export(tmp_path, model, "plain",
                                   compile=CompileOptions(conv_row_widths=()))
    assert not any("conv2d_rows" in name for name in kernels)
    got_plain = _check(path, plain, feeds, threads, runs=1)
    np.testing.assert_allclose(got_packed, got_plain, rtol=1e-5, atol=1e-5)


def test_batch_plans_beside_a_symbolic_plan_share_unpacked_weights(tmp_path, run_cli):
    """``--batch-sizes`` over a symbolic batch: the symbolic plan keeps [O, C, KH, KW] weights
    (its convolutions take run-time extents), so the static plans beside it do too and every
    weight is stored once; a single static export packs them."""
    import onnx

    path = tmp_path / "c.onnx"
    onnx.save(conv_model(1, 32, 7, 7, 40, 1, 1, "silu", False, "spec"), str(path))
    batched, single = tmp_path / "b.mlc", tmp_path / "s.mlc"
    proc = run_cli("export", path, "-o", batched, "--input-shape", "x=N,32,7,7",
                   "--batch-sizes", "1,4", "--target", TARGET, timeout=180)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("export", path, "-o", single, "--target", TARGET, timeout=180)
    assert proc.returncode == 0, proc.stderr
    with BundleReader(batched) as r, BundleReader(single) as s:
        hb, hs = r.header, s.header
    assert len(hb["constants"]) == len(hs["constants"]) == 2   # weight, bias
    assert any("conv2d_rows" in k["name"] for k in hs["kernels"])
    plans = [hb] + list(hb["specialized"])
    assert not any("conv2d_rows" in k["name"] for p in plans for k in p["kernels"])
    from mlcpack.runtime import load

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with load(batched) as m:
        for n in (1, 3, 4):
            x = np.random.default_rng(n).standard_normal((n, 32, 7, 7)).astype(np.float32)
            want = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(n)])
            np.testing.assert_allclose(list(m.run({"x": x}).values())[0], want,
                                       rtol=1e-4, atol=1e-4)
