"""A direct kernel for depthwise convolutions (NCHW float32, ``groups`` == input channels, one
input channel per group, any channel multiplier, any window, padding and vertical stride,
horizontal stride 1 or 2), with the same fused epilogue as the register-blocked kernels.

Each task takes whole (image, output channel) planes. Its kh*kw weights are broadcast once per
plane; every output row is computed ``vl`` outputs (a *chunk*) at a time, ``ROW_BLOCK`` rows
together where no window row is padding (each input row's vectors then feed every output row
that reads it). For a chunk starting at output column ``ox0``, tap kx needs the input row's
``x[ix0 + kx + sw * j]`` (``ix0 = ox0 * sw - pl``, lanes j < vl):

- stride 1: one (unaligned) load per tap; on Zen 4 faster than two loads and lane shifts;
- stride 2: taps 0 and 1 are the even and odd lanes of the two vectors from ix0, tap 2m + p the
  same shifted by m lanes, topped up from the vector after them (3 loads and 3 shuffles for a
  3-wide window); taps beyond that reach are loaded and deinterleaved on their own.

Rows narrower than half a vector use half-width vectors (7-wide rows: 8 lanes on AVX-512).
Small planes skip the rows at AVX-512: stride 1 with output rows of at most two vectors (or
several rows a vector: 7x7 two rows of 7) unrolled in bands of 16 accumulators, a window column
at a time, each input row loaded once per column with constant masks (``_emit_packed_plane``;
it replaced 7x7 and 8x8 planes' flat runs of vectors, whose every tap was its own load:
PP-LCNet's 5x5 on 7x7x512 12.6 -> 9.4 us, on 14x14x256 21.5 -> 12.3), stride 2 with output
rows up to a vector wide from whole input-row vectors, each tap one two-source permute
(``_emit_s2_plane``).

Padding costs no bounds checks in the inner loops: output rows are grouped (at compile time)
by which window rows lie inside the image, and chunks whose reads lie inside the row and whose
outputs are all inside it (the *interior*) run plain loads and stores; the few border chunks
load with masks (lanes outside the row read 0) and store with one.

That is the AVX-512 path. With narrower vectors (AVX2, SSE, NEON), where masked loads are slow
(AMD's vmaskmovps) or scalarized, and 8-lane cross-lane shuffles cost more than loads, each
task first copies its plane into a zero-margined row buffer of its own (``padded``), with zero
rows above and below the plane's: every chunk then loads plainly, every output row's window
lies inside the buffer (one group of rows: one copy of the row block's code, where a group per
border row's window made 2-3x the IR for a 5x5 window, all of it compile time), a row's
partial last chunk stores its lanes in pieces (4, 2, 1), and
with stride 2 the copy splits each row by column parity so that every tap is one plain load
(no shuffles). There 3 rows x 2 chunks (2 x 2 under a SiLU) share each weight load. MobileNetV3 /
EfficientNet / ConvNeXt depthwise layers went from 2.0x ORT's time (geometric mean, 1 thread,
this kernel's first AVX2 form) to 0.88x (bench/layers.py).
"""

from __future__ import annotations

from llvmlite import ir

from ...ir import te
from ...ir.graph import PrimFunc
from ..bf16dot import BF16
from ..contraction.kernel import ContractionEmitter
from ..contraction.match import Contraction, match_contraction
from ..helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from ..lower import KernelInfo
from ..threads import DEFAULTS, SplitThresholds
from ..vecmath_lanes import opaque_zero

I16 = ir.IntType(16)

# Output rows computed together where no window row is padding, by vector width: 4 with
# AVX-512's 32 registers, 2 with 16 (AVX2: 9 weights + 4 accumulators would spill). Measured on
# MobileNetV2's layers (Zen 4): 1 -> 2 -> 4 rows 1.0 / 0.86 / 0.81 of the time with AVX-512,
# 2 rows 0.9 of 1 or 3 with AVX2.
ROW_BLOCK = {16: 4}
# Chunks of a row computed together on AVX-512's rows where a window has at most
# COL_BLOCK_TAPS taps (3x3: 9 weights and 4 x 2 accumulators in registers). Measured on Zen 5
# (1 thread, min us, 1 -> 2 chunks, PP-LCNet's 3x3 layers with HardSwish): 112x112x16 27.3 ->
# 26.8, 56x56x64 27.8 -> 25.8, stride 2 112x112x32 24.5 -> 23.5, 56x56x64 12.2 -> 12.1.
COL_BLOCK = {16: 2}
COL_BLOCK_TAPS = 9
# ... and where the row's interior chunks make at most this many pairs: with a loop over several
# pairs LLVM loads the next pair's taps early and spills (112x112x16 with a BatchNorm and
# HardSwish epilogue: 1 chunk 29.0 us, 2 chunks 36.9).
COL_BLOCK_MAX_PAIRS = 1
# Targets with vectors narrower than this (AVX2, SSE, NEON) pad each plane's rows in a task
# workspace region instead of loading the border chunks with masks; tasks beyond
# MAX_TASK_REGIONS get no planes.
PADDED_BELOW_VL = 16
MAX_TASK_REGIONS = 8
# Output rows x chunks computed together on the padded path: each weight loaded once for 6
# vectors (16 registers: a 5x5 or 7x7 window's weights are reloaded from the stack per use).
# Measured on this AVX2 host (1 thread, min us, rows x chunks 2x1 -> 3x2): dw5x5 28x28x240
# 610 -> 465, 14x14x672 425 -> 324, dw7x7 56x56x40 761 -> 485, 14x14x160 229 -> 160, dw3x3
# 56x56x144 657 -> 521; 4x2 no better, worse where 7 rows leave 4-row blocks no room.
PADDED_BLOCK = (3, 2)
# With vector math in the epilogue (SiLU's sigmoid) six epilogues at a time spill: 2 x 2 there
# (dw5x5 28x28x240 + SiLU: 2x1 1143 us, 3x2 1499, 2x2 828; ORT 795).
PADDED_BLOCK_MATH = (2, 2)
# A depthwise multiply-add moves its own input and output (no reuse across channels), several
# times a dense kernel's time per multiply-add (Zen 4: 10-14 per ns against ~45), so it splits
# over threads from options.parallel_min_macs / DEPTHWISE_MAC_COST. Measured on 2 threads against
# one (min / median us): MobileNetV2's 3x3 stride 2 on 14x14x576 (254 K) 40.8 / 58 -> 28.4 /
# 45, 3x3 on 28x28x32 (226 K) 17.7 / 27 -> 14.0 / 23; not below: 3x3 on 14x14x64 (113 K) 11.5 /
# 12 -> 10.8 / 17, 7x7x160 (70 K) 11.0 / 12 -> 9.9 / 17 (the medians pay for the hand-off).
DEPTHWISE_MAC_COST = 2
# A padded region of at least this many bytes is filled row block by row block, right before the
# rows that read it (``_copy_new_rows``), instead of a whole plane at a time. Measured on Zen 4
# (AVX2, MobileNetV2, 1 thread, min us): 3x3 on 112x112x32 178 -> 149, stride 2 on 112x112x96
# 279 -> 250 (the regions 51 KB, past L1); on 56x56 (13 KB) stride 2 84 -> 80 but stride 1 140
# -> 146, and on 14x14 and 7x7 planes (a few rows per block) the per-block copies cost more than
# they save (29 -> 44).
LAZY_COPY_BYTES = 16 * 1024
# AVX-512, horizontal stride 2: output rows at most 16 wide from input rows under 32 wide
# (two rows of at most 8 per 16-lane vector from input rows under 16) with at most this many
# vectors per plane run unrolled from whole input-row vectors (``_emit_s2_plane``): each tap
# one two-source permute of them, where rows took chunks with run-time masks (14x14 -> 7x7:
# 8-lane rows).
S2_MAX_VECTORS = 16
# AVX-512, stride 1: planes whose output rows take at most this many 16-lane vectors (or several
# rows a vector where they are at most half one wide), with at most PACKED_MAX_VECTORS vectors
# per plane, run unrolled a band of PACKED_BAND accumulators at a time (``_emit_packed_plane``).
PACKED_MAX_CHUNKS = 2
PACKED_MAX_VECTORS = 64
PACKED_BAND = 16


def is_depthwise(match: Contraction | None) -> bool:
    """``match`` is a convolution this kernel handles: one input channel per group, every
    input channel its own group (and more than one: a single-channel convolution is a plain
    one, whose register-blocked kernel reuses each input load across output channels),
    horizontal stride 1 or 2."""
    if match is None or match.tag.kind != "conv2d":
        return False
    x, w = match.tag.operands
    groups = match.tag.attrs["groups"]
    return (len(x.shape) == 4 and w.shape[1] == 1 and groups == x.shape[1] and groups > 1
            and match.tag.attrs["strides"][1] in (1, 2))


def match_depthwise(func: PrimFunc) -> Contraction | None:
    """The depthwise convolution ``func`` computes, if this kernel handles it."""
    match = match_contraction(func)
    return match if is_depthwise(match) else None


class DepthwiseEmitter(ContractionEmitter):

    plans_conv = False   # its own plan (_geometry)
    # (input plane, its region) while _emit_rows copies the plane's rows as it goes
    _lazy: tuple[ir.Value, ir.Value] | None = None

    def emit(self) -> KernelInfo:
        self._geometry()
        # the output as bf16 pair words for the bf16 convolution that alone reads it
        # (passes/bf16_pairs.py, bf16_pair_depthwise: unpadded, [N, O / 2, OH, OW])
        self.pairs_out = self.func.attrs.get("bf16_pairs_out")
        if self.pairs_out is not None and (
                any(self.pairs_out) or self.padded or not self.vector_epilogue
                or self.target_vl != 16 or self.o % 2):
            raise ValueError("depthwise pair-word output needs unpadded words, a vector "
                             "epilogue and 16-lane vdpbf16ps targets")
        params = self.func.inputs + self.func.outputs
        workspace = MAX_TASK_REGIONS * self.region_floats * 4 if self.padded else 0
        body_fn, ptr_types = self._begin_body(params, workspace=bool(workspace))
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(params)] if workspace else None
        self._emit_planes(ws, body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1])
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        choice = None if self.pairs_out is None else \
            "depthwise convolution, bf16 pair-word output"
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), workspace,
                          self._macs() * DEPTHWISE_MAC_COST >= self.options.parallel_min_macs,
                          choice=choice)

    # ---- static plan ----------------------------------------------------------------------------

    def _geometry(self) -> None:
        x, w = self.match.tag.operands
        attrs = self.match.tag.attrs
        self.n, self.c, self.h, self.w = x.shape
        self.o, _, self.kh, self.kw = w.shape
        _, _, self.oh, self.ow = self.match.out.shape
        self.sh, self.sw = attrs["strides"]
        self.packed = self._packed_rows()
        self.s2_rows = 0 if self.packed else self._s2_rows()
        # rows narrower than half a vector: half-width vectors (on AVX-512, twice the throughput
        # of full ones, and otherwise half the lanes would be wasted)
        while not (self.s2_rows or self.packed) and self.vl > 4 and self.vl // 2 >= self.ow:
            self.vl //= 2
        vl = self.vl
        self.vty = ir.VectorType(F32, vl)
        self.row_block = ROW_BLOCK.get(vl, 2)
        # AVX-512 rows: two chunks a block where a window's weights leave the registers for
        # their 8 accumulators (more independent multiply-add chains than 4 rows x 1 chunk)
        self.col_block = COL_BLOCK.get(vl, 1) if self.kh * self.kw <= COL_BLOCK_TAPS else 1
        self.vector_epilogue = self._vector_epilogue_ok()
        self.pt, self.pl = attrs["padding"][0], attrs["padding"][1]
        if self.s2_rows or self.packed:
            self.padded, self.region_floats, self.segments = False, 0, []
            return
        # How each tap's vector is made: ("load", offset) or ("shuffle", a, b, lanes), where
        # a and b are tap recipes or loads; offsets are relative to ix0.
        recipes = {}
        for kx in range(self.kw):
            if self.sw == 1:
                recipes[kx] = ("load", kx)
            else:
                m, p = divmod(kx, 2)
                pair = ("shuffle", ("load", 0), ("load", vl), tuple(range(p, p + 2 * vl, 2)))
                if m == 0:
                    recipes[kx] = pair
                elif m < vl and p + 2 * (m - 1) < vl:
                    recipes[kx] = ("shuffle", pair, ("load", 2 * vl),
                                   tuple(range(m, vl)) + tuple(vl + p + 2 * i for i in range(m)))
                else:   # out of the shared vectors' reach: its own two loads
                    recipes[kx] = ("shuffle", ("load", kx), ("load", kx + vl),
                                   tuple(range(0, 2 * vl, 2)))
        self.recipes = recipes

        def loads(r):
            return {r[1]} if r[0] == "load" else loads(r[1]) | loads(r[2])

        span = max(off for r in recipes.values() for off in loads(r)) + vl
        # interior chunks q in [q_lo, q_hi): reads x[ix0 : ix0 + span] inside the row, and all
        # vl outputs inside it
        step = self.sw * vl
        self.nq = -(-self.ow // vl)
        q_lo = min(-(-self.pl // step), self.nq)
        q_hi = min((self.w + self.pl - span) // step, self.ow // vl - 1) + 1 \
            if self.w + self.pl - span >= 0 else 0
        self.q_lo, self.q_hi = q_lo, max(q_lo, min(q_hi, self.nq))
        if self.q_hi - self.q_lo > 2 * COL_BLOCK_MAX_PAIRS:
            self.col_block = 1
        # Narrower vectors (AVX2, SSE, NEON): masked loads are slow or scalarized there, so a
        # convolution with border chunks copies each input plane into a zero-margined row
        # buffer of its task (row stride ``row_stride``, column ix at ix + pl) and runs every
        # chunk with plain loads; a row's last, partial chunk stores its lanes in pieces.
        # With stride 2 the copy also splits each row by column parity (``phase`` rows of
        # ``phase_len`` floats: padded column c at c % 2 * phase_len + c // 2), so that tap
        # kx = 2m + p of the chunk at ox0 is one plain load from phase p at ox0 + m: no
        # shuffles in the inner loop (AVX2's cross-lane shuffles cost more than the loads).
        self.padded = self.target_vl < PADDED_BELOW_VL and (
            self.q_lo > 0 or self.q_hi < self.nq or self.sw == 2)
        self.row_stride, self.x_left, self.x_step, self.region_floats = self.w, self.pl, \
            self.sw, 0
        if self.padded:
            self.x_left = 0
            self.q_lo, self.q_hi = 0, self.ow // vl
            if self.sw == 1:
                self.row_stride = max(self.pl + self.w, (self.nq - 1) * step + span)
            else:
                self.phase_len = max(-(-(self.pl + self.w) // 2),
                                     self.nq * vl + (self.kw - 1) // 2)
                self.row_stride = 2 * self.phase_len
                self.x_step = 1
                self.recipes = {kx: ("load", kx % 2 * self.phase_len + kx // 2)
                                for kx in range(self.kw)}
            # Zero rows above and below the plane's (``pad_rows`` above): every output row's
            # window then lies inside the region, so all rows are one segment (one copy of the
            # row block's code instead of one per border row's window; the border rows multiply
            # zeros instead)
            self.pad_rows = self.pt
            rows = max(self.pt + self.h, (self.oh - 1) * self.sh + self.kh)
            self.region_floats = -(-rows * self.row_stride // 16) * 16
            math = any(isinstance(node, te.MathCall)
                       for node in te.walk(self.match.body, skip=self.match.reduce))
            self.row_block, self.col_block = PADDED_BLOCK_MATH if math else PADDED_BLOCK
            if self.nq == 1 and not math:   # one chunk per row (7-wide): 6 rows
                self.row_block, self.col_block = self.row_block * self.col_block, 1
        # output rows grouped by the window rows inside the image: (oy0, oy1, ky_lo, ky_hi)
        if self.padded:   # inside the region's zero rows: one group
            self.segments = [(0, self.oh, 0, self.kh)]
            return
        segments: list[list[int]] = []
        for oy in range(self.oh):
            top = oy * self.sh - self.pt
            ky = (max(0, -top), min(self.kh, self.h - top))
            ky = ky if ky[0] < ky[1] else (0, 0)
            if segments and tuple(segments[-1][2:]) == ky:
                segments[-1][1] = oy + 1
            else:
                segments.append([oy, oy + 1, *ky])
        self.segments = [tuple(s) for s in segments]

    def _s2_rows(self) -> int:
        """AVX-512, horizontal stride 2, output rows at most a vector wide read from input
        rows narrower than two vectors, at most ``S2_MAX_VECTORS`` vectors per plane, an
        epilogue that reads flat offsets (``_flat_epilogue_ok``): output rows per vector of
        ``_emit_s2_plane`` (2 for output rows of at most half a vector from input rows
        narrower than one, else 1); 0 where it does not apply."""
        vl = self.target_vl
        if vl < PADDED_BELOW_VL or self.sw != 2 or self.ow > vl:
            return 0
        rows = 2 if self.ow <= vl // 2 and self.w < vl else 1
        # input rows narrower than their vectors (one of two rows, the two of one row): a
        # lane past the row reads 0 for the taps' columns outside it
        if self.w >= 2 * vl or -(-self.oh // rows) > S2_MAX_VECTORS:
            return 0
        return rows if self._flat_epilogue_ok() else 0

    def _packed_rows(self) -> int:
        """AVX-512, stride 1, output rows of at most ``PACKED_MAX_CHUNKS`` vectors, at most
        ``PACKED_MAX_VECTORS`` vectors per plane: output rows per vector of
        ``_emit_packed_plane`` (``vl // ow`` for rows at most half a vector wide read from input
        rows as wide, whose epilogue reads flat offsets; else 1); 0 where it does not apply."""
        vl = self.target_vl
        if vl < PADDED_BELOW_VL or (self.sh, self.sw) != (1, 1):
            return 0
        g = 1
        if self.ow <= vl // 2:
            if self.w != self.ow or not self._flat_epilogue_ok():
                return 0
            g = vl // self.ow
        chunks = -(-self.ow // vl)
        if chunks > PACKED_MAX_CHUNKS or -(-self.oh // g) * chunks > PACKED_MAX_VECTORS:
            return 0
        return g

    def _emit_packed_plane(self, x_plane: ir.Value, w_ptr: ir.Value, oc: ir.Value) -> None:
        """One plane of a stride-1 convolution (``_packed_rows``), unrolled: vector (v, c) holds
        output rows v * g .. v * g + g - 1 (g = ``packed``; lane j row v * g + j // ow, column
        j % ow) or with g = 1 chunk c of row v (columns c * vl + j). Vectors are taken in bands
        of ``PACKED_BAND`` accumulators; in a band, window column kx at a time, each input row a
        is loaded once at column kx - pl (constant masks: lanes whose column or row falls
        outside the image, or past the outputs, read 0; loads wholly outside skipped) and feeds
        every vector of the band whose window row ky = a - v * g + pt reads it, with that
        column's kh weights broadcast once per band (so only kh of them are live, not kh * kw:
        a 5x5 window's 25 weights and four rows' accumulators spilled). Flat input offsets: with
        g > 1 the input rows are as wide as the output's, so lane j of rows a.. is element
        a * w + j + kx - pl of the plane."""
        b, vl, g, ow, w = self.builder, self.vl, self.packed, self.ow, self.w
        chunks = -(-ow // vl)
        groups = -(-self.oh // g)
        per_band = max(1, PACKED_BAND // chunks)
        taps = self.kh * self.kw
        for v0 in range(0, groups, per_band):
            v1 = min(groups, v0 + per_band)
            accs: dict[tuple[int, int], ir.Value] = {}
            # a fresh zero per band: LLVM would otherwise keep every weight loaded once per
            # plane (noalias) live across all bands
            z = b.sext(opaque_zero(b), I64) if v0 else const_i64(0)
            for kx in range(self.kw):
                wcol: dict[int, ir.Value] = {}
                for a in range(v0 * g - self.pt, (v1 - 1) * g + self.kh - self.pt):
                    users = [(v, a - v * g + self.pt) for v in range(v0, v1)
                             if 0 <= a - v * g + self.pt < self.kh]
                    for c in range(chunks):
                        valid = []
                        for j in range(vl):
                            row, col = (a + j // ow, j % ow) if g > 1 else (a, c * vl + j)
                            out_ok = j < g * ow if g > 1 else col < ow
                            valid.append(out_ok and 0 <= row < self.h
                                         and 0 <= col + kx - self.pl < w)
                        if not any(valid):
                            continue
                        off = a * w + c * vl + kx - self.pl
                        ptr = b.bitcast(b.gep(x_plane, [const_i64(off)]), self.vty.as_pointer())
                        x = b.load(ptr, align=4) if all(valid) else self._masked_load(
                            ptr, ir.Constant(ir.VectorType(I1, vl), valid))
                        for v, ky in users:
                            if ky not in wcol:
                                idx = b.add(b.add(b.mul(oc, const_i64(taps)),
                                                  const_i64(ky * self.kw + kx)), z)
                                wcol[ky] = self._splat(b.load(b.gep(w_ptr, [idx],
                                                                    inbounds=True)))
                            acc = accs.get((v, c))
                            accs[v, c] = b.fmul(wcol[ky], x) if acc is None else \
                                self._fma(wcol[ky], x, acc)
            zero = ir.Constant(self.vty, [0.0] * vl)
            self._share_opaque()
            for v in range(v0, v1):
                for c in range(chunks):
                    acc = accs.get((v, c), zero)
                    if g > 1:
                        count = min(g, self.oh - v * g) * ow
                        mask = None if count == vl else ir.Constant(
                            ir.VectorType(I1, vl), [j < count for j in range(vl)])
                        # oy 0, ox the flat offset (_flat_epilogue_ok)
                        emit_epilogue(self, acc, const_i64(0), const_i64(v * g * ow), mask,
                                      const_i64(self.oh * ow))
                    else:
                        count = min(vl, ow - c * vl)
                        mask = None if count == vl else ir.Constant(
                            ir.VectorType(I1, vl), [j < count for j in range(vl)])
                        emit_epilogue(self, acc, const_i64(v), const_i64(c * vl), mask,
                                      const_i64(ow))
            self.end_shared_epilogue_zero()

    def _share_opaque(self) -> None:
        """The epilogues emitted until ``end_shared_epilogue_zero`` share one opaque zero (at
        AVX-512, where the vector epilogue's constants derive from one): a packed band's or a
        row block's, where a zero per vector cost 5 instructions each (28x28x128 3x3 +
        HardSwish 15.4 -> 13.9 us)."""
        if self.vector_epilogue and self.target_vl >= PADDED_BELOW_VL:
            self.share_epilogue_zero()

    def _flat_epilogue_ok(self) -> bool:
        """Every tensor the epilogue reads is indexed like the output over the plane or not at
        all, so the epilogue may index the plane's outputs by flat offsets. Not for 1-wide
        output rows: a per-channel tensor's last axis (1) then matches the output's and is read
        at the lanes' flat offsets (a 7x1 plane's bias read as 7 channels' biases)."""
        if self.ow == 1:
            return False
        x, w = self.match.tag.operands
        for t in self.func.inputs:
            if t.uid in (x.uid, w.uid):
                continue
            shape = tuple(t.shape)
            if len(shape) < 2 and any(d != 1 for d in shape):
                return False
            if len(shape) >= 2 and shape[-2:] not in ((1, 1), (self.oh, self.ow)):
                return False
        return True

    def _emit_s2_plane(self, x_plane: ir.Value) -> None:
        """One plane of a horizontal stride 2 (``_s2_rows``): ``g`` = s2_rows output rows per
        16-lane vector, lane j output row v * g + j // (vl / g), column j % (vl / g). Each
        input row is loaded once as whole vectors from its column 0, masked to the row's own
        columns (the lanes past them read 0). Tap (ky, kx) of a vector is one permute of two
        vectors (two rows' with g = 2, one row's two with g = 1; a row outside the image a zero
        vector): lane j takes input column 2 * (its column) + kx - pl, or a zero lane where
        that lies outside the row, so the permute's lanes depend on kx only (kw constants).
        The rows' lanes are then packed to flat outputs (two rows: one more permute) and stored
        through the flat epilogue (``_flat_epilogue_ok``)."""
        b, vl, ow, w = self.builder, self.vl, self.ow, self.w
        g = self.s2_rows
        per = vl // g
        size = self.h * w
        zero = ir.Constant(self.vty, [0.0] * vl)
        rows: dict[tuple[int, int], ir.Value] = {}

        def row_vector(iy: int, t: int) -> ir.Value:
            """Input row iy's vector t, or zeros outside the image or the row."""
            if not (0 <= iy < self.h and t * vl < w):
                return zero
            if (iy, t) not in rows:
                off = iy * w + t * vl
                ptr = b.bitcast(b.gep(x_plane, [const_i64(off)], inbounds=True),
                                self.vty.as_pointer())
                keep = [t * vl + j < w and off + j < size for j in range(vl)]
                rows[iy, t] = b.load(ptr, align=4) if all(keep) else self._masked_load(
                    ptr, ir.Constant(ir.VectorType(I1, vl), keep))
            return rows[iy, t]

        # lane j of tap kx: input column 2 * (j % per) + kx - pl of its source (g = 2: vector
        # j // per; g = 1: the row's two vectors as one), else a lane that reads 0 (_s2_rows:
        # the row's width leaves one)
        index, used = {}, {}
        for kx in range(self.kw):
            lanes = []
            for j in range(vl):
                half, ix = j // per, 2 * (j % per) + kx - self.pl
                inside = j % per < ow and 0 <= ix < w
                base = half * vl if g == 2 else 0
                lanes.append(base + (ix if inside else (w if g == 2 or w > vl else vl)))
            index[kx] = ir.Constant(ir.VectorType(I32, vl), lanes)
            used[kx] = any(0 <= 2 * c + kx - self.pl < w for c in range(ow))
        total = self.oh * ow
        for v in range(-(-self.oh // g)):
            acc = None
            for ky in range(self.kh):
                if g == 2:
                    iys = [(v * 2 + r) * self.sh + ky - self.pt if v * 2 + r < self.oh else -1
                           for r in (0, 1)]
                    srcs = [row_vector(iys[0], 0), row_vector(iys[1], 0)]
                else:
                    iy = v * self.sh + ky - self.pt
                    srcs = [row_vector(iy, 0), row_vector(iy, 1)]
                if all(src is zero for src in srcs):
                    continue
                for kx in range(self.kw):
                    if not used[kx]:
                        continue
                    x = b.shuffle_vector(srcs[0], srcs[1], index[kx])
                    wv = self.weights[ky][kx]
                    acc = b.fmul(wv, x) if acc is None else self._fma(wv, x, acc)
            if acc is None:
                acc = zero
            count = min(g, self.oh - v * g) * ow
            packed = [r * per + c for r in range(count // ow) for c in range(ow)]
            if packed != list(range(count)):   # the rows' outputs to the first lanes
                acc = b.shuffle_vector(acc, ir.Constant(self.vty, None), ir.Constant(
                    ir.VectorType(I32, vl), packed + [0] * (vl - count)))
            mask = None
            if count < vl:
                mask = ir.Constant(ir.VectorType(I1, vl), [j < count for j in range(vl)])
            emit_epilogue(self, acc, const_i64(0), const_i64(v * g * ow), mask,
                          const_i64(total))

    # ---- emission -------------------------------------------------------------------------------

    def _emit_planes(self, ws: ir.Value | None, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        if not self.padded:
            self._emit_plane_range(*self._split(self.n * self.o, task, ntasks), None)
            return
        nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                      const_i64(MAX_TASK_REGIONS))
        with b.if_then(b.icmp_signed("<", task, nt)):
            region = b.gep(b.bitcast(ws, F32.as_pointer()),
                           [b.mul(task, const_i64(self.region_floats))], inbounds=True)
            # the margins stay zero: the plane copies write only columns pl .. pl + w - 1
            memset = intrinsic(self.module, "llvm.memset.p0i8.i64", ir.VoidType(),
                               [ir.IntType(8).as_pointer(), ir.IntType(8), I64, I1])
            b.call(memset, [b.bitcast(region, ir.IntType(8).as_pointer()),
                            ir.Constant(ir.IntType(8), 0),
                            const_i64(self.region_floats * 4), ir.Constant(I1, 0)])
            self._emit_plane_range(*self._split(self.n * self.o, task, nt), region)

    def _emit_plane_range(self, lo, hi, region: ir.Value | None) -> None:
        b = self.builder
        x_ptr = self.buffers[self.match.tag.operands[0].uid]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        mult = self.o // self.c
        with for_range(b, lo, hi, "plane") as p:
            nb = b.sdiv(p, const_i64(self.o))
            oc = b.srem(p, const_i64(self.o))
            ic = b.sdiv(oc, const_i64(mult)) if mult > 1 else oc
            plane = b.add(b.mul(nb, const_i64(self.c)), ic)
            x_plane = b.gep(x_ptr, [b.mul(plane, const_i64(self.h * self.w))], inbounds=True)
            if region is not None:   # input row 0 after the zero rows
                region = b.gep(region, [const_i64(self.pad_rows * self.row_stride)],
                               inbounds=True)
            if region is not None and 4 * self.region_floats >= LAZY_COPY_BYTES:
                self._lazy = (x_plane, region)   # copied row block by row block (_emit_rows)
                x_plane = region
            elif region is not None:
                self._copy_plane(x_plane, region)
                x_plane = region
            begin_plane(self, w_ptr, nb, oc)
            if self.s2_rows:   # no segments
                self._emit_s2_plane(x_plane)
            elif self.packed:
                self._emit_packed_plane(x_plane, w_ptr, oc)
            for oy0, oy1, ky_lo, ky_hi in self.segments:
                rows = oy1 - oy0
                full = (ky_lo, ky_hi) == (0, self.kh)
                blocked = self.row_block if full and rows >= self.row_block else 1
                if self.padded and full:   # fewer rows than a block: one block of them all
                    blocked = min(self.row_block, rows)
                nblk = rows // blocked
                with for_range(b, const_i64(0), const_i64(nblk), "oyb") as blk:
                    oy = b.add(const_i64(oy0), b.mul(blk, const_i64(blocked)))
                    self._emit_rows(x_plane, oy, blocked, ky_lo, ky_hi)
                if rows % blocked and self.padded and full:   # the leftover rows together
                    self._emit_rows(x_plane, const_i64(oy0 + nblk * blocked), rows % blocked,
                                    ky_lo, ky_hi)
                elif rows % blocked:
                    with for_range(b, const_i64(oy0 + nblk * blocked), const_i64(oy1),
                                   "oyr") as oy:
                        self._emit_rows(x_plane, oy, 1, ky_lo, ky_hi)
            self._lazy = None

    def _copy_new_rows(self, oy0: ir.Value, nrows: int) -> None:
        """Before output rows oy0 .. oy0 + nrows - 1 of a plane: copy the input rows their
        windows reach that the plane's earlier rows did not (the plane's output rows come in
        order), so each row is read from L1 right after its copy, not from L2 after the whole
        plane's (112x112: 51 KB, past L1)."""
        b, sh, kh, h = self.builder, self.sh, self.kh, self.h

        def clamp(v: ir.Value) -> ir.Value:
            v = b.select(b.icmp_signed("<", v, const_i64(0)), const_i64(0), v)
            return b.select(b.icmp_signed(">", v, const_i64(h)), const_i64(h), v)

        top = b.mul(oy0, const_i64(sh))
        lo = b.select(b.icmp_signed("==", oy0, const_i64(0)), const_i64(0),
                      clamp(b.add(top, const_i64(kh - sh - self.pt))))
        hi = clamp(b.add(top, const_i64((nrows - 1) * sh + kh - self.pt)))
        self._copy_plane(*self._lazy, lo, hi)

    def _copy_plane(self, src: ir.Value, dst: ir.Value, lo: ir.Value | None = None,
                    hi: ir.Value | None = None) -> None:
        """The input plane's rows (``lo`` .. ``hi`` - 1; default all) into the padded region: at
        column ``pl`` of each row (stride 1), or split by the padded column's parity (stride 2;
        see ``_geometry``)."""
        b = self.builder
        lo = const_i64(0) if lo is None else lo
        hi = const_i64(self.h) if hi is None else hi
        with for_range(b, lo, hi, "cpy") as iy:
            s_row = b.gep(src, [b.mul(iy, const_i64(self.w))], inbounds=True)
            d_row = b.gep(dst, [b.mul(iy, const_i64(self.row_stride))], inbounds=True)
            if self.sw == 1:
                self._copy_run(s_row, 0, d_row, self.pl, self.w)
            else:
                self._copy_deinterleaved(s_row, d_row)

    def _copy_run(self, src: ir.Value, s0: int, dst: ir.Value, d0: int, count: int) -> None:
        """``count`` floats from src[s0:] to dst[d0:]: whole vectors, then pieces."""
        b, j = self.builder, 0
        sizes = [self.vl] * (count // self.vl) + _pieces(count % self.vl)
        for size in sizes:
            ty = ir.VectorType(F32, size) if size > 1 else F32
            sp = b.bitcast(b.gep(src, [const_i64(s0 + j)], inbounds=True), ty.as_pointer())
            dp = b.bitcast(b.gep(dst, [const_i64(d0 + j)], inbounds=True), ty.as_pointer())
            b.store(b.load(sp, align=4), dp, align=4)
            j += size

    def _copy_deinterleaved(self, s_row: ir.Value, d_row: ir.Value) -> None:
        """Input column ix to padded column c = pl + ix, stored at c % 2 * phase_len + c // 2:
        runs of 2v columns as two v-lane vectors split into their even and odd lanes."""
        b = self.builder
        ix, v = 0, self.vl
        while ix < self.w:
            while v > 1 and self.w - ix < 2 * v:
                v //= 2
            if v == 1:   # the last column
                c = self.pl + ix
                self._copy_run(s_row, ix, d_row, c % 2 * self.phase_len + c // 2, 1)
                ix += 1
                continue
            ty = ir.VectorType(F32, v)
            lo = b.load(b.bitcast(b.gep(s_row, [const_i64(ix)], inbounds=True), ty.as_pointer()),
                        align=4)
            hi = b.load(b.bitcast(b.gep(s_row, [const_i64(ix + v)], inbounds=True),
                                  ty.as_pointer()), align=4)
            for parity in (0, 1):   # source columns ix + parity, ix + parity + 2, ...
                c = self.pl + ix + parity
                lanes = ir.Constant(ir.VectorType(I32, v), list(range(parity, 2 * v, 2)))
                part = b.shuffle_vector(lo, hi, lanes)
                dp = b.gep(d_row, [const_i64(c % 2 * self.phase_len + c // 2)], inbounds=True)
                b.store(part, b.bitcast(dp, ty.as_pointer()), align=4)
            ix += 2 * v

    def _emit_rows(self, x_plane, oy0, nrows: int, ky_lo: int, ky_hi: int) -> None:
        """Output rows oy0 .. oy0 + nrows - 1, whose window rows ky_lo..ky_hi-1 lie inside the
        image: the interior chunks ``col_block`` at a time, then the rest (with padded rows:
        the leftover interior chunks and the row's partial last one together)."""
        b = self.builder
        if self._lazy is not None:
            self._copy_new_rows(oy0, nrows)
        cb = self.col_block
        nblk = (self.q_hi - self.q_lo) // cb
        if nblk:
            with for_range(b, const_i64(0), const_i64(nblk), "q") as qb:
                q0 = b.add(const_i64(self.q_lo), b.mul(qb, const_i64(cb)))
                qs = [b.add(q0, const_i64(c)) if c else q0 for c in range(cb)]
                self._emit_chunk(x_plane, oy0, nrows, ky_lo, ky_hi, [(q, None) for q in qs])
        rest = [(const_i64(q), None) for q in range(self.q_lo + nblk * cb, self.q_hi)]
        if self.padded:
            if self.q_hi < self.nq:   # the last chunk: its first ow % vl lanes are stored
                rest.append((const_i64(self.nq - 1), self.ow % self.vl))
            for i in range(0, len(rest), cb):
                self._emit_chunk(x_plane, oy0, nrows, ky_lo, ky_hi, rest[i:i + cb])
            return
        # then the border chunks, with masked loads and stores (AVX-512), ``col_block`` at a
        # time with the leftover interior ones, each at a constant column (its masks then
        # constants: in one loop over them they were computed per tap)
        rest = [(chunk, False) for chunk in rest] + [
            ((const_i64(q), None), True) for q in [*range(self.q_lo), *range(self.q_hi, self.nq)]]
        for i in range(0, len(rest), cb):
            part = rest[i:i + cb]
            self._emit_chunk(x_plane, oy0, nrows, ky_lo, ky_hi, [c for c, _ in part],
                             masked=[m for _, m in part])

    def _emit_chunk(self, x_plane, oy0, nrows, ky_lo, ky_hi, chunks: list,
                    masked: list[bool] | None = None) -> None:
        """``chunks`` ((q, tail): tail None for a whole chunk, else how many of its lanes are
        stored) of ``nrows`` output rows, each weight loaded once for all of them (with 16
        registers a 5x5 or 7x7 window's weights live on the stack); ``masked``: per chunk, a
        border chunk, loaded and stored with masks."""
        b, vl = self.builder, self.vl
        masked = masked or [False] * len(chunks)
        ox0s = [b.mul(q, const_i64(vl)) for q, _ in chunks]
        ix0s = [b.sub(b.mul(ox0, const_i64(self.x_step)), const_i64(self.x_left))
                for ox0 in ox0s]
        top = b.sub(b.mul(oy0, const_i64(self.sh)), const_i64(self.pt))
        accs: list[list[ir.Value | None]] = [[None] * len(chunks) for _ in range(nrows)]
        for d in range((nrows - 1) * self.sh + self.kh):
            users = [(r, d - r * self.sh) for r in range(nrows)
                     if ky_lo <= d - r * self.sh < ky_hi]
            if not users:
                continue
            row = b.gep(x_plane, [b.mul(b.add(top, const_i64(d)), const_i64(self.row_stride))],
                        inbounds=True)
            caches: list[dict] = [{} for _ in chunks]
            for kx in range(self.kw):
                vs = [self._tap(self.recipes[kx], row, ix0, m, cache)
                      for ix0, m, cache in zip(ix0s, masked, caches)]
                for r, ky in users:
                    wv = self.weights[ky][kx]
                    for c, v in enumerate(vs):
                        acc = accs[r][c]
                        accs[r][c] = b.fmul(wv, v) if acc is None else self._fma(wv, v, acc)
        zero = ir.Constant(self.vty, [0.0] * vl)
        self._share_opaque()
        for c, ((_, tail), ox0) in enumerate(zip(chunks, ox0s)):
            mask = None
            if tail is not None:
                mask = ir.Constant(ir.VectorType(I1, vl), [j < tail for j in range(vl)])
            elif masked[c]:
                mask = self._lane_mask(b.sub(const_i64(self.ow), ox0), 0)
            for r in range(nrows):
                oy = b.add(oy0, const_i64(r)) if r else oy0
                acc = accs[r][c]
                self._emit_epilogue(zero if acc is None else acc, oy, ox0, mask, tail)
        self.end_shared_epilogue_zero()

    def _tap(self, recipe, row, ix0, masked: bool, cache: dict) -> ir.Value:
        if recipe in cache:
            return cache[recipe]
        b = self.builder
        if recipe[0] == "load":
            start = b.add(ix0, const_i64(recipe[1]))
            if masked:
                idx = b.add(self._splat_i64(start), ir.Constant(ir.VectorType(I64, self.vl),
                                                                 list(range(self.vl))))
                inside = b.and_(
                    b.icmp_signed(">=", idx, ir.Constant(idx.type, [0] * self.vl)),
                    b.icmp_signed("<", idx, ir.Constant(idx.type, [self.w] * self.vl)))
                ptr = b.bitcast(b.gep(row, [start]), self.vty.as_pointer())
                value = self._masked_load(ptr, inside)
            else:
                value = b.load(self._vec_ptr(row, start), align=4)
        else:
            _, ra, rb, lanes = recipe
            value = b.shuffle_vector(self._tap(ra, row, ix0, masked, cache),
                                     self._tap(rb, row, ix0, masked, cache),
                                     ir.Constant(ir.VectorType(I32, self.vl), list(lanes)))
        cache[recipe] = value
        return value

    def _store_pieces(self, value: ir.Value, ptr: ir.Value, count: int) -> None:
        """The first ``count`` (< vl) lanes of ``value`` to ``ptr``: a store per power of two
        (vmaskmovps stores are slow on AMD's AVX2 cores and scalarized on SSE and NEON)."""
        b, j = self.builder, 0
        for size in _pieces(count):
            if size == 1:
                part, ty = b.extract_element(value, ir.Constant(I32, j)), F32
            else:
                part = b.shuffle_vector(value, ir.Constant(self.vty, None), ir.Constant(
                    ir.VectorType(I32, size), list(range(j, j + size))))
                ty = ir.VectorType(F32, size)
            b.store(part, b.bitcast(b.gep(ptr, [const_i64(j)], inbounds=True), ty.as_pointer()),
                    align=4)
            j += size

    def _splat_i64(self, x: ir.Value) -> ir.Value:
        b = self.builder
        vec = ir.VectorType(I64, self.vl)
        v = b.insert_element(ir.Constant(vec, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(vec, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _emit_epilogue(self, acc: ir.Value, oy, ox0, mask: ir.Value | None,
                       tail: int | None = None) -> None:
        """The fused epilogue on the vl outputs of row ``oy`` from column ``ox0`` (``mask``: the
        lanes inside the row; None: all; ``tail``: their number when it is known here, the
        store then in pieces)."""
        emit_epilogue(self, acc, oy, ox0, mask, const_i64(self.ow), pieces=tail)


def begin_plane(em: ContractionEmitter, w_ptr: ir.Value, nb: ir.Value, oc: ir.Value
                ) -> None:
    """A depthwise kernel's plane (image ``nb``, output channel ``oc``; ``em``: this module's
    emitter or symbolic.py's): its kh x kw weights broadcast once (``em.weights``), its
    indices for the epilogue (``em.env``)."""
    b = em.builder
    taps = em.kh * em.kw
    em.weights = [[em._splat(b.load(b.gep(
        w_ptr, [b.add(b.mul(oc, const_i64(taps)), const_i64(ky * em.kw + kx))],
        inbounds=True))) for kx in range(em.kw)] for ky in range(em.kh)]
    out = em.match.out
    em.env = {id(out.axes[0]): nb, id(out.axes[1]): oc}


def emit_epilogue(em: ContractionEmitter, acc: ir.Value, oy: ir.Value, ox0: ir.Value,
                  mask: ir.Value | None, ow: ir.Value, pieces: int | None = None,
                  memo: dict[int, ir.Value] | None = None) -> None:
    """The fused epilogue of a depthwise kernel (``em``: this module's emitter or
    symbolic.py's) on the vl outputs ``acc`` of row ``oy`` from column ``ox0``, stored
    to the output: ``mask`` the lanes inside the row (None: all); ``ow`` the output row's
    width; ``pieces`` the number of those lanes when it is known at export (the store then in
    pieces, ``em._store_pieces``; else masked); ``memo`` values the vector epilogue reuses
    (``_vvalue``)."""
    b = em.builder
    out = em.match.out
    env = dict(em.env)
    env[id(out.axes[2])] = oy
    env[id(out.axes[3])] = ox0
    if em.vector_epilogue:
        # AVX-512 as measured there; with 16 registers the epilogue's constants as plain
        # constants (memory operands) cost less than rebuilding them from an opaque zero per
        # vector (dw 3x3 112x112 + SiLU: 1740 -> 1550 us, 1 thread)
        value = em.epilogue_vector(acc, env, mask, memo,
                                   opaque_constants=em.target_vl >= PADDED_BELOW_VL)
        if getattr(em, "pairs_out", None) is not None:
            store_pair_half(em, value, env, mask)
            return
        ptr = b.gep(em.buffers[out.uid],
                    [em._offset(out, [env[id(a)] for a in out.axes])], inbounds=True)
        vptr = b.bitcast(ptr, em.vty.as_pointer())
        if mask is None:
            b.store(value, vptr, align=4)
        elif pieces is not None:
            em._store_pieces(value, ptr, pieces)
        else:
            fn = intrinsic(em.module, f"llvm.masked.store.v{em.vl}f32.p0",
                           ir.VoidType(), [em.vty, em.vty.as_pointer(), I32,
                                           ir.VectorType(I1, em.vl)])
            b.call(fn, [value, vptr, ir.Constant(I32, 4), mask])
        return
    # math calls or casts in the epilogue: element by element, from a spilled tile
    tile = alloca_once(b, ir.ArrayType(F32, em.vl), name="dwtile")
    tile_f = b.bitcast(tile, F32.as_pointer())
    b.store(acc, b.bitcast(tile_f, em.vty.as_pointer()), align=4)
    left = b.sub(ow, ox0)
    count = b.select(b.icmp_signed("<", left, const_i64(em.vl)), left, const_i64(em.vl))
    with for_range(b, const_i64(0), count, "lane") as j:
        env[id(out.axes[3])] = b.add(ox0, j)
        em._store_epilogue(env, tile_f, j)


def store_pair_half(em: ContractionEmitter, value: ir.Value, env: dict,
                    mask: ir.Value | None) -> None:
    """The epilogue's vl values (output channel c, row oy, columns ox0 ..: ``env``) rounded to
    bfloat16 and stored into c's half of the pair words ``[N, O / 2, OH, OW]`` that the reading
    bf16 convolution multiplies (``bf16_pairs_out``): channel 2j in the low half of pair j's
    word of each pixel, 2j + 1 in the high half. ``vcvtneps2bf16`` rounds them (to nearest
    even) as that convolution's own copy of a float32 input did (``vcvtne2ps2bf16``), so its
    outputs are bit for bit the same; the bf16 values are zero-extended to 32-bit lanes
    (``vpmovzxwd``) and stored as 16-bit lanes with a mask of the even ones (and ``mask``'s:
    the ones inside the row) from c's half of the first word, so the other channel's halves
    are not written."""
    b, vl = em.builder, em.vl
    out = em.match.out
    n, c, oy, ox = (env[id(a)] for a in out.axes)
    _, o, oh, ow = out.shape
    half = b.and_(c, const_i64(1))
    plane = b.mul(b.add(b.mul(n, const_i64(o)), b.sub(c, half)), const_i64(oh * ow))
    pix = b.add(b.mul(oy, const_i64(ow)), ox)
    idx = b.add(b.add(plane, b.mul(pix, const_i64(2))), half)
    ptr = b.gep(b.bitcast(em.buffers[out.uid], I16.as_pointer()), [idx], inbounds=True)
    v16 = ir.VectorType(F32, 16)
    if vl != 16:
        value = b.shuffle_vector(value, ir.Constant(em.vty, None), ir.Constant(
            ir.VectorType(I32, 16), list(range(vl)) + [0] * (16 - vl)))
    cvt = intrinsic(em.module, "llvm.x86.avx512bf16.cvtneps2bf16.512",
                    ir.VectorType(BF16, 16), [v16])
    bits = b.bitcast(b.call(cvt, [value]), ir.VectorType(I16, 16))
    if vl != 16:
        bits = b.shuffle_vector(bits, ir.Constant(bits.type, None), ir.Constant(
            ir.VectorType(I32, vl), list(range(vl))))
    # each value in the low half of a 32-bit lane (vpmovzxwd), stored as 16-bit lanes
    wty = ir.VectorType(I16, 2 * vl)
    spread = b.bitcast(b.zext(bits, ir.VectorType(I32, vl)), wty)
    mty = ir.VectorType(I1, 2 * vl)
    if mask is None:
        lanes = ir.Constant(mty, [k % 2 == 0 for k in range(2 * vl)])
    else:
        lanes = b.shuffle_vector(mask, ir.Constant(mask.type, [False] * vl), ir.Constant(
            ir.VectorType(I32, 2 * vl), [k // 2 if k % 2 == 0 else vl for k in range(2 * vl)]))
    store = intrinsic(em.module, f"llvm.masked.store.v{2 * vl}i16.p0", ir.VoidType(),
                      [wty, wty.as_pointer(), I32, mty])
    b.call(store, [spread, b.bitcast(ptr, wty.as_pointer()), ir.Constant(I32, 2), lanes])


def _pieces(count: int) -> list[int]:
    """``count`` as descending powers of two (7 -> 4, 2, 1)."""
    return [1 << i for i in range(count.bit_length() - 1, -1, -1) if count >> i & 1]


def emit_depthwise(module: ir.Module, match: Contraction, func: PrimFunc, symbol: str, vl: int,
                   options: SplitThresholds = DEFAULTS) -> KernelInfo:
    return DepthwiseEmitter(module, func, symbol, match, vl, options=options).emit()
