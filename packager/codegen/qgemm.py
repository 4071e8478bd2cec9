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
``vpmaddubsw`` (u8 x s8, 32 per instruction) saturates its int16 pair sums, so it is used only
where every byte pair of weights keeps 255 (|w0| + |w1|) <= 32767 for same signs (always with
|w| <= 64), on the quad kernel below (``madd7``, passes/quad_weights.py ``w7``): ``vpmaddubsw``
+ ``vpmaddwd`` by ones is then ``vpdpbusd``, exact; full-range weights are split into such
main quads and residual words run in short per-row loops first (``split``,
ops/qconv_quads.py).

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
x86-64-v4+vnni (512-bit vectors, native vpdpbusd): the quad convolutions on zmm registers
(codegen/qgemm_conv.py ``_tile_dp16``, ``tile_zmm``, ``_requant_zmm``; static and run-time
image sizes; split weights merged back into int8 on each call, ``_merge_residual``; a fused
chain applied in the tile's epilogue and stored into the output where the plane rows are the
output's, ``tile_direct``) and ``qmatmul``'s tile rows as two zmm of two panels each
(codegen/qgemm_matmul.py ``tile_zmm``): 64 multiply-adds an instruction at the 256-bit form's
rate on Zen 5 (bench/int8_peak.py).
Not done: sdot depthwise (VNNI depthwise: codegen/qdepthwise.py), AVX-VNNI (VEX, no AVX-512),
``udot``/``usdot``.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import reduction_tag
from ..ops.qlinear import PANEL
from ..ops.quant import saturation_range
from .helpers import (F32, I8, I16, I32, STORAGE_TYPES, alloca_once, const_i64, for_range,
                      intrinsic)
from .lower import WORKSPACE_ALIGN, KernelEmitter, KernelInfo, bound_select
from .qchain import CHAIN_KINDS, chained, channel_offset, match_chain
from .vecmath_lanes import vector_math

V8I32 = ir.VectorType(I32, PANEL)
V16I16 = ir.VectorType(I16, 2 * PANEL)
V16I32 = ir.VectorType(I32, 2 * PANEL)
V8F32 = ir.VectorType(F32, PANEL)
V8I8 = ir.VectorType(I8, PANEL)
V16I8 = ir.VectorType(I8, 2 * PANEL)
MAGIC = 12582912.0   # 1.5 * 2**23: (f + M) - M rounds half to even for |f| < 2**22


def _count(count: int | ir.Value) -> ir.Value:
    return count if isinstance(count, ir.Value) else const_i64(count)


def match_qgemm(func: PrimFunc, kinds: tuple[str, ...] = ("qmatmul", "qconv2d"),
                sized: bool = False, chain: bool = False):
    """(kind, tag) when ``func`` is one of the integer ops ``kinds`` (an opaque op, so its
    inputs are the op's arguments in order), else None. ``chain``: the caller's kernel takes
    an elementwise chain after a float32 result (codegen/qchain.py: the op's arguments are
    then the first inputs, the chain's follow); without it a function with a chain is no
    match."""
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
                    n = len(tag.operands)
                    if [o.uid for o in tag.operands] != [i.uid for i in func.inputs[:n]]:
                        return None
                    has_chain = tag.kind in CHAIN_KINDS and chained(func, tag)
                    if (has_chain and (not chain or match_chain(func, tag) is None)) or (
                            not has_chain and len(func.inputs) != n):
                        return None
                    # run-time extents: only where the caller emits them (``sized``)
                    if not sized and any(not isinstance(d, int)
                                         for d in func.outputs[0].shape):
                        return None
                    return tag.kind, tag
            if isinstance(node, te.Read):
                stack.append(node.tensor)
    return None


def align_workspace(n: int) -> int:
    return -(-n // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


class QEmitter(KernelEmitter):
    # the 8-bit result's clamp, when narrower than its type's (codegen/qdepthwise.py: a table's
    # columns that differ; the entries past them are the ends')
    sat_range: tuple[float, float] | None = None

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, tag, avx2: bool,
                 size_vars: tuple[str, ...] = ()):
        # size_vars: a kernel with run-time extents reads them (KernelEmitter._dim_value)
        super().__init__(module, func, symbol, size_vars)
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
        if getattr(self, "signed_x", False):
            return self._dp_signed(acc, a, w)
        if getattr(self, "madd7", False) and self.avx2:
            # weights of 7 bits (|w| <= 64): vpmaddubsw's int16 pair sums (u8 x s8) stay
            # within +-32640, never saturate; vpmaddwd by ones adds the two pairs of each quad
            v16i16 = ir.VectorType(I16, 16)
            ub = intrinsic(self.module, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [v32i8, v32i8])
            pairs = b.call(ub, [a, w])
            return b.add(acc, self._madd(pairs, ir.Constant(v16i16, [1] * 16)))
        if getattr(self, "ssse3", False):
            # x86-64-v2: the same two instructions on 128-bit halves (SSSE3 pmaddubsw, SSE2
            # pmaddwd by ones)
            v16i8, v8i16, v4i32 = (ir.VectorType(I8, 16), ir.VectorType(I16, 8),
                                   ir.VectorType(I32, 4))
            ub = intrinsic(self.module, "llvm.x86.ssse3.pmadd.ub.sw.128", v8i16, [v16i8, v16i8])
            wd = intrinsic(self.module, "llvm.x86.sse2.pmadd.wd", v4i32, [v8i16, v8i16])
            ones = ir.Constant(v8i16, [1] * 8)
            parts = []
            for k in range(2):
                m = ir.Constant(ir.VectorType(I32, 16), list(range(16 * k, 16 * k + 16)))
                pairs = b.call(ub, [b.shuffle_vector(a, a, m), b.shuffle_vector(w, w, m)])
                parts.append(b.call(wd, [pairs, ones]))
            return b.add(acc, b.shuffle_vector(parts[0], parts[1],
                                               ir.Constant(V8I32, list(range(8)))))
        if getattr(self, "madd7", False) and not getattr(self, "vnni_emulated", False):
            # x86 without AVX2 or SSSE3 (x86-64 v1): the bytes widened to int16 (exact products
            # for any weights), pair sums with ``_madd`` (pmaddwd on SSE2), the two pairs of
            # each quad added
            v32i16 = ir.VectorType(I16, 32)
            a16, w16 = b.zext(a, v32i16), b.sext(w, v32i16)
            halves = [ir.Constant(ir.VectorType(I32, 16), list(range(16 * k, 16 * k + 16)))
                      for k in range(2)]
            sums = [self._madd(b.shuffle_vector(a16, a16, m), b.shuffle_vector(w16, w16, m))
                    for m in halves]
            cat = b.shuffle_vector(sums[0], sums[1],
                                   ir.Constant(ir.VectorType(I32, 16), list(range(16))))
            even = b.shuffle_vector(cat, cat, ir.Constant(V8I32, list(range(0, 16, 2))))
            odd = b.shuffle_vector(cat, cat, ir.Constant(V8I32, list(range(1, 16, 2))))
            return b.add(acc, b.add(even, odd))
        if getattr(self, "vnni_emulated", False):
            v32i32 = ir.VectorType(I32, 32)
            p = b.mul(b.zext(a, v32i32), b.sext(w, v32i32))
            for j in range(4):
                part = b.shuffle_vector(p, p, ir.Constant(V8I32, list(range(j, 32, 4))))
                acc = b.add(acc, part)
            return acc
        f = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.256", V8I32, [V8I32, v32i8, v32i8])
        return b.call(f, [acc, a, w])

    def _dp_signed(self, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
        """``_dpbusd`` on *int8* activations ``a`` (the planes of a ``signed_x`` kernel: uint8
        x - 128, int8 x as is) and int8 weights ``w`` in [-127, 127] (no -128), exact for all
        of them: ``vpmaddubsw``(|a|, sign(w, a)) multiplies |a| <= 128 (uint8) by +-w (int8,
        |w| <= 127, ``vpsignb``: -w where a < 0, 0 where a = 0), so a byte pair's sum is at
        most 2 x 128 x 127 = 32512 in magnitude and never saturates, whatever the weights;
        ``vpmaddwd`` by ones adds each quad's two pairs. The |a| of a plane vector is the same
        for every row of the tile (LLVM computes it once). x86-64-v2: SSSE3's 128-bit
        ``pabsb`` / ``psignb`` / ``pmaddubsw`` + ``pmaddwd``; a VNNI level: ``vpdpbusd`` on the
        same (|a|, sign(w, a)); x86-64 v1 and the emulation: the exact products of the
        sign-extended bytes."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        v32i32 = ir.VectorType(I32, 32)
        native = getattr(self, "vnni", False) and not getattr(self, "madd7", False)
        if self.avx2 and not getattr(self, "vnni_emulated", False):
            absb = intrinsic(self.module, "llvm.abs.v32i8", v32i8, [v32i8, ir.IntType(1)])
            sign = intrinsic(self.module, "llvm.x86.avx2.psign.b", v32i8, [v32i8, v32i8])
            ua = b.call(absb, [a, ir.Constant(ir.IntType(1), 0)])
            sw = b.call(sign, [w, a])
            if native:
                f = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.256", V8I32,
                              [V8I32, v32i8, v32i8])
                return b.call(f, [acc, ua, sw])
            v16i16 = ir.VectorType(I16, 16)
            ub = intrinsic(self.module, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [v32i8, v32i8])
            return b.add(acc, self._madd(b.call(ub, [ua, sw]), ir.Constant(v16i16, [1] * 16)))
        if getattr(self, "ssse3", False):
            v16i8, v8i16, v4i32 = (ir.VectorType(I8, 16), ir.VectorType(I16, 8),
                                   ir.VectorType(I32, 4))
            absb = intrinsic(self.module, "llvm.abs.v16i8", v16i8, [v16i8, ir.IntType(1)])
            sign = intrinsic(self.module, "llvm.x86.ssse3.psign.b.128", v16i8, [v16i8, v16i8])
            ub = intrinsic(self.module, "llvm.x86.ssse3.pmadd.ub.sw.128", v8i16, [v16i8, v16i8])
            wd = intrinsic(self.module, "llvm.x86.sse2.pmadd.wd", v4i32, [v8i16, v8i16])
            ones = ir.Constant(v8i16, [1] * 8)
            parts = []
            for k in range(2):
                m = ir.Constant(ir.VectorType(I32, 16), list(range(16 * k, 16 * k + 16)))
                ah, wh = b.shuffle_vector(a, a, m), b.shuffle_vector(w, w, m)
                pairs = b.call(ub, [b.call(absb, [ah, ir.Constant(ir.IntType(1), 0)]),
                                    b.call(sign, [wh, ah])])
                parts.append(b.call(wd, [pairs, ones]))
            return b.add(acc, b.shuffle_vector(parts[0], parts[1],
                                               ir.Constant(V8I32, list(range(8)))))
        # x86-64 v1, the VNNI emulation: exact products of the sign-extended bytes
        p = b.mul(b.sext(a, v32i32), b.sext(w, v32i32))
        for j in range(4):
            acc = b.add(acc, b.shuffle_vector(p, p, ir.Constant(V8I32, list(range(j, 32, 4)))))
        return acc

    def _quad_shift(self, dtype: str) -> int:
        """What the quad kernels add to x (a xor with 0x80): vpdpbusd takes uint8, so int8 x
        + 128; aarch64's sdot takes int8, so uint8 x - 128; else 0."""
        if getattr(self, "sdot", False) or getattr(self, "signed_x", False):
            return -128 if dtype == "uint8" else 0
        return 128 if dtype == "int8" else 0

    def _task_span(self, parallel: bool, regions: int, count: int | ir.Value, task: ir.Value,
                   ntasks: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """This task's [lo, hi) of ``count`` work items and its workspace region: the items
        split evenly over min(ntasks, regions) tasks, the tasks past those returning at once
        (a pool with more threads than the kernel has regions); one task does everything when
        the kernel is not parallel. ``count``: an int, or a run-time value (open sizes)."""
        if not parallel:
            return const_i64(0), _count(count), const_i64(0)
        b = self.builder
        cap = const_i64(regions)
        eff = b.select(b.icmp_signed("<", ntasks, cap), ntasks, cap)
        with b.if_then(b.icmp_signed(">=", task, eff), likely=False):
            b.ret_void()
        lo = b.sdiv(b.mul(task, _count(count)), eff)
        hi = b.sdiv(b.mul(b.add(task, const_i64(1)), _count(count)), eff)
        return lo, hi, task

    def _zero_points(self, x_zp: te.Tensor, y_zp: te.Tensor,
                     shift: int | None = None) -> ir.Value:
        """x's zero point as int32 (a DynamicQuantizeLinear's uint8/int8 one widened), plus
        ``shift`` where given (the quad kernels' planes hold x + ``_quad_shift``), and for
        integer outputs y's as the epilogue's vector, ``self.y_zp``."""
        b = self.builder
        xzp = b.load(self.buffers[x_zp.uid])
        if x_zp.dtype != "int32":
            xzp = self._widen(xzp, x_zp.dtype)
        if shift is not None:
            xzp = b.add(xzp, ir.Constant(I32, shift))
        if not self.float_out:
            self.y_zp = self._splat(b.load(self.buffers[y_zp.uid]), V8F32)
        return xzp

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
        lo, hi = self.sat_range or saturation_range(self.dtype)
        zp = self.y_zp
        lo_v = b.fsub(self._splat(ir.Constant(F32, float(lo)), V8F32), zp)
        hi_v = b.fsub(self._splat(ir.Constant(F32, float(hi)), V8F32), zp)
        f = b.select(b.fcmp_ordered("<", f, lo_v), lo_v, f)
        f = b.select(b.fcmp_ordered(">", f, hi_v), hi_v, f)
        magic = self._splat(ir.Constant(F32, MAGIC), V8F32)
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
        lo, hi = self.sat_range or saturation_range(self.dtype)
        zp = self.y_zp
        lo_v = b.fsub(self._splat(ir.Constant(F32, float(lo)), V8F32), zp)
        hi_v = b.fsub(self._splat(ir.Constant(F32, float(hi)), V8F32), zp)
        f = b.select(b.fcmp_ordered("<", f, lo_v), lo_v, f)
        f = b.select(b.fcmp_ordered(">", f, hi_v), hi_v, f)
        cvt = intrinsic(self.module, "llvm.x86.avx.cvt.ps2dq.256", V8I32, [V8F32])
        q = b.add(b.call(cvt, [f]), b.fptosi(zp, V8I32))
        return q if wide else b.trunc(q, self.out_vec)

    def _lut_chunk(self, src, dst, tb, at, signed: bool) -> None:
        """dst[at + i] = tb[src[at + i]] for i < 32 (``signed``: int8 bytes, which index from
        tb + 128) with AVX2 ``vpshufb``: the 256-byte row as 16 chunks of 16 bytes, each looked
        up by the index's low nibble and kept where its high nibble is the chunk's (16 pshufb +
        compare + blend per 32 bytes, against one scalar load per byte)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        shuf = intrinsic(self.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
        both = ir.Constant(ir.VectorType(I32, 32), list(range(16)) * 2)
        low = ir.Constant(v32i8, [0x0F] * 32)
        v = b.load(self._ptr(src, at, v32i8), align=1)
        if signed:
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

    def _lookup_cols(self, v: ir.Value, tb: ir.Value, cols: tuple[int, int],
                     signed: bool) -> ir.Value:
        """<32 x i8> ``tb[v]`` (int8 values index from tb + 128) on a register (a ``vpshufb``
        + compare + blend per 16-byte chunk, as ``_lut_chunk``) over the chunks of the columns
        ``cols`` (lo, hi) that ``v`` can hold (the first chunk needs no blend)."""
        b = self.builder
        v32i8 = ir.VectorType(I8, 32)
        shuf = intrinsic(self.module, "llvm.x86.avx2.pshuf.b", v32i8, [v32i8, v32i8])
        both = ir.Constant(ir.VectorType(I32, 32), list(range(16)) * 2)
        if signed:
            v = b.xor(v, ir.Constant(v32i8, [0x80] * 32))
        lo_n = b.and_(v, ir.Constant(v32i8, [0x0F] * 32))
        hi_n = b.lshr(v, ir.Constant(v32i8, [4] * 32))
        res = None
        for k in range(cols[0] // 16, cols[1] // 16 + 1):
            t = b.load(self._ptr(tb, const_i64(16 * k), V16I8), align=1)
            part = b.call(shuf, [b.shuffle_vector(t, t, both), lo_n])
            res = part if res is None else b.select(
                b.icmp_unsigned("==", hi_n, ir.Constant(v32i8, [k] * 32)), part, res)
        return res

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

    # ---- an elementwise chain after a float32 result (codegen/qchain.py) ----------------------

    chain = None    # the matched chain (qchain.Chain), set by the entry points that take one

    def chain_vector(self, value: ir.Value, channel: ir.Value,
                     channel_lanes: bool = False) -> ir.Value:
        """``self.chain`` on ``value`` (<n x float>: the kernel's float32 results of channel
        ``channel``, an i64; with ``channel_lanes`` of channels ``channel`` .. + n, one a
        lane): the chain's result, <n x float> or <n x i8>. The operations are the generic
        loop nest's, lane by lane (max / min against a constant as one compare and select,
        math functions with vecmath's polynomials, round as roundeven), without contracting
        multiply-adds."""
        b = self.builder
        ch = self.chain
        n = value.type.count
        vty = ir.VectorType(F32, n)
        memo: dict[int, ir.Value] = {ch.mid.uid: value}

        def stage_value(t: te.Tensor) -> ir.Value:
            if t.uid not in memo:
                memo[t.uid] = node(t.body, t, {})
            return memo[t.uid]

        def lanes(e: te.Read, stage: te.Tensor) -> ir.Value:
            """A placeholder's values (per tensor, or per channel), loaded, as <n x T>."""
            stride, by_channel = channel_offset(e, stage)
            ptr = self.buffers[e.tensor.uid]
            el = STORAGE_TYPES[e.tensor.dtype]
            if not by_channel:
                return self._splat(b.load(ptr), ir.VectorType(el, n))
            at = b.mul(channel, const_i64(stride))
            if not channel_lanes:
                return self._splat(b.load(b.gep(ptr, [at], inbounds=True)),
                                   ir.VectorType(el, n))
            assert stride == 1, "per-channel values one after another (qchain.match_chain)"
            return b.load(self._ptr(ptr, at, ir.VectorType(el, n)), align=1)

        def node(e: te.Expr, stage: te.Tensor, seen: dict) -> ir.Value:
            if id(e) in seen:
                return seen[id(e)]
            if isinstance(e, te.Read):
                if e.tensor.body is not None or e.tensor.uid == ch.mid.uid:
                    v = stage_value(e.tensor)
                else:
                    v = lanes(e, stage)
            elif isinstance(e, te.Const):
                v = ir.Constant(vty, [float(e.value)] * n)
            elif isinstance(e, te.Binary):
                x, y = node(e.a, stage, seen), node(e.b, stage, seen)
                if e.op in ("max", "min"):
                    if isinstance(e.b, te.Const):
                        v = bound_select(b, e.op, x, y)
                    elif isinstance(e.a, te.Const):
                        v = bound_select(b, e.op, y, x)
                    else:
                        name = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.v{n}f32"
                        v = b.call(intrinsic(self.module, name, vty, [vty, vty]), [x, y])
                else:
                    v = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[e.op](x, y)
            elif isinstance(e, te.Compare):
                sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
                       "ne": "!="}[e.op]
                x, y = node(e.a, stage, seen), node(e.b, stage, seen)
                v = b.fcmp_unordered(sym, x, y) if e.op == "ne" else b.fcmp_ordered(sym, x, y)
            elif isinstance(e, te.Select):
                v = b.select(node(e.cond, stage, seen), node(e.a, stage, seen),
                             node(e.b, stage, seen))
            elif isinstance(e, te.MathCall):
                v = vector_math(b, e.name, node(e.arg, stage, seen))
            elif isinstance(e, te.Cast):
                inner = e.value
                if e.dtype != "float32":            # the last stage's quantize: clamped before
                    wide = b.fptosi(node(inner, stage, seen), ir.VectorType(I32, n))
                    v = b.trunc(wide, ir.VectorType(I8, n))
                elif inner.dtype == "float32":
                    v = node(inner, stage, seen)
                else:                               # a zero point: an integer placeholder
                    raw = lanes(inner, stage)
                    v = (b.uitofp(raw, vty) if inner.tensor.dtype.startswith("uint")
                         else b.sitofp(raw, vty))
            else:
                raise AssertionError(f"not in a chain: {type(e).__name__}")
            seen[id(e)] = v
            return v

        return stage_value(ch.out)

    def chain_copy(self, src: ir.Value, dst: ir.Value, n, channel: ir.Value) -> None:
        """dst[i] = chain(src[i]) for i < ``n`` (an int or a run-time i64): float32 ``src``
        (staging rows of channel ``channel``), 8 lanes a step (16 on 512-bit levels); the last
        partial vector through a copy (no load or store past ``n``)."""
        b = self.builder
        lanes = 16 if getattr(self, "vl", 8) >= 16 else 8
        vty = ir.VectorType(F32, lanes)
        out_el = STORAGE_TYPES[self.chain.out.dtype]
        n = const_i64(n) if isinstance(n, int) else n
        full = b.udiv(n, const_i64(lanes))
        with for_range(b, const_i64(0), full, "chv") as i:
            at = b.mul(i, const_i64(lanes))
            r = self.chain_vector(b.load(self._ptr(src, at, vty), align=4), channel)
            b.store(r, self._ptr(dst, at, r.type), align=1)
        at = b.mul(full, const_i64(lanes))
        left = b.sub(n, at)
        with b.if_then(b.icmp_signed(">", left, const_i64(0)), likely=False):
            tmp = alloca_once(b, vty, "chain_in")
            b.store(ir.Constant(vty, None), tmp)
            elts = b.bitcast(tmp, F32.as_pointer())
            with for_range(b, const_i64(0), left, "chl") as k:
                b.store(b.load(b.gep(src, [b.add(at, k)])), b.gep(elts, [k]))
            r = self.chain_vector(b.load(tmp), channel)
            res = alloca_once(b, r.type, "chain_out")
            b.store(r, res)
            outs = b.bitcast(res, out_el.as_pointer())
            with for_range(b, const_i64(0), left, "chs") as k:
                b.store(b.load(b.gep(outs, [k])), b.gep(dst, [b.add(at, k)]))

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
