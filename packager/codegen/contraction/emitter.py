"""The contraction emitter's shared pieces: the matched contraction, the vector type, weight
loads (float32, or bfloat16 widened exactly: ``load_weights``), splats, fused multiply-adds,
lane masks, task splits, the conv weight's rows, and the register-tile microkernel
(``ContractionBase._microkernel``) that ``matmul.py`` and ``conv.py`` drive.

The microkernel keeps an MR x NR block of the output in vector registers (NR a multiple of the
target's vector width) and, for every step k of the reduction, loads NR contiguous values of the
"wide" operand and broadcasts MR scalars of the "narrow" one into fused multiply-adds."""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ...ir.te import itemsize
from ...ir.graph import PrimFunc
from ..helpers import (F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic,
                       shared_constant)
from ..lower import KernelEmitter, LoweringError
from ..vecmath_lanes import opaque_zero, splat_i32
from .match import Contraction
from ..threads import DEFAULTS, SplitThresholds


def load_weights(b: ir.IRBuilder, w_ptr: ir.Value, offset: ir.Value, lanes: int | None,
                 bf16: bool) -> ir.Value:
    """``lanes`` consecutive float32 weights (a vector; None: one scalar) from element
    ``offset`` of ``w_ptr``: a plain load, or bfloat16 ones widened to float32 (zero-extend to
    32 bits, shift left 16: exact, on every level)."""
    ptr = b.gep(w_ptr, [offset], inbounds=True)
    if lanes is None:
        value = b.load(ptr)
        return b.bitcast(b.shl(b.zext(value, I32), ir.Constant(I32, 16)), F32) if bf16 else value
    if not bf16:
        return b.load(b.bitcast(ptr, ir.VectorType(F32, lanes).as_pointer()), align=4)
    i16v, i32v = ir.VectorType(ir.IntType(16), lanes), ir.VectorType(I32, lanes)
    raw = b.load(b.bitcast(ptr, i16v.as_pointer()), align=2)
    wide = b.shl(b.zext(raw, i32v), ir.Constant(i32v, [16] * lanes))
    return b.bitcast(wide, ir.VectorType(F32, lanes))


class ContractionBase(KernelEmitter):
    """The state and pieces every contraction kernel shares; ``kernel.ContractionEmitter``
    composes it with the matmul, conv and epilogue parts."""

    plans_conv = True   # convolutions: conv_geometry() picks the vector width

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: Contraction,
                 vl: int, size_vars: tuple[str, ...] = (),
                 options: SplitThresholds = DEFAULTS) -> None:
        super().__init__(module, func, symbol, size_vars, options)
        self.match = match
        self.target_vl = vl
        self._geom_cache: dict | None = None
        if match.tag.kind == "conv2d" and self.plans_conv:   # the tile may use half-width vectors
            vl = self._conv_geometry()["vl"]
        self.vl = vl
        self.vty = ir.VectorType(F32, vl)
        self._tile_value: ir.Value | None = None
        # constants of the vector epilogue derive from it (see vecmath_lanes.opaque_constant)
        self._opaque: ir.Value | None = None
        self._opaque_scalar: ir.Value | None = None
        # (opaque zero, its splat) that epilogues share between share_epilogue_zero() and
        # end_shared_epilogue_zero(), or None: a fresh one per epilogue
        self._shared_opaque: tuple[ir.Value, ir.Value] | None = None
        self._packed_b: ir.Value | None = None   # the packed B panel _matmul_panel reads
        self._pack_region: ir.Value | None = None   # this task's region for it (workspace)
        # (chunk index, chunks) of the work item's rows (MatmulMixin._row_chunks), or None
        self._row_chunk: tuple[ir.Value, int] | None = None
        self._part_base: ir.Value | None = None   # the conv's reduction-chunk tiles (workspace)
        # (image, gathered rows) of the tail outputs that follow each block row (_fuses_tail)
        self._fused_tail: tuple[ir.Value, ir.Value] | None = None
        # B packed at export into panels [ceil(N / nr), K, nr] (ops/layout.py matmul_packed)
        self._const_panels = match.tag.kind == "matmul_packed"

    # The contraction inside the epilogue expression reads the register tile.
    def _reduce(self, e: te.Reduce, env: dict) -> ir.Value:
        if e is self.match.reduce and self._tile_value is not None:
            return self._tile_value
        return super()._reduce(e, env)

    def _macs(self) -> int:
        out, red = self.match.out, self.match.reduce
        n = 1
        for d in out.shape:
            n *= d
        for a in red.axes:
            n *= a.extent
        return n

    def _weight_bytes_split(self, work_items: int) -> bool:
        """Whether the kernel is worth splitting over threads for the bytes of its second
        operand (the weights a matmul or dot product streams once per call) whatever its
        multiply-adds: at least ``options.parallel_min_weight_bytes`` of them and
        ``work_items`` >= 2 to share (codegen/threads.py PARALLEL_MIN_WEIGHT_BYTES)."""
        w = self.match.tag.operands[1]
        nbytes = itemsize(w.dtype)
        for d in w.shape:
            nbytes *= d
        return work_items >= 2 and nbytes >= self.options.parallel_min_weight_bytes

    # ---- shared pieces --------------------------------------------------------------------------

    def _vec_ptr(self, ptr: ir.Value, offset: ir.Value) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(ptr, [offset], inbounds=True), self.vty.as_pointer())

    def _bf16_weights(self) -> bool:
        """The packed weights are bfloat16 (``--precision bf16``)."""
        return self.match.tag.operands[1].dtype == "bfloat16"

    def _weight_vector(self, w_ptr: ir.Value, offset: ir.Value, lanes: int) -> ir.Value:
        """``lanes`` weights from element ``offset`` of ``w_ptr`` as float32 (``load_weights``)."""
        return load_weights(self.builder, w_ptr, offset, lanes, self._bf16_weights())

    def _weight_scalar(self, w_ptr: ir.Value, offset: ir.Value) -> ir.Value:
        """One weight as float32 (``load_weights``)."""
        return load_weights(self.builder, w_ptr, offset, None, self._bf16_weights())

    def _splat(self, x: ir.Value) -> ir.Value:
        b = self.builder
        undef = shared_constant(self.vty, None)
        v = b.insert_element(undef, x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, undef,
                                shared_constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _fma(self, a: ir.Value, x: ir.Value, acc: ir.Value) -> ir.Value:
        fn = intrinsic(self.module, f"llvm.fmuladd.v{self.vl}f32", self.vty,
                       [self.vty] * 3)
        return self.builder.call(fn, [a, x, acc])

    def _masked_load(self, ptr: ir.Value, mask: ir.Value) -> ir.Value:
        vptr = self.vty.as_pointer()
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [vptr, I32, ir.VectorType(I1, self.vl), self.vty])
        return self.builder.call(fn, [ptr, ir.Constant(I32, 4), mask,
                                      shared_constant(self.vty, [0.0] * self.vl)])

    def _begin_epilogue(self) -> None:
        """Make the opaque zero the epilogue's constants derive from, after a reduction loop
        (or take the one ``share_epilogue_zero`` made)."""
        if self._shared_opaque is not None:
            self._opaque_scalar, self._opaque = self._shared_opaque
            return
        self._opaque_scalar = opaque_zero(self.builder)
        self._opaque = splat_i32(self.builder, self._opaque_scalar, self.vl)

    def share_epilogue_zero(self) -> None:
        """The vector epilogues emitted from here until ``end_shared_epilogue_zero`` share one
        opaque zero (straight-line code after one reduction: their constants and per-channel
        reads are then made once for all of them, not once per vector)."""
        scalar = opaque_zero(self.builder)
        self._shared_opaque = (scalar, splat_i32(self.builder, scalar, self.vl))

    def end_shared_epilogue_zero(self) -> None:
        self._shared_opaque = None

    def _lane_mask(self, remaining: ir.Value, v: int) -> ir.Value:
        """Lanes of vector ``v`` of a panel whose column index is < ``remaining``."""
        b = self.builder
        i64s = ir.VectorType(I64, self.vl)
        lanes = shared_constant(i64s, [v * self.vl + i for i in range(self.vl)])
        rem = b.insert_element(shared_constant(i64s, None), remaining, ir.Constant(I32, 0))
        rem = b.shuffle_vector(rem, shared_constant(i64s, None),
                               shared_constant(ir.VectorType(I32, self.vl), [0] * self.vl))
        return b.icmp_signed("<", lanes, rem)

    def _split(self, total: int, task: ir.Value, ntasks: ir.Value) -> tuple[ir.Value, ir.Value]:
        b = self.builder
        t = total if isinstance(total, ir.Value) else self._dim_value(total)
        return (b.sdiv(b.mul(task, t), ntasks),
                b.sdiv(b.mul(b.add(task, const_i64(1)), t), ntasks))

    def _weight_shape(self) -> tuple:
        """The convolution's weight shape [O, C / groups, KH, KW], whatever its layout."""
        x, w = self.match.tag.operands
        if self.match.tag.kind == "conv2d_rows":
            attrs = self.match.tag.attrs
            return (attrs["out_channels"], x.shape[1], *attrs["kernel"])
        return tuple(w.shape)

    def _row_block(self) -> int | None:
        """The rows of a ``conv2d_rows`` weight block (None: the weights are [O, C, KH, KW])."""
        return self.match.tag.attrs["rows"] if self.match.tag.kind == "conv2d_rows" else None

    def _conv_weight(self, oc0: ir.Value, local0: ir.Value, og: int, khw: int = 1):
        """``a_scalar(k, u, i)`` for a conv tile: the weight of output channel oc0 + i, input
        channel k, tap u, from the weights [O, cg * khw] (tap u None: khw is 1). Rows past the
        group's last channel (local0 + i >= og, a partial block row) repeat it: computed, not
        stored. Packed in blocks of the tile's rows (``conv2d_rows``, one group), a block row's
        weights are block oc0 / rows: row i of step (k, u) at (k * khw + u) * rows + i, zero
        past the last channel."""
        b = self.builder
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        cg = self._weight_shape()[1]
        rows = self._row_block()
        if rows is not None:
            k_taps = cg * khw
            if rows != self._conv_geometry()["mr"]:
                raise LoweringError(f"{self.func.name}: weights packed in blocks of {rows} rows "
                                   f"for a tile of {self._conv_geometry()['mr']}")
            block = b.gep(w_ptr, [b.mul(b.sdiv(oc0, const_i64(rows)),
                                        const_i64(k_taps * rows))], inbounds=True)

            def a_packed(k, u, i):
                col = k if u is None else b.add(b.mul(k, const_i64(khw)), const_i64(u))
                return self._weight_scalar(block, b.add(b.mul(col, const_i64(rows)),
                                                        const_i64(i)))

            return a_packed
        last = b.add(b.sub(oc0, local0), const_i64(og - 1))

        def a_scalar(k, u, i):
            row = b.select(b.icmp_signed("<", b.add(local0, const_i64(i)), const_i64(og)),
                           b.add(oc0, const_i64(i)), last)
            col = k if u is None else b.add(b.mul(k, const_i64(khw)), const_i64(u))
            return b.load(b.gep(w_ptr, [b.add(b.mul(row, const_i64(cg * khw)), col)],
                                inbounds=True))

        return a_scalar

    def _microkernel(self, mr: int, nv: int, k_extent: int, a_scalar, b_vector,
                     unroll: list | None = None, b_last=None, tile: ir.Value | None = None,
                     init: ir.Value | None = None) -> ir.Value:
        """Accumulate an mr x (nv vectors) block over ``k_extent`` steps (times the ``unroll``
        list of unrolled sub-steps); ``a_scalar(k, u, i)`` gives row i's value, ``b_vector(k, u,
        v)`` the v-th vector of the wide operand; ``b_last``, if given, loads the wide operand
        in the last step instead (which is peeled off the loop). Returns the tile (an alloca of
        mr*nv vectors). ``tile``: a buffer for the tile (else a stack one); ``init`` (i1): the
        accumulators start from the tile's values when true (else from zero)."""
        b = self.builder
        accs = [alloca_once(b, self.vty, name=f"acc{i}_{v}") for i in range(mr) for v in range(nv)]
        zero = ir.Constant(self.vty, [0.0] * self.vl)
        for q, a in enumerate(accs):
            if init is None:
                b.store(zero, a)
            else:
                old = b.load(self._vec_ptr(tile, const_i64(q * self.vl)), align=4)
                b.store(b.select(init, old, zero), a)
        steps = unroll or [None]

        def step(k, load) -> None:
            vals = [b.load(a) for a in accs]
            for u in steps:
                bv = [load(k, u, v) for v in range(nv)]
                for i in range(mr):
                    ai = self._splat(a_scalar(k, u, i))
                    for v in range(nv):
                        vals[i * nv + v] = self._fma(ai, bv[v], vals[i * nv + v])
            for a, val in zip(accs, vals):
                b.store(val, a)

        if not isinstance(k_extent, int):   # a run-time K (symbolic matmul): no peeled step
            assert b_last is None
            with for_range(b, const_i64(0), self._dim_value(k_extent), "k") as k:
                step(k, b_vector)
            k_extent = 0
        loop_end = k_extent - (1 if b_last is not None else 0)
        if loop_end > 0:
            with for_range(b, const_i64(0), const_i64(loop_end), "k") as k:
                step(k, b_vector)
        if b_last is not None:
            step(const_i64(k_extent - 1), b_last)
        self._begin_epilogue()
        # one vector of padding: the vectorized epilogue may load a vector from any element
        if tile is None:
            tile = alloca_once(b, ir.ArrayType(F32, (mr * nv + 1) * self.vl), name="tile")
            tile_f = b.bitcast(tile, F32.as_pointer())
        else:
            tile_f = tile
        for i in range(mr):
            for v in range(nv):
                b.store(b.load(accs[i * nv + v]),
                        self._vec_ptr(tile_f, const_i64((i * nv + v) * self.vl)), align=4)
        return tile_f
