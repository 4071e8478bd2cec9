"""A row kernel for ``nn.normalize`` (LayerNorm, InstanceNorm, GroupNorm; ``ops/norm.py``):
float32, static or run-time extents.

x is seen as [rows, n] (n = the product of the normalized trailing axes). Per row, three passes a
vector at a time (the last vector masked), the row staying in cache after the first:

1. the sum of x - x0 (x0 the row's first element), so mean = x0 + shift, shift = sum / n: the
   partial sums stay near the row's spread instead of its magnitude (values around 1e3 with a
   spread of 1 lose three digits to a plain float32 sum), and x - mean is computed as
   (x - x0) - shift, exact to float32 where a float32 mean near 1e3 is off by up to 3e-5;
2. the sum of (x - mean)^2, so the variance cannot cancel as E[x^2] - mean^2 does (ONNX
   Runtime's InstanceNormalization does: a one-pixel row comes out bias + 1e-5, not bias);
3. y = (x - mean) * inv_std, times the scale plus the bias, written once.

The scale and bias are either per element of the row (LayerNorm: vectors read beside x), or
constant over segments of it: K segments of S = n / K elements, parameter (row % G) * K + k
(InstanceNorm: G = C, K = 1; GroupNorm-21 over [N, G, C/G, H, W]: K = C/G; GroupNorm-18: K = 1).
A segment writes (x - mean) * a + c with a = inv_std * scale, c = bias, one multiply-add.

An elementwise epilogue that fusion spliced in (style transfer's ReLU after each InstanceNorm, a
residual add, SiLU) is evaluated on the vector before its store: arithmetic, compares, selects
and the lane-wise math of ``vecmath_lanes``, reading other tensors of x's shape at the same
element or one-element tensors; any other epilogue leaves the function to the generic loop nest.

Rows split over threads (as the generic kernels, when there is work enough). The decomposition
this replaces ran five kernels, each a pass over the tensor: mean, subtract, square and mean,
add/sqrt/divide, multiply (then the affine part).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import product
from .helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelEmitter, KernelInfo
from .vecmath_lanes import VECTOR_MATH, vector_math
from .threads import DEFAULTS, SplitThresholds

_VECTOR_BINARY = ("add", "sub", "mul", "div", "max", "min")
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


@dataclass(frozen=True)
class NormMatch:
    x: te.Tensor
    out: te.Tensor
    axis: int
    eps: float
    scale: te.Tensor | None
    bias: te.Tensor | None
    groups: int         # G: parameters repeat every G rows
    segments: int       # K: parameter blocks per row (n: per element)
    per_element: bool   # K == n (S == 1): vectors of parameters
    result: te.Tensor   # the normalized stage (``out`` itself when nothing is fused after it)
    extras: tuple[te.Tensor, ...]   # the fused epilogue's other inputs
    n: object           # the row length (an int or a run-time size)
    rows: object        # the number of rows


def _param_layout(x: te.Tensor, p: te.Tensor, axis: int) -> tuple[int, int] | None:
    """(G, K) of parameter ``p`` over ``x`` (see the module docstring), or None when its
    broadcast is not of that form."""
    rank = x.ndim
    shape = (1,) * (rank - p.ndim) + tuple(p.shape)
    lead, trail = shape[:axis], shape[axis:]
    first = next((d for d, n in enumerate(lead) if n != 1), len(lead))
    if any(not isinstance(n, int) or n != x.shape[d] for d, n in enumerate(lead[first:], first)):
        return None
    last = max((d for d, n in enumerate(trail) if n != 1), default=-1) + 1
    if any(not isinstance(n, int) or n != x.shape[axis + d] for d, n in enumerate(trail[:last])):
        return None
    return int(product(lead[first:])), int(product(trail[:last]))


def _identity(r: te.Read, stage: te.Tensor) -> bool:
    return len(r.indices) == len(stage.axes) and all(i is a for i, a in
                                                     zip(r.indices, stage.axes))


def _epilogue_ok(out: te.Tensor, result: te.Tensor, x: te.Tensor,
                 extras: tuple[te.Tensor, ...]) -> bool:
    """``out`` (and the stages it reads) is an elementwise function, evaluable a vector at a
    time, of the normalized ``result`` and of ``extras`` read at the same element (same shape
    as x) or being one element."""
    extra_ids = {t.uid for t in extras}
    seen: set[int] = set()

    def stage_ok(stage: te.Tensor) -> bool:
        if stage.uid in seen:
            return True
        seen.add(stage.uid)
        if tuple(stage.shape) != tuple(x.shape) or stage.dtype != "float32":
            return False
        stack = [stage.body]
        while stack:
            node = stack.pop()
            if isinstance(node, te.Read):
                t = node.tensor
                if t.uid in extra_ids:
                    if t.dtype != "float32":
                        return False
                    if product(t.shape) == 1:
                        continue
                    if tuple(t.shape) != tuple(x.shape) or not _identity(node, stage):
                        return False
                    continue
                if not _identity(node, stage):
                    return False
                if t is result:
                    continue
                if t.is_placeholder or not stage_ok(t):
                    return False
                continue
            if isinstance(node, te.Binary):
                if node.dtype != "float32" or node.op not in _VECTOR_BINARY:
                    return False
            elif isinstance(node, te.Compare):
                if node.a.dtype != "float32" or node.op not in _COMPARE:
                    return False
            elif isinstance(node, te.MathCall):
                if node.dtype != "float32" or node.name not in VECTOR_MATH:
                    return False
            elif isinstance(node, te.Const):
                if node.dtype != "float32" or not isinstance(node.value, (int, float)):
                    return False
                continue
            elif not isinstance(node, te.Select):
                return False
            stack.extend(te.children(node))
        return True

    return stage_ok(out)


def match_normalize(func: PrimFunc) -> NormMatch | None:
    """The normalization ``ops/norm.py`` legalized, if ``func`` is that (float32), possibly
    followed by an elementwise epilogue that fusion spliced in (a ReLU, a residual add)."""
    if len(func.outputs) != 1:
        return None
    out = func.outputs[0]
    tag = mean_stage = None
    stages = [st for st in te.stages(func.outputs) if not st.is_placeholder]
    for stage in stages:
        stack = [stage.body]
        while stack and tag is None:
            node = stack.pop()
            if isinstance(node, te.Reduce):
                t = reduction_tag(node)
                if t is not None and t.kind == "normalize":
                    tag, mean_stage = t, stage
            stack.extend(te.children(node))
        if tag is not None:
            break
    if tag is None:
        return None
    operands = tag.operands
    k = len(operands)
    if [t.uid for t in func.inputs[:k]] != [t.uid for t in operands]:
        return None
    x = operands[0]
    if any(t.dtype != "float32" for t in operands) or out.dtype != "float32" \
            or tuple(out.shape) != tuple(x.shape) or x.ndim == 0:
        return None
    # the normalized stage: x's shape, reads the mean
    results = [st for st in stages if tuple(st.shape) == tuple(x.shape)
               and any(r.tensor is mean_stage for r in te.reads(st.body))]
    if len(results) == 2:   # one-element rows: the inverse deviation has x's shape too
        results = [st for st in results
                   if any(r.tensor is other for other in results for r in te.reads(st.body))]
    if len(results) != 1:
        return None
    result = results[0]
    extras = tuple(func.inputs[k:])
    if out is not result and not _epilogue_ok(out, result, x, extras):
        return None
    axis = int(tag.attrs["start"]) % x.ndim
    params = list(operands[1:])
    scale = params.pop(0) if tag.attrs.get("scale") else None
    bias = params.pop(0) if tag.attrs.get("bias") else None
    layouts = {_param_layout(x, p, axis) for p in (scale, bias) if p is not None}
    if None in layouts or len(layouts) > 1:
        return None
    groups, segments = layouts.pop() if layouts else (1, 1)
    row_groups = int(tag.attrs.get("groups", 1))
    n = product(x.shape[axis:])
    rows = product(x.shape[:axis])
    if row_groups > 1:
        # a row per group of x.shape[axis]: the parameters (per channel) split the same way,
        # row r reading the (r % row_groups)-th block
        if scale is None and bias is None:
            segments = row_groups
        if groups != 1 or segments % row_groups:
            return None
        groups, segments = row_groups, segments // row_groups
        n = (x.shape[axis] // row_groups) * product(x.shape[axis + 1:])
        rows = rows * row_groups
    per_element = segments > 1 and isinstance(n, int) and segments == n
    return NormMatch(x, out, axis, float(tag.attrs["eps"]), scale, bias, groups, segments,
                     per_element, result, extras, n, rows)


class NormEmitter(KernelEmitter):
    UNROLL = 4     # vectors per iteration of a pass (independent accumulators)

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: NormMatch,
                 vl: int, size_vars: tuple[str, ...] = (),
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, size_vars, options)
        self.m, self.vl = match, vl
        self.vty = ir.VectorType(F32, vl)
        self.mty = ir.VectorType(I1, vl)

    # ---- vector helpers ----------------------------------------------------------------------

    def _splat(self, value: float | ir.Value) -> ir.Value:
        if not isinstance(value, ir.Value):
            return ir.Constant(self.vty, [float(value)] * self.vl)
        b = self.builder
        v = b.insert_element(ir.Constant(self.vty, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _vptr(self, base: ir.Value, offset: ir.Value) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(base, [offset], inbounds=True), self.vty.as_pointer())

    def _load(self, base: ir.Value, offset: ir.Value, mask: ir.Value | None) -> ir.Value:
        b = self.builder
        if mask is None:
            return b.load(self._vptr(base, offset), align=4)
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [self.vty.as_pointer(), I32, self.mty, self.vty])
        return b.call(fn, [self._vptr(base, offset), ir.Constant(I32, 4), mask, self._splat(0.0)])

    def _store(self, value: ir.Value, base: ir.Value, offset: ir.Value,
               mask: ir.Value | None) -> None:
        b = self.builder
        if mask is None:
            b.store(value, self._vptr(base, offset), align=4)
            return
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}f32.p0", ir.VoidType(),
                       [self.vty, self.vty.as_pointer(), I32, self.mty])
        b.call(fn, [value, self._vptr(base, offset), ir.Constant(I32, 4), mask])

    def _fma(self, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
        fn = intrinsic(self.module, f"llvm.fmuladd.v{self.vl}f32", self.vty, [self.vty] * 3)
        return self.builder.call(fn, [a, x, c])

    def _hsum(self, v: ir.Value) -> ir.Value:
        b = self.builder
        width = self.vl
        while width > 1:
            width //= 2
            upper = b.shuffle_vector(v, ir.Constant(self.vty, None), ir.Constant(
                ir.VectorType(I32, self.vl), [width + i if i < width else i
                                              for i in range(self.vl)]))
            v = b.fadd(v, upper)
        return b.extract_element(v, ir.Constant(I32, 0))

    def _tail_mask(self, count: ir.Value) -> ir.Value:
        """Lanes i < count (count < vl)."""
        b = self.builder
        ity = ir.VectorType(I64, self.vl)
        c = b.insert_element(ir.Constant(ity, None), count, ir.Constant(I32, 0))
        c = b.shuffle_vector(c, ir.Constant(ity, None),
                             ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))
        return b.icmp_signed("<", ir.Constant(ity, list(range(self.vl))), c)

    def _pass(self, count: ir.Value, step, reduce: bool) -> ir.Value | None:
        """``step(offset, mask, acc)`` over the vectors of [0, count): blocks of UNROLL vectors
        (UNROLL accumulators when ``reduce``), then single vectors, then the masked rest. Returns
        the accumulators' sum (a vector) when ``reduce``."""
        b = self.builder
        u, vl = self.UNROLL, self.vl
        zero = self._splat(0.0)
        accs = []
        if reduce:
            for i in range(u):
                slot = alloca_once(b, self.vty, name=f"acc{i}")
                b.store(zero, slot)
                accs.append(slot)
        blocks = b.sdiv(count, const_i64(u * vl))
        with for_range(b, const_i64(0), blocks, "blk") as blk:
            base = b.mul(blk, const_i64(u * vl), flags=("nsw",))
            for i in range(u):
                off = b.add(base, const_i64(i * vl), flags=("nsw",))
                if reduce:
                    b.store(step(off, None, b.load(accs[i])), accs[i])
                else:
                    step(off, None, None)
        done = b.mul(blocks, const_i64(u * vl), flags=("nsw",))
        vectors = b.sdiv(b.sub(count, done), const_i64(vl))
        with for_range(b, const_i64(0), vectors, "vec") as v:
            off = b.add(done, b.mul(v, const_i64(vl), flags=("nsw",)), flags=("nsw",))
            if reduce:
                b.store(step(off, None, b.load(accs[0])), accs[0])
            else:
                step(off, None, None)
        done = b.add(done, b.mul(vectors, const_i64(vl), flags=("nsw",)), flags=("nsw",))
        rest = b.sub(count, done)
        # the masked rest: the mask is all false when rest is 0 (nothing loaded or stored)
        mask = self._tail_mask(rest)
        if reduce:
            value = step(done, mask, zero)
            b.store(b.fadd(b.load(accs[0]), b.select(mask, value, zero)), accs[0])
            total = b.load(accs[0])
            for slot in accs[1:]:
                total = b.fadd(total, b.load(slot))
            return total
        step(done, mask, None)
        return None

    # ---- the kernel --------------------------------------------------------------------------

    def emit(self) -> KernelInfo:
        m = self.m
        params = list(self.func.inputs)
        body_fn, ptr_types = self._begin_body(params + [m.out], workspace=False)
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        n_dim, rows_dim = m.n, m.rows
        n = self._dim_value(n_dim)
        rows = self._dim_value(rows_dim)
        static = isinstance(n_dim, int) and isinstance(rows_dim, int)
        if static:
            parallel = rows_dim > 1 and rows_dim * n_dim >= self.options.parallel_min_outputs
        else:
            parallel = True   # decided at run time below (a symbolic kernel's rows vary)
        lo, hi = const_i64(0), rows
        if parallel:
            split_lo = b.sdiv(b.mul(task, rows), ntasks)
            split_hi = b.sdiv(b.mul(b.add(task, const_i64(1)), rows), ntasks)
            if static:
                lo, hi = split_lo, split_hi
            else:
                # too little work to share: task 0 takes every row, the others none
                small = b.icmp_signed("<", b.mul(rows, n),
                                      const_i64(self.options.parallel_min_outputs))
                first = b.icmp_signed("==", task, const_i64(0))
                lo = b.select(small, const_i64(0), split_lo)
                hi = b.select(small, b.select(first, rows, const_i64(0)), split_hi)
        x_ptr = self.buffers[m.x.uid]
        out_ptr = self.buffers[m.out.uid]
        scale_ptr = self.buffers[m.scale.uid] if m.scale is not None else None
        bias_ptr = self.buffers[m.bias.uid] if m.bias is not None else None
        inv_n = b.fdiv(ir.Constant(F32, 1.0), b.sitofp(n, F32))
        with for_range(b, lo, hi, "row") as row:
            start = b.mul(row, n, flags=("nsw",))
            xr = b.gep(x_ptr, [start], inbounds=True)
            yr = b.gep(out_ptr, [start], inbounds=True)
            # the epilogue's inputs: this row of each x-shaped one, a splat of each scalar
            self.extra_rows = {}
            for t in m.extras:
                ptr = self.buffers[t.uid]
                if product(t.shape) == 1:
                    self.extra_rows[t.uid] = ("scalar", self._splat(b.load(ptr)))
                else:
                    self.extra_rows[t.uid] = ("row", b.gep(ptr, [start], inbounds=True))
            self._row(xr, yr, n, inv_n, row, scale_ptr, bias_ptr)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(params), 1, 0, parallel, symbolic=self.symbolic)

    def _row(self, xr, yr, n, inv_n, row, scale_ptr, bias_ptr) -> None:
        b, m = self.builder, self.m
        x0 = self._splat(b.load(xr))
        shifted = self._pass(n, lambda off, mask, acc: b.fadd(acc, b.fsub(
            self._load(xr, off, mask), x0)), reduce=True)
        # mean = x0 + shift; x - mean is computed as (x - x0) - shift: x - x0 is exact for the
        # row's values near x0, and the float32 mean itself (1e3 to within 6e-5) never is
        shift = self._splat(b.fmul(self._hsum(shifted), inv_n))

        def centered(v):
            return b.fsub(b.fsub(v, x0), shift)

        def sq(off, mask, acc):
            d = centered(self._load(xr, off, mask))
            return self._fma(d, d, acc)

        var = b.fmul(self._hsum(self._pass(n, sq, reduce=True)), inv_n)
        sqrt = intrinsic(self.module, "llvm.sqrt.f32", F32, [F32])
        inv_s = b.fdiv(ir.Constant(F32, 1.0),
                       b.call(sqrt, [b.fadd(var, ir.Constant(F32, m.eps))]))
        inv = self._splat(inv_s)
        g0 = None
        if scale_ptr is not None or bias_ptr is not None:
            group = b.srem(row, const_i64(m.groups)) if m.groups > 1 else const_i64(0)
            g0 = b.mul(group, const_i64(m.segments), flags=("nsw",))
        zero = self._splat(0.0)
        if m.per_element:
            sp = b.gep(scale_ptr, [g0], inbounds=True) if scale_ptr is not None else None
            bp = b.gep(bias_ptr, [g0], inbounds=True) if bias_ptr is not None else None

            def write(off, mask, acc):
                y = b.fmul(centered(self._load(xr, off, mask)), inv)
                if sp is not None and bp is not None:
                    y = self._fma(y, self._load(sp, off, mask), self._load(bp, off, mask))
                elif sp is not None:
                    y = b.fmul(y, self._load(sp, off, mask))
                else:
                    y = b.fadd(y, self._load(bp, off, mask))
                self._store(self._epilogue(y, off, mask), yr, off, mask)

            self._pass(n, write, reduce=False)
            return

        def segment(base, count, a, c):
            def write(off, mask, acc):
                at = b.add(base, off)
                y = self._fma(centered(self._load(xr, at, mask)), a, c)
                self._store(self._epilogue(y, at, mask), yr, at, mask)

            self._pass(count, write, reduce=False)

        def params_at(k):
            a, c = inv_s, None
            if scale_ptr is not None:
                a = b.fmul(a, b.load(b.gep(scale_ptr, [b.add(g0, k)], inbounds=True)))
            if bias_ptr is not None:
                c = b.load(b.gep(bias_ptr, [b.add(g0, k)], inbounds=True))
            return self._splat(a), (self._splat(c) if c is not None else zero)

        if m.segments == 1:
            a, c = params_at(const_i64(0)) if g0 is not None else (inv, zero)
            segment(const_i64(0), n, a, c)
            return
        seg = b.sdiv(n, const_i64(m.segments))
        with for_range(b, const_i64(0), const_i64(m.segments), "seg") as k:
            a, c = params_at(k)
            segment(b.mul(k, seg, flags=("nsw",)), seg, a, c)


    # ---- the fused epilogue -------------------------------------------------------------------

    def _epilogue(self, y: ir.Value, off: ir.Value, mask: ir.Value | None) -> ir.Value:
        """The output vector at row offset ``off``: the fused epilogue of the normalized ``y``
        (``y`` itself when nothing is fused)."""
        m = self.m
        if m.out is m.result:
            return y
        memo: dict[int, ir.Value] = {m.result.uid: y}
        b = self.builder

        def stage(t: te.Tensor) -> ir.Value:
            if t.uid not in memo:
                memo[t.uid] = value(t.body)
            return memo[t.uid]

        def value(e: te.Expr) -> ir.Value:
            if isinstance(e, te.Read):
                kind = self.extra_rows.get(e.tensor.uid)
                if kind is None:
                    return stage(e.tensor)
                if kind[0] == "scalar":
                    return kind[1]
                return self._load(kind[1], off, mask)
            if isinstance(e, te.Const):
                return self._splat(float(e.value))
            if isinstance(e, te.Binary):
                x, z = value(e.a), value(e.b)
                if e.op in ("max", "min"):
                    if isinstance(e.b, te.Const) or isinstance(e.a, te.Const):
                        # against a constant (relu, clip): one maxps, NaN passes through
                        var, bound = (x, z) if isinstance(e.b, te.Const) else (z, x)
                        less = b.fcmp_ordered("<" if e.op == "max" else ">", var, bound)
                        return b.select(less, bound, var)
                    name = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.v{self.vl}f32"
                    return b.call(intrinsic(self.module, name, self.vty, [self.vty] * 2),
                                  [x, z])
                return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul,
                        "div": b.fdiv}[e.op](x, z)
            if isinstance(e, te.Compare):
                x, z = value(e.a), value(e.b)
                sym = _COMPARE[e.op]
                return b.fcmp_unordered(sym, x, z) if e.op == "ne" else \
                    b.fcmp_ordered(sym, x, z)
            if isinstance(e, te.Select):
                return b.select(value(e.cond), value(e.a), value(e.b))
            if isinstance(e, te.MathCall):
                return vector_math(b, e.name, value(e.arg))
            raise AssertionError(f"unmatched epilogue node {type(e).__name__}")

        return stage(m.out)


def emit_normalize(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                   size_vars: tuple[str, ...] = (), options: SplitThresholds = DEFAULTS
                   ) -> KernelInfo | None:
    match = match_normalize(func)
    if match is None:
        return None
    return NormEmitter(module, func, symbol, match, vl, size_vars, options).emit()


def emit_symbolic_normalize(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                            size_vars: tuple[str, ...],
                            options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """The same kernel with run-time rows and row length (read from the size variables)."""
    return emit_normalize(module, func, symbol, vl, size_vars, options)
