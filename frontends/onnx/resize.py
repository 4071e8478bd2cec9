"""Converters for resampling ONNX operators (Resize, Upsample).

Scales, sizes and roi known at export build the tables here; fed at run time (any mode,
antialias, the aspect-ratio policies), ``resize_taps`` kernels build them for each run.
Resize is separable, so each resized axis becomes one operator whose per-output-position
tables (source indices and weights) are computed here with numpy, following the ONNX
specification: ``nearest`` is a ``take`` with constant indices (any dtype); ``linear`` and
``cubic`` (with antialias, exclude_outside, cubic_coeff_a and tf_crop_and_resize's
extrapolation) are ``resize_axis`` with a weight table.

Two shapes of the tables get cheaper kernels: nearest tables that repeat every element r times
(an integer scale, in whichever coordinate mode rounds that way) become one ``broadcast_to``
that copies rows and duplicates values in registers (1x96x64x64 at 2x: 0.15 ms, as ORT, where
two gathers took 1.4 ms); and an upsampled innermost axis, the only one whose resampling
gathers along rows, is resampled first, while the tensor is smallest.
"""

from __future__ import annotations

import math

import numpy as np

from typing import Any

from ...packager.ir.graph import Value
from ...packager.ir.sym import is_static
from ...packager.ops.resize_tables import resize_tables
from ...packager.ops.resize_taps import antialias_width
from .registry import NodeContext, converter

_MODES = ("nearest", "linear", "cubic")
_COORDS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
           "asymmetric", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# ---- output sizes -------------------------------------------------------------------------------

def _optional_const(ctx: NodeContext, i: int, what: str) -> np.ndarray | None:
    """Input ``i`` as a constant, or None when it is absent or empty."""
    if not ctx.has_input(i):
        return None
    value = ctx.input(i)
    if 0 in value.type.shape:
        return None
    return ctx.require_const(i, what)


def _plan(ctx: NodeContext, shape: tuple[int, ...], scales: np.ndarray | None,
          sizes: np.ndarray | None, axes: list[int], policy: str
          ) -> tuple[list[float], list[int]]:
    """Per-axis (scale, output size) of every axis of the input, as the specification says."""
    rank = len(shape)
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of scales and sizes must be given")
    given = (scales if scales is not None else sizes).reshape(-1)
    if len(given) != len(axes):
        raise ctx.error(f"{'scales' if sizes is None else 'sizes'} has {len(given)} values "
                        f"for {len(axes)} axes")
    if sizes is None:
        factors = [1.0] * rank
        for a, s in zip(axes, given.tolist()):
            if not s > 0:
                raise ctx.error(f"scale {s} must be positive")
            factors[a] = float(s)
        return factors, [int(f * n) if is_static([n]) else
                         (n * int(f) if float(f).is_integer() else _scaled_size(f, n))
                         for f, n in zip(factors, shape)]
    out = list(shape)
    for a, s in zip(axes, given.tolist()):
        if int(s) < 1:
            raise ctx.error(f"size {int(s)} must be positive")
        out[a] = int(s)
    # a size known only at run time: the scale is out / in of each run (None)
    factors = [o / n if is_static([n]) else 1.0 if o is n else None
               for o, n in zip(out, shape)]
    if policy == "stretch":
        return factors, out
    if None in factors:
        raise ctx.error(f"keep_aspect_ratio_policy={policy!r} on sizes known only at run time "
                        "is not supported: fix the input sizes with --input-shape")
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.error(f"keep_aspect_ratio_policy={policy!r} is not stretch, not_larger or "
                        "not_smaller")
    picked = [factors[a] for a in axes]
    scale = min(picked) if policy == "not_larger" else max(picked)
    factors = [scale if d in axes else 1.0 for d in range(rank)]
    return factors, [int(scale * shape[d] + 0.5) if d in axes else shape[d] for d in range(rank)]


def _scaled_size(f: float, n: object) -> object:
    """``floor(f * n)`` for a size ``n`` known at run time: ``(n * p) // q`` with ``p / q`` the
    float's exact value (the same as the float product for any size below 2^29)."""
    from fractions import Fraction
    ratio = Fraction(float(f))
    return (n * ratio.numerator) // ratio.denominator


def _resize(ctx: NodeContext, x: Value, factors: list[float], out: list[int], mode: str,
            coord: str, roi: np.ndarray | None, axes: list[int], **table_args) -> Value:
    if mode not in _MODES:
        raise ctx.error(f"mode={mode!r} is not nearest, linear or cubic")
    if coord not in _COORDS:
        raise ctx.error(f"coordinate_transformation_mode={coord!r} is not one of "
                        f"{', '.join(_COORDS)}")
    shape = x.type.shape
    rank = len(shape)
    if mode != "nearest" and x.type.dtype not in ("float32", "float64"):
        raise ctx.error(f"mode={mode!r} needs a float32 or float64 input, not {x.type.dtype}")
    full_roi = None
    if roi is not None and coord == "tf_crop_and_resize":
        flat = [float(v) for v in roi.reshape(-1)]
        if len(flat) != 2 * len(axes):
            raise ctx.error(f"roi has {len(flat)} values; {2 * len(axes)} expected")
        full_roi = [(0.0, 1.0)] * rank
        for i, a in enumerate(axes):
            full_roi[a] = (flat[i], flat[len(axes) + i])
    elif coord == "tf_crop_and_resize":
        raise ctx.error("coordinate_transformation_mode='tf_crop_and_resize' needs roi")
    if not is_static(shape) or not is_static(out):
        return _resize_symbolic(ctx, x, factors, out, mode, coord, full_roi, axes, table_args)
    tables = {}
    for a in axes:
        axis_roi = None if full_roi is None else full_roi[a]
        if (math.isclose(factors[a], 1.0) and out[a] == shape[a]
                and (axis_roi is None or axis_roi == (0.0, 1.0))):
            continue
        if out[a] < 1:
            raise ctx.error(f"output size {out[a]} of axis {a} is empty")
        tables[a] = resize_tables(shape[a], out[a], factors[a], mode, coord, axis_roi,
                                  **table_args)
    repeats = {a: _repeat_factor(shape[a], out[a], *tables[a]) for a in tables}
    if tables and all(repeats.values()):
        return _repeat(ctx, x, repeats)
    y = x
    dtype = x.type.dtype
    for a in _axis_order(shape, out, list(tables)):
        idx, w, fill = tables[a]
        if mode == "nearest" and not fill.any() and (w.max(axis=1) == 1).all():
            # one tap per output: a gather with constant indices
            picked = idx[np.arange(len(idx)), w.argmax(axis=1)]
            y = ctx.emit("take", y, ctx.constant(picked, "resize_index"), axis=a)
            continue
        y = ctx.emit("resize_axis", y, ctx.constant(idx, "resize_index"),
                     ctx.constant(w.astype(dtype), "resize_weight"),
                     ctx.constant(fill.astype(dtype), "resize_fill"), axis=a)
    return y


def _resize_symbolic(ctx: NodeContext, x: Value, factors: list[float], out: list, mode: str,
                     coord: str, roi: Any, axes: list[int], table_args: dict) -> Value:
    """Resize where a size is known at run time only: an integer upscale whose nearest tables
    repeat each element (the same at every size: checked on a few sizes here) is a broadcast;
    anything else builds its tables at run time (``resize_taps``), from the constant scale or,
    for sizes, from out / in of the run."""
    shape = x.type.shape
    repeats = {}
    changed = [a for a in axes if not (out[a] is shape[a] or out[a] == shape[a])
               or (roi is not None and roi[a] != (0.0, 1.0))]
    for a in changed:
        f = factors[a]
        if f is not None and not (is_static([shape[a]]) and is_static([out[a]])) \
                and float(f).is_integer() and f >= 1 and out[a] == int(f) * shape[a] \
                and roi is None:
            r = int(f)
            if all(_repeat_factor(n, n * r, *resize_tables(n, n * r, float(r), mode, coord,
                                                              None, **table_args)) == r
                   for n in (1, 2, 3, 5, 8, 13)):
                repeats[a] = r
    if len(repeats) == len(changed):
        return _repeat(ctx, x, repeats) if repeats else x
    if table_args.get("antialias") or x.type.dtype not in ("float32", "float64"):
        raise ctx.error(f"resizing {x.type.dtype} ({mode}, {coord}"
                        f"{', antialias' if table_args.get('antialias') else ''}) with sizes "
                        "known only at run time is not supported; fix the input sizes with "
                        "--input-shape")
    y = x
    for a in changed:
        span = (0.0, 1.0) if roi is None else roi[a]
        y = _taps_axis(ctx, y, a, out[a], factors[a], ctx.constant(np.array(span), "roi"), mode,
                       coord, table_args["nearest_mode"], table_args.get("cubic_a", -0.75),
                       table_args.get("exclude_outside", False),
                       table_args.get("extrapolation", 0.0))
    return y


def _taps_axis(ctx: NodeContext, y: Value, a: int, out_size: object, scale: Any, span: Value,
               mode: str, coord: str, nearest_mode: str, cubic_a: float, exclude: bool,
               extrapolation: float, antialias_taps: int = 0) -> Value:
    """Axis ``a`` of ``y`` resized to ``out_size`` with tables built at run time: ``scale`` a
    float, a float64 ``[1]`` tensor, or None (out / in of the run). ``antialias_taps``: the
    antialiased filter's widest tap count (its width follows the run's scale): the kernels
    give each row's taps before normalisation (float64, zero past the filter's width), a sum
    normalises them."""
    if scale is None or isinstance(scale, Value):
        tensor = scale if scale is not None else ctx.constant(np.array([1.0]), "scale")
    else:
        tensor = ctx.constant(np.array([float(scale)]), "scale")
    attrs = dict(in_size=y.type.shape[a], out_size=out_size, mode=mode, coord=coord,
                 dtype=y.type.dtype, nearest_mode=nearest_mode, cubic_a=float(cubic_a),
                 exclude_outside=bool(exclude), extrapolation=float(extrapolation),
                 from_sizes=scale is None)
    # a size known only at run time: a kernel, even when the tables' own shape is static
    emit = ctx.emit if is_static([y.type.shape[a], out_size]) else ctx.bb.emit_op
    if antialias_taps:
        fill = emit("resize_taps", tensor, span, part="fill", **attrs)
        attrs.update(antialias=True, taps=antialias_taps)
        idx = emit("resize_taps", tensor, span, part="index", **attrs)
        raw = emit("resize_taps", tensor, span, part="raw", **attrs)
        total = ctx.emit("sum", raw, axes=(1,), keepdims=True)
        total = ctx.emit("where", ctx.emit("equal", total, ctx.scalar(0.0, total)),
                         ctx.scalar(1.0, total), total)
        w = ctx.emit("divide", raw, total)
        if y.type.dtype != "float64":
            w = ctx.emit("cast", w, dtype=y.type.dtype)
        return ctx.emit("resize_axis", y, idx, w, fill, axis=a)
    tables = [emit("resize_taps", tensor, span, part=part, **attrs)
              for part in ("index", "weight", "fill")]
    return ctx.emit("resize_axis", y, *tables, axis=a)


def _repeat_factor(in_size: int, out_size: int, idx: np.ndarray, w: np.ndarray,
                   fill: np.ndarray) -> int | None:
    """r when the axis's tables repeat every input element r times in order (nearest at an
    integer scale, in any coordinate mode that rounds that way), else None."""
    if out_size % in_size or fill.any() or not (w.max(axis=1) == 1).all():
        return None
    r = out_size // in_size
    picked = idx[np.arange(len(idx)), w.argmax(axis=1)]
    return r if np.array_equal(picked, np.arange(out_size) // r) else None


def _repeat(ctx: NodeContext, x: Value, repeats: dict[int, int]) -> Value:
    """Every element repeated along the axes of ``repeats``: a broadcast over new size-r axes
    beside them, so the kernel copies each input row and duplicates values in registers."""
    split, wide = [], []
    for a, n in enumerate(x.type.shape):
        split.append(n)
        wide.append(n)
        if a in repeats:
            split.append(1)
            wide.append(repeats[a])
    y = ctx.emit("broadcast_to", ctx.reshape(x, tuple(split)), shape=tuple(wide))
    return ctx.reshape(y, tuple(n * repeats.get(a, 1) for a, n in enumerate(x.type.shape)))


def _axis_order(shape, out, axes: list[int]) -> list[int]:
    """The innermost axis's resampling gathers along rows (the others move whole rows): when
    it upsamples, do it first, while the tensor is smallest."""
    last = len(shape) - 1
    if last in axes and out[last] > shape[last]:
        return [last] + [a for a in axes if a != last]
    return axes


_RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                 "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
                 "nearest_mode": "round_prefer_floor"}


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _convert_resize(ctx: NodeContext, scales_at: int, sizes_at: int | None) -> Value:
    x = ctx.input(0)
    rank = len(x.type.shape)
    axes = ctx.attrs.get("axes")
    axes = list(range(rank)) if not axes else [int(a) % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {ctx.attrs['axes']} repeat an axis")
    policy = _text(ctx.attrs.get("keep_aspect_ratio_policy", "stretch"))
    if _fed_at_run_time(ctx, scales_at, sizes_at):
        return _resize_run_time(ctx, x, axes, scales_at, sizes_at)
    scales = _optional_const(ctx, scales_at, "scales")
    sizes = _optional_const(ctx, sizes_at, "sizes") if sizes_at is not None else None
    roi = _optional_const(ctx, 1, "roi") if scales_at == 2 else None
    factors, out = _plan(ctx, x.type.shape, scales, sizes, axes, policy)
    nearest_mode = _text(ctx.attrs["nearest_mode"])
    if nearest_mode not in _NEAREST:
        raise ctx.error(f"nearest_mode={nearest_mode!r} is not one of {', '.join(_NEAREST)}")
    mode = _text(ctx.attrs["mode"])
    antialias = bool(ctx.attrs.get("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.error("antialias=1 needs mode linear or cubic")
    return _resize(ctx, x, factors, out, mode, _text(ctx.attrs["coordinate_transformation_mode"]),
                   roi, axes, nearest_mode=nearest_mode,
                   cubic_a=float(ctx.attrs["cubic_coeff_a"]),
                   exclude_outside=bool(ctx.attrs["exclude_outside"]), antialias=antialias,
                   extrapolation=float(ctx.attrs["extrapolation_value"]))


def _given(ctx: NodeContext, i: int | None) -> bool:
    return i is not None and ctx.has_input(i) and 0 not in ctx.input(i).type.shape


def _fed_at_run_time(ctx: NodeContext, scales_at: int, sizes_at: int | None) -> bool:
    """Whether sizes (as size expressions) or roi arrive at run time (scales at run time still
    need --bind)."""
    from .symvalue import dims_of
    policy = _text(ctx.attrs.get("keep_aspect_ratio_policy", "stretch"))
    if policy not in ("stretch", "not_larger", "not_smaller") or (
            policy != "stretch" and not _given(ctx, sizes_at)) \
            or ctx.input(0).type.dtype not in ("float32", "float64"):
        return False   # these need the sizes at export: --bind
    if _given(ctx, sizes_at) and ctx.const(sizes_at) is None:
        return dims_of(ctx.input(sizes_at)) is not None
    if _given(ctx, scales_at) and ctx.const(scales_at) is None:
        from .valueinputs import run_time_scales
        rank = len(ctx.input(0).type.shape)
        count = len(ctx.attrs.get("axes") or range(rank))
        coord = _text(ctx.attrs.get("coordinate_transformation_mode", "asymmetric"))
        return coord != "tf_crop_and_resize" and \
            run_time_scales(ctx, scales_at, count) is not None
    roi_at = 1 if scales_at == 2 else None
    return _given(ctx, roi_at) and ctx.const(roi_at) is None and _given(ctx, sizes_at)


def _resize_run_time(ctx: NodeContext, x: Value, axes: list[int], scales_at: int,
                     sizes_at: int | None) -> Value:
    """Resize to sizes known at run time (a graph input's values or a shape computation: size
    expressions; or float scales fed as a graph input, whose sizes ``floor(scale * dim)`` are
    bound at run start), or with a roi fed at run time: per resized axis, ``resize_taps``
    kernels build the tables for the sizes of this run and ``resize_axis`` applies them."""
    from .valueinputs import read_as, run_time_scales, scale_sizes
    mode, coord = _text(ctx.attrs["mode"]), _text(ctx.attrs["coordinate_transformation_mode"])
    if mode not in _MODES or coord not in _COORDS:
        raise ctx.error(f"mode={mode!r} / coordinate_transformation_mode={coord!r} is not "
                        "supported")
    nearest_mode = _text(ctx.attrs["nearest_mode"])
    if nearest_mode not in _NEAREST:
        raise ctx.error(f"nearest_mode={nearest_mode!r} is not one of {', '.join(_NEAREST)}")
    antialias = bool(ctx.attrs.get("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.error("antialias=1 needs mode linear or cubic")
    if antialias and not is_static([x.type.shape[a] for a in axes]):
        raise ctx.error("antialias with input sizes known only at run time is not supported; "
                        "fix the input sizes with --input-shape")
    scales = None
    if _given(ctx, scales_at):
        if _given(ctx, sizes_at):
            raise ctx.error("exactly one of scales and sizes must be given")
        scales = run_time_scales(ctx, scales_at, len(axes))
        if scales is None:
            ctx.require_const(scales_at, "scales")
        sizes = scale_sizes(ctx, scales, [x.type.shape[a] for a in axes])
        if scales.type.dtype != "float64":
            scales = ctx.emit("cast", scales, dtype="float64")
    else:
        read_as(ctx, sizes_at, "dims")
        sizes = ctx.dims(sizes_at, "sizes")
    if len(sizes) != len(axes):
        raise ctx.error(f"sizes has {len(sizes)} values for {len(axes)} axes")
    policy = _text(ctx.attrs.get("keep_aspect_ratio_policy", "stretch"))
    if policy != "stretch":
        sizes, scale = _policy_sizes(ctx, x, axes, sizes_at, sizes, policy)
        scales = ctx.emit("concat", *([scale] * len(axes)), axis=0) if len(axes) > 1 else scale
    roi = _run_time_roi(ctx, axes) if coord == "tf_crop_and_resize" else None
    y = x
    for k, a in enumerate(axes):
        span = roi[k] if roi is not None else ctx.constant(np.array([0.0, 1.0]), "roi")
        if roi is None and (sizes[k] is y.type.shape[a] or sizes[k] == y.type.shape[a]):
            continue
        scale = None if scales is None else ctx.emit(
            "take", scales, ctx.constant(np.array([k], np.int64), "axis"), axis=0)
        y = _taps_axis(ctx, y, a, sizes[k], scale, span, mode, coord, nearest_mode,
                       float(ctx.attrs["cubic_coeff_a"]), bool(ctx.attrs["exclude_outside"]),
                       float(ctx.attrs["extrapolation_value"]),
                       antialias_width(mode, x.type.shape[a]) if antialias else 0)
    return y


def _policy_sizes(ctx: NodeContext, x: Value, axes: list[int], sizes_at: int, given: list,
                  policy: str) -> tuple[list, Value]:
    """keep_aspect_ratio_policy not_larger / not_smaller with sizes fed at run time: the
    scale ``min`` (``max``) of ``size / dim`` over the axes and each output size
    ``int(scale * dim + 0.5)``, computed by kernels in float64 as the export-time plan does,
    each size a variable bound at run time (``bind_size``; at most the size asked for with
    not_larger, ``sum(sizes) * dim`` with not_smaller). Returns (sizes, scale float64 [1])."""
    dims = [x.type.shape[a] for a in axes]
    if not is_static(dims):
        raise ctx.error(f"keep_aspect_ratio_policy={policy!r} with input sizes known only at "
                        "run time is not supported; fix the input sizes with --input-shape")
    from .symvalue import SymValue, materialize
    asked = ctx.input(sizes_at)
    asked = materialize(ctx.bb, asked) if isinstance(asked, SymValue) else asked
    asked = ctx.emit("cast", asked, dtype="float64")
    ratios = ctx.emit("divide", ctx.reshape(asked, (len(axes),)),
                      ctx.constant(np.array(dims, np.float64), "resize_dims"))
    pick = [ctx.emit("take", ratios, ctx.constant(np.array([k], np.int64), "axis"), axis=0)
            for k in range(len(axes))]
    scale = pick[0]
    for other in pick[1:]:
        scale = ctx.emit("minimum" if policy == "not_larger" else "maximum", scale, other)
    total = given[0]
    for g in given[1:]:
        total = total + g
    out, bound = [], []
    for k, n in enumerate(dims):
        wide = ctx.emit("add", ctx.emit("multiply", scale, ctx.constant(np.array([float(n)]),
                                                                          "resize_dim")),
                        ctx.constant(np.array([0.5]), "half"))
        count = ctx.emit("cast", ctx.emit("floor", wide), dtype="int64")
        after, d = ctx.bb.bind_size(count, given[k] if policy == "not_larger" else total * n,
                                    "resized")
        out.append(d)
        bound.append(after)
    # the tables' kernels read the bound sizes: their scale input comes after the bindings
    # (plus 0 times each count: the same value, in the order the VM needs)
    for after in bound:
        scale = ctx.emit("add", scale, ctx.emit("multiply", ctx.emit("cast", after,
                                                                     dtype="float64"),
                                                ctx.constant(np.array([0.0]), "zero")))
    return out, scale


def _run_time_roi(ctx: NodeContext, axes: list[int]) -> list[Value]:
    """tf_crop_and_resize's (start, end) of each resized axis, float64 ``[2]`` tensors."""
    if not _given(ctx, 1):
        raise ctx.error("coordinate_transformation_mode='tf_crop_and_resize' needs roi")
    roi = ctx.input(1)
    k = len(axes)
    if roi.type.shape != (2 * k,):
        raise ctx.error(f"roi has shape {roi.type.shape}; ({2 * k},) expected")
    roi = roi if roi.type.dtype == "float64" else ctx.emit("cast", roi, dtype="float64")
    return [ctx.emit("take", roi, ctx.constant(np.array([i, k + i], np.int64), "roi_at"),
                     axis=0) for i in range(k)]


@converter("Resize", since=10, attrs={"mode": "nearest"})
def _resize_10(ctx: NodeContext) -> Value:
    # Opset 10: (X, scales); asymmetric coordinates, nearest rounds down (as Upsample).
    ctx.attrs = {**_RESIZE_ATTRS, **ctx.attrs, "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"}
    return _convert_resize(ctx, 1, None)


@converter("Resize", since=11, attrs=_RESIZE_ATTRS)
def _resize_11(ctx: NodeContext) -> Value:
    return _convert_resize(ctx, 2, 3)


@converter("Resize", since=18, attrs={**_RESIZE_ATTRS, "antialias": 0, "axes": None,
                                      "keep_aspect_ratio_policy": "stretch"})
def _resize_18(ctx: NodeContext) -> Value:
    return _convert_resize(ctx, 2, 3)


def _upsample(ctx: NodeContext, scales: np.ndarray) -> Value:
    x = ctx.input(0)
    mode = _text(ctx.attrs["mode"])
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ctx.error(f"mode={mode!r} is not nearest or linear")
    rank = len(x.type.shape)
    factors, out = _plan(ctx, x.type.shape, np.asarray(scales, dtype=np.float64), None,
                         list(range(rank)), "stretch")
    return _resize(ctx, x, factors, out, mode, "asymmetric", None, list(range(rank)),
                   nearest_mode="floor")


@converter("Upsample", since=7, attrs={"mode": "nearest", "scales": None})
def _upsample_7(ctx: NodeContext) -> Value:
    if ctx.attrs["scales"] is None:
        raise ctx.error("the scales attribute is required")
    return _upsample(ctx, np.array(ctx.attrs["scales"], dtype=np.float64))


@converter("Upsample", since=9, attrs={"mode": "nearest"})
def _upsample_9(ctx: NodeContext) -> Value:
    if ctx.const(1) is None and _fed_at_run_time(ctx, 1, None):   # scales fed at run time
        mode = _text(ctx.attrs["mode"])
        ctx.attrs = {**_RESIZE_ATTRS, "mode": "linear" if mode == "bilinear" else mode,
                     "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        return _resize_run_time(ctx, ctx.input(0), list(range(len(ctx.input(0).type.shape))),
                                1, None)
    return _upsample(ctx, ctx.require_const(1, "scales"))


@converter("GridSample", since=16, attrs={"mode": "bilinear", "padding_mode": "zeros",
                                          "align_corners": 0})
def _grid_sample(ctx: NodeContext) -> Value:
    x, grid = ctx.input(0), ctx.input(1)
    # opset 16 says bilinear/bicubic (2-D only); opset 20 renamed them linear/cubic (N-D)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(_text(ctx.attrs["mode"]),
                                                         _text(ctx.attrs["mode"]))
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.error(f"mode={ctx.attrs['mode']!r} is not nearest, linear or cubic")
    padding = _text(ctx.attrs["padding_mode"])
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.error(f"padding_mode={padding!r} is not zeros, border or reflection")
    if x.type.dtype not in ("float32", "float64"):
        raise ctx.error(f"input X is {x.type.dtype}; only float32 and float64 are supported")
    if grid.type.dtype != x.type.dtype:
        grid = ctx.emit("cast", grid, dtype=x.type.dtype)
    return ctx.emit("grid_sample", x, grid, mode=mode, padding_mode=padding,
                    align_corners=bool(ctx.attrs["align_corners"]))


def resample(ctx: NodeContext, x: Value, out: list[int], mode: str, coord: str,
             factors: list[float] | None = None, **table_args) -> Value:
    """Resize ``x`` to shape ``out`` (every axis may change) with the tables above: the entry
    the torch frontend's ``upsample_*`` converters share, so both frontends give the same
    kernels. ``factors`` default to out / in per axis; ``ctx`` needs ``emit``, ``constant``,
    ``reshape`` and ``error``."""
    shape = x.type.shape
    if factors is None:
        factors = [o / n for o, n in zip(out, shape)]
    return _resize(ctx, x, list(factors), list(out), mode, coord, None, list(range(len(shape))),
                   **table_args)
