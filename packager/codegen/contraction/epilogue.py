"""The contraction kernels' fused epilogue (bias, BatchNorm scale/shift, activation, residual
add), evaluated on the register tile after each block: a vector at a time along the output's
last axis (masked at the ends of rows and panels) when it is plain float32 arithmetic, or the
casts of a quantize -> dequantize round trip (``_vector_casts``) or a ``qlookup``'s gather from
its float table (``_gather_table``); otherwise (other casts, math
calls without a vector form) by the generic scalar expression lowering, element by element.
``EpilogueMixin.epilogue_vector`` is the public entry for kernels that hold their own
accumulators (the depthwise kernels)."""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ...ops.qlookup import is_table_read
from ..helpers import F32, I1, I8, I32, I64, const_i64, for_range, intrinsic
from ..lower import bound_select
from ..vecmath_lanes import VECTOR_MATH, opaque_constant, vector_math


_VECTOR_BINARY = ("add", "sub", "mul", "div", "max", "min")
# Integers whose every value a float32 holds and an int32 lane holds: a float32 -> T -> float32
# round trip is a truncation toward zero through int32 for every value T holds.
_SMALL_INT = ("int8", "uint8", "int16", "uint16")


def _is_bound(e: te.Expr) -> bool:
    """A float constant that is not NaN (max/min against it is one maxps/minps)."""
    return isinstance(e, te.Const) and te.is_float(e.dtype) and e.value == e.value


def _vector_casts(body: te.Expr, skip: te.Expr, last: te.IndexVar) -> set[int] | None:
    """The ids of the nodes a float32 cast in ``body`` lets the vector epilogue take (None: a
    cast it cannot take). A QDQ model whose shapes stay symbolic runs its quantize ->
    dequantize pairs in float inside the convolutions' epilogues (the integer kernels need
    static shapes): ``float32(T(q))`` with ``q`` clamped to T's range and rounded (quantize's
    saturation), and ``float32(zero_point)``, a T constant read once per channel. Allowed:
    float32 -> float32; float32 of a float32 -> 8/16-bit integer cast (emitted as fptosi to
    int32 and back: the same truncation for every value T holds; other values are poison in
    the scalar lowering's fptoui/fptosi too); float32 of an 8/16-bit or int32 read that is not
    along the output's last axis (a per-channel or per-tensor value, loaded and splat); the
    int64 column of a table read (``ops/qlookup.is_table_read``: a gather)."""
    inner: set[int] = {id(n.indices[1]) for n in te.walk(body, skip=skip) if is_table_read(n)}
    for node in te.walk(body, skip=skip):
        if not isinstance(node, te.Cast):
            continue
        if id(node) in inner:
            continue   # the integer cast of a round trip, checked with its parent
        v = node.value
        if node.dtype != "float32":
            return None
        if v.dtype == "float32":
            continue
        if isinstance(v, te.Cast) and v.dtype in _SMALL_INT and v.value.dtype == "float32":
            inner.add(id(v))
        elif (isinstance(v, te.Read) and v.tensor.dtype in (*_SMALL_INT, "int32")
              and all(i is not last for i in v.indices)):
            inner.add(id(v))
        else:
            return None
    return inner


def _index_used_as_value(body: te.Expr, skip: te.Expr) -> bool:
    """Some loop index appears in ``body`` (outside ``skip``) other than as a Read index."""
    stack = [body]
    while stack:
        node = stack.pop()
        if node is skip:
            continue
        if isinstance(node, te.IndexVar):
            return True
        if isinstance(node, te.Read):
            continue   # its indices were checked to be plain index variables or constants
        stack.extend(te.children(node))
    return False


def vector_epilogue_ok(match) -> bool:
    """The epilogue can be evaluated a vector at a time along the output's last axis: only
    float32 arithmetic, compares and selects, and reads of float32 tensors whose indices are
    plain output loop indices or constants, the last axis (if read) as their last index."""
    out, last = match.out, match.out.axes[-1]
    axes = {id(a) for a in out.axes}
    cast_inner = _vector_casts(match.body, match.reduce, last)
    if cast_inner is None:
        return False
    for node in te.walk(match.body, skip=match.reduce):
        if isinstance(node, te.Cast):
            continue   # checked by _vector_casts
        if isinstance(node, te.Binary):
            if node.dtype != "float32" or node.op not in _VECTOR_BINARY:
                return False
        elif isinstance(node, te.Compare):
            if node.a.dtype != "float32":
                return False
        elif isinstance(node, te.MathCall):   # sigmoid (SiLU), erf (GELU), tanh, exp
            if node.dtype != "float32" or node.name not in VECTOR_MATH:
                return False
        elif is_table_read(node):   # a qlookup's gather: its row per channel, not per lane
            row = node.indices[0]
            if isinstance(row, te.IndexVar) and (id(row) not in axes or row is last):
                return False
        elif isinstance(node, te.Read):
            if id(node) not in cast_inner and (node.dtype != "float32"
                                               or node.tensor.dtype != "float32"):
                return False
            for d, idx in enumerate(node.indices):
                if isinstance(idx, te.IndexVar):
                    if id(idx) not in axes or (idx is last and d != len(node.indices) - 1):
                        return False
                elif not isinstance(idx, te.Const):
                    return False
        elif not isinstance(node, (te.Select, te.Const, te.IndexVar)):
            return False   # casts, math calls, other reductions: the scalar epilogue
    return not _index_used_as_value(match.body, match.reduce)


def rows_contiguous(match) -> bool:
    """Every read along the output's last axis also reads along the one before it, in its
    last two dimensions, with the output's row length: consecutive outputs across a row end
    are then consecutive elements of that tensor too."""
    out = match.out
    for node in te.walk(match.body, skip=match.reduce):
        if isinstance(node, te.Read) and node.indices and node.indices[-1] is out.axes[-1]:
            if (len(node.indices) < 2 or node.indices[-2] is not out.axes[-2]
                    or node.tensor.shape[-1] != out.shape[-1]):
                return False
    return True


class EpilogueMixin:
    """The epilogue part of ``kernel.ContractionEmitter``."""

    # NCHW float32 tensors the epilogue reads that hold bf16 pair words instead: uid ->
    # padding (pt, pl, pb, pr) of their [N, C / 2, H + pt + pb, W + pl + pr] 32-bit words
    # (bf16(x[2j]), bf16(x[2j + 1])) (passes/bf16_pairs.py)
    pair_word_reads: dict = {}

    def _pair_word_read(self, t: te.Tensor, idx: list, mask: ir.Value | None) -> ir.Value:
        """vl values of pair-word tensor ``t`` from NCHW indices ``idx`` (along the last axis;
        with padding, within one row): the words of channel pair c // 2, each widened from
        its low (even c) or high half."""
        b = self.builder
        n, c, h, w = t.shape
        pt, pl, pb, pr = self.pair_word_reads[t.uid]
        hp, wp = h + pt + pb, w + pl + pr
        cp = -(-c // 2)
        i32v = ir.VectorType(I32, self.vl)
        pair = b.sdiv(idx[1], const_i64(2))
        offset = b.add(b.mul(idx[0], const_i64(cp * hp * wp)),
                       b.add(b.mul(pair, const_i64(hp * wp)),
                             b.add(b.mul(b.add(idx[2], const_i64(pt)), const_i64(wp)),
                                   b.add(idx[3], const_i64(pl)))))
        ptr = b.bitcast(b.gep(self.buffers[t.uid], [offset], inbounds=True), i32v.as_pointer())
        if mask is None:
            words = b.load(ptr, align=4)
        else:
            fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}i32.p0", i32v,
                           [i32v.as_pointer(), I32, ir.VectorType(I1, self.vl), i32v])
            words = b.call(fn, [ptr, ir.Constant(I32, 4), mask, ir.Constant(i32v, None)])
        low = b.shl(words, ir.Constant(i32v, [16] * self.vl))
        high = b.and_(words, ir.Constant(i32v, [-65536] * self.vl))
        odd = b.icmp_signed("!=", b.and_(idx[1], const_i64(1)), const_i64(0))
        return b.bitcast(b.select(odd, high, low), self.vty)

    def epilogue_vector(self, acc: ir.Value, env: dict, mask: ir.Value | None, memo: dict | None,
                        opaque_constants: bool) -> ir.Value:
        """The fused epilogue's value, a vector, on the accumulators ``acc`` of the outputs at
        the indices ``env`` binds: for kernels that hold their own accumulators (the depthwise
        ones). ``mask``: the lanes inside the row (None: all); ``memo``: values reused between
        calls (``_vvalue``); ``opaque_constants``: the epilogue's constants derive from an
        opaque zero made here (``_begin_epilogue``) rather than being plain constants."""
        self._tile_value = acc
        if opaque_constants:
            self._begin_epilogue()
        value = self._vvalue(self.match.body, env, mask, memo)
        self._tile_value = self._opaque = self._opaque_scalar = None
        return value

    def _vector_epilogue_ok(self) -> bool:
        """``vector_epilogue_ok`` of this kernel's contraction."""
        return vector_epilogue_ok(self.match)

    def _rows_contiguous(self) -> bool:
        """``rows_contiguous`` of this kernel's contraction."""
        return rows_contiguous(self.match)

    def _vvalue(self, e: te.Expr, env: dict, mask: ir.Value | None,
                memo: dict[int, ir.Value] | None = None) -> ir.Value:
        """``e`` for the vl consecutive outputs starting at ``env``'s indices (the last axis
        varying across lanes); ``mask`` (or None: all lanes) limits the loads. A node the
        expression reaches twice (the diamond of x * sigmoid(x)) is emitted once (``memo``:
        the code is straight-line, so a value emitted earlier dominates its later uses)."""
        memo = {} if memo is None else memo
        value = memo.get(id(e))
        if value is None:
            value = memo[id(e)] = self._vnode(e, env, mask, memo)
        return value

    def _vnode(self, e: te.Expr, env: dict, mask: ir.Value | None, memo: dict) -> ir.Value:
        b = self.builder
        if e is self.match.reduce:
            return self._tile_value
        if isinstance(e, te.Const):
            if e.dtype == "bool":
                return ir.Constant(ir.VectorType(I1, self.vl), [bool(e.value)] * self.vl)
            if self._opaque is not None:
                return opaque_constant(b, float(e.value), self._opaque)
            return ir.Constant(self.vty, [float(e.value)] * self.vl)
        if is_table_read(e):
            return self._gather_table(e, env, mask, memo)
        if isinstance(e, te.Read) and e.tensor.dtype != "float32":   # under a float32 cast
            return self._splat(self.int_read_f32(e, env))
        if isinstance(e, te.Read):
            last = self.match.out.axes[-1]
            idx = [const_i64(int(i.value)) if isinstance(i, te.Const) else env[id(i)]
                   for i in e.indices]
            if e.tensor.uid in self.pair_word_reads and e.indices and e.indices[-1] is last:
                return self._pair_word_read(e.tensor, idx, mask)
            offset = self._offset(e.tensor, idx)
            if e.indices and e.indices[-1] is last:
                ptr = b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)
                vptr = b.bitcast(ptr, self.vty.as_pointer())
                if mask is None:
                    return b.load(vptr, align=4)
                return self._masked_load(vptr, mask)
            if self._opaque_scalar is not None:
                # a per-channel scale or shift: loaded here, not hoisted over the reduction
                offset = b.add(offset, b.sext(self._opaque_scalar, offset.type))
            ptr = b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)
            return self._splat(b.load(ptr))
        if isinstance(e, te.Binary):
            x, y = self._vvalue(e.a, env, mask, memo), self._vvalue(e.b, env, mask, memo)
            if e.op in ("max", "min"):
                # clip, relu: one vmaxps/vminps, NaN in the other operand still propagates
                if _is_bound(e.b):
                    return bound_select(b, e.op, x, y)
                if _is_bound(e.a):
                    return bound_select(b, e.op, y, x)
                name = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.v{self.vl}f32"
                return b.call(intrinsic(self.module, name, self.vty, [self.vty] * 2), [x, y])
            return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[e.op](x, y)
        if isinstance(e, te.Compare):
            return self._compare(e.op, self._vvalue(e.a, env, mask, memo),
                                 self._vvalue(e.b, env, mask, memo), e.a.dtype)
        if isinstance(e, te.Select):
            return b.select(self._vvalue(e.cond, env, mask, memo),
                            self._vvalue(e.a, env, mask, memo), self._vvalue(e.b, env, mask, memo))
        if isinstance(e, te.MathCall):
            return vector_math(b, e.name, self._vvalue(e.arg, env, mask, memo),
                               self._opaque_scalar)
        if isinstance(e, te.Cast):   # the forms _vector_casts allows
            v = e.value
            if v.dtype == "float32":
                return self._vvalue(v, env, mask, memo)
            if isinstance(v, te.Cast):   # float32 -> 8/16-bit integer -> float32
                x = self._vvalue(v.value, env, mask, memo)
                return b.sitofp(b.fptosi(x, ir.VectorType(I32, self.vl)), self.vty)
            return self._vvalue(v, env, mask, memo)   # an integer read: its float32 splat
        raise AssertionError(f"not vectorizable: {type(e).__name__}")

    def _gather_table(self, e: te.Read, env: dict, mask: ir.Value | None, memo: dict
                      ) -> ir.Value:
        """A ``qlookup``'s read ``table[row, int64(column)]`` for vl outputs: the row (the
        vector's channel, or 0) is one per vector, the columns are the lanes' quantized values
        (rounded, clamped to 0..255, a NaN made 0 by the op: never outside the row)."""
        b = self.builder
        row, col = e.indices
        r = const_i64(int(row.value)) if isinstance(row, te.Const) else env[id(row)]
        offset = self._offset(e.tensor, [r, const_i64(0)])
        if self._opaque_scalar is not None:   # not hoisted over the reduction (see _vnode)
            offset = b.add(offset, b.sext(self._opaque_scalar, offset.type))
        base = b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)
        idx = b.fptosi(self._vvalue(col.value, env, mask, memo), ir.VectorType(I32, self.vl))
        return gather_f32(b, self.module, base, idx, self.vl)

    def int_read_f32(self, e: te.Read, env: dict) -> ir.Value:
        """A scalar read of an integer tensor (not along the output's last axis: a zero point
        per tensor or per channel), as float32."""
        b = self.builder
        idx = [const_i64(int(i.value)) if isinstance(i, te.Const) else env[id(i)]
               for i in e.indices]
        offset = self._offset(e.tensor, idx)
        if self._opaque_scalar is not None:   # not hoisted over the reduction (see _vnode)
            offset = b.add(offset, b.sext(self._opaque_scalar, offset.type))
        return self.int_to_f32(b.load(b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)),
                               e.tensor.dtype)

    def int_to_f32(self, v: ir.Value, dtype: str) -> ir.Value:
        """A loaded integer of ``dtype`` as float32."""
        b = self.builder
        f32 = self.vty.element
        return b.uitofp(v, f32) if dtype.startswith("uint") else b.sitofp(v, f32)

    def _store_vector(self, env: dict, tile_f: ir.Value, tile_index: ir.Value,
                      mask: ir.Value | None) -> None:
        """Evaluate the epilogue for vl consecutive outputs (tile elements from ``tile_index``)
        and store the lanes ``mask`` selects (None: all)."""
        b = self.builder
        out = self.match.out
        self._tile_value = b.load(self._vec_ptr(tile_f, tile_index), align=4)
        value = self._vvalue(self.match.body, env, mask)
        self._tile_value = None
        ptr = b.gep(self.buffers[out.uid], [self._offset(out, [env[id(a)] for a in out.axes])],
                    inbounds=True)
        vptr = b.bitcast(ptr, self.vty.as_pointer())
        if mask is None:
            b.store(value, vptr, align=4)
            return
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}f32.p0", ir.VoidType(),
                       [self.vty, self.vty.as_pointer(), I32, ir.VectorType(I1, self.vl)])
        b.call(fn, [value, vptr, ir.Constant(I32, 4), mask])

    def _store_tile_vector(self, env: dict, tile_f: ir.Value, row: ir.Value, nr: int, v: int,
                           masked: bool, remaining: ir.Value, masks: list) -> None:
        """The epilogue on vector ``v`` of tile row ``row`` (``nr`` columns a row), its output
        indices set in ``env``: whole, or when ``masked`` only where some of the ``remaining``
        columns lie in it, its lanes ``masks[v]``."""
        b = self.builder
        t_idx = b.add(b.mul(row, const_i64(nr)), const_i64(v * self.vl))
        if not masked:
            self._store_vector(env, tile_f, t_idx, None)
            return
        with b.if_then(b.icmp_signed(">", remaining, const_i64(v * self.vl))):
            self._store_vector(env, tile_f, t_idx, masks[v])

    def _store_row_span(self, env: dict, x_axis: te.IndexVar, tile_f: ir.Value, row: ir.Value,
                        nr: int, row0: ir.Value, p0: ir.Value, x_lo: ir.Value, x_hi: ir.Value,
                        vector: bool, clamp: bool = False) -> None:
        """The epilogue on outputs ``x_lo`` .. ``x_hi`` of one output row of a convolution
        tile (tile row ``row``, ``nr`` columns a row; output x at tile column row0 + x - p0),
        ``x_axis`` set in ``env``: element by element, or with ``vector`` vl at a time, the
        last vector masked (``clamp``: x_hi may lie below x_lo, then none)."""
        b = self.builder
        if not vector:
            with for_range(b, x_lo, x_hi, "ox") as ox:
                env[id(x_axis)] = ox
                t_idx = b.add(b.mul(row, const_i64(nr)), b.sub(b.add(row0, ox), p0))
                self._store_epilogue(env, tile_f, t_idx)
            return
        count = b.sub(x_hi, x_lo)
        if clamp:
            count = b.select(b.icmp_signed(">", count, const_i64(0)), count, const_i64(0))
        nvec = b.sdiv(b.add(count, const_i64(self.vl - 1)), const_i64(self.vl))
        with for_range(b, const_i64(0), nvec, "ov") as q:
            ox = b.add(x_lo, b.mul(q, const_i64(self.vl)))
            env[id(x_axis)] = ox
            t_idx = b.add(b.mul(row, const_i64(nr)), b.sub(b.add(row0, ox), p0))
            left = b.sub(x_hi, ox)
            with b.if_else(b.icmp_signed(">=", left, const_i64(self.vl))) as (full, part):
                with full:
                    self._store_vector(env, tile_f, t_idx, None)
                with part:
                    self._store_vector(env, tile_f, t_idx, self._lane_mask(left, 0))

    def _store_epilogue(self, env: dict, tile_f: ir.Value, tile_index: ir.Value) -> None:
        b = self.builder
        out = self.match.out
        self._tile_value = b.load(b.gep(tile_f, [tile_index], inbounds=True))
        value = self._value(self.match.body, env)
        self._tile_value = None
        self._store(self.buffers[out.uid], out, [env[id(a)] for a in out.axes], value)


def gather_f32(b: ir.IRBuilder, module: ir.Module, base: ir.Value, idx: ir.Value, vl: int
               ) -> ir.Value:
    """``base[idx[j]]`` for the vl lanes of the int32 vector ``idx`` (every index in bounds):
    on x86 with 8-lane vectors or more, AVX2's ``vgatherdps`` 8 lanes at a time (LLVM's generic
    masked gather is scalarized on CPUs it does not tune for fast gathers, AMD's among them);
    elsewhere one load per lane."""
    vty = ir.VectorType(F32, vl)
    if module.triple.startswith("x86_64") and vl % 8 == 0:
        v8f, v8i = ir.VectorType(F32, 8), ir.VectorType(I32, 8)
        fn = intrinsic(module, "llvm.x86.avx2.gather.d.ps.256", v8f,
                       [v8f, I8.as_pointer(), v8i, v8f, I8])
        ptr = b.bitcast(base, I8.as_pointer())
        ones = b.bitcast(ir.Constant(v8i, [-1] * 8), v8f)
        zero = ir.Constant(v8f, [0.0] * 8)
        parts = []
        for k in range(vl // 8):
            part = idx if vl == 8 else b.shuffle_vector(
                idx, ir.Constant(idx.type, None), ir.Constant(v8i, list(range(8 * k, 8 * k + 8))))
            parts.append(b.call(fn, [zero, ptr, part, ones, ir.Constant(I8, 4)]))
        while len(parts) > 1:   # concatenate pairwise: 8 + 8 -> 16
            n = parts[0].type.count
            parts = [b.shuffle_vector(parts[i], parts[i + 1],
                                      ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))
                     for i in range(0, len(parts), 2)]
        return parts[0]
    out = ir.Constant(vty, None)
    for j in range(vl):
        at = b.sext(b.extract_element(idx, ir.Constant(I32, j)), I64)
        out = b.insert_element(out, b.load(b.gep(base, [at], inbounds=True)),
                               ir.Constant(I32, j))
    return out
