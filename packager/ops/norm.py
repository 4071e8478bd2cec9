"""``nn.normalize``: one operator for LayerNorm, InstanceNorm and GroupNorm (and torch's
native_layer_norm / native_group_norm).

    y = (x - mean) / sqrt(var + eps) [* scale] [+ bias]

with the mean and the (biased) variance taken over the trailing axes ``x.shape[axis:]`` (a "row";
the leading axes index the rows), or with ``groups`` over each of that many equal slices of
them (GroupNorm on [N, C, H, W] itself: axis 1, a row per group of C / groups channels, so its
readers fuse into the kernel with no reshape in between). ``scale`` and ``bias`` (present when
the attributes say so) broadcast to ``x`` without changing its shape: per element of the row
for LayerNorm ([n] or x.shape[axis:]), per row for InstanceNorm ([C, 1, 1] over [N, C, H, W],
axis 2), per channel segment of a row for GroupNorm-21 ([G, C/G, 1, 1] over
[N, G, C/G, H, W], axis 2).

The frontends emitted this as five operators (mean, subtract, multiply, mean, add/sqrt/divide,
multiply), four or five kernels each passing over the whole tensor; ``codegen/norm.py`` computes
it as one row kernel, the affine part fused. An elementwise reader (a ReLU, a residual add) fuses
into it as into any reduction (passes/fuse.py) and the kernel evaluates it before its store; the
tensor expressions below are the generic fallback (other dtypes, shapes or epilogues the kernel
does not take).
"""

from __future__ import annotations

import numpy as np

from ..ir import te
from ..ir.graph import TensorType
from ..ir.patterns import tag_reduction
from ..ir.sym import SymExpr, product
from .elementwise import broadcast_read
from .registry import REDUCTION, broadcast_shape, register_op


def _infer(x: TensorType, *params: TensorType, axis: int = -1, eps: float = 1e-5,
           scale: bool = False, bias: bool = False, groups: int = 1, relations: list
           ) -> TensorType:
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    if groups != 1 and (not isinstance(x.shape[axis], int) or groups < 1
                        or x.shape[axis] % groups):
        raise ValueError(f"{groups} groups do not divide axis {axis} of {x.shape}")
    if len(params) != int(scale) + int(bias):
        raise ValueError(f"nn.normalize takes {int(scale) + int(bias)} parameters, "
                         f"got {len(params)}")
    for p in params:
        if len(p.shape) > rank or broadcast_shape(x.shape, p.shape,
                                                  relations=relations) != tuple(x.shape):
            raise ValueError(f"a scale or bias of shape {p.shape} does not broadcast to "
                             f"{x.shape} without changing it")
        if p.dtype != x.dtype:
            raise ValueError(f"scale/bias dtype {p.dtype} differs from the input's {x.dtype}")
    return x


def _legalize(x: te.Tensor, *params: te.Tensor, out_type: TensorType, name: str,
              axis: int = -1, eps: float = 1e-5, scale: bool = False,
              bias: bool = False, groups: int = 1) -> te.Tensor:
    axis %= x.ndim
    red = list(range(axis, x.ndim))
    # with groups, a row is one group of x.shape[axis] (and everything after it)
    cg = x.shape[axis] // groups if groups > 1 else x.shape[axis]
    extents = [cg] + [x.shape[d] for d in red[1:]]
    raxes = [te.reduce_axis(e, f"r{d}") for d, e in zip(red, extents)]
    count = product(extents)
    row_shape = tuple(groups if d == axis else 1 if d > axis else n
                      for d, n in enumerate(x.shape))
    tag_reduction(raxes[0], "normalize", (x,) + tuple(params), start=axis, eps=float(eps),
                  scale=bool(scale), bias=bool(bias), groups=int(groups))   # codegen/norm.py
    inv_count = (1.0 / te.cast(te.Const(count, "int64"), x.dtype)
                 if isinstance(count, SymExpr) else te.const(1.0 / count, x.dtype))

    def row_read(t: te.Tensor, i) -> te.Read:
        group = i[axis] // cg if groups > 1 else 0
        return t[tuple(i[:axis]) + (group,) + (0,) * (x.ndim - axis - 1)]

    def within(i, axes) -> tuple:
        first = i[axis] * cg + axes[0] if groups > 1 else axes[0]
        return tuple(i[:axis]) + (first,) + tuple(axes[1:])

    def at_r(i) -> tuple:
        return within(i, raxes)

    mean = te.compute(row_shape, lambda *i: te.sum_of(x[at_r(i)], raxes) * inv_count,
                      name=f"{name}_mean")

    # the variance's own reduction axes (each stage reduces over its own)
    raxes2 = [te.reduce_axis(e, f"s{d}") for d, e in zip(red, extents)]

    def at_s(i) -> tuple:
        return within(i, raxes2)

    def sq2(i):
        d = x[at_s(i)] - row_read(mean, i)
        return d * d

    inv_std = te.compute(
        row_shape, lambda *i: 1.0 / te.sqrt(te.sum_of(sq2(i), raxes2) * inv_count
                                            + te.const(float(eps), x.dtype)),
        name=f"{name}_inv_std")
    it = iter(params)
    gamma = next(it) if scale else None
    beta = next(it) if bias else None

    def out(*i):
        y = (x[i] - row_read(mean, i)) * row_read(inv_std, i)
        if gamma is not None:
            y = y * broadcast_read(gamma, i)
        if beta is not None:
            y = y + broadcast_read(beta, i)
        return y

    return te.compute(x.shape, out, name=name)


@register_op("nn.normalize", REDUCTION, _infer, _legalize)
def normalize(x: np.ndarray, *params: np.ndarray, axis: int = -1, eps: float = 1e-5,
              scale: bool = False, bias: bool = False, groups: int = 1) -> np.ndarray:
    axis %= x.ndim
    xd = x.astype(np.float64).reshape(x.shape[:axis] + (groups, -1))
    mean = xd.mean(axis=-1, keepdims=True)
    var = ((xd - mean) ** 2).mean(axis=-1, keepdims=True)
    y = ((xd - mean) / np.sqrt(var + eps)).reshape(x.shape)
    it = iter(params)
    if scale:
        y = y * next(it)
    if bias:
        y = y + next(it)
    return y.astype(x.dtype)
