"""``mlcpack export --precision bf16`` (docs/precision.md): the packed weights of matmuls and
convolutions stored as bfloat16 (round to nearest even), widened to float32 by the kernels;
bundles against an exact numpy model (bf16-rounded weights, float32 accumulation) and against
fp32 within the guard's bound; the guard's fallback to fp32; the CLI flag's errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mlcpack.packager.passes.layout import to_bfloat16

AVX2 = "x86-64-v3"
RNG = np.random.default_rng(33)


# ---- rounding -----------------------------------------------------------------------------------

def _bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint32).view(np.float32)


def test_round_to_nearest_even():
    x = _bits([0x3F808000,   # 1 + 2^-8: a tie, the even neighbour 1.0
               0x3F818000,   # a tie above an odd mantissa: up to 0x3F82
               0x3F808001,   # just past the tie: up
               0x3F807FFF,   # just below: down
               0xBF808000,   # negative tie: to even
               0x00000001,   # the smallest denormal: to +0
               0x007F8000,   # a denormal tie above an odd mantissa: up (to even)
               0x7F7FFFFF])  # the largest float32: past bfloat16's largest, to infinity
    got = to_bfloat16(x).view(np.uint16)
    np.testing.assert_array_equal(got, np.array([0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF80,
                                                 0x0000, 0x0080, 0x7F80], dtype=np.uint16))


def test_matches_ml_dtypes_and_round_trips():
    scaled = (RNG.standard_normal(20000) * 10.0 ** RNG.integers(-30, 30, 20000)).astype(
        np.float32)
    raw = RNG.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([scaled, raw])
    x = x[np.isfinite(x)]
    assert x.dtype == np.float32
    got = to_bfloat16(x)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    # bf16 values widen exactly and round back to themselves
    wide = got.astype(np.float32)
    np.testing.assert_array_equal(to_bfloat16(wide).view(np.uint16), got.view(np.uint16))
    # within half a unit of bfloat16's 8-bit significand (normal values)
    normal = np.abs(x) > 1e-37
    assert np.all(np.abs(wide[normal] - x[normal]) <= np.abs(x[normal]) * 2.0 ** -8)


def test_nan_and_infinity():
    x = _bits([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
               0x7FFFFFFF])
    got = to_bfloat16(x).view(np.uint16)
    assert got[0] == 0x7F80 and got[1] == 0xFF80                 # infinities stay
    wide = got.astype(np.uint32) << 16
    assert np.isnan(wide[2:].view(np.float32)).all()             # NaNs stay NaN ...
    assert list(got[2:] >> 15) == [0, 1, 0, 1, 0]                # ... of their sign
    assert got[4] != 0x7F80 and got[5] != 0xFF80                 # never rounded to infinity


# ---- bundles --------------------------------------------------------------------------------------

def _mlp(batch: int, dims=(96, 130, 40)):
    inits, nodes, ws, x = [], [], [], "x"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        bias = (RNG.standard_normal(n) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        ws.append((w, bias))
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
        x = f"g{i}"
        if i < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dims[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, dims[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    def exact(a, bf16: bool):   # float64 products of float32 inputs and the stored weights
        h = a.astype(np.float64)
        for i, (w, bias) in enumerate(ws):
            wq = to_bfloat16(w).astype(np.float32) if bf16 else w
            h = h @ wq.astype(np.float64).T + bias
            if i < len(ws) - 1:
                h = np.maximum(h, 0)
        return h
    return model, exact, {"x": (batch, dims[0])}


WINO_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=float)
WINO_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=float)


def _winograd(x: np.ndarray, u: np.ndarray, pad: int) -> np.ndarray:
    """F(2x2, 3x3) of x [1, C, H, W] (stride 1, padding ``pad``) with transformed weights
    u [4, 4, C, O]: each 2x2 output tile A^T (sum_c U[c] * B^T d[c] B) A."""
    _, c, h, w = x.shape
    oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
    xp = np.zeros((c, oh + 2 + oh % 2, ow + 2 + ow % 2))
    xp[:, pad:pad + h, pad:pad + w] = x[0]
    y = np.zeros((u.shape[3], oh + oh % 2, ow + ow % 2))
    for ty in range(0, oh, 2):
        for tx in range(0, ow, 2):
            v = np.einsum("ai,cij,bj->abc", WINO_BT, xp[:, ty:ty + 4, tx:tx + 4], WINO_BT)
            m = np.einsum("abc,abco->oab", v, u)
            y[:, ty:ty + 2, tx:tx + 2] = np.einsum("ia,oab,jb->oij", WINO_AT, m, WINO_AT)
    return y[None, :, :oh, :ow]


def test_winograd_model_is_the_convolution():
    """The numpy F(2x2, 3x3) above on unrounded weights is the plain convolution."""
    from mlcpack.packager.ops.layout import pack_wino_weights, unpack_matmul_b
    from mlcpack.packager.ops.nn import conv2d

    w = RNG.standard_normal((5, 3, 3, 3))
    x = RNG.standard_normal((1, 3, 7, 9))
    u = unpack_matmul_b(pack_wino_weights(w), 5).astype(np.float64).reshape(4, 4, 3, 5)
    np.testing.assert_allclose(_winograd(x, u, 1), conv2d(x, w, (1, 1), (1, 1, 1, 1)),
                               rtol=1e-5, atol=1e-5)


def _conv(c: int, o: int, k: int, hw: int, stride: int = 1):
    w = (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = (RNG.standard_normal(o) * 0.1).astype(np.float32)
    pad = k // 2
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[pad] * 4,
                            strides=[stride, stride])
    out = (hw + 2 * pad - k) // stride + 1
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, out, out])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8

    def exact(x, bf16: bool):
        from mlcpack.packager.ops.layout import pack_wino_weights, unpack_matmul_b
        from mlcpack.packager.ops.nn import conv2d
        from mlcpack.packager.passes.layout import uses_winograd

        wq = to_bfloat16(w).astype(np.float32) if bf16 else w
        if bf16 and uses_winograd(w.shape, (stride, stride), (1, o, out, out)):
            # the bundle stores the transformed weights U = G w G^T in bf16: F(2x2, 3x3) on the
            # rounded U, in float64
            u = unpack_matmul_b(to_bfloat16(pack_wino_weights(w)).astype(np.float32), o)
            return _winograd(x.astype(np.float64), u.astype(np.float64).reshape(4, 4, c, o),
                             pad) + bias[None, :, None, None]
        return conv2d(x.astype(np.float64), wq.astype(np.float64), (stride, stride),
                      (pad,) * 4) + bias[None, :, None, None]
    return model, exact, {"x": (1, c, hw, hw)}


def _export(tmp_path, model, name: str, precision: str, **kw):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(model)
    bundle = tmp_path / f"{name}.mlc"
    # the convolutions' widened bf16 kernels and compute-bound matmuls widened on AVX2 are
    # opt-in: on here, the defaults tested below
    kw.setdefault("compile", CompileOptions(bf16_convs=True, bf16_widen_all=True))
    report = export_module(mod, bundle, ExportOptions(target=kw.pop("target", AVX2),
                                                      precision=precision, **kw))
    return bundle, report


def _run(bundle, feeds, threads: int = 1):
    from mlcpack.runtime import load

    with load(bundle, threads=threads) as m:
        return list(m.run(feeds).values())[0]


def _weight_dtypes(bundle) -> list[str]:
    from mlcpack.runtime.bundle import BundleReader
    from mlcpack.runtime.header import Header

    with BundleReader(bundle) as reader:
        header = Header.from_msgpack(reader.header, reader.data_size, reader.name)
    return [c.dtype for c in header.constants]


CASES = {
    "mlp_b16": lambda: _mlp(16),
    "mlp_b1": lambda: _mlp(1, (64, 200, 24)),              # one row: a packed Linear at batch 1
    "mlp_odd_k": lambda: _mlp(5, (97, 45, 9)),             # K pairs with an odd K's last row
    "conv3x3_oc": lambda: _conv(8, 16, 3, 12),            # nn.conv2d_oc, direct
    "conv3x3_wino": lambda: _conv(16, 32, 3, 16),         # nn.conv2d_oc, Winograd F(2x2, 3x3)
    "conv1x1_rows": lambda: _conv(24, 20, 1, 9),          # nn.conv2d_rows
    "conv3x3_s2_rows": lambda: _conv(6, 12, 3, 15, 2),    # nn.conv2d_rows (12 % 8 != 0)
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bundle_matches_exact_model_and_fp32(tmp_path, case):
    model, exact, shapes = CASES[case]()
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    bundle, report = _export(tmp_path, model, "bf16", "bf16")
    assert report.precision == "bf16", report.precision_note
    assert "bfloat16" in _weight_dtypes(bundle)
    want16, want32 = exact(feeds["x"], True), exact(feeds["x"], False)
    scale = float(np.abs(want32).max())
    for threads in (1, 2):
        got = _run(bundle, feeds, threads).astype(np.float64)
        # the exact model of the kernel: bf16 weights, float32 products and sums (only the
        # order of the float32 additions differs)
        k = int(np.prod(model.graph.initializer[0].dims[1:])) if "conv" in case else 200
        np.testing.assert_allclose(got, want16, rtol=0, atol=8e-7 * k * scale,
                                   err_msg=f"{case}, {threads} threads")
        # against fp32: within the guard's bound, and not exact (the weights were rounded)
        err = float(np.abs(got - want32).max()) / scale
        assert 0 < err <= 0.01, err


@pytest.mark.parametrize("case", ["mlp_b16", "conv3x3_wino"])
def test_weights_half_the_size(tmp_path, case):
    model, _, _ = CASES[case]()
    _, r32 = _export(tmp_path, model, "fp32", "fp32")
    bundle, r16 = _export(tmp_path, model, "bf16", "bf16")
    biases = sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer if len(t.dims) == 1)
    assert r16.weights_bytes - biases == (r32.weights_bytes - biases) // 2
    assert r16.bundle_bytes < r32.bundle_bytes
    assert r32.precision == "fp32" and r32.precision_note is None


def test_guard_falls_back_to_fp32(tmp_path):
    model, _, shapes = CASES["mlp_b16"]()
    feeds = {"x": RNG.standard_normal(shapes["x"]).astype(np.float32)}
    ref, _ = _export(tmp_path, model, "fp32", "fp32")
    bundle, report = _export(tmp_path, model, "guarded", "bf16", bf16_max_error=1e-6)
    assert report.precision == "fp32"
    note = report.precision_note
    assert note.startswith("bf16: error against fp32") and "exported in fp32" in note, note
    assert "\n" not in note
    assert "bfloat16" not in _weight_dtypes(bundle)
    np.testing.assert_array_equal(_run(bundle, feeds), _run(ref, feeds))


def test_guard_reports_each_output(tmp_path):
    model, _, _ = CASES["conv1x1_rows"]()
    _, report = _export(tmp_path, model, "bf16", "bf16", check=True)
    note = report.precision_note
    assert note.startswith("bf16: ") and "error against fp32" in note and "bound 1 %" in note
    assert " y " in note and "\n" not in note
    assert report.check.startswith("golden check passed")


def test_no_packed_weights_note(tmp_path):
    """x86-64-v4 keeps its kernels' plain layouts (no packing measured there): nothing is stored
    as bf16, and the report says so rather than claiming a bf16 bundle."""
    model, _, _ = CASES["mlp_b16"]()
    bundle, report = _export(tmp_path, model, "v4", "bf16", target="x86-64-v4")
    assert "no weight is stored as bf16" in report.precision_note
    assert "bfloat16" not in _weight_dtypes(bundle)


def test_unknown_precision_is_refused(tmp_path):
    from mlcpack.packager.errors import ExportError

    model, _, _ = CASES["mlp_b16"]()
    with pytest.raises(ExportError, match="precision 'fp16' is not supported"):
        _export(tmp_path, model, "x", "fp16")
    assert not (tmp_path / "x.mlc").exists()


def test_cli_precision_errors(tmp_path, run_cli, one_line_error):
    import onnx

    model, _, _ = CASES["mlp_b16"]()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    out = tmp_path / "m.mlc"
    proc = run_cli("export", path, "-o", out, "--precision", "fp16")
    assert proc.returncode == 2
    assert one_line_error(proc) == "error: --precision fp16: choose fp32 or bf16"
    proc = run_cli("export", path, "-o", out, "--precision", "bf16", "--quantize", "int8",
                   "--calibration", tmp_path)
    assert proc.returncode == 2
    assert "do not combine" in one_line_error(proc)
    assert not out.exists()


def test_cli_bf16_export(tmp_path, run_cli):
    import onnx

    # the CLI keeps convolutions and, on AVX2, matmuls of more than 2 rows fp32 (the tests
    # below): one row
    model, _, _ = CASES["mlp_b1"]()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    proc = run_cli("export", path, "-o", tmp_path / "m.mlc", "--precision", "bf16",
                   "--target", AVX2, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("bf16: ")]
    assert len(lines) == 1 and "of weights in bf16" in lines[0] and "bound 1 %" in lines[0]
    assert "golden check passed" in proc.stdout
    # the embedded golden pair carries the bf16 tolerance: `mlcpack verify` passes
    proc = run_cli("verify", tmp_path / "m.mlc")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sensitive_mlp(k: int = 24, n: int = 32, m: int = 16, batch: int = 16):
    """x -> [x, x] (w_dup: exact in bf16) -> [x, x] @ [[A + D], [-A]] = x @ D (w_bad: A's
    rounding errors are far larger than D) -> @ w_good: bf16 is fine but for w_bad."""
    a = RNG.standard_normal((k, n)).astype(np.float32)
    d = (0.01 * RNG.standard_normal((k, n))).astype(np.float32)
    weights = {"w_dup": np.concatenate([np.eye(k), np.eye(k)], 1).astype(np.float32),
               "w_bad": np.concatenate([a + d, -a], 0),
               "w_good": (RNG.standard_normal((n, m)) / np.sqrt(n)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w_dup"], ["h"]),
             helper.make_node("MatMul", ["h", "w_bad"], ["g"]),
             helper.make_node("MatMul", ["g", "w_good"], ["y"])]
    graph = helper.make_graph(
        nodes, "sensitive", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m])],
        [numpy_helper.from_array(v, name) for name, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"x": (batch, k)}


def test_guard_keeps_the_sensitive_layer_in_fp32(tmp_path):
    model, shapes = _sensitive_mlp()
    feeds = {"x": RNG.standard_normal(shapes["x"]).astype(np.float32)}
    ref, _ = _export(tmp_path, model, "fp32", "fp32")
    bundle, report = _export(tmp_path, model, "bf16", "bf16")
    assert report.precision == "bf16", report.precision_note
    assert report.precision_note.endswith("kept in fp32 (the most sensitive): w_bad")
    dtypes = _weight_dtypes(bundle)
    assert dtypes.count("bfloat16") == 2 and "float32" in dtypes
    want = _run(ref, feeds)
    err = float(np.abs(_run(bundle, feeds) - want).max()) / float(np.abs(want).max())
    assert 0 < err <= 0.01, err
    # all of it in bf16 (a bound nothing passes) is far past 1 %: the selection is what kept it
    everything, _ = _export(tmp_path, model, "all", "bf16", bf16_max_error=10.0)
    assert _weight_dtypes(everything).count("bfloat16") == 3
    err_all = float(np.abs(_run(everything, feeds) - want).max()) / float(np.abs(want).max())
    assert err_all > 0.05, err_all


def test_convolutions_stay_fp32_by_default(tmp_path):
    """Without a bf16 convolution kernel faster than fp32 (none yet: widening is slower on
    AVX2), ``--precision bf16`` keeps convolution weights fp32 and says so; the bundle is then
    the fp32 one."""
    from mlcpack.packager.options import CompileOptions

    model, _, shapes = _conv(16, 32, 3, 16)
    feeds = {"x": RNG.standard_normal(shapes["x"]).astype(np.float32)}
    ref, _ = _export(tmp_path, model, "fp32", "fp32", compile=CompileOptions())
    bundle, report = _export(tmp_path, model, "bf16", "bf16", compile=CompileOptions())
    assert "1 convolutions stay fp32: bf16 convolutions (vdpbf16ps) need x86-64-v4+bf16" \
        in report.precision_note
    assert "bfloat16" not in _weight_dtypes(bundle)
    np.testing.assert_array_equal(_run(bundle, feeds), _run(ref, feeds))


def test_compute_bound_matmuls_stay_fp32_without_vdpbf16ps(tmp_path):
    """On a target set without x86-64-v4+bf16 the widened bf16 matmul is slower than fp32 past
    2 rows (bench/bf16.py mlp@ROWS): those keep fp32 weights, and the bf16 line names them; the
    bundle then computes as the fp32 one. One row stays bf16 (half the bytes, faster)."""
    from mlcpack.packager.options import CompileOptions

    model, _, shapes = CASES["mlp_b16"]()
    feeds = {"x": RNG.standard_normal(shapes["x"]).astype(np.float32)}
    ref, _ = _export(tmp_path, model, "fp32", "fp32", compile=CompileOptions())
    bundle, report = _export(tmp_path, model, "bf16", "bf16", compile=CompileOptions())
    note = report.precision_note
    assert ("2 compute-bound matmuls (more than 2 rows) stay fp32: without x86-64-v4+bf16 "
            "(avx512_bf16) in the targets") in note and "(w0" in note and "w1" in note, note
    assert "\n" not in note
    assert "bfloat16" not in _weight_dtypes(bundle)
    np.testing.assert_array_equal(_run(bundle, feeds), _run(ref, feeds))
    model, _, _ = CASES["mlp_b1"]()
    bundle, report = _export(tmp_path, model, "b1", "bf16", compile=CompileOptions())
    assert _weight_dtypes(bundle).count("bfloat16") == 2, report.precision_note
    assert "compute-bound" not in report.precision_note
