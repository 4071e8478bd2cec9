"""Register-blocked kernels for contractions: matmul and conv2d (tagged by their legalizers, see
``ir.patterns``), with whatever elementwise epilogue fusion put after them.

The microkernel keeps an MR x NR block of the output in vector registers (NR a multiple of the
target's vector width) and, for every step k of the reduction, loads NR contiguous values of the
"wide" operand and broadcasts MR scalars of the "narrow" one into fused multiply-adds:

- matmul: ``out[m, n] = sum_k a[m, k] * b[k, n]``: rows m are broadcast from ``a``, the wide
  operand is a row of ``b`` (masked loads on the last, partial panel).
- conv2d: the input is first copied, zero-padded and split by stride phase into *planes* in the
  workspace, so that for every tap (ic, ky, kx) the values needed by a run of consecutive
  flattened outputs ``p = oy * Wq + ox`` (Wq >= the padded width / stride) are contiguous: a
  convolution becomes a GEMM ``out[oc, p] = sum_k w[oc, k] * planes[off(k) + p]`` with no
  bounds checks. Columns with ox >= OW are computed and dropped.

After each block, the fused epilogue (bias, BatchNorm scale/shift, activation, residual add) is
evaluated by the generic expression lowering on the block, with the contraction's value read
from the register tile: loops over contiguous output runs, which LLVM vectorizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import ReductionTag, reduction_tag
from .helpers import F32, I1, I32, I64, STORAGE_TYPES, alloca_once, const_i64, for_range, intrinsic
from .lower import WORKSPACE_ALIGN, KernelEmitter, KernelInfo, _plan_stages


# Below this many multiply-adds (~10 µs on one core) a kernel runs on one thread: handing work
# to another thread costs tens of microseconds in the runtime.
PARALLEL_MIN_MACS = 1 << 20


@dataclass(frozen=True)
class Contraction:
    out: te.Tensor
    body: te.Expr          # the output's expression; ``reduce`` is the contraction inside it
    reduce: te.Reduce
    tag: ReductionTag


def match_contraction(func: PrimFunc) -> Contraction | None:
    """The tagged float32 contraction ``func`` computes, if it has the form the fast kernels
    handle: one output whose expression holds exactly one tagged reduction over placeholders."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32":
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    out, body = outputs[0]
    reduces = [n for n in _walk(body) if isinstance(n, te.Reduce)]
    if len(reduces) != 1:
        return None
    tag = reduction_tag(reduces[0])
    inputs = {t.uid for t in func.inputs}
    if tag is None or not all(t.uid in inputs and t.dtype == "float32" for t in tag.operands):
        return None
    if tag.kind == "conv2d" and tuple(tag.attrs["dilation"]) != (1, 1):
        return None
    if tag.kind == "matmul" and tag.attrs.get("transpose_b"):
        return None
    return Contraction(out, body, reduces[0], tag)


def _walk(e: te.Expr):
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(te.children(node))


def vector_width(target_name: str) -> int:
    """Floats per vector register the kernels are written for."""
    return {"x86-64-v4": 16, "x86-64-v3": 8}.get(target_name, 4)


class ContractionEmitter(KernelEmitter):
    """Emits a matched contraction; the generic emitter evaluates the epilogue."""

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: Contraction,
                 vl: int) -> None:
        super().__init__(module, func, symbol)
        self.match = match
        self.vl = vl
        self.vty = ir.VectorType(F32, vl)
        self._tile_value: ir.Value | None = None

    # The contraction inside the epilogue expression reads the register tile.
    def _reduce(self, e: te.Reduce, env: dict) -> ir.Value:
        if e is self.match.reduce and self._tile_value is not None:
            return self._tile_value
        return super()._reduce(e, env)

    def emit(self) -> KernelInfo:
        m = self.match
        params = self.func.inputs + self.func.outputs
        workspace = self._workspace_bytes()
        ptr_types = [STORAGE_TYPES[t.dtype].as_pointer() for t in params]
        if workspace:
            ptr_types.append(ir.IntType(8).as_pointer())
        n_ptrs = len(ptr_types)
        body_fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), ptr_types + [I64, I64]),
                              name=f"{self.symbol}.body")
        body_fn.linkage = "internal"
        body_fn.attributes.add("alwaysinline")
        body_fn.attributes.add("nounwind")
        for arg in body_fn.args[:n_ptrs]:
            arg.add_attribute("noalias")
        self.builder = ir.IRBuilder(body_fn.append_basic_block("entry"))
        for t, arg in zip(params, body_fn.args):
            self.buffers[t.uid] = arg
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        ws = body_fn.args[len(params)] if workspace else None
        if m.tag.kind == "conv2d":
            self._emit_conv(ws, task, ntasks)
        else:
            self._emit_matmul(task, ntasks)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), workspace,
                          self._macs() >= PARALLEL_MIN_MACS)

    def _macs(self) -> int:
        out, red = self.match.out, self.match.reduce
        n = 1
        for d in out.shape:
            n *= d
        for a in red.axes:
            n *= a.extent
        return n

    # ---- shared pieces --------------------------------------------------------------------------

    def _vec_ptr(self, ptr: ir.Value, offset: ir.Value) -> ir.Value:
        b = self.builder
        return b.bitcast(b.gep(ptr, [offset], inbounds=True), self.vty.as_pointer())

    def _splat(self, x: ir.Value) -> ir.Value:
        b = self.builder
        v = b.insert_element(ir.Constant(self.vty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vty, None),
                                ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))

    def _fma(self, a: ir.Value, x: ir.Value, acc: ir.Value) -> ir.Value:
        fn = intrinsic(self.module, f"llvm.fmuladd.v{self.vl}f32", self.vty,
                       [self.vty] * 3)
        return self.builder.call(fn, [a, x, acc])

    def _masked_load(self, ptr: ir.Value, mask: ir.Value) -> ir.Value:
        vptr = self.vty.as_pointer()
        fn = intrinsic(self.module, f"llvm.masked.load.v{self.vl}f32.p0", self.vty,
                       [vptr, I32, ir.VectorType(I1, self.vl), self.vty])
        return self.builder.call(fn, [ptr, ir.Constant(I32, 4), mask,
                                      ir.Constant(self.vty, [0.0] * self.vl)])

    def _lane_mask(self, remaining: ir.Value, v: int) -> ir.Value:
        """Lanes of vector ``v`` of a panel whose column index is < ``remaining``."""
        b = self.builder
        lanes = ir.Constant(ir.VectorType(I64, self.vl), [v * self.vl + i for i in range(self.vl)])
        rem = b.insert_element(ir.Constant(ir.VectorType(I64, self.vl), None), remaining,
                               ir.Constant(I32, 0))
        rem = b.shuffle_vector(rem, ir.Constant(ir.VectorType(I64, self.vl), None),
                               ir.Constant(ir.VectorType(I32, self.vl), [0] * self.vl))
        return b.icmp_signed("<", lanes, rem)

    def _split(self, total: int, task: ir.Value, ntasks: ir.Value) -> tuple[ir.Value, ir.Value]:
        b = self.builder
        t = const_i64(total)
        return (b.sdiv(b.mul(task, t), ntasks),
                b.sdiv(b.mul(b.add(task, const_i64(1)), t), ntasks))

    def _microkernel(self, mr: int, nv: int, k_extent: int, a_scalar, b_vector,
                     unroll: list | None = None) -> ir.Value:
        """Accumulate an mr x (nv vectors) block over ``k_extent`` steps (times the ``unroll``
        list of unrolled sub-steps); ``a_scalar(k, u, i)`` gives row i's value, ``b_vector(k, u,
        v)`` the v-th vector of the wide operand. Returns the tile (an alloca of mr*nv vectors)."""
        b = self.builder
        accs = [alloca_once(b, self.vty, name=f"acc{i}_{v}") for i in range(mr) for v in range(nv)]
        zero = ir.Constant(self.vty, [0.0] * self.vl)
        for a in accs:
            b.store(zero, a)
        steps = unroll or [None]
        with for_range(b, const_i64(0), const_i64(k_extent), "k") as k:
            vals = [b.load(a) for a in accs]
            for u in steps:
                bv = [b_vector(k, u, v) for v in range(nv)]
                for i in range(mr):
                    ai = self._splat(a_scalar(k, u, i))
                    for v in range(nv):
                        vals[i * nv + v] = self._fma(ai, bv[v], vals[i * nv + v])
            for a, val in zip(accs, vals):
                b.store(val, a)
        tile = alloca_once(b, ir.ArrayType(F32, mr * nv * self.vl), name="tile")
        tile_f = b.bitcast(tile, F32.as_pointer())
        for i in range(mr):
            for v in range(nv):
                b.store(b.load(accs[i * nv + v]),
                        self._vec_ptr(tile_f, const_i64((i * nv + v) * self.vl)), align=4)
        return tile_f

    def _store_epilogue(self, env: dict, tile_f: ir.Value, tile_index: ir.Value) -> None:
        b = self.builder
        out = self.match.out
        self._tile_value = b.load(b.gep(tile_f, [tile_index], inbounds=True))
        value = self._value(self.match.body, env)
        self._tile_value = None
        self._store(self.buffers[out.uid], out, [env[id(a)] for a in out.axes], value)

    # ---- matmul -------------------------------------------------------------------------------

    def _matmul_shape(self) -> tuple[int, int, int, int]:
        out = self.match.out
        a = self.match.tag.operands[0]
        batch = 1
        for n in out.shape[:-2]:
            batch *= n
        return batch, out.shape[-2], a.shape[-1], out.shape[-1]

    def _workspace_bytes(self) -> int:
        if self.match.tag.kind != "conv2d":
            return 0
        g = self._conv_geometry()
        nbytes = (g["planes_floats"] + g["slack"]) * 4
        return -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    def _batch_offset(self, t: te.Tensor, bidx: list[ir.Value]) -> ir.Value:
        """Element offset of matrix number ``bidx`` (out's batch indices) in operand ``t``,
        broadcasting its size-1 batch dimensions."""
        b = self.builder
        out = self.match.out
        nb_out, nb = len(out.shape) - 2, len(t.shape) - 2
        offset: ir.Value = const_i64(0)
        stride = t.shape[-1] * t.shape[-2]
        for d in range(nb - 1, -1, -1):
            if t.shape[d] != 1:
                offset = b.add(offset, b.mul(bidx[nb_out - nb + d], const_i64(stride)))
            stride *= t.shape[d]
        return offset

    def _emit_matmul(self, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        out = self.match.out
        a_t, b_t = self.match.tag.operands
        batch, M, K, N = self._matmul_shape()
        mr = min(M, 6)
        nv = 2 if M >= 4 else max(1, 8 // mr)
        nv = max(1, min(nv, -(-N // self.vl)))
        nr = nv * self.vl
        mblocks, panels = -(-M // mr), -(-N // nr)
        a_ptr, b_ptr = self.buffers[a_t.uid], self.buffers[b_t.uid]
        lo, hi = self._split(batch * panels, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            bi = b.sdiv(work, const_i64(panels))
            jp = b.srem(work, const_i64(panels))
            # batch indices of the output, outermost first
            bidx, rest = [], bi
            for n in reversed(out.shape[:-2]):
                bidx.append(b.srem(rest, const_i64(n)))
                rest = b.sdiv(rest, const_i64(n))
            bidx.reverse()
            a_base = b.gep(a_ptr, [self._batch_offset(a_t, bidx)], inbounds=True)
            b_base = b.gep(b_ptr, [self._batch_offset(b_t, bidx)], inbounds=True)
            n0 = b.mul(jp, const_i64(nr))
            remaining = b.sub(const_i64(N), n0)
            masks = [self._lane_mask(remaining, v) for v in range(nv)]
            with for_range(b, const_i64(0), const_i64(mblocks), "mb") as mb:
                m0 = b.mul(mb, const_i64(mr))

                def a_scalar(k, u, i):
                    row = b.select(b.icmp_signed("<", b.add(m0, const_i64(i)), const_i64(M)),
                                   b.add(m0, const_i64(i)), const_i64(M - 1))
                    return b.load(b.gep(a_base, [b.add(b.mul(row, const_i64(K)), k)],
                                        inbounds=True))

                def b_vector(k, u, v):
                    off = b.add(b.add(b.mul(k, const_i64(N)), n0), const_i64(v * self.vl))
                    ptr = self._vec_ptr(b_base, off)
                    return self._masked_load(ptr, masks[v])

                tile = self._microkernel(mr, nv, K, a_scalar, b_vector)
                env = {id(ax): idx for ax, idx in zip(out.axes[:-2], bidx)}
                rows = b.select(b.icmp_signed("<", b.sub(const_i64(M), m0), const_i64(mr)),
                                b.sub(const_i64(M), m0), const_i64(mr))
                cols = b.select(b.icmp_signed("<", remaining, const_i64(nr)), remaining,
                                const_i64(nr))
                with for_range(b, const_i64(0), rows, "ti") as i:
                    with for_range(b, const_i64(0), cols, "tj") as j:
                        env[id(out.axes[-2])] = b.add(m0, i)
                        env[id(out.axes[-1])] = b.add(n0, j)
                        self._store_epilogue(env, tile, b.add(b.mul(i, const_i64(nr)), j))

    # ---- conv2d -------------------------------------------------------------------------------

    def _conv_geometry(self) -> dict:
        x, w = self.match.tag.operands
        attrs = self.match.tag.attrs
        _, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        _, _, oh, ow = self.match.out.shape
        sh, sw = attrs["strides"]
        pt, pl, pb, pr = attrs["padding"]
        hp, wp = h + pt + pb, wd + pl + pr
        hq, wq = -(-hp // sh), -(-wp // sw)
        hq = max(hq, oh + (kh - 1) // sh)
        wq = max(wq, ow + (kw - 1) // sw)
        groups = attrs["groups"]
        og = o // groups
        pflat = oh * wq                              # flattened outputs computed per channel
        mr = min(og, 6)
        nv = 2 if og >= 4 else 4
        nr = nv * self.vl
        panels = -(-pflat // nr)
        shift_max = ((kh - 1) // sh) * wq + (kw - 1) // sw
        planes = c * sh * sw * hq * wq
        slack = max(0, shift_max + panels * nr - hq * wq) + nr
        return dict(c=c, h=h, w=wd, o=o, cg=cg, kh=kh, kw=kw, oh=oh, ow=ow, sh=sh, sw=sw,
                    pt=pt, pl=pl, hq=hq, wq=wq, groups=groups, og=og, pflat=pflat, mr=mr, nv=nv,
                    nr=nr, panels=panels, planes_floats=planes, slack=slack)

    def _fill_planes(self, g: dict, x_img: ir.Value, planes: ir.Value) -> None:
        """planes[ic, py, px, u, v] = x[ic, u*sh + py - pt, v*sw + px - pl], 0 outside."""
        b = self.builder
        zero = ir.Constant(F32, 0.0)
        with for_range(b, const_i64(0), const_i64(g["c"]), "pc") as ic:
            for py in range(g["sh"]):
                for px in range(g["sw"]):
                    base = b.mul(b.add(b.mul(ic, const_i64(g["sh"] * g["sw"])),
                                       const_i64(py * g["sw"] + px)), const_i64(g["hq"] * g["wq"]))
                    # columns v whose source x = v*sw + px - pl lies inside the row
                    v_lo = min(g["wq"], max(0, -(-(g["pl"] - px) // g["sw"])))
                    v_hi = max(v_lo, min(g["wq"], (g["w"] - 1 + g["pl"] - px) // g["sw"] + 1))
                    with for_range(b, const_i64(0), const_i64(g["hq"]), "pu") as u:
                        yy = b.sub(b.add(b.mul(u, const_i64(g["sh"])), const_i64(py)),
                                   const_i64(g["pt"]))
                        row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                        b.icmp_signed("<", yy, const_i64(g["h"])))
                        dst_row = b.add(base, b.mul(u, const_i64(g["wq"])))
                        with b.if_else(row_ok) as (inside, outside):
                            with inside:
                                src_row = b.add(b.mul(ic, const_i64(g["h"] * g["w"])),
                                                b.mul(yy, const_i64(g["w"])))
                                self._zero_run(planes, dst_row, 0, v_lo)
                                with for_range(b, const_i64(v_lo), const_i64(v_hi), "pv") as v:
                                    xx = b.add(b.mul(v, const_i64(g["sw"])),
                                               const_i64(px - g["pl"]))
                                    val = b.load(b.gep(x_img, [b.add(src_row, xx)], inbounds=True))
                                    b.store(val, b.gep(planes, [b.add(dst_row, v)], inbounds=True))
                                self._zero_run(planes, dst_row, v_hi, g["wq"])
                            with outside:
                                self._zero_run(planes, dst_row, 0, g["wq"])
        # the slack after the last plane is read only by dropped columns; keep it finite
        with for_range(b, const_i64(0), const_i64(g["slack"]), "ps") as s:
            b.store(zero, b.gep(planes, [b.add(const_i64(g["planes_floats"]), s)], inbounds=True))

    def _zero_run(self, ptr: ir.Value, row: ir.Value, lo: int, hi: int) -> None:
        b = self.builder
        if hi > lo:
            with for_range(b, const_i64(lo), const_i64(hi), "pz") as v:
                b.store(ir.Constant(F32, 0.0), b.gep(ptr, [b.add(row, v)], inbounds=True))

    def _emit_conv(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        g = self._conv_geometry()
        out = self.match.out
        x_t, w_t = self.match.tag.operands
        x_ptr, w_ptr = self.buffers[x_t.uid], self.buffers[w_t.uid]
        planes = b.bitcast(ws, F32.as_pointer())
        n_batch = x_t.shape[0]
        mr, nv, nr, og, cg = g["mr"], g["nv"], g["nr"], g["og"], g["cg"]
        mblocks = -(-og // mr)
        taps = [(ky, kx) for ky in range(g["kh"]) for kx in range(g["kw"])]
        khw = len(taps)
        plane = g["hq"] * g["wq"]
        sh, sw, wq = g["sh"], g["sw"], g["wq"]
        with for_range(b, const_i64(0), const_i64(n_batch), "n") as n:
            x_img = b.gep(x_ptr, [b.mul(n, const_i64(g["c"] * g["h"] * g["w"]))], inbounds=True)
            # Every task fills the whole plane buffer (identical values), so no barrier is needed.
            self._fill_planes(g, x_img, planes)
            lo, hi = self._split(g["groups"] * mblocks * g["panels"], task, ntasks)
            with for_range(b, lo, hi, "work") as work:
                # panel innermost: a block of weight rows is reused across the panels
                jp = b.srem(work, const_i64(g["panels"]))
                rest = b.sdiv(work, const_i64(g["panels"]))
                mb = b.srem(rest, const_i64(mblocks))
                grp = b.sdiv(rest, const_i64(mblocks))
                p0 = b.mul(jp, const_i64(nr))
                oc0 = b.add(b.mul(grp, const_i64(og)), b.mul(mb, const_i64(mr)))
                local0 = b.mul(mb, const_i64(mr))
                ic_base = b.mul(grp, const_i64(cg))

                def a_scalar(k, u, i):
                    row = b.select(b.icmp_signed("<", b.add(local0, const_i64(i)), const_i64(og)),
                                   b.add(oc0, const_i64(i)), b.add(b.sub(oc0, local0),
                                                                   const_i64(og - 1)))
                    idx = b.add(b.mul(row, const_i64(cg * khw)),
                                b.add(b.mul(k, const_i64(khw)), const_i64(u)))
                    return b.load(b.gep(w_ptr, [idx], inbounds=True))

                def b_vector(k, u, v):
                    ky, kx = taps[u]
                    plane_idx = b.add(b.mul(b.add(ic_base, k), const_i64(sh * sw)),
                                      const_i64((ky % sh) * sw + kx % sw))
                    off = b.add(b.mul(plane_idx, const_i64(plane)),
                                const_i64((ky // sh) * wq + kx // sw + v * self.vl))
                    return b.load(self._vec_ptr(planes, b.add(off, p0)), align=4)

                tile = self._microkernel(mr, nv, cg, a_scalar, b_vector, list(range(khw)))
                self._conv_epilogue(g, out, n, oc0, local0, p0, tile)

    def _conv_epilogue(self, g: dict, out: te.Tensor, n, oc0, local0, p0, tile) -> None:
        b = self.builder
        mr, nr, wq = g["mr"], g["nr"], g["wq"]
        rows = b.sub(const_i64(g["og"]), local0)
        rows = b.select(b.icmp_signed("<", rows, const_i64(mr)), rows, const_i64(mr))
        p1 = b.add(p0, const_i64(nr))
        oy_lo = b.sdiv(p0, const_i64(wq))
        oy_hi = b.sdiv(b.sub(p1, const_i64(1)), const_i64(wq))
        oy_hi = b.add(b.select(b.icmp_signed("<", oy_hi, const_i64(g["oh"] - 1)), oy_hi,
                               const_i64(g["oh"] - 1)), const_i64(1))
        env = {id(out.axes[0]): n}
        with for_range(b, const_i64(0), rows, "ti") as i:
            env[id(out.axes[1])] = b.add(oc0, i)
            with for_range(b, oy_lo, oy_hi, "oy") as oy:
                row0 = b.mul(oy, const_i64(wq))
                start = b.sub(p0, row0)
                x_lo = b.select(b.icmp_signed(">", start, const_i64(0)), start, const_i64(0))
                end = b.sub(p1, row0)
                x_hi = b.select(b.icmp_signed("<", end, const_i64(g["ow"])), end,
                                const_i64(g["ow"]))
                env[id(out.axes[2])] = oy
                with for_range(b, x_lo, x_hi, "ox") as ox:
                    env[id(out.axes[3])] = ox
                    t_idx = b.add(b.mul(i, const_i64(nr)), b.sub(b.add(row0, ox), p0))
                    self._store_epilogue(env, tile, t_idx)


def emit_contraction(module: ir.Module, func: PrimFunc, symbol: str, vl: int
                     ) -> KernelInfo | None:
    """Emit ``func`` with a register-blocked kernel if it is a contraction they handle."""
    match = match_contraction(func)
    if match is None:
        return None
    return ContractionEmitter(module, func, symbol, match, vl).emit()
