"""The kernel of ``nn.conv2d_bf16p`` (ops/bf16.py): an ungrouped, undilated convolution (any
window, stride and padding, static shapes) of a float32 NCHW input by weights stored as
bfloat16 in input-channel pairs (``wp [O, ceil(C / 2), KH, KW, 2]``), float32 accumulation
(``mlcpack export --precision bf16`` for a target set with x86-64-v4+bf16, docs/precision.md).

It is the register-blocked convolution of codegen/contraction/conv.py (output pixels on the
vector lanes, output channels on the tile's rows, the output flattened over rows of ``wq``
columns, the columns past the output width computed and dropped, the same fused epilogue: bias,
BatchNorm, ReLU/clip, residual add) with planes of its own:

- each image's input is copied once, zero-padded, into *pair planes* by stride phase
  (``planes[j, py, px, u, v]`` for the channel pair j = (2j, 2j + 1), the input at row ``u * sh
  + py - pt``, column ``v * sw + px - pl``); each task copies the plane rows its panels read
  (the same values where tasks overlap, as contraction/conv.py's planes);
- **x86-64-v4+bf16** (avx512_bf16, 16 lanes): a plane element is one 32-bit word, the pair of
  the two channels' values rounded to bfloat16 (``vcvtne2ps2bf16`` on 16 pixels of each
  channel, then the halves interleaved), so that each reduction step (pair j, tap) loads ``nv``
  vectors of 16 pixels' words and broadcasts each tile row's weight word (w[o, 2j], w[o, 2j +
  1]) into ``vdpbf16ps``: two multiply-adds per lane and instruction, the pair's odd product
  first (tests/kernels/test_bf16_dot_v4.py models it exactly);
- **aarch64+bf16** (FEAT_BF16, 4 lanes): the same words made with ``bfcvtn`` (round to nearest
  even, denormals kept) and ``bfdot`` in place of vdpbf16ps (per lane acc + (even product + odd
  product), round to odd; tests/kernels/test_bf16_aarch64.py models it exactly);
- **every other level** (a portable bundle's v2/v3/v4 or aarch64/aarch64+dotprod variants: the
  weights are shared):
  the planes stay float32 (the channels of a pair one plane after the other) and each weight is
  widened as it is broadcast (``word << 16``, exact), two float32 multiply-adds per pair, in the
  order of the channels; slower than fp32 there (the widening), correct everywhere.
"""

from __future__ import annotations

from llvmlite import ir

from ..ir.graph import PrimFunc
from ..ops.bf16 import CONV_PAIR_KIND
from .bf16dot import (BF16, BFDOT, DOT_LANES, KIND_LANES, VDPBF16PS, bf16_bits_portable,
                      bfcvtn_words, dot_kind, dot_words)
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .contraction.kernel import ContractionEmitter
from .contraction.match import Contraction, match_contraction
from .helpers import F32, I1, I32, alloca_once, const_i64, for_range, intrinsic
from .lower import WORKSPACE_ALIGN, KernelInfo

I16 = ir.IntType(16)
# Register tiles (rows = output channels, vectors of pixels per row, relative cost per computed
# output): with AVX-512's 32 registers, up to 24 accumulators beside the nv pixel vectors and a
# broadcast; with 16 registers (the widened levels), contraction/geometry.py's AVX2 tiles.
TILES_32_REGS = ((4, 4, 1.0), (6, 3, 1.0), (8, 2, 1.02), (12, 1, 1.1))
DOT_8X3_COST = 0.95
TILES_16_REGS = ((4, 3, 1.0), (6, 2, 1.02))
# vdpbf16ps (the dot path) on planes of DOT_8X3_PIXELS output pixels (above the first, up to the
# second) also: 8 x 3
# (24 accumulators, 3 pixel vectors, the broadcast: 8 broadcasts and 3 loads per 24
# vdpbf16ps, where 8 x 2 takes 10 per 16 and 4 x 4 8 per 16). ResNet-50 in the network, 1
# thread, kernel CPU minima: its 1x1s at 28x28 0.95-0.98x; at 56x56 0.97-1.03x (level, kept on
# 4 x 4); at 14x14 the 1024 -> 256 and 1024 -> 512 0.97x but the 256 -> 1024 with a pair-word
# residual 1.10-1.15x (not understood: the next panel's output prefetch slowed the same five
# by 1.2x), hence not there (docs/performance.md).
TILES_DOT = TILES_32_REGS + ((8, 3, DOT_8X3_COST),)
DOT_8X3_PIXELS = (14 * 14, 28 * 28)


def match_conv_pairs(func: PrimFunc) -> Contraction | None:
    return match_contraction(func, kinds=(CONV_PAIR_KIND,))


def pair_conv_geometry(x_shape, wp_shape, out_shape, strides, padding, vl: int,
                       dot: bool = False) -> dict:
    """The plane layout and register tile of a ``conv2d_bf16p`` for vectors of ``vl`` lanes
    (``dot``: vdpbf16ps's tiles)."""
    _, c, h, w = x_shape
    o, cp, kh, kw, _ = wp_shape
    oh, ow = out_shape[2:]
    sh, sw = strides
    pt, pl, pb, pr = padding
    ny, nx = min(sh, kh), min(sw, kw)
    hq = max(-(-(h + pt + pb) // sh), oh + (kh - 1) // sh)
    wq = max(-(-(w + pl + pr) // sw), ow + (kw - 1) // sw)
    pflat = oh * wq
    best = None
    tiles = TILES_DOT if dot and DOT_8X3_PIXELS[0] < oh * ow <= DOT_8X3_PIXELS[1] \
        else TILES_32_REGS
    for mr, nv, eff in tiles if vl == 16 else TILES_16_REGS:
        mr = min(mr, o)
        nr = nv * vl
        cost = -(-o // mr) * mr * -(-pflat // nr) * nr * eff
        if best is None or cost < best[0]:
            best = (cost, mr, nv)
    _, mr, nv = best
    nr = nv * vl
    panels = -(-pflat // nr)
    shift_max = ((kh - 1) // sh) * wq + (kw - 1) // sw
    # rows past hq (outside the image: zero) so that the last panel's reads stay in its plane
    rows = max(hq, -(-(panels * nr + shift_max) // wq))
    pstride = rows * wq
    return dict(c=c, h=h, w=w, o=o, og=o, cp=cp, kh=kh, kw=kw, oh=oh, ow=ow, sh=sh, sw=sw,
                pt=pt, pl=pl, ny=ny, nx=nx, wq=wq, rows=rows, pstride=pstride, pflat=pflat,
                mr=mr, nv=nv, nr=nr, vl=vl, panels=panels, shift_max=shift_max,
                plane_elems=2 * cp * ny * nx * pstride)


class PairConvEmitter(ContractionEmitter):
    """``nn.conv2d_bf16p``: ``dot`` True, vdpbf16ps on bfloat16 pair planes (16 lanes); else
    float32 planes and widened weights."""

    plans_conv = False

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: Contraction,
                 vl: int, dot: str | None = None, emulate: bool = False) -> None:
        super().__init__(module, func, symbol, match, DOT_LANES if emulate else vl)
        self.emulate = emulate   # the dot path in portable IR (CompileOptions.bf16_emulate)
        self.kind = VDPBF16PS if emulate else dot   # bf16dot.DOT_KINDS: the dot instruction
        self.dot = emulate or (dot is not None and vl == KIND_LANES[dot])
        # the input already as pair words (passes/bf16_pairs.py: a 1x1, stride 1, no padding):
        # plane j is the H * W words of pair j, read in place (no pair planes copied)
        self.pairs_in = bool(func.attrs.get("bf16_pairs_in"))
        # epilogue operands (a residual) held as dense pair words (passes/bf16_pairs.py)
        self.pair_word_reads = {func.inputs[i].uid: tuple(pad)
                                for i, pad in func.attrs.get("bf16_pairs_read", ())}
        # the output written as pair words for the next bf16 convolution (padded by these)
        self.pairs_out = func.attrs.get("bf16_pairs_out")
        # the input as pair words of this padding (passes/bf16_pairs.py: a strided 1x1): the
        # planes filled from the words, not from float32 values
        self.pairs_fill = func.attrs.get("bf16_pairs_fill")
        if (self.pairs_in or self.pairs_out is not None or self.pairs_fill is not None) \
                and not self.dot:
            raise ValueError("nn.conv2d_bf16p with pair words needs the dot instruction")

    def _conv_geometry(self) -> dict:
        if self._geom_cache is None:
            x, wp = self.match.tag.operands
            attrs = self.match.tag.attrs
            self._geom_cache = pair_conv_geometry(x.shape, wp.shape, self.match.out.shape,
                                                  attrs["strides"], attrs["padding"], self.vl,
                                                  dot=self.dot)
            if self.pairs_in:   # (a 1x1 window: no shifted reads; wq = w)
                g = self._geom_cache
                g.update(rows=g["h"], pstride=g["h"] * g["w"], plane_elems=0)
        return self._geom_cache

    def _planes_bytes(self) -> int:
        # every image its own planes (tasks run without a barrier, see contraction/conv.py); the dot path's
        # words are half the float32 planes
        g = self._conv_geometry()
        per_image = g["plane_elems"] // (2 if self.dot else 1) * 4
        nbytes = per_image * self.match.tag.operands[0].shape[0]
        return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    def _weights_floats(self) -> int:
        """Widened levels: a task's region for its block's weights as float32 (mr rows)."""
        g = self._conv_geometry()
        return -(-g["mr"] * g["cp"] * g["kh"] * g["kw"] * 2 // 16) * 16

    def _workspace_bytes(self) -> int:
        regions = 0 if self.dot else self._weights_floats() * 4 * MAX_TASK_REGIONS
        return self._planes_bytes() + regions

    def emit(self) -> KernelInfo:
        g = self._conv_geometry()
        if self.pair_word_reads and (g["wq"] != g["ow"] or not (
                self._vector_epilogue_ok() and self._rows_contiguous())):
            raise ValueError("a pair-word residual needs whole rows and a vector epilogue")
        params = self.func.inputs + self.func.outputs
        workspace = self._workspace_bytes()
        body_fn, ptr_types = self._begin_body(params, True)
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        self._emit_pair_conv(body_fn.args[len(params)], task, ntasks)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), workspace,
                          self._macs() >= PARALLEL_MIN_MACS)

    def _emit_pair_conv(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        g = self._conv_geometry()
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        elem = I32 if self.dot else F32
        planes_all = b.bitcast(ws, elem.as_pointer())
        image_elems = g["plane_elems"] // (2 if self.dot else 1)
        mblocks = -(-g["o"] // g["mr"])
        nr, wq = g["nr"], g["wq"]
        self._w_region = None
        if not self.dot:
            # widened levels: each task widens its block's weights once into a float32 region
            # (one broadcast load per weight in the loop, as fp32's); tasks past
            # MAX_TASK_REGIONS get no work
            ntasks = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                              const_i64(MAX_TASK_REGIONS))
            base = b.bitcast(b.gep(ws, [const_i64(self._planes_bytes())], inbounds=True),
                             F32.as_pointer())
            self._w_region = b.gep(base, [b.mul(b.select(b.icmp_signed("<", task, ntasks), task,
                                                         const_i64(0)),
                                                const_i64(self._weights_floats()))],
                                   inbounds=True)
            task = b.select(b.icmp_signed("<", task, ntasks), task, ntasks)
        with for_range(b, const_i64(0), const_i64(x_t.shape[0]), "n") as n:
            x_img = b.gep(x_ptr, [b.mul(n, const_i64(g["c"] * g["h"] * g["w"]))], inbounds=True)
            if self.pairs_fill is not None:   # the words of image n (as floats: bits kept)
                wpt, wpl, wpb, wpr = self.pairs_fill
                x_img = b.gep(x_ptr, [b.mul(n, const_i64(
                    g["cp"] * (g["h"] + wpt + wpb) * (g["w"] + wpl + wpr)))], inbounds=True)
            planes = b.gep(planes_all, [b.mul(n, const_i64(image_elems))], inbounds=True)
            if self.pairs_in:
                planes = b.gep(b.bitcast(x_ptr, I32.as_pointer()),
                               [b.mul(n, const_i64(g["cp"] * g["pstride"]))], inbounds=True)
            # work items (panel, block row), the block row innermost: a panel's planes are
            # reused by every block of output channels
            lo, hi = self._split(g["panels"] * mblocks, task, ntasks)
            with b.if_then(b.icmp_signed(">", hi, lo)):
                jp_lo = b.sdiv(lo, const_i64(mblocks))
                jp_hi = b.sdiv(b.add(hi, const_i64(mblocks - 1)), const_i64(mblocks))
                u_lo = b.sdiv(b.mul(jp_lo, const_i64(nr)), const_i64(wq))
                u_hi = b.sdiv(b.add(b.mul(jp_hi, const_i64(nr)),
                                    const_i64(g["shift_max"] + wq - 1)), const_i64(wq))
                u_hi = b.select(b.icmp_signed("<", u_hi, const_i64(g["rows"])), u_hi,
                                const_i64(g["rows"]))
                if not self.pairs_in:
                    self._fill_pair_planes(g, x_img, planes, u_lo, u_hi)
                tail = self._tail_geometry(g)
                with for_range(b, lo, hi, "work") as work:
                    mb = b.srem(work, const_i64(mblocks))
                    jp = b.sdiv(work, const_i64(mblocks))
                    if tail is None:
                        self._pair_block(g, n, mb, jp, planes)
                    else:
                        last = b.icmp_signed("==", jp, const_i64(g["panels"] - 1))
                        with b.if_else(last) as (in_tail, in_body):
                            with in_tail:
                                self._pair_block(tail, n, mb, jp, planes)
                            with in_body:
                                self._pair_block(g, n, mb, jp, planes)

    def _tail_geometry(self, g: dict) -> dict | None:
        """vdpbf16ps on a 1x1 window: the last panel with only the vectors that hold outputs
        (``nv`` of them where the panel is full: None), so that a 14x14 plane in panels of 32
        pixels computes 208 of them, not 224."""
        if not self.dot or g["kh"] * g["kw"] != 1:
            return None
        left = g["pflat"] - (g["panels"] - 1) * g["nr"]
        nv = -(-left // self.vl)
        if nv >= g["nv"]:
            return None
        return dict(g, nv=nv, nr=nv * self.vl, panel_nr=g["nr"])

    def _conv_epilogue(self, g: dict, out, n, oc0, local0, p0, tile) -> None:
        if self.pairs_out is None:
            super()._conv_epilogue(g, out, n, oc0, local0, p0, tile)
        else:
            self._pair_epilogue(g, out, n, oc0, p0, tile)

    def _pair_epilogue(self, g: dict, out, n, oc0, p0, tile) -> None:
        """The epilogue writing pair words (``pairs_out``, passes/bf16_pairs.py; output rows of
        ``wq == ow`` columns, an even tile of rows): tile rows 2i and 2i + 1 (channels oc0 + 2i,
        + 1) through the fused epilogue, a vector of pixels at a time, made into the words
        (bf16(even), bf16(odd)) by ``pair_words`` and stored at [n, oc / 2, oy + pt, ox + pl]
        of the [N, O / 2, OH + pt + pb, OW + pl + pr] words (per output row the vector's lanes
        in it, where there is padding); then the rows' padding columns, and above the first
        and below the last row the padding rows, zero words."""
        b, vl = self.builder, self.vl
        if g["wq"] != g["ow"] or not (self._vector_epilogue_ok() and self._rows_contiguous()):
            raise ValueError("bf16 pair-word output needs whole rows and a vector epilogue")
        pt, pl, pb, pr = self.pairs_out
        oh, ow, o, nr, pflat = g["oh"], g["ow"], g["o"], g["nr"], g["pflat"]
        hp, wp = oh + pt + pb, ow + pl + pr
        plane = hp * wp
        padded = any(self.pairs_out)
        ivec = ir.VectorType(I32, vl)
        i64v = ir.VectorType(ir.IntType(64), vl)
        lanes = ir.Constant(i64v, list(range(vl)))
        words = b.bitcast(self.buffers[out.uid], I32.as_pointer())
        img = b.gep(words, [b.mul(n, const_i64(o // 2 * plane))], inbounds=True)
        store = intrinsic(self.module, f"llvm.masked.store.v{vl}i32.p0", ir.VoidType(),
                          [ivec, ivec.as_pointer(), I32, ir.VectorType(I1, vl)])
        rows = b.sub(const_i64(o), oc0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(g["mr"])), rows, const_i64(g["mr"]))
        pair0 = b.sdiv(oc0, const_i64(2))

        def put(words_v, base, p, count, full: bool) -> None:
            """Lanes [0, count) of the words of pixels p .. p + vl - 1 into pair plane
            ``base``."""
            if not padded:
                ptr = b.bitcast(b.gep(base, [p], inbounds=True), ivec.as_pointer())
                if full:
                    b.store(words_v, ptr, align=4)
                else:
                    b.call(store, [words_v, ptr, ir.Constant(I32, 4),
                                   self._lane_mask(count, 0)])
                return
            pix = b.add(self._splat_i64(p), lanes)
            inside = b.icmp_signed("<", lanes, self._splat_i64(count))
            r0 = b.sdiv(p, const_i64(ow))
            r1 = b.add(b.sdiv(b.sub(b.add(p, count), const_i64(1)), const_i64(ow)),
                       const_i64(1))
            with for_range(b, r0, r1, "prow") as r:
                start = b.mul(r, const_i64(ow))
                in_row = b.and_(b.icmp_signed(">=", pix, self._splat_i64(start)),
                                b.icmp_signed("<", pix, self._splat_i64(
                                    b.add(start, const_i64(ow)))))
                # lane 0's word if it were in row r (the masked lanes are not written)
                at = b.add(b.sub(p, start), b.add(b.mul(b.add(r, const_i64(pt)),
                                                        const_i64(wp)), const_i64(pl)))
                b.call(store, [words_v, b.bitcast(b.gep(base, [at]), ivec.as_pointer()),
                               ir.Constant(I32, 4), b.and_(in_row, inside)])

        def clear_padding(base) -> None:
            """The padding of the rows this panel wrote, of one pair."""
            p_end = b.add(p0, const_i64(nr))
            p_end = b.select(b.icmp_signed("<", p_end, const_i64(pflat)), p_end,
                             const_i64(pflat))
            zero = ir.Constant(I32, 0)
            with for_range(b, b.sdiv(p0, const_i64(ow)),
                           b.add(b.sdiv(b.sub(p_end, const_i64(1)), const_i64(ow)),
                                 const_i64(1)), "prz") as r:
                row = b.gep(base, [b.mul(b.add(r, const_i64(pt)), const_i64(wp))],
                            inbounds=True)
                for x in list(range(pl)) + list(range(pl + ow, wp)):
                    b.store(zero, b.gep(row, [const_i64(x)], inbounds=True))
            if pt:
                with b.if_then(b.icmp_signed("==", p0, const_i64(0))):
                    with for_range(b, const_i64(0), const_i64(pt * wp), "pzt") as k:
                        b.store(zero, b.gep(base, [k], inbounds=True))
            if pb:
                with b.if_then(b.icmp_signed(">=", p_end, const_i64(pflat))):
                    with for_range(b, const_i64((pt + oh) * wp), const_i64(plane), "pzb") as k:
                        b.store(zero, b.gep(base, [k], inbounds=True))

        with for_range(b, const_i64(0), b.sdiv(rows, const_i64(2)), "pi") as i:
            base = b.gep(img, [b.mul(b.add(pair0, i), const_i64(plane))], inbounds=True)
            for v in range(g["nv"]):
                p = b.add(p0, const_i64(v * vl))
                left = b.sub(const_i64(pflat), p)
                for full in (True, False):
                    cond = b.icmp_signed(">=", left, const_i64(vl)) if full else b.and_(
                        b.icmp_signed("<", left, const_i64(vl)),
                        b.icmp_signed(">", left, const_i64(0)))
                    with b.if_then(cond):
                        mask = None if full else self._lane_mask(left, 0)
                        env = {id(out.axes[0]): n, id(out.axes[2]): b.sdiv(p, const_i64(ow)),
                               id(out.axes[3]): b.srem(p, const_i64(ow))}
                        vals = []
                        for half in range(2):
                            env[id(out.axes[1])] = b.add(oc0, b.add(b.mul(i, const_i64(2)),
                                                                    const_i64(half)))
                            t_idx = b.add(b.mul(b.add(b.mul(i, const_i64(2)), const_i64(half)),
                                                const_i64(nr)), const_i64(v * vl))
                            acc = b.load(self._vec_ptr(tile, t_idx), align=4)
                            vals.append(self.epilogue_vector(acc, env, mask, None,
                                                             opaque_constants=True))
                        put(self._pair_words(vals[0], vals[1]), base, p,
                            const_i64(vl) if full else left, full)
            if padded:
                clear_padding(base)

    # ---- the planes ---------------------------------------------------------------------------

    def _fill_pair_planes(self, g: dict, x_img, planes, u_lo, u_hi) -> None:
        """Plane rows [u_lo, u_hi) of every pair and phase, vl columns at a time."""
        if self.pairs_fill is not None:
            self._fill_from_words(g, x_img, planes, u_lo, u_hi)
            return
        b = self.builder
        vl, wq, sw, w = self.vl, g["wq"], g["sw"], g["w"]
        ny, nx, pstride = g["ny"], g["nx"], g["pstride"]
        lanes = ir.Constant(ir.VectorType(ir.IntType(64), vl), list(range(vl)))
        ivec = ir.VectorType(I32, vl)
        with for_range(b, const_i64(0), const_i64(g["cp"]), "pj") as j:
            for py in range(ny):
                with for_range(b, u_lo, u_hi, "pu") as u:
                    yy = b.sub(b.add(b.mul(u, const_i64(g["sh"])), const_i64(py)),
                               const_i64(g["pt"]))
                    row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                    b.icmp_signed("<", yy, const_i64(g["h"])))
                    yyc = b.select(row_ok, yy, const_i64(0))
                    c0 = b.mul(j, const_i64(2))
                    # the pair's second channel past C (odd C): zero, its masked-off loads
                    # from channel c0's row (not one plane past the input: a page never
                    # touched costs each a fault-suppression assist)
                    second = b.icmp_signed("<", b.add(c0, const_i64(1)), const_i64(g["c"]))
                    src = [b.add(b.mul(ch, const_i64(g["h"] * w)), b.mul(yyc, const_i64(w)))
                           for ch in (c0, b.select(second, b.add(c0, const_i64(1)), c0))]
                    ok = [row_ok, b.and_(row_ok, second)]
                    for px in range(nx):
                        with for_range(b, const_i64(0), const_i64(-(-wq // vl)), "pv") as q:
                            v0 = b.mul(q, const_i64(vl))
                            vs = b.add(self._splat_i64(v0), lanes)
                            store_mask = b.icmp_signed("<", vs, self._splat_i64(const_i64(wq)))
                            vals = [self._source_vector(x_img, src[i], ok[i], v0, px, sw, w)
                                    for i in range(2)]
                            if self.dot:
                                words = self._pair_words(vals[0], vals[1])
                                off = b.add(b.mul(b.add(b.mul(j, const_i64(ny * nx)),
                                                        const_i64(py * nx + px)),
                                                  const_i64(pstride)),
                                            b.add(b.mul(u, const_i64(wq)), v0))
                                self._masked_store(b.gep(planes, [off]), words, ivec,
                                                   store_mask)
                            else:
                                for i in range(2):
                                    plane = b.add(b.mul(b.add(c0, const_i64(i)),
                                                        const_i64(ny * nx)),
                                                  const_i64(py * nx + px))
                                    off = b.add(b.mul(plane, const_i64(pstride)),
                                                b.add(b.mul(u, const_i64(wq)), v0))
                                    self._masked_store(b.gep(planes, [off]), vals[i], self.vty,
                                                       store_mask)

    def _fill_from_words(self, g: dict, x_img, planes, u_lo, u_hi) -> None:
        """``pairs_fill``: the planes' rows from the input's pair words ([C / 2, H + pt + pb,
        W + pl + pr] of an image at ``x_img``, the padding ``pairs_fill``), the words of a
        phase's columns picked as ``_source_vector`` picks values (bits kept: loads and
        shuffles only); zero words outside the image. A 1x1 window without padding."""
        b = self.builder
        vl, wq, sw, w, h = self.vl, g["wq"], g["sw"], g["w"], g["h"]
        ny, nx, pstride = g["ny"], g["nx"], g["pstride"]
        wpt, wpl, wpb, wpr = self.pairs_fill
        wrow = w + wpl + wpr
        wplane = (h + wpt + wpb) * wrow
        lanes = ir.Constant(ir.VectorType(ir.IntType(64), vl), list(range(vl)))
        ivec = ir.VectorType(I32, vl)
        with for_range(b, const_i64(0), const_i64(g["cp"]), "pj") as j:
            for py in range(ny):
                with for_range(b, u_lo, u_hi, "pu") as u:
                    yy = b.sub(b.add(b.mul(u, const_i64(g["sh"])), const_i64(py)),
                               const_i64(g["pt"]))
                    row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                    b.icmp_signed("<", yy, const_i64(h)))
                    yyc = b.select(row_ok, yy, const_i64(0))
                    src = b.add(b.mul(j, const_i64(wplane)),
                                b.add(b.mul(b.add(yyc, const_i64(wpt)), const_i64(wrow)),
                                      const_i64(wpl)))
                    for px in range(nx):
                        with for_range(b, const_i64(0), const_i64(-(-wq // vl)), "pv") as q:
                            v0 = b.mul(q, const_i64(vl))
                            vs = b.add(self._splat_i64(v0), lanes)
                            store_mask = b.icmp_signed("<", vs, self._splat_i64(const_i64(wq)))
                            words = b.bitcast(self._source_vector(x_img, src, row_ok, v0, px,
                                                                  sw, w), ivec)
                            off = b.add(b.mul(b.add(b.mul(j, const_i64(ny * nx)),
                                                    const_i64(py * nx + px)),
                                              const_i64(pstride)),
                                        b.add(b.mul(u, const_i64(wq)), v0))
                            self._masked_store(b.gep(planes, [off]), words, ivec, store_mask)

    def _splat_i64(self, x: ir.Value) -> ir.Value:
        b = self.builder
        ty = ir.VectorType(ir.IntType(64), self.vl)
        v = b.insert_element(ir.Constant(ty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(ty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _source_vector(self, x_img, row_start, ok, v0, px: int, sw: int, w: int) -> ir.Value:
        """The input at columns ``v * sw + px - pl`` (v = v0 .. v0 + vl) of the row starting
        at ``row_start``, zero outside it (or everywhere when ``ok`` is false): masked loads,
        ``sw`` consecutive vectors and every ``sw``-th lane for a stride."""
        b = self.builder
        vl = self.vl
        g = self._conv_geometry()
        first = b.add(b.mul(v0, const_i64(sw)), const_i64(px - g["pl"]))
        lane_ids = ir.Constant(ir.VectorType(ir.IntType(64), vl), list(range(vl)))
        loads = []
        for s in range(sw):
            cols = b.add(self._splat_i64(b.add(first, const_i64(s * vl))), lane_ids)
            inside = b.and_(b.icmp_signed(">=", cols, self._splat_i64(const_i64(0))),
                            b.icmp_signed("<", cols, self._splat_i64(const_i64(w))))
            inside = b.and_(inside, self._splat_i1(ok))
            # a masked lane is not read: the address may lie outside the row
            ptr = b.gep(x_img, [b.add(row_start, b.add(first, const_i64(s * vl)))])
            loads.append(self._masked_load(b.bitcast(ptr, self.vty.as_pointer()), inside))
        if sw == 1:
            return loads[0]
        # concatenate the sw vectors (padded to a power of two with zeros), keep lane l * sw
        zero = ir.Constant(self.vty, [0.0] * vl)
        while len(loads) & (len(loads) - 1):
            loads.append(zero)
        while len(loads) > 1:
            n = loads[0].type.count
            idx = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
            loads = [b.shuffle_vector(loads[i], loads[i + 1], idx)
                     for i in range(0, len(loads), 2)]
        pick = ir.Constant(ir.VectorType(I32, vl), [lane * sw for lane in range(vl)])
        return b.shuffle_vector(loads[0], loads[0], pick)

    def _splat_i1(self, x: ir.Value) -> ir.Value:
        b = self.builder
        ty = ir.VectorType(I1, self.vl)
        v = b.insert_element(ir.Constant(ty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(ty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _pair_words(self, even: ir.Value, odd: ir.Value) -> ir.Value:
        return pair_words(self.builder, self.module, even, odd, self.emulate, self.kind)

    def _dot(self, acc: ir.Value, pair: ir.Value, xw: ir.Value) -> ir.Value:
        return dot_words(self.builder, self.module, acc, pair, xw, self.emulate, self.kind)

    def _masked_store(self, ptr, value, vty: ir.VectorType, mask) -> None:
        b = self.builder
        elem = "i32" if vty.element == I32 else "f32"
        fn = intrinsic(self.module, f"llvm.masked.store.v{vty.count}{elem}.p0", ir.VoidType(),
                       [vty, vty.as_pointer(), I32, ir.VectorType(I1, vty.count)])
        b.call(fn, [value, b.bitcast(ptr, vty.as_pointer()), ir.Constant(I32, 4), mask])

    # ---- the blocks ---------------------------------------------------------------------------

    def _pair_block(self, g: dict, n, mb, jp, planes) -> None:
        """The mr x nr outputs of block row ``mb`` (output channels) and panel ``jp``."""
        b = self.builder
        mr, nv, nr, o, cp = g["mr"], g["nv"], g["nr"], g["o"], g["cp"]
        taps = [(ky, kx) for ky in range(g["kh"]) for kx in range(g["kw"])]
        ntaps = len(taps)
        sh, sw, ny, nx, wq, pstride = g["sh"], g["sw"], g["ny"], g["nx"], g["wq"], g["pstride"]
        p0 = b.mul(jp, const_i64(g.get("panel_nr", nr)))   # (a tail panel: the full panels')
        oc0 = b.mul(mb, const_i64(mr))
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        # rows past the last channel repeat it: computed, not stored
        rows = [b.select(b.icmp_signed("<", b.add(oc0, const_i64(i)), const_i64(o)),
                         b.add(oc0, const_i64(i)), const_i64(o - 1)) for i in range(mr)]

        def plane_offset(j, t: int, planes_per_pair: int, half: int, v: int) -> ir.Value:
            ky, kx = taps[t]
            plane = b.add(b.mul(b.add(b.mul(j, const_i64(planes_per_pair)), const_i64(half)),
                                const_i64(ny * nx)), const_i64((ky % sh) * nx + kx % sw))
            return b.add(b.mul(plane, const_i64(pstride)),
                         b.add(p0, const_i64((ky // sh) * wq + kx // sw + v * self.vl)))

        if self.dot:
            tile = self._dot_tile(mr, nv, cp, ntaps, rows, w_ptr, planes, plane_offset)
        else:
            # the block's rows widened once: row i's cp * ntaps * 2 weights at i * per_row
            per_row = cp * ntaps * 2
            region = self._w_region
            src16 = b.bitcast(w_ptr, I16.as_pointer())
            for i in range(mr):
                src = b.gep(src16, [b.mul(rows[i], const_i64(per_row))], inbounds=True)
                with for_range(b, const_i64(0), const_i64(per_row), "wz") as e:
                    half16 = b.load(b.gep(src, [e], inbounds=True))
                    wide = b.bitcast(b.shl(b.zext(half16, I32), ir.Constant(I32, 16)), F32)
                    b.store(wide, b.gep(region, [b.add(const_i64(i * per_row), e)],
                                        inbounds=True))

            def a_scalar(j, u, i):
                t, half = u
                return b.load(b.gep(region, [b.add(
                    const_i64(i * per_row + 2 * t + half), b.mul(j, const_i64(2 * ntaps)))],
                    inbounds=True))

            def b_vector(j, u, v):
                t, half = u
                return b.load(self._vec_ptr(planes, plane_offset(j, t, 2, half, v)), align=4)

            steps = [(t, half) for t in range(ntaps) for half in (0, 1)]
            tile = self._microkernel(mr, nv, cp, a_scalar, b_vector, steps)
        self._conv_epilogue(g, self.match.out, n, oc0, oc0, p0, tile)

    def _dot_tile(self, mr: int, nv: int, cp: int, ntaps: int, rows, w_ptr, planes,
                  plane_offset) -> ir.Value:
        """vdpbf16ps over the pairs and taps: accumulators mr x nv, returned as a tile."""
        b = self.builder
        vl = self.vl
        ivec = ir.VectorType(I32, vl)
        words = b.bitcast(w_ptr, I32.as_pointer())
        # each row's weight words, hoisted out of the reduction loop (affine in the pair)
        row_words = [b.gep(words, [b.mul(r, const_i64(cp * ntaps))], inbounds=True)
                     for r in rows]
        accs = [alloca_once(b, self.vty, name=f"acc{q}") for q in range(mr * nv)]
        for a in accs:
            b.store(ir.Constant(self.vty, [0.0] * vl), a)
        with for_range(b, const_i64(0), const_i64(cp), "kp") as j:
            vals = [b.load(a) for a in accs]
            for t in range(ntaps):
                xv = [b.load(b.bitcast(b.gep(planes, [plane_offset(j, t, 1, 0, v)],
                                             inbounds=True), ivec.as_pointer()), align=4)
                      for v in range(nv)]
                for i in range(mr):
                    word = b.load(b.gep(row_words[i], [b.add(b.mul(j, const_i64(ntaps)),
                                                             const_i64(t))], inbounds=True))
                    pair = self._splat_word(word)
                    for v in range(nv):
                        q = i * nv + v
                        vals[q] = self._dot(vals[q], pair, xv[v])
            for a, val in zip(accs, vals):
                b.store(val, a)
        self._begin_epilogue()
        tile = alloca_once(b, ir.ArrayType(F32, (mr * nv + 1) * vl), name="tile")
        tile_f = b.bitcast(tile, F32.as_pointer())
        for q, a in enumerate(accs):
            b.store(b.load(a), self._vec_ptr(tile_f, const_i64(q * vl)), align=4)
        return tile_f

    def _splat_word(self, x: ir.Value) -> ir.Value:
        b = self.builder
        ivec = ir.VectorType(I32, self.vl)
        v = b.insert_element(ir.Constant(ivec, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(ivec, None), ir.Constant(ivec, [0] * self.vl))


def pair_words(b: ir.IRBuilder, module: ir.Module, even: ir.Value, odd: ir.Value,
               emulate: bool = False, kind: str | None = VDPBF16PS) -> ir.Value:
    """16 words (bf16(even[l]), bf16(odd[l])), the even channel in the low half:
    vcvtne2ps2bf16 (round to nearest even) gives even's 16 then odd's 16; interleaved
    (``emulate``: in integer IR, ``bf16dot.bf16_bits_portable``; ``BFDOT``: bfcvtn)."""
    if emulate:
        shift = ir.Constant(ir.VectorType(I32, DOT_LANES), [16] * DOT_LANES)
        return b.or_(bf16_bits_portable(b, even), b.shl(bf16_bits_portable(b, odd), shift))
    if kind == BFDOT:
        return bfcvtn_words(b, even, odd, interleave=True)
    vty = ir.VectorType(F32, DOT_LANES)
    v32b = ir.VectorType(BF16, 2 * DOT_LANES)
    cvt = intrinsic(module, "llvm.x86.avx512bf16.cvtne2ps2bf16.512", v32b, [vty, vty])
    halves = b.bitcast(b.call(cvt, [odd, even]), ir.VectorType(I16, 2 * DOT_LANES))
    order = [k for lane in range(DOT_LANES) for k in (lane, lane + DOT_LANES)]
    mixed = b.shuffle_vector(halves, halves, ir.Constant(ir.VectorType(I32, 2 * DOT_LANES),
                                                          order))
    return b.bitcast(mixed, ir.VectorType(I32, DOT_LANES))


def emit_pair_conv(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                   llvm_features: str, emulate: bool = False) -> KernelInfo | None:
    """The kernel of an ``nn.conv2d_bf16p`` ``func`` (static shapes), None for any other
    function; ``llvm_features`` with avx512_bf16 (and 16 lanes) takes vdpbf16ps, with aarch64's
    bf16 (4 lanes) bfdot; ``emulate`` vdpbf16ps's data path in portable IR (tests)."""
    match = match_conv_pairs(func)
    if match is None:
        return None
    return PairConvEmitter(module, func, symbol, match, vl, dot=dot_kind(llvm_features),
                           emulate=emulate).emit()
