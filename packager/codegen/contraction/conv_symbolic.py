"""Convolutions whose spatial extents are known at run time only (symbolic H, W, batch) that
the channel-lane kernel (``codegen/conv_oc.py``, on AVX2 targets) does not take: 1x1,
grouped and dilated ones, output channels not in whole vectors, other targets.

The static conv kernel (``conv.py``) chooses its plane layout, register tile and loop order
from the sizes at export. Here the channel counts, the window, strides and padding are known
at export and the image size is not, so the kernel takes the sizes as arguments (the module's
size variables) and computes every extent from them:

* per image and group, the window's columns are laid out as a ``[cg * kh * kw, oh * ow]``
  matrix in the workspace (im2col: one row per tap and input channel, zeros outside the image;
  each row is a zero run, a copy LLVM vectorizes, a zero run). A 1x1, stride-1, unpadded conv
  reads its input in place;
* the outputs are that matrix times the weights, with the register-blocked microkernel of the
  matmuls (``ContractionEmitter._microkernel``): a tile of ``mr`` output channels by ``nv``
  vectors of output positions, the last panel of positions masked (its count is a run-time
  value);
* the fused epilogue (bias, activation, residual) runs on the tile a vector at a time, the
  positions mapped back to (row, column) with the run-time output width.

Threads (``task`` of ``ntasks``): a grouped convolution (depthwise included) splits its
groups, each task copying one group at a time into a region of the workspace of its own
(``MAX_TASK_REGIONS`` regions); an ungrouped one splits its (panel, block row) work, every
image having planes (or columns) of its own, and each task copies only the plane rows (or
output rows) its panels read, so the tasks share no row they write differently and need no
barrier. A call with fewer multiply-adds than ``options.parallel_min_macs`` per task uses fewer
tasks (the rest return at once). Depthwise convolutions (one channel per group, horizontal
stride 1 or 2) take a kernel of their own (``codegen/depthwise/symbolic.py``); others with one
channel per group use this kernel with a one-row tile.
"""

from __future__ import annotations

from contextlib import contextmanager


from llvmlite import ir

from ...ir import te
from ...ir.graph import PrimFunc
from ..helpers import F32, I64, alloca_once, const_i64, for_range
from ..lower import WORKSPACE_ALIGN, KernelInfo
from .geometry import (L2_REUSE_BYTES, MAX_TASK_REGIONS, PACKED_1X1_VL, packs_open_1x1,
                       symbolic_conv_tile)
from .conv_packed_symbolic import SymbolicPackedMixin
from .kernel import ContractionEmitter
from .match import match_contraction
from ..threads import DEFAULTS, SplitThresholds


# The columns an image's packed panels hold past its pixels (the last panel's zeros), at most:
# a panel of any target's tile (AVX2's 24).
PACKED_SLACK = 32


class SymbolicConvEmitter(SymbolicPackedMixin, ContractionEmitter):
    plans_conv = False

    def _conv_geometry(self) -> dict:
        """The plan made in ``emit`` (its ``mr`` is the row block of ``conv2d_rows`` weights)."""
        return self.g

    def emit(self) -> KernelInfo:
        x_t = self.match.tag.operands[0]
        attrs = self.match.tag.attrs
        _, c, h, w = x_t.shape
        o, cg, kh, kw = self._weight_shape()
        out = self.match.out
        _, _, oh, ow = out.shape
        g = dict(c=c, h=h, w=w, o=o, cg=cg, kh=kh, kw=kw, oh=oh, ow=ow,
                 sh=attrs["strides"][0], sw=attrs["strides"][1],
                 pt=attrs["padding"][0], pl=attrs["padding"][1],
                 dh=attrs.get("dilation", (1, 1))[0], dw=attrs.get("dilation", (1, 1))[1],
                 groups=attrs["groups"], og=o // attrs["groups"])
        g["direct"] = (kh, kw, g["sh"], g["sw"]) == (1, 1, 1, 1) and not any(attrs["padding"])
        g["K"] = cg * kh * kw
        g["mr"], g["nv"] = symbolic_conv_tile(g["og"], self.vl, kh * kw)
        self.g = g
        # Stride-phase planes (as the static kernel lays them out): one copy of the input,
        # every tap reads them at a shift; columns past the output width are computed and
        # dropped. Dilated windows take the im2col matrix instead.
        g["planes"] = not g["direct"] and g["dh"] == 1 and g["dw"] == 1
        nr = g["nv"] * self.vl
        if g["planes"]:
            g["ny"], g["nx"] = min(g["sh"], kh), min(g["sw"], kw)
            g["hq"] = oh + (kh - 1) // g["sh"]
            g["wq"] = ow + (kw - 1) // g["sw"]
            g["shift"] = ((kh - 1) // g["sh"]) * g["wq"] + (kw - 1) // g["sw"]
            # the last panel reads up to a panel and a vector past the planes: zeros. The same
            # for every target (a bundle's variants share the workspace size): 128 >= nr + vl
            g["slack"] = g["shift"] + 128
            assert nr + self.vl <= 128
            floats = cg * g["ny"] * g["nx"] * g["hq"] * g["wq"] + g["slack"]
        else:
            floats = g["K"] * oh * ow
        # A 1x1 on weights packed in row blocks copies its input into packed panels on AVX2
        # (``conv_packed_symbolic.py``): an image's panels, zeros past its last pixel. Every
        # variant of a bundle has the workspace (they share its size expression); the others
        # read the input in place.
        packs = (self._row_block() is not None and g["groups"] == 1
                 and packs_open_1x1(cg, o, (kh, kw), attrs["strides"], attrs["padding"],
                                    PACKED_1X1_VL))
        g["packed"] = packs and self.vl == PACKED_1X1_VL
        if packs:
            assert nr <= PACKED_SLACK
            floats = cg * (oh * ow + PACKED_SLACK)
        # one region: a group's planes (or columns, or packed panels), 64-byte aligned;
        # grouped convolutions have one per task, ungrouped ones one per image
        g["region"] = -(-floats // 16) * 16
        copies = MAX_TASK_REGIONS if g["groups"] > 1 else x_t.shape[0]
        workspace = (None if g["direct"] and not packs
                     else g["region"] * copies * 4 + WORKSPACE_ALIGN)
        params = self.func.inputs + self.func.outputs
        body_fn, ptr_types = self._begin_body(params, workspace is not None)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(params)] if workspace is not None else None
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        self._emit_body(None if g["direct"] and not g["packed"] else ws, task, ntasks)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        # parallel when a 128 x 128 output would pay for a second task; a smaller call uses
        # fewer tasks (see _tasks_used). (32 x 32 left PP-OCR's detector's stem, 3 -> 16
        # 3x3/2 at 240 x 320, and its ConvTranspose 24 -> 1's GEMM on one thread, where the
        # static bundle splits them.)
        per_position = g["og"] * g["K"] * g["groups"]
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                          per_position * 128 * 128 >= 2 * self.options.parallel_min_macs, symbolic=True,
                          workspace_expr=workspace,
                          choice=self.packed_choice() if packs else None)

    def _split_v(self, total: ir.Value, task: ir.Value, ntasks: ir.Value):
        b = self.builder
        return (b.sdiv(b.mul(task, total), ntasks),
                b.sdiv(b.mul(b.add(task, const_i64(1)), total), ntasks))

    def _tasks_used(self, macs: ir.Value, ntasks: ir.Value, cap: int | None = None) -> ir.Value:
        """How many of ``ntasks`` share ``macs`` multiply-adds: at least PARALLEL_MIN_MACS
        each, at least one, at most ``cap``."""
        b = self.builder
        want = b.sdiv(macs, const_i64(self.options.parallel_min_macs))
        want = b.select(b.icmp_signed("<", want, const_i64(1)), const_i64(1), want)
        nt = b.select(b.icmp_signed("<", want, ntasks), want, ntasks)
        if cap is not None:
            nt = b.select(b.icmp_signed("<", nt, const_i64(cap)), nt, const_i64(cap))
        return nt

    def _emit_body(self, ws: ir.Value | None, task: ir.Value, ntasks: ir.Value) -> None:
        b, g = self.builder, self.g
        if g["packed"]:
            self._emit_packed_sym(ws, task, ntasks)
            return
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        H, W = self._dim_value(g["h"]), self._dim_value(g["w"])
        OH, OW = self._dim_value(g["oh"]), self._dim_value(g["ow"])
        P = b.mul(OH, OW)
        base = None if ws is None else b.bitcast(ws, F32.as_pointer())
        plane = b.mul(H, W)
        N = self._dim_value(x_t.shape[0])
        region = self._dim_value(g["region"]) if ws is not None else None
        macs = b.mul(b.mul(N, P), const_i64(g["og"] * g["K"] * g["groups"]))
        if g["groups"] > 1:
            # each task a run of groups, copied one at a time into its own region
            nt = self._tasks_used(macs, ntasks, MAX_TASK_REGIONS)
            with b.if_then(b.icmp_signed("<", task, nt)):
                lo, hi = self._split_v(const_i64(g["groups"]), task, nt)
                mine = None if base is None else b.gep(base, [b.mul(task, region)],
                                                      inbounds=True)
                with for_range(b, const_i64(0), N, "n") as n:
                    x_img = b.gep(x_ptr, [b.mul(n, b.mul(plane, const_i64(g["c"])))],
                                  inbounds=True)
                    with for_range(b, lo, hi, "grp") as grp:
                        x_grp = b.gep(x_img, [b.mul(grp, b.mul(plane, const_i64(g["cg"])))],
                                      inbounds=True)
                        if mine is None:
                            self._products(n, grp, x_grp, P, OW, None)
                        elif g["planes"]:
                            self._fill_planes_sym(x_grp, mine, H, W)
                            self._plane_products(n, grp, mine, OH, OW, None)
                        else:
                            self._fill_cols(x_grp, mine, H, W, OH, OW, P)
                            self._products(n, grp, mine, P, OW, None)
            return
        # one group: each task a run of (panel, block row) work items, panel outer
        nt = self._tasks_used(macs, ntasks)
        with b.if_then(b.icmp_signed("<", task, nt)):
            nr = g["nv"] * self.vl
            mblocks = -(-g["og"] // g["mr"])
            if g["planes"]:
                wq = self._dim_value(g["wq"])
                positions = b.mul(OH, wq)
            else:
                positions = P
            panels = b.sdiv(b.add(positions, const_i64(nr - 1)), const_i64(nr))
            lo, hi = self._split_v(b.mul(panels, const_i64(mblocks)), task, nt)
            work = (lo, hi, mblocks)
            with for_range(b, const_i64(0), N, "n") as n:
                x_img = b.gep(x_ptr, [b.mul(n, b.mul(plane, const_i64(g["c"])))], inbounds=True)
                if base is None:   # the input read in place: either loop order
                    work = (lo, hi, mblocks, self._panel_inner(P, panels, mblocks))
                    self._products(n, const_i64(0), x_img, P, OW, work)
                else:
                    mine = b.gep(base, [b.mul(n, region)], inbounds=True)
                    jp_lo = b.sdiv(lo, const_i64(mblocks))
                    jp_end = b.add(b.sdiv(b.sub(hi, const_i64(1)), const_i64(mblocks)),
                                   const_i64(1))
                    # One task fills every plane row before its products: either loop order
                    # (weights larger than L2 read once, as the static kernel's rule; 512 x
                    # 512 3x3 at 7x7: 8.1 -> ~3.5 ms). Several tasks each fill the rows of
                    # their panels only, so theirs stay panel outer.
                    if g["planes"]:
                        pbytes = b.mul(positions, const_i64(4 * g["cg"] * g["ny"] * g["nx"]))
                    else:
                        pbytes = b.mul(P, const_i64(4 * g["K"]))
                    work = (lo, hi, mblocks, b.and_(
                        b.icmp_signed("==", nt, const_i64(1)),
                        self._panel_inner(P, panels, mblocks, pbytes)))
                    if g["planes"]:
                        self._fill_planes_sym(x_img, mine, H, W,
                                              rows=self._task_rows_sym(jp_lo, jp_end))
                        self._plane_products(n, const_i64(0), mine, OH, OW, work)
                    else:
                        p_lo = b.mul(jp_lo, const_i64(nr))
                        p_hi = b.mul(jp_end, const_i64(nr))
                        p_hi = b.select(b.icmp_signed("<", p_hi, P), p_hi, P)
                        oy_lo = b.sdiv(p_lo, OW)
                        oy_hi = b.sdiv(b.add(p_hi, b.sub(OW, const_i64(1))), OW)
                        self._fill_cols(x_img, mine, H, W, OH, OW, P, (oy_lo, oy_hi))
                        self._products(n, const_i64(0), mine, P, OW, work)

    def _panel_inner(self, P: ir.Value, panels: ir.Value, mblocks: int,
                     plane_bytes: ir.Value | None = None) -> ir.Value:
        """Whether a convolution runs its panels innermost (each block of weight rows read
        once, the input (planes, columns) once per block row) rather than its block rows (each
        input panel read once, the weights once per panel): the static kernel's rule
        (``geometry.conv_geometry``), on the run-time input size. ``plane_bytes``: the bytes the
        panels read (default: an in-place 1x1 convolution's input)."""
        b, g = self.builder, self.g
        if plane_bytes is None:
            plane_bytes = b.mul(P, const_i64(4 * g["K"]))
        weight_bytes = 4 * g["og"] * g["K"]
        fits = b.icmp_signed("<=", plane_bytes, const_i64(L2_REUSE_BYTES))
        if weight_bytes <= L2_REUSE_BYTES:
            return fits
        inner_reads = b.add(const_i64(weight_bytes), b.mul(plane_bytes, const_i64(mblocks)))
        outer_reads = b.add(plane_bytes, b.mul(panels, const_i64(weight_bytes)))
        return b.or_(fits, b.icmp_signed(">=", outer_reads, inner_reads))

    @contextmanager
    def _work_items(self, panels: ir.Value, mblocks: int, work):
        """Loop over (panel, block row) pairs, panel outer: all of them (``work`` None), or
        the items [lo, hi) of ``work`` = (lo, hi, mblocks[, panel_inner]); ``panel_inner``
        (an i1) puts the panels innermost instead. The pair is stepped along, not divided
        out of the item index per item."""
        b = self.builder
        if work is None:
            with for_range(b, const_i64(0), panels, "jp") as jp:
                with for_range(b, const_i64(0), const_i64(mblocks), "mb") as mb:
                    yield jp, mb
            return
        lo, hi = work[0], work[1]
        panel_inner = work[3] if len(work) > 3 else None
        inner_n = const_i64(mblocks) if panel_inner is None else \
            b.select(panel_inner, panels, const_i64(mblocks))
        outer_p, inner_p = alloca_once(b, I64, "w.outer"), alloca_once(b, I64, "w.inner")
        b.store(b.sdiv(lo, inner_n), outer_p)
        b.store(b.srem(lo, inner_n), inner_p)
        with for_range(b, lo, hi, "work"):
            outer, inner = b.load(outer_p), b.load(inner_p)
            if panel_inner is None:
                yield outer, inner
            else:
                yield b.select(panel_inner, inner, outer), b.select(panel_inner, outer, inner)
            step = b.add(inner, const_i64(1))
            wrap = b.icmp_signed("==", step, inner_n)
            b.store(b.select(wrap, const_i64(0), step), inner_p)
            b.store(b.select(wrap, b.add(outer, const_i64(1)), outer), outer_p)

    def _task_rows_sym(self, jp_lo: ir.Value, jp_end: ir.Value) -> list:
        """The plane rows panels [jp_lo, jp_end) read: rows [u_lo, u_hi) of every plane, and
        rows [0, ov) of the next plane that the last panels' reads spill into (they feed only
        dropped columns, but must be finite)."""
        b, g = self.builder, self.g
        nr = g["nv"] * self.vl
        hq, wq = self._dim_value(g["hq"]), self._dim_value(g["wq"])
        shift = self._dim_value(g["shift"])
        p_lo = b.mul(jp_lo, const_i64(nr))
        p_end = b.add(b.mul(jp_end, const_i64(nr)), shift)

        def clamp(v):
            v = b.select(b.icmp_signed("<", v, hq), v, hq)
            return b.select(b.icmp_signed(">", v, const_i64(0)), v, const_i64(0))

        def rows_up_to(end):
            return clamp(b.sdiv(b.add(end, b.sub(wq, const_i64(1))), wq))

        u_lo = clamp(b.sdiv(p_lo, wq))
        u_hi = rows_up_to(p_end)
        ov = rows_up_to(b.sub(p_end, b.mul(hq, wq)))
        ov = b.select(b.icmp_signed("<", ov, u_lo), ov, u_lo)   # rows [u_lo, ...) are filled
        return [(u_lo, u_hi), (const_i64(0), ov)]

    def _fill_planes_sym(self, x_grp, planes, H, W, rows: list | None = None) -> None:
        """planes[ic, py, px, u, v] = x[ic, u*sh + py - pt, v*sw + px - pl] (0 outside),
        u < hq, v < wq, for the rows u in the ``rows`` ranges ([(lo, hi), ...]; default all);
        then zero slack. As the static kernel's ``_fill_planes``: the columns whose source lies
        inside the row for every column phase are copied by one interleaved loop that reads the
        source row contiguously (LLVM vectorizes it; per-phase strided gathers it does not).
        More than ``UNROLLED_PHASES`` column phases: ``_plane_rows_rolled`` instead."""
        b, g = self.builder, self.g
        sw, pl, ny, nx = g["sw"], g["pl"], g["ny"], g["nx"]
        hq, wq = self._dim_value(g["hq"]), self._dim_value(g["wq"])

        def clamp(v, lo, hi):
            v = b.select(b.icmp_signed("<", v, lo), lo, v)
            return b.select(b.icmp_signed(">", v, hi), hi, v)

        def pick(op, x, y):
            return b.select(b.icmp_signed(op, x, y), x, y)

        if nx > self.UNROLLED_PHASES:   # many column phases: one run-time loop over them
            plane = b.mul(hq, wq)
            with for_range(b, const_i64(0), const_i64(g["cg"]), "ic") as ic:
                x_ch = b.gep(x_grp, [b.mul(ic, b.mul(H, W))], inbounds=True)
                for py in range(ny):
                    phase0 = b.mul(b.add(b.mul(ic, const_i64(ny * nx)), const_i64(py * nx)),
                                   plane)
                    for r_lo, r_hi in rows or [(const_i64(0), hq)]:
                        self._plane_rows_rolled(planes, x_ch, phase0, plane, wq, r_lo, r_hi,
                                                H, W, py)
            self._zero_slack(planes, plane)
            return
        # per column phase px: the columns [lo, hi) whose source v*sw + px - pl is in the row
        spans = []
        for px in range(nx):
            off_x = px - pl
            lo = const_i64(-(off_x // sw)) if off_x < 0 else const_i64(0)   # ceil(-off_x / sw)
            hi = b.add(b.sdiv(b.sub(b.sub(W, const_i64(1)), const_i64(off_x)), const_i64(sw)),
                       const_i64(1))
            lo, hi = clamp(lo, const_i64(0), wq), clamp(hi, const_i64(0), wq)
            spans.append((lo, pick(">", hi, lo)))
        c_lo = spans[0][0]
        c_hi = spans[0][1]
        for lo, hi in spans[1:]:
            c_lo, c_hi = pick(">", c_lo, lo), pick("<", c_hi, hi)
        c_hi = pick(">", c_hi, c_lo)
        plane = b.mul(hq, wq)
        with for_range(b, const_i64(0), const_i64(g["cg"]), "ic") as ic:
            x_ch = b.gep(x_grp, [b.mul(ic, b.mul(H, W))], inbounds=True)
            for py in range(ny):
                bases = [b.mul(b.add(b.mul(ic, const_i64(ny * nx)), const_i64(py * nx + px)),
                               plane) for px in range(nx)]
                for r_lo, r_hi in rows or [(const_i64(0), hq)]:
                    self._plane_rows(planes, x_ch, bases, wq, r_lo, r_hi, H, W, py, spans,
                                     (c_lo, c_hi))
        self._zero_slack(planes, plane)

    def _zero_slack(self, planes, plane) -> None:
        b, g = self.builder, self.g
        end = b.mul(const_i64(g["cg"] * g["ny"] * g["nx"]), plane)
        with for_range(b, const_i64(0), self._dim_value(g["slack"]), "s") as s:
            b.store(ir.Constant(F32, 0.0), b.gep(planes, [b.add(end, s)], inbounds=True))

    # More column phases than this (a horizontal stride and window this wide) fill their
    # planes by a run-time loop over the phases (``_plane_rows_rolled``).
    UNROLLED_PHASES = 16

    def _plane_rows_rolled(self, planes, x_ch, phase0, plane, wq, r_lo, r_hi, H, W, py
                           ) -> None:
        """``_plane_rows`` with the column phases px in a run-time loop, each phase's source
        columns computed in it: for many phases (silero VAD v6's STFT conv, 1x256 stride 128,
        has 128), where unrolled phases made 128 x 5 loops with run-time bounds per row range
        and LLVM's loop strength reduction spent minutes on them (the kernel: 360 CPU-s of
        code generation for x86-64-v2). Each phase reads its source at a stride of sw (LLVM
        does not vectorize it); the rows such a conv reads are short (its output width)."""
        b, g = self.builder, self.g
        sh, sw, pt, pl, nx = g["sh"], g["sw"], g["pt"], g["pl"], g["nx"]
        zero = ir.Constant(F32, 0.0)
        c0 = const_i64(0)

        def pick(op, x, y):
            return b.select(b.icmp_signed(op, x, y), x, y)

        def zeros(dst, lo, hi, name):
            with for_range(b, lo, hi, name) as v:
                b.store(zero, b.gep(dst, [v], inbounds=True))

        with for_range(b, r_lo, r_hi, "u") as u:
            row0 = b.add(phase0, b.mul(u, wq))
            yy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
            inside = b.and_(b.icmp_signed(">=", yy, c0), b.icmp_signed("<", yy, H))
            with b.if_else(inside) as (then, otherwise):
                with then:
                    src = b.gep(x_ch, [b.mul(yy, W)], inbounds=True)
                    with for_range(b, c0, const_i64(nx), "px") as px:
                        dst = b.gep(planes, [b.add(row0, b.mul(px, plane))], inbounds=True)
                        off_x = b.sub(px, const_i64(pl))
                        # columns v whose source v*sw + off_x is in [0, W): from
                        # ceil(-off_x / sw) (0 for off_x >= 0) to floor((W-1-off_x) / sw) + 1
                        lo = b.sdiv(b.add(pick(">", b.sub(const_i64(0), off_x), c0),
                                          const_i64(sw - 1)), const_i64(sw))
                        hi = b.sdiv(pick(">", b.add(b.sub(b.sub(W, const_i64(1)), off_x),
                                                    const_i64(sw)), c0), const_i64(sw))
                        lo = pick("<", lo, wq)
                        hi = pick(">", pick("<", hi, wq), lo)
                        zeros(dst, c0, lo, "z0")
                        with for_range(b, lo, hi, "cp") as v:
                            xx = b.add(b.mul(v, const_i64(sw)), off_x)
                            b.store(b.load(b.gep(src, [xx], inbounds=True)),
                                    b.gep(dst, [v], inbounds=True))
                        zeros(dst, hi, wq, "z1")
                with otherwise:
                    with for_range(b, c0, const_i64(nx), "px") as px:
                        zeros(b.gep(planes, [b.add(row0, b.mul(px, plane))], inbounds=True),
                              c0, wq, "z2")

    def _plane_rows(self, planes, x_ch, bases, wq, r_lo, r_hi, H, W, py, spans, common
                    ) -> None:
        """Plane rows [r_lo, r_hi) of row phase py, every column phase px (``bases``, with
        its source columns ``spans[px]``); the columns in ``common`` by one loop."""
        b, g = self.builder, self.g
        sh, sw, pt, pl = g["sh"], g["sw"], g["pt"], g["pl"]
        zero = ir.Constant(F32, 0.0)
        c_lo, c_hi = common

        def zeros(dst, lo, hi, name):
            with for_range(b, lo, hi, name) as v:
                b.store(zero, b.gep(dst, [v], inbounds=True))

        with for_range(b, r_lo, r_hi, "u") as u:
            dsts = [b.gep(planes, [b.add(base, b.mul(u, wq))], inbounds=True) for base in bases]
            yy = b.add(b.mul(u, const_i64(sh)), const_i64(py - pt))
            inside = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                            b.icmp_signed("<", yy, H))
            with b.if_else(inside) as (then, otherwise):
                with then:
                    src = b.gep(x_ch, [b.mul(yy, W)], inbounds=True)

                    def copy(v, px):
                        xx = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                        b.store(b.load(b.gep(src, [xx], inbounds=True)),
                                b.gep(dsts[px], [v], inbounds=True))

                    for px, (lo, hi) in enumerate(spans):
                        zeros(dsts[px], const_i64(0), lo, "z0")
                        stop = b.select(b.icmp_signed("<", c_lo, hi), c_lo, hi)
                        with for_range(b, lo, stop, "cp0") as v:
                            copy(v, px)
                    with for_range(b, c_lo, c_hi, "cp") as v:
                        for px in range(len(spans)):
                            copy(v, px)
                    for px, (lo, hi) in enumerate(spans):
                        start = b.select(b.icmp_signed(">", c_hi, lo), c_hi, lo)
                        with for_range(b, start, hi, "cp1") as v:
                            copy(v, px)
                        zeros(dsts[px], hi, wq, "z1")
                with otherwise:
                    for dst in dsts:
                        zeros(dst, const_i64(0), wq, "z2")

    def _plane_products(self, n, grp, planes, OH, OW, work) -> None:
        """out[n, grp*og + m, oy, ox] over the planes: position p = oy*wq + ox (ox < wq;
        columns from the output width on are dropped), tap (ky, kx) read at a shift."""
        b, g = self.builder, self.g
        mr, nv, og, cg = g["mr"], g["nv"], g["og"], g["cg"]
        kh, kw, sh, sw, ny, nx = g["kh"], g["kw"], g["sh"], g["sw"], g["ny"], g["nx"]
        nr = nv * self.vl
        khw = kh * kw
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        wq = self._dim_value(g["wq"])
        plane = b.mul(self._dim_value(g["hq"]), wq)
        pq = b.mul(OH, wq)
        panels = b.sdiv(b.add(pq, const_i64(nr - 1)), const_i64(nr))
        mblocks = -(-og // mr)
        # A tap's offset: the input channel's phase planes (k), then a run-time part per
        # (phase, plane row) pair, then a constant (the column shift and the vector), added
        # last so that it folds into the load's displacement: a 7x7/2 stem has 14 pairs for its
        # 49 taps (one run-time offset per tap held 49 values live across the taps' loads, and
        # LLVM spilled vectors around them).
        if khw > self.ROW_LOOP_TAPS:
            self._window_row_products(n, grp, planes, OH, OW, work, panels, plane, wq, pq)
            return
        pairs: dict[tuple[int, int], ir.Value] = {}
        for ky, kx in taps:
            key = ((ky % sh) * nx + kx % sw, ky // sh)
            if key not in pairs:
                pairs[key] = b.add(b.mul(const_i64(key[0]), plane),
                                   b.mul(const_i64(key[1]), wq))
        with self._work_items(panels, mblocks, work) as (jp, mb):
            p0 = b.mul(jp, const_i64(nr))
            local0 = b.mul(mb, const_i64(mr))
            oc0 = b.add(b.mul(grp, const_i64(og)), local0)
            a_scalar = self._conv_weight(oc0, local0, og, khw)

            def b_vector(k, u, v):
                ky, kx = taps[u]
                start = b.gep(planes, [b.add(b.mul(k, b.mul(const_i64(ny * nx), plane)), p0)],
                              inbounds=True)
                start = b.gep(start, [pairs[((ky % sh) * nx + kx % sw, ky // sh)]],
                              inbounds=True)
                return b.load(self._vec_ptr(start, const_i64(kx // sw + v * self.vl)),
                              align=4)

            tile = self._unrolled_microkernel(mr, nv, cg, a_scalar, b_vector, khw)
            self._row_epilogue(n, oc0, local0, p0, pq, wq, OH, OW, tile)

    ROW_LOOP_TAPS = 9   # larger windows loop over (input channel, window row)

    def _window_row_products(self, n, grp, planes, OH, OW, work, panels, plane, wq, pq
                             ) -> None:
        """``_plane_products`` for a large window (a 7x7/2 stem): the microkernel loops over
        (input channel, window row) pairs with the row's kw taps unrolled, so each iteration's
        loads are nx run-time row starts plus constant column shifts. With every tap unrolled
        (49 loads at 14 run-time offsets) LLVM kept the offsets live across the taps and
        spilled accumulators: ResNet-18's stem ran 1.6x the static kernel."""
        b, g = self.builder, self.g
        mr, nv, og, cg = g["mr"], g["nv"], g["og"], g["cg"]
        kh, kw, sh, sw, ny, nx = g["kh"], g["kw"], g["sh"], g["sw"], g["ny"], g["nx"]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        nr = nv * self.vl
        mblocks = -(-og // mr)
        with self._work_items(panels, mblocks, work) as (jp, mb):
            p0 = b.mul(jp, const_i64(nr))
            local0 = b.mul(mb, const_i64(mr))
            oc0 = b.add(b.mul(grp, const_i64(og)), local0)
            last = b.add(b.sub(oc0, local0), const_i64(og - 1))
            # rows past the group's last channel repeat it (computed, not stored)
            rows = [b.select(b.icmp_signed("<", b.add(local0, const_i64(i)), const_i64(og)),
                             b.add(oc0, const_i64(i)), last) for i in range(mr)]

            def a_scalar(k, kx, i):   # k = ic * kh + ky: weight column k * kw + kx
                return b.load(b.gep(w_ptr, [b.add(b.mul(rows[i], const_i64(cg * kh * kw)),
                                                  b.add(b.mul(k, const_i64(kw)),
                                                        const_i64(kx)))], inbounds=True))

            def b_vector(k, kx, v):
                ic, ky = b.udiv(k, const_i64(kh)), b.urem(k, const_i64(kh))
                phase = b.add(b.add(b.mul(ic, const_i64(ny * nx)),
                                    b.mul(b.urem(ky, const_i64(sh)), const_i64(nx))),
                              const_i64(kx % sw))
                start = b.add(b.add(b.mul(phase, plane), b.mul(b.udiv(ky, const_i64(sh)), wq)),
                              p0)
                start = b.gep(planes, [start], inbounds=True)
                return b.load(self._vec_ptr(start, const_i64(kx // sw + v * self.vl)),
                              align=4)

            tile = self._microkernel(mr, nv, cg * kh, a_scalar, b_vector, list(range(kw)))
            self._row_epilogue(n, oc0, local0, p0, pq, wq, OH, OW, tile)

    def _unrolled_microkernel(self, mr, nv, k_extent: int, a_scalar, b_vector,
                              taps: int | None, b_last=None):
        """``_microkernel`` over ``k_extent`` steps of ``taps`` sub-steps each (None: one,
        passed as None), with ``unroll`` steps per loop iteration when a step has fewer than 4
        sub-steps (1x1 convolutions, the columns matrix):
        with one FMA block per iteration LLVM rotated the 12 accumulators through registers
        and spilled two every iteration (a 64 -> 128 1x1/2 conv at 56x56 ran 3.4x the static
        kernel)."""
        b = self.builder
        subs = [None] if taps is None else list(range(taps))
        unroll = next((u for u in (4, 2) if len(subs) < 4 and k_extent % u == 0), 1)
        if unroll == 1:
            return self._microkernel(mr, nv, k_extent, a_scalar, b_vector,
                                     None if taps is None else subs, b_last=b_last)
        steps = [(j, u) for j in range(unroll) for u in subs]

        def wrap(fn):
            if fn is None:
                return None
            return lambda k, ju, x: fn(b.add(b.mul(k, const_i64(unroll)), const_i64(ju[0])),
                                       ju[1], x)
        return self._microkernel(mr, nv, k_extent // unroll, wrap(a_scalar), wrap(b_vector),
                                 steps, b_last=wrap(b_last))

    def _row_epilogue(self, n, oc0, local0, p0, pq, wq, OH, OW, tile) -> None:
        b, g = self.builder, self.g
        out = self.match.out
        mr, nr, og = g["mr"], g["nv"] * self.vl, g["og"]
        rows = b.sub(const_i64(og), local0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(mr)), rows, const_i64(mr))
        p1 = b.add(p0, const_i64(nr))
        p1 = b.select(b.icmp_signed("<", p1, pq), p1, pq)
        oy_lo = b.sdiv(p0, wq)
        oy_hi = b.add(b.sdiv(b.sub(p1, const_i64(1)), wq), const_i64(1))
        env = {id(out.axes[0]): n}
        vector = self._vector_epilogue_ok()
        with for_range(b, const_i64(0), rows, "ti") as i:
            env[id(out.axes[1])] = b.add(oc0, i)
            with for_range(b, oy_lo, oy_hi, "oy") as oy:
                row0 = b.mul(oy, wq)
                start = b.sub(p0, row0)
                x_lo = b.select(b.icmp_signed(">", start, const_i64(0)), start, const_i64(0))
                end = b.sub(p1, row0)
                x_hi = b.select(b.icmp_signed("<", end, OW), end, OW)
                env[id(out.axes[2])] = oy
                self._store_row_span(env, out.axes[3], tile, i, nr, row0, p0, x_lo, x_hi,
                                     vector, clamp=True)

    def _fill_cols(self, x_grp, cols, H, W, OH, OW, P, oy_range=None) -> None:
        """cols[(ic*kh + ky)*kw + kx, oy*OW + ox] = x[ic, oy*sh + ky*dh - pt, ox*sw + kx*dw - pl]
        (0 outside the image), for the output rows oy in ``oy_range`` (default all)."""
        b, g = self.builder, self.g
        sh, sw, pt, pl = g["sh"], g["sw"], g["pt"], g["pl"]
        zero = ir.Constant(F32, 0.0)

        def clamp(v, lo, hi):
            v = b.select(b.icmp_signed("<", v, lo), lo, v)
            return b.select(b.icmp_signed(">", v, hi), hi, v)

        with for_range(b, const_i64(0), const_i64(g["cg"]), "ic") as ic:
            x_ch = b.gep(x_grp, [b.mul(ic, b.mul(H, W))], inbounds=True)
            for ky in range(g["kh"]):
                for kx in range(g["kw"]):
                    k = b.add(b.mul(ic, const_i64(g["kh"] * g["kw"])),
                              const_i64(ky * g["kw"] + kx))
                    row_k = b.gep(cols, [b.mul(k, P)], inbounds=True)
                    off_x = kx * g["dw"] - pl
                    # columns ox whose source ox*sw + off_x lies in [0, W)
                    lo = b.sdiv(b.add(const_i64(-off_x), const_i64(sw - 1)), const_i64(sw)) \
                        if off_x < 0 else const_i64(0)
                    hi = b.add(b.sdiv(b.sub(b.sub(W, const_i64(1)), const_i64(off_x)),
                                      const_i64(sw)), const_i64(1))
                    lo, hi = clamp(lo, const_i64(0), OW), clamp(hi, const_i64(0), OW)
                    hi = b.select(b.icmp_signed("<", hi, lo), lo, hi)
                    oy_lo, oy_hi = oy_range or (const_i64(0), OH)
                    with for_range(b, oy_lo, oy_hi, "oy") as oy:
                        dst = b.gep(row_k, [b.mul(oy, OW)], inbounds=True)
                        yy = b.add(b.mul(oy, const_i64(sh)), const_i64(ky * g["dh"] - pt))
                        inside = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                        b.icmp_signed("<", yy, H))
                        with b.if_else(inside) as (then, otherwise):
                            with then:
                                src = b.gep(x_ch, [b.mul(yy, W)], inbounds=True)
                                with for_range(b, const_i64(0), lo, "z0") as v:
                                    b.store(zero, b.gep(dst, [v], inbounds=True))
                                with for_range(b, lo, hi, "cp") as v:
                                    xx = b.add(b.mul(v, const_i64(sw)), const_i64(off_x))
                                    b.store(b.load(b.gep(src, [xx], inbounds=True)),
                                            b.gep(dst, [v], inbounds=True))
                                with for_range(b, hi, OW, "z1") as v:
                                    b.store(zero, b.gep(dst, [v], inbounds=True))
                            with otherwise:
                                with for_range(b, const_i64(0), OW, "z2") as v:
                                    b.store(zero, b.gep(dst, [v], inbounds=True))

    def _products(self, n, grp, src, P, OW, work) -> None:
        """out[n, grp*og + m, p] = sum_k w[grp*og + m, k] * src[k, p], then the epilogue."""
        b, g = self.builder, self.g
        mr, nv, og, K = g["mr"], g["nv"], g["og"], g["K"]
        nr = nv * self.vl
        panels = b.sdiv(b.add(P, const_i64(nr - 1)), const_i64(nr))
        mblocks = -(-og // mr)
        with self._work_items(panels, mblocks, work) as (jp, mb):
            p0 = b.mul(jp, const_i64(nr))
            remaining = b.sub(P, p0)
            local0 = b.mul(mb, const_i64(mr))
            oc0 = b.add(b.mul(grp, const_i64(og)), local0)
            a_scalar = self._conv_weight(oc0, local0, og, g["kh"] * g["kw"])

            def block(masked: bool) -> None:
                # the lane masks in the partial panel only (made before the branch, LLVM
                # kept them there: a dozen vector compares and spills per full panel)
                masks = [self._lane_mask(remaining, v) for v in range(nv)] if masked else None

                def b_vector(k, u, v):
                    ptr = self._vec_ptr(src, b.add(b.mul(k, P),
                                                   b.add(p0, const_i64(v * self.vl))))
                    return self._masked_load(ptr, masks[v]) if masked else \
                        b.load(ptr, align=4)

                def plain(k, u, v):
                    return b.load(self._vec_ptr(src, b.add(b.mul(k, P), b.add(
                        p0, const_i64(v * self.vl)))), align=4)

                # in the last, partial panel only the last row's loads could run past the
                # rows (the input, or the columns): the lanes past a row read the next one
                # and feed only outputs that are not stored
                tile = self._unrolled_microkernel(mr, nv, K, a_scalar,
                                                  plain if masked else b_vector, None,
                                                  b_last=b_vector if masked else None)
                self._epilogue(n, oc0, local0, p0, remaining, tile, OW, masks, masked)

            with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                with full:
                    block(False)
                with part:
                    block(True)

    def _epilogue(self, n, oc0, local0, p0, remaining, tile, OW, masks, masked: bool) -> None:
        b, g = self.builder, self.g
        out = self.match.out
        mr, nv, og = g["mr"], g["nv"], g["og"]
        nr = nv * self.vl
        rows = b.sub(const_i64(og), local0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(mr)), rows, const_i64(mr))
        cols = b.select(b.icmp_signed("<", remaining, const_i64(nr)), remaining, const_i64(nr))
        env = {id(out.axes[0]): n}
        vector = self._vector_epilogue_ok() and self._rows_contiguous()
        flat = vector and self._flat_positions_ok()

        def row(i) -> None:
            env[id(out.axes[1])] = b.add(oc0, i)
            if not vector:
                with for_range(b, const_i64(0), cols, "tj") as j:
                    p = b.add(p0, j)
                    env[id(out.axes[2])] = b.sdiv(p, OW)
                    env[id(out.axes[3])] = b.srem(p, OW)
                    self._store_epilogue(env, tile, b.add(b.mul(i, const_i64(nr)), j))
            for v in range(nv if vector else 0):
                p = b.add(p0, const_i64(v * self.vl))
                if flat:   # (row 0, column p) is position p: no division by the run-time OW
                    env[id(out.axes[2])], env[id(out.axes[3])] = const_i64(0), p
                else:
                    env[id(out.axes[2])] = b.sdiv(p, OW)
                    env[id(out.axes[3])] = b.srem(p, OW)
                self._store_tile_vector(env, tile, i, nr, v, masked, remaining, masks)

        if og % mr == 0 and vector:
            # every block row whole: unrolled, so that the tile stays in registers (the loop
            # over a run-time row count kept it on the stack: a 24 -> 96 1x1 conv at
            # 120 x 160, ConvTranspose's GEMM in PP-OCR's detector, ran 1.15x the static
            # kernel)
            for r in range(mr):
                row(const_i64(r))
            return
        with for_range(b, const_i64(0), rows, "ti") as i:
            row(i)

    def _flat_positions_ok(self) -> bool:
        """Every read of the epilogue that takes the output's row index takes it as
        [..., oy, ox] (and, ``_rows_contiguous``, with the output's row length), as the output
        itself does: position p = oy * OW + ox may then be given as (0, p)."""
        out = self.match.out
        oy, ox = out.axes[-2], out.axes[-1]
        for node in te.walk(self.match.body, skip=self.match.reduce):
            if isinstance(node, te.Read) and any(i is oy for i in node.indices) and not (
                    len(node.indices) >= 2 and node.indices[-2] is oy
                    and node.indices[-1] is ox):
                return False
        return True


def emit_symbolic_conv(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                       size_vars: tuple[str, ...],
                       options: SplitThresholds = DEFAULTS) -> KernelInfo | None:
    """A conv2d (any groups, NCHW, float32; or ``conv2d_rows``, its weights packed in the
    tile's row blocks by passes/layout.py) whose batch or spatial sizes are run-time values;
    None for anything else (the caller falls back). Depthwise convs take their own kernel
    first (the rule table, ``codegen/rules.py``, asks
    ``depthwise.symbolic.emit_symbolic_depthwise`` before this)."""
    match = match_contraction(func)
    if match is None or match.tag.kind not in ("conv2d", "conv2d_rows"):
        return None
    x_t, w_t = match.tag.operands
    w_types = ("float32", "bfloat16") if match.tag.kind == "conv2d_rows" else ("float32",)
    if x_t.dtype != "float32" or w_t.dtype not in w_types or match.out.dtype != "float32" \
            or len(x_t.shape) != 4 or not all(isinstance(d, int) for d in w_t.shape) \
            or not isinstance(x_t.shape[1], int) or len(match.out.axes) != 4:
        return None
    return SymbolicConvEmitter(module, func, symbol, match, vl, size_vars, options).emit()
