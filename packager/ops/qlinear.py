"""Integer kernels the quantized-pattern fusion (``passes/quantize.py``) emits.

``qmatmul(x, w, x_zp, w_zp, bias, multiplier, y_zp, dtype=D)``: x int8/uint8 ``[..., M, K]``,
w int8/uint8 ``[K, N]`` (a constant), x_zp int32 ``()``, w_zp int32 ``[N]``, bias int32 ``[N]``,
multiplier float32 ``[N]`` (x_scale * w_scale / y_scale, float32 as ONNX Runtime computes it),
y_zp float32 ``()``; the result ``[..., M, N]`` of dtype D:

    acc = sum_k (x - x_zp) * (w - w_zp) + bias                     (int32, exact)
    y   = saturate(round_half_even(float32(acc) * multiplier) + y_zp)

which is ONNX Runtime's QLinearMatMul / QGemm requantization (MLAS ``MlasRequantizeOutput``).
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from .elementwise import scalar_of
from .quant import saturation_range
from .registry import COMPLEX, register_op


def _infer_qmatmul(x: TensorType, w: TensorType, x_zp: TensorType, w_zp: TensorType,
                   bias: TensorType, multiplier: TensorType, y_zp: TensorType,
                   dtype: str = "uint8") -> TensorType:
    if x.dtype not in ("int8", "uint8") or w.dtype not in ("int8", "uint8"):
        raise ValueError(f"qmatmul takes int8/uint8 operands, not {x.dtype} x {w.dtype}")
    if len(w.shape) != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"qmatmul inner dimensions differ: {x.shape} @ {w.shape}")
    return TensorType(tuple(x.shape[:-1]) + (w.shape[1],), dtype)


def _legalize_qmatmul(x: te.Tensor, w: te.Tensor, x_zp: te.Tensor, w_zp: te.Tensor,
                      bias: te.Tensor, multiplier: te.Tensor, y_zp: te.Tensor,
                      out_type: TensorType, name: str, dtype: str = "uint8") -> te.Tensor:
    k = te.reduce_axis(x.shape[-1], "k")
    lo, hi = saturation_range(dtype)

    def acc_body(*i: te.IndexVar) -> te.Expr:
        xv = te.cast(x[tuple(i[:-1]) + (k,)], "int32") - x_zp[()]
        wv = te.cast(w[k, i[-1]], "int32") - w_zp[i[-1]]
        return te.sum_of(xv * wv, k)

    acc = te.compute(out_type.shape, acc_body, name=name + "_acc", dtype="int32")

    def body(*i: te.IndexVar) -> te.Expr:
        a = te.cast(acc[i] + bias[i[-1]], "float32") * multiplier[i[-1]]
        q = te.math("round", a) + y_zp[()]
        q = te.minimum(te.maximum(q, scalar_of(lo, "float32")), scalar_of(hi, "float32"))
        return te.cast(q, dtype)

    return te.compute(out_type.shape, body, name=name, dtype=dtype)


@register_op("qmatmul", COMPLEX, _infer_qmatmul, _legalize_qmatmul)
def qmatmul(x: np.ndarray, w: np.ndarray, x_zp: np.ndarray, w_zp: np.ndarray, bias: np.ndarray,
            multiplier: np.ndarray, y_zp: np.ndarray, dtype: str = "uint8") -> np.ndarray:
    acc = np.matmul(x.astype(np.int64) - x_zp, w.astype(np.int64) - w_zp) + bias
    lo, hi = saturation_range(dtype)
    y = np.round(acc.astype(np.int32).astype(np.float32) * multiplier) + np.float32(y_zp)
    return np.clip(y, lo, hi).astype(dtype)
