"""Quantized products whose result stays float32 (``--quantize int8`` graphs and PyTorch
PT2E's QDQ: conv2d / matmul of dequantize(x) and dequantize(W const), no quantize after),
folded with their bias and ReLU into a ``qconv2d`` / ``qmatmul`` / ``qdwconv2d`` with a
float32 epilogue; a pass of ``passes/fuse_qdq.py``."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ir.graph import Call, Constant, Function, Value
from ..ops.qlinear import PANEL, pack_conv_weights, pack_weights
from .fuse_qdq_common import I8, const_of, conv_channels, matmul_columns, sole_reader, static_shapes
from .fuse_qdq_dw import depthwise_call
from .int8_cost import open_conv_integer
from .quad_weights import split_share


def dq_input(defs: dict, v: Value):
    """(x, x_scale, x_zp) when ``v`` = dequantize(x int8/uint8, scalar float32 scale, zp)."""
    d = defs.get(id(v))
    if d is None or d.op != "dequantize" or len(d.args) != 3:
        return None
    x, xs, xzp = d.args[0], const_of(d.args[1]), const_of(d.args[2])
    if (x.type.dtype not in I8 or xs is None or xzp is None or xs.size != 1 or xzp.size != 1
            or xs.dtype != np.float32):
        return None
    return x, np.float32(xs.reshape(())), int(xzp.reshape(()))


def dq_weight(defs: dict, v: Value):
    """(w, scale, zp) constants when ``v`` = dequantize(W const int8/uint8, scale, zp)."""
    d = defs.get(id(v))
    if d is None or d.op != "dequantize" or len(d.args) != 3:
        return None
    w, ws, wzp = (const_of(a) for a in d.args)
    if w is None or ws is None or wzp is None or w.dtype.name not in I8 or ws.dtype != np.float32:
        return None
    return w, ws, wzp


def plan_float_products(fn: Function, defs: dict, uses: Counter, reader_of: dict,
                        options=None) -> dict:
    """Quantized products whose result stays float (mlcpack's own ``--quantize int8`` graphs:
    conv2d / matmul of dequantize(x) and dequantize(W const), no quantize after): [bias add]
    [relu] folded into a ``qconv2d`` / ``qmatmul`` with a float32 result. Returns {id(var the
    chain ends in): the call}; the chain's other bindings become dead."""
    plan: dict[int, Call] = {}

    for b in fn.bindings():
        c = b.value
        if not isinstance(c, Call) or c.op not in ("nn.conv2d", "matmul") or len(c.args) != 2:
            continue
        dx, dw = dq_input(defs, c.args[0]), dq_weight(defs, c.args[1])
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
            chans = conv_channels(ws, wzp, o)
            if chans is None:
                continue
            ws_o, wzp_o = chans[0].astype(np.float32), chans[1].astype(np.int64)
            wd = w.astype(np.int64) - wzp_o.reshape(o, 1, 1, 1)
        else:
            if w.ndim != 2 or set(c.attrs) - {"transpose_b"} or len(x.type.shape) < 2:
                continue
            cols = matmul_columns(w, ws, wzp, bool(c.attrs.get("transpose_b", False)))
            if cols is None:
                continue
            wk = cols[0]
            o = wk.shape[1]
            ws_o, wzp_o = cols[1].astype(np.float32), cols[2].astype(np.int64)
            wd = wk.astype(np.int64) - wzp_o.reshape(1, o)
        # run-time image sizes: the depthwise kernel (codegen/qdepthwise.py ``_emit_open``),
        # the quad convolutions ``open_conv_integer`` takes, matmuls with run-time rows only
        # (codegen/qgemm_matmul.py ``_open_rows``)
        if not static_shapes(x, c) and not (conv and depthwise) and not (
                not conv and isinstance(x.type.shape[-1], int)) and not (
                conv and options is not None and open_conv_integer(
                    w.shape, c.attrs["strides"], 1, options,
                    split_share(wd) if options.conv_quads7 else None)):
            continue
        mult = (xs * ws_o).astype(np.float32)
        bias_i = np.zeros(o, np.int64)
        offset = np.zeros(o, np.float32)
        end = b.var
        r = sole_reader(reader_of, uses, end)
        float_bias = False
        if r is not None and getattr(r.value, "op", "") == "add":
            other = [a for a in r.value.args if a is not end]
            got = (bias_of(defs, other[0], o, conv, mult)
                   if len(other) == 1 and r.value.type == c.type else None)
            if got is not None:
                bias_i, offset = got
                float_bias = const_of(other[0]) is not None
                end = r.var
                r = sole_reader(reader_of, uses, end)
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



def bias_of(defs: dict, v: Value, o: int, conv: bool, mult: np.ndarray):
    """(int32 bias, float offset) when ``v`` is a per-channel bias of a product with ``o``
    channels: [reshape](dequantize(B int32, B_scale == mult, 0)) or a float32 constant."""
    d = defs.get(id(v))
    if d is not None and d.op == "reshape":
        v = d.args[0]
        d = defs.get(id(v))
    if d is not None and d.op == "dequantize" and len(d.args) == 3:
        bq, bs, bzp = (const_of(a) for a in d.args)
        if (bq is not None and bs is not None and bzp is not None and bq.dtype == np.int32
                and bq.size == o and not np.any(bzp != 0)
                and np.array_equal(np.broadcast_to(bs.reshape(-1) if bs.size == o else bs,
                                                   (o,)).astype(np.float32), mult)):
            return bq.reshape(o).astype(np.int64), np.zeros(o, np.float32)
        return None
    b = const_of(v)
    if b is None or b.dtype != np.float32 or b.size not in (1, o):
        return None
    rank_ok = b.ndim <= 4 and (b.size == 1 or b.shape[-3] == o) if conv and b.ndim >= 3 \
        else (not conv and (b.size == 1 or b.shape[-1] == o))
    if not rank_ok:
        return None
    return np.zeros(o, np.int64), np.broadcast_to(b.reshape(-1), (o,)).astype(np.float32)


# Sums of integer products are exact in float32 while every partial sum stays below 2**24.
