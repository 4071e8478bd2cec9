"""Fuse quantized matrix products and convolutions (QDQ compositions, see
``frontends/onnx/quant.py``) into integer arithmetic with a fused requantization.

Matched (scales and zero points constants, each intermediate read only by the next step):
    q = quantize(matmul(dequantize(x, xs, xzp), dequantize(W, ws, wzp)[, transpose_b])
                 [+ dequantize(B int32, bs, 0)], ys, yzp, dtype=int8|uint8)
    q = quantize(nn.conv2d(dequantize(x, xs, xzp), dequantize(W, ws, wzp))
                 [+ [reshape](dequantize(B int32, bs, 0))], ys, yzp, dtype=int8|uint8)
x int8/uint8 per tensor, W an int8/uint8 constant per tensor or per output channel, B int32
with bs == xs * ws in float32 (what ONNX Runtime's quantizer writes). This is what
QLinearMatMul, QGemm, QLinearConv and QDQ MatMul/Gemm/Conv import as, and what ONNX Runtime
runs as QLinearMatMul/QGemm/QLinearConv: acc = sum (x - xzp)(w - wzp) + B in int32, then
saturate(round_half_even(float32(acc) * (xs * ws / ys)) + yzp) (MLAS MlasRequantizeOutput).

Two ways to compute it, both equal to ONNX Runtime bit for bit:
- Float32-exact (the fast path): when every partial sum is bounded below 2**24 (checked at
  export from the constant weights, x's dtype range and the bias), float32 accumulation in any
  order gives the int32 sum exactly, so the product becomes dequantize(x, 1, xzp) @/conv
  float32(W - wzp) [+ B] * multiplier -> quantize(., 1, yzp): the fp32 GEMM/convolution with
  the requantization in its epilogue. Used only where it pays: the result read by one
  dequantize (fused into the epilogue, since the fp32 kernels write float32) and x's
  dequantize read by this product alone.
- ``qmatmul`` (``ops/qlinear.py``, int32 accumulation, a te loop nest: correct, slow) for
  matmuls whose integer result is a graph output.
Everything else stays the float composition (``fold_dequantize`` folds the weights), within
one quantization step of ONNX Runtime; so does a convolution that ``int8_cost.py`` finds
faster on the fp32 kernels for the targets (no int8 dot instruction, fp32 Winograd).
With run-time image sizes (open batch / height / width) a convolution takes the integer kernel
where the quad kernel's run-time-size form applies (``int8_cost.open_conv_integer``: int8
weights packed as quads, 7-bit or split where that pays, not a 3x3 stride-1 layer fp32's
Winograd wins); the others keep the float32-exact chain.

Dynamic quantization (onnxruntime's quantize_dynamic: a float result scaled from int32 with a
run-time x scale and zero point) takes the integer kernels too, with a float32 epilogue:
MatMulInteger / ConvInteger chains (``fuse_qdq_dynamic.py``) and
DynamicQuantizeLSTM's input projection (``plan_requantized_products``: its weights were
dequantized at import; the integers are recovered exactly from the float32 constant).

Not done: VNNI (vpdpbusd) / AVX2 (vpmaddubsw) / sdot packed int8 kernels, so int8 runs at fp32
speed at best (bench/int8.py); ReLU/Clip between the product and the quantize (ORT's quantizer
folds them into the output range).

DynamicQuantizeLSTM's recurrent product (``integer_recurrences``): the fused recurrence kernel
takes int8 R and a scale per weight row when the dequantized R is exactly that (``int_r``), and
computes ORT's integer product (uint8 h - zp times int8 R, int32 sums, float32(acc) * (h_scale *
r_scale)); ddddocr's H = 512 LSTM streams 1 MB per step and direction instead of 4 MB.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import Binding, Call, Constant, Function, IRModule, TensorType, Value, Var, used_values
from ..ops.qlinear import PANEL, pack_conv_weights, pack_weights_offset
from ..options import CompileOptions
from .common import map_functions, rewrite_function
from .fuse_qdq_common import I8, const_of, conv_channels, matmul_columns, static_shapes
from .fuse_qdq_dw import depthwise_call
from .fuse_qdq_dynamic import (integer_recurrences, plan_integer_convs, plan_integer_products,
                               plan_requantized_products)
from .fuse_qdq_float import plan_float_products
from .int8_cost import float_conv_reason, open_conv_integer
from .quad_weights import split_share
from .simplify import eliminate_dead_code
from .stored_int import integer_constant


def fuse_quantized(mod: IRModule, options: CompileOptions) -> IRModule:
    """QDQ patterns into integer kernels; with ``options.int8_kernels`` False (compared in
    bench/int8.py) into the float32-exact chains the integer kernels replaced."""
    # the float products replaced are dropped here, so nothing legalizes them
    int8 = options.int8_kernels
    mod = eliminate_dead_code(map_functions(mod, lambda fn: _fuse_in_function(fn, int8,
                                                                              options)))
    return map_functions(mod, integer_recurrences) if int8 else mod


def _fuse_in_function(fn: Function, int8: bool, options: CompileOptions) -> Function:
    defs: dict[int, Call] = {}
    uses: Counter = Counter()
    readers: dict[int, list[str]] = {}
    reader_of: dict[int, list[Binding]] = {}
    for b in fn.bindings():
        if isinstance(b.value, Call):
            defs[id(b.var)] = b.value
        for a in used_values(b.value):
            uses[id(a)] += 1
            readers.setdefault(id(a), []).append(getattr(b.value, "op", ""))
            reader_of.setdefault(id(a), []).append(b)
    for o in fn.outputs:
        uses[id(o)] += 1
    float_products = plan_float_products(fn, defs, uses, reader_of, options) if int8 else {}
    pre_bindings: dict[int, list[Binding]] = {}   # bindings a planned call reads, put before it
    if int8:
        float_products.update(plan_integer_products(fn, defs, uses, reader_of))
        float_products.update(plan_requantized_products(fn, defs, uses, reader_of,
                                                         pre_bindings))
        float_products.update(plan_integer_convs(fn, defs, uses, reader_of, pre_bindings))
    inserted: dict[int, list[Binding]] = {}

    def call(v: Value, op: str, single: bool = True) -> Call | None:
        c = defs.get(id(v))
        if c is not None and c.op == op and (not single or uses[id(v)] == 1):
            return c
        return None

    def match(q: Call):
        if q.op != "quantize" or q.attrs.get("dtype") not in I8 or len(q.args) != 3:
            return None
        ys, yzp = const_of(q.args[1]), const_of(q.args[2])
        if ys is None or yzp is None or ys.size != 1 or yzp.size != 1 or ys.dtype != np.float32:
            return None
        inner, bias_dq = q.args[0], None
        add = call(inner, "add")
        if add is not None:
            for mm_v, b_v in (add.args, add.args[::-1]):
                if call(mm_v, "matmul") is not None and call(b_v, "dequantize", False):
                    inner, bias_dq = mm_v, call(b_v, "dequantize", False)
                    break
            else:
                return None
        mm = call(inner, "matmul")
        if mm is None:
            return None
        dx = call(mm.args[0], "dequantize", False)
        dw = call(mm.args[1], "dequantize", False)
        if dx is None or dw is None:
            return None
        x = dx.args[0]
        xs, xzp = const_of(dx.args[1]), const_of(dx.args[2])
        w, ws, wzp = (const_of(a) for a in dw.args)
        if (x.type.dtype not in I8 or xs is None or xzp is None or xs.size != 1 or xzp.size != 1
                or xs.dtype != np.float32 or w is None or ws is None or wzp is None
                or w.dtype.name not in I8 or w.ndim != 2 or ws.dtype != np.float32
                or len(x.type.shape) < 2):
            return None
        if set(mm.attrs) - {"transpose_b"}:
            return None
        cols = matmul_columns(w, ws, wzp, bool(mm.attrs.get("transpose_b", False)))
        if cols is None:
            return None
        wk, ws_n, wzp_n = cols
        n = wk.shape[1]
        bias = np.zeros(n, np.int32)
        sx = np.float32(xs.reshape(()))
        if bias_dq is not None:
            bq, bs, bzp = (const_of(a) for a in bias_dq.args)
            if bq is None or bs is None or bzp is None or bq.dtype != np.int32 or np.any(bzp != 0):
                return None
            try:
                bq_n = np.broadcast_to(bq.reshape(-1) if bq.size == n else bq, (n,))
                bs_n = np.broadcast_to(bs.reshape(-1) if bs.size == n else bs, (n,))
            except ValueError:
                return None
            if not np.array_equal(bs_n.astype(np.float32), (sx * ws_n).astype(np.float32)):
                return None
            bias = bq_n.astype(np.int32)
        multiplier = ((sx * ws_n.astype(np.float32)) / np.float32(ys.reshape(()))).astype(np.float32)
        dtype = q.attrs["dtype"]
        out = TensorType(tuple(x.type.shape[:-1]) + (n,), dtype)
        if out != q.type:
            return None
        wd = wk.astype(np.int32) - wzp_n.astype(np.int32).reshape(1, n)
        return dict(x=x, wd=wd, xzp=int(xzp.reshape(())), bias=bias, mult=multiplier,
                    yzp=float(yzp.reshape(())), dtype=dtype, out=out, x_dq=mm.args[0])

    conv_inputs: list[Value] = []      # match_conv's dequantized input, when it matched

    def match_conv(q: Call):
        """quantize(add(nn.conv2d(dq(x), dq(W const)), [reshape](dq(B int32))), ys, yzp) whose
        sums are exact in float32: the chain of ``_float_chain`` with a convolution."""
        if q.op != "quantize" or q.attrs.get("dtype") not in I8:
            return None
        ys, yzp = const_of(q.args[1]), const_of(q.args[2])
        if ys is None or yzp is None or ys.size != 1 or yzp.size != 1 or ys.dtype != np.float32:
            return None
        inner, bias_dq = q.args[0], None
        add = call(inner, "add")
        if add is not None:
            for cv, bv in (add.args, add.args[::-1]):
                r = call(bv, "reshape", False)
                d = call(r.args[0] if r is not None else bv, "dequantize", False)
                if call(cv, "nn.conv2d") is not None and d is not None:
                    inner, bias_dq = cv, d
                    break
            else:
                return None
        cv = call(inner, "nn.conv2d")
        if cv is None or len(cv.args) != 2:
            return None
        dx, dw = call(cv.args[0], "dequantize", False), call(cv.args[1], "dequantize", False)
        if dx is None or dw is None:
            return None
        conv_inputs.append(cv.args[0])
        x = dx.args[0]
        xs, xzp = const_of(dx.args[1]), const_of(dx.args[2])
        w, ws, wzp = (const_of(a) for a in dw.args)
        if (x.type.dtype not in I8 or xs is None or xzp is None or xs.size != 1
                or xzp.size != 1 or xs.dtype != np.float32 or w is None or ws is None
                or wzp is None or w.dtype.name not in I8 or w.ndim != 4
                or ws.dtype != np.float32):
            return None
        o = w.shape[0]
        chans = conv_channels(ws, wzp, o)
        if chans is None:
            return None
        ws_o, wzp_o = chans
        sx = np.float32(xs.reshape(()))
        bias = np.zeros(o, np.int64)
        if bias_dq is not None:
            bq, bs, bzp = (const_of(a) for a in bias_dq.args)
            if (bq is None or bs is None or bzp is None or bq.dtype != np.int32 or bq.size != o
                    or np.any(bzp != 0)):
                return None
            bs_o = np.broadcast_to(bs.reshape(-1) if bs.size == o else bs, (o,))
            if not np.array_equal(bs_o.astype(np.float32), (sx * ws_o).astype(np.float32)):
                return None
            bias = bq.reshape(o).astype(np.int64)
        info = np.iinfo(x.type.dtype)
        x_dev = max(int(xzp.reshape(())) - info.min, info.max - int(xzp.reshape(())))
        wd = w.astype(np.int64) - wzp_o.astype(np.int64).reshape(o, 1, 1, 1)
        mult = ((sx * ws_o) / np.float32(ys.reshape(()))).astype(np.float32).reshape(1, o, 1, 1)
        # faster on the fp32 kernels on these targets (passes/int8_cost.py): the float chain
        # share of the quad kernel's words over vpmaddubsw's pair bound: 0 with 7-bit weights
        share = split_share(wd) if options.conv_quads7 else None
        float_reason = static_shapes(x, q) and float_conv_reason(
            w.shape, cv.attrs["strides"], q.type.shape, cv.attrs.get("groups", 1), options,
            w7=share == 0, split_share=share,
            signed_ok=share is not None and bool(wd.min() >= -127))
        # run-time image sizes: the quad kernel's open form where it applies (int8_cost.py)
        sized = static_shapes(x, q) or open_conv_integer(
            w.shape, cv.attrs["strides"], cv.attrs.get("groups", 1), options, share)
        if (int8 and not float_reason and cv.attrs.get("groups", 1) == 1
                and tuple(cv.attrs.get("dilation", (1, 1))) == (1, 1) and sized):
            args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", pack_conv_weights(wd)),
                    Constant("x_zp", np.asarray(int(xzp.reshape(())), np.int32)),
                    Constant("bias_i32", bias.astype(np.int32)),
                    Constant("requant_scale", mult.reshape(o).copy()),
                    Constant("y_zp", np.asarray(float(yzp.reshape(())), np.float32))]
            return "int", (args, {"out_channels": o, "kernel": tuple(w.shape[2:]),
                                  "strides": tuple(cv.attrs["strides"]),
                                  "padding": tuple(cv.attrs["padding"]),
                                  "dtype": q.attrs["dtype"]})
        if int8 and cv.attrs.get("groups", 1) != 1:
            dw = depthwise_call(x, cv, wd, int(xzp.reshape(())), bias, mult.reshape(o),
                                np.float32(yzp.reshape(())), q.attrs["dtype"], q.type)
            if dw is not None:
                return "dw", dw
        if (np.abs(wd).sum(axis=(1, 2, 3)) * x_dev + np.abs(bias)).max() >= _F32_EXACT:
            return None
        one = Constant("one", np.asarray(1.0, np.float32))
        f32 = "float32"
        ct = cv.type
        steps = [("dequantize", [x, one, Constant("x_zp", xzp.astype(x.type.dtype))], {},
                  TensorType(x.type.shape, f32)),
                 ("nn.conv2d", [None, integer_constant("qw_f32", wd)],
                  dict(cv.attrs), ct)]
        if np.any(bias):
            steps.append(("add", [None, Constant("bias_f32",
                                                 bias.astype(np.float32).reshape(1, o, 1, 1))],
                          {}, ct))
        steps.append(("multiply", [None, Constant("requant_scale", mult)], {}, ct))
        steps.append(("quantize", [None, one, Constant("y_zp", yzp.astype(q.attrs["dtype"]))],
                      {"dtype": q.attrs["dtype"], "unit_scale": True}, q.type))
        return "float", steps

    def visit(b, lookup):
        v = b.value
        if id(b.var) in float_products:     # a quantized product with a float result
            c = float_products[id(b.var)]
            if id(b.var) in pre_bindings:
                inserted[id(b.var)] = [
                    Binding(p.var, Call(p.value.op, [lookup(a) for a in p.value.args],
                                        p.value.attrs, p.value.type), b.source)
                    for p in pre_bindings[id(b.var)]]
            return Call(c.op, [lookup(a) for a in c.args], c.attrs, c.type)
        if not isinstance(v, Call) or v.op != "quantize":
            return None
        # The fp32 GEMM/conv kernels write float32 only: the float chain pays when the
        # integer result is read by one dequantize alone (fused into the epilogue) and x's
        # dequantize by this product alone (replaced, not duplicated); otherwise the float
        # composition stays (a uint8 output would take the generic loop nest), except an
        # integer graph output, which takes the int32 kernel (exact, slow).
        fast = readers.get(id(b.var)) == ["dequantize"] and uses[id(b.var)] == 1
        conv_inputs.clear()
        res = match_conv(v)
        if res is not None:
            kind, payload = res
            if kind == "int":
                args, attrs = payload
                return Call("qconv2d", [lookup(args[0])] + args[1:], attrs, v.type)
            if kind == "dw":
                return Call("qdwconv2d", [lookup(payload.args[0])] + payload.args[1:],
                            payload.attrs, v.type)
            x_dq = conv_inputs[-1]
            if fast and uses[id(x_dq)] == 1:
                conv_chains[id(b.var)] = payload
            return None
        m = match(v)
        if m is None:
            return None
        c = _qmatmul_call(m, lookup(m["x"]))
        if int8 and static_shapes(m["x"], v):
            return c                                  # the integer GEMM (codegen/qgemm.py)
        if _exact_in_float32(m) and fast and uses[id(m["x_dq"])] == 1:
            mm_chains[id(b.var)] = m                  # expanded into the float chain below
            return c
        if readers.get(id(b.var)) is None:            # a graph output only
            return c
        return None

    conv_chains: dict[int, list] = {}
    mm_chains: dict[int, dict] = {}
    out = rewrite_function(fn, visit)
    for block in out.blocks:   # exact in float32: the fp32 GEMM with a fused epilogue
        new = []
        for b in block.bindings:
            new.extend(inserted.get(id(b.var), []))
            if id(b.var) in mm_chains:
                new.extend(_float_chain(b, mm_chains[id(b.var)]))
            elif id(b.var) in conv_chains:
                new.extend(_bind_chain(b, conv_chains[id(b.var)]))
            else:
                new.append(b)
        block.bindings[:] = new
    return out



_F32_EXACT = float(2 ** 24)


def _qmatmul_call(m: dict, x: Value) -> Call:
    wp, w_off = pack_weights_offset(m["wd"])
    n = m["wd"].shape[1]
    npn = wp.shape[0] * PANEL
    bias = np.zeros(npn, np.int32)
    bias[:n] = m["bias"]
    mult = np.zeros(npn, np.float32)
    mult[:n] = m["mult"]
    args = [x, Constant(f"{getattr(m['x'], 'name', 'x')}_qw", wp),
            Constant("x_zp", np.asarray(m["xzp"], np.int32)), Constant("bias_i32", bias),
            Constant("requant_scale", mult), Constant("y_zp", np.asarray(m["yzp"], np.float32))]
    return Call("qmatmul", args, {"n": n, "dtype": m["dtype"], "w_offset": w_off}, m["out"])


def _exact_in_float32(m: dict) -> bool:
    info = np.iinfo(m["x"].type.dtype)
    x_dev = max(m["xzp"] - info.min, info.max - m["xzp"])
    col = np.abs(m["wd"].astype(np.int64)).sum(axis=0) * x_dev
    return bool((col + np.abs(m["bias"].astype(np.int64))).max() < _F32_EXACT)


def _float_chain(b: Binding, m: dict) -> list[Binding]:
    """The quantized matmul ``m`` as dequantize(x, 1, x_zp) @ float32(w - w_zp) + bias, times
    the multiplier, quantize(., 1, y_zp): every sum an integer below 2**24, so float32
    accumulation in any order gives the int32 result exactly, and the requantization is ORT's
    operation for operation (float32(acc) * multiplier, round half to even, + zero point,
    saturate)."""
    x, dtype = m["x"], m["dtype"]
    n = m["wd"].shape[1]
    f32 = "float32"
    one = Constant("one", np.asarray(1.0, np.float32))
    x_t = x.type
    steps = [("dequantize", [b.value.args[0], one,
                             Constant("x_zp", np.asarray(m["xzp"], x_t.dtype))], {},
              TensorType(x_t.shape, f32))]
    mm_t = TensorType(tuple(x_t.shape[:-1]) + (n,), f32)
    steps.append(("matmul", [None, integer_constant("qw_f32", m["wd"])], {}, mm_t))
    if np.any(m["bias"]):
        steps.append(("add", [None, Constant("bias_f32", m["bias"].astype(np.float32))], {},
                      mm_t))
    steps.append(("multiply", [None, Constant("requant_scale", m["mult"])], {}, mm_t))
    steps.append(("quantize", [None, one, Constant("y_zp", np.asarray(m["yzp"], dtype))],
                  {"dtype": dtype, "unit_scale": True}, b.value.type))
    return _bind_chain(b, steps)


def _bind_chain(b: Binding, steps: list) -> list[Binding]:
    """Bindings for ``steps`` (op, args with None for the previous result, attrs, type), the
    last one bound to ``b``'s var."""
    out, prev = [], None
    for i, (op, args, attrs, t) in enumerate(steps):
        args = [prev if a is None else a for a in args]
        var = b.var if i == len(steps) - 1 else Var(f"{b.var.name}_q{i}", t)
        out.append(Binding(var, Call(op, args, attrs, t), b.source))
        prev = var
    return out
