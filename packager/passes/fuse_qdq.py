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
one quantization step of ONNX Runtime.

Dynamic quantization (onnxruntime's quantize_dynamic: a float result scaled from int32 with a
run-time x scale and zero point) takes the integer kernels too, with a float32 epilogue:
MatMulInteger / ConvInteger chains (``_plan_integer_products``, ``_plan_integer_convs``) and
DynamicQuantizeLSTM's input projection (``_plan_requantized_products``: its weights were
dequantized at import; the integers are recovered exactly from the float32 constant).

Not done: VNNI (vpdpbusd) / AVX2 (vpmaddubsw) / sdot packed int8 kernels, so int8 runs at fp32
speed at best (bench/int8.py); ReLU/Clip between the product and the quantize (ORT's quantizer
folds them into the output range).

DynamicQuantizeLSTM's recurrent product (``_integer_recurrences``): the fused recurrence kernel
takes int8 R and a scale per weight row when the dequantized R is exactly that (``int_r``), and
computes ORT's integer product (uint8 h - zp times int8 R, int32 sums, float32(acc) * (h_scale *
r_scale)); ddddocr's H = 512 LSTM streams 1 MB per step and direction instead of 4 MB.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import (Binding, Call, Constant, Function, IRModule, TensorType, Value, Var,
                        used_values)
from ..ops.qlinear import PANEL, pack_conv_weights, pack_weights, pack_weights_offset
from ..options import CompileOptions
from .common import map_functions, rewrite_function
from .fuse_qdq_dw import depthwise_call
from .simplify import eliminate_dead_code
from .stored_int import integer_constant

_I8 = ("int8", "uint8")


def fuse_quantized(mod: IRModule, options: CompileOptions) -> IRModule:
    """QDQ patterns into integer kernels; with ``options.int8_kernels`` False (compared in
    bench/int8.py) into the float32-exact chains the integer kernels replaced."""
    # the float products replaced are dropped here, so nothing legalizes them
    int8 = options.int8_kernels
    mod = eliminate_dead_code(map_functions(mod, lambda fn: _fuse_in_function(fn, int8)))
    return map_functions(mod, _integer_recurrences) if int8 else mod


def _integer_recurrences(fn: Function) -> Function:
    """DynamicQuantizeLSTM's recurrent product (``nn.recurrence`` with ``quantize_h``) in
    integers, as ONNX Runtime computes it: when the packed float32 R is exactly int8 times a
    scale per weight row (it was dequantized at import; ``_integer_columns`` recovers both),
    R becomes the int8 constant of ``pack_recurrent_int8`` and its scales a further input
    (``int_r``), so each step streams 1 byte per weight instead of 4 (an LSTM with H = 512
    reads 1 MB per step and direction instead of 4 MB)."""
    changed = False
    blocks = []
    for block in fn.blocks:
        new_block = type(block)()
        for b in block.bindings:
            v = b.value
            new = _integer_recurrence(v) if (isinstance(v, Call) and v.op == "nn.recurrence"
                                             and v.attrs.get("quantize_h")
                                             and not v.attrs.get("int_r")) else None
            if new is not None:
                changed = True
                v = new
            new_block.bindings.append(Binding(b.var, v, b.source))
        blocks.append(new_block)
    if not changed:
        return fn
    return Function(fn.name, list(fn.params), blocks, list(fn.outputs), list(fn.output_names))


def _integer_recurrence(c: Call) -> Call | None:
    from ..ops.sequence import UNIT_BLOCK, pack_recurrent_int8, unpack_recurrent
    packed = _const(c.args[1])
    hidden = int(c.attrs["hidden"])
    if (packed is None or packed.dtype != np.float32 or c.attrs.get("cell") != "lstm"
            or len(c.args) != 4):
        return None
    rr = unpack_recurrent(packed, "lstm", hidden, False)          # [D, 4H, H]
    dirs = rr.shape[0]
    ints, scales = [], []
    for d in range(dirs):
        got = _integer_columns(np.ascontiguousarray(rr[d].T))     # columns: the 4H rows
        if got is None or got[0].min() < -128 or got[0].max() > 127:
            return None
        ints.append(got[0].T)
        scales.append(got[1])
    hpad = -(-hidden // UNIT_BLOCK) * UNIT_BLOCK
    scale = np.zeros((dirs, 4, hpad), np.float32)
    scale[:, :, :hidden] = np.stack(scales).reshape(dirs, 4, hidden)
    q = pack_recurrent_int8(np.stack(ints).astype(np.int8))
    return Call("nn.recurrence", [c.args[0], Constant("r_int8", q), c.args[2], c.args[3],
                                  Constant("r_scale", scale.reshape(dirs, 4 * hpad))],
                {**c.attrs, "int_r": True}, c.type)


def _const(v: Value) -> np.ndarray | None:
    return v.data if isinstance(v, Constant) else None


def _fuse_in_function(fn: Function, int8: bool) -> Function:
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
    float_products = _plan_float_products(fn, defs, uses, reader_of) if int8 else {}
    pre_bindings: dict[int, list[Binding]] = {}   # bindings a planned call reads, put before it
    if int8:
        float_products.update(_plan_integer_products(fn, defs, uses, reader_of))
        float_products.update(_plan_requantized_products(fn, defs, uses, reader_of,
                                                         pre_bindings))
        float_products.update(_plan_integer_convs(fn, defs, uses, reader_of, pre_bindings))
    inserted: dict[int, list[Binding]] = {}

    def call(v: Value, op: str, single: bool = True) -> Call | None:
        c = defs.get(id(v))
        if c is not None and c.op == op and (not single or uses[id(v)] == 1):
            return c
        return None

    def match(q: Call):
        if q.op != "quantize" or q.attrs.get("dtype") not in _I8 or len(q.args) != 3:
            return None
        ys, yzp = _const(q.args[1]), _const(q.args[2])
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
        xs, xzp = _const(dx.args[1]), _const(dx.args[2])
        w, ws, wzp = (_const(a) for a in dw.args)
        if (x.type.dtype not in _I8 or xs is None or xzp is None or xs.size != 1 or xzp.size != 1
                or xs.dtype != np.float32 or w is None or ws is None or wzp is None
                or w.dtype.name not in _I8 or w.ndim != 2 or ws.dtype != np.float32
                or len(x.type.shape) < 2):
            return None
        transpose_b = bool(mm.attrs.get("transpose_b", False))
        if set(mm.attrs) - {"transpose_b"}:
            return None
        k, n = (w.shape[1], w.shape[0]) if transpose_b else w.shape
        try:   # per-tensor or per-output-column scale / zero point, as [N]
            ws_n = np.broadcast_to(ws.T if transpose_b else ws, (1, n)).reshape(n)
            wzp_n = np.broadcast_to(wzp.T if transpose_b else wzp, (1, n)).reshape(n)
        except ValueError:
            return None
        if ws.ndim == 2 and ws.shape[0 if not transpose_b else 1] != 1:
            return None
        wk = w.T if transpose_b else w
        bias = np.zeros(n, np.int32)
        sx = np.float32(xs.reshape(()))
        if bias_dq is not None:
            bq, bs, bzp = (_const(a) for a in bias_dq.args)
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
        if q.op != "quantize" or q.attrs.get("dtype") not in _I8:
            return None
        ys, yzp = _const(q.args[1]), _const(q.args[2])
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
        xs, xzp = _const(dx.args[1]), _const(dx.args[2])
        w, ws, wzp = (_const(a) for a in dw.args)
        if (x.type.dtype not in _I8 or xs is None or xzp is None or xs.size != 1
                or xzp.size != 1 or xs.dtype != np.float32 or w is None or ws is None
                or wzp is None or w.dtype.name not in _I8 or w.ndim != 4
                or ws.dtype != np.float32):
            return None
        o = w.shape[0]
        try:
            ws_o = np.broadcast_to(ws, (o, 1, 1, 1)).reshape(o)
            wzp_o = np.broadcast_to(wzp, (o, 1, 1, 1)).reshape(o)
        except ValueError:
            return None
        sx = np.float32(xs.reshape(()))
        bias = np.zeros(o, np.int64)
        if bias_dq is not None:
            bq, bs, bzp = (_const(a) for a in bias_dq.args)
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
        if (int8 and cv.attrs.get("groups", 1) == 1
                and tuple(cv.attrs.get("dilation", (1, 1))) == (1, 1) and _static(x, q)):
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
                      {"dtype": q.attrs["dtype"]}, q.type))
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
        if int8 and _static(m["x"], v):
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


def _dq_input(defs: dict, v: Value):
    """(x, x_scale, x_zp) when ``v`` = dequantize(x int8/uint8, scalar float32 scale, zp)."""
    d = defs.get(id(v))
    if d is None or d.op != "dequantize" or len(d.args) != 3:
        return None
    x, xs, xzp = d.args[0], _const(d.args[1]), _const(d.args[2])
    if (x.type.dtype not in _I8 or xs is None or xzp is None or xs.size != 1 or xzp.size != 1
            or xs.dtype != np.float32):
        return None
    return x, np.float32(xs.reshape(())), int(xzp.reshape(()))


def _dq_weight(defs: dict, v: Value):
    """(w, scale, zp) constants when ``v`` = dequantize(W const int8/uint8, scale, zp)."""
    d = defs.get(id(v))
    if d is None or d.op != "dequantize" or len(d.args) != 3:
        return None
    w, ws, wzp = (_const(a) for a in d.args)
    if w is None or ws is None or wzp is None or w.dtype.name not in _I8 or ws.dtype != np.float32:
        return None
    return w, ws, wzp


def _plan_float_products(fn: Function, defs: dict, uses: Counter, reader_of: dict) -> dict:
    """Quantized products whose result stays float (mlcpack's own ``--quantize int8`` graphs:
    conv2d / matmul of dequantize(x) and dequantize(W const), no quantize after): [bias add]
    [relu] folded into a ``qconv2d`` / ``qmatmul`` with a float32 result. Returns {id(var the
    chain ends in): the call}; the chain's other bindings become dead."""
    plan: dict[int, Call] = {}

    def sole_reader(var) -> Binding | None:
        rs = reader_of.get(id(var), [])
        return rs[0] if len(rs) == 1 and uses[id(var)] == 1 else None

    for b in fn.bindings():
        c = b.value
        if not isinstance(c, Call) or c.op not in ("nn.conv2d", "matmul") or len(c.args) != 2:
            continue
        dx, dw = _dq_input(defs, c.args[0]), _dq_weight(defs, c.args[1])
        if dx is None or dw is None or c.type.dtype != "float32":
            continue
        x, xs, xzp = dx
        w, ws, wzp = dw
        conv = c.op == "nn.conv2d"
        if conv:
            depthwise = w.ndim == 4 and c.attrs.get("groups", 1) != 1
            if (w.ndim != 4 or (c.attrs.get("groups", 1) != 1 and not depthwise)
                    or tuple(c.attrs.get("dilation", (1, 1))) != (1, 1)):
                continue
            o = w.shape[0]
            try:
                ws_o = np.broadcast_to(ws, (o, 1, 1, 1)).reshape(o).astype(np.float32)
                wzp_o = np.broadcast_to(wzp, (o, 1, 1, 1)).reshape(o).astype(np.int64)
            except ValueError:
                continue
            wd = w.astype(np.int64) - wzp_o.reshape(o, 1, 1, 1)
        else:
            if w.ndim != 2 or set(c.attrs) - {"transpose_b"} or len(x.type.shape) < 2:
                continue
            tb = bool(c.attrs.get("transpose_b", False))
            wk = w.T if tb else w
            o = wk.shape[1]
            try:
                ws_o = np.broadcast_to(ws.T if tb else ws, (1, o)).reshape(o).astype(np.float32)
                wzp_o = np.broadcast_to(wzp.T if tb else wzp, (1, o)).reshape(o).astype(np.int64)
            except ValueError:
                continue
            if ws.ndim == 2 and ws.shape[1 if tb else 0] != 1:
                continue
            wd = wk.astype(np.int64) - wzp_o.reshape(1, o)
        if not _static(x, c):
            continue
        mult = (xs * ws_o).astype(np.float32)
        bias_i = np.zeros(o, np.int64)
        offset = np.zeros(o, np.float32)
        end = b.var
        r = sole_reader(end)
        float_bias = False
        if r is not None and getattr(r.value, "op", "") == "add":
            other = [a for a in r.value.args if a is not end]
            got = (_bias_of(defs, other[0], o, conv, mult)
                   if len(other) == 1 and r.value.type == c.type else None)
            if got is not None:
                bias_i, offset = got
                float_bias = _const(other[0]) is not None
                end = r.var
                r = sole_reader(end)
        relu = r is not None and getattr(r.value, "op", "") == "relu"
        if relu:
            end = r.var
        else:
            rs = reader_of.get(id(end), [])
            if rs and all(getattr(x.value, "op", "") == "quantize" for x in rs) \
                    and not float_bias:
                # quantize(product [+ int32 bias]): the requantizing kernel's pattern; with a
                # float bias (PyTorch PT2E's QDQ) it does not apply: the product takes the
                # integer kernel with a float result here, the quantize after it stays
                continue
        name = f"{getattr(x, 'name', 'x')}_qw"
        common = [Constant("x_zp", np.asarray(xzp, np.int32))]
        if conv and depthwise:
            dw = depthwise_call(x, c, wd, xzp, bias_i, mult, offset, "float32", c.type, relu)
            if dw is not None:
                plan[id(end)] = dw
            continue
        if conv:
            args = [x, Constant(name, pack_conv_weights(wd))] + common + [
                Constant("bias_i32", bias_i.astype(np.int32)), Constant("dequant_scale", mult),
                Constant("bias_f32", offset)]
            attrs = {"out_channels": o, "kernel": tuple(w.shape[2:]),
                     "strides": tuple(c.attrs["strides"]), "padding": tuple(c.attrs["padding"]),
                     "dtype": "float32", "relu": relu}
            plan[id(end)] = Call("qconv2d", args, attrs, c.type)
        else:
            wp = pack_weights(wd)
            npn = wp.shape[0] * PANEL

            def pad(a, dt, npn=npn, o=o):
                out = np.zeros(npn, dt)
                out[:o] = a
                return out

            args = [x, Constant(name, wp)] + common + [
                Constant("bias_i32", pad(bias_i, np.int32)),
                Constant("dequant_scale", pad(mult, np.float32)),
                Constant("bias_f32", pad(offset, np.float32))]
            plan[id(end)] = Call("qmatmul", args, {"n": o, "dtype": "float32", "relu": relu},
                                 c.type)
    return plan


def _unit(v: Value) -> bool:
    a = _const(v)
    return a is not None and a.size == 1 and a.dtype in (np.float32, np.float64) and a.item() == 1.0


def _plan_integer_products(fn: Function, defs: dict, uses: Counter, reader_of: dict) -> dict:
    """ONNX MatMulInteger with its result scaled back to float (what ONNX Runtime's dynamic
    quantizer writes, e.g. ddddocr's vocabulary projection), as the importer writes it:

        cast(cast(matmul(dequantize(x, 1, xzp), dequantize(W const, 1, wzp)), int32), float32)
        [* s] [+ b]

    x int8/uint8 with a zero point that may be computed at run time (DynamicQuantizeLinear),
    s a float32 scalar (run time too) or a constant per column, b a float32 constant per
    column or scalar. The importer emits the float matmul only where its sums are exact, so
    the int32 accumulation of ``qmatmul`` gives the same integers; its float32 epilogue is
    float32(acc) * s + b, the graph's operations in order. Returns {id(var the chain ends in):
    the ``qmatmul`` call}, as ``_plan_float_products``."""
    plan: dict[int, Call] = {}

    def sole_reader(var) -> Binding | None:
        rs = reader_of.get(id(var), [])
        return rs[0] if len(rs) == 1 and uses[id(var)] == 1 else None

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "matmul" or len(c.args) != 2
                or set(c.attrs) - {"transpose_b"}):
            continue
        dx, dw = defs.get(id(c.args[0])), defs.get(id(c.args[1]))
        if (dx is None or dw is None or dx.op != "dequantize" or dw.op != "dequantize"
                or len(dx.args) != 3 or len(dw.args) != 3):
            continue
        x, xs, xzp = dx.args
        w, ws, wzp = (_const(a) for a in dw.args)
        if (x.type.dtype not in _I8 or not _unit(xs) or xzp.type.shape != ()
                or xzp.type.dtype not in _I8 + ("int32",) or w is None or ws is None
                or wzp is None or w.dtype.name not in _I8 or w.ndim != 2
                or ws.size != 1 or ws.item() != 1.0 or len(x.type.shape) < 2):
            continue
        tb = bool(c.attrs.get("transpose_b", False))
        wk = w.T if tb else w
        n = wk.shape[1]
        try:
            wzp_n = np.broadcast_to(wzp.T if tb else wzp, (1, n)).reshape(n).astype(np.int64)
        except ValueError:
            continue
        if wzp.ndim == 2 and wzp.shape[1 if tb else 0] != 1:
            continue
        wd = wk.astype(np.int64) - wzp_n.reshape(1, n)
        if (np.abs(wd).sum(axis=0).max() * 255 >= 2 ** 31 or not _static(x, c)
                or tuple(c.type.shape) != tuple(x.type.shape[:-1]) + (n,)):
            continue
        r1 = sole_reader(b.var)
        if r1 is None or r1.value.op != "cast" or r1.value.attrs.get("dtype") != "int32":
            continue
        r2 = sole_reader(r1.var)
        if r2 is None or r2.value.op != "cast" or r2.value.attrs.get("dtype") != "float32":
            continue
        end = r2.var
        out_t = r2.value.type
        mult: Value = Constant("dequant_scale", np.ones(-(-n // PANEL) * PANEL, np.float32))
        offset = np.zeros(n, np.float32)
        r = sole_reader(end)
        if r is not None and r.value.op == "multiply" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            s = other[0] if len(other) == 1 else None
            sc = _const(s) if s is not None else None
            if s is not None and s.type.dtype == "float32" and s.type.shape == ():
                mult, end = s, r.var                       # a scalar, maybe computed
            elif sc is not None and sc.dtype == np.float32 and sc.shape in ((n,), (1, n)):
                pad = np.zeros(-(-n // PANEL) * PANEL, np.float32)
                pad[:n] = sc.reshape(n)
                mult, end = Constant("dequant_scale", pad), r.var
            if end is r.var:
                r = sole_reader(end)
        if r is not None and r.value.op == "add" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            bc = _const(other[0]) if len(other) == 1 else None
            if (bc is not None and bc.dtype == np.float32
                    and (bc.size == 1 or bc.shape in ((n,), (1, n)))):
                offset = np.broadcast_to(bc.reshape(-1), (n,)).astype(np.float32)
                end = r.var
        wp, w_off = pack_weights_offset(wd)
        npn = wp.shape[0] * PANEL
        off = np.zeros(npn, np.float32)
        off[:n] = offset
        zp = xzp if _const(xzp) is None else Constant(
            "x_zp", np.asarray(int(_const(xzp).reshape(())), np.int32))
        args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", wp), zp,
                Constant("bias_i32", np.zeros(npn, np.int32)), mult,
                Constant("bias_f32", off)]
        plan[id(end)] = Call("qmatmul", args, {"n": n, "dtype": "float32", "w_offset": w_off},
                             out_t)
    return plan


def _plan_integer_convs(fn: Function, defs: dict, uses: Counter, reader_of: dict,
                        pre: dict) -> dict:
    """ONNX ConvInteger scaled back to float (onnxruntime's quantize_dynamic of a conv,
    ddddocr's 21 convolutions), as the importer writes it:

        cast(cast(nn.conv2d(dequantize(x, 1, xzp), dequantize(W const, 1, wzp)), int32)
             [+ B int32 [1, O, 1, 1]], float32) [* s]

    x int8/uint8, xzp, B (the bias quantized at run time by the model's own Div / Floor /
    Cast) and the scalar float32 s may all be computed at run time. Becomes a ``qconv2d``
    with a float32 result, float32(acc + B) * s: the graph's integers (the importer emits the
    float convolution only where its sums are exact) and its float operations in order.
    Returns {id(var the chain ends in): the call}; a reshape of B to [O] goes in ``pre``."""
    plan: dict[int, Call] = {}

    def sole_reader(var) -> Binding | None:
        rs = reader_of.get(id(var), [])
        return rs[0] if len(rs) == 1 and uses[id(var)] == 1 else None

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "nn.conv2d" or len(c.args) != 2
                or c.attrs.get("groups", 1) != 1
                or tuple(c.attrs.get("dilation", (1, 1))) != (1, 1)):
            continue
        dx, dw = defs.get(id(c.args[0])), defs.get(id(c.args[1]))
        if (dx is None or dw is None or dx.op != "dequantize" or dw.op != "dequantize"
                or len(dx.args) != 3 or len(dw.args) != 3):
            continue
        x, xs, xzp = dx.args
        w, ws, wzp = (_const(a) for a in dw.args)
        if (x.type.dtype not in _I8 or not _unit(xs) or xzp.type.shape != ()
                or xzp.type.dtype not in _I8 + ("int32",) or w is None or ws is None
                or wzp is None or w.dtype.name not in _I8 or w.ndim != 4
                or ws.size != 1 or ws.item() != 1.0 or not _static(x, c)):
            continue
        o = w.shape[0]
        try:
            wzp_o = np.broadcast_to(wzp, (o, 1, 1, 1)).reshape(o).astype(np.int64)
        except ValueError:
            continue
        wd = w.astype(np.int64) - wzp_o.reshape(o, 1, 1, 1)
        if np.abs(wd).sum(axis=(1, 2, 3)).max() * 255 >= 2 ** 30:
            continue
        r1 = sole_reader(b.var)
        if r1 is None or r1.value.op != "cast" or r1.value.attrs.get("dtype") != "int32":
            continue
        end, steps = r1.var, []
        bias: Value = Constant("bias_i32", np.zeros(o, np.int32))
        r = sole_reader(end)
        if r is not None and r.value.op == "add" and r.value.type == r1.value.type:
            other = [a for a in r.value.args if a is not end]
            bv = other[0] if len(other) == 1 else None
            if (bv is not None and bv.type.dtype == "int32"
                    and tuple(bv.type.shape) in ((o,), (1, o, 1, 1))):
                bc = _const(bv)
                if bc is not None:
                    bias = Constant("bias_i32", bc.reshape(o).astype(np.int32))
                elif tuple(bv.type.shape) == (o,):
                    bias = bv
                else:
                    bias = Var(f"{b.var.name}_bias", TensorType((o,), "int32"))
                    steps.append(Binding(bias, Call("reshape", [bv], {"shape": (o,)},
                                                    bias.type)))
                end = r.var
                r = sole_reader(end)
        if r is None or r.value.op != "cast" or r.value.attrs.get("dtype") != "float32":
            continue
        end, out_t = r.var, r.value.type
        mult: Value = Constant("dequant_scale", np.ones(o, np.float32))
        r = sole_reader(end)
        if r is not None and r.value.op == "multiply" and r.value.type == out_t:
            other = [a for a in r.value.args if a is not end]
            sv = other[0] if len(other) == 1 else None
            if sv is not None and sv.type.dtype == "float32" and sv.type.shape == ():
                mult, end = sv, r.var
        if steps:
            pre[id(end)] = steps
        args = [x, Constant(f"{getattr(x, 'name', 'x')}_qw", pack_conv_weights(wd)), xzp,
                bias, mult, Constant("bias_f32", np.zeros(o, np.float32))]
        attrs = {"out_channels": o, "kernel": tuple(w.shape[2:]),
                 "strides": tuple(c.attrs["strides"]), "padding": tuple(c.attrs["padding"]),
                 "dtype": "float32"}
        plan[id(end)] = Call("qconv2d", args, attrs, out_t)
    return plan


def _integer_columns(wk: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(d int64 [K, N], s float32 [N]) with float32(d * s[n]) == wk exactly and |d| <= 255,
    when the float32 constant ``wk`` [K, N] is such a product column by column (weights that
    were dequantized at import, e.g. DynamicQuantizeLSTM's W); else None. The scale of a
    column is searched near max|w| / m for the largest integer m a quantizer maps the largest
    weight to (127, 255, 128, 254), a few float32 ulps either side; every candidate is
    checked on the whole column."""
    if wk.dtype != np.float32 or wk.ndim != 2 or not np.all(np.isfinite(wk)):
        return None
    k, n = wk.shape
    d = np.zeros((k, n), np.int64)
    s = np.ones(n, np.float32)
    top = np.abs(wk).max(axis=0)
    todo = top > 0

    def attempt(cols: np.ndarray, sc: np.ndarray) -> None:
        q = np.rint(wk[:, cols] / sc)
        ok = (sc > 0) & (np.abs(q) <= 255).all(axis=0) & (
            q.astype(np.float32) * sc == wk[:, cols]).all(axis=0)
        d[:, cols[ok]] = q[:, ok].astype(np.int64)
        s[cols[ok]] = sc[ok] if sc.ndim else sc
        todo[cols[ok]] = False

    # the smallest integers first (127 before 255: a column that fits int8 stays int8); after
    # each, the scales found so far for the columns whose largest weight is not the
    # quantizer's largest integer (a scale per tensor or per LSTM direction)
    for m in (127, 128, 255, 254):
        for step in (0, 1, -1, 2, -2):
            if todo.any():
                cand = (top / np.float32(m)).astype(np.float32)
                for _ in range(abs(step)):
                    cand = np.nextafter(cand, np.float32(np.inf if step > 0 else 0),
                                        dtype=np.float32)
                cols = np.nonzero(todo)[0]
                attempt(cols, cand[cols])
        for sc in np.unique(s[(top > 0) & ~todo])[::-1][:256]:
            if todo.any():
                attempt(np.nonzero(todo)[0], np.float32(sc))
    return None if todo.any() else (d, s)


def _plan_requantized_products(fn: Function, defs: dict, uses: Counter, reader_of: dict,
                               pre: dict) -> dict:
    """matmul([reshape](dequantize(quantize(x, s, zp), s, zp)), W float32 const)[+ b const]
    with W exactly integers times a scale per output column (``_integer_columns``): ONNX
    Runtime's DynamicQuantizeLSTM input projection as the importer writes it (its int8 W
    dequantized at import, X round-tripped through DynamicQuantizeLinear). ONNX Runtime
    computes it as an integer product scaled to float, float32(acc) * (s * w_scale[n]); so
    does the ``qmatmul`` this becomes (s * w_scale computed at run time by a ``multiply``
    put before it, in ``pre``), instead of a float32 product of the dequantized values:
    int8 weights (4x smaller than the float32 ones), same numbers as ORT up to the float32
    rounding of the scale products. Returns {id(var the chain ends in): the call}."""
    plan: dict[int, Call] = {}

    def sole_reader(var) -> Binding | None:
        rs = reader_of.get(id(var), [])
        return rs[0] if len(rs) == 1 and uses[id(var)] == 1 else None

    for b in fn.bindings():
        c = b.value
        if (not isinstance(c, Call) or c.op != "matmul" or len(c.args) != 2
                or set(c.attrs) - {"transpose_b"} or c.type.dtype != "float32"):
            continue
        w = _const(c.args[1])
        if w is None or w.dtype != np.float32 or w.ndim != 2:
            continue
        a = c.args[0]
        r = defs.get(id(a))
        if r is not None and r.op == "reshape":
            if tuple(r.type.shape[-1:]) != tuple(r.args[0].type.shape[-1:]):
                continue
            a = r.args[0]
        dq = defs.get(id(a))
        if dq is None or dq.op != "dequantize" or len(dq.args) != 3:
            continue
        q, xs, xzp = dq.args
        qc = defs.get(id(q))
        if (qc is None or qc.op != "quantize" or len(qc.args) != 3 or qc.args[1] is not xs
                or qc.args[2] is not xzp or q.type.dtype not in _I8
                or xs.type.shape != () or xs.type.dtype != "float32" or xzp.type.shape != ()
                or xzp.type.dtype not in _I8 or not _static(q, c)):
            continue
        tb = bool(c.attrs.get("transpose_b", False))
        wk = np.ascontiguousarray(w.T if tb else w)
        k, n = wk.shape
        if c.args[0].type.shape[-1] != k or len(c.args[0].type.shape) < 2:
            continue
        got = _integer_columns(wk)
        if got is None or np.abs(got[0]).sum(axis=0).max() * 255 >= 2 ** 31:
            continue
        d, ws = got
        end, offset = b.var, np.zeros(n, np.float32)
        rd = sole_reader(end)
        if rd is not None and rd.value.op == "add" and rd.value.type == c.type:
            other = [x for x in rd.value.args if x is not end]
            bc = _const(other[0]) if len(other) == 1 else None
            if (bc is not None and bc.dtype == np.float32
                    and (bc.size == 1 or bc.shape in ((n,), (1, n)))):
                offset = np.broadcast_to(bc.reshape(-1), (n,)).astype(np.float32)
                end = rd.var
        wp, w_off = pack_weights_offset(d)
        npn = wp.shape[0] * PANEL
        ws_pad, off = np.zeros(npn, np.float32), np.zeros(npn, np.float32)
        ws_pad[:n], off[:n] = ws, offset
        steps = []
        x_in = q
        if tuple(q.type.shape) != tuple(c.args[0].type.shape):
            x_in = Var(f"{b.var.name}_xq", TensorType(tuple(c.args[0].type.shape), q.type.dtype))
            steps.append(Binding(x_in, Call("reshape", [q], {"shape": tuple(c.args[0].type.shape)},
                                            x_in.type)))
        mult = Var(f"{b.var.name}_scale", TensorType((npn,), "float32"))
        steps.append(Binding(mult, Call("multiply", [xs, Constant("w_scale", ws_pad)], {},
                                        mult.type)))
        pre[id(end)] = steps
        args = [x_in, Constant(f"{b.var.name}_qw", wp), xzp,
                Constant("bias_i32", np.zeros(npn, np.int32)), mult, Constant("bias_f32", off)]
        plan[id(end)] = Call("qmatmul", args, {"n": n, "dtype": "float32", "w_offset": w_off},
                             c.type)
    return plan


def _bias_of(defs: dict, v: Value, o: int, conv: bool, mult: np.ndarray):
    """(int32 bias, float offset) when ``v`` is a per-channel bias of a product with ``o``
    channels: [reshape](dequantize(B int32, B_scale == mult, 0)) or a float32 constant."""
    d = defs.get(id(v))
    if d is not None and d.op == "reshape":
        v = d.args[0]
        d = defs.get(id(v))
    if d is not None and d.op == "dequantize" and len(d.args) == 3:
        bq, bs, bzp = (_const(a) for a in d.args)
        if (bq is not None and bs is not None and bzp is not None and bq.dtype == np.int32
                and bq.size == o and not np.any(bzp != 0)
                and np.array_equal(np.broadcast_to(bs.reshape(-1) if bs.size == o else bs,
                                                   (o,)).astype(np.float32), mult)):
            return bq.reshape(o).astype(np.int64), np.zeros(o, np.float32)
        return None
    b = _const(v)
    if b is None or b.dtype != np.float32 or b.size not in (1, o):
        return None
    rank_ok = b.ndim <= 4 and (b.size == 1 or b.shape[-3] == o) if conv and b.ndim >= 3 \
        else (not conv and (b.size == 1 or b.shape[-1] == o))
    if not rank_ok:
        return None
    return np.zeros(o, np.int64), np.broadcast_to(b.reshape(-1), (o,)).astype(np.float32)


# Sums of integer products are exact in float32 while every partial sum stays below 2**24.
_F32_EXACT = float(2 ** 24)


def _static(x: Value, q: Call) -> bool:
    return all(isinstance(d, int) for d in tuple(x.type.shape) + tuple(q.type.shape))


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
                  {"dtype": dtype}, b.value.type))
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
