"""Integer GEMM kernels for the quantized ops of ``ops/qlinear.py`` (``qmatmul``, ``qconv2d``):
int32 accumulation, exact, with ONNX Runtime's requantization fused into the epilogue.

The microkernel keeps an MR x NV block of 8-lane int32 accumulators in registers. Every step
multiplies two consecutive reduction terms at once with ``vpmaddwd`` (AVX2,
``llvm.x86.avx2.pmadd.wd``): both operands are int16 *k-pairs*, the broadcast one a pair
``(a[m, k], a[m, k+1])`` in one int32, the vector one ``(b[k, n], b[k+1, n])`` interleaved for 8
columns n, and the instruction returns ``a[m,k] b[k,n] + a[m,k+1] b[k+1,n]`` per column, exact
(|values| <= 255, so no pair overflows int32). A ``vpaddd`` adds it to the accumulator. That is
16 multiply-adds per instruction against an fp32 FMA's 8, but on Zen 4 (measured here) it issues
at half the FMA's rate, so the integer kernels run at the fp32 kernels' multiply-add rate: the
gains are int8 weights (4x smaller bundles, faster weight-bound layers), not throughput.
``vpmaddubsw`` (u8 x s8, 32 per instruction) is not used: it saturates its int16 pair sums,
which is not exact, and widening them takes a second multiply-port instruction.

Zero points: x - x_zp is formed while packing the activations into int16 (so u8 and s8
activations take the same kernel); w - w_zp is folded into the weights at export
(``passes/fuse_qdq.py``), stored int8 when it fits, else int16.

- ``qmatmul`` x [M, K] @ W [K, N]: the weights come packed from the bundle (``ops/qlinear.
  pack_weights``: panels of 8 columns, k-pairs interleaved, int8 loaded with ``vpmovsxbw``);
  x's rows are packed to int16 pairs in the workspace; rows m are broadcast, columns are lanes.
- ``qconv2d`` (groups 1, dilation 1, any kernel / stride / padding): no im2col. The input is
  copied once into *planes* (per stride phase, x - x_zp as int16 with channels 2c and 2c+1
  interleaved per pixel, zero padding), so for a tap (ky, kx) and a channel pair the values
  needed by 8 consecutive flattened outputs ``q = oy * Wq + ox`` are one contiguous 32-byte
  load; the weights are expanded to int16 channel pairs per output channel (broadcast), output
  channels are rows and pixels lanes. Outputs go to a uint8 staging buffer and rows of OW are
  copied out (columns ox >= OW of the plane rows are computed and dropped, as in gemm.py);
  with a ``lut8`` table folded in (a 7th input, passes/quantize_lut.py) each byte is looked up
  in its channel's row as it is copied.

Epilogue, per vector: float32(acc + bias) * multiplier, clamped to [lo - y_zp, hi - y_zp],
rounded half to even with the 1.5 * 2**23 trick (exact in that range, no libcall, any target),
+ y_zp, converted, truncated to 8 bits: ORT's ``MlasRequantizeOutput`` operation for operation.
On AVX2 with an 8-bit result the conv's accumulators start from the bias, the rounding is
``vcvtps2dq`` (round half to even, the default MXCSR mode), y_zp is added in int32 and a row's
two vectors are packed with saturating packs into one 16-byte store (``_requant_int``,
``_pack``): the same bytes, 11 vector operations fewer per row. The AVX2 int16 planes are
filled 8 pixels at a time (``_fill_pair_vectors``).

A 1x1 convolution of a 1x1 image (squeeze-and-excitation) is a matrix-vector product
(``_emit_vector``): output channels as lanes, the packed weight tiles read directly.

Targets: x86-64 with AVX2 (x86-64-v3 and v4) use the intrinsic; every other target (x86-64-v2,
aarch64) gets the same kernel with the pair product written as sext / mul / even+odd add, which
LLVM lowers to ``pmaddwd`` on SSE2 and to ``smull``/``addp`` on NEON.

AVX-512 VNNI (level ``x86-64-v4+vnni``, LLVM feature ``+avx512vnni``; int8 weights only):
``vpdpbusd`` (``_dpbusd``) on uint8 x int8 quads, 4 products summed into each int32 lane per
instruction, exact and without saturation (unlike ``vpmaddubsw``), with the +128 shift for int8
activations and a zero-point correction zp' * sum(w):
- ``qmatmul`` (``_emit_vnni``): x packed as uint8 k-quads, two k-pair rows of the bundle's
  panels interleaved per step, column sums by one more vpdpbusd with ones.
- ``qconv2d`` (``_tile_dp``, ``_vnni_weights``, ``_fill_quads``): the planes hold uint8 channel
  *quads* per pixel (x's zero point in the padding, so padding adds zp' * w, which the
  correction removes), the bundle's k-pair weights are regrouped into int8 channel quads with
  each output channel's weight sum in the workspace on each call (as the AVX2 path widens them
  to int16), the same 6 x 2 register tile and epilogue; or, where every level of the bundle
  runs this kernel, read as stored (``quads`` attribute: passes/quad_weights.py packed them at
  export and folded the correction into the bias).
Tests compile both (the instruction is in the assembly), run their data path with the
instruction written in portable IR (``CompileOptions.vnni_emulate``, ``MLCPACK_VNNI_EMULATE=1``
at the command line), model the conv's inner loop in numpy (tests/kernels/test_int8_gemm_vnni.py), and run
them natively only on a CPU with avx512_vnni.
aarch64+dotprod: the same quad kernels with ``sdot`` (``llvm.aarch64.neon.sdot``, two per
8-lane accumulator; int8 x int8, so uint8 x is shifted by -128 instead: ``_quad_shift``), run
under qemu-aarch64 in the tests.
Not done: VNNI/sdot depthwise, AVX-VNNI (VEX, no AVX-512), 512-bit vectors, ``udot``/``usdot``.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ops.qlinear import CONV_ROWS, PANEL
from ..ops.quant import saturation_range
from .helpers import F32, I8, I16, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .lower import WORKSPACE_ALIGN, KernelEmitter, KernelInfo, LoweringError

V8I32 = ir.VectorType(I32, PANEL)
V16I16 = ir.VectorType(I16, 2 * PANEL)
V16I32 = ir.VectorType(I32, 2 * PANEL)
V8F32 = ir.VectorType(F32, PANEL)
V8I8 = ir.VectorType(I8, PANEL)
V16I8 = ir.VectorType(I8, 2 * PANEL)
_MAGIC = 12582912.0   # 1.5 * 2**23: (f + M) - M rounds half to even for |f| < 2**22


def match_qgemm(func: PrimFunc, kinds: tuple[str, ...] = ("qmatmul", "qconv2d")):
    """(kind, tag) when ``func`` is one of the integer ops ``kinds`` (an opaque op, so its
    inputs are the op's arguments in order), else None."""
    if len(func.outputs) != 1:
        return None
    stack = [func.outputs[0]]
    seen = set()
    while stack:
        t = stack.pop()
        if t.uid in seen or t.body is None:
            continue
        seen.add(t.uid)
        for node in te.walk(t.body):
            if isinstance(node, te.Reduce):
                tag = reduction_tag(node)
                if tag is not None and tag.kind in kinds:
                    if [o.uid for o in tag.operands] != [i.uid for i in func.inputs]:
                        return None
                    if any(not isinstance(d, int) for d in func.outputs[0].shape):
                        return None
                    return tag.kind, tag
            if isinstance(node, te.Read):
                stack.append(node.tensor)
    return None


def _align(n: int) -> int:
    return -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


def emit_qgemm(module: ir.Module, func: PrimFunc, symbol: str, vl: int, features: str = "",
               vnni_emulate: bool = False) -> KernelInfo | None:
    """The integer kernel of ``func`` (None when it is no qmatmul / qconv2d); ``features``:
    the target's LLVM features; ``vnni_emulate`` (``CompileOptions.vnni_emulate``)."""
    m = match_qgemm(func)
    if m is None:
        return None
    kind, tag = m
    avx2 = module.triple.startswith("x86_64") and vl >= 8
    cls = _QMatmul if kind == "qmatmul" else _QConv
    emitter = cls(module, func, symbol, tag, avx2)
    # AVX-512 VNNI: where the target's LLVM features name it (level x86-64-v4+vnni)
    emitter.vnni = avx2 and "+avx512vnni" in features
    # tests: the VNNI kernel with vpdpbusd written in portable IR, so its packing, column sums
    # and epilogue run (and are checked) on a CPU without VNNI
    emitter.vnni_emulated = vnni_emulate
    # aarch64 with dotprod: the same kernels with sdot (int8 x int8 quads, uint8 x shifted)
    emitter.sdot = module.triple.startswith("aarch64") and "+dotprod" in features
    emitter.vnni = emitter.vnni or emitter.vnni_emulated or emitter.sdot
    return emitter.emit()


class _QEmitter(KernelEmitter):
    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, tag, avx2: bool):
        super().__init__(module, func, symbol)
        self.tag = tag
        self.avx2 = avx2
        # 6 x 2 accumulators + 2 operands + broadcast + product = AVX2's 16 registers; the
        # generic target splits each 8-lane vector in two (SSE, NEON): 3 x 2.
        self.mr, self.nv = (6, 2) if avx2 else (3, 2)
        self.dtype = tag.attrs["dtype"]
        self.float_out = self.dtype == "float32"
        self.relu = bool(tag.attrs.get("relu", False))
        self.out_ty = F32 if self.float_out else I8
        self.out_vec = V8F32 if self.float_out else V8I8

    # ---- small helpers ------------------------------------------------------------------------

    def _ptr(self, base: ir.Value, offset, ty: ir.Type) -> ir.Value:
        b = self.builder
        off = offset if isinstance(offset, ir.Value) else const_i64(offset)
        return b.bitcast(b.gep(base, [off], inbounds=True), ty.as_pointer())

    def _splat(self, x: ir.Value, ty: ir.VectorType) -> ir.Value:
        b = self.builder
        v = b.insert_element(ir.Constant(ty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(ty, None),
                                ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count))

    def _madd(self, a: ir.Value, w: ir.Value) -> ir.Value:
        """Per int32 lane: a.lo * w.lo + a.hi * w.hi of two int16 pairs (``vpmaddwd``)."""
        b = self.builder
        if self.avx2:
            f = intrinsic(self.module, "llvm.x86.avx2.pmadd.wd", V8I32, [V16I16, V16I16])
            return b.call(f, [a, w])
        p = b.mul(b.sext(a, V16I32), b.sext(w, V16I32))
        even = ir.Constant(V8I32, list(range(0, 2 * PANEL, 2)))
        odd = ir.Constant(V8I32, list(range(1, 2 * PANEL, 2)))
        return b.add(b.shuffle_vector(p, p, even), b.shuffle_vector(p, p, odd))

    def _dpbusd(self, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
        """``vpdpbusd``: per int32 lane of ``acc`` (<8 x i32>), + the sum of the 4 products
        uint8 ``a`` x int8 ``w`` of its byte quad (<32 x i8> each), exact, no saturation
        (wrapping int32 add). With ``vnni_emulated`` written in portable IR (runs anywhere)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        if getattr(self, "sdot", False):       # aarch64: two sdot, int8 x int8, 4 lanes each
            v4i32, v16i8 = ir.VectorType(I32, 4), ir.VectorType(I8, 16)
            f = intrinsic(self.module, "llvm.aarch64.neon.sdot.v4i32.v16i8", v4i32,
                          [v4i32, v16i8, v16i8])
            halves = []
            for h in range(2):
                lanes = ir.Constant(ir.VectorType(I32, 4), list(range(4 * h, 4 * h + 4)))
                quads = ir.Constant(ir.VectorType(I32, 16), list(range(16 * h, 16 * h + 16)))
                halves.append(b.call(f, [b.shuffle_vector(acc, acc, lanes),
                                         b.shuffle_vector(a, a, quads),
                                         b.shuffle_vector(w, w, quads)]))
            return b.shuffle_vector(halves[0], halves[1], ir.Constant(V8I32, list(range(8))))
        if getattr(self, "vnni_emulated", False):
            v32i32 = ir.VectorType(I32, 32)
            p = b.mul(b.zext(a, v32i32), b.sext(w, v32i32))
            for j in range(4):
                part = b.shuffle_vector(p, p, ir.Constant(V8I32, list(range(j, 32, 4))))
                acc = b.add(acc, part)
            return acc
        f = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, v32i8, v32i8])
        return b.call(f, [acc, a, w])

    def _quad_shift(self, dtype: str) -> int:
        """What the quad kernels add to x (a xor with 0x80): vpdpbusd takes uint8, so int8 x
        + 128; aarch64's sdot takes int8, so uint8 x - 128; else 0."""
        if getattr(self, "sdot", False):
            return -128 if dtype == "uint8" else 0
        return 128 if dtype == "int8" else 0

    def _widen(self, v: ir.Value, dtype: str) -> ir.Value:
        """A loaded int8/uint8/int16 scalar as int32 (x86 u8 zero-extends)."""
        b = self.builder
        return b.zext(v, I32) if dtype == "uint8" else b.sext(v, I32)

    def _requant(self, acc: ir.Value, bias: ir.Value, mult: ir.Value,
                 off: ir.Value | None = None) -> ir.Value:
        """<8 x i32> accumulators -> <8 x i8> (see the module docstring), or with a float32
        result: float32(acc + bias) * mult + off [relu] as <8 x float>."""
        b = self.builder
        return self._requant_float(b.fmul(b.sitofp(b.add(acc, bias), V8F32), mult), off)

    def _requant_float(self, f: ir.Value, off: ir.Value | None = None) -> ir.Value:
        """The epilogue from the scaled accumulator ``f`` (<8 x float>) on."""
        b = self.builder
        if self.float_out:
            f = b.fadd(f, off)
            if self.relu:
                zero = ir.Constant(V8F32, None)
                f = b.select(b.fcmp_ordered(">", f, zero), f, zero)
            return f
        lo, hi = saturation_range(self.dtype)
        zp = self.y_zp
        lo_v = b.fsub(self._splat(ir.Constant(F32, float(lo)), V8F32), zp)
        hi_v = b.fsub(self._splat(ir.Constant(F32, float(hi)), V8F32), zp)
        f = b.select(b.fcmp_ordered("<", f, lo_v), lo_v, f)
        f = b.select(b.fcmp_ordered(">", f, hi_v), hi_v, f)
        magic = self._splat(ir.Constant(F32, _MAGIC), V8F32)
        f = b.fsub(b.fadd(f, magic), magic)
        f = b.fadd(f, zp)
        return b.trunc(b.fptosi(f, V8I32), V8I8)

    def _pack(self, vecs: list[ir.Value]) -> ir.Value:
        """2 or 4 <8 x i32> results already within the output's range as one <8k x i8>, in
        order: vpackssdw, vpackuswb / vpacksswb (saturating: exact here), vpermd."""
        b = self.builder
        v16i16 = ir.VectorType(ir.IntType(16), 16)
        v32i8 = ir.VectorType(I8, 32)
        pack32 = intrinsic(self.module, "llvm.x86.avx2.packssdw", v16i16, [V8I32, V8I32])
        name = "llvm.x86.avx2.packuswb" if self.dtype == "uint8" else "llvm.x86.avx2.packsswb"
        pack16 = intrinsic(self.module, name, v32i8, [v16i16, v16i16])
        permd = intrinsic(self.module, "llvm.x86.avx2.permd", V8I32, [V8I32, V8I32])
        ab = b.call(pack32, [vecs[0], vecs[1]])
        cd = b.call(pack32, [vecs[2], vecs[3]]) if len(vecs) == 4 else ab
        # per 128-bit lane: a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 (dwords)
        mixed = b.bitcast(b.call(pack16, [ab, cd]), V8I32)
        order = ir.Constant(V8I32, [0, 4, 1, 5, 2, 6, 3, 7])
        out = b.bitcast(b.call(permd, [mixed, order]), v32i8)
        if len(vecs) == 4:
            return out
        return b.shuffle_vector(out, out, ir.Constant(ir.VectorType(I32, 16), list(range(16))))

    def _requant_int(self, f: ir.Value, off: ir.Value | None,
                     wide: bool = False) -> ir.Value:
        """``_requant_float``; on AVX, rounding with ``vcvtps2dq`` (round half to even, the
        default MXCSR mode) and the zero point added in int32: 4 operations fewer; ``wide``:
        the <8 x i32> before the truncation (for ``_pack``)."""
        if self.float_out or not self.avx2:
            return self._requant_float(f, off)
        b = self.builder
        lo, hi = saturation_range(self.dtype)
        zp = self.y_zp
        lo_v = b.fsub(self._splat(ir.Constant(F32, float(lo)), V8F32), zp)
        hi_v = b.fsub(self._splat(ir.Constant(F32, float(hi)), V8F32), zp)
        f = b.select(b.fcmp_ordered("<", f, lo_v), lo_v, f)
        f = b.select(b.fcmp_ordered(">", f, hi_v), hi_v, f)
        cvt = intrinsic(self.module, "llvm.x86.avx.cvt.ps2dq.256", V8I32, [V8F32])
        q = b.add(b.call(cvt, [f]), b.fptosi(zp, V8I32))
        return q if wide else b.trunc(q, self.out_vec)

    def _tile(self, rows: int, nvec: int, steps, a_word, b_vec,
              init: list[ir.Value] | None = None) -> list[list[ir.Value]]:
        """``rows`` x ``nvec`` accumulators over ``steps`` k-pair steps: acc[r][v] +=
        madd(broadcast(a_word(r, j)), b_vec(v, j)), starting from ``init[r]`` (<8 x i32>, else
        zero). Returns the final accumulators."""
        b = self.builder
        accs = [[alloca_once(b, V8I32, f"acc{r}_{v}") for v in range(nvec)] for r in range(rows)]
        zero = ir.Constant(V8I32, None)
        for r, row in enumerate(accs):
            for a in row:
                b.store(zero if init is None else init[r], a)
        with for_range(b, const_i64(0), steps if isinstance(steps, ir.Value)
                       else const_i64(steps), "kp") as j:
            ws = [b_vec(v, j) for v in range(nvec)]
            for r in range(rows):
                a = b.bitcast(self._splat(a_word(r, j), V8I32), V16I16)
                for v in range(nvec):
                    acc = accs[r][v]
                    b.store(b.add(b.load(acc), self._madd(a, ws[v])), acc)
        return [[b.load(a) for a in row] for row in accs]

    def _start(self, workspace: int):
        body_fn, ptr_types = self._begin_body(self.func.inputs + self.func.outputs,
                                              workspace > 0)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(self.func.inputs) + 1] if workspace else None
        return body_fn, ptr_types, n_ptrs, ws

    def _finish(self, body_fn, n_ptrs, ptr_types, workspace: int,
                parallel: bool = False) -> KernelInfo:
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), 1, workspace, parallel)


class _QMatmul(_QEmitter):
    def _store_panel(self, m0: ir.Value, nrows: int, n: int, col0, acc) -> None:
        """The requantize epilogue of one tile column: rows m0 .. m0 + nrows of the PANEL
        columns from ``col0``, ``acc(r)`` giving row r's <8 x i32> accumulator (called after
        the column's bias, multiplier and offset are loaded), stored into y (lane by lane
        where the panel runs past column n)."""
        bias, mult, y_zp = self.func.inputs[3:]
        y = self.func.outputs[0]
        b = self.builder
        buf = self.buffers
        bv = b.load(self._ptr(buf[bias.uid], col0, V8I32), align=4)
        mv = (self._splat(b.load(buf[mult.uid]), V8F32) if tuple(mult.shape) == ()
              else b.load(self._ptr(buf[mult.uid], col0, V8F32), align=4))
        ov = (b.load(self._ptr(buf[y_zp.uid], col0, V8F32), align=4)
              if self.float_out else None)
        for r in range(nrows):
            q = self._requant(acc(r), bv, mv, ov)
            row = b.mul(b.add(m0, const_i64(r)), const_i64(n))
            if isinstance(col0, ir.Value) or col0 + PANEL <= n:   # a run-time col0: whole
                c0 = col0 if isinstance(col0, ir.Value) else const_i64(col0)
                b.store(q, self._ptr(buf[y.uid], b.add(row, c0), self.out_vec),
                        align=1)
            else:
                for lane in range(n - col0):
                    b.store(b.extract_element(q, ir.Constant(I32, lane)),
                            b.gep(buf[y.uid], [b.add(row, const_i64(col0 + lane))]))

    def _groups(self, groups: list[int], parallel: bool, g_lo, g_hi, rows: int, npn: int,
                tile_at, n: int | None = None) -> None:
        """Calls ``tile_at(m0, nrows, p0, nvec)`` over all rows (tiles of mr, then the rest)
        for each group of up to nv panels from ``groups``; when parallel, only the groups
        g_lo <= gi < g_hi of this task. With ``n`` (the columns), the groups of nv whole
        panels run as one loop with a run-time p0 (an int64 value: one copy of the code, not
        one per group, which for 8210 columns made half a megabyte of code), the rest
        unrolled with constant p0."""
        b = self.builder
        mr, nv = self.mr, self.nv
        if n is not None:
            uniform = sum(1 for p0 in groups if p0 + nv <= npn and (p0 + nv) * PANEL <= n)
            if uniform > 1:
                lo, hi = const_i64(0), const_i64(uniform)
                if parallel:
                    lo = b.select(b.icmp_signed(">", g_lo, lo), g_lo, lo)
                    hi = b.select(b.icmp_signed("<", g_hi, hi), g_hi, hi)
                full = rows // mr
                with for_range(b, lo, hi, "gq") as gi:
                    p0 = b.mul(gi, const_i64(nv))
                    if full:
                        with for_range(b, const_i64(0), const_i64(full), "mt") as t:
                            tile_at(b.mul(t, const_i64(mr)), mr, p0, nv)
                    if rows % mr:
                        tile_at(const_i64(full * mr), rows % mr, p0, nv)
                rest = list(enumerate(groups))[uniform:]
            else:
                rest = list(enumerate(groups))
        else:
            rest = list(enumerate(groups))

        def group(p0: int) -> None:
            nvec = min(nv, npn - p0)
            full = rows // mr
            if full:
                with for_range(b, const_i64(0), const_i64(full), "mt") as t:
                    tile_at(b.mul(t, const_i64(mr)), mr, p0, nvec)
            if rows % mr:
                tile_at(const_i64(full * mr), rows % mr, p0, nvec)

        for gi, p0 in rest:
            if parallel:
                g = const_i64(gi)
                mine = b.and_(b.icmp_signed(">=", g, g_lo), b.icmp_signed("<", g, g_hi))
                with b.if_then(mine):
                    group(p0)
            else:
                group(p0)

    def emit(self) -> KernelInfo:
        x, wp, x_zp, _, _, y_zp = self.func.inputs
        n = int(self.tag.attrs["n"])
        k = int(x.shape[-1])
        rows = 1
        for d in x.shape[:-1]:
            rows *= int(d)
        npn, k2 = int(wp.shape[0]), int(wp.shape[1])
        if wp.dtype not in ("int8", "int16"):
            raise LoweringError(f"{self.func.name}: packed weights of dtype {wp.dtype}")
        # Split over tasks by groups of column panels when there is work enough; every task
        # packs the rows into a region of its own.
        groups = list(range(0, npn, self.nv))
        parallel = rows * k * n >= PARALLEL_MIN_MACS and len(groups) > 1
        w_off = int(self.tag.attrs.get("w_offset", 0))
        vnni = getattr(self, "vnni", False) and wp.dtype == "int8" and not w_off
        k4 = -(-k2 // 2)
        # after the packed rows, with w_offset: each row's sum_k (x - x_zp) (int32)
        sums_at = _align(rows * (k4 * 4 if vnni else k2 * 4))
        region = _align(sums_at + (rows * 4 if w_off else 0))
        workspace = region * (MAX_TASK_REGIONS if parallel else 1)
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        if parallel:
            cap = const_i64(MAX_TASK_REGIONS)
            eff = b.select(b.icmp_signed("<", ntasks, cap), ntasks, cap)
            with b.if_then(b.icmp_signed(">=", task, eff), likely=False):
                b.ret_void()
            g_lo = b.sdiv(b.mul(task, const_i64(len(groups))), eff)
            g_hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(len(groups))), eff)
            ws = b.gep(ws, [b.mul(task, const_i64(region))])
        xzp = b.load(buf[x_zp.uid])
        if x_zp.dtype != "int32":     # a DynamicQuantizeLinear's uint8/int8 zero point
            xzp = self._widen(xzp, x_zp.dtype)
        if not self.float_out:
            self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        if vnni:
            return self._emit_vnni(body_fn, ptr_types, n_ptrs, ws, workspace, parallel, groups,
                                   g_lo if parallel else None, g_hi if parallel else None,
                                   rows, k, k2, k4, n, npn, xzp)
        a16 = b.bitcast(ws, I16.as_pointer())
        sums = b.bitcast(b.gep(ws, [const_i64(sums_at)]), I32.as_pointer())
        total = alloca_once(b, I32, "rowsum")
        # pack x - x_zp as int16, rows of 2 * k2 (a zero after an odd K)
        with for_range(b, const_i64(0), const_i64(rows), "pm") as m:
            src = b.gep(buf[x.uid], [b.mul(m, const_i64(k))])
            dst = b.gep(a16, [b.mul(m, const_i64(2 * k2))])
            b.store(ir.Constant(I32, 0), total)
            with for_range(b, const_i64(0), const_i64(k), "pk") as kk:
                v = b.sub(self._widen(b.load(b.gep(src, [kk])), x.dtype), xzp)
                b.store(b.trunc(v, I16), b.gep(dst, [kk]))
                if w_off:
                    b.store(b.add(b.load(total), v), total)
            if k % 2:
                b.store(ir.Constant(I16, 0), b.gep(dst, [const_i64(k)]))
            if w_off:
                b.store(b.mul(b.load(total), ir.Constant(I32, w_off)), b.gep(sums, [m]))
        a32 = b.bitcast(ws, I32.as_pointer())
        wbase = buf[wp.uid]
        wide = wp.dtype == "int16"

        def tile_at(m0: ir.Value, nrows: int, p0: int, nvec: int) -> None:
            def a_word(r, j):
                return b.load(b.gep(a32, [b.add(b.mul(b.add(m0, const_i64(r)), const_i64(k2)),
                                                j)]))

            pv = [b.add(p0, const_i64(v)) if isinstance(p0, ir.Value) else const_i64(p0 + v)
                  for v in range(nvec)]

            def b_vec(v, j):
                off = b.add(b.mul(pv[v], const_i64(k2 * 16)), b.mul(j, const_i64(16)))
                if wide:
                    return b.load(self._ptr(wbase, off, V16I16), align=2)
                return b.sext(b.load(self._ptr(wbase, off, V16I8), align=1), V16I16)

            accs = self._tile(nrows, nvec, k2, a_word, b_vec)
            if w_off:   # + w_offset * sum_k (x - x_zp), per row (wrapping, as the int32 sum)
                for r in range(nrows):
                    corr = self._splat(b.load(b.gep(sums, [b.add(m0, const_i64(r))])), V8I32)
                    accs[r] = [b.add(a, corr) for a in accs[r]]
            for v in range(nvec):
                col0 = (b.mul(pv[v], const_i64(PANEL)) if isinstance(p0, ir.Value)
                        else (p0 + v) * PANEL)
                self._store_panel(m0, nrows, n, col0, lambda r, v=v: accs[r][v])

        self._groups(groups, parallel, g_lo if parallel else None, g_hi if parallel else None,
                     rows, npn, tile_at, n)
        return self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)


    def _emit_vnni(self, body_fn, ptr_types, n_ptrs, ws, workspace, parallel, groups, g_lo,
                   g_hi, rows, k, k2, k4, n, npn, xzp) -> KernelInfo:
        """``qmatmul`` with ``vpdpbusd`` (AVX-512 VNNI, 256-bit): u8 x s8 quads, 4 exact
        products summed into each int32 lane per instruction. x is packed as uint8 (int8 x
        shifted by +128) in rows of 4 * k4 bytes; the weights are the bundle's int8 panels,
        two k-pair rows interleaved into k-quads per step; sum(x_u8 w) - zp' * sum(w) with zp' =
        x_zp (+128 for int8 x) gives sum((x - x_zp) w), the column sums made by one more
        vpdpbusd with ones per step. Compiled and checked for ``vpdpbusd`` here; not run on
        this machine (no AVX-512)."""
        x, wp = self.func.inputs[:2]
        b = self.builder
        buf = self.buffers
        v32i8 = ir.VectorType(I8, 32)
        dpbusd = self._dpbusd
        a8 = ws
        shift = self._quad_shift(x.dtype)
        with for_range(b, const_i64(0), const_i64(rows), "pm") as m:
            src = b.gep(buf[x.uid], [b.mul(m, const_i64(k))])
            dst = b.gep(a8, [b.mul(m, const_i64(4 * k4))])
            with for_range(b, const_i64(0), const_i64(k), "pk") as kk:
                v = b.load(b.gep(src, [kk]))
                if shift:
                    v = b.xor(v, ir.Constant(I8, 0x80))
                b.store(v, b.gep(dst, [kk]))
            for kk in range(k, 4 * k4):
                b.store(ir.Constant(I8, 0), b.gep(dst, [const_i64(kk)]))
        a32 = b.bitcast(ws, I32.as_pointer())
        zp = b.add(xzp, ir.Constant(I32, shift))
        zpv = self._splat(zp, V8I32)
        ones = b.bitcast(self._splat(ir.Constant(I32, 0x01010101), V8I32), v32i8)
        wbase = buf[wp.uid]
        quad = ir.Constant(ir.VectorType(I32, 32),
                           [i for lane in range(PANEL)
                            for i in (2 * lane, 2 * lane + 1, 16 + 2 * lane, 17 + 2 * lane)])

        def b_quad(p: int, j, half: bool) -> ir.Value:
            off = b.add(const_i64(p * k2 * 16), b.mul(j, const_i64(32)))
            lo = b.load(self._ptr(wbase, off, V16I8), align=1)
            hi = (ir.Constant(V16I8, None) if half else
                  b.load(self._ptr(wbase, b.add(off, const_i64(16)), V16I8), align=1))
            return b.shuffle_vector(lo, hi, quad)

        def tile_at(m0: ir.Value, nrows: int, p0: int, nvec: int) -> None:
            accs = [[alloca_once(b, V8I32, f"dacc{r}_{v}") for v in range(nvec)]
                    for r in range(nrows)]
            sums = [alloca_once(b, V8I32, f"dsum{v}") for v in range(nvec)]
            zero = ir.Constant(V8I32, None)
            for a in [a for row in accs for a in row] + sums:
                b.store(zero, a)

            def step(j, half: bool) -> None:
                ws_ = [b_quad(p0 + v, j, half) for v in range(nvec)]
                for v in range(nvec):
                    b.store(dpbusd(b.load(sums[v]), ones, ws_[v]), sums[v])
                for r in range(nrows):
                    word = b.load(b.gep(a32, [b.add(b.mul(b.add(m0, const_i64(r)),
                                                          const_i64(k4)), j)]))
                    a = b.bitcast(self._splat(word, V8I32), v32i8)
                    for v in range(nvec):
                        b.store(dpbusd(b.load(accs[r][v]), a, ws_[v]), accs[r][v])

            if k2 // 2:
                with for_range(b, const_i64(0), const_i64(k2 // 2), "kq") as j:
                    step(j, False)
            if k2 % 2:
                step(const_i64(k2 // 2), True)
            for v in range(nvec):
                corr = b.mul(zpv, b.load(sums[v]))
                self._store_panel(m0, nrows, n, (p0 + v) * PANEL,
                                  lambda r, v=v, corr=corr: b.sub(b.load(accs[r][v]), corr))

        self._groups(groups, parallel, g_lo, g_hi, rows, npn, tile_at)
        return self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)


class _QConv(_QEmitter):
    def emit(self) -> KernelInfo:
        x, wk, x_zp, bias, mult, y_zp = self.func.inputs[:6]
        lut = self.func.inputs[6] if len(self.func.inputs) > 6 else None
        y = self.func.outputs[0]
        batch, c, h, w = (int(d) for d in x.shape)
        o = int(self.tag.attrs["out_channels"])
        kh, kw = self.tag.attrs["kernel"]
        _, _, oh, ow = (int(d) for d in y.shape)
        sh, sw = self.tag.attrs["strides"]
        pt, pl, pb, pr = self.tag.attrs["padding"]
        if (h, w, kh, kw, oh, ow) == (1, 1, 1, 1, 1, 1) and not any(self.tag.attrs["padding"]):
            return self._emit_vector(x, wk, x_zp, bias, mult, y_zp, lut, y, batch, c, o)
        hp, wpd = h + pt + pb, w + pl + pr
        hq, wq = -(-hp // sh), -(-wpd // sw)
        cp = -(-c // 2)
        # AVX-512 VNNI (int8 weights): planes of uint8 channel quads and vpdpbusd, else int16
        # channel pairs and vpmaddwd
        vnni = bool(getattr(self, "vnni", False)) and wk.dtype == "int8"
        # weights packed at export as the quad loop reads them, the correction in the bias
        # (ops/qconv_quads.py): no regrouping here
        quads = bool(self.tag.attrs.get("quads", False))
        if quads and (not vnni or self._quad_shift(x.dtype) != self.tag.attrs["shift"]):
            raise LoweringError(f"{self.func.name}: weights packed for another quad kernel")
        cg = -(-c // 4) if vnni else cp                  # channel groups of a plane word
        phases = sorted({(ky % sh, kx % sw) for ky in range(kh) for kx in range(kw)})
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        lanes = PANEL * self.nv
        qn = oh * wq
        qpad = -(-qn // lanes) * lanes
        offmax = ((kh - 1) // sh) * wq + (kw - 1) // sw
        prow = max(hq, -(-(qpad + offmax) // wq))       # plane rows, reads stay inside
        psz = prow * wq                                  # int32 words per (phase, pair) plane
        steps = len(taps) * cp                           # k-pair steps of the packed weights
        ksteps = len(taps) * cg                          # steps of the kernel's loop
        rows6 = CONV_ROWS
        ot = int(wk.shape[0])
        n_words = ot * steps * rows6
        if quads:
            w_bytes = 0
        elif vnni:    # the weights as s8 quads [ot][ksteps][6] words, then sum_c,t w per row
            wsum_at = _align(ot * ksteps * rows6 * 4)
            w_bytes = wsum_at + _align(ot * rows6 * 4)
        else:
            w_bytes = _align(n_words * 4) if wk.dtype == "int8" else 0
        p_bytes = _align(len(phases) * cg * psz * 4)
        s_bytes = _align(o * qpad * (4 if self.float_out else 1))
        # Split over tasks by tiles of output channels when there is work enough: the widened
        # weights and the staging rows are shared (each task writes its own rows), the planes
        # are per task (a task may run ahead to the next image).
        parallel = batch * o * oh * ow * c * kh * kw >= PARALLEL_MIN_MACS
        regions = MAX_TASK_REGIONS if parallel else 1
        workspace = w_bytes + s_bytes + p_bytes * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        mr = self.mr
        full, tail = o // mr, o % mr
        n_tiles = full + (1 if tail else 0)
        if parallel:
            cap = const_i64(regions)
            eff = b.select(b.icmp_signed("<", ntasks, cap), ntasks, cap)
            skip = b.icmp_signed(">=", task, eff)
            with b.if_then(skip, likely=False):
                b.ret_void()
            lo = b.sdiv(b.mul(task, const_i64(n_tiles)), eff)
            hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(n_tiles)), eff)
            region = task
        else:
            lo, hi, region = const_i64(0), const_i64(n_tiles), const_i64(0)
        xzp = b.load(buf[x_zp.uid])
        if x_zp.dtype != "int32":     # a DynamicQuantizeLinear's uint8/int8 zero point
            xzp = self._widen(xzp, x_zp.dtype)
        if not self.float_out:
            self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        tile_words = steps * rows6 * 2                      # int16 values per 6-row tile
        if vnni:
            shift = self._quad_shift(x.dtype)
            zpq = b.add(xzp, ir.Constant(I32, shift))    # x's zero point as the planes hold it
            if quads:
                wexp32, wsum = b.bitcast(buf[wk.uid], I32.as_pointer()), None
            else:
                wexp32, wsum = self._vnni_weights(ws, buf[wk.uid], lo, hi, mr, ot, len(taps),
                                                  cp, cg, steps, ksteps, wsum_at)
        elif w_bytes:   # int8 weights (the bundle's) widened to int16, this task's tiles
            wexp = b.bitcast(ws, I16.as_pointer())
            # 6-row tiles of the packed weights are mr-row tiles' groups (mr divides 6)
            g_lo = b.sdiv(b.mul(lo, const_i64(mr)), const_i64(rows6))
            g_hi = b.sdiv(b.add(b.mul(hi, const_i64(mr)), const_i64(rows6 - 1)),
                          const_i64(rows6))
            with for_range(b, b.mul(g_lo, const_i64(tile_words)),
                           b.mul(g_hi, const_i64(tile_words)), "we") as i:
                b.store(b.sext(b.load(b.gep(buf[wk.uid], [i])), I16), b.gep(wexp, [i]))
            wexp32 = b.bitcast(ws, I32.as_pointer())
        else:
            wexp32 = b.bitcast(buf[wk.uid], I32.as_pointer())
        stage = b.bitcast(b.gep(ws, [const_i64(w_bytes)]),              # [o][qpad] results
                          self.out_ty.as_pointer())
        planes = b.bitcast(b.gep(ws, [b.add(const_i64(w_bytes + s_bytes),
                                            b.mul(region, const_i64(p_bytes)))]),
                           I16.as_pointer())
        planes32 = b.bitcast(planes, I32.as_pointer())
        # step j = t * cg + p reads plane (phase(t), p) at offset off(t): a table of word
        # offsets into the planes
        table = [(phases.index((ky % sh, kx % sw)) * cg + p) * psz + (ky // sh) * wq + kx // sw
                 for ky, kx in taps for p in range(cg)]
        tbl_ty = ir.ArrayType(I64, len(table))
        gv = ir.GlobalVariable(self.module, tbl_ty, name=f"{self.symbol}.steps")
        gv.global_constant = True
        gv.linkage = "internal"
        gv.initializer = ir.Constant(tbl_ty, table)
        with for_range(b, const_i64(0), const_i64(batch), "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c * h * w))])
            if vnni:
                self._fill_quads(xb, b.bitcast(planes, I8.as_pointer()), phases, c, h, w, cg,
                                 prow, wq, psz, sh, sw, pt, pl, zpq, shift,
                                 zero=any(self.tag.attrs["padding"]))
            else:
                self._fill_planes(xb, planes, phases, c, h, w, cp, prow, wq, psz, sh, sw, pt,
                                  pl, xzp, x.dtype,
                                  zero=any(self.tag.attrs["padding"]) or c % 2 == 1)

            def a_word_at(oc0):
                # word ((oc // 6) * steps + j) * 6 + oc % 6; a tile never crosses a 6-row group
                base = b.add(b.mul(b.sdiv(oc0, const_i64(rows6)), const_i64(ksteps * rows6)),
                             b.srem(oc0, const_i64(rows6)))

                def a_word(r, j):
                    return b.load(b.gep(wexp32, [b.add(b.add(base, const_i64(r)),
                                                       b.mul(j, const_i64(rows6)))]))
                return a_word

            def b_vec_at(q0):
                def b_vec(v, j):
                    off = b.load(b.gep(gv, [const_i64(0), j]))
                    p = b.add(b.add(off, q0), const_i64(v * PANEL))
                    return b.load(self._ptr(planes32, p, V16I16), align=4)
                return b_vec

            def tile(q0, oc0, nrows):
                if packed:
                    return tile_packed(q0, oc0, nrows)
                if vnni:
                    accs = self._tile_dp(nrows, self.nv, ksteps, a_word_at(oc0), b_vec_at(q0))
                else:
                    accs = self._tile(nrows, self.nv, steps, a_word_at(oc0), b_vec_at(q0))
                for r in range(nrows):
                    ocr = b.add(oc0, const_i64(r))
                    if vnni and wsum is not None:
                        # sum (x_q - zp') w = sum (x - x_zp) w + zp' sum w (wrapping)
                        corr = self._splat(b.mul(zpq, b.load(b.gep(wsum, [ocr]))), V8I32)
                        accs[r] = [b.sub(a, corr) for a in accs[r]]
                    bv = self._splat(b.load(b.gep(buf[bias.uid], [ocr])), V8I32)
                    mv = self._splat(b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                            else b.gep(buf[mult.uid], [ocr])), V8F32)
                    ov = (self._splat(b.load(b.gep(buf[y_zp.uid], [ocr])), V8F32)
                          if self.float_out else None)
                    for v in range(self.nv):
                        q = self._requant(accs[r][v], bv, mv, ov)
                        dst = b.add(b.mul(ocr, const_i64(qpad)), b.add(q0, const_i64(v * PANEL)))
                        b.store(q, self._ptr(stage, dst, self.out_vec), align=4)

            def tile_packed(q0, oc0, nrows):
                """AVX2, 8-bit result: the accumulators start from the bias (less the VNNI
                zero-point correction), the epilogue rounds with vcvtps2dq, adds the zero
                point in int32 and packs the row's two vectors into 16 bytes with saturating
                packs (``_requant_int``, ``_pack``): per row 11 vector operations fewer than
                ``_requant``'s twice, the same bytes."""
                ocs = [b.add(oc0, const_i64(r)) for r in range(nrows)]
                init = []
                for ocr in ocs:
                    start = b.load(b.gep(buf[bias.uid], [ocr]))
                    if vnni and wsum is not None:   # zp' sum w (wrapping); quads: in the bias
                        start = b.sub(start, b.mul(zpq, b.load(b.gep(wsum, [ocr]))))
                    init.append(self._splat(start, V8I32))
                if vnni:
                    accs = self._tile_dp(nrows, self.nv, ksteps, a_word_at(oc0), b_vec_at(q0),
                                         init)
                else:
                    accs = self._tile(nrows, self.nv, steps, a_word_at(oc0), b_vec_at(q0), init)
                for r, ocr in enumerate(ocs):
                    mv = self._splat(b.load(buf[mult.uid] if tuple(mult.shape) == ()
                                            else b.gep(buf[mult.uid], [ocr])), V8F32)
                    wide = [self._requant_int(b.fmul(b.sitofp(a, V8F32), mv), None, True)
                            for a in accs[r]]
                    dst = b.add(b.mul(ocr, const_i64(qpad)), q0)
                    b.store(self._pack(wide), self._ptr(stage, dst, V16I8), align=4)

            packed = self.avx2 and not self.float_out and self.nv == 2
            # pixels outer: one chunk's plane columns (all steps) stay in L1 for every tile
            with for_range(b, const_i64(0), const_i64(qpad // lanes), "qc") as qc:
                q0 = b.mul(qc, const_i64(lanes))
                with for_range(b, lo, hi, "ot") as t:
                    oc0 = b.mul(t, const_i64(mr))
                    if tail:
                        with b.if_else(b.icmp_signed("<", t, const_i64(full))) as (whole, part):
                            with whole:
                                tile(q0, oc0, mr)
                            with part:
                                tile(q0, oc0, tail)
                    else:
                        tile(q0, oc0, mr)
            # compact this task's rows of ow out of the staging rows of wq
            yb = b.gep(buf[y.uid], [b.mul(bi, const_i64(o * oh * ow))])
            oc_hi = b.mul(hi, const_i64(mr))
            oc_hi = b.select(b.icmp_signed("<", oc_hi, const_i64(o)), oc_hi, const_i64(o))
            # rows of ow, or whole channels where the staging rows are the output's (wq == ow)
            per, n = (1, oh * ow) if wq == ow else (oh, ow)
            with for_range(b, b.mul(b.mul(lo, const_i64(mr)), const_i64(per)),
                           b.mul(oc_hi, const_i64(per)), "cr") as r:
                oc = b.sdiv(r, const_i64(per))
                oy = b.srem(r, const_i64(per))
                src = b.gep(stage, [b.add(b.mul(oc, const_i64(qpad)), b.mul(oy, const_i64(wq)))])
                dst = b.gep(yb, [b.mul(r, const_i64(n))])
                # a lut8 folded in (passes/quantize_lut.py): the row's table
                tb = None if lut is None else b.gep(buf[lut.uid], [
                    b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1 else const_i64(0)])
                if tb is None:
                    with for_range(b, const_i64(0), const_i64(n), "cx") as i:
                        b.store(b.load(b.gep(src, [i])), b.gep(dst, [i]))
                elif self.avx2 and n >= 32:
                    self._lut_bytes(src, dst, tb, n)
                else:
                    with for_range(b, const_i64(0), const_i64(n), "cx") as i:
                        v = b.load(b.gep(src, [i]))
                        idx = (b.add(b.sext(v, I64), const_i64(128)) if self.dtype == "int8"
                               else b.zext(v, I64))
                        b.store(b.load(b.gep(tb, [idx])), b.gep(dst, [i]))
        return self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)

    def _emit_vector(self, x, wk, x_zp, bias, mult, y_zp, lut, y, batch: int, c: int,
                     o: int) -> KernelInfo:
        """A 1x1 convolution of a 1x1 image (a squeeze-and-excitation block's): a matrix-
        vector product, output channels as lanes. The planes' kernel would put the one pixel in
        a lane of 16 (and widen all the weights first); here each k-pair step loads the 6
        output channels' pairs of a packed weight tile directly (12 int8 or int16 values, 6 of
        8 lanes) against x's pair broadcast, and the epilogue (``_requant``) runs on the 6
        lanes, stored one by one (through the row's lut8 table when folded in)."""
        rows6 = CONV_ROWS
        cp = -(-c // 2)
        ot = int(wk.shape[0])
        wide = wk.dtype != "int8"
        workspace = _align(cp * 4)
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        b = self.builder
        buf = self.buffers
        xpairs = b.bitcast(ws, I16.as_pointer())
        words = b.bitcast(ws, I32.as_pointer())
        xzp = b.load(buf[x_zp.uid])
        if x_zp.dtype != "int32":
            xzp = self._widen(xzp, x_zp.dtype)
        if not self.float_out:
            self.y_zp = self._splat(b.load(buf[y_zp.uid]), V8F32)
        w_el = I16 if wide else I8
        v12, v12i16 = ir.VectorType(w_el, 2 * rows6), ir.VectorType(I16, 2 * rows6)
        to16 = ir.Constant(ir.VectorType(I32, 2 * PANEL),
                           list(range(2 * rows6)) + [2 * rows6] * (2 * (PANEL - rows6)))
        to8 = ir.Constant(V8I32, list(range(rows6)) + [rows6] * (PANEL - rows6))
        with for_range(b, const_i64(0), const_i64(batch), "b") as bi:
            xb = b.gep(buf[x.uid], [b.mul(bi, const_i64(c))])
            if c % 2:
                b.store(ir.Constant(I16, 0), b.gep(xpairs, [const_i64(c)]))
            with for_range(b, const_i64(0), const_i64(c), "xc") as ch:
                v = b.sub(self._widen(b.load(b.gep(xb, [ch])), x.dtype), xzp)
                b.store(b.trunc(v, I16), b.gep(xpairs, [ch]))
            yb = b.gep(buf[y.uid], [b.mul(bi, const_i64(o))])
            with for_range(b, const_i64(0), const_i64(ot), "og") as g:
                acc = alloca_once(b, V8I32, "vacc")
                b.store(ir.Constant(V8I32, None), acc)
                with for_range(b, const_i64(0), const_i64(cp), "kp") as j:
                    at = b.mul(b.add(b.mul(g, const_i64(cp)), j), const_i64(2 * rows6))
                    wv = b.load(self._ptr(buf[wk.uid], at, v12), align=1)
                    wv = b.sext(wv, v12i16) if not wide else wv
                    wv = b.shuffle_vector(wv, ir.Constant(v12i16, None), to16)
                    a = b.bitcast(self._splat(b.load(b.gep(words, [j])), V8I32), V16I16)
                    b.store(b.add(b.load(acc), self._madd(a, wv)), acc)
                oc0 = b.mul(g, const_i64(rows6))

                def lanes(src, ty, vty):
                    if tuple(src.shape) == ():
                        return self._splat(b.load(buf[src.uid]), vty)
                    vals = ir.Constant(ir.VectorType(ty, rows6), None)
                    for r in range(rows6):    # scalar loads: the last tile may pass o
                        oc = b.add(oc0, const_i64(r))
                        oc = b.select(b.icmp_signed("<", oc, const_i64(o)), oc, const_i64(0))
                        vals = b.insert_element(vals, b.load(b.gep(buf[src.uid], [oc])),
                                                ir.Constant(I32, r))
                    return b.shuffle_vector(vals, ir.Constant(vals.type, None), to8)

                bv = lanes(bias, I32, V8I32)
                mv = lanes(mult, F32, V8F32)
                ov = lanes(y_zp, F32, V8F32) if self.float_out else None
                q = self._requant(b.load(acc), bv, mv, ov)
                for r in range(rows6):
                    oc = b.add(oc0, const_i64(r))
                    with b.if_then(b.icmp_signed("<", oc, const_i64(o))):
                        val = b.extract_element(q, ir.Constant(I32, r))
                        if lut is not None:
                            row = (b.mul(oc, const_i64(256)) if int(lut.shape[0]) != 1
                                   else const_i64(0))
                            idx = (b.add(b.sext(val, I64), const_i64(128))
                                   if self.dtype == "int8" else b.zext(val, I64))
                            val = b.load(b.gep(buf[lut.uid], [b.add(row, idx)]))
                        b.store(val, b.gep(yb, [oc]))
        return self._finish(body_fn, n_ptrs, ptr_types, workspace)

    def _lut_bytes(self, src, dst, tb, n: int) -> None:
        """dst[i] = tb[src[i]] for i < n (n >= 32; int8 bytes index from tb + 128), 32 bytes
        at a time with AVX2 ``vpshufb``: the 256-byte row as 16 chunks of 16 bytes, each
        looked up by the index's low nibble and kept where its high nibble is the chunk's (16
        pshufb + compare + blend per 32 bytes, against one scalar load per byte); the last 32
        bytes overlap the previous vector when n is not a multiple of 32 (same values)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        shuf = intrinsic(self.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
        both = ir.Constant(ir.VectorType(I32, 32), list(range(16)) * 2)
        low = ir.Constant(v32i8, [0x0F] * 32)

        def chunk(at) -> None:
            v = b.load(self._ptr(src, at, v32i8), align=1)
            if self.dtype == "int8":
                v = b.xor(v, ir.Constant(v32i8, [0x80] * 32))
            lo_n = b.and_(v, low)
            hi_n = b.lshr(v, ir.Constant(v32i8, [4] * 32))
            res = ir.Constant(v32i8, None)
            for k in range(16):
                t = b.load(self._ptr(tb, const_i64(16 * k), V16I8), align=1)
                part = b.call(shuf, [b.shuffle_vector(t, t, both), lo_n])
                sel = b.icmp_unsigned("==", hi_n, ir.Constant(v32i8, [k] * 32))
                res = b.select(sel, part, res)
            b.store(res, self._ptr(dst, at, v32i8), align=1)

        if n // 32 > 1:
            with for_range(b, const_i64(0), const_i64(n // 32), "lx") as i:
                chunk(b.mul(i, const_i64(32)))
        else:
            chunk(const_i64(0))
        if n % 32:
            chunk(const_i64(n - 32))

    def _tile_dp(self, rows: int, nvec: int, steps: int, a_word, b_vec,
                 init: list[ir.Value] | None = None) -> list[list[ir.Value]]:
        """Like ``_tile`` with ``vpdpbusd``: acc[r][v] += dpbusd(b_vec(v, j) as uint8 quads,
        broadcast(a_word(r, j)) as int8 quads)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        accs = [[alloca_once(b, V8I32, f"qacc{r}_{v}") for v in range(nvec)] for r in range(rows)]
        zero = ir.Constant(V8I32, None)
        for r, row in enumerate(accs):
            for a in row:
                b.store(zero if init is None else init[r], a)
        with for_range(b, const_i64(0), const_i64(steps), "kq") as j:
            ws = [b.bitcast(b_vec(v, j), v32i8) for v in range(nvec)]
            for r in range(rows):
                a = b.bitcast(self._splat(a_word(r, j), V8I32), v32i8)
                for v in range(nvec):
                    acc = accs[r][v]
                    b.store(self._dpbusd(b.load(acc), ws[v], a), acc)
        return [[b.load(a) for a in row] for row in accs]

    def _vnni_weights(self, ws, wk, lo, hi, mr, ot, ntaps, cp, cg, steps, ksteps, wsum_at):
        """The bundle's int8 k-pair weights [ot][taps * cp][6][2] regrouped as int8 channel
        quads [ot][taps * cg][6] (int32 words: pairs 2q and 2q + 1, a zero pair past the last)
        at the start of ``ws``, and each row's sum of weights at ``wsum_at`` (int32), for
        this task's 6-row tiles. Returns (words, sums) as i32 pointers."""
        b = self.builder
        rows6 = CONV_ROWS
        words = b.bitcast(ws, I32.as_pointer())
        wsum = b.bitcast(b.gep(ws, [const_i64(wsum_at)]), I32.as_pointer())
        pairs = b.bitcast(wk, I16.as_pointer())          # one int16 = one k-pair of bytes
        g_lo = b.sdiv(b.mul(lo, const_i64(mr)), const_i64(rows6))
        g_hi = b.sdiv(b.add(b.mul(hi, const_i64(mr)), const_i64(rows6 - 1)), const_i64(rows6))
        g_hi = b.select(b.icmp_signed("<", g_hi, const_i64(ot)), g_hi, const_i64(ot))
        sums = [alloca_once(b, I32, f"wsum{r}") for r in range(rows6)]

        def quad(g, t, q, full: bool) -> None:
            for r in range(rows6):
                src = b.add(b.mul(b.add(b.add(b.mul(g, const_i64(steps)),
                                              b.mul(t, const_i64(cp))),
                                        b.mul(q, const_i64(2))), const_i64(rows6)),
                            const_i64(r))
                lo16 = b.load(b.gep(pairs, [src]))
                word = b.zext(lo16, I32)
                parts = [lo16]
                if full:
                    hi16 = b.load(b.gep(pairs, [b.add(src, const_i64(rows6))]))
                    word = b.or_(word, b.shl(b.zext(hi16, I32), ir.Constant(I32, 16)))
                    parts.append(hi16)
                dst = b.add(b.mul(b.add(b.add(b.mul(g, const_i64(ksteps)),
                                              b.mul(t, const_i64(cg))), q), const_i64(rows6)),
                            const_i64(r))
                b.store(word, b.gep(words, [dst]))
                total = b.load(sums[r])
                for part in parts:
                    for sh in (8, 0):    # the pair's high byte, then its low byte, sign-extended
                        byte = b.trunc(b.lshr(part, ir.Constant(I16, sh)), I8)
                        total = b.add(total, b.sext(byte, I32))
                b.store(total, sums[r])

        with for_range(b, g_lo, g_hi, "vg") as g:
            for r in range(rows6):
                b.store(ir.Constant(I32, 0), sums[r])
            with for_range(b, const_i64(0), const_i64(ntaps), "vt") as t:
                if cp // 2:
                    with for_range(b, const_i64(0), const_i64(cp // 2), "vq") as q:
                        quad(g, t, q, True)
                if cp % 2:
                    quad(g, t, const_i64(cp // 2), False)
            for r in range(rows6):
                b.store(b.load(sums[r]),
                        b.gep(wsum, [b.add(b.mul(g, const_i64(rows6)), const_i64(r))]))
        return words, wsum

    def _fill_quads(self, xb, planes, phases, c, h, w, cg, prow, wq, psz, sh, sw, pt, pl,
                    zpq, shift: int, zero: bool) -> None:
        """The VNNI kernel's planes: bytes planes[ph, q, u, v, j] = x[4q + j, u*sh + py - pt,
        v*sw + px - pl] as uint8 (int8 x + 128, ``shift``), x's zero point ``zpq`` (so it
        adds nothing after the correction) outside the image when ``zero``; channels past the
        last meet zero weights, so what they hold does not matter."""
        b = self.builder
        total = len(phases) * cg * psz * 4
        if zero:
            fill = b.trunc(zpq, I8)
            with for_range(b, const_i64(0), const_i64(total), "fz") as i:
                b.store(fill, b.gep(planes, [i]))
        for pi, (py, px) in enumerate(phases):
            u_lo = max(0, -(-(pt - py) // sh))
            u_hi = min(prow, (h + pt - py - 1) // sh + 1)
            v_lo = max(0, -(-(pl - px) // sw))
            v_hi = min(wq, (w + pl - px - 1) // sw + 1)
            if u_hi <= u_lo or v_hi <= v_lo:
                continue
            for q_lo, q_hi, chans in ((0, c // 4, 4), (c // 4, cg, c % 4)):
                if q_hi <= q_lo:
                    continue
                with for_range(b, const_i64(q_lo), const_i64(q_hi), "fq") as q:
                    base = b.mul(b.add(const_i64(pi * cg), q), const_i64(psz * 4))
                    with for_range(b, const_i64(u_lo), const_i64(u_hi), "fu") as u:
                        iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                        row = b.add(base, b.mul(u, const_i64(wq * 4)))
                        with for_range(b, const_i64(v_lo), const_i64(v_hi), "fv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                            dst = b.add(row, b.mul(v, const_i64(4)))
                            for j in range(chans):
                                ch = b.add(b.mul(q, const_i64(4)), const_i64(j))
                                src = b.add(b.mul(ch, const_i64(h * w)),
                                            b.add(b.mul(iy, const_i64(w)), ix))
                                val = b.load(b.gep(xb, [src]))
                                if shift:
                                    val = b.xor(val, ir.Constant(I8, 0x80))
                                b.store(val, b.gep(planes, [b.add(dst, const_i64(j))]))

    def _fill_planes(self, xb, planes, phases, c, h, w, cp, prow, wq, psz, sh, sw, pt, pl,
                     xzp, dtype, zero: bool = True) -> None:
        """planes[ph, p, u, v, j] = x[2p + j, u*sh + py - pt, v*sw + px - pl] - x_zp, zero
        outside the image and past the last channel (int16): zero everything, then copy the
        rectangle of each phase that lies inside the image (its bounds are constants).
        ``zero`` False (no padding, an even channel count): the outputs kept read the image
        alone, so the cells outside it (read for the dropped columns and rows) stay as
        they are."""
        b = self.builder
        total = len(phases) * cp * psz * 2
        if zero:
            with for_range(b, const_i64(0), const_i64(total), "fz") as i:
                b.store(ir.Constant(I16, 0), b.gep(planes, [i]))
        for pi, (py, px) in enumerate(phases):
            u_lo = max(0, -(-(pt - py) // sh))
            u_hi = min(prow, (h + pt - py - 1) // sh + 1)
            v_lo = max(0, -(-(pl - px) // sw))
            v_hi = min(wq, (w + pl - px - 1) // sw + 1)
            if u_hi <= u_lo or v_hi <= v_lo:
                continue
            for p_lo, p_hi, chans in ((0, c // 2, 2), (c // 2, cp, 1)):
                if p_hi <= p_lo:
                    continue
                # AVX2: 8 pixels of the pair at a time (one load of 8 * sw bytes per channel,
                # every sw-th lane widened, the two channels interleaved), the rest one by one
                nvec = 0
                while (self.avx2 and v_lo + (nvec + 1) * PANEL <= v_hi
                       and (v_lo + nvec * PANEL) * sw + px - pl + PANEL * sw <= w):
                    nvec += 1
                with for_range(b, const_i64(p_lo), const_i64(p_hi), "fp") as p:
                    base = b.mul(b.add(const_i64(pi * cp), p), const_i64(psz * 2))
                    with for_range(b, const_i64(u_lo), const_i64(u_hi), "fu") as u:
                        iy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
                        row = b.add(base, b.mul(u, const_i64(wq * 2)))
                        if nvec:
                            self._fill_pair_vectors(xb, planes, p, chans, iy, row, v_lo, nvec,
                                                    h, w, sw, px - pl, xzp, dtype)
                        with for_range(b, const_i64(v_lo + nvec * PANEL), const_i64(v_hi),
                                       "fv") as v:
                            ix = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                            dst = b.add(row, b.mul(v, const_i64(2)))
                            for j in range(chans):
                                ch = b.add(b.mul(p, const_i64(2)), const_i64(j))
                                src = b.add(b.mul(ch, const_i64(h * w)),
                                            b.add(b.mul(iy, const_i64(w)), ix))
                                val = b.sub(self._widen(b.load(b.gep(xb, [src])), dtype), xzp)
                                b.store(b.trunc(val, I16),
                                        b.gep(planes, [b.add(dst, const_i64(j))]))

    def _fill_pair_vectors(self, xb, planes, p, chans: int, iy, row, v_lo: int, nvec: int,
                           h: int, w: int, sw: int, dx: int, xzp, dtype) -> None:
        """``_fill_planes``' inner loop, vectorized: plane columns v_lo .. v_lo + 8 nvec of
        row ``row`` (int16 index) from input row ``iy`` of channels 2p and 2p + 1 (``chans``
        2; else the second is zero): per channel one load of 8 * sw bytes from column
        v * sw + dx, lanes 0, sw, .. widened to int16 less x's zero point, the two interleaved
        into 8 words (a 32-byte store)."""
        b = self.builder
        v8i16 = ir.VectorType(I16, PANEL)
        src_ty = ir.VectorType(I8, PANEL * sw)
        every = ir.Constant(ir.VectorType(I32, PANEL), [j * sw for j in range(PANEL)])
        mix = ir.Constant(ir.VectorType(I32, 2 * PANEL),
                          [k for j in range(PANEL) for k in (j, j + PANEL)])
        zp = self._splat(b.trunc(xzp, I16), v8i16)
        with for_range(b, const_i64(0), const_i64(nvec), "fw") as q:
            v0 = b.add(const_i64(v_lo), b.mul(q, const_i64(PANEL)))
            ix = b.add(b.mul(v0, const_i64(sw)), const_i64(dx))
            vals = []
            for j in range(chans):
                ch = b.add(b.mul(p, const_i64(2)), const_i64(j))
                src = b.add(b.mul(ch, const_i64(h * w)), b.add(b.mul(iy, const_i64(w)), ix))
                raw = b.load(self._ptr(xb, src, src_ty), align=1)
                if sw > 1:
                    raw = b.shuffle_vector(raw, ir.Constant(src_ty, None), every)
                wide = b.zext(raw, v8i16) if dtype == "uint8" else b.sext(raw, v8i16)
                vals.append(b.sub(wide, zp))
            if chans == 1:
                vals.append(ir.Constant(v8i16, None))
            pair = b.shuffle_vector(vals[0], vals[1], mix)
            dst = b.add(row, b.mul(v0, const_i64(2)))
            b.store(pair, self._ptr(planes, dst, V16I16), align=2)
