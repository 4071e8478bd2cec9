"""Lowering of a primitive function (tensor expressions) to one LLVM kernel.

Every kernel has the same C signature, so the runtime calls all of them the same way::

    void kernel(void **args, int64_t task, int64_t ntasks);

``args`` holds the input pointers, then the output pointers, then (when the kernel needs scratch
memory) a workspace pointer. ``task``/``ntasks`` split the outermost parallel loop, so a runtime
can run one kernel on several threads; a kernel with ``parallel == False`` must get ntasks == 1.

How stages become loops:
- a stage without a reduction that is not an output is *inlined* into its readers;
- a reduction stage read once by an output at that output's own indices becomes the output's
  accumulator (``matmul`` followed by ``+ bias`` and ``relu`` is one loop nest);
- any other reduction stage is *materialized* into the workspace before the outputs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.sym import SymExpr, product, shape_vars, to_record
from . import vecmath
from .helpers import (ARITH_FLAGS, F32, F64, I8, I64, LLVM_TYPES, REDUCE_FLAGS, STORAGE_TYPES,
                      VOID, alloca_once, const_i64, for_range, intrinsic, load_converted, round_to,
                      store_converted, type_suffix)
from .reduce_flat import whole_min_max
from .threads import DEFAULTS, SplitThresholds

WORKSPACE_ALIGN = 64


# Generic kernels with fewer output elements than this run on one thread.


@dataclass(frozen=True)
class KernelInfo:
    symbol: str
    num_inputs: int
    num_outputs: int
    workspace_bytes: int
    parallel: bool
    # Symbolic kernels (shapes with size variables) take one more pointer after the workspace:
    # the int64 values of the module's size variables; their workspace size is an expression.
    symbolic: bool = False
    workspace_expr: object = None
    # Which kernel computes it, in words (the rule table's row, and the emitter's design where
    # it has several: "Winograd F(2x2, 3x3)", a register tile); `mlcpack inspect` shows it.
    choice: str | None = None


class LoweringError(Exception):
    """A primitive function uses a construct the code generator cannot lower."""


def _has_reduce(e: te.Expr) -> bool:
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, te.Reduce):
            return True
        stack.extend(te.children(node))
    return False


def _inline_reads(e: te.Expr, inline: dict[int, te.Tensor],
                  memo: dict[tuple, te.Expr] | None = None) -> te.Expr:
    """Substitute reads of inlined stages by their bodies (recursively). Reads of one stage at
    the same index expressions share one substituted body (``memo``), so an expression that
    reads a stage twice (a diamond such as ``y * sigmoid(y)``) stays a DAG, not a tree that
    doubles with every diamond."""
    memo = {} if memo is None else memo

    def fn(n: te.Expr) -> te.Expr | None:
        if isinstance(n, te.Read) and n.tensor.uid in inline:
            key = (n.tensor.uid, tuple(id(i) for i in n.indices))
            if key not in memo:
                stage = inline[n.tensor.uid]
                body = te.substitute(stage.body, dict(zip(stage.axes, n.indices)))
                memo[key] = _inline_reads(body, inline, memo)
            return memo[key]
        return None

    return te.rewrite(e, fn)


def _plan_stages(func: PrimFunc) -> tuple[list[tuple[te.Tensor, te.Expr]], list[tuple[te.Tensor,
                                                                                       te.Expr]]]:
    """Decide which stages are materialized; return (materialized, outputs), each a list of
    (stage, body with inlined reads)."""
    outputs = {t.uid for t in func.outputs}
    all_stages = [s for s in te.stages(func.outputs) if s.body is not None]
    inline = {s.uid: s for s in all_stages if s.uid not in outputs and not _has_reduce(s.body)}
    memo: dict[tuple, te.Expr] = {}
    bodies = {s.uid: _inline_reads(s.body, inline, memo) for s in all_stages
              if s.uid not in inline}

    reducers = {s.uid: s for s in all_stages if s.uid not in inline and s.uid not in outputs}
    read_count = Counter(r.tensor.uid for b in bodies.values() for r in te.reads(b))
    fused: set[int] = set()
    for out in func.outputs:
        body = bodies[out.uid]
        # A reduction read only by this output, every time at its own indices (once, or
        # several times by an epilogue that reads it twice, such as x * sigmoid(x)).
        reads_here = Counter(r.tensor.uid for r in te.reads(body))
        for r in te.reads(body):
            red = reducers.get(r.tensor.uid)
            if (red is not None and read_count[red.uid] == reads_here[red.uid]
                    and red.shape == out.shape
                    and all(i is a for i, a in zip(r.indices, out.axes))):
                fused.add(red.uid)
        fused -= {r.tensor.uid for r in te.reads(body)
                  if not all(i is a for i, a in zip(r.indices, out.axes))}
        if fused:
            spliced: dict[int, te.Expr] = {}   # one shared expression per spliced reduction

            def splice(n: te.Expr, fused: set[int] = fused,
                       spliced: dict[int, te.Expr] = spliced) -> te.Expr | None:
                if isinstance(n, te.Read) and n.tensor.uid in fused:
                    if n.tensor.uid not in spliced:
                        red = reducers[n.tensor.uid]
                        spliced[n.tensor.uid] = te.substitute(bodies[red.uid],
                                                              dict(zip(red.axes, n.indices)))
                    return spliced[n.tensor.uid]
                return None
            bodies[out.uid] = te.rewrite(body, splice)
    materialized = [(s, bodies[s.uid]) for s in all_stages
                    if s.uid in reducers and s.uid not in fused]
    return materialized, [(t, bodies[t.uid]) for t in func.outputs]


# Loops a select on an axis is split into, at most (a concatenation of this many inputs).
MAX_RANGES = 16


def _ranges(e: te.Expr, axis: te.IndexVar, lo: int, hi: int
            ) -> list[tuple[int, int, te.Expr]]:
    """Split ``[lo, hi)`` of ``axis`` where ``e`` is a chain of selects on ``axis`` compared
    with integer constants (``if_then_else(i >= start, x_k[i - start], earlier)``, as concat
    is legalized): the ranges with the branch each one takes, in order."""
    if not (isinstance(e, te.Select) and isinstance(e.cond, te.Compare)
            and e.cond.a is axis and isinstance(e.cond.b, te.Const)
            and not isinstance(e.cond.b.value, SymExpr) and e.cond.op in ("ge", "gt", "lt", "le")):
        return [(lo, hi, e)]
    c = int(e.cond.b.value) + (1 if e.cond.op in ("gt", "le") else 0)
    c = min(max(c, lo), hi)
    below, above = (e.b, e.a) if e.cond.op in ("ge", "gt") else (e.a, e.b)
    out = [r for r in _ranges(below, axis, lo, c) + _ranges(above, axis, c, hi) if r[0] < r[1]]
    return out if len(out) <= MAX_RANGES else [(lo, hi, e)]


def _stage_work(stage: te.Tensor, body: te.Expr) -> int:
    """A static stage's outputs times the elements its largest reduction reads per output (1
    without one): the work ``emit`` weighs before splitting the stage over threads."""
    per_output = max((int(np.prod([a.extent for a in r.axes], dtype=np.int64))
                      for r in te.walk(body) if isinstance(r, te.Reduce)), default=1)
    return int(np.prod(stage.shape, dtype=np.int64)) * max(1, per_output)


def _rows_split_together(materialized: list[tuple[te.Tensor, te.Expr]],
                         outputs: list[tuple[te.Tensor, te.Expr]]) -> bool:
    """Whether splitting every stage on the outputs' first dim of extent > 1 keeps each task to
    its own rows: all stages agree on the dims up to it, and every read of a materialized stage
    indexes that dim with the reading stage's own loop variable."""
    first = outputs[0][0]
    d = next((i for i, n in enumerate(first.shape) if not isinstance(n, int) or n > 1), None)
    if d is None:
        return False
    everything = materialized + outputs
    if any(len(st.shape) <= d or tuple(st.shape[:d + 1]) != tuple(first.shape[:d + 1])
           for st, _ in everything):
        return False
    mat = {st.uid for st, _ in materialized}
    return all(r.indices[d] is st.axes[d]
               for st, body in everything for r in te.reads(body) if r.tensor.uid in mat)


class KernelEmitter:
    """Emits one kernel into an LLVM module."""

    # _dim_value's values (by record), computed in the entry block of ``_dims_function``
    _dims_function: ir.Function | None = None
    _dims: dict[str, ir.Value] = {}

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str,
                 size_vars: tuple[str, ...] = (), options: SplitThresholds = DEFAULTS
                 ) -> None:
        self.module = module
        self.options = options   # read for the thresholds of splitting over threads
        self.func = func
        self.symbol = symbol
        self.buffers: dict[int, ir.Value] = {}
        self.size_vars = size_vars
        self.symbolic = is_symbolic(func)
        self.var_values: dict[str, ir.Value] = {}
        self._reduce_memo: dict[int, ir.Value] | None = None

    def emit(self) -> KernelInfo:
        func = self.func
        for t in func.inputs + func.outputs:
            if t.dtype not in LLVM_TYPES:
                raise LoweringError(f"{func.name}: dtype {t.dtype} is not supported")
        materialized, outputs = _plan_stages(func)
        offsets, workspace = [], 0
        for stage, _ in materialized:
            offsets.append(workspace)
            nbytes = product(stage.shape) * te.itemsize(stage.dtype)
            workspace += -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
        params = func.inputs + func.outputs
        body_fn, ptr_types = self._begin_body(params, bool(workspace))
        if self.symbolic:
            return self._emit_symbolic(body_fn, ptr_types, materialized, outputs, offsets,
                                       workspace)
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        if workspace:
            ws = body_fn.args[len(params)]
            for (stage, _), off in zip(materialized, offsets):
                ptr = b.gep(ws, [const_i64(off)], inbounds=True)
                self.buffers[stage.uid] = b.bitcast(ptr, STORAGE_TYPES[stage.dtype].as_pointer())
        # Split the output loop over threads only when there is work enough to share: a hand-off
        # costs well under a microsecond (runtime/vm.py), a kernel this small not much more.
        # Materialized stages (a softmax's row max and sum) split with the outputs when every
        # task only reads the rows it wrote itself.
        # A reduction's work is its outputs times the elements each one reads: a layer norm's
        # sums over 512 rows into 256 outputs (magika) ran on one thread, 72 us each.
        parallel = (not materialized or _rows_split_together(materialized, outputs)) and sum(
            _stage_work(stage, body) for stage, body in outputs
        ) >= self.options.parallel_min_outputs and any(n > 1 for n in outputs[0][0].shape)
        for stage, body in materialized:
            if parallel:
                self._emit_stage(stage, body, task, ntasks)
            else:
                self._emit_stage(stage, body, None, None)
        for stage, body in outputs:
            if parallel:
                self._emit_stage(stage, body, task, ntasks)
            else:
                self._emit_stage(stage, body, None, None)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(func.inputs), len(func.outputs), workspace, parallel)

    def _emit_symbolic(self, body_fn: ir.Function, ptr_types: list[ir.Type],
                       materialized: list, outputs: list, offsets: list, workspace: object
                       ) -> KernelInfo:
        """The rest of ``emit`` for a kernel whose extents are read at run time from the size
        variables' array (the last pointer). Splits over threads like a static kernel when its
        static dims alone have work enough."""
        b = self.builder
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        if workspace:
            ws = body_fn.args[len(self.func.inputs) + len(self.func.outputs)]
            for (stage, _), off in zip(materialized, offsets):
                ptr = b.gep(ws, [self._dim_value(off)], inbounds=True)
                self.buffers[stage.uid] = b.bitcast(ptr, STORAGE_TYPES[stage.dtype].as_pointer())
        static_work = sum(product(d for d in stage.shape if isinstance(d, int))
                          for stage, _ in outputs)
        parallel = (not materialized or _rows_split_together(materialized, outputs)) and \
            static_work >= self.options.parallel_min_outputs // 8
        for stage, body in materialized + outputs:
            self._emit_stage(stage, body, task if parallel else None,
                             ntasks if parallel else None)
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                          parallel, symbolic=True, workspace_expr=workspace or None)

    def _dim_value(self, d: object) -> ir.Value:
        """An extent, stride or offset as an i64: a constant, or computed from the size
        variables (floor division and remainder by positive constants), once per function, in
        its entry block (where the size variables are loaded), so that every use is dominated.
        A kernel asks for the same strides at every store (YOLOv8n: 5,800 asks; computed at
        each, they were 36 % of its module's instructions, which LLVM then merged again)."""
        if isinstance(d, int):
            return const_i64(d)
        rec = to_record(d)
        if isinstance(rec, str):
            return self.var_values[rec]
        b = self.builder
        if self._dims_function is not b.function:
            self._dims_function, self._dims = b.function, {}
        key = repr(rec)
        value = self._dims.get(key)
        if value is None:
            with b.goto_block(b.function.entry_basic_block):
                value = self._record_value(rec)
            self._dims[key] = value
        return value

    def _record_value(self, rec: object) -> ir.Value:
        b = self.builder
        if isinstance(rec, int):
            return const_i64(rec)
        if isinstance(rec, str):
            return self.var_values[rec]
        op, *args = rec  # type: ignore[misc]
        if op in ("+", "*"):
            vals = [self._record_value(a) for a in args]
            out = vals[0]
            for v in vals[1:]:
                out = b.add(out, v, flags=("nsw",)) if op == "+" else b.mul(out, v,
                                                                            flags=("nsw",))
            return out
        return self._floor_divmod(self._record_value(args[0]), const_i64(args[1]),
                                  "floordiv" if op == "//" else "mod")

    def _begin_body(self, params: list[te.Tensor], workspace: bool
                    ) -> tuple[ir.Function, list[ir.Type]]:
        """Start the kernel body: noalias pointers to ``params`` (then an i8* workspace), then
        task and ntasks. ``_emit_entry`` exports a wrapper that unpacks void** and calls it; the
        inliner turns noalias into alias scopes the vectorizer can use. Leaves ``self.builder``
        at the body's entry with the params' buffers bound; returns (body, pointer types)."""
        ptr_types = [STORAGE_TYPES[t.dtype].as_pointer() for t in params]
        if workspace:
            ptr_types.append(I8.as_pointer())
        if self.symbolic:
            ptr_types.append(I64.as_pointer())
        body_fn = ir.Function(self.module, ir.FunctionType(VOID, ptr_types + [I64, I64]),
                              name=f"{self.symbol}.body")
        body_fn.linkage = "internal"
        body_fn.attributes.add("alwaysinline")
        body_fn.attributes.add("nounwind")
        for i, arg in enumerate(body_fn.args[:len(ptr_types)]):
            arg.add_attribute("noalias")
            arg.name = params[i].name if i < len(params) else "workspace"
        self.builder = ir.IRBuilder(body_fn.append_basic_block("entry"))
        for t, arg in zip(params, body_fn.args):
            self.buffers[t.uid] = arg
        if self.symbolic:
            sizes = body_fn.args[len(ptr_types) - 1]
            sizes.name = "sizes"
            for name in sorted(symbolic_vars(self.func)):
                if name not in self.size_vars:
                    raise LoweringError(f"{self.func.name}: size variable {name} is not bound "
                                        "by the inputs of main")
                slot = self.builder.gep(sizes, [const_i64(self.size_vars.index(name))])
                self.var_values[name] = self.builder.load(slot, name=name)
        return body_fn, ptr_types

    def _emit_entry(self, body_fn: ir.Function, n_ptrs: int, ptr_types: list[ir.Type]) -> None:
        void_pp = I8.as_pointer().as_pointer()
        entry = ir.Function(self.module, ir.FunctionType(VOID, [void_pp, I64, I64]),
                            name=self.symbol)
        entry.attributes.add("nounwind")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        args, task, ntasks = entry.args
        ptrs = []
        for i in range(n_ptrs):
            raw = b.load(b.gep(args, [const_i64(i)], inbounds=True))
            ptrs.append(b.bitcast(raw, ptr_types[i]))
        b.call(body_fn, ptrs + [task, ntasks])
        b.ret_void()

    # ---- loop nests ---------------------------------------------------------------------------

    def _emit_stage(self, stage: te.Tensor, body: te.Expr, task: ir.Value | None,
                    ntasks: ir.Value | None) -> None:
        b = self.builder
        out_ptr = self.buffers[stage.uid]
        env: dict[int, ir.Value] = {}
        split = next((d for d, n in enumerate(stage.shape) if not isinstance(n, int) or n > 1),
                     None) if task is not None else None

        def nest(d: int, body: te.Expr) -> None:
            if d == len(stage.shape):
                # a reduction the body reads twice (y * sigmoid(y) after a generic sum) is
                # computed once per element: straight-line code, the first result dominates
                self._reduce_memo = {}
                value = self._value(body, env)
                self._reduce_memo = None
                self._store(out_ptr, stage, [env[id(a)] for a in stage.axes], value)
                return
            extent = self._dim_value(stage.shape[d])
            lo: ir.Value = const_i64(0)
            hi: ir.Value = extent
            if d == split:
                lo = b.sdiv(b.mul(task, extent), ntasks)
                hi = b.sdiv(b.mul(b.add(task, const_i64(1)), extent), ntasks)
            # A select on this axis against a constant (a concatenation) becomes one loop per
            # range, each reading only its own input: a copy LLVM vectorizes.
            if self.symbolic:   # bounds that may be size expressions: clamped at run time
                axis = stage.axes[d]
                for start, stop, piece, span in self._run_time_ranges(
                        body, axis, lo, hi, (0, stage.shape[d])):
                    piece = _unclamped(piece, axis, *span)
                    source = _contiguous_source(stage, d, piece, split)
                    if source is not None and source.tensor.uid in self.buffers:
                        # indices d.. of both alike: one run of elements per range
                        self._copy_run(stage, d, source, env, start, stop)
                        continue
                    with for_range(b, start, stop, axis.name) as idx:
                        env[id(axis)] = idx
                        nest(d + 1, piece)
                return
            ranges = (_ranges(body, stage.axes[d], 0, stage.shape[d])
                      if isinstance(stage.shape[d], int) else [(0, stage.shape[d], body)])
            for p_lo, p_hi, piece in ranges:
                start = lo if p_lo == 0 else self._bound(max, lo, p_lo, d == split)
                stop = hi if p_hi == stage.shape[d] else self._bound(min, hi, p_hi, d == split)
                with for_range(b, start, stop, stage.axes[d].name) as idx:
                    env[id(stage.axes[d])] = idx
                    nest(d + 1, piece)

        nest(0, body)

    def _run_time_ranges(self, e: te.Expr, axis: te.IndexVar, lo: ir.Value, hi: ir.Value,
                         span: tuple) -> list[tuple[ir.Value, ir.Value, te.Expr, tuple]]:
        """``_ranges`` for a symbolic kernel: the select chain's constants may be size
        expressions (a concatenation of inputs with run-time extents), so every split point
        is computed and clamped into [lo, hi) at run time. Each range also comes with the
        span of indices it lies in as size expressions (``span``: the whole axis's, then
        split at the constants), for ``_unclamped``."""
        if not (isinstance(e, te.Select) and isinstance(e.cond, te.Compare)
                and e.cond.a is axis and isinstance(e.cond.b, te.Const)
                and isinstance(e.cond.b.value, (int, SymExpr))
                and e.cond.op in ("ge", "gt", "lt", "le")):
            return [(lo, hi, e, span)]
        b = self.builder
        c_s = e.cond.b.value + (1 if e.cond.op in ("gt", "le") else 0)
        c = self._dim_value(c_s)
        c = b.select(b.icmp_signed("<", c, lo), lo, c)
        c = b.select(b.icmp_signed(">", c, hi), hi, c)
        below, above = (e.b, e.a) if e.cond.op in ("ge", "gt") else (e.a, e.b)
        out = self._run_time_ranges(below, axis, lo, c, (span[0], c_s)) + \
            self._run_time_ranges(above, axis, c, hi, (c_s, span[1]))
        return out if len(out) <= MAX_RANGES else [(lo, hi, e, span)]

    def _copy_run(self, stage: te.Tensor, d: int, read: te.Read, env: dict[int, ir.Value],
                  start: ir.Value, stop: ir.Value) -> None:
        """``stage[outer..., start:stop, ...] = read`` for a read that ``_contiguous_source``
        accepted: one ``llvm.memcpy`` of (stop - start) * (the extents after axis ``d``)
        elements (a KV cache's Concat along T copied a 16-float row per call before)."""
        b = self.builder
        axis = stage.axes[d]
        out_idx = [env[id(a)] for a in stage.axes[:d]] + [start] + \
            [const_i64(0)] * (len(stage.shape) - d - 1)
        env[id(axis)] = start
        src_idx = [self._value(i, env) if k <= d else const_i64(0)
                   for k, i in enumerate(read.indices)]
        inner = self._dim_value(product(stage.shape[d + 1:]))
        count = b.mul(b.sub(stop, start), inner, flags=("nsw",))
        count = b.select(b.icmp_signed(">", count, const_i64(0)), count, const_i64(0))
        nbytes = b.mul(count, const_i64(te.itemsize(stage.dtype)), flags=("nsw",))
        i8p = I8.as_pointer()
        memcpy = self.module.declare_intrinsic("llvm.memcpy", [i8p, i8p, I64])
        dst = b.bitcast(b.gep(self.buffers[stage.uid], [self._offset(stage, out_idx)],
                              inbounds=True), i8p)
        src = b.bitcast(b.gep(self.buffers[read.tensor.uid], [self._offset(read.tensor, src_idx)],
                              inbounds=True), i8p)
        b.call(memcpy, [dst, src, nbytes, ir.Constant(ir.IntType(1), 0)])

    def _bound(self, pick, task_bound: ir.Value, value: int, split: bool) -> ir.Value:
        """``value``, or on the axis split over tasks ``pick(task_bound, value)``."""
        if not split:
            return const_i64(value)
        b = self.builder
        op = ">" if pick is max else "<"
        return b.select(b.icmp_signed(op, task_bound, const_i64(value)), task_bound,
                        const_i64(value))

    def _offset(self, tensor: te.Tensor, indices: list[ir.Value]) -> ir.Value:
        b = self.builder
        offset: ir.Value | None = None
        stride = 1
        for idx, n in reversed(list(zip(indices, tensor.shape))):
            term = idx if stride == 1 else b.mul(idx, self._dim_value(stride), flags=("nsw",))
            offset = term if offset is None else b.add(offset, term, flags=("nsw",))
            stride *= n
        return const_i64(0) if offset is None else offset

    def _store(self, ptr: ir.Value, tensor: te.Tensor, indices: list[ir.Value], value: ir.Value
               ) -> None:
        b = self.builder
        value = store_converted(b, value, tensor.dtype)
        b.store(value, b.gep(ptr, [self._offset(tensor, indices)], inbounds=True))

    # ---- expressions --------------------------------------------------------------------------

    def _value(self, e: te.Expr, env: dict[int, ir.Value]) -> ir.Value:
        b = self.builder
        if isinstance(e, te.IndexVar):
            try:
                return env[id(e)]
            except KeyError:
                raise LoweringError(f"{self.func.name}: index {e.name} used outside its loop") from None
        if isinstance(e, te.Const):
            ty = LLVM_TYPES[e.dtype]
            if isinstance(e.value, SymExpr):   # a size known at run time (shape arithmetic)
                return self._cast(self._dim_value(e.value), "int64", e.dtype)
            if e.dtype in te.REDUCED_FLOAT_DTYPES:  # the value the dtype can hold
                return ir.Constant(ty, float(np.asarray(float(e.value), dtype=e.dtype)))
            return ir.Constant(ty, float(e.value) if te.is_float(e.dtype) else int(e.value))
        if isinstance(e, te.Read):
            ptr = self.buffers.get(e.tensor.uid)
            if ptr is None:
                raise LoweringError(f"{self.func.name}: {e.tensor.name} has no buffer")
            indices = [self._value(i, env) for i in e.indices]
            value = b.load(b.gep(ptr, [self._offset(e.tensor, indices)], inbounds=True))
            return load_converted(b, value, e.dtype)
        if isinstance(e, te.Binary):
            return self._binary(e.op, self._value(e.a, env), self._value(e.b, env), e.dtype)
        if isinstance(e, te.Compare):
            return self._compare(e.op, self._value(e.a, env), self._value(e.b, env), e.a.dtype)
        if isinstance(e, te.Select):
            return b.select(self._value(e.cond, env), self._value(e.a, env),
                            self._value(e.b, env))
        if isinstance(e, te.Cast):
            return self._cast(self._value(e.value, env), e.value.dtype, e.dtype)
        if isinstance(e, te.MathCall):
            return self._math(e.name, self._value(e.arg, env))
        if isinstance(e, te.Reduce):
            memo = self._reduce_memo
            if memo is None:
                return self._reduce(e, env)
            if id(e) not in memo:
                self._reduce_memo = None   # reductions inside its loop are not kept
                memo[id(e)] = self._reduce(e, env)
                self._reduce_memo = memo
            return memo[id(e)]
        raise LoweringError(f"{self.func.name}: cannot lower {type(e).__name__}")

    def _reduce(self, e: te.Reduce, env: dict[int, ir.Value]) -> ir.Value:
        b = self.builder
        whole = self._whole_tensor_read(e)
        if whole is not None:   # DynamicQuantizeLinear's range: a vector loop, same result
            n = int(np.prod(whole.tensor.shape, dtype=np.int64))
            return whole_min_max(b, self.module, self.buffers[whole.tensor.uid], n, e.combiner)
        ty = LLVM_TYPES[e.dtype]
        is_float = te.is_float(e.dtype)
        if e.combiner in ("sum", "prod"):
            unit = 0 if e.combiner == "sum" else 1
            init = ir.Constant(ty, float(unit) if is_float else unit)
        else:
            sign = -1 if e.combiner == "max" else 1
            if is_float:
                init = ir.Constant(ty, sign * float("inf"))
            else:
                info = np.iinfo(e.dtype)
                init = ir.Constant(ty, int(info.min if sign < 0 else info.max))
        acc = alloca_once(b, ty, name=f"acc.{e.combiner}")
        b.store(init, acc)

        def nest(d: int) -> None:
            if d == len(e.axes):
                value = self._value(e.body, env)
                current = b.load(acc)
                if e.combiner == "sum":
                    new = (b.fadd(current, value, flags=REDUCE_FLAGS) if is_float
                           else b.add(current, value))
                else:
                    op = "mul" if e.combiner == "prod" else e.combiner
                    new = self._binary(op, current, value, e.dtype, REDUCE_FLAGS)
                b.store(new, acc)
                return
            axis = e.axes[d]
            with for_range(b, const_i64(0), self._dim_value(axis.extent), axis.name) as idx:
                env[id(axis)] = idx
                nest(d + 1)

        nest(0)
        return b.load(acc)

    def _whole_tensor_read(self, e: te.Reduce) -> te.Read | None:
        """The read of a float32 min / max reduction over a whole static tensor in its own
        order (``x[r0, .., rn]``, every axis reduced: the range DynamicQuantizeLinear
        takes), else None."""
        body = e.body
        if (e.combiner not in ("min", "max") or e.dtype != "float32"
                or not isinstance(body, te.Read) or body.tensor.dtype != "float32"
                or body.tensor.uid not in self.buffers
                or len(body.indices) != len(e.axes) or not e.axes
                or any(i is not a for i, a in zip(body.indices, e.axes))
                or any(not isinstance(n, int) or a.extent != n
                       for a, n in zip(e.axes, body.tensor.shape))):
            return None
        return body

    def _binary(self, op: str, x: ir.Value, y: ir.Value, dtype: str,
                flags: tuple[str, ...] = ARITH_FLAGS) -> ir.Value:
        b = self.builder
        if te.is_float(dtype):
            if op in ("max", "min"):
                bound = _constant_bound(x, y)
                if bound is not None:   # clip, relu: one maxss/minss, NaN still propagates
                    return bound_select(b, op, *bound)
                name = f"llvm.{'maximum' if op == 'max' else 'minimum'}.{type_suffix(x.type)}"
                return b.call(intrinsic(self.module, name, x.type, [x.type, x.type]), [x, y])
            if op == "mod":
                # frem becomes a libm fmodf call the runtime does not resolve: x - trunc(x/y)*y.
                trunc = intrinsic(self.module, f"llvm.trunc.{type_suffix(x.type)}", x.type,
                                  [x.type])
                return b.fsub(x, b.fmul(b.call(trunc, [b.fdiv(x, y)]), y))
            method = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}.get(op)
            if method is None:
                raise LoweringError(f"{self.func.name}: float op {op} is not supported")
            return method(x, y, flags=flags)
        if op in ("and", "or", "xor"):  # logical on bool, bitwise on integers
            return {"and": b.and_, "or": b.or_, "xor": b.xor}[op](x, y)
        signed = not dtype.startswith("uint")
        if op in ("shl", "shr"):
            # A shift by the bit width or more gives 0 (LLVM would make it poison).
            shifted = b.shl(x, y) if op == "shl" else (b.ashr(x, y) if signed else b.lshr(x, y))
            too_far = b.icmp_unsigned(">=", y, ir.Constant(x.type, x.type.width))
            return b.select(too_far, ir.Constant(x.type, 0), shifted)
        if op in ("max", "min"):
            less = b.icmp_signed("<", x, y) if signed else b.icmp_unsigned("<", x, y)
            return b.select(less, y, x) if op == "max" else b.select(less, x, y)
        if op in ("add", "sub", "mul"):
            return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)
        if op in ("div", "floordiv", "mod"):
            return self._integer_divmod(x, y, op, signed)
        raise LoweringError(f"{self.func.name}: integer op {op} is not supported")

    def _integer_divmod(self, x: ir.Value, y: ir.Value, op: str, signed: bool) -> ir.Value:
        """Integer division that never traps: x86's div/idiv raise SIGFPE on a zero divisor (and
        idiv on MIN / -1), which would kill the whole interpreter. A zero divisor gives 0, as
        numpy does; a divisor of -1 gives -x (wrapping) and remainder 0, without dividing."""
        b = self.builder
        zero, one = ir.Constant(x.type, 0), ir.Constant(x.type, 1)
        by_zero = b.icmp_unsigned("==", y, zero)
        if not signed:
            safe = b.select(by_zero, one, y)
            value = b.udiv(x, safe) if op != "mod" else b.urem(x, safe)
            return b.select(by_zero, zero, value)
        by_minus_one = b.icmp_signed("==", y, ir.Constant(x.type, -1))
        safe = b.select(b.or_(by_zero, by_minus_one), one, y)
        value = self._floor_divmod(x, safe, op)
        special = zero if op == "mod" else b.select(by_zero, zero, b.sub(zero, x))
        return b.select(b.or_(by_zero, by_minus_one), special, value)

    def _floor_divmod(self, x: ir.Value, y: ir.Value, op: str) -> ir.Value:
        # Python semantics: the quotient rounds toward -inf and the remainder has y's sign.
        b = self.builder
        zero = ir.Constant(x.type, 0)
        q, r = b.sdiv(x, y), b.srem(x, y)
        adjust = b.and_(b.icmp_signed("!=", r, zero),
                        b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                      b.icmp_signed("<", y, zero)))
        if op == "mod":
            return b.select(adjust, b.add(r, y), r)
        return b.select(adjust, b.sub(q, ir.Constant(x.type, 1)), q)

    def _compare(self, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        b = self.builder
        sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
        if te.is_float(dtype):
            return b.fcmp_unordered(sym, x, y) if op == "ne" else b.fcmp_ordered(sym, x, y)
        if dtype.startswith("uint") or dtype == "bool":
            return b.icmp_unsigned(sym, x, y)
        return b.icmp_signed(sym, x, y)

    def _cast(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        b = self.builder
        if src == dst:
            return v
        to = LLVM_TYPES[dst]
        src_f, dst_f = te.is_float(src), te.is_float(dst)
        if dst == "bool":
            zero = ir.Constant(v.type, 0.0 if src_f else 0)
            return b.fcmp_unordered("!=", v, zero) if src_f else b.icmp_unsigned("!=", v, zero)
        if src_f and dst_f:
            if v.type != to:
                v = b.fpext(v, to) if to == F64 else b.fptrunc(v, to)
            # float16/bfloat16 compute in float32: a cast to one rounds to what it can hold
            return round_to(b, v, dst) if dst in te.REDUCED_FLOAT_DTYPES else v
        if dst in te.SUBBYTE_INT_DTYPES:  # wraps, as ONNX's Cast to int4/uint4/int2/uint2
            wide = self._cast(v, src, "int32")
            return round_to(b, b.trunc(wide, to), dst)
        if src_f:
            return b.fptoui(v, to) if dst.startswith("uint") else b.fptosi(v, to)
        unsigned = src.startswith("uint") or src == "bool"
        if dst_f:
            v = b.uitofp(v, to) if unsigned else b.sitofp(v, to)
            return round_to(b, v, dst) if dst in te.REDUCED_FLOAT_DTYPES else v
        if to.width > v.type.width:
            return b.zext(v, to) if unsigned else b.sext(v, to)
        return b.trunc(v, to) if to.width < v.type.width else v

    _INTRINSIC_MATH = {"abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "roundeven"}

    def _math(self, name: str, x: ir.Value) -> ir.Value:
        b = self.builder
        if x.type not in (F32, F64):
            raise LoweringError(f"{self.func.name}: {name} needs a float argument")
        if name in self._INTRINSIC_MATH:
            fn = intrinsic(self.module, f"llvm.{self._INTRINSIC_MATH[name]}.{type_suffix(x.type)}",
                           x.type, [x.type])
            return b.call(fn, [x])
        if x.type == F64:
            # float64 exp/log/tanh/erf... go through the float32 kernels: float32 precision, not libm.
            return b.fpext(vecmath.call_math(b, name, b.fptrunc(x, F32)), F64)
        return vecmath.call_math(b, name, x)


def _same_size(a: object, b: object) -> bool:
    """Whether two sizes (ints or size expressions) are the same expression."""
    try:
        return bool(a == b)
    except Exception:   # noqa: BLE001  (an undecidable comparison: not known to be equal)
        return False


def _contiguous_source(stage: te.Tensor, d: int, e: te.Expr, split: int | None
                       ) -> te.Read | None:
    """``e`` when it reads a buffer of the stage's dtype whose indices from ``d`` on are the
    stage's own (axis ``d`` perhaps shifted by a constant: a concatenation's piece), over the
    same extents after ``d``, and the outer indices do not use axes from ``d`` on: the elements
    of one range of axis ``d`` (with all that follows) are one contiguous run in both. Only
    when no axis after ``d`` is split over threads, and not on the last axis alone: rows of a
    few elements (a Concat along the last axis) copy faster as the vectorized loop than as a
    memcpy call each ([1, 4, 1000, 16 + 16]: 8.9 us as loops, 12.0 as calls)."""
    if d == len(stage.shape) - 1 or not isinstance(e, te.Read) or e.tensor.dtype != stage.dtype \
            or e.tensor.dtype in te.SUBBYTE_INT_DTYPES \
            or len(e.tensor.shape) != len(stage.shape) or (split is not None and split > d):
        return None
    axes = stage.axes
    inner = {id(a) for a in axes[d:]}
    for k, idx in enumerate(e.indices):
        if k < d:
            if any(id(n) in inner for n in _walk(idx)):
                return None
        elif k == d:
            if not (idx is axes[d] or (isinstance(idx, te.Binary) and idx.op == "sub"
                                       and idx.a is axes[d] and isinstance(idx.b, te.Const))):
                return None
        elif idx is not axes[k] or not _same_size(e.tensor.shape[k], stage.shape[k]):
            return None
    return e


def _walk(e: te.Expr):
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(te.children(node))


def _unclamped(e: te.Expr, axis: te.IndexVar, lo: object, hi: object) -> te.Expr:
    """``e`` with the index clamps ``min(max(axis - s, 0), m)`` that are the identity for
    ``axis`` in [lo, hi) (s = lo, m = hi - lo - 1) replaced by ``axis - s``: a concatenation's
    reads, legalized with clamps so that a select evaluating both branches stays in bounds,
    are plain reads inside their own input's range (a clamp per element keeps LLVM from
    vectorizing the copy into vector loads)."""
    def fn(n: te.Expr) -> te.Expr | None:
        if not (isinstance(n, te.Binary) and n.op == "min" and isinstance(n.a, te.Binary)
                and n.a.op == "max" and isinstance(n.a.b, te.Const) and n.a.b.value == 0
                and isinstance(n.b, te.Const)):
            return None
        x = n.a.a
        if x is axis:
            s = 0
        elif isinstance(x, te.Binary) and x.op == "sub" and x.a is axis \
                and isinstance(x.b, te.Const):
            s = x.b.value
        else:
            return None
        if _same_size(s, lo) and _same_size(n.b.value, hi - lo - 1):
            return x
        return None

    return te.rewrite(e, fn)


def _constant_bound(x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Constant] | None:
    """(value, bound) when one of ``x``, ``y`` is a float constant (or splat) that is not NaN."""
    for value, bound in ((x, y), (y, x)):
        if isinstance(bound, ir.Constant) and not isinstance(value, ir.Constant):
            consts = ([c.constant for c in bound.constant] if isinstance(bound.constant, list)
                      else [bound.constant])
            if all(isinstance(c, float) and c == c for c in consts):
                return value, bound
    return None


def bound_select(b: ir.IRBuilder, op: str, x: ir.Value, bound: ir.Constant) -> ir.Value:
    """max/min of ``x`` and a constant that is not NaN, as ``x < bound ? bound : x`` (max): x86
    lowers it to one maxps/minps with NaN in ``x`` passed through, which NaN-propagating
    ``llvm.maximum`` needs several instructions for (signed zeros are the one difference:
    max(-0.0, 0.0) gives -0.0)."""
    cmp = b.fcmp_ordered("<" if op == "max" else ">", x, bound)
    return b.select(cmp, bound, x)


def emit_kernel(module: ir.Module, func: PrimFunc, symbol: str,
                size_vars: tuple[str, ...] = (), options: SplitThresholds = DEFAULTS
                ) -> KernelInfo:
    """Emit ``func`` into ``module`` as the exported function ``symbol``; ``size_vars`` orders
    the values a symbolic kernel reads from its sizes array."""
    return KernelEmitter(module, func, symbol, size_vars, options).emit()


def _func_dims(func: PrimFunc) -> list[object]:
    dims: list[object] = []
    for t in func.inputs + func.outputs + [s for s in te.stages(func.outputs)]:
        dims += list(t.shape)
        if t.body is not None:
            stack = [t.body]
            while stack:
                node = stack.pop()
                if isinstance(node, te.Reduce):
                    dims += [a.extent for a in node.axes]
                elif isinstance(node, te.Const) and isinstance(node.value, SymExpr):
                    dims.append(node.value)
                stack.extend(te.children(node))
    return dims


def is_symbolic(func: PrimFunc) -> bool:
    """Whether any shape or loop extent of ``func`` is symbolic (a run-time size)."""
    return any(not isinstance(d, int) for d in _func_dims(func))


def symbolic_vars(func: PrimFunc) -> set[str]:
    return shape_vars(_func_dims(func))
