"""A kernel for float32 transposes that move the last axis (MLP-Mixer's token mixing, attention's
k^T): tiles of T x T elements, T vectors loaded along the input's last axis, transposed in
registers by log2(T) stages of interleaving shuffles, stored as T vectors along the output's
last axis. The generic loop nest vectorized along the output and gathered the input with a
stride: 196x256 -> 256x196 took 40 us (ORT ~13). Edges that do not fill a tile are copied
element by element.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.sym import product
from .helpers import F32, I32, const_i64, for_range
from .lower import KernelEmitter, KernelInfo, _same_size, is_symbolic

TILE = 8                      # T: vectors of 8 floats on every x86 level (two SSE registers on v2)
PARALLEL_MIN_ELEMENTS = 1 << 16


def match_transpose(func: PrimFunc) -> tuple[te.Tensor, list[int]] | None:
    """(output, perm) if ``func`` is exactly out[i...] = x[j...] for a permutation of the
    output's loop indices, float32, where the input's last axis is not the output's last one
    and both span at least a tile (or are known only at run time: a KV cache's T); perm[d] = the
    output axis that indexes x's axis d."""
    if len(func.inputs) != 1 or len(func.outputs) != 1:
        return None
    x, out = func.inputs[0], func.outputs[0]
    body = out.body
    if x.dtype != "float32" or out.dtype != "float32" or not isinstance(body, te.Read) \
            or body.tensor.uid != x.uid or len(x.shape) != len(out.shape) or len(x.shape) < 2:
        return None
    axis_of = {id(a): k for k, a in enumerate(out.axes)}
    perm = [axis_of.get(id(i)) for i in body.indices]
    if None in perm or sorted(perm) != list(range(len(out.shape))):
        return None
    if not all(_same_size(x.shape[d], out.shape[perm[d]]) for d in range(len(perm))):
        return None
    a_axis, b_axis = perm[-1], len(out.shape) - 1
    if a_axis == b_axis or any(isinstance(out.shape[k], int) and out.shape[k] < TILE
                               for k in (a_axis, b_axis)):
        return None
    return out, perm


def _interleave(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, half: int) -> ir.Value:
    """Lanes [x0, y0, x1, y1, ...] of the first (half=0) or second (half=1) halves of x, y."""
    n = TILE // 2
    mask = [half * n + i // 2 + (TILE if i % 2 else 0) for i in range(TILE)]
    return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, TILE), mask))


def transpose_tile(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The T x T transpose of ``rows`` (T vectors of T lanes): log2(T) perfect-shuffle stages."""
    v = rows
    for _ in range(TILE.bit_length() - 1):
        w: list[ir.Value] = []
        for k in range(TILE // 2):
            w += [_interleave(b, v[k], v[k + TILE // 2], 0),
                  _interleave(b, v[k], v[k + TILE // 2], 1)]
        v = w
    return v


class TransposeEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor,
                 perm: list[int], vl: int, size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.out, self.perm = out, perm
        self.vty = ir.VectorType(F32, TILE)

    def emit(self) -> KernelInfo:
        x_t = self.func.inputs[0]
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=False)
        x_ptr, out_ptr = body_fn.args[:2]
        task, ntasks = body_fn.args[len(ptr_types):]
        b = self.builder
        shape = self.out.shape
        rank = len(shape)
        a_axis, b_axis = self.perm[-1], rank - 1
        others = [k for k in range(rank) if k not in (a_axis, b_axis)]
        if self.symbolic:   # run-time extents: split over threads on the static dims' work
            static = [n for n in shape if isinstance(n, int)]
            outer_dims = [shape[k] for k in others]
            parallel = bool(others) and not all(n == 1 for n in outer_dims) and int(
                np.prod(static, dtype=np.int64)) >= PARALLEL_MIN_ELEMENTS // 8
            outer = self._dim_value(product(outer_dims))
        else:
            n_outer = int(np.prod([shape[k] for k in others], dtype=np.int64))
            parallel = n_outer > 1 and int(np.prod(shape, dtype=np.int64)) >= PARALLEL_MIN_ELEMENTS
            outer = const_i64(n_outer)
        lo, hi = const_i64(0), outer
        if parallel:
            lo = b.sdiv(b.mul(task, hi), ntasks)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), outer), ntasks)
        with for_range(b, lo, hi, "outer") as flat:
            idx: list[ir.Value | None] = [None] * rank
            rest = flat
            for k in reversed(others):
                idx[k] = b.srem(rest, self._dim_value(shape[k]))
                rest = b.sdiv(rest, self._dim_value(shape[k]))
            self._plane(x_ptr, out_ptr, idx, a_axis, b_axis)
        b.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        return KernelInfo(self.symbol, 1, 1, 0, parallel, symbolic=self.symbolic)

    def _offsets(self, idx: list[ir.Value]) -> tuple[ir.Value, ir.Value]:
        """(offset in x, offset in out) of the element at output indices ``idx``."""
        x_t = self.func.inputs[0]
        return (self._offset(x_t, [idx[self.perm[d]] for d in range(len(self.perm))]),
                self._offset(self.out, idx))

    def _plane(self, x_ptr, out_ptr, idx: list, a_axis: int, b_axis: int) -> None:
        """Every (a, b) of one plane of the output (the other indices fixed in ``idx``)."""
        b = self.builder
        na, nb = self.out.shape[a_axis], self.out.shape[b_axis]
        fa, fb = self._tiled(na), self._tiled(nb)
        vptr = self.vty.as_pointer()
        with for_range(b, const_i64(0), self._tiles(na), "ta") as ta:
            a0 = b.mul(ta, const_i64(TILE))
            with for_range(b, const_i64(0), self._tiles(nb), "tb") as tb:
                b0 = b.mul(tb, const_i64(TILE))
                rows = []
                for t in range(TILE):    # x's last axis runs along a: a vector per b
                    idx[a_axis], idx[b_axis] = a0, b.add(b0, const_i64(t))
                    xo, _ = self._offsets(idx)
                    rows.append(b.load(b.bitcast(b.gep(x_ptr, [xo], inbounds=True), vptr),
                                       align=4))
                for j, vec in enumerate(transpose_tile(b, rows)):
                    idx[a_axis], idx[b_axis] = b.add(a0, const_i64(j)), b0
                    _, oo = self._offsets(idx)
                    b.store(vec, b.bitcast(b.gep(out_ptr, [oo], inbounds=True), vptr), align=4)
        # edges: b past the last whole tile for the tiled a, then every b of the last rows of a
        self._copy(x_ptr, out_ptr, idx, a_axis, b_axis, (0, fa), (fb, nb))
        self._copy(x_ptr, out_ptr, idx, a_axis, b_axis, (fa, na), (0, nb))

    def _copy(self, x_ptr, out_ptr, idx: list, a_axis: int, b_axis: int, a_range, b_range
              ) -> None:
        if all(isinstance(v, int) for v in a_range + b_range) and (
                a_range[0] >= a_range[1] or b_range[0] >= b_range[1]):
            return
        b = self.builder
        with for_range(b, self._end(a_range[0]), self._end(a_range[1]), "ea") as a:
            with for_range(b, self._end(b_range[0]), self._end(b_range[1]), "eb") as bi:
                idx[a_axis], idx[b_axis] = a, bi
                xo, oo = self._offsets(idx)
                b.store(b.load(b.gep(x_ptr, [xo], inbounds=True)),
                        b.gep(out_ptr, [oo], inbounds=True))


    def _tiles(self, n: object) -> ir.Value:
        """Whole tiles along an extent (a constant, or counted at run time)."""
        if isinstance(n, int):
            return const_i64(n // TILE)
        return self.builder.sdiv(self._dim_value(n), const_i64(TILE))

    def _tiled(self, n: object) -> int | ir.Value:
        """The elements of ``n`` the whole tiles cover."""
        if isinstance(n, int):
            return n // TILE * TILE
        return self.builder.mul(self._tiles(n), const_i64(TILE))

    def _end(self, v: object) -> ir.Value:
        return v if isinstance(v, ir.Value) else self._dim_value(v)


def emit_transpose(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                   size_vars: tuple[str, ...] = ()) -> KernelInfo | None:
    """The tiled transpose, also with run-time extents (``size_vars``: a KV cache's T)."""
    if is_symbolic(func) and not size_vars:
        return None
    match = match_transpose(func)
    if match is None:
        return None
    return TransposeEmitter(module, func, symbol, *match, vl, size_vars).emit()
