"""A 1-D convolution over a run-time length whose horizontal stride divides its window and has
many phases (an STFT written as a Conv1d: silero VAD's 258 x 256 taps at stride 128, 16 kHz;
130 x 128 at stride 64, 8 kHz) as frames, one matmul and an overlap sum
(``ops/frames.py``):

    frames [N, T + m - 1, C * s]  (hops of s samples; window = m * s)
    Y = frames @ Wm               (Wm [C * s, m * O]: the window's m hops side by side, packed
                                   once as any matmul weight)
    out[n, o, 0, t] = sum_i Y[n, t + i, i * O + o]

The symbolic convolution kernel vectorizes over output positions and fills stride-phase planes
(``contraction/conv_symbolic.py``, more than ``UNROLLED_PHASES`` column phases in a run-time
loop); an STFT has few positions per call (silero: 4 frames of 258 channels), so most lanes
idled. The matmul puts the output channels on the lanes instead. It computes (m - 1) frames
more than the convolution's positions need (a 25 % surplus at silero's 4 frames, m = 2), and
no sample is copied more than once.

Taken only where the length is a run-time size (fixed-shape bundles keep their kernels, and
stay byte-identical), one group, no dilation or padding, a window of one row, a stride above
``MIN_HOP`` that divides a window of at most ``MAX_PARTS`` hops, and a constant weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.graph import Binding, Call, Constant, DataflowBlock, Function, IRModule, TensorType, Var
from .stored_int import derive

MIN_HOP = 16        # the symbolic kernel unrolls up to this many column phases (conv_symbolic)
MAX_PARTS = 4       # hops per window: the surplus frames cost (m - 1) / T of the products


def _hop_parts(v: Call) -> tuple[int, int] | None:
    """(stride, window / stride) of a convolution this pass rewrites, else None."""
    if v.op != "nn.conv2d" or len(v.args) != 2 or not isinstance(v.args[1], Constant):
        return None
    x, w = v.args
    shape, out = x.type.shape, v.type.shape
    if len(shape) != 4 or shape[2] != 1 or len(out) != 4 or isinstance(shape[3], int) \
            or not isinstance(shape[1], int) or x.type.dtype != "float32":
        return None
    o, c, kh, kw = w.data.shape
    sh, sw = v.attrs.get("strides", (1, 1))
    if (int(v.attrs.get("groups", 1)) != 1 or tuple(v.attrs.get("dilation", (1, 1))) != (1, 1)
            or any(v.attrs.get("padding", (0, 0, 0, 0))) or kh != 1 or c != shape[1]):
        return None
    if sw <= MIN_HOP or kw % sw or not 1 <= kw // sw <= MAX_PARTS:
        return None
    return int(sw), int(kw // sw)


def _window_matrix(w: np.ndarray, hop: int, parts: int) -> np.ndarray:
    """[C * hop, parts * O]: column i * O + o holds hop i of output channel o's window (rows
    channel-major, as ``nn.frames`` lays a frame out)."""
    o, c, _, _ = w.shape
    hops = w[:, :, 0, :].reshape(o, c, parts, hop)            # [O, C, i, s]
    return np.ascontiguousarray(hops.transpose(1, 3, 2, 0).reshape(c * hop, parts * o))


def _rewrite(b: Binding, hop: int, parts: int) -> list[Binding]:
    from ..ops import get_op

    v = b.value
    x, w = v.args
    n, c, _, _ = x.type.shape
    length = v.type.shape[3]
    count = length + (parts - 1)
    frames_t = TensorType((n, count, c * hop), x.type.dtype)
    weight = derive(f"{w.name}_frames", w, lambda d: _window_matrix(d, hop, parts))
    product_t, relations = get_op("matmul").infer_type(frames_t, weight.type)
    if relations:
        raise AssertionError(f"strided frames: the matmul assumed {relations}")
    cut = Var(f"{b.var.name}_frames", frames_t)
    product = Var(f"{b.var.name}_hops", product_t)
    return [dataclasses.replace(b, var=cut, value=Call("nn.frames", [x], {"hop": hop,
                                                                         "count": count},
                                                       frames_t)),
            dataclasses.replace(b, var=product, value=Call("matmul", [cut, weight], {},
                                                           product_t)),
            dataclasses.replace(b, value=Call("nn.frame_sum", [product],
                                              {"parts": parts, "length": length}, v.type))]


def _function(fn: Function) -> Function:
    blocks = []
    changed = False
    for block in fn.blocks:
        bindings: list[Binding] = []
        for b in block.bindings:
            found = _hop_parts(b.value) if isinstance(b.value, Call) else None
            if found is None:
                bindings.append(b)
                continue
            bindings += _rewrite(b, *found)
            changed = True
        blocks.append(DataflowBlock(bindings))
    if not changed:
        return fn
    return Function(fn.name, list(fn.params), blocks, list(fn.outputs), list(fn.output_names))


def strided_frames_as_matmul(mod: IRModule) -> IRModule:
    """Every function's convolutions of the kind above as frames, a matmul and an overlap
    sum; the module itself when there are none."""
    out = None
    for name, fn in mod.functions.items():
        if not isinstance(fn, Function):
            continue
        new = _function(fn)
        if new is not fn:
            out = out or mod.copy()
            out.functions[name] = new
    return out or mod
