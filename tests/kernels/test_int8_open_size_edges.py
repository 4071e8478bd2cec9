"""Edges of the integer kernels with run-time image sizes.

``qdwconv2d``'s run-time-size kernel (codegen/qdepthwise.py ``_emit_open``), JIT-run on its
own: its copy into tuple words takes each border chunk's lanes once and loads a corner chunk
(whose 16/32-byte load would leave the plane) with a masked load. The input sits against a
``PROT_NONE`` page, once ending at it and once starting after it, so a byte read outside x
faults; the output is followed by a guard that must stay untouched; results bit for bit
against integer numpy (``test_int8_depthwise._case``). Sizes with odd widths, rows narrower
than a vector, planes smaller than one load, stride 1 and 2, 3x3 and 5x5 windows, 8-bit and
float32 results; x86-64-v2 (pairs; AVX2 masks bytes as it does), and the VNNI quads (native where the host has
avx512_vnni, else their arithmetic in portable IR, ``vnni_emulate``).

``qconv2d`` of 1x1 images with a run-time batch (a squeeze-and-excitation block of an
open-dims ``--quantize int8`` model): the matrix-vector kernel with the batch read at run time
(``QConv._open_vector``), not the generic loop nest; float32 + ReLU and requantizing results
bit for bit against integer numpy, batches 1, 2 and 5, x86-64-v2 and this host.

Float pools and means with run-time extents (the recognizer's SE squeezes and its AveragePool
before the neck, in fp32 and int8 bundles alike): the vector mean kernel and the symbolic
depthwise kernel, not the generic loop nest."""

from __future__ import annotations

import ctypes
import mmap
import platform
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import quant_models as qm
from conftest import X86_V2
from test_int8_depthwise import _case
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.codegen.build import emit_module
from mlcpack.packager.codegen.target import resolve_target
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.packager.ir.builder import BlockBuilder
from mlcpack.packager.ir.graph import PrimFunc
from mlcpack.packager.ir.sym import evaluate, size_var, to_record
from mlcpack.packager.options import UNPACKED
from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline
from mlcpack.packager.vm_emit import main_size_vars
from mlcpack.runtime import load
from mlcpack.runtime.cpu import host_features

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86 or "avx2" not in host_features(),
                                reason="runs x86-64-v2 and v3 code: needs an x86-64 host with AVX2")

C = 3
# kernel, strides, pads, result; sizes (n, h, w): odd widths, rows of 1-3 pixels, planes
# smaller than a 16-byte load, a row of 83
LAYERS = (((3, 3), (1, 1), (1, 1, 1, 1), "uint8"), ((5, 5), (2, 1), (2, 2, 2, 2), "float32"),
          ((3, 3), (2, 2), (1, 1, 1, 1), "uint8"))
SIZES = ((1, 1, 1), (1, 3, 5), (2, 2, 3), (1, 5, 2), (2, 7, 13), (1, 6, 83), (1, 4, 17))
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Fenced:
    """Three pages, the outer two PROT_NONE: ``place(a, end)`` copies ``a`` into the middle
    page against the page after it (``end``) or the page before it."""

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, 3 * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        for page in (0, 2):
            assert _libc.mprotect(self.base + page * PAGE, PAGE, 0) == 0

    def place(self, a: np.ndarray, end: bool) -> int:
        at = PAGE + (PAGE - a.nbytes if end else 0)
        self.map[at:at + a.nbytes] = a.tobytes()
        return self.base + at


def _kernel(attrs: dict, level: str, emulate: bool):
    """The JIT-compiled run-time-size qdwconv2d of ``attrs`` (C channels, x uint8 of shape
    (n, C, h, w)), its info, its constant arguments and the size variables' order."""
    import llvmlite.binding as llvm

    rng = np.random.default_rng(5)
    args, _, _ = _case(rng, 1, C, 4, 4, attrs["kernel"], attrs["strides"], attrs["padding"],
                       "uint8", 7, attrs["dtype"], "int32")
    bb = BlockBuilder()
    x = bb.input("x", (size_var("n"), C, size_var("h"), size_var("w")), "uint8")
    consts = [bb.constant(a, f"c{i}") for i, a in enumerate(args[1:])]
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_op("qdwconv2d", x, *consts, **attrs))
        bb.emit_func_output(out, names=["y"])
    options = UNPACKED.replace(vnni_emulate=emulate)
    mod = run_pipeline(bb.get(), DEFAULT_PIPELINE, options=options)
    funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    size_vars = main_size_vars(mod)
    target = resolve_target(level)
    emitted = emit_module(funcs, target, size_vars, thread_pool=False, options=options)
    info = emitted.kernels[funcs[0].name]
    assert info.symbolic and "planes sized at run time" in (info.choice or ""), info
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.llvm_cpu, features=target.llvm_features, opt=3, reloc="pic")
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(emitted.text), tm)
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        engine.get_function_address(info.symbol))
    return engine, fn, info, [np.ascontiguousarray(a) for a in args[1:]], size_vars


def _levels() -> list[tuple[str, bool]]:
    out = [("x86-64-v2", False)]
    if "avx512_vnni" in host_features():
        out.append(("x86-64-v4+vnni", False))
    else:
        out.append(("x86-64-v3", True))     # the quad kernel, vpdpbusd in portable IR
    return out


@pytest.mark.parametrize("level,emulate", _levels())
def test_open_depthwise_reads_and_writes_only_its_tensors(level: str, emulate: bool) -> None:
    fence = _Fenced()
    rng = np.random.default_rng(11)
    for kernel, strides, pads, yd in LAYERS:
        attrs = dict(kernel=kernel, strides=strides, padding=pads, dtype=yd,
                     bias_in_float=False, weights_int8=True)
        engine, fn, info, consts, size_vars = _kernel(attrs, level, emulate)
        for n, hh, ww in SIZES:
            oh = (hh + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
            ow = (ww + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
            if oh < 1 or ow < 1:
                continue
            x = rng.integers(0, 256, (n, C, hh, ww)).astype(np.uint8)
            # the numpy model of the same weights, bias and scales at this size
            want = _expect(x, consts, attrs)
            env = dict(zip(size_vars, [{"n": n, "h": hh, "w": ww}[v] for v in size_vars]))
            work = np.zeros(evaluate(to_record(info.workspace_expr), env) + 64, np.uint8)
            sizes = np.array([env[v] for v in size_vars], np.int64)
            for end in (True, False):
                guard = np.full(32, 77, want.dtype)
                out = np.concatenate([np.zeros(want.size, want.dtype), guard])
                ptrs = (ctypes.c_void_p * 9)(
                    fence.place(x, end), *[a.ctypes.data for a in consts], out.ctypes.data,
                    work.ctypes.data + (-work.ctypes.data % 64), sizes.ctypes.data)
                fn(ctypes.cast(ptrs, ctypes.c_void_p), 0, 1)
                what = f"{kernel} {strides} {yd} {(n, hh, ww)} at the {'end' if end else 'start'}"
                np.testing.assert_array_equal(out[:want.size].reshape(want.shape), want,
                                              err_msg=what)
                np.testing.assert_array_equal(out[want.size:], guard, err_msg=what)
        del engine


def _expect(x: np.ndarray, consts: list[np.ndarray], attrs: dict) -> np.ndarray:
    """``_case``'s integer model for these constants: int64 sums, int32 wrap, float32 scale."""
    wd, xz, bias, mult, last = consts
    kh, kw = attrs["kernel"]
    sh, sw = attrs["strides"]
    pads = attrs["padding"]
    n, c, hh, ww = x.shape
    xp = np.pad(x.astype(np.int64) - int(xz.reshape(-1)[0]), ((0, 0), (0, 0), (pads[0], pads[2]),
                                               (pads[1], pads[3])))
    oh = (hh + pads[0] + pads[2] - kh) // sh + 1
    ow = (ww + pads[1] + pads[3] - kw) // sw + 1
    w = wd.astype(np.int64).reshape(c, kh, kw)
    acc = np.zeros((n, c, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            acc += xp[:, :, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw] * \
                w[:, ky, kx].reshape(1, c, 1, 1)
    f = (acc + bias.astype(np.int64).reshape(1, c, 1, 1)).astype(np.int32).astype(np.float32) \
        * mult.reshape(1, c, 1, 1)
    if attrs["dtype"] == "float32":
        return f + last.reshape(1, c, 1, 1)
    return np.clip(np.round(f) + last.reshape(-1)[0], 0, 255).astype(np.uint8)


# ---- qconv2d of 1x1 images, run-time batch -------------------------------------------------

K, OC = 37, 19
SX, ZX, SY, ZY = 0.05, 120, 0.04, 125


def _se_graph(path: Path) -> Path:
    """x [N, K, 1, 1] -> QDQ 1x1 convolutions: float32 + ReLU (yf), requantized (yq)."""
    rng = np.random.default_rng(9)
    nodes = [h.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"])]
    inits = {"sx": np.float32(SX), "zx": np.uint8(ZX), "sy": np.float32(SY), "zy": np.uint8(ZY)}
    for name in ("f", "q"):
        ws = rng.uniform(0.002, 0.01, OC).astype(np.float32)
        inits.update({f"w{name}": rng.integers(-63, 64, (OC, K, 1, 1)).astype(np.int8),
                      f"ws{name}": ws, f"wz{name}": np.zeros(OC, np.int8),
                      f"b{name}": rng.integers(-4000, 4000, OC).astype(np.int32),
                      f"bs{name}": (np.float32(SX) * ws).astype(np.float32),
                      f"bz{name}": np.zeros(OC, np.int32)})
        nodes += [h.make_node("DequantizeLinear", [f"w{name}", f"ws{name}", f"wz{name}"],
                              [f"wd{name}"], axis=0),
                  h.make_node("DequantizeLinear", [f"b{name}", f"bs{name}", f"bz{name}"],
                              [f"bd{name}"], axis=0),
                  h.make_node("Conv", ["xd", f"wd{name}", f"bd{name}"], [f"c{name}"],
                              kernel_shape=[1, 1])]
    nodes += [h.make_node("Relu", ["cf"], ["yf"]),
              h.make_node("QuantizeLinear", ["cq", "sy", "zy"], ["qq"]),
              h.make_node("DequantizeLinear", ["qq", "sy", "zy"], ["yq"])]
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("yf", "yq")]
    return qm._save(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", K, 1, 1])], outs,
                    inits, path)


def _se_exact(src: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(src)).graph.initializer}
    xq = np.clip(np.round(x / np.float32(SX)) + ZX, 0, 255).astype(np.int64) - ZX
    out = {}
    for name in ("f", "q"):
        w = init[f"w{name}"].astype(np.int64)[:, :, 0, 0]
        acc = np.einsum("ok,nkhw->nohw", w, xq) + \
            init[f"b{name}"].astype(np.int64).reshape(1, OC, 1, 1)
        scale = np.float32(SX) * init[f"ws{name}"]
        if name == "q":
            scale = scale / np.float32(SY)
        f = acc.astype(np.int32).astype(np.float32) * scale.astype(np.float32).reshape(1, OC, 1, 1)
        if name == "f":
            out["yf"] = np.maximum(f, np.float32(0))
        else:
            q = np.clip(np.round(f) + np.float32(ZY), 0, 255)
            out["yq"] = ((q - np.float32(ZY)) * np.float32(SY)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def se_bundle(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("se_open")
    src = _se_graph(folder / "se.onnx")
    path = folder / "se.mlc"
    mod, _ = import_onnx(str(src))
    export_module(mod, path, ExportOptions(target="x86-64-v2,host", check=False))
    return src, path


@pytest.mark.parametrize("level", ["x86-64-v2", "host"])
def test_open_batch_1x1_image_convolution_is_integer_and_exact(se_bundle, level: str,
                                                               monkeypatch) -> None:
    src, path = se_bundle
    if level != "host":
        monkeypatch.setenv("MLCPACK_CPU_FEATURES", X86_V2)
    rng = np.random.default_rng(4)
    with load(path, threads=1) as model:
        kinds = [k.kernel for k in model.schema.plan.kernels]
        assert sum(k.startswith("integer matrix-vector product") for k in kinds) == 2, kinds
        for n in (1, 2, 5):
            x = (rng.standard_normal((n, K, 1, 1)) * 3).astype(np.float32)
            got = model.run({"x": x})
            for name, exact in _se_exact(src, x).items():
                np.testing.assert_array_equal(got[name], exact, err_msg=f"{name} batch {n}")


# ---- float pools and means with run-time extents ----------------------------------------------

def _pool(x: np.ndarray, kh: int, kw: int) -> np.ndarray:
    n, c, hh, ww = x.shape
    oh, ow = (hh - kh) // kh + 1, (ww - kw) // kw + 1
    v = x[:, :, :oh * kh, :ow * kw].astype(np.float64).reshape(n, c, oh, kh, ow, kw)
    return v.mean(axis=(3, 5))


def test_open_means_and_average_pools(tmp_path: Path, monkeypatch) -> None:
    """Run-time extents: GlobalAveragePool (the sum divided by the run-time H * W) and a
    ReduceMean over an open last axis take the vector mean kernel (codegen/pool.py
    ``GlobalMeanEmitter._emit_open``); AveragePools of whole windows (the recognizer's 3x2 /
    (3, 2), a 2x2 / 2) a depthwise convolution with a constant window (passes/conv_nd.py
    ``_open_avg_pool``, the symbolic depthwise kernel): no generic loop nest; within float32
    rounding of numpy at runs shorter than a vector, odd and over 4 vectors, leftover rows and
    columns, x86-64-v2 and this host, 2 threads."""
    nodes = [h.make_node("GlobalAveragePool", ["x"], ["g"]),
             h.make_node("ReduceMean", ["z"], ["r"], axes=[2], keepdims=0),
             h.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 2], strides=[3, 2]),
             h.make_node("AveragePool", ["x"], ["b"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = h.make_graph(nodes, "means",
                         [h.make_tensor_value_info("x", T.FLOAT, ["N", 6, "H", "W"]),
                          h.make_tensor_value_info("z", T.FLOAT, ["N", 5, "L"])],
                         [h.make_tensor_value_info(n, T.FLOAT, None) for n in "grab"])
    src = tmp_path / "means.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), src)
    mod, _ = import_onnx(str(src))
    path = tmp_path / "means.mlc"
    export_module(mod, path, ExportOptions(target="x86-64-v2,host", check=False))
    rng = np.random.default_rng(2)
    for level, feats in (("x86-64-v2", X86_V2), ("host", None)):
        if feats:
            monkeypatch.setenv("MLCPACK_CPU_FEATURES", feats)
        else:
            monkeypatch.delenv("MLCPACK_CPU_FEATURES", raising=False)
        with load(path, threads=2) as model:
            kinds = [k.kernel for k in model.schema.plan.kernels]
            assert sorted(k.split(",")[0] for k in kinds) == \
                ["depthwise convolution"] * 2 + ["global mean"] * 2, kinds
            for n, hh, ww, length in ((1, 3, 2, 1), (2, 4, 5, 7), (1, 9, 13, 70),
                                      (3, 12, 80, 129)):
                x = rng.standard_normal((n, 6, hh, ww)).astype(np.float32)
                z = rng.standard_normal((n, 5, length)).astype(np.float32)
                got = model.run({"x": x, "z": z})
                want = {"g": x.astype(np.float64).mean(axis=(2, 3), keepdims=True),
                        "r": z.astype(np.float64).mean(axis=2), "a": _pool(x, 3, 2),
                        "b": _pool(x, 2, 2)}
                for k, v in want.items():
                    np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6,
                                               err_msg=f"{k} {level} {x.shape}")
