"""Transposed convolutions on the fast kernels: ``nn.conv_transpose`` with a constant weight
becomes stride-1 convolutions, one per output *phase*, and an interleave.

Along an axis with stride s, padding p and dilation d, output ``o = q * s + r`` receives tap k
from input ``i = q + (r + p - k * d) / s`` whenever that division is exact. So the outputs of one
phase r (every s-th output) are a plain stride-1 correlation of the input with the taps that
reach that phase, at offsets known at export. Three ways, by what the kernels do best:

- kernel == stride (k=2, s=2 in decoders and U-Nets, any rank): every phase is one tap at
  offset 0, so the whole transposed convolution is one GEMM ``[Cout * k^d, Cin] @ [Cin, H*W]``,
  run as a 1x1 ``nn.conv2d`` over the flattened image (measured 2x faster than ``matmul`` with
  the weight as its left operand: 2.9 vs 7.1 ms for 256->128 channels on 28x28);
- otherwise in 1-D/2-D with few taps along x (k=4, s=2 upsamplers), the taps along y by
  convolution windows one column wide, the taps along x by summing shifted columns;
- otherwise in 1-D/2-D, one stride-1 ``nn.conv2d`` per group of phases that share a window,
  the taps flipped into place and stacked along the output channels;
- otherwise in 3-D (where ``nn.conv`` has no fast kernel), one GEMM of every tap over the
  input padded so that all reads stay inside, then each phase sums its taps' columns (col2im).

``nn.phase_interleave`` then writes every phase into its place, adding the bias.

Everything is built from rows of the operator table (conv2d, pad, reshape), so those kernels'
fast paths, and whatever they learn later (run-time extents), apply here too. Weights are
rearranged once, at export. A transposed convolution whose weight is not a constant keeps the
generic loop nest.

Under sizes known only at run time, the 2-D kernel == stride case (a detector head's 2x2
stride-2 upsampler) takes the same 1x1 convolution, its channels then placed as the kh x kw
blocks by a transpose (``_pixels``: what the ONNX frontend does for a ``Constant`` weight; here
for weights that became constants only in ``fold_dequantize``, as a QDQ file's
DequantizeLinear weight does). The other symbolic cases keep the generic loop nest.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from ..ir.graph import (Binding, Call, Constant, DataflowBlock, Function, IRModule, TensorType,
                        Value, Var)
from .common import infer_static, map_functions


# A strided 2-D (or 1-D) transposed convolution with at most this many taps along x sums its
# x taps from one-column-wide convolutions (``_row_convolutions``); wider ones run a window per
# phase. Min of runs, 1 thread, kernels only (loaded machine): 128->64 k4s2p1 32x32 5.4 ms
# vs 6.1 (ORT 4.0-4.7), groups=4 0.53 vs 0.79 ms, 1-D 64->32 k4s2p1 56 vs 73 us; but 1-D
# 512->256 k16s8p4 18.5 vs 8.8 ms.
ROW_SUM_MAX_TAPS = 4


@dataclass(frozen=True)
class AxisPhase:
    """One phase r of one axis: the stride-1 window that computes it."""

    taps: tuple[tuple[int, int], ...]   # (kernel tap k, window position t)
    width: int                          # window length T (dense; taps may leave holes)
    pad_begin: int
    pad_end: int
    shift: int                          # phase output q is window output q + shift


def axis_taps(kernel: int, stride: int, pad: int, dilation: int) -> list[list[tuple[int, int]]]:
    """Per phase r of one axis, the taps k that reach it and their offsets: phase output q
    reads input ``q + offset``."""
    return [[(k, (r + pad - k * dilation) // stride) for k in range(kernel)
             if (r + pad - k * dilation) % stride == 0] for r in range(stride)]


def axis_phases(size: int, kernel: int, stride: int, pad: int, dilation: int, blocks: int,
                shared: bool = False) -> list[AxisPhase | None]:
    """The phases r = 0..stride-1 of one axis (None where no tap reaches the phase), each
    producing at least ``blocks`` outputs from an input axis of ``size``; ``shared``: every
    phase gets the window that covers all of them (so they stack into one convolution)."""
    taps = axis_taps(kernel, stride, pad, dilation)
    every = [off for offsets in taps for _, off in offsets]
    phases: list[AxisPhase | None] = []
    for offsets in taps:
        if not offsets:
            phases.append(None)
            continue
        window = every if shared else [off for _, off in offsets]
        lo = min(window)
        width = max(window) - lo + 1
        pad_begin = max(-lo, 0)
        shift = lo + pad_begin
        # window outputs = size + pad_begin + pad_end - width + 1 >= blocks + shift
        pad_end = max(0, blocks + shift - size - pad_begin + width - 1)
        phases.append(AxisPhase(tuple((k, off - lo) for k, off in offsets), width, pad_begin,
                                pad_end, shift))
    return phases


@dataclass
class _Plan:
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    blocks: tuple[int, ...]      # Q per axis: ceil(output / stride)
    outs: tuple[int, ...]
    per_axis: list[list[AxisPhase | None]]


def _plan(x: TensorType, w: TensorType, attrs: dict, out: TensorType) -> _Plan:
    spatial, kernel = x.shape[2:], w.shape[2:]
    n = len(spatial)
    strides, padding, dilation = attrs["strides"], attrs["padding"], attrs["dilation"]
    outs = out.shape[2:]
    blocks = tuple(-(-outs[d] // strides[d]) for d in range(n))
    # Phases along the last axis share one window: on x86-64-v3 the convolution kernel's 6x2
    # register tile spills on rows of 2-4 taps (128->64 channels, 32x32: 2x2 at 32 GFLOP/s,
    # 2x3 at 84; a 4x2 tile runs the 2x2 at 77), so k=4, s=2 runs faster as two 2x3 windows
    # (1.5x the multiply-adds) than as four 2x2 ones. Revisit when the tile choice knows it.
    per_axis = [axis_phases(spatial[d], kernel[d], strides[d], padding[d], dilation[d], blocks[d],
                            shared=d == n - 1) for d in range(n)]
    return _Plan(tuple(spatial), tuple(kernel), tuple(strides), blocks, tuple(outs), per_axis)


class _Emitter:
    """Appends the bindings that replace one ``nn.conv_transpose`` binding."""

    def __init__(self, binding: Binding, out: list[Binding]) -> None:
        self.binding = binding
        self.out = out
        self.count = 0

    def emit(self, op: str, args: list[Value], var: Var | None = None, **attrs) -> Value:
        ty = infer_static(op, *[a.type for a in args], **attrs)   # static: see _fast
        if var is None:
            self.count += 1
            var = Var(f"{self.binding.var.name}_ct{self.count}", ty)
        elif var.type != ty:
            raise AssertionError(f"conv_transpose rewrite: {ty} where {var.type} was expected")
        self.out.append(dataclasses.replace(self.binding, var=var, value=Call(op, args, attrs, ty)))
        return var

    def constant(self, data: np.ndarray, what: str) -> Constant:
        self.count += 1
        return Constant(f"{self.binding.var.name}_{what}{self.count}", np.ascontiguousarray(data))


def _stacked_weight(w: np.ndarray, groups: int, phase_list: list[tuple], plan: _Plan,
                    widths: tuple[int, ...]) -> np.ndarray:
    """Convolution weight [G * len(phases) * Og, Cg, *widths]: phase j's taps at their window
    positions, in the output channels g * len(phases) * Og + j * Og + og."""
    cin, og = w.shape[0], w.shape[1]
    cg = cin // groups
    wr = w.reshape((groups, cg, og) + plan.kernel)
    stacked = np.zeros((groups, len(phase_list), og, cg) + widths, dtype=w.dtype)
    for j, axes in enumerate(phase_list):
        for combo in itertools.product(*[a.taps for a in axes]):
            ks = tuple(k for k, _ in combo)
            ts = tuple(t for _, t in combo)
            stacked[(slice(None), j, slice(None), slice(None)) + ts] = \
                wr[(slice(None), slice(None), slice(None)) + ks].transpose(0, 2, 1)
    return stacked.reshape((groups * len(phase_list) * og, cg) + widths)


def _phase_groups(plan: _Plan) -> dict[tuple, list[tuple[int, tuple]]]:
    """Phases (row-major number, per-axis phases) grouped by the window they need."""
    groups: dict[tuple, list[tuple[int, tuple]]] = {}
    for j, axes in enumerate(itertools.product(*plan.per_axis)):
        if any(a is None for a in axes):
            continue
        key = tuple((a.width, a.pad_begin, a.pad_end) for a in axes)
        groups.setdefault(key, []).append((j, axes))
    return groups


def _rewrite(binding: Binding, out: list[Binding]) -> None:
    call = binding.value
    x, w = call.args[0], call.args[1]
    bias = call.args[2] if len(call.args) > 2 else None
    attrs = dict(call.attrs)
    groups = int(attrs.get("groups", 1))
    em = _Emitter(binding, out)
    n = len(x.type.shape) - 2
    wdata = w.data
    if n == 1:  # a 1-D transposed convolution is a 2-D one of height 1
        x = em.emit("reshape", [x], shape=x.type.shape[:2] + (1,) + x.type.shape[2:])
        wdata = wdata.reshape(wdata.shape[:2] + (1,) + wdata.shape[2:])
        pad = attrs["padding"]
        attrs.update(strides=(1,) + tuple(attrs["strides"]), dilation=(1,) + tuple(attrs["dilation"]),
                     padding=(0, pad[0], 0, pad[1]),
                     output_padding=(0,) + tuple(attrs.get("output_padding", (0,))))
    wtype = TensorType(wdata.shape, str(wdata.dtype))
    out_type = infer_static("nn.conv_transpose", x.type, wtype, **attrs)
    plan = _plan(x.type, wtype, attrs, out_type)
    phase_groups = _phase_groups(plan)
    ((key, members),) = phase_groups.items() if len(phase_groups) == 1 else ((None, None),)
    if key is not None and all(width == 1 and pb == 0 and pe == 0 for width, pb, pe in key) \
            and all(a.shift == 0 for _, axes in members for a in axes):
        inputs, phases = _stacked(em, x, wdata, groups, plan, members)
    elif len(plan.spatial) == 2:
        if 1 < plan.strides[1] and plan.kernel[1] <= ROW_SUM_MAX_TAPS:
            inputs, phases = _row_convolutions(em, x, wdata, groups, plan, attrs)
        else:
            inputs, phases = _phase_convolutions(em, x, wdata, groups, plan, phase_groups)
    else:
        inputs, phases = _gemm_and_sum(em, x, wdata, groups, plan, attrs)
    og = wdata.shape[1]
    batch, channels = x.type.shape[0], groups * og
    args = inputs + ([bias] if bias is not None else [])
    y = em.emit("nn.phase_interleave", args, phases=phases, strides=plan.strides, groups=groups,
                channels=channels, blocks=plan.blocks, has_bias=bias is not None)
    covered = tuple(q * s for q, s in zip(plan.blocks, plan.strides))
    final = binding.var
    outs = plan.outs[1:] if n == 1 else plan.outs
    if covered == plan.outs:
        em.emit("reshape", [y], var=final, shape=(batch, channels) + outs)
        return
    y = em.emit("reshape", [y], shape=(batch, channels) + covered)
    nd = len(plan.spatial)
    sliced = dict(starts=(0,) * nd, ends=plan.outs, axes=tuple(range(2, 2 + nd)), steps=(1,) * nd)
    if n == 1:
        y = em.emit("strided_slice", [y], **sliced)
        em.emit("reshape", [y], var=final, shape=(batch, channels) + outs)
    else:
        em.emit("strided_slice", [y], var=final, **sliced)


def _pointwise(em: _Emitter, x: Value, weight: np.ndarray, groups: int) -> Value:
    """``weight`` [M, Cg] applied at every pixel of ``x``: a 1x1 convolution over the image
    flattened to one row (the convolution kernel reads the input in place)."""
    batch, cin = x.type.shape[:2]
    spatial = x.type.shape[2:]
    flat = em.emit("reshape", [x], shape=(batch, cin, 1, int(np.prod(spatial))))
    y = em.emit("nn.conv2d", [flat, em.constant(weight[:, :, None, None], "w")], strides=(1, 1),
                padding=(0, 0, 0, 0), dilation=(1, 1), groups=groups)
    return em.emit("reshape", [y], shape=(batch, weight.shape[0]) + spatial)


def _stacked(em: _Emitter, x: Value, wdata: np.ndarray, groups: int, plan: _Plan,
             members: list) -> tuple[list[Value], tuple]:
    """Kernel == stride: every phase is one tap at offset 0, all computed by one 1x1
    convolution whose output channels are (group, phase, channel)."""
    og = wdata.shape[1]
    weight = _stacked_weight(wdata, groups, [axes for _, axes in members], plan,
                             (1,) * len(plan.spatial))
    y = _pointwise(em, x, weight.reshape(weight.shape[:2]), groups)
    step = len(members) * og
    phases = [()] * int(np.prod(plan.strides))
    for j, (number, _) in enumerate(members):
        phases[number] = ((0, j * og, step, (0,) * len(plan.spatial)),)
    return [y], tuple(phases)


def _phase_convolutions(em: _Emitter, x: Value, wdata: np.ndarray, groups: int, plan: _Plan,
                        phase_groups: dict) -> tuple[list[Value], tuple]:
    """One stride-1 ``nn.conv2d`` per group of phases that share a window."""
    og = wdata.shape[1]
    nd = len(plan.spatial)
    inputs: list[Value] = []
    phases: list[tuple] = [()] * int(np.prod(plan.strides))
    for key, members in phase_groups.items():
        widths = tuple(width for width, _, _ in key)
        weight = _stacked_weight(wdata, groups, [axes for _, axes in members], plan, widths)
        padding = tuple(pb for _, pb, _ in key) + tuple(pe for _, _, pe in key)
        inputs.append(em.emit("nn.conv2d", [x, em.constant(weight, "w")], strides=(1,) * nd,
                              padding=padding, dilation=(1,) * nd, groups=groups))
        step = len(members) * og
        for j, (number, axes) in enumerate(members):
            phases[number] = ((len(inputs) - 1, j * og, step, tuple(a.shift for a in axes)),)
    return inputs, tuple(phases)


def _row_convolutions(em: _Emitter, x: Value, wdata: np.ndarray, groups: int, plan: _Plan,
                      attrs: dict) -> tuple[list[Value], tuple]:
    """2-D: the taps along y by convolution windows one column wide (one ``nn.conv2d`` per
    group of row phases sharing a window, output channels (row phase, tap kx, channel)), the
    taps along x by summing shifted columns of those (col2im along the rows only)."""
    og = wdata.shape[1]
    cin = wdata.shape[0]
    cg = cin // groups
    kx_n = plan.kernel[1]
    taps_x = axis_taps(kx_n, plan.strides[1], attrs["padding"][1], attrs["dilation"][1])
    offs = [off for per_r in taps_x for _, off in per_r]
    begin_x = max(0, -min(offs))
    end_x = max(0, plan.blocks[1] + max(offs) - plan.spatial[1])
    wr = wdata.reshape((groups, cg, og) + plan.kernel)
    by_window: dict[tuple, list[int]] = {}
    for ry, ph in enumerate(plan.per_axis[0]):
        if ph is not None:
            by_window.setdefault((ph.width, ph.pad_begin, ph.pad_end), []).append(ry)
    inputs: list[Value] = []
    where: dict[int, tuple[int, int, int]] = {}     # ry -> (input, member number, step)
    for (width, pb, pe), members in by_window.items():
        weight = np.zeros((groups, len(members), kx_n, og, cg, width, 1), dtype=wdata.dtype)
        for j, ry in enumerate(members):
            for ky, t in plan.per_axis[0][ry].taps:
                weight[:, j, :, :, :, t, 0] = wr[:, :, :, ky, :].transpose(0, 3, 2, 1)
        weight = weight.reshape(groups * len(members) * kx_n * og, cg, width, 1)
        inputs.append(em.emit("nn.conv2d", [x, em.constant(weight, "w")], strides=(1, 1),
                              padding=(pb, begin_x, pe, end_x), dilation=(1, 1),
                              groups=groups))
        for j, ry in enumerate(members):
            where[ry] = (len(inputs) - 1, j, len(members) * kx_n * og)
    phases = []
    for ry in range(plan.strides[0]):
        for rx in range(plan.strides[1]):
            if ry not in where:
                phases.append(())
                continue
            i, j, step = where[ry]
            shift_y = plan.per_axis[0][ry].shift
            phases.append(tuple((i, (j * kx_n + kx) * og, step, (shift_y, off + begin_x))
                                for kx, off in taps_x[rx]))
    return inputs, tuple(phases)


def _gemm_and_sum(em: _Emitter, x: Value, wdata: np.ndarray, groups: int, plan: _Plan,
                  attrs: dict) -> tuple[list[Value], tuple]:
    """Every tap of every input pixel by one GEMM (a 1x1 convolution with Cout * prod(k)
    output channels) over the input padded so that every phase's reads stay inside it; each
    phase then sums its taps' shifted columns (col2im)."""
    nd = len(plan.spatial)
    cin, og = wdata.shape[0], wdata.shape[1]
    cg = cin // groups
    taps = [axis_taps(plan.kernel[d], plan.strides[d], attrs["padding"][d], attrs["dilation"][d])
            for d in range(nd)]
    begin, end = [], []
    for d in range(nd):
        offs = [off for per_r in taps[d] for _, off in per_r]
        begin.append(max(0, -min(offs)))
        end.append(max(0, plan.blocks[d] + max(offs) - plan.spatial[d]))
    if any(begin) or any(end):
        x = em.emit("pad", [x], pads=(0, 0) + tuple(begin) + (0, 0) + tuple(end))
    ktot = int(np.prod(plan.kernel))
    # output channel g * ktot * og + tap * og + o holds tap ``tap`` of group g's channel o
    wr = wdata.reshape((groups, cg, og, ktot)).transpose(0, 3, 2, 1)
    cols = _pointwise(em, x, wr.reshape(groups * ktot * og, cg), groups)
    phases = []
    for rs in itertools.product(*[range(s) for s in plan.strides]):
        terms = []
        for combo in itertools.product(*[taps[d][rs[d]] for d in range(nd)]):
            tap = int(np.ravel_multi_index(tuple(k for k, _ in combo), plan.kernel))
            terms.append((0, tap * og, ktot * og,
                          tuple(off + begin[d] for d, (_, off) in enumerate(combo))))
        phases.append(tuple(terms))
    return [cols], tuple(phases)


def _pixels(binding: Binding, out: list[Binding]) -> None:
    """``binding``'s kernel == stride 2-D transposed convolution on run-time sizes: a 1x1
    convolution to cout*kh*kw channels (bias repeated per block position, added in its
    epilogue), reshaped to (n, cout, kh, kw, h, w) and transposed into the kh x kw blocks."""
    call = binding.value
    x, w = call.args[0], call.args[1]
    cin, cout, kh, kw = w.data.shape
    n, _, h, wd = x.type.shape
    em = _Emitter(binding, out)
    w2 = w.data.transpose(1, 2, 3, 0).reshape(cout * kh * kw, cin, 1, 1)
    y = em.emit("nn.conv2d", [x, em.constant(w2, "w")], strides=(1, 1), padding=(0, 0, 0, 0),
                dilation=(1, 1), groups=1)
    if len(call.args) > 2:
        bias = np.repeat(call.args[2].data.astype(np.float32), kh * kw)
        y = em.emit("add", [y, em.constant(bias.reshape(1, -1, 1, 1), "b")])
    y = em.emit("reshape", [y], shape=(n, cout, kh, kw, h, wd))
    y = em.emit("transpose", [y], axes=(0, 1, 4, 2, 5, 3))
    em.emit("reshape", [y], var=binding.var, shape=binding.var.type.shape)


def _as_pixels(binding: Binding) -> bool:
    """A 2-D transposed convolution with a constant float32 weight (and bias), window ==
    stride, no padding, dilation or groups, on sizes known only at run time."""
    v = binding.value
    if not (isinstance(v, Call) and v.op == "nn.conv_transpose" and len(v.args) >= 2
            and all(isinstance(a, Constant) for a in v.args[1:])
            and v.type.dtype == "float32" and v.args[0].type.dtype == "float32"
            and len(v.type.shape) == 4 and len(v.args[1].type.shape) == 4):
        return False
    attrs = v.attrs
    kernel = tuple(v.args[1].type.shape[2:])
    return (tuple(attrs["strides"]) == kernel and not any(attrs["padding"])
            and tuple(attrs["dilation"]) == (1, 1) and not any(attrs.get("output_padding", ()))
            and int(attrs.get("groups", 1)) == 1
            and not all(isinstance(d, int) for d in v.args[0].type.shape))


def _fast(binding: Binding) -> bool:
    v = binding.value
    return (isinstance(v, Call) and v.op == "nn.conv_transpose" and len(v.args) >= 2
            and isinstance(v.args[1], Constant) and v.type.dtype == "float32"
            and v.args[0].type.dtype == "float32" and 3 <= len(v.type.shape) <= 5
            and all(isinstance(d, int) for d in v.args[0].type.shape + v.type.shape))


def decompose_conv_transpose(mod: IRModule) -> IRModule:
    """Rewrite every ``nn.conv_transpose`` with a constant float32 weight (see module doc)."""

    def visit(fn: Function) -> Function:
        blocks = []
        for block in fn.blocks:
            bindings: list[Binding] = []
            for b in block.bindings:
                if _fast(b):
                    _rewrite(b, bindings)
                elif _as_pixels(b):
                    _pixels(b, bindings)
                else:
                    bindings.append(b)
            blocks.append(type(block)(bindings) if isinstance(block, DataflowBlock)
                          else dataclasses.replace(block, bindings=bindings))
        return dataclasses.replace(fn, blocks=blocks)

    return map_functions(mod, visit)
