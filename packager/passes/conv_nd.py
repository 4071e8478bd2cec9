"""N-D convolution and pooling on the fast 2-D kernels: ``nn.conv`` and ``nn.pool`` (what the
ONNX frontend emits for 3-D windows, and for 1-D/2-D ones the 2-D rows do not cover), dilated
``nn.conv2d`` and padded ``nn.avg_pool2d`` are rewritten into ``nn.conv2d`` /
``nn.max_pool2d`` and views, so that those kernels' fast paths, and whatever they learn later
(run-time extents), apply here too.

- 1-D and 2-D: the 2-D row itself (a 1-D window is a 2-D one of height 1).
- 3-D convolution: ``nn.window_unfold`` lays the depth taps out as channels and stacks the
  output depth slices on top of each other, each slice's rows padded and rounded up to a
  multiple of the row stride (at row stride 1, a slice's bottom padding is the next one's
  top padding): ``[N, C * kd, OD * Hs, W]``. One 2-D convolution with the weight
  viewed as ``[O, Cg * kd, kh, kw]`` then computes every depth slice at once (the reduction
  runs over channels and depth taps, as the 3-D one does); output rows ``od * Hs / sh + oh``
  with ``oh < OH`` are the result, the few rows between slices are dropped by a strided slice
  (where the epilogue, bias and activation, then fuses), or, where a max/avg pool whose
  windows never reach those rows alone reads the result (after the bias and unary
  activations, which then run in the convolution's epilogue), not at all: the pool reads the
  stacked slices (``_pool_reads_slices``; conv3d's MaxPool3d after its first two layers). The
  unfold copies the input ``kd``
  times, as the 2-D kernel's own planes copy does for its taps. Without depth taps, row
  padding or a row stride (a 1x1x1 or 1x1xk convolution), the input is only viewed as 2-D.
  A short clip (at most 4/3 as many input slices as depth taps, constant weights, one group)
  folds its depth into the channels instead: one 2-D convolution from ``[N, C * D, H, W]`` to
  ``[N, O * OD, OH, OW]`` (both views) with a banded weight built at export, which multiplies
  at most a third more than the unfold does and copies nothing; the bias and unary
  activations after it move before the output's view, into the kernel's epilogue
  (``_depth_as_channels``).
- Dilation (any rank; the 2-D kernels take none): the dilated axes' taps are unfolded into
  channels too (rows, or rows and columns: a 1x1 convolution over an im2col).
- 3-D max/avg pooling is separable: a 2-D pool over (H, W) of every depth slice, then a
  ``(kd, 1)`` 2-D pool over the depth axis of [N, C, D, OH*OW] (or in the other order when that
  moves less data). Maxima commute, and an average's count is the product of per-axis counts,
  with or without the padding counted, also under ``ceil_mode``.
- Average pools (2-D, and those stages) run as depthwise convolutions with a constant window.

Lp pooling and average pooling with dilation keep the generic loop nest (no 2-D row for them).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from ..ir.graph import (Binding, Call, Constant, DataflowBlock, Function, IRModule, TensorType,
                        Value, Var, used_values)
from ..ops.registry import ELEMWISE, get_op
from .common import infer_static, map_functions
from .stored_int import derive


class _Emitter:
    """Appends the bindings that replace one binding; the last one binds its variable."""

    def __init__(self, binding: Binding, out: list[Binding]) -> None:
        self.binding = binding
        self.out = out
        self.count = 0

    def emit(self, op: str, args: list[Value], final: bool = False, **attrs) -> Value:
        ty = infer_static(op, *[a.type for a in args], **attrs)   # static: see _rewritable
        if final:
            var = self.binding.var
            if var.type != ty:
                raise AssertionError(f"conv_nd rewrite: {ty} where {var.type} was expected")
        else:
            self.count += 1
            var = Var(f"{self.binding.var.name}_nd{self.count}", ty)
        self.out.append(dataclasses.replace(self.binding, var=var, value=Call(op, args, attrs, ty)))
        return var

    def reshape(self, x: Value, shape: tuple[int, ...], final: bool = False) -> Value:
        if x.type.shape == tuple(shape) and not final:
            return x
        if isinstance(x, Constant):   # weights: rearranged once, at export
            self.count += 1
            return derive(f"{x.name}_2d{self.count}", x,
                          lambda d: np.ascontiguousarray(d.reshape(shape)))
        return self.emit("reshape", [x], final=final, shape=tuple(shape))


# A convolution with few input channels (<= IM2COL_MAX_CHANNELS, one group) and at least
# IM2COL_TAPS taps, whose windows overlap little (the im2col at most IM2COL_MAX_COPIES times the
# input), runs as a 1x1 convolution over the im2col of its rows and columns: the 2-D kernel
# unrolls its taps. An STFT as a Conv1d (400 taps, stride 160): a 128 KB kernel, 849 us against
# ORT's 352, then 351 us; a ViT/DeiT/Mixer patch embedding (3 channels, 16x16 stride 16).
IM2COL_TAPS = 64
IM2COL_MAX_CHANNELS = 4
IM2COL_MAX_COPIES = 4


def _long_row(w: Value, groups: int, strides) -> bool:
    """Whether a convolution with weight ``w`` takes the im2col path (see IM2COL_TAPS)."""
    taps = int(np.prod(w.type.shape[2:]))
    return (groups == 1 and w.type.shape[1] <= IM2COL_MAX_CHANNELS and w.type.shape[-1] > 1
            and taps >= IM2COL_TAPS and taps <= IM2COL_MAX_COPIES * int(np.prod(strides)))


def _lift(values, fill: int) -> tuple[int, ...]:
    return (fill,) + tuple(values)


# ---- convolution --------------------------------------------------------------------------------

def _as_3d(em: _Emitter, x: Value, w: Value, attrs: dict) -> tuple[Value, Value, dict]:
    """A 1-D or 2-D convolution as a 3-D one with unit leading axes (views only)."""
    lead = 5 - len(x.type.shape)
    n, c = x.type.shape[:2]
    x3 = em.reshape(x, (n, c) + (1,) * lead + x.type.shape[2:])
    w3 = em.reshape(w, w.type.shape[:2] + (1,) * lead + w.type.shape[2:])
    k = len(attrs["strides"])
    pads = attrs["padding"]
    return x3, w3, dict(strides=(1,) * lead + tuple(attrs["strides"]),
                        padding=(0,) * lead + tuple(pads[:k]) + (0,) * lead + tuple(pads[k:]),
                        dilation=(1,) * lead + tuple(attrs["dilation"]), groups=attrs["groups"])


def _conv_2d(em: _Emitter, x: Value, w: Value, attrs: dict) -> None:
    """An undilated 1-D/2-D convolution: the 2-D row itself."""
    if len(x.type.shape) == 4:
        em.emit("nn.conv2d", [x, w], final=True, **attrs)
        return
    n, c, length = x.type.shape
    x2 = em.reshape(x, (n, c, 1, length))
    w2 = em.reshape(w, w.type.shape[:2] + (1,) + w.type.shape[2:])
    y = em.emit("nn.conv2d", [x2, w2], strides=_lift(attrs["strides"], 1),
                padding=(0, attrs["padding"][0], 0, attrs["padding"][1]),
                dilation=(1, 1), groups=attrs["groups"])
    em.reshape(y, em.binding.var.type.shape, final=True)


def _depth_as_channels(x: Value, w: Value, attrs: dict) -> bool:
    """Whether a 3-D convolution runs as one 2-D convolution with the depth slices folded into
    the channels (``_fold_depth``): constant weights, one group, undilated rows and columns,
    depth taps, and at most 4/3 as many input slices as taps (``3 D <= 4 kd``): the banded
    weight then multiplies at most a third more than the unfold path does with its padding
    taps and rows (none where ``D <= kd``), and the unfold's and the slice's copies go.
    conv3d's last two layers (1 thread, AVX-512 host): 64 -> 64 on 2 x 8 x 8, 265 -> 59 us;
    32 -> 64 on 4 x 16 x 16 (16 slice pairs against 12), 335 -> 287 us with the copies."""
    (_, dh, dw) = attrs["dilation"]
    o, _, kd, kh, kw = w.type.shape
    depth = x.type.shape[2]
    return (isinstance(w, Constant) and attrs["groups"] == 1 and dh == dw == 1 and kd > 1
            and 3 * depth <= 4 * kd and not (kw > 1 and _long_row(w, 1, attrs["strides"])))


def _fold_depth(em: _Emitter, x: Value, w: Value, attrs: dict, od: int,
                tail: list[Binding]) -> None:
    """``y[n, o, j] = sum_{c, d} x[n, c, d] * w[o, c, (d + pd0 - j * sd) / dd]`` (zero where
    that tap is not whole or not in the window) as one 2-D convolution over ``[N, C * D, H, W]``
    (channel ``c * D + d``, a view) into ``[N, O * OD, OH, OW]`` (channel ``o * OD + j``, a
    view of the result): the weight ``[O * OD, C * D, kh, kw]`` is built at export. ``tail``
    (``_epilogue``): the bias add (its constant repeated per output slice) and the unary
    elementwise ops after it, applied before the view, where the 2-D kernel's epilogue takes
    them."""
    (sd, sh, sw), (dd, _, _) = attrs["strides"], attrs["dilation"]
    pd0, ph0, pw0, _, ph1, pw1 = attrs["padding"]
    n, c, depth, height, width = x.type.shape
    o, _, kd, kh, kw = w.type.shape

    def banded(data: np.ndarray) -> np.ndarray:
        out = np.zeros((o, od, c, depth, kh, kw), data.dtype)
        for j in range(od):
            for d in range(depth):
                t, rest = divmod(d + pd0 - j * sd, dd)
                if rest == 0 and 0 <= t < kd:
                    out[:, j, :, d] = data[:, :, t]
        return out.reshape(o * od, c * depth, kh, kw)

    em.count += 1
    w2 = derive(f"{w.name}_2d{em.count}", w, banded)
    x2 = em.reshape(x, (n, c * depth, height, width))
    y = em.emit("nn.conv2d", [x2, w2], strides=(sh, sw), padding=(ph0, pw0, ph1, pw1),
                dilation=(1, 1), groups=1)
    for t in tail:
        call = t.value
        if len(call.args) == 2:   # the bias
            b = call.args[1]
            em.count += 1
            y = em.emit("add", [y, derive(f"{b.name}_2d{em.count}", b, lambda v: np.repeat(
                v.reshape(o), od).reshape(1, o * od, 1, 1))])
        else:
            y = em.emit(call.op, [y], **call.attrs)
        em = _Emitter(t, em.out)
    em.reshape(y, em.binding.var.type.shape, final=True)


def _epilogue(bindings: list[Binding], i: int, uses: Counter) -> list[Binding]:
    """The bindings after ``bindings[i]`` (a 3-D convolution) that a folded one
    (``_fold_depth``) applies before its view: a per-channel constant ``[1, O, 1, 1, 1]``
    added to the result (the ONNX frontend's Conv bias), then unary elementwise ops (ReLU), each
    the only reader of the one before, of its shape and type."""
    tail: list[Binding] = []
    cur = bindings[i]
    o = cur.var.type.shape[1]
    for nxt in bindings[i + 1:]:
        call = nxt.value
        if uses[id(cur.var)] != 1 or not isinstance(call, Call) or not call.args \
                or call.args[0] is not cur.var or nxt.var.type != cur.var.type:
            break
        if not tail and call.op == "add" and len(call.args) == 2:
            b = call.args[1]
            if not (isinstance(b, Constant) and b.type.dtype == "float32"
                    and tuple(b.type.shape) == (1, o, 1, 1, 1)):
                break
        elif len(call.args) != 1 or get_op(call.op).kind != ELEMWISE:
            break
        tail.append(nxt)
        cur = nxt
    return tail


def _pooled(bindings: list[Binding], i: int, tail: list[Binding], uses: Counter
            ) -> Binding | None:
    """The binding after ``bindings[i]`` (a 3-D convolution) and its epilogue ``tail`` that
    alone reads the result: a float32 max or avg ``nn.pool`` of 3 spatial axes, else None."""
    last = (tail[-1] if tail else bindings[i]).var
    if uses[id(last)] != 1:
        return None
    for b in bindings[i + 1 + len(tail):]:
        v = b.value
        if isinstance(v, Call) and any(a is last for a in v.args):
            ok = (v.op == "nn.pool" and len(v.args) == 1 and len(v.type.shape) == 5
                  and v.attrs.get("mode") in ("max", "avg") and _static(v))
            return b if ok else None
    return None


def _pool_reads_slices(pooled: Binding, stacked: tuple[int, ...], oh: int) -> bool:
    """Whether the pool ``pooled`` computes the same from ``stacked`` ([N, O, OD, Hs, OW], each
    slice's ``oh`` rows followed by rows between slices) as from the slices' rows alone: its
    windows never reach a row past ``oh`` (not even as padding) and its output is the same."""
    a = pooled.value.attrs
    kh, sh = a["kernel"][1], (a.get("strides") or (1, 1, 1))[1]
    dh, pt = (a.get("dilation") or (1, 1, 1))[1], (a.get("padding") or (0,) * 6)[1]
    rows = pooled.var.type.shape[3]
    if (rows - 1) * sh - pt + (kh - 1) * dh >= oh:
        return False
    try:
        got = infer_static("nn.pool", TensorType(tuple(stacked), "float32"), **a)
    except ValueError:
        return False
    return got == pooled.var.type


def _conv_3d(em: _Emitter, x: Value, w: Value, attrs: dict, tail: list[Binding],
             pooled: Binding | None = None) -> int:
    """See the module docstring; ``padding`` is (d, h, w begins, d, h, w ends). Taps of a
    dilated axis go to the channels too (the 2-D kernels take no dilation); so do the row taps
    when the columns are dilated, keeping the weight's folded axes a prefix (a view)."""
    (sd, sh, sw), (dd, dh, dw) = attrs["strides"], attrs["dilation"]
    pd0, ph0, pw0, pd1, ph1, pw1 = attrs["padding"]
    groups = attrs["groups"]
    n, c, depth, height, width = x.type.shape
    o, cg, kd, kh, kw = w.type.shape
    out_shape = em.binding.var.type.shape   # rank 3 or 4 for 1-D or 2-D ones seen as 3-D
    _, _, od, oh, ow = infer_static("nn.conv", x.type, w.type, **attrs).shape
    if _depth_as_channels(x, w, attrs):
        _fold_depth(em, x, w, attrs, od, tail)
        return len(tail)
    fold_w = kw > 1 and (dw > 1 or _long_row(w, groups, attrs["strides"]))
    fold_h = kh > 1 and (dh > 1 or fold_w)
    if kd == 1 and sd == 1 and pd0 == pd1 == 0 and kh == 1 and sh == 1 and ph0 == ph1 == 0 \
            and not fold_w:   # every output row is one input row: view the slices as rows
        x2 = em.reshape(x, (n, c, depth * height, width))
        y = em.emit("nn.conv2d", [x2, em.reshape(w, (o, cg, 1, kw))], strides=(1, sw),
                    padding=(0, pw0, 0, pw1), dilation=(1, 1), groups=groups)
        em.reshape(y, out_shape, final=True)
        return 0
    # rows: each output depth slice's rows, padded and rounded up to a multiple of the row
    # stride, stacked (the rows between slices' outputs are dropped at the end), or with the
    # row taps folded, exactly the output rows. At row stride 1 with no more bottom than top
    # padding, a slice's bottom padding is the next one's top padding (the last one's is the
    # conv's): rows H + pt, not H + pt + pb (conv3d's 3x3x3 layers: 65 rows per slice, not 66)
    if not fold_h and sh == 1 and ph1 <= ph0 and ph1 < kh:
        slice_out = height + ph0
    else:
        slice_out = oh if fold_h else -(-(height + ph0 + ph1) // sh)
    rows = oh if fold_h else slice_out * sh
    cols = em.emit("nn.window_unfold", [x],
                   kernel=(kd, kh if fold_h else 1, kw if fold_w else 1),
                   strides=(sd, sh if fold_h else 1, sw if fold_w else 1),
                   dilation=(dd, dh if fold_h else 1, dw if fold_w else 1),
                   pads=(pd0, ph0, pw0 if fold_w else 0),
                   sizes=(od, rows, ow if fold_w else width))
    folded = kd * (kh if fold_h else 1) * (kw if fold_w else 1)
    x2 = em.reshape(cols, (n, c * folded, od * rows, ow if fold_w else width))
    w2 = em.reshape(w, (o, cg * folded, 1 if fold_h else kh, 1 if fold_w else kw))
    # the last slice's windows reach below the stacked rows: zero rows from the kernel's padding
    bottom = 0 if fold_h else max(0, kh - sh)
    conv = dict(strides=(1 if fold_h else sh, 1 if fold_w else sw),
                padding=(0, 0 if fold_w else pw0, bottom, 0 if fold_w else pw1),
                dilation=(1, 1), groups=groups)
    if slice_out == oh and infer_static("nn.conv2d", x2.type, w2.type, **conv).shape \
            == tuple(out_shape):   # the conv binds the result: its epilogue (bias) fuses
        em.emit("nn.conv2d", [x2, w2], final=True, **conv)
        return 0
    y = em.emit("nn.conv2d", [x2, w2], **conv)
    if slice_out == oh:
        em.reshape(y, out_shape, final=True)
        return 0
    if pooled is not None and len(out_shape) == 5 \
            and _pool_reads_slices(pooled, out_shape[:-2] + (slice_out, ow), oh):
        # the epilogue on the stacked slices (bias per channel), then the pool reads them
        for t in tail:
            call = t.value
            if len(call.args) == 2:   # the bias [1, O, 1, 1, 1]
                y = em.emit("add", [y, em.reshape(call.args[1], (1, o, 1, 1))])
            else:
                y = em.emit(call.op, [y], **call.attrs)
        y = em.reshape(y, out_shape[:-2] + (slice_out, ow))
        pool = pooled.value
        _rewrite_pool(dataclasses.replace(pooled, value=Call(pool.op, [y], pool.attrs,
                                                                pool.type)), em.out)
        return len(tail)
    # the slice binds the result (so that the epilogue fuses into it): in the result's rank
    y = em.reshape(y, out_shape[:-2] + (slice_out, ow))
    em.emit("strided_slice", [y], final=True, starts=(0,), ends=(oh,), axes=(len(out_shape) - 2,),
            steps=(1,))
    return 0


def _rewrite_conv(binding: Binding, out: list[Binding], tail: list[Binding],
                  pooled: Binding | None = None) -> int:
    """Rewrites ``binding``; how many of the bindings in ``tail`` (``_epilogue``) it took
    (and, where it took them, also ``pooled``, ``_pooled``'s pool, rewritten here)."""
    call = binding.value
    x, w = call.args
    # a call built without an attribute takes the op's default (every stride/dilation 1, no pads)
    n = len(x.type.shape) - 2
    attrs = {"strides": tuple(call.attrs.get("strides") or (1,) * n),
             "padding": tuple(call.attrs.get("padding") or (0,) * (2 * n)),
             "dilation": tuple(call.attrs.get("dilation") or (1,) * n),
             "groups": int(call.attrs.get("groups", 1))}
    em = _Emitter(binding, out)
    if len(x.type.shape) < 5 and all(d == 1 for d in attrs["dilation"]) \
            and not _long_row(w, attrs["groups"], attrs["strides"]):
        _conv_2d(em, x, w, attrs)
        return 0
    if len(x.type.shape) < 5:
        x, w, attrs = _as_3d(em, x, w, attrs)
    return _conv_3d(em, x, w, attrs, tail, pooled)


# ---- pooling ------------------------------------------------------------------------------------

def _pool_2d(em: _Emitter, x: Value, mode: str, kernel, strides, padding, dilation,
             attrs: dict, final: bool = False) -> Value:
    """One 2-D pool; ``padding`` in the 2-D rows' order (top, left, bottom, right)."""
    common = dict(kernel=tuple(kernel), strides=tuple(strides), padding=tuple(padding),
                  ceil_mode=bool(attrs.get("ceil_mode", False)))
    if mode == "max":
        return em.emit("nn.max_pool2d", [x], final=final, dilation=tuple(dilation), **common)
    common["count_include_pad"] = bool(attrs.get("count_include_pad", False))
    if strides[1] in (1, 2):
        return _avg_as_depthwise(em, x, final=final, **common)
    return em.emit("nn.avg_pool2d", [x], final=final, dilation=(1, 1), **common)


def _window_counts(size: int, k: int, s: int, pad0: int, pad1: int, out: int,
                   count_include_pad: bool) -> np.ndarray:
    """Elements an average divides by, per output position along one axis (as nn.avg_pool2d)."""
    start = np.arange(out) * s - pad0
    end = np.minimum(start + k, size + pad1)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_as_depthwise(em: _Emitter, x: Value, kernel, strides, padding, ceil_mode: bool,
                      count_include_pad: bool, final: bool = False) -> Value:
    """An average pool as a depthwise convolution with a constant window (the depthwise kernel
    reads padding without bounds checks; the generic pool's clamped reads do not vectorize),
    then, where windows hold different counts, a multiply by 1 / count per output position
    (fused into the convolution's epilogue). ``ceil_mode`` windows reach into zero padding."""
    n, c, h, w = x.type.shape
    out_type = infer_static("nn.avg_pool2d", x.type, kernel=kernel, strides=strides,
                            padding=padding, ceil_mode=ceil_mode,
                            count_include_pad=count_include_pad)
    _, _, oh, ow = out_type.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = kernel, strides, padding
    counts = np.outer(_window_counts(h, kh, sh, pt, pb, oh, count_include_pad),
                      _window_counts(w, kw, sw, pl, pr, ow, count_include_pad))
    uniform = bool(np.all(counts == kh * kw))
    em.count += 1
    weight = Constant(f"{em.binding.var.name}_window{em.count}",
                      np.full((c, 1, kh, kw), 1.0 / (kh * kw) if uniform else 1.0, np.float32))
    # bottom/right padding: exactly what the last window reaches (ceil_mode: beyond the pads)
    conv_pad = (pt, pl, max(0, (oh - 1) * sh + kh - h - pt), max(0, (ow - 1) * sw + kw - w - pl))
    y = em.emit("nn.conv2d", [x, weight], final=final and uniform, strides=tuple(strides),
                padding=conv_pad, dilation=(1, 1), groups=c)
    if uniform:
        return y
    em.count += 1
    scale = Constant(f"{em.binding.var.name}_counts{em.count}",
                     (1.0 / counts).astype(np.float32).reshape(1, 1, oh, ow))
    return em.emit("multiply", [y, scale], final=final)


def _pool_3d(em: _Emitter, x: Value, mode: str, attrs: dict) -> None:
    (kd, kh, kw), (sd, sh, sw) = attrs["kernel"], attrs["strides"]
    dd, dh, dw = attrs["dilation"]
    pd0, ph0, pw0, pd1, ph1, pw1 = attrs["padding"]
    n, c, depth, height, width = x.type.shape
    _, _, od, oh, ow = em.binding.var.type.shape
    final_shape = em.binding.var.type.shape
    plane = (kh, kw, sh, sw) != (1, 1, 1, 1) or any((ph0, pw0, ph1, pw1))
    along_depth = (kd, sd) != (1, 1) or any((pd0, pd1))

    def planes(v: Value, slices: int) -> Value:    # [N, C, slices, H, W] -> [.., OH, OW]
        v = em.reshape(v, (n, c * slices, height, width))
        return _pool_2d(em, v, mode, (kh, kw), (sh, sw), (ph0, pw0, ph1, pw1), (dh, dw), attrs)

    def depths(v: Value, h: int, w: int) -> Value:  # [N, C, D, h, w] -> [N, C, OD, h * w]
        v = em.reshape(v, (n, c, depth, h * w))
        return _pool_2d(em, v, mode, (kd, 1), (sd, 1), (pd0, 0, pd1, 0), (dd, 1), attrs)

    # the order that writes the smaller intermediate
    planes_first = depth * oh * ow <= od * height * width
    y = x
    if planes_first or not along_depth:
        if plane:
            y = planes(y, depth)
        if along_depth:
            y = depths(y, oh, ow)
    else:
        y = depths(y, height, width)
        if plane:
            y = planes(y, od)
    em.reshape(y, final_shape, final=True)


def _rewrite_pool(binding: Binding, out: list[Binding]) -> None:
    call = binding.value
    (x,) = call.args
    attrs = dict(call.attrs)
    mode = attrs["mode"]
    em = _Emitter(binding, out)
    kernel, strides = attrs["kernel"], attrs["strides"]
    padding, dilation = attrs["padding"], attrs["dilation"]
    rank = len(x.type.shape)
    if rank == 5:
        _pool_3d(em, x, mode, attrs)
    elif rank == 4:
        _pool_2d(em, x, mode, kernel, strides, padding, dilation, attrs, final=True)
    else:
        n, c, length = x.type.shape
        x2 = em.reshape(x, (n, c, 1, length))
        y = _pool_2d(em, x2, mode, _lift(kernel, 1), _lift(strides, 1),
                     (0, padding[0], 0, padding[1]), _lift(dilation, 1), attrs)
        em.reshape(y, binding.var.type.shape, final=True)


def _rewrite_avg_pool2d(binding: Binding, out: list[Binding]) -> None:
    call = binding.value
    attrs = dict(call.attrs)
    if not _static(call):     # run-time extents, every window whole (``_open_avg_pool``)
        kh, kw = attrs["kernel"]
        c = call.args[0].type.shape[1]
        weight = Constant(f"{binding.var.name}_window1",
                          np.full((c, 1, kh, kw), 1.0 / (kh * kw), np.float32))
        out.append(dataclasses.replace(binding, value=Call(
            "nn.conv2d", [call.args[0], weight],
            {"strides": tuple(attrs["strides"]), "padding": (0, 0, 0, 0),
             "dilation": (1, 1), "groups": c}, binding.var.type)))
        return
    _avg_as_depthwise(_Emitter(binding, out), call.args[0], tuple(attrs.get("kernel", (1, 1))),
                      tuple(attrs.get("strides", (1, 1))),
                      tuple(attrs.get("padding", (0, 0, 0, 0))),
                      bool(attrs.get("ceil_mode", False)),
                      bool(attrs.get("count_include_pad", False)), final=True)


# ---- the pass -----------------------------------------------------------------------------------

def _static(v: Call) -> bool:
    return all(isinstance(d, int) for a in v.args for d in a.type.shape + v.type.shape)


def _open_avg_pool(v: Call) -> bool:
    """A 2-D average pool with run-time extents whose windows are all whole (no padding, no
    ceil_mode: its count is kh * kw everywhere, whatever the size): a depthwise convolution
    with a constant window, the symbolic depthwise kernel's (codegen/depthwise/symbolic.py)."""
    a = v.attrs
    return (v.op == "nn.avg_pool2d" and len(v.type.shape) == 4
            and isinstance(v.args[0].type.shape[1], int)
            and not any(a.get("padding", (0, 0, 0, 0))) and not a.get("ceil_mode", False)
            and all(d == 1 for d in a.get("dilation", (1, 1)))
            and a.get("strides", (1, 1))[1] in (1, 2))


def _rewritable(v: object) -> bool:
    if not isinstance(v, Call) or v.type.dtype != "float32" or not 3 <= len(v.type.shape) <= 5:
        return False
    if not _static(v):
        # symbolic extents: the generic loop nest until the 2-D rows take them (an average
        # pool of whole windows does)
        return _open_avg_pool(v)
    if v.op == "nn.conv":
        return len(v.args) == 2 and all(a.type.dtype == "float32" for a in v.args)
    if v.op == "nn.conv2d":   # dilated (the fast 2-D kernel takes no dilation) or long rows
        return (any(d != 1 for d in v.attrs.get("dilation", (1, 1)))
                or len(v.args) == 2 and _long_row(v.args[1], int(v.attrs.get("groups", 1)),
                                                  v.attrs.get("strides", (1, 1)))) \
            and all(a.type.dtype == "float32" for a in v.args)
    if v.op == "nn.pool":
        mode = v.attrs.get("mode", "max")
        return mode == "max" or mode == "avg" and all(d == 1 for d in v.attrs["dilation"])
    if v.op == "nn.avg_pool2d":
        return v.attrs.get("strides", (1, 1))[1] in (1, 2)
    return False


def decompose_conv_nd(mod: IRModule) -> IRModule:
    """Rewrite every float32 ``nn.conv`` and max/avg ``nn.pool`` of 1-3 spatial axes (see the
    module docstring)."""

    def visit(fn: Function) -> Function:
        uses: Counter = Counter(id(a) for b in fn.bindings() for a in used_values(b.value))
        uses.update(id(o) for o in fn.outputs)
        blocks = []
        for block in fn.blocks:
            bindings: list[Binding] = []
            skip = 0   # bindings a rewritten convolution took (its epilogue)
            pooled: set[int] = set()   # pools a rewritten convolution took (``_pooled``)
            for i, b in enumerate(block.bindings):
                if skip:
                    skip -= 1
                elif id(b) in pooled:
                    continue
                elif not _rewritable(b.value):
                    bindings.append(b)
                elif b.value.op in ("nn.conv", "nn.conv2d"):
                    tail = _epilogue(block.bindings, i, uses)
                    pool = _pooled(block.bindings, i, tail, uses)
                    before = len(bindings)
                    skip = _rewrite_conv(b, bindings, tail, pool)
                    if pool is not None and any(n.var is pool.var for n in bindings[before:]):
                        pooled.add(id(pool))
                elif b.value.op == "nn.avg_pool2d":
                    _rewrite_avg_pool2d(b, bindings)
                else:
                    _rewrite_pool(b, bindings)
            blocks.append(type(block)(bindings) if isinstance(block, DataflowBlock)
                          else dataclasses.replace(block, bindings=bindings))
        return dataclasses.replace(fn, blocks=blocks)

    return map_functions(mod, visit)

