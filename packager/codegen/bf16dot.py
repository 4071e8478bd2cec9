"""The kernel of ``matmul_bf16p`` (ops/bf16.py): A [..., M, K] float32 times a constant B stored
as bfloat16 in K pairs, float32 accumulation (``mlcpack export --precision bf16``,
docs/precision.md).

It is the register-blocked matmul of codegen/contraction/ (``ContractionEmitter``: task split,
panels, tiles, the fused epilogue) with its own inner loop:

- **x86-64-v4+bf16** (avx512_bf16, 16 lanes): ``vdpbf16ps``. Per tile, the activations of its
  rows are converted to bfloat16 ``A_CHUNK`` at a time into a stack buffer with
  ``vcvtne2ps2bf16`` (round to nearest even; zero past K), so that one 32-bit word holds a pair
  (a[2j], a[2j + 1]); each step broadcasts a row's word against one vector of B's pair words
  (16 columns x 2 rows of K) and accumulates both products into the float32 lane.
- **every other level** (x86-64-v2/v3/v4, 4 to 16 lanes): one 32-bit load of B's pair words gives
  two float32 vectors, the even row by a shift left of 16 and the odd row by masking the high
  half (both exact), and the products are float32 FMAs of unrounded activations, in the order
  of k as the fp32 kernel's.

- **aarch64+bf16** (FEAT_BF16, 4 lanes): ``bfdot`` in the same data path: the activations
  converted with ``bfcvtn`` (``fptrunc`` to bfloat: round to nearest even by FPCR, denormals
  kept), each step a row's pair word broadcast against one vector of 4 columns' pair words.

``vdpbf16ps``'s arithmetic (Intel SDM): for each lane, acc += a_odd * b_odd, then acc += a_even *
b_even, each an FMA rounded to nearest even, with denormal inputs read as zero and denormal
results flushed to zero, MXCSR ignored; tests/kernels/test_bf16_dot_v4.py models it in numpy.
``bfdot``'s (Arm ARM ``BFDotAdd`` without FEAT_EBF16 or with FPCR.EBF 0, Linux's default): per
lane acc + (a_even * b_even + a_odd * b_odd), the sum of the two products rounded, then its sum
with acc, both **round to odd**, denormal inputs and results flushed to zero, FPCR ignored
(qemu's ``bfdotadd`` does the same); tests/kernels/test_bf16_aarch64.py models it in numpy."""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ops.bf16 import PAIR_KIND
from .contraction.kernel import ContractionEmitter
from .contraction.match import Contraction, match_contraction
from .helpers import F32, I32, alloca_once, const_i64, for_range, intrinsic
from .lower import KernelInfo


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no such type): the element of vdpbf16ps's operands."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


BF16 = _BFloat()
DOT_LANES = 16
# activations converted per chunk of K: a tile's rows x A_CHUNK / 2 words on the stack (6 rows:
# 3 KiB)
A_CHUNK = 256
LLVM_FEATURE = "+avx512bf16"
# the dot instructions by the LLVM feature that enables them, and their float32 lanes
VDPBF16PS, BFDOT = "vdpbf16ps", "bfdot"
DOT_KINDS = {LLVM_FEATURE: VDPBF16PS, "+bf16": BFDOT}
KIND_LANES = {VDPBF16PS: DOT_LANES, BFDOT: 4}


def dot_kind(llvm_features: str) -> str | None:
    """The bf16 dot instruction a target's LLVM features enable: ``VDPBF16PS`` (x86-64-v4+bf16),
    ``BFDOT`` (aarch64+bf16), or None."""
    for feature in llvm_features.split(","):
        if feature in DOT_KINDS:
            return DOT_KINDS[feature]
    return None


def bfcvtn_words(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, interleave: bool) -> ir.Value:
    """aarch64+bf16: two vectors of ``vl`` float32 rounded to bfloat16 (``bfcvtn``: round to
    nearest even by FPCR, denormals kept) as ``vl`` 32-bit words, the first of each pair in the
    low half: ``interleave`` False, lo's values then hi's (word w = elements 2w, 2w + 1 of
    lo || hi, the matmul's K pairs); True, word l = (lo[l], hi[l]) (the conv's channel pairs)."""
    vl = lo.type.count
    parts = [b.fptrunc(x, ir.VectorType(BF16, vl)) for x in (lo, hi)]
    order = ([k for lane in range(vl) for k in (lane, lane + vl)] if interleave
             else list(range(2 * vl)))
    mixed = b.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(I32, 2 * vl), order))
    return b.bitcast(mixed, ir.VectorType(I32, vl))


def bf16_bits_portable(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """vcvtne2ps2bf16's rounding of 16 float32 lanes in integer IR (tests:
    ``CompileOptions.bf16_emulate``): the bfloat16 bits in each lane's low half, round to
    nearest even, denormals to signed zero (NaNs not quieted: finite inputs only)."""
    ivec = ir.VectorType(I32, DOT_LANES)

    def splat(c: int) -> ir.Constant:
        return ir.Constant(ivec, [c] * DOT_LANES)

    bits = b.bitcast(x, ivec)
    lsb = b.and_(b.lshr(bits, splat(16)), splat(1))
    rounded = b.lshr(b.add(b.add(bits, splat(0x7FFF)), lsb), splat(16))
    denormal = b.icmp_unsigned("==", b.and_(bits, splat(0x7F800000)), splat(0))
    return b.select(denormal, b.lshr(b.and_(bits, splat(-0x80000000)), splat(16)), rounded)


def dot_words(b: ir.IRBuilder, module: ir.Module, acc: ir.Value, pairs: ir.Value,
              words: ir.Value, emulate: bool, kind: str = VDPBF16PS) -> ir.Value:
    """``vdpbf16ps``: acc (16 float32) + per lane the product of the two operands' odd
    halves, then of their even halves (``pairs``, ``words``: 16 lanes of bfloat16 pairs as
    i32). ``emulate``: in portable IR, each product one float32 FMA (bf16 x bf16 products are
    exact in float32, so each rounds once, as vdpbf16ps; its DAZ/FTZ on denormals is not
    modelled). ``kind`` ``BFDOT``: aarch64's ``bfdot`` on 4 lanes (never emulated)."""
    if kind == BFDOT and not emulate:
        v4f, v8b = ir.VectorType(F32, 4), ir.VectorType(BF16, 8)
        dot = intrinsic(module, "llvm.aarch64.neon.bfdot.v4f32.v8bf16", v4f, [v4f, v8b, v8b])
        return b.call(dot, [acc, b.bitcast(pairs, v8b), b.bitcast(words, v8b)])
    vty = ir.VectorType(F32, DOT_LANES)
    if not emulate:
        v32b = ir.VectorType(BF16, 2 * DOT_LANES)
        dot = intrinsic(module, "llvm.x86.avx512bf16.dpbf16ps.512", vty, [vty, v32b, v32b])
        return b.call(dot, [acc, b.bitcast(pairs, v32b), b.bitcast(words, v32b)])
    ivec = ir.VectorType(I32, DOT_LANES)
    fma = intrinsic(module, f"llvm.fma.v{DOT_LANES}f32", vty, [vty] * 3)
    high = ir.Constant(ivec, [-65536] * DOT_LANES)
    shift = ir.Constant(ivec, [16] * DOT_LANES)
    for part in (lambda w: b.and_(w, high), lambda w: b.shl(w, shift)):   # odd, then even
        acc = b.call(fma, [b.bitcast(part(pairs), vty), b.bitcast(part(words), vty), acc])
    return acc


def match_pairs(func: PrimFunc) -> Contraction | None:
    return match_contraction(func, kinds=(PAIR_KIND,))


class PairMatmulEmitter(ContractionEmitter):
    """``matmul_bf16p``: ``dot`` a ``DOT_KINDS`` instruction (vdpbf16ps, 16 lanes; bfdot, 4
    lanes); None, widened pair loads."""

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: Contraction,
                 vl: int, size_vars: tuple[str, ...] = (), dot: str | None = None,
                 emulate: bool = False) -> None:
        super().__init__(module, func, symbol, match, DOT_LANES if emulate else vl, size_vars)
        self._const_panels = True   # packed at export: no panel copy (_packs_b)
        self.emulate = emulate   # the vdpbf16ps path in portable IR (CompileOptions.bf16_emulate)
        self.kind = VDPBF16PS if emulate else dot
        self.dot = emulate or (dot is not None and self.vl == KIND_LANES[dot])
        self._a_words: ir.Value | None = None   # the converted activations, shared by blocks

    # The two places ContractionEmitter runs its microkernel on a block of rows of one panel.
    def _matmul_block(self, m0, rows: int, nv: int, a_base, b_base, bidx, n0, remaining, masks,
                      masked: bool, fill: bool = False) -> None:
        _, _, K, _ = self._matmul_shape()
        self._pair_block(m0, rows, nv, const_i64(K), a_base, b_base, bidx, n0, remaining, masks,
                         masked)

    def _matmul_rows(self, m0, mr: int, nv: int, K, a_base, b_base, bidx, n0, remaining, masks,
                     masked: bool) -> None:
        self._pair_block(m0, mr, nv, K, a_base, b_base, bidx, n0, remaining, masks, masked)

    def _pair_block(self, m0, rows: int, nv: int, K: ir.Value, a_base, b_base, bidx, n0,
                    remaining, masks, masked: bool) -> None:
        """Rows m0 .. m0 + rows of the panel at column n0: accumulate, then the epilogue."""
        b = self.builder
        vl = self.vl
        nrp = int(self.match.tag.attrs["nr"])
        assert nrp % vl == 0, (nrp, vl)
        _, _, _, N = self._matmul_shape()
        words = b.bitcast(b_base, I32.as_pointer())
        pairs = b.ashr(b.add(K, const_i64(1)), const_i64(1))
        padded = b.mul(b.sdiv(b.add(self._dim_value(N), const_i64(nrp - 1)), const_i64(nrp)),
                       const_i64(nrp))
        # word offset of pair row 0 of vector v; a vector wholly past the last panel (a tile
        # wider than what is left of N) reads panel 0: computed, never stored
        bases = []
        for v in range(nv):
            col = b.add(n0, const_i64(v * vl))
            off = b.add(b.mul(b.sdiv(col, const_i64(nrp)), b.mul(pairs, const_i64(nrp))),
                        b.srem(col, const_i64(nrp)))
            bases.append(b.select(b.icmp_signed("<", col, padded), off, const_i64(0)))
        a_rows = [b.gep(a_base, [b.mul(b.add(m0, const_i64(i)), K)], inbounds=True)
                  for i in range(rows)]
        accs = [alloca_once(b, self.vty, name=f"acc{i}_{v}") for i in range(rows)
                for v in range(nv)]
        for a in accs:
            b.store(ir.Constant(self.vty, [0.0] * vl), a)
        if self.dot:
            self._dot_loop(rows, nv, K, a_rows, words, bases, accs)
        else:
            self._widen_loop(rows, nv, K, a_rows, words, bases, accs)
        self._begin_epilogue()
        # one vector of padding: the vectorized epilogue may load a vector from any element
        tile = alloca_once(b, ir.ArrayType(F32, (rows * nv + 1) * vl), name="tile")
        tile_f = b.bitcast(tile, F32.as_pointer())
        for q, a in enumerate(accs):
            b.store(b.load(a), self._vec_ptr(tile_f, const_i64(q * vl)), align=4)
        self._store_matmul_tile(tile_f, bidx, m0, rows, nv, n0, remaining, masks, masked)

    def _pair_words(self, words, base, pair) -> ir.Value:
        """The vector of B's pair words of ``pair`` at a vector's ``base``."""
        b = self.builder
        nrp = int(self.match.tag.attrs["nr"])
        ivec = ir.VectorType(I32, self.vl)
        ptr = b.gep(words, [b.add(base, b.mul(pair, const_i64(nrp)))], inbounds=True)
        return b.load(b.bitcast(ptr, ivec.as_pointer()), align=4)

    def _widen_loop(self, rows, nv, K, a_rows, words, bases, accs) -> None:
        """float32 FMAs on B's pairs widened: the even row ``word << 16``, the odd row
        ``word & 0xFFFF0000``; an odd K's last row alone."""
        b = self.builder
        ivec = ir.VectorType(I32, self.vl)
        shift = ir.Constant(ivec, [16] * self.vl)
        high = ir.Constant(ivec, [-65536] * self.vl)   # 0xFFFF0000

        def a_splat(i, k):
            return self._splat(b.load(b.gep(a_rows[i], [k], inbounds=True)))

        def step(kp, both: bool) -> None:
            vals = [b.load(a) for a in accs]
            raw = [self._pair_words(words, bases[v], kp) for v in range(nv)]
            even = [b.bitcast(b.shl(r, shift), self.vty) for r in raw]
            odd = [b.bitcast(b.and_(r, high), self.vty) for r in raw] if both else None
            k0 = b.mul(kp, const_i64(2))
            for i in range(rows):
                a0 = a_splat(i, k0)
                a1 = a_splat(i, b.add(k0, const_i64(1))) if both else None
                for v in range(nv):
                    q = i * nv + v
                    vals[q] = self._fma(a0, even[v], vals[q])
                    if both:
                        vals[q] = self._fma(a1, odd[v], vals[q])
            for a, val in zip(accs, vals):
                b.store(val, a)

        full = b.ashr(K, const_i64(1))
        with for_range(b, const_i64(0), full, "kp") as kp:
            step(kp, True)
        with b.if_then(b.icmp_signed("!=", b.and_(K, const_i64(1)), const_i64(0))):
            step(full, False)

    def _dot_loop(self, rows, nv, K, a_rows, words, bases, accs) -> None:
        """vdpbf16ps (bfdot) on activations converted a chunk of K at a time (vcvtne2ps2bf16,
        bfcvtn)."""
        b = self.builder
        vl = self.vl
        v32b, ivec = ir.VectorType(BF16, 2 * vl), ir.VectorType(I32, vl)
        cvt = None if self.kind == BFDOT else intrinsic(
            self.module, "llvm.x86.avx512bf16.cvtne2ps2bf16.512", v32b, [self.vty, self.vty])
        chunk_words = A_CHUNK // 2
        if self._a_words is None:   # one buffer for the tile's rows, whichever block runs
            most = max(rows, self._matmul_tile()[0])
            buf = alloca_once(b, ir.ArrayType(I32, most * chunk_words), name="a_bf16")
            with b.goto_block(b.function.entry_basic_block):
                b.position_after(buf)
                self._a_words = b.bitcast(buf, I32.as_pointer())
        buf_i = self._a_words
        chunks = b.sdiv(b.add(K, const_i64(A_CHUNK - 1)), const_i64(A_CHUNK))
        with for_range(b, const_i64(0), chunks, "kc") as kc:
            k0 = b.mul(kc, const_i64(A_CHUNK))
            left = b.sub(K, k0)
            length = b.select(b.icmp_signed("<", left, const_i64(A_CHUNK)), left,
                              const_i64(A_CHUNK))
            # rows x length activations -> bfloat16 pairs, 2 * vl at a time, zero past K
            with for_range(b, const_i64(0), b.ashr(b.add(length, const_i64(2 * vl - 1)),
                                                   const_i64((2 * vl).bit_length() - 1)),
                           "kq") as kq:
                e0 = b.mul(kq, const_i64(2 * vl))
                rem = b.sub(length, e0)
                lo_mask, hi_mask = self._lane_mask(rem, 0), self._lane_mask(rem, 1)
                for i in range(rows):
                    ptr = b.gep(a_rows[i], [b.add(k0, e0)])
                    lo = self._masked_load(b.bitcast(ptr, self.vty.as_pointer()), lo_mask)
                    hi = self._masked_load(b.bitcast(b.gep(ptr, [const_i64(vl)]),
                                                     self.vty.as_pointer()), hi_mask)
                    if self.kind == BFDOT:   # lo's 4 then hi's (bfcvtn)
                        packed = bfcvtn_words(b, lo, hi, interleave=False)
                    elif self.emulate:   # lo's 16 bfloat16 then hi's
                        i16v = ir.VectorType(ir.IntType(16), vl)
                        halves = [b.trunc(bf16_bits_portable(b, x), i16v) for x in (lo, hi)]
                        packed = b.bitcast(b.shuffle_vector(
                            halves[0], halves[1],
                            ir.Constant(ir.VectorType(I32, 2 * vl), list(range(2 * vl)))), ivec)
                    else:
                        packed = b.bitcast(b.call(cvt, [hi, lo]), ivec)   # lo's 16 first
                    dst = b.gep(buf_i, [b.add(const_i64(i * chunk_words),
                                              b.mul(kq, const_i64(vl)))], inbounds=True)
                    b.store(packed, b.bitcast(dst, ivec.as_pointer()), align=4)
            first = b.mul(kc, const_i64(chunk_words))
            with for_range(b, const_i64(0), b.ashr(b.add(length, const_i64(1)), const_i64(1)),
                           "kp") as kp:
                vals = [b.load(a) for a in accs]
                wv = [self._pair_words(words, bases[v], b.add(first, kp)) for v in range(nv)]
                for i in range(rows):
                    word = b.load(b.gep(buf_i, [b.add(const_i64(i * chunk_words), kp)],
                                        inbounds=True))
                    pair = self._splat_i32(word)
                    for v in range(nv):
                        q = i * nv + v
                        vals[q] = dot_words(b, self.module, vals[q], pair, wv[v],
                                            self.emulate, self.kind)
                for a, val in zip(accs, vals):
                    b.store(val, a)

    def _splat_i32(self, x: ir.Value) -> ir.Value:
        b = self.builder
        ivec = ir.VectorType(I32, self.vl)
        v = b.insert_element(ir.Constant(ivec, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(ivec, None),
                                ir.Constant(ivec, [0] * self.vl))


def emit_pair_matmul(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                     llvm_features: str, size_vars: tuple[str, ...] = (),
                     emulate: bool = False) -> KernelInfo | None:
    """The kernel of a ``matmul_bf16p`` ``func`` (static or symbolic shapes), None for any
    other function; ``llvm_features`` with avx512_bf16 (and 16 lanes) takes vdpbf16ps, with
    aarch64's bf16 (4 lanes) bfdot; ``emulate`` vdpbf16ps's data path in portable IR (tests)."""
    match = match_pairs(func)
    if match is None:
        return None
    return PairMatmulEmitter(module, func, symbol, match, vl, size_vars,
                             dot=dot_kind(llvm_features), emulate=emulate).emit()
