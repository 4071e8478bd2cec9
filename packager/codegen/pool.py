"""Vectorized pooling kernels: 2-D max pooling, and global average pooling (a mean over the
trailing axes, SE blocks' squeeze).

Max pooling: a vectorized kernel for 2-D max pooling (NCHW float32, stride 1 or 2, any window, padding and
dilation), tagged ``max_pool2d`` by its legalizer (see ``ir.patterns``); the same kernel on
uint8 / int8 planes (a quantized model's MaxPool, passes/fuse_qdq_layout.py): 4x the lanes per
vector, byte maxima (``vpmaxub`` / ``vpmaxsb``), the type's least value in the margins instead of
-inf, no NaN, and a row's partial last vector stored as an overlapping whole one.

Each task takes whole (image, channel) planes and computes the window's maximum separably, one
output row at a time: first the maximum over the window's rows of every input column (whole
input vectors, plain loads; a window row outside the image reads a -inf row) into the task's
-inf-margined row buffer (for stride 2 split by column parity, so that every tap is one plain
load), then each output vector's maximum over the window's columns of those, stored straight to
the output. A k x k window costs 2k vector maxima per output vector, not k^2. The running
maximum is maxps plus a NaN flag (one unordered compare per two values), NaN-propagating as
the generic reduction.

Global average pooling (``sum over the trailing axes [* or / a constant]``, a GlobalAveragePool
or ReduceMean over H, W): each output sums its contiguous run of L inputs with four vector
accumulators (the generic loop nest adds one float at a time: a float add's latency per
element; EfficientNet-B0's 16 SE squeezes took 1.3 ms, ORT 0.5), the run's last L % vl values
one by one, then the lanes.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ir.sym import product
from .conv_oc import OPEN_IMAGE_PIXELS
from .helpers import F32, I1, I8, I32, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelEmitter, KernelInfo, _plan_stages

# Outputs per kernel below which it stays on one thread (a few microseconds of work).
PARALLEL_MIN_OUTPUTS = 1 << 14
# Inputs a global mean reads below which it stays on one thread.
MEAN_PARALLEL_MIN_INPUTS = 1 << 16
# Workspace regions (one per task) for the row maxima; tasks beyond them get no planes.
MAX_TASK_REGIONS = 8
# Float vectors of at least this many lanes take narrower vectors on narrow rows and an
# overlapping last vector (MaxPoolEmitter.overlap)
FLOAT_OVERLAP_LANES = 16
# the max pool's element types (8-bit ones: passes/fuse_qdq_layout.py)
POOL_DTYPES = ("float32", "uint8", "int8")


def _one_float32_stage(func: PrimFunc, dtypes: tuple[str, ...] = ("float32",)
                       ) -> tuple[te.Tensor, te.Expr] | None:
    """(output, body) when ``func`` is one float32 input to one float32 output computed with
    no materialized stage: what both pooling kernels start from (``dtypes``: the max pool
    also takes 8-bit integers)."""
    if len(func.outputs) != 1 or func.outputs[0].dtype not in dtypes or len(func.inputs) != 1:
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    return outputs[0]


def match_max_pool(func: PrimFunc):
    """(output, tag) if ``func`` is exactly one tagged float32 (or uint8 / int8) max pool this
    kernel handles."""
    stage = _one_float32_stage(func, POOL_DTYPES)
    if stage is None:
        return None
    out, body = stage
    if not isinstance(body, te.Reduce):
        return None
    tag = reduction_tag(body)
    if tag is None or tag.kind != "max_pool2d":
        return None
    (x,) = tag.operands
    if x.uid != func.inputs[0].uid or x.dtype != out.dtype or len(x.shape) != 4:
        return None
    if any(s not in (1, 2) for s in tag.attrs["strides"]):
        return None
    return out, tag


def _round16(floats):
    """``floats`` rounded up to a multiple of 16 (64 bytes); an int or a size expression."""
    return (floats + 15) // 16 * 16


class MaxPoolEmitter(KernelEmitter):
    """The max pool kernel, with static extents or (``size_vars``, a symbolic module) with
    sizes read at run time: the same code either way, every extent an ``_dim_value``. Only the
    workspace layout differs: a symbolic kernel's is an expression every target shares (a fat
    bundle's variants have one workspace size), so it bounds the vector width by 16."""

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor, tag,
                 vl: int, size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.out, self.tag = out, tag
        # 8-bit planes: bytes, 4x the float lanes per vector
        self.dtype = tag.operands[0].dtype
        self.ints = self.dtype != "float32"
        self.elt, self.esize = (I8, 1) if self.ints else (F32, 4)
        self.vl = vl * 4 if self.ints else vl
        self.vty = ir.VectorType(self.elt, self.vl)
        self.vl_bound = (64 if self.ints else 16) if self.symbolic else self.vl
        # Rows narrower than a step take narrower vectors and an overlapping last one (the same
        # values again): bytes at any width, floats at 16 lanes (YOLOv8n's SPPF 5x5 pools on
        # 10x10 planes ran every column of the vertical pass scalar: 17 us against OpenVINO's
        # 4). Floats at 8 lanes keep their pieces (x86-64-v3 bundles unchanged).
        self.overlap = self.ints or self.vl >= FLOAT_OVERLAP_LANES
        # the input as bf16 pair words (passes/bf16_pairs.py: a bf16 convolution's output read
        # by nothing but this pool): plane j of [N, C / 2, H, W] 32-bit words holds channels 2j
        # (low half) and 2j + 1; each load widens its plane's half (exact), so the output is the
        # float32 max pool of the bf16-rounded input, which equals bf16 of the float32 max pool
        self.words = bool(func.attrs.get("bf16_pairs_in"))
        if self.words and (self.ints or self.symbolic):
            raise ValueError("a max pool of pair words needs float32 and static shapes")
        self._half = 0   # (words) the half of the plane being emitted: 0 low, 1 high

    def emit(self) -> KernelInfo:
        x_t = self.tag.operands[0]
        workspace = MAX_TASK_REGIONS * self._region_floats() * self.esize
        body_fn, ptr_types = self._begin_body([x_t, self.out], workspace=True)
        x_ptr, out_ptr, ws = body_fn.args[:3]
        task, ntasks = body_fn.args[len(ptr_types)], body_fn.args[len(ptr_types) + 1]
        ws = self.builder.bitcast(ws, self.elt.as_pointer()) if self.ints \
            else b_f32(self.builder, ws)
        self._emit_body(x_ptr, out_ptr, ws, task, ntasks)
        self.builder.ret_void()
        self._emit_entry(body_fn, len(ptr_types), ptr_types)
        if self.symbolic:   # parallel where 32 x 32 outputs per plane would be; see _tasks
            c = self.out.shape[1]
            parallel = isinstance(c, int) and c * 1024 >= PARALLEL_MIN_OUTPUTS
            return KernelInfo(self.symbol, 1, 1, 0, parallel, symbolic=True,
                              workspace_expr=workspace)
        return KernelInfo(self.symbol, 1, 1, workspace,
                          product(self.out.shape) >= PARALLEL_MIN_OUTPUTS)

    def _row_buffer_floats(self):
        """One input row with -inf margins (for stride 2, each of its two column-parity
        halves): every column a tap of a full output vector reads, and every column the row's
        copy writes. An int, or (symbolic) a size expression bounding it for every vl <= 16."""
        attrs = self.tag.attrs
        kw, sw, dw = attrs["kernel"][1], attrs["strides"][1], attrs["dilation"][1]
        w, ow, pl = self.tag.operands[0].shape[3], self.out.shape[3], attrs["padding"][1]
        taps = ((kw - 1) * dw) // sw + 1
        if not self.symbolic:
            reach = -(-ow // self.vl) * self.vl + taps
            return _round16(max(reach, (w + pl) // sw + 2)) + 16
        return _round16(ow + self.vl_bound + taps + (w + pl) // sw + 2) + 16

    def _inf_row_floats(self):
        """A row of -inf as wide as an input row: what the window's rows outside the image
        read."""
        return _round16(self.tag.operands[0].shape[3]) + 16

    def _region_floats(self):
        """One task's row buffer(s), then its -inf row."""
        return self.tag.attrs["strides"][1] * self._row_buffer_floats() + self._inf_row_floats()

    def _lanes(self, ty: ir.Type, values) -> ir.Constant:
        return ir.Constant(ir.VectorType(ty, len(values)), list(values))

    def _byte_width(self, columns) -> int:
        """The lanes a step over a row of ``columns`` (static) takes: the widest of vl,
        vl / 2, ... (at least 16 bytes, or 4 floats) that fits in it, so that a row shorter
        than a step is whole vectors and an overlapping last one, not elements one by one (64
        lanes at x86-64-v4: ResNet-18's 112-wide stem pool on bytes went scalar, 158 us
        against fp32's 71). vl where nothing fits, for run-time widths, or without
        ``overlap``."""
        if not self.overlap or not isinstance(columns, int):
            return self.vl
        vl, least = self.vl, 16 if self.ints else 4
        while vl > least and vl > columns:
            vl //= 2
        return vl if vl <= columns else self.vl

    def _splat_i32(self, v: ir.Value) -> ir.Value:
        b, vec = self.builder, ir.VectorType(I32, self.vl)
        v = b.insert_element(ir.Constant(vec, None), b.trunc(v, I32), ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(vec, None), self._lanes(I32, [0] * self.vl))

    def _max_nan(self, values):
        """The maximum of ``values`` (vectors or scalars), NaN if any is NaN: a chain of
        ``v > acc ? v : acc`` (one maxps each) and one unordered compare per pair of values
        (llvm.maximum costs five instructions on AVX2; the -0/+0 order is not kept, as ONNX
        Runtime's pool does not keep it). 8-bit values: the plain maximum."""
        b = self.builder
        acc = values[0]
        if self.ints:
            cmp = b.icmp_unsigned if self.dtype == "uint8" else b.icmp_signed
            for v in values[1:]:
                acc = b.select(cmp(">", v, acc), v, acc)
            return acc
        for v in values[1:]:
            acc = b.select(b.fcmp_ordered(">", v, acc), v, acc)
        nan = None
        for j in range(0, len(values), 2):
            u = b.fcmp_unordered("uno", values[j], values[min(j + 1, len(values) - 1)])
            nan = u if nan is None else b.or_(nan, u)
        ty = values[0].type
        qnan = ir.Constant(ty, [float("nan")] * ty.count) if isinstance(ty, ir.VectorType) \
            else ir.Constant(ty, float("nan"))
        return b.select(nan, qnan, acc)

    def _vertical_row(self, rows, bufs, w, pl: int, sw: int, vl: int) -> None:
        """The maximum over the window's input rows ``rows`` (row pointers; rows outside the
        image point at the -inf row) of columns 0..w, into the row buffer(s) at padded column
        pl + x (for stride 2, into buffer (pl + x) % 2 at (pl + x) // 2): whole vectors (two,
        split into even and odd lanes, for stride 2), then the last columns one by one
        (unrolled when ``w`` is static; ``w`` is an int or an i64 value; 8-bit values: an
        overlapping last vector where the row has one; ``vl`` lanes a vector)."""
        b = self.builder
        vty = ir.VectorType(self.elt, vl)
        w_v = const_i64(w) if isinstance(w, int) else w

        def vmax(i):
            return self._max_nan([
                self._widen(b.load(b.bitcast(b.gep(r, [i], inbounds=True),
                                             self._load_ty(vty).as_pointer()),
                                   align=self.esize))
                for r in rows])

        def one(i):
            dst = b.gep(bufs[0], [b.add(i, const_i64(pl))], inbounds=True)
            b.store(vmax(i), b.bitcast(dst, vty.as_pointer()), align=self.esize)

        def two(i, m_of):   # columns i .. i + 2 vl (i even); m_of(): i / 2
            # x[2m] -> padded column pl + 2m, x[2m + 1] -> pl + 2m + 1
            even_buf, even_off = bufs[pl % 2], pl // 2
            odd_buf, odd_off = bufs[(pl + 1) % 2], (pl + 1) // 2
            lo_v, hi_v = vmax(i), vmax(b.add(i, const_i64(vl)))
            m = m_of()
            for buf, off, first in ((even_buf, even_off, 0), (odd_buf, odd_off, 1)):
                v = b.shuffle_vector(lo_v, hi_v, self._lanes(I32, range(first, 2 * vl, 2)))
                dst = b.gep(buf, [b.add(m, const_i64(off))], inbounds=True)
                b.store(v, b.bitcast(dst, vty.as_pointer()), align=self.esize)

        if sw == 1:
            full = b.sdiv(w_v, const_i64(vl))
            with for_range(b, const_i64(0), full, "cv") as q:
                one(b.mul(q, const_i64(vl)))
        else:
            full = b.sdiv(w_v, const_i64(2 * vl))
            with for_range(b, const_i64(0), full, "cv") as q:
                two(b.mul(q, const_i64(2 * vl)), lambda: b.mul(q, const_i64(vl)))
        tail = 0
        if self.overlap and isinstance(w, int) and w % (sw * vl):
            # the row's last whole vector(s) again, overlapping (the same values), in place
            # of up to 2 vl - 1 columns one by one (ResNet's 112-wide stem pool on bytes: 48)
            last = w - sw * vl
            last -= last % sw                   # stride 2: an even first column
            if last >= 0:
                if sw == 1:
                    one(const_i64(last))
                else:
                    two(const_i64(last), lambda: const_i64(last // 2))
                if last + sw * vl >= w:
                    return
                tail = last + sw * vl   # stride 2 on an odd width: the last column alone
        step = vl * sw

        def smax(x):
            ptrs = [b.gep(r, [x], inbounds=True) for r in rows]
            if self.words:
                ptrs = [b.bitcast(q, I32.as_pointer()) for q in ptrs]
            return self._max_nan([self._widen(b.load(q)) for q in ptrs])

        if isinstance(w, int):
            for x in range(tail or w // step * step, w):   # < sw * vl columns, unrolled
                j = pl + x
                b.store(smax(const_i64(x)),
                        b.gep(bufs[j % sw], [const_i64(j // sw)], inbounds=True))
            return
        with for_range(b, b.mul(full, const_i64(step)), w_v, "ct") as x:
            j = b.add(x, const_i64(pl))
            if sw == 1:
                dst = b.gep(bufs[0], [j], inbounds=True)
            else:
                odd = b.trunc(b.and_(j, const_i64(1)), I1)
                dst = b.gep(b.select(odd, bufs[1], bufs[0]), [b.ashr(j, const_i64(1))],
                            inbounds=True)
            b.store(smax(x), dst)

    def _load_ty(self, vty: ir.VectorType) -> ir.VectorType:
        return ir.VectorType(I32, vty.count) if self.words else vty

    def _widen(self, value: ir.Value) -> ir.Value:
        """A loaded input value (``words``: its pair words' half ``_half`` as float32, the low
        one shifted up, the high one masked); else unchanged."""
        if not self.words:
            return value
        b = self.builder
        vec = isinstance(value.type, ir.VectorType)
        n = value.type.count if vec else 1
        const = (lambda x: ir.Constant(ir.VectorType(I32, n), [x] * n)) if vec \
            else (lambda x: ir.Constant(I32, x))
        bits = b.and_(value, const(-65536)) if self._half else b.shl(value, const(16))
        return b.bitcast(bits, ir.VectorType(F32, n) if vec else F32)

    def _tasks(self, ntasks: ir.Value, outputs: ir.Value) -> ir.Value:
        """Tasks that get planes: every task up to MAX_TASK_REGIONS (a static kernel is only
        called on several when it has outputs enough); a symbolic one with fewer than
        PARALLEL_MIN_OUTPUTS outputs keeps to one."""
        b = self.builder
        nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                      const_i64(MAX_TASK_REGIONS))
        if not self.symbolic:
            return nt
        few = b.icmp_signed("<", outputs, const_i64(PARALLEL_MIN_OUTPUTS))
        return b.select(few, const_i64(1), nt)

    def _emit_body(self, x_ptr, out_ptr, ws, task, ntasks) -> None:
        """Separably, one output row at a time: the maximum over the window's rows of each
        input column (plain loads of whole input rows; rows outside the image read a -inf row)
        into the task's row buffer(s) (-inf margins; split by column parity for stride 2),
        then each output vector's maximum over the window's columns of those, one plain load
        a tap, stored straight to the output. A k x k window costs 2k maxima per output
        vector, not k^2. (Masked loads at the borders and a shuffle per tap for stride 2 made
        ResNet-18's 3x3/2 stem pool 6x ONNX Runtime's time on AVX2; taking the columns' maxima
        of every input row first, then the rows', split twice as many input rows by parity
        and went through a workspace image of row maxima: 1.3x the time of this order.)"""
        b, vl = self.builder, self.vl
        x_shape = self.tag.operands[0].shape
        n, c, h, w = (self._dim_value(d) for d in x_shape)
        w_static = x_shape[3]
        oh, ow = self._dim_value(self.out.shape[2]), self._dim_value(self.out.shape[3])
        attrs = self.tag.attrs
        kh, kw = attrs["kernel"]
        sh, sw = attrs["strides"]
        pt, pl = attrs["padding"][0], attrs["padding"][1]
        dh, dw = attrs["dilation"]
        planes = b.mul(n, c)
        nt = self._tasks(ntasks, b.mul(planes, b.mul(oh, ow)))
        kind = "i8" if self.ints else "f32"
        store = intrinsic(self.module, f"llvm.masked.store.v{vl}{kind}.p0", ir.VoidType(),
                          [self.vty, self.vty.as_pointer(), I32, ir.VectorType(I1, vl)])
        buf_floats = self._dim_value(self._row_buffer_floats())
        if self.ints:       # the type's least value: never above a value of the image
            ninf = ir.Constant(I8, 0 if self.dtype == "uint8" else -128)
        else:
            ninf = ir.Constant(F32, float("-inf"))

        with b.if_then(b.icmp_signed("<", task, nt)):
            region = b.gep(ws, [b.mul(task, self._dim_value(self._region_floats()))],
                           inbounds=True)
            # the row buffer(s): columns -pl.. of the padded row; for stride 2 split by
            # column parity (buffer 0: padded columns 0, 2, 4, ...; buffer 1: 1, 3, 5, ...),
            # so that every tap of an output vector is one plain load. The margins stay -inf,
            # as does the -inf row after them.
            bufs = [b.gep(region, [b.mul(buf_floats, const_i64(i))], inbounds=True)
                    for i in range(sw)]
            inf_row = b.gep(region, [b.mul(buf_floats, const_i64(sw))], inbounds=True)
            with for_range(b, const_i64(0), self._dim_value(self._region_floats()),
                           "fill") as j:
                b.store(ninf, b.gep(region, [j], inbounds=True))
            if self.words:   # the -inf row as words: bf16 -inf in both halves
                inf_words = b.bitcast(inf_row, I32.as_pointer())
                with for_range(b, const_i64(0), const_i64(self._inf_row_floats()),
                               "fillw") as j:
                    b.store(ir.Constant(I32, -8323200),   # 0xff80ff80
                            b.gep(inf_words, [j], inbounds=True))
                inf_row = b.bitcast(inf_row, F32.as_pointer())
            lo = b.sdiv(b.mul(task, planes), nt)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), planes), nt)

            def plane_rows(x_plane, o_plane) -> None:
                with for_range(b, const_i64(0), oh, "oy") as oy:
                    rows = []
                    for ky in range(kh):
                        iy = b.add(b.mul(oy, const_i64(sh)), const_i64(ky * dh - pt))
                        ok = b.and_(b.icmp_signed(">=", iy, const_i64(0)),
                                    b.icmp_signed("<", iy, h))
                        row = b.gep(x_plane, [b.mul(b.select(ok, iy, const_i64(0)), w)],
                                    inbounds=True)
                        rows.append(b.select(ok, row, inf_row))
                    o_row = b.gep(o_plane, [b.mul(oy, ow)], inbounds=True)
                    w_row = w_static if isinstance(w_static, int) else w
                    self._vertical_row(rows, bufs, w_row, pl, sw,
                                       self._byte_width(w_row // sw) if isinstance(w_row, int)
                                       else vl)
                    ow_static = self.out.shape[3]
                    vlo = self._byte_width(ow_static)
                    voty = ir.VectorType(self.elt, vlo)

                    def out_vector(q):
                        return out_vector_at(b.mul(q, const_i64(vlo)))

                    def out_vector_at(ox0):
                        taps = []
                        for kx in range(kw):
                            t = kx * dw          # padded column sw * ox + t
                            src = b.gep(bufs[t % sw], [b.add(ox0, const_i64(t // sw))],
                                        inbounds=True)
                            taps.append(b.load(b.bitcast(src, voty.as_pointer()),
                                               align=self.esize))
                        dst = b.bitcast(b.gep(o_row, [ox0], inbounds=True),
                                        voty.as_pointer())
                        return ox0, self._max_nan(taps), dst

                    # full vectors with plain stores (a masked store is microcoded on AMD's
                    # AVX2 cores: ResNet-18's 3x3/2 stem pool took 6x ORT's time), the
                    # row's partial last vector masked
                    full = b.sdiv(ow, const_i64(vlo))
                    with for_range(b, const_i64(0), full, "ov") as q:
                        _, acc, dst = out_vector(q)
                        b.store(acc, dst, align=self.esize)
                    if isinstance(ow_static, int) and not ow_static % vlo:
                        return
                    if self.overlap and isinstance(ow_static, int) and ow_static > vlo:
                        # the row's last whole vector, overlapping the one before (the same
                        # values there; bytes have no masked store on AVX2)
                        _, acc, dst = out_vector_at(const_i64(ow_static - vlo))
                        b.store(acc, dst, align=self.esize)
                        return
                    with b.if_then(b.icmp_signed("<", b.mul(full, const_i64(vl)), ow)):
                        ox0, acc, dst = out_vector(full)
                        lanes = b.add(self._splat_i32(ox0), self._lanes(I32, range(vl)))
                        mask = b.icmp_signed("<", lanes, self._splat_i32(ow))
                        b.call(store, [acc, dst, ir.Constant(I32, self.esize), mask])
            with for_range(b, lo, hi, "plane") as p:
                if self.words:   # plane p: the words of pair p // 2, its half p % 2
                    x_plane = b.gep(b.bitcast(x_ptr, I32.as_pointer()),
                                    [b.mul(b.sdiv(p, const_i64(2)), b.mul(h, w))],
                                    inbounds=True)
                    x_plane = b.bitcast(x_plane, F32.as_pointer())
                    odd = b.icmp_signed("!=", b.srem(p, const_i64(2)), const_i64(0))
                else:
                    x_plane = b.gep(x_ptr, [b.mul(p, b.mul(h, w))], inbounds=True)
                o_plane = b.gep(out_ptr, [b.mul(p, b.mul(oh, ow))], inbounds=True)
                if not self.words:
                    plane_rows(x_plane, o_plane)
                else:   # each half with code of its own: one instruction widens a load
                    with b.if_else(odd) as (high, low):
                        for branch, half in ((high, 1), (low, 0)):
                            with branch:
                                self._half = half
                                plane_rows(x_plane, o_plane)


def b_f32(b: ir.IRBuilder, ws: ir.Value) -> ir.Value:
    return b.bitcast(ws, F32.as_pointer())


def match_global_mean(func: PrimFunc, sized: bool = False):
    """(output, scale op or None, scale constant) if ``func`` is exactly ``sum(x[outer...,
    r...]) [* or / c]`` over x's trailing axes, the output's leading axes indexing x's leading
    ones in order (float32, nothing else fused). ``sized``: run-time extents too (a mean over a
    run-time count divides by it: the scale a size expression, op "div")."""
    stage = _one_float32_stage(func)
    if stage is None:
        return None
    out, body = stage
    op, scale = None, 1.0
    if isinstance(body, te.Binary) and body.op in ("mul", "div") \
            and isinstance(body.b, te.Const) and body.dtype == "float32":
        op, scale, body = body.op, float(body.b.value), body.a
    elif sized and isinstance(body, te.Binary) and body.op == "div" \
            and body.dtype == "float32" and isinstance(body.b, te.Cast) \
            and isinstance(body.b.value, te.Const) and body.b.value.dtype == "int64":
        op, scale, body = "div", body.b.value.value, body.a     # ops/nn.py's run-time count
    if not (isinstance(body, te.Reduce) and body.combiner == "sum"
            and isinstance(body.body, te.Read) and body.dtype == "float32"):
        return None
    x, read = func.inputs[0], body.body
    if read.tensor.uid != x.uid or x.dtype != "float32":
        return None
    if sized:
        if all(isinstance(d, int) for d in x.shape + out.shape) or \
                any(isinstance(d, int) and d <= 0 for d in x.shape + out.shape):
            return None
    elif not all(isinstance(d, int) and d > 0 for d in x.shape + out.shape):
        return None   # run-time or empty extents: the loop nest (or ``sized``)
    k = len(x.shape) - len(body.axes)
    lead, trail = read.indices[:k], read.indices[k:]
    if k < 0 or tuple(trail) != tuple(body.axes) or \
            any(a.extent != d for a, d in zip(body.axes, x.shape[k:])):
        return None
    # the leading indices: the output's axes of extent > 1, in order, as x's leading dims
    # (with run-time extents: those not known to be 1)
    big = [a for a in out.axes if not isinstance(a.extent, int) or a.extent > 1]
    if not all(isinstance(i, te.IndexVar) and i.extent == d or isinstance(i, te.Const) and d == 1
               for i, d in zip(lead, x.shape[:k])):
        return None
    used = [i for i in lead if isinstance(i, te.IndexVar)
            and (not isinstance(i.extent, int) or i.extent > 1)]
    # x's leading dims in the output's order: element o of the output sums run o of x
    if [id(i) for i in used] != [id(a) for a in big]:
        return None
    return (out, op, scale, k) if sized else (out, op, scale)


def match_global_mean_quantize(func: PrimFunc):
    """(the mean's ``match_global_mean`` with run-time extents, whether the quantize divides)
    when ``func`` is ops/quant.py's ``quantize(mean(x), s, z)`` of one scale and one zero
    point (``fuse_ops`` fuses a squeeze-and-excitation mean's quantize in where the sizes are
    open: passes/fuse.py ``_is_open_mean_quantize``), else None."""
    from .qelementwise import _quantized_read   # the quantize's form, one home
    if len(func.inputs) != 3 or len(func.outputs) != 1:
        return None
    x, s, z = func.inputs
    out = func.outputs[0]
    if (out.dtype not in ("int8", "uint8") or z.dtype != out.dtype or s.dtype != "float32"
            or len(s.shape) != 0 or len(z.shape) != 0
            or all(isinstance(d, int) for d in out.shape)):
        return None
    v = _quantized_read(out, s, z)
    if not (isinstance(v, te.Read) and v.tensor.body is not None
            and tuple(v.indices) == tuple(out.axes)):
        return None
    mean = match_global_mean(PrimFunc(func.name, [x], [v.tensor]), sized=True)
    if mean is None:
        return None
    divides = any(isinstance(n, te.Binary) and n.op == "div" and isinstance(n.b, te.Read)
                  and n.b.tensor.uid == s.uid for n in te.walk(out.body))
    return mean, divides


class GlobalMeanEmitter(KernelEmitter):
    """The global mean; with ``size_vars`` (run-time extents) the outputs and the run length
    are read at run time (``_emit_open``)."""

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, out: te.Tensor,
                 op: str | None, scale, vl: int, size_vars: tuple[str, ...] = (),
                 lead: int = 0) -> None:
        super().__init__(module, func, symbol, size_vars)
        self.out, self.op, self.scale, self.vl = out, op, scale, vl
        self.lead = lead    # x's leading (not summed) dims: run-time extents
        self.vty = ir.VectorType(F32, vl)
        self.quant = None   # (divides,) when a quantize follows (``match_global_mean_quantize``)

    def emit(self) -> KernelInfo:
        if self.symbolic:
            return self._emit_open()
        x = self.func.inputs[0]
        body_fn, ptr_types = self._begin_body([x, self.out], workspace=False)
        x_ptr, out_ptr, task, ntasks = body_fn.args[:4]
        outer = 1
        for d in self.out.shape:
            outer *= d
        total = 1
        for d in x.shape:
            total *= d
        self.length = total // outer
        b = self.builder
        lo = b.sdiv(b.mul(task, const_i64(outer)), ntasks)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(outer)), ntasks)
        with for_range(b, lo, hi, "o") as o:
            run = b.gep(x_ptr, [b.mul(o, const_i64(self.length))], inbounds=True)
            total_v = self._sum(run)
            if self.op == "mul":
                total_v = b.fmul(total_v, ir.Constant(F32, self.scale))
            elif self.op == "div":
                total_v = b.fdiv(total_v, ir.Constant(F32, self.scale))
            b.store(total_v, b.gep(out_ptr, [o], inbounds=True))
        b.ret_void()
        self._emit_entry(body_fn, 2, ptr_types)
        # its own choice: the rule's row ("max pool", the rule that tries both) misnamed it
        return KernelInfo(self.symbol, 1, 1, 0, total >= MEAN_PARALLEL_MIN_INPUTS,
                          choice="global mean, up to 4 vector accumulators")

    def _emit_open(self) -> KernelInfo:
        """``emit`` with run-time extents: the outputs and each one's run length from the
        sizes; the run summed ``_sum_open``; a mean over a run-time count divides by it.
        Split over threads where an image of ``OPEN_IMAGE_PIXELS`` per output would be."""
        x = self.func.inputs[0]
        if self.quant is None:
            body_fn, ptr_types = self._begin_body([x, self.out], workspace=False)
            x_ptr, out_ptr = body_fn.args[:2]
        else:
            qs, qz = self.func.inputs[1:]
            y = self.func.outputs[0]
            body_fn, ptr_types = self._begin_body([x, qs, qz, y], workspace=False)
            x_ptr, s_ptr, z_ptr, out_ptr = body_fn.args[:4]
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        outer = self._dim_value(product(self.out.shape))
        run_len = self._dim_value(product(x.shape[self.lead:]))
        scale = (ir.Constant(F32, self.scale) if isinstance(self.scale, float)
                 else b.sitofp(self._dim_value(self.scale), F32))
        static = product(d for d in self.out.shape if isinstance(d, int))
        parallel = static * OPEN_IMAGE_PIXELS >= MEAN_PARALLEL_MIN_INPUTS
        lo = b.sdiv(b.mul(task, outer), ntasks)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), outer), ntasks)
        with for_range(b, lo, hi, "o") as o:
            run = b.gep(x_ptr, [b.mul(o, run_len)], inbounds=True)
            total_v = self._sum_open(run, run_len)
            if self.op == "mul":
                total_v = b.fmul(total_v, scale)
            elif self.op == "div":
                total_v = b.fdiv(total_v, scale)
            if self.quant is not None:
                total_v = self._quantize(total_v, s_ptr, z_ptr, y.dtype)
            b.store(total_v, b.gep(out_ptr, [o], inbounds=True))
        b.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        choice = "global mean, 4 vector accumulators, run length read at run time"
        if self.quant is not None:
            choice += ", quantized"
        return KernelInfo(self.symbol, len(self.func.inputs), 1, 0, parallel, symbolic=True,
                          choice=choice)

    def _quantize(self, v: ir.Value, s_ptr: ir.Value, z_ptr: ir.Value, dtype: str
                  ) -> ir.Value:
        """ops/quant.py's quantize of one float32 mean, its operations in order:
        min(max(roundeven(v / s) + float32(z), lo), hi), converted to the 8-bit type."""
        b = self.builder
        lo, hi = (-128.0, 127.0) if dtype == "int8" else (0.0, 255.0)
        if self.quant[0]:
            v = b.fdiv(v, b.load(s_ptr))
        rnd = intrinsic(self.module, "llvm.roundeven.f32", F32, [F32])
        zv = b.load(z_ptr)
        zf = b.sitofp(zv, F32) if dtype == "int8" else b.uitofp(zv, F32)
        r = b.fadd(b.call(rnd, [v]), zf)
        r = b.select(b.fcmp_ordered(">", r, ir.Constant(F32, lo)), r, ir.Constant(F32, lo))
        r = b.select(b.fcmp_ordered("<", r, ir.Constant(F32, hi)), r, ir.Constant(F32, hi))
        return b.trunc(b.fptosi(r, I32), I8)

    def _sum_open(self, run: ir.Value, n: ir.Value) -> ir.Value:
        """``_sum`` of a run of run-time length ``n``: blocks of 4 vectors, then vectors,
        then the last n % vl values one by one."""
        b, vl = self.builder, self.vl
        zero = ir.Constant(self.vty, [0.0] * vl)

        def load(offset):
            ptr = b.bitcast(b.gep(run, [offset], inbounds=True), self.vty.as_pointer())
            return b.load(ptr, align=4)

        slots = [alloca_once(b, self.vty, name=f"macc{i}") for i in range(4)]
        for slot in slots:
            b.store(zero, slot)
        blocks = b.udiv(n, const_i64(4 * vl))
        with for_range(b, const_i64(0), blocks, "mb") as blk:
            base = b.mul(blk, const_i64(4 * vl))
            for i, slot in enumerate(slots):
                b.store(b.fadd(b.load(slot), load(b.add(base, const_i64(i * vl)))), slot)
        vecs = b.udiv(n, const_i64(vl))
        with for_range(b, b.mul(blocks, const_i64(4)), vecs, "mv") as v:
            b.store(b.fadd(b.load(slots[0]), load(b.mul(v, const_i64(vl)))), slots[0])
        acc = b.load(slots[0])
        for slot in slots[1:]:
            acc = b.fadd(acc, b.load(slot))
        total = b.extract_element(acc, ir.Constant(I32, 0))
        for lane in range(1, vl):
            total = b.fadd(total, b.extract_element(acc, ir.Constant(I32, lane)))
        tot = alloca_once(b, F32, "mtail")
        b.store(total, tot)
        with for_range(b, b.mul(vecs, const_i64(vl)), n, "mt") as j:
            b.store(b.fadd(b.load(tot), b.load(b.gep(run, [j], inbounds=True))), tot)
        return b.load(tot)

    def _sum(self, run: ir.Value) -> ir.Value:
        b, vl, n = self.builder, self.vl, self.length
        zero = ir.Constant(self.vty, [0.0] * vl)
        nacc = 4 if n >= 4 * vl else max(1, n // vl)
        accs = [zero] * nacc
        blocks = n // (nacc * vl)

        def load(offset):
            ptr = b.bitcast(b.gep(run, [offset], inbounds=True), self.vty.as_pointer())
            return b.load(ptr, align=4)

        if blocks:
            slots = [alloca_once(b, self.vty, name=f"macc{i}") for i in range(nacc)]
            for slot in slots:
                b.store(zero, slot)
            with for_range(b, const_i64(0), const_i64(blocks), "mb") as blk:
                base = b.mul(blk, const_i64(nacc * vl))
                for i, slot in enumerate(slots):
                    b.store(b.fadd(b.load(slot), load(b.add(base, const_i64(i * vl)))), slot)
            accs = [b.load(slot) for slot in slots]
        done = blocks * nacc * vl
        i = 0
        while done + vl <= n:
            accs[i % nacc] = b.fadd(accs[i % nacc], load(const_i64(done)))
            done += vl
            i += 1
        acc = accs[0]
        for a in accs[1:]:
            acc = b.fadd(acc, a)
        total = b.extract_element(acc, ir.Constant(I32, 0))
        for lane in range(1, vl):
            total = b.fadd(total, b.extract_element(acc, ir.Constant(I32, lane)))
        for j in range(done, n):
            total = b.fadd(total, b.load(b.gep(run, [const_i64(j)], inbounds=True)))
        return total


def emit_max_pool(module: ir.Module, func: PrimFunc, symbol: str, vl: int
                  ) -> KernelInfo | None:
    """The pooling kernels: a max pool, or a global mean (the rule table's "max pool" entry
    tries both)."""
    match = match_max_pool(func)
    if match is not None:
        return MaxPoolEmitter(module, func, symbol, *match, vl).emit()
    mean = match_global_mean(func)
    if mean is not None:
        return GlobalMeanEmitter(module, func, symbol, *mean, vl).emit()
    return None


# ---- max pool with run-time extents -------------------------------------------------------------

def emit_symbolic_max_pool(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                           size_vars: tuple[str, ...]) -> KernelInfo | None:
    """The max pool kernel above (-inf margined row buffers, row maxima over
    the window's columns into the workspace, then maxima over its rows; planes split over
    threads) with its sizes read at run time."""
    match = match_max_pool(func)
    if match is None:
        mean = match_global_mean(func, sized=True)
        if mean is not None:
            out, op, scale, lead = mean
            return GlobalMeanEmitter(module, func, symbol, out, op, scale, vl, size_vars,
                                     lead).emit()
        quantized = match_global_mean_quantize(func)
        if quantized is not None:
            (out, op, scale, lead), divides = quantized
            emitter = GlobalMeanEmitter(module, func, symbol, out, op, scale, vl, size_vars,
                                        lead)
            emitter.quant = (divides,)
            return emitter.emit()
        return None
    return MaxPoolEmitter(module, func, symbol, *match, vl, size_vars).emit()
