"""Float32 weights stored as 8-bit integers in the bundle (``Constant.stored``).

A dequantized constant weight that no integer kernel takes is folded to float32 by
``fold_dequantize`` (its kernels are the float ones), but its values stay ``(q - zp) * scale``:
the bundle stores ``q`` (int8 or uint8) with per-slice ``scale`` and ``zero_point`` arrays, and
the runtime expands them once at load (``runtime/model.py``, ``runtime/c``), so the kernels and
their speed are those of the float32 bundle while the file is the quantized model's size.

Every transform a weight goes through after the fold (constant folding of reshapes and
transposes, the layout passes' packing) keeps the stored form when it is a rearrangement of the
values: ``derive`` applies the transform to the integers and to the broadcast scale and zero
point, finds the axes along which the packed scale and zero point are constant (padding ignored),
and keeps the result only when it reproduces the float32 result bit for bit; anything else
(Winograd's transform, arithmetic) is stored float32 as before.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from ..ir.graph import Constant, StoredInt

# Smaller constants are not worth a stored record (its scale and zero point cost more than the
# three bytes per value they save).
MIN_STORED_ELEMENTS = 64
_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a, np.float32).view(np.uint32),
        np.ascontiguousarray(b, np.float32).view(np.uint32))


def expand(stored: StoredInt) -> np.ndarray:
    """The float32 values a stored constant stands for (what the runtimes compute at load)."""
    return ((stored.q.astype(np.float32) - stored.zero_point) * stored.scale).astype(np.float32)


def make_stored(data: np.ndarray, q: np.ndarray, scale: np.ndarray,
                zero_point: np.ndarray) -> StoredInt | None:
    """``StoredInt(q, scale, zero_point)`` when it reproduces ``data`` exactly and saves
    space, else None."""
    if (data.dtype != np.float32 or str(q.dtype) not in _RANGES or q.shape != data.shape
            or data.size < MIN_STORED_ELEMENTS):
        return None
    rank = data.ndim
    parts = []
    for a in (scale, zero_point):
        a = np.asarray(a, np.float32)
        if a.ndim > rank:
            return None
        a = a.reshape((1,) * (rank - a.ndim) + a.shape)
        if any(d not in (1, n) for d, n in zip(a.shape, data.shape)) or a.size * 8 > data.size:
            return None
        parts.append(a)
    common = np.broadcast_shapes(parts[0].shape, parts[1].shape)   # one param_shape for both
    scale, zero_point = (np.ascontiguousarray(np.broadcast_to(a, common)) for a in parts)
    stored = StoredInt(np.ascontiguousarray(q), scale, zero_point)
    return stored if _same_bits(expand(stored), data) else None


def stored_dequantize(data: np.ndarray, q: np.ndarray, scale: np.ndarray,
                      zero_point: np.ndarray) -> StoredInt | None:
    """The stored form of ``data = dequantize(q, scale, zero_point)`` (``ops/quant.py``)."""
    if str(q.dtype) not in _RANGES or str(np.asarray(scale).dtype) != "float32":
        return None
    return make_stored(data, q, scale, np.asarray(zero_point).astype(np.float32))


def integer_stored(data: np.ndarray) -> StoredInt | None:
    """A float32 constant of integers that fit int8 (or uint8) stored with scale 1."""
    if data.dtype != np.float32 or data.size < MIN_STORED_ELEMENTS:
        return None
    if not np.array_equal(data, np.round(data)):
        return None
    lo, hi = float(data.min()), float(data.max())
    for dtype, (a, b) in _RANGES.items():
        if a <= lo and hi <= b:
            ones = np.ones((1,) * data.ndim, np.float32)
            return make_stored(data, data.astype(dtype), ones, np.zeros_like(ones))
    return None


def integer_constant(name: str, data: np.ndarray) -> Constant:
    """``Constant(name, data)``, stored as int8/uint8 when its values are such integers."""
    data = np.asarray(data, np.float32, order="C")
    return Constant(name, data, integer_stored(data))


def _reduced(full: np.ndarray, pad: np.ndarray, fill: float) -> np.ndarray | None:
    """``full`` (the transform of a broadcast scale or zero point) as an array of its rank with
    dim 1 along every axis where it is constant (padding, ``pad`` True, ignored), or None when
    it varies along too many axes to be small."""
    r = np.where(pad, np.nan, full).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for axis in range(r.ndim):
            if r.shape[axis] == 1:
                continue
            lo = np.nanmin(r, axis=axis, keepdims=True)
            hi = np.nanmax(r, axis=axis, keepdims=True)
            if np.all((lo == hi) | np.isnan(lo)):
                r = hi
    if r.size * 8 > full.size:
        return None
    return np.where(np.isnan(r), fill, r).astype(np.float32)


def derive(name: str, w: Constant, fn: Callable[[np.ndarray], np.ndarray],
           data: np.ndarray | None = None) -> Constant:
    """``Constant(name, fn(w.data))`` (``data`` when already computed), keeping ``w``'s stored
    integer form when ``fn`` only rearranges (and zero-pads) values."""
    out = np.ascontiguousarray(fn(w.data) if data is None else data)
    stored = w.stored
    if stored is None or out.dtype != np.float32 or out.size < MIN_STORED_ELEMENTS:
        return Constant(name, out)
    shape = w.data.shape
    try:
        centred = fn(stored.q.astype(np.float32) - stored.zero_point)
        scale = fn(np.broadcast_to(stored.scale, shape).astype(np.float32))
        zp = fn(np.broadcast_to(stored.zero_point, shape).astype(np.float32))
        pad = fn(np.ones(shape, np.float32)) == 0
    except Exception:   # noqa: BLE001 - a transform that takes only its own data: float32
        return Constant(name, out)
    if not (centred.shape == scale.shape == zp.shape == pad.shape == out.shape):
        return Constant(name, out)
    scale_r, zp_r = _reduced(scale, pad, 1.0), _reduced(zp, pad, 0.0)
    if scale_r is None or zp_r is None:
        return Constant(name, out)
    q = centred + zp_r
    lo, hi = _RANGES[str(stored.q.dtype)]
    if not np.array_equal(q, np.round(q)) or q.min() < lo or q.max() > hi:
        return Constant(name, out)
    return Constant(name, out, make_stored(out, q.astype(stored.q.dtype), scale_r, zp_r))
