"""The aarch64+bf16 level and its ``bfdot`` matmul and convolution (codegen/bf16dot.py,
bf16conv.py, ``--precision bf16``).

The arithmetic is pinned by an instruction-exact numpy model of BFDOT, written from the Arm
ARM's pseudo-code (``BFDotAdd`` without FEAT_EBF16, or with FPCR.EBF 0 as Linux leaves it):
per 32-bit lane, ``BFAdd(acc, BFAdd(BFMul(a_even, b_even), BFMul(a_odd, b_odd)))`` where every
``BFRound`` rounds **to odd** (not to nearest even, and FPCR's rounding mode is ignored),
denormal inputs read as zero, results whose unrounded exponent is below -126 flushed to zero,
an exact zero sum +0. The activations are converted by ``bfcvtn`` (FPCR's rounding: nearest
even; denormals kept, then read as zero by bfdot).

The kernels run for real under ``qemu-aarch64-static`` with its default ``max`` CPU (FEAT_BF16;
qemu's ``bfdotadd`` uses round-to-odd with flush-to-zero, as the pseudo-code), bit for bit
against the model, through the C runtime (cross-built, static: seconds) and, under
``MLCPACK_SLOW=1``, the Python runtime (an emulated numpy takes ~15 s to start); on a CPU model
without bf16 (``cortex-a76``: dotprod only) the C runtime refuses an aarch64+bf16 bundle and
runs a fat bundle's aarch64+dotprod variant (the same pair weights widened to float32). The
Python runtime's choice and refusal are checked with pinned features
(``test_level_records_bf16``)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from mlcpack.packager.passes.layout import to_bfloat16
from mlcpack.runtime import elf

from conftest import SLOW

RNG = np.random.default_rng(33)
A64_BF16 = "aarch64+bf16"
A64_FLAGS = {"fp", "asimd", "asimddp", "bf16"}
TINY = 2.0 ** -126


# ---- the CPU level ----------------------------------------------------------------------------

def test_level_records_bf16(monkeypatch):
    from mlcpack.packager.codegen.target import has_bf16_dot, portable_levels, resolve_target
    from mlcpack.runtime.cpu import best_level, check_supported, level, pick_variant
    from mlcpack.runtime.errors import CpuFeatureError

    lv = level(A64_BF16)
    assert lv.arch == "aarch64" and level("aarch64+dotprod").flags < lv.flags
    assert "bf16" in lv.flags and "+bf16" in lv.llvm_features.split(",")
    assert best_level("aarch64", A64_FLAGS) == A64_BF16
    assert best_level("aarch64", A64_FLAGS - {"bf16"}) == "aarch64+dotprod"
    # fp32 exports on a bf16 host stay as they were; bf16 ones add the level
    assert portable_levels("aarch64", A64_BF16) == ["aarch64", "aarch64+dotprod"]
    assert portable_levels("aarch64", A64_BF16, precision="bf16")[-1] == A64_BF16
    monkeypatch.setenv("MLCPACK_CPU_ARCH", "aarch64")
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", ",".join(A64_FLAGS))
    assert resolve_target("host").name == "aarch64+dotprod"
    assert resolve_target("host", "bf16").name == A64_BF16
    assert has_bf16_dot([resolve_target(n) for n in ("aarch64", A64_BF16)])
    assert not has_bf16_dot([resolve_target(n) for n in ("x86-64-v3", A64_BF16)])
    variants = [{"arch": "aarch64", "level": n, "features": []}
                for n in ("aarch64", A64_BF16, "aarch64+dotprod")]
    assert pick_variant(variants) == 1
    monkeypatch.setenv("MLCPACK_CPU_FEATURES", "fp,asimd,asimddp")   # Armv8.2, no bf16
    assert pick_variant(variants) == 2
    with pytest.raises(CpuFeatureError, match="needs bf16"):
        check_supported("aarch64", A64_BF16, [], "m.mlc")


# ---- the numpy model of BFDOT -------------------------------------------------------------------

def unpack16(h: np.ndarray) -> np.ndarray:
    """BFUnpack of bfloat16 bits -> float64, denormals read as (signed) zero."""
    f = (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.where(np.abs(f) < TINY, np.copysign(0.0, f), f)


def bf_round(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """BFRound of the exact value ``s + err`` (``s`` float64, ``err`` its TwoSum error, at most
    half an ulp of s): to float32 by **round to odd** (truncate, then set the last bit when
    anything was dropped), zero with its sign when the unrounded value is below 2^-126,
    infinity past the largest exponent. Returns the float32 values as float64."""
    s = np.asarray(s, np.float64)
    err = np.broadcast_to(np.asarray(err, np.float64), s.shape)
    inward = (err != 0) & (np.sign(err) != np.sign(s))
    # the exact value truncated to 53 bits, then to 24 (truncations compose)
    t = np.where(inward, np.nextafter(s, 0.0), s)
    bits = t.view(np.uint64)
    low = np.uint64((1 << 29) - 1)
    inexact = ((bits & low) != 0) | (err != 0)
    bits = (bits & ~low) | np.where(inexact, np.uint64(1 << 29), np.uint64(0))
    with np.errstate(over="ignore"):
        r = bits.view(np.float64).astype(np.float32).astype(np.float64)   # exact, or +-inf
    tiny = (np.abs(s) < TINY) | ((np.abs(s) == TINY) & inward)
    return np.where(tiny, np.copysign(0.0, s), r)


def bf_mul(a16: np.ndarray, b16: np.ndarray) -> np.ndarray:
    """BFMul: the product of two bfloat16 (exact in float64), BFRound'ed."""
    a, b = unpack16(a16), unpack16(b16)
    p = a * b
    zero = (a == 0) | (b == 0)
    return np.where(zero, p, bf_round(p, 0.0))   # a zero operand: a zero of the sign's xor


def bf_add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """BFAdd of two float32 values (as float64): denormal inputs read as zero, the exact sum
    (TwoSum) BFRound'ed; an exact zero +0, unless both are zeros of one sign."""
    x = np.where(np.abs(x) < TINY, np.copysign(0.0, x), x)
    y = np.where(np.abs(y) < TINY, np.copysign(0.0, y), y)
    with np.errstate(invalid="ignore"):   # an infinite sum: err is NaN, unused
        s = x + y
        bb = s - x
        err = (x - (s - bb)) + (y - bb)
    both_zero = (x == 0) & (y == 0) & (np.signbit(x) == np.signbit(y))
    exact_zero = (s == 0) & (err == 0)
    return np.where(both_zero, x, np.where(exact_zero, 0.0, bf_round(s, err)))


def bfdot(acc: np.ndarray, a_even, a_odd, b_even, b_odd) -> np.ndarray:
    """One BFDOT lane: acc + (a_even * b_even + a_odd * b_odd), the Arm pseudo-code's order."""
    return bf_add(acc, bf_add(bf_mul(a_even, b_even), bf_mul(a_odd, b_odd)))


def bfcvtn(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (FPCR's default), denormals kept."""
    return to_bfloat16(np.asarray(x, np.float32)).view(np.uint16)


def bits32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).view(np.uint32)


def test_model_of_one_instruction():
    """The rules on chosen values: round to odd (where nearest even differs), the products'
    sum rounded before the accumulator is added, flush to zero, the sign of a zero."""
    one = bfcvtn(np.float32(1.0))
    small = bfcvtn(np.float32(2.0 ** -30))
    zero = np.uint16(0)
    # 1 + 2^-30 in float32: nearest even gives 1, round to odd 1 + 2^-23
    assert bfdot(0.0, one, small, one, one) == 1.0 + 2.0 ** -23
    assert bfdot(1.0, small, zero, one, zero) == 1.0 + 2.0 ** -23
    # exact: no last bit set
    assert bfdot(1.0, one, one, one, one) == 3.0
    # the products' sum rounds first: 2^-30 + 2^-60 -> odd at 2^-30's scale, then + 1
    tiny = bfcvtn(np.float32(2.0 ** -60))
    assert bfdot(1.0, small, tiny, one, one) == 1.0 + 2.0 ** -23
    # flush to zero: a product below 2^-126, and a denormal input
    assert bfdot(0.0, bfcvtn(np.float32(2.0 ** -70)), zero, bfcvtn(np.float32(2.0 ** -60)),
                 zero) == 0.0
    denormal = np.uint16(0x0001)
    assert bfdot(0.0, denormal, zero, bfcvtn(np.float32(2.0 ** 100)), zero) == 0.0
    # an exact cancellation is +0; -0 + -0 stays -0
    minus = bfcvtn(np.float32(-1.0))
    assert np.signbit(bfdot(0.0, one, minus, one, one)) == np.False_
    assert np.signbit(bf_add(np.float64(-0.0), np.float64(-0.0)))
    # a result just above 2^-126 after rounding, but below it unrounded: flushed
    assert bf_round(np.float64(TINY), np.float64(-2.0 ** -200)) == 0.0
    # overflow to infinity
    big = bfcvtn(np.float32(2.0 ** 127))
    assert np.isinf(bfdot(0.0, big, big, big, big))


def bfdot_matmul(a: np.ndarray, bp: np.ndarray, n: int) -> np.ndarray:
    """The kernel's accumulator for a [M, K] float32 times the packed pairs ``bp`` [panels,
    ceil(K / 2), nr, 2] (bfloat16 bits, as stored): one bfdot per pair row, in order of K."""
    m, k = a.shape
    pairs = bp.shape[1]
    ah = np.zeros((m, 2 * pairs), dtype=np.uint16)
    ah[:, :k] = bfcvtn(a)
    cols = np.arange(n)
    bw = bp[cols // bp.shape[2], :, cols % bp.shape[2], :]   # [n, pairs, 2]
    acc = np.zeros((m, n))
    for j in range(pairs):
        acc = bfdot(acc, ah[:, 2 * j, None], ah[:, 2 * j + 1, None], bw[None, :, j, 0],
                    bw[None, :, j, 1])
    return acc.astype(np.float32)


def bfdot_conv(x: np.ndarray, wp: np.ndarray, strides, padding) -> np.ndarray:
    """The convolution kernel's accumulators for x [1, C, H, W] and ``wp`` [O, ceil(C / 2), KH,
    KW, 2] (bfloat16 bits): per channel pair, per tap (row-major), one bfdot; the activations
    as the pair planes hold them (bfcvtn of each channel, zero padding, a zero channel past an
    odd C)."""
    _, c, h, w = x.shape
    o, cp, kh, kw, _ = wp.shape
    sh, sw = strides
    pt, pl, pb, pr = padding
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    xb = np.zeros((2 * cp, h + pt + pb, w + pl + pr), np.uint16)
    xb[:c, pt:pt + h, pl:pl + w] = bfcvtn(x[0])
    acc = np.zeros((o, oh, ow))
    for j in range(cp):
        for ky in range(kh):
            for kx in range(kw):
                win = (slice(ky, ky + sh * (oh - 1) + 1, sh), slice(kx, kx + sw * (ow - 1) + 1, sw))
                acc = bfdot(acc, xb[(2 * j, *win)][None], xb[(2 * j + 1, *win)][None],
                            wp[:, j, ky, kx, 0][:, None, None], wp[:, j, ky, kx, 1][:, None, None])
    return acc.astype(np.float32)[None]


# ---- the models (ONNX) ----------------------------------------------------------------------------

def _onnx(nodes, inputs, outputs, inits):
    from onnx import helper, numpy_helper

    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _gemm(m: int, k: int, n: int):
    from onnx import TensorProto, helper

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    bias = (RNG.standard_normal(n) * 0.1).astype(np.float32)
    model = _onnx([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1),
                   helper.make_node("Relu", ["g"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                  {"w": w, "b": bias})
    return model, {"w": w, "bias": bias}


def _wide_range(shape) -> np.ndarray:
    """bfloat16-exact float32 values of both signs over 2^-140 .. 2^20 (denormal products,
    cancellations, sums far from exact), a tenth of them zero."""
    exp = RNG.integers(-140, 20, shape)
    mant = 1 + RNG.integers(0, 128, shape) / 128.0
    v = np.ldexp(mant, exp) * RNG.choice([-1.0, 1.0], shape)
    v[RNG.random(shape) < 0.1] = 0.0
    return to_bfloat16(v.astype(np.float32)).astype(np.float32)


def _edge_feed(shape) -> np.ndarray:
    """``_wide_range`` with a zero row (outputs of +0, the sign rule of exact zeros)."""
    x = _wide_range(shape)
    x[0] = 0.0
    return x


def _edge_matmul(m: int, k: int, n: int):
    """A MatMul (no epilogue) of wide-range operands: the instruction's rounding, flushing and
    zero signs through the kernel, bit for bit."""
    from onnx import TensorProto, helper

    w = _wide_range((k, n))
    model = _onnx([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], {"w": w})
    return model, {"w": w.T.copy(), "bias": np.zeros(n, np.float32)}


def _conv(c: int, o: int, k: int, hw: int, stride: int):
    from onnx import TensorProto, helper

    w = (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = (RNG.standard_normal(o) * 0.1).astype(np.float32)
    pad = k // 2
    out = (hw + 2 * pad - k) // stride + 1
    model = _onnx([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4,
                                    strides=[stride, stride]),
                   helper.make_node("Relu", ["c"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, out, out])],
                  {"w": w, "b": bias})
    return model, {"w": w, "bias": bias, "strides": (stride, stride), "padding": (pad,) * 4}


# K = 301: two chunks of converted activations (A_CHUNK 256), the second of odd length; 37
# columns: a partial panel. The conv: an odd C, a strided 3x3 with padding, 10 output channels
# (a partial block of tile rows).
CASES = {"gemm": lambda: _gemm(5, 301, 37), "edge": lambda: _edge_matmul(6, 40, 20),
         "conv": lambda: _conv(5, 10, 3, 9, 2)}
FEEDS = {"gemm": lambda: RNG.standard_normal((5, 301)).astype(np.float32),
         "edge": lambda: _edge_feed((6, 40)),
         "conv": lambda: RNG.standard_normal((1, 5, 9, 9)).astype(np.float32)}


def _want(case: str, meta: dict, x: np.ndarray) -> np.ndarray:
    """The model's accumulators, then the float32 epilogue (+ bias, ReLU) of the case."""
    from mlcpack.packager.ops.bf16 import pack_conv_pairs, pack_pairs

    if case == "conv":
        wp = pack_conv_pairs(to_bfloat16(meta["w"])).view(np.uint16)
        acc = bfdot_conv(x, wp, meta["strides"], meta["padding"])
        return np.maximum(acc + meta["bias"][None, :, None, None], np.float32(0))
    w = meta["w"]
    acc = bfdot_matmul(x, pack_pairs(to_bfloat16(w.T)).view(np.uint16), w.shape[0])
    return acc if case == "edge" else np.maximum(acc + meta["bias"], np.float32(0))


def _fp32(case: str, meta: dict, x: np.ndarray) -> np.ndarray:
    from mlcpack.packager.ops.nn import conv2d

    if case == "conv":
        c = conv2d(x.astype(np.float64), meta["w"].astype(np.float64), meta["strides"],
                   meta["padding"]) + meta["bias"][None, :, None, None]
    else:
        c = x.astype(np.float64) @ meta["w"].T.astype(np.float64) + meta["bias"]
    return np.maximum(c, 0)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each case exported (``--precision bf16``) for aarch64+dotprod,aarch64+bf16 (one
    pair-packed weight, two variants; the edge case for aarch64+bf16 alone too), with its feeds
    and both levels' assembly."""
    import llvmlite.binding as llvm

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.codegen.build import _target_machine
    from mlcpack.packager.codegen.parallel import compile_prim_funcs
    from mlcpack.packager.codegen.target import resolve_target
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ir.graph import Constant, PrimFunc
    from mlcpack.packager.options import CompileOptions
    from mlcpack.packager.passes.pipeline import DEFAULT_PIPELINE, run_pipeline

    tmp = tmp_path_factory.mktemp("a64bf16")
    out = {}
    for case, make in CASES.items():
        model, meta = make()
        x = FEEDS[case]()
        paths = {}
        levels = {"fat": f"aarch64+dotprod,{A64_BF16}", "bf16": A64_BF16}
        for name, target in levels.items():
            if name == "bf16" and case != "edge":
                continue   # one bundle of aarch64+bf16 alone is enough for the refusals
            mod, _ = import_onnx(model)
            paths[name] = tmp / f"{case}-{name}.mlc"
            report = export_module(mod, paths[name], ExportOptions(target=target,
                                                                    precision="bf16"))
            assert report.precision == "bf16", report.precision_note
        mod, _ = import_onnx(model)
        opts = CompileOptions(target=f"aarch64+dotprod,{A64_BF16}", precision="bf16")
        mod = run_pipeline(mod, DEFAULT_PIPELINE, options=opts)
        packed = [a for b in mod.functions["main"].bindings()
                  for a in getattr(b.value, "args", ())
                  if isinstance(a, Constant) and str(a.data.dtype) == "bfloat16"]
        funcs = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
        asm = {}
        for name in ("aarch64+dotprod", A64_BF16) if case != "edge" else ():   # gemm's kernel
            target = resolve_target(name)
            code = compile_prim_funcs(funcs, target, options=opts.for_targets([target]))
            asm[name] = _target_machine(target).emit_assembly(llvm.parse_assembly(code.llvm_ir))
        out[case] = dict(meta=meta, x=x, paths=paths, packed=packed,
                         funcs=[f.name for f in funcs], asm=asm)
    return out


@pytest.mark.parametrize("case", ["conv", "gemm"])
def test_kernel_selected_and_emitted(built, case):
    got = built[case]
    assert len(got["packed"]) == 1
    kind = "conv2d_bf16p" if case == "conv" else "matmul_bf16p"
    assert any(kind in f for f in got["funcs"]), got["funcs"]
    asm = got["asm"]
    # activations rounded by bfcvtn, the products in bfdot: a broadcast pair (a lane-indexed
    # operand, or a dup/ld1r splat) against a vector of 4 columns' (pixels') pairs
    assert "bfdot\tv" in asm[A64_BF16] and "bfcvtn" in asm[A64_BF16]
    # the level below widens the same pair weights: no bf16 instruction
    assert "bfdot" not in asm["aarch64+dotprod"] and "bfcvt" not in asm["aarch64+dotprod"]


@pytest.mark.parametrize("case", ["gemm", "conv"])
def test_model_within_bf16_error_of_fp32(built, case):
    """The model on the kernel's packing: within 1 % of fp32 (bf16 operands, float32 sums)."""
    got = built[case]
    want = _want(case, got["meta"], got["x"]).astype(np.float64)
    fp32 = _fp32(case, got["meta"], got["x"])
    err = float(np.abs(want - fp32).max()) / float(np.abs(fp32).max())
    assert 0 < err < 0.01, err


def test_model_differs_from_nearest_even(built):
    """The wide-range case is one where round to odd matters: the same chain with each sum
    rounded to nearest even (float32 arithmetic) differs in some outputs, so a kernel that
    rounded to nearest would fail the bit-exact run."""
    from mlcpack.packager.ops.bf16 import pack_pairs

    got = built["edge"]
    w, x = got["meta"]["w"], got["x"]
    model = bfdot_matmul(x, pack_pairs(to_bfloat16(w.T)).view(np.uint16), w.shape[0])
    xa = unpack16(bfcvtn(x)).astype(np.float32)
    wa = unpack16(bfcvtn(w)).astype(np.float32)
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    with np.errstate(all="ignore"):
        for j in range(0, x.shape[1], 2):
            acc = acc + (xa[:, j, None] * wa[None, :, j] + xa[:, j + 1, None] * wa[None, :, j + 1])
    assert (bits32(model) != bits32(acc)).any()
    assert (model == 0).any() and np.isfinite(model).all()


# ---- run under qemu-aarch64 ------------------------------------------------------------------------

QEMU = shutil.which("qemu-aarch64-static")
CROSS = shutil.which("aarch64-linux-gnu-gcc")
needs_qemu = pytest.mark.skipif(
    elf._real_arch() != "x86_64" or QEMU is None,
    reason="runs aarch64 code under qemu-aarch64-static from an x86-64 host (Debian's "
           "qemu-user-static); on an aarch64 host with bf16 the runtime tests run it natively")

# Run by the emulated python: each bundle loaded and run; the chosen levels printed.
_RUNNER = """
import json, sys
import numpy as np
from mlcpack.runtime import load
report = {}
for job in json.load(open(sys.argv[1])):
    with load(job["bundle"]) as model:
        np.savez(job["outputs"], **model.run(dict(np.load(job["inputs"]))))
        report[job["bundle"]] = model.code_variant["level"]
print(json.dumps(report))
"""


@needs_qemu
@pytest.mark.skipif(not SLOW, reason="~30 s (numpy's start under qemu); the C runtime's test "
                    "runs the same kernels: MLCPACK_SLOW=1")
def test_python_runtime_runs_bfdot_under_qemu_bit_exact(built, tmp_path):
    """qemu's default CPU (max: FEAT_BF16) through the Python runtime, which reads HWCAP2_BF16:
    every bundle picks aarch64+bf16 and gives the model's bits (the wide-range matmul: round to
    odd, flush to zero and zero signs, for real). One emulated process (numpy under qemu takes
    seconds to start)."""
    from arm64_root import arm64_root_or_fail, runtime_package

    from conftest import ROOT

    root = arm64_root_or_fail()
    pkg = runtime_package(tmp_path / "app", ROOT)
    jobs, keys = [], {}
    for case, got in built.items():
        np.savez(tmp_path / f"{case}-in.npz", x=got["x"])
        for name, path in got["paths"].items():
            jobs.append({"bundle": str(path), "inputs": str(tmp_path / f"{case}-in.npz"),
                         "outputs": str(tmp_path / f"{case}-{name}.npz")})
            keys[str(path)] = (case, name)
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "runner.py").write_text(_RUNNER)
    proc = root.run_python([str(tmp_path / "runner.py"), str(tmp_path / "jobs.json")],
                           pythonpath=[pkg])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(report.values()) == [A64_BF16] * len(jobs), report
    for case, name in keys.values():
        got = built[case]
        with np.load(tmp_path / f"{case}-{name}.npz") as data:
            y = data["y"]
        want = _want(case, got["meta"], got["x"])
        np.testing.assert_array_equal(bits32(y), bits32(want), err_msg=f"{case} {name}")


@needs_qemu
@pytest.mark.skipif(CROSS is None, reason="cross-builds the C runtime: needs Debian's "
                    "gcc-aarch64-linux-gnu (apt-get install gcc-aarch64-linux-gnu)")
def test_c_runtime_reads_hwcap2_bf16_under_qemu(built, tmp_path):
    """The C runtime (``make aarch64``, static) reads HWCAP2_BF16 from the auxiliary vector:
    on qemu's max CPU it picks aarch64+bf16 and every case gives the model's bits (the
    wide-range matmul: round to odd, flush to zero and zero signs, for real); on cortex-a76 (dotprod,
    no bf16) it refuses the aarch64+bf16 bundle (exit 5, one line naming bf16 and the level to
    export for), and runs the fat bundles' aarch64+dotprod variant: the same pair weights
    widened, float32 activations, within float32 summation error of the product with the
    bf16-rounded weights."""
    from conftest import ROOT

    cdir = ROOT / "runtime" / "c"
    proc = subprocess.run(["make", "-C", str(cdir), "-j2", "aarch64"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mlcrun = cdir / "build-aarch64" / "mlcrun"

    def run(cpu: str, *args) -> subprocess.CompletedProcess:
        return subprocess.run([QEMU, "-cpu", cpu, str(mlcrun), *map(str, args)],
                              capture_output=True, text=True, timeout=120)

    def outputs(cpu: str, case: str, name: str) -> np.ndarray:
        np.save(tmp_path / f"{case}.npy", built[case]["x"])
        out = tmp_path / f"{case}-{name}-{cpu}"
        proc = run(cpu, "run", built[case]["paths"][name], tmp_path / f"{case}.npy", "-o", out)
        assert proc.returncode == 0, proc.stderr
        return np.load(out / "out0.npy")

    edge = built["edge"]
    for case, got in built.items():
        for name, path in got["paths"].items():
            proc = run("max", "inspect", path)
            assert proc.returncode == 0 and f"code {A64_BF16} (aarch64" in proc.stdout, \
                proc.stdout + proc.stderr
            want = _want(case, got["meta"], got["x"])
            np.testing.assert_array_equal(bits32(outputs("max", case, name)), bits32(want),
                                          err_msg=f"{case} {name}")
    proc = run("cortex-a76", "inspect", edge["paths"]["bf16"])
    lines = proc.stderr.splitlines()
    assert proc.returncode == 5 and len(lines) == 1, proc.stderr
    assert "needs bf16" in lines[0] and "--target aarch64+dotprod" in lines[0], lines[0]
    for case in ("gemm", "conv"):
        got = built[case]
        proc = run("cortex-a76", "inspect", got["paths"]["fat"])
        assert "code aarch64+dotprod (aarch64" in proc.stdout, proc.stdout + proc.stderr
        y = outputs("cortex-a76", case, "fat").astype(np.float64)
        meta = dict(got["meta"], w=to_bfloat16(got["meta"]["w"]).astype(np.float32))
        ref = _fp32(case, meta, got["x"])
        k = int(np.prod(meta["w"].shape[1:]))
        np.testing.assert_allclose(y, ref, rtol=0, atol=2 ** -23 * k * float(np.abs(ref).max()))


@needs_qemu
@pytest.mark.skipif(CROSS is None, reason="cross-builds the C runtime: needs Debian's "
                    "gcc-aarch64-linux-gnu (apt-get install gcc-aarch64-linux-gnu)")
def test_symbolic_rows_under_qemu(tmp_path):
    """A Gemm with a symbolic batch (matmul_bf16p with run-time extents) exported for
    aarch64+dotprod,aarch64+bf16 and run at batch 3 by the C runtime on qemu's max CPU: the
    model's bits."""
    from onnx import TensorProto, helper

    from conftest import ROOT
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.bf16 import pack_pairs

    w = (RNG.standard_normal((37, 45)) / 7).astype(np.float32)
    model = _onnx([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 45])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 37])],
                  {"w": w})
    mod, _ = import_onnx(model)
    path = tmp_path / "sym.mlc"
    report = export_module(mod, path, ExportOptions(target=f"aarch64+dotprod,{A64_BF16}",
                                                    precision="bf16"))
    assert report.precision == "bf16", report.precision_note
    cdir = ROOT / "runtime" / "c"
    proc = subprocess.run(["make", "-C", str(cdir), "-j2", "aarch64"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    x = RNG.standard_normal((3, 45)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = subprocess.run([QEMU, str(cdir / "build-aarch64" / "mlcrun"), "run", str(path),
                           str(tmp_path / "x.npy"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    want = bfdot_matmul(x, pack_pairs(to_bfloat16(w.T)).view(np.uint16), 37)
    np.testing.assert_array_equal(bits32(np.load(tmp_path / "out" / "out0.npy")), bits32(want))
