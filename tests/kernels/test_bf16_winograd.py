"""bf16 Winograd F(2x2, 3x3) (``--precision bf16``, ``CompileOptions.bf16_winograd``):
nn.conv2d_oc with ``winograd`` and ``pairs`` (codegen/conv_oc.py, ops/layout.py
``pack_wino_pairs``): the transformed weights G w G^T rounded once to bf16 in input-channel
pairs, the transformed inputs B^T d B computed in float32 and rounded to pair words
(vcvtne2ps2bf16), the 16 products per tile in vdpbf16ps, the output transform and epilogue in
float32. By default every 3x3 stride-1 convolution fp32 runs as Winograd takes it, 2-D and 3-D.

The v4+bf16 code is checked by what it emits on any host; the native runs (bit for bit
against an instruction-exact numpy model of the kernel, and a 3-D model against ONNX Runtime)
need an x86-64 host with avx512_bf16 and skip elsewhere, saying so."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_bf16_dot_v4 import V4_BF16, cvt_bf16, fma_rne_ftz, widen

from mlcpack.packager.passes.layout import to_bfloat16
from mlcpack.runtime.cpu import host_arch, host_features

RNG = np.random.default_rng(35)
NEEDS_BF16 = ("runs vdpbf16ps: needs an x86-64 host with AVX-512 and avx512_bf16 (Zen 4, "
              "Sapphire Rapids, Cooper Lake); this one has neither or not both")


def _native() -> bool:
    return host_arch() == "x86_64" and {"avx512f", "avx512_bf16"} <= host_features()


def _model(op: str, c: int, o: int, spatial: tuple[int, ...]):
    """Conv (3x3 or 3x3x3, padding 1, bias) then ReLU."""
    k = (3,) * len(spatial)
    w = (RNG.standard_normal((o, c) + k) / np.sqrt(c * 3 ** len(k))).astype(np.float32)
    bias = (RNG.standard_normal(o) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * (2 * len(k))),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, *spatial])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, *spatial])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, w, bias


# an odd C (the last pair's odd channel zero), a block and a half of output channels, an odd
# output size (a last tile half outside), tiles past the register tiles (5 x 5 = 25 = 3 x 8 + 1)
C2, O2, HW2 = 19, 48, 9


def _pipeline(model, **fields):
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    mod, _ = import_onnx(model)
    opts = CompileOptions(target=V4_BF16, precision="bf16", **fields).for_targets(
        [resolve_target(V4_BF16)])
    return run_pipeline(mod, DEFAULT_PIPELINE, options=opts), opts


def _wino_weights(mod):
    """The Winograd bf16 pair weights the calls of ``mod``'s main read (``pack_wino_pairs``'s,
    named ``{weight}_wino_bf16``)."""
    from mlcpack.packager.ir.graph import Constant

    return [a.data for b in mod.functions["main"].bindings()
            for a in getattr(b.value, "args", ())
            if isinstance(a, Constant) and a.name.endswith("_wino_bf16")]


def test_which_convolutions_take_it():
    """Default (None) and True: a 3-D convolution (conv_nd's 2-D form) and a 2-D one take it
    (``precision.bf16_winograd_used`` says so); False: neither, and a 3x3 of 8 output
    channels (not whole vectors) never. The packing: [blocks, 16 * ceil(C / 2), 32, 2],
    unpacked back to the weights."""
    from mlcpack.packager.precision import bf16_winograd_used
    from mlcpack.packager.ops.layout import pack_wino_pairs, unpack_wino_pairs, wino_transform

    m3 = _model("conv3d", 16, 32, (4, 10, 10))[0]
    m2 = _model("conv2d", C2, O2, (HW2, HW2))[0]
    # depth folded: [O * D, C * D] = [128, 64], 32 channel pairs
    (wp,) = _wino_weights(_pipeline(m3)[0])
    assert wp.shape == (4, 16 * 32, 32, 2) and str(wp.dtype) == "bfloat16"
    mod2 = _pipeline(m2)[0]
    (wp,) = _wino_weights(mod2)
    assert wp.shape == (2, 16 * 10, 32, 2) and bf16_winograd_used(mod2)
    (wp,) = _wino_weights(_pipeline(m2, bf16_winograd=True)[0])
    assert wp.shape == (2, 16 * 10, 32, 2)
    for m in (m2, m3):
        off = _pipeline(m, bf16_winograd=False)[0]
        assert _wino_weights(off) == [] and not bf16_winograd_used(off)
    assert _wino_weights(_pipeline(_model("conv2d", C2, 8, (HW2, HW2))[0])[0]) == []
    w = RNG.standard_normal((O2, C2, 3, 3)).astype(np.float32)
    wp = pack_wino_pairs(wino_transform(w))
    assert not wp[:, :, :, 1].reshape(2, 16, 10, 32)[:, :, 9].any()   # past C
    assert not wp[1, :, 16:].any()                                     # past O
    np.testing.assert_allclose(unpack_wino_pairs(wp, O2, C2), w, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def compiled():
    import llvmlite.binding as llvm

    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.ir.graph import PrimFunc

    model, w, bias = _model("conv2d", C2, O2, (HW2, HW2))
    mod, opts = _pipeline(model, bf16_winograd=True)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    target = resolve_target(V4_BF16)
    code = compile_prim_funcs(funcs, target, options=opts)
    asm = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
    return dict(asm=asm, model=model, w=w, bias=bias, kernels=code.kernels,
                choices=[k.choice for k in code.kernels.values()])


def test_emitted(compiled):
    """The kernel is chosen, its products are vdpbf16ps on zmm registers, the transformed
    inputs converted with vcvtne2ps2bf16."""
    assert any("Winograd F(2x2, 3x3), bf16 pairs" in (c or "") for c in compiled["choices"])
    asm = compiled["asm"]
    assert "vcvtne2ps2bf16" in asm
    # the bf16 kernel keeps the code generator's LSR (fp32's Winograd kernels do not)
    from mlcpack.packager.codegen.build import winograd_kernels
    assert not winograd_kernels(compiled["kernels"])
    dots = [ln for ln in asm.splitlines() if "vdpbf16ps" in ln]
    assert dots and all("zmm" in ln for ln in dots)


def wino_bf16_model(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The kernel's result before the epilogue for x [1, C, H, W] (3x3, padding 1), in its
    float32 order: V = B^T d B per 4x4 block (rows then columns, as _wino_bt), rounded with
    vcvtne2ps2bf16; U the packed bf16 weights; per transform position and tile the pairs in
    order, each one vdpbf16ps (the odd channel's product, then the even one's); Y = A^T M A."""
    from mlcpack.packager.ops.layout import wino_transform

    _, c, h, wd = x.shape
    o = w.shape[0]
    cp = -(-c // 2)
    nty, ntx = -(-h // 2), -(-wd // 2)
    pad = np.zeros((2 * cp, 2 * nty + 2, 2 * ntx + 2), np.float32)
    pad[:c, 1:h + 1, 1:wd + 1] = x[0]
    d = np.stack([np.stack([pad[:, 2 * ty:2 * ty + 4, 2 * tx:2 * tx + 4] for tx in range(ntx)],
                           1) for ty in range(nty)], 1)        # [2cp, nty, ntx, 4, 4]
    r = [d[..., 0, :] - d[..., 2, :], d[..., 1, :] + d[..., 2, :], d[..., 2, :] - d[..., 1, :],
         d[..., 1, :] - d[..., 3, :]]
    v = np.stack([np.stack([t[..., 0] - t[..., 2], t[..., 1] + t[..., 2], t[..., 2] - t[..., 1],
                            t[..., 1] - t[..., 3]], -1) for t in r], -2)   # [.., 4, 4]
    vb = widen(cvt_bf16(v))
    ub = widen(to_bfloat16(wino_transform(w)).view(np.uint16))          # [4, 4, C, O]
    ub = np.concatenate([ub, np.zeros((4, 4, 2 * cp - c, o))], 2)
    m = np.zeros((o, nty, ntx, 4, 4))
    for j in range(cp):
        for half in (1, 0):
            ch = 2 * j + half
            p = ub[:, :, ch, :].transpose(2, 0, 1)[:, None, None] * vb[ch][None]
            m = fma_rne_ftz(m, p)
    m = m.astype(np.float32)
    s = [(m[..., 0, :] + m[..., 1, :]) + m[..., 2, :], (m[..., 1, :] - m[..., 2, :]) - m[..., 3, :]]
    y = np.stack([np.stack([(t[..., 0] + t[..., 1]) + t[..., 2],
                            (t[..., 1] - t[..., 2]) - t[..., 3]], -1) for t in s], -2)
    y = y.transpose(0, 1, 3, 2, 4).reshape(o, 2 * nty, 2 * ntx)[:, :h, :wd]
    return y[None]


def test_native_run_bit_exact(tmp_path, compiled):
    """Bit for bit ``wino_bf16_model``, then bias and ReLU in float32; 1 and 2 threads; and
    within 1 % of the fp32 convolution."""
    if not _native():
        pytest.skip(NEEDS_BF16)
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.nn import conv2d
    from mlcpack.packager.options import CompileOptions
    from mlcpack.runtime import load

    w, bias = compiled["w"], compiled["bias"]
    mod, _ = import_onnx(compiled["model"])
    path = tmp_path / "wino.mlc"
    report = export_module(mod, path, ExportOptions(
        target=V4_BF16, precision="bf16", compile=CompileOptions(bf16_winograd=True)))
    assert report.precision == "bf16", report.precision_note
    x = RNG.standard_normal((1, C2, HW2, HW2)).astype(np.float32)
    want = np.maximum(wino_bf16_model(x, w) + bias[None, :, None, None], np.float32(0))
    for threads in (1, 2):
        with load(path, threads=threads) as bundle:
            np.testing.assert_array_equal(bundle.run({"x": x})["y"], want)
    fp32 = np.maximum(conv2d(x.astype(np.float64), w.astype(np.float64), (1, 1), (1,) * 4)
                      + bias[None, :, None, None], 0)
    assert float(np.abs(want - fp32).max()) < 0.01 * float(np.abs(fp32).max())


def test_conv3d_against_onnxruntime(tmp_path):
    """A 3-D convolution exported with the default command's bf16: its Winograd layer within
    the guard's bound of ONNX Runtime's fp32 result (a short clip: depth folded, and a longer
    one: depth unfolded)."""
    if not _native():
        pytest.skip(NEEDS_BF16)
    import onnxruntime as ort

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    for depth in (4, 8):
        model, _, _ = _model("conv3d", 16, 32, (depth, 12, 12))
        mod, _ = import_onnx(model)
        path = tmp_path / f"c3d{depth}.mlc"
        report = export_module(mod, path, ExportOptions(target=V4_BF16, precision="bf16"))
        assert report.precision == "bf16", report.precision_note
        assert "Winograd F(2x2, 3x3), bf16 pairs" in "".join(
            k.get("kernel") or "" for k in _header(path)["kernels"])
        x = RNG.standard_normal((1, 16, depth, 12, 12)).astype(np.float32)
        ref = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        with load(path) as bundle:
            got = bundle.run({"x": x})["y"]
        err = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
        assert 0 < err < 0.01, err


def _header(path):
    from mlcpack.runtime.bundle import BundleReader

    with BundleReader(str(path)) as r:
        return r.header


def test_guard_retries_without_winograd(tmp_path):
    """Three 3x3 convolutions of 32 channels: the guard's check errs 0.69 % of the output's
    scale with Winograd, 0.50 % with the direct pair kernels; under a bound of 0.6 % the
    default (None) makes the export again with Winograd off and keeps every layer bf16, where
    ``bf16_winograd`` True keeps a layer fp32."""
    if not _native():
        pytest.skip(NEEDS_BF16)
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    rng = np.random.default_rng(7)
    c, nodes, inits, x = 32, [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(c * 9) * 1.4).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1] * 4))
        x = f"c{i}"
    graph = helper.make_graph(
        nodes, "three", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 10, 10])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 10, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    notes = {}
    for wino in (None, True):
        mod, _ = import_onnx(model)
        report = export_module(mod, tmp_path / "three.mlc", ExportOptions(
            target=V4_BF16, precision="bf16", bf16_max_error=0.006,
            compile=CompileOptions(bf16_winograd=wino)))
        assert report.precision == "bf16", report.precision_note
        notes[wino] = report.precision_note
    assert "54.0 KiB of weights in bf16" in notes[None] and "kept in fp32" not in notes[None]
    assert "kept in fp32" in notes[True]
