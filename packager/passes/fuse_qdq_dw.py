"""The arguments of a ``qdwconv2d`` (``ops/qlinear.py``, kernel ``codegen/qdepthwise.py``) for
a quantized depthwise convolution the fusion in ``passes/fuse_qdq.py`` matched: one input
channel per output channel, dilation 1, static channels (the batch, height and width may be
run-time sizes), and every partial sum exact in float32
(below 2**24: the largest |x - x_zp| times the sum of |w - w_zp| of a channel; the int32 bias is
added after, in int32)."""

from __future__ import annotations

import numpy as np

from ..ir.graph import Call, Constant, TensorType, Value
from .stored_int import integer_constant

_F32_EXACT = 2 ** 24


def depthwise_call(x: Value, conv: Call, wd: np.ndarray, xzp: int, bias: np.ndarray,
                   mult: np.ndarray, last: np.ndarray, dtype: str, out: TensorType,
                   relu: bool = False) -> Call | None:
    """``qdwconv2d(x, ...)`` computing ``conv`` (an ``nn.conv2d`` of dequantized x and weights
    ``wd`` = w - w_zp [O, 1, KH, KW] int64) with int ``bias`` [O], ``mult`` [O] and ``last``
    (y_zp () for an 8-bit ``dtype``, the float offset [O] for float32); None when it does not
    apply."""
    shape = x.type.shape
    o = wd.shape[0]
    # run-time batch / height / width: the kernel's open form (codegen/qdepthwise.py)
    if (len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(out.shape[1], int)
            or conv.attrs.get("groups", 1) != shape[1] or o != shape[1] or wd.shape[1] != 1
            or tuple(conv.attrs.get("dilation", (1, 1))) != (1, 1)):
        return None
    info = np.iinfo(x.type.dtype)
    x_dev = max(xzp - int(info.min), int(info.max) - xzp)
    bound = np.abs(wd).sum(axis=(1, 2, 3)) * x_dev
    if bound.max() >= _F32_EXACT:
        return None
    kh, kw = wd.shape[2:]
    args = [x, integer_constant("qdw_w", wd.reshape(o, kh * kw)),
            Constant("x_zp", np.asarray(xzp, np.int32)),
            Constant("bias_i32", bias.reshape(o).astype(np.int32)),
            Constant("requant_scale", np.asarray(mult, np.float32).reshape(o).copy()),
            Constant("y_zp", np.asarray(last, np.float32).copy())]
    attrs = {"kernel": (int(kh), int(kw)), "strides": tuple(conv.attrs["strides"]),
             "padding": tuple(conv.attrs["padding"]), "dtype": dtype, "relu": relu,
             # the bias joins the float32 sums where they stay exact with it
             "bias_in_float": bool((bound + np.abs(bias)).max() < _F32_EXACT),
             # int8 weights: the VNNI kernel's vpdpbusd quads (codegen/qdepthwise.py)
             "weights_int8": bool(wd.min() >= -128 and wd.max() <= 127)}
    return Call("qdwconv2d", args, attrs, out)
