"""The ``qmatmul`` integer GEMM kernel (x [M, K] @ packed W [K, N], int32 accumulation,
ONNX Runtime's requantization in the epilogue) on AVX2 / generic targets and with VNNI / sdot
quads; the family's design, packing and epilogue are described in ``codegen/qgemm.py``."""

from __future__ import annotations

from llvmlite import ir

from ..ops.qlinear import PANEL
from .helpers import I8, I16, I32, alloca_once, const_i64, for_range, intrinsic
from .contraction.geometry import MAX_TASK_REGIONS, PARALLEL_MIN_MACS
from .lower import WORKSPACE_ALIGN, KernelInfo, LoweringError
from .qgemm import V8F32, V8I32, V16I8, V16I16, V16I32, QEmitter, align_workspace


# Rows of qmatmul's VNNI tile on AVX-512 levels: 12 x 2 accumulators, 2 column sums, 2 weight
# quads and a broadcast row in 32 registers.
VNNI_ROWS = 12
# Run-time rows (an open batch or sequence length, ``_open_rows``): whether the kernel splits
# over tasks is decided as for this many rows.
OPEN_ROWS = 64


class QMatmul(QEmitter):
    @staticmethod
    def takes_open(func) -> bool:
        """Whether ``_open_rows`` takes a ``qmatmul`` with run-time extents: only its rows
        (x's leading dimensions) open, K fixed."""
        return isinstance(func.inputs[0].shape[-1], int)

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

    def _row_tiles(self, rows: int | ir.Value, p0, nvec: int, tile_at) -> None:
        """``tile_at(m0, nrows, p0, nvec)`` over rows 0 .. rows: tiles of mr, then the rest;
        with run-time ``rows`` (``_open_rows``) the rest is tiles of the powers of two below mr
        its bits name (11 rows: 8, 2 and 1), each under a run-time test."""
        b = self.builder
        mr = self.mr
        if isinstance(rows, int):
            full = rows // mr
            if full:
                with for_range(b, const_i64(0), const_i64(full), "mt") as t:
                    tile_at(b.mul(t, const_i64(mr)), mr, p0, nvec)
            if rows % mr:
                tile_at(const_i64(full * mr), rows % mr, p0, nvec)
            return
        full = b.udiv(rows, const_i64(mr))
        with for_range(b, const_i64(0), full, "mt") as t:
            tile_at(b.mul(t, const_i64(mr)), mr, p0, nvec)
        at = b.mul(full, const_i64(mr))
        tail = b.sub(rows, at)
        bit = 1 << (mr - 1).bit_length() - 1
        while bit:
            # rows of the larger bits come first: this tile starts past them
            m0 = b.add(at, b.and_(tail, const_i64(~(2 * bit - 1))))
            with b.if_then(b.icmp_unsigned("!=", b.and_(tail, const_i64(bit)), const_i64(0))):
                tile_at(m0, bit, p0, nvec)
            bit >>= 1

    def _groups(self, groups: list[int], parallel: bool, g_lo, g_hi, rows: int, npn: int,
                tile_at, n: int | None = None) -> None:
        """Calls ``tile_at(m0, nrows, p0, nvec)`` over all rows (tiles of mr, then the rest)
        for each group of up to nv panels from ``groups``; when parallel, only the groups
        g_lo <= gi < g_hi of this task. With ``n`` (the columns), the groups of nv whole
        panels run as one loop with a run-time p0 (an int64 value: one copy of the code, not
        one per group, which for 8210 columns made half a megabyte of code), the rest
        unrolled with constant p0."""
        b = self.builder
        nv = self.nv
        if n is not None:
            uniform = sum(1 for p0 in groups if p0 + nv <= npn and (p0 + nv) * PANEL <= n)
            if uniform > 1:
                lo, hi = const_i64(0), const_i64(uniform)
                if parallel:
                    lo = b.select(b.icmp_signed(">", g_lo, lo), g_lo, lo)
                    hi = b.select(b.icmp_signed("<", g_hi, hi), g_hi, hi)
                with for_range(b, lo, hi, "gq") as gi:
                    self._row_tiles(rows, b.mul(gi, const_i64(nv)), nv, tile_at)
                rest = list(enumerate(groups))[uniform:]
            else:
                rest = list(enumerate(groups))
        else:
            rest = list(enumerate(groups))

        def group(p0: int) -> None:
            self._row_tiles(rows, p0, min(nv, npn - p0), tile_at)

        for gi, p0 in rest:
            if parallel:
                g = const_i64(gi)
                mine = b.and_(b.icmp_signed(">=", g, g_lo), b.icmp_signed("<", g, g_hi))
                with b.if_then(mine):
                    group(p0)
            else:
                group(p0)

    def emit(self) -> KernelInfo:
        x = self.func.inputs[0]
        if self.symbolic:
            return self._open_rows()
        rows = 1
        for d in x.shape[:-1]:
            rows *= int(d)
        return self._emit_rows(rows)

    def _open_rows(self) -> KernelInfo:
        """``emit`` with run-time rows (x [..., M, K] with an open batch or M; K and the
        columns fixed): the rows are read from the sizes, the workspace is a size expression
        bounding the packed rows, the last rows' tiles are picked at run time
        (``_row_tiles``); the packing, tiles and epilogue are ``emit``'s."""
        return self._emit_rows(None)

    def _emit_rows(self, rows: int | None) -> KernelInfo:
        """``emit`` for ``rows`` rows (None: run-time rows, ``_open_rows``)."""
        x, wp, x_zp, _, _, y_zp = self.func.inputs
        n = int(self.tag.attrs["n"])
        k = int(x.shape[-1])
        npn, k2 = int(wp.shape[0]), int(wp.shape[1])
        if wp.dtype not in ("int8", "int16"):
            raise LoweringError(f"{self.func.name}: packed weights of dtype {wp.dtype}")
        w_off = int(self.tag.attrs.get("w_offset", 0))
        vnni = getattr(self, "vnni", False) and wp.dtype == "int8" and not w_off
        if vnni and self._zmm():
            self.nv = 4     # 512-bit: a tile row is 2 zmm, 4 panels (``_emit_vnni``)
        # Split over tasks by groups of column panels when there is work enough; every task
        # packs the rows into a region of its own.
        groups = list(range(0, npn, self.nv))
        open_rows = rows is None
        parallel = ((OPEN_ROWS if open_rows else rows) * k * n >= PARALLEL_MIN_MACS
                    and len(groups) > 1)
        k4 = -(-k2 // 2)
        row_bytes = k4 * 4 if vnni else k2 * 4
        regions = MAX_TASK_REGIONS if parallel else 1
        if open_rows:
            # the workspace's bound, a size expression: each region's packed rows and row sums,
            # each part aligned
            rows_e = 1
            for d in x.shape[:-1]:
                rows_e = rows_e * d
            per_row = row_bytes + (4 if w_off else 0)
            workspace_e = (rows_e * per_row + 2 * WORKSPACE_ALIGN) * regions
            workspace = 1
        else:
            # after the packed rows, with w_offset: each row's sum_k (x - x_zp) (int32)
            sums_at = align_workspace(rows * row_bytes)
            region = align_workspace(sums_at + (rows * 4 if w_off else 0))
            workspace = region * regions
        body_fn, ptr_types, n_ptrs, ws = self._start(workspace)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        b = self.builder
        buf = self.buffers
        if open_rows:
            rows = const_i64(1)
            for d in x.shape[:-1]:
                rows = b.mul(rows, self._dim_value(d))

            def aligned(v):
                return b.mul(b.udiv(b.add(v, const_i64(WORKSPACE_ALIGN - 1)),
                                    const_i64(WORKSPACE_ALIGN)), const_i64(WORKSPACE_ALIGN))
            sums_at = aligned(b.mul(rows, const_i64(row_bytes)))
            region = aligned(b.add(sums_at, b.mul(rows, const_i64(4))) if w_off else sums_at)
        else:
            region = const_i64(region)
            sums_at = const_i64(sums_at)
        nrows = rows if open_rows else const_i64(rows)
        if parallel:
            cap = const_i64(MAX_TASK_REGIONS)
            eff = b.select(b.icmp_signed("<", ntasks, cap), ntasks, cap)
            with b.if_then(b.icmp_signed(">=", task, eff), likely=False):
                b.ret_void()
            g_lo = b.sdiv(b.mul(task, const_i64(len(groups))), eff)
            g_hi = b.sdiv(b.mul(b.add(task, const_i64(1)), const_i64(len(groups))), eff)
            ws = b.gep(ws, [b.mul(task, region)])
        xzp = self._zero_points(x_zp, y_zp)
        if vnni and getattr(self, "registers32", False) and not getattr(self, "sdot", False):
            # 32 registers (AVX-512): up to VNNI_ROWS rows a tile, the rows split evenly
            # (40 -> 4 tiles of 10): the weight quads' loads and shuffles and the column sums
            # of each step serve more rows
            self.mr = VNNI_ROWS if open_rows else -(-rows // -(-rows // VNNI_ROWS))
        if vnni:
            self._emit_vnni(body_fn, ptr_types, n_ptrs, ws, workspace, parallel, groups,
                            g_lo if parallel else None, g_hi if parallel else None,
                            rows, k, k2, k4, n, npn, xzp)
            return self._done(body_fn, n_ptrs, ptr_types, workspace, parallel,
                              workspace_e if open_rows else None)
        a16 = b.bitcast(ws, I16.as_pointer())
        sums = b.bitcast(b.gep(ws, [sums_at]), I32.as_pointer())
        total = alloca_once(b, I32, "rowsum")
        # pack x - x_zp as int16, rows of 2 * k2 (a zero after an odd K)
        with for_range(b, const_i64(0), nrows, "pm") as m:
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
        return self._done(body_fn, n_ptrs, ptr_types, workspace, parallel,
                          workspace_e if open_rows else None)

    def _zmm(self) -> bool:
        """Native vpdpbusd on a level with 512-bit vectors (x86-64-v4+vnni): not its
        emulation, sdot or the vpmaddubsw forms (as ``QConv._zmm``)."""
        return (getattr(self, "vl", 8) >= 16 and getattr(self, "vnni", False)
                and not getattr(self, "vnni_emulated", False)
                and not getattr(self, "sdot", False) and not getattr(self, "madd7", False)
                and not getattr(self, "signed_x", False))

    def _done(self, body_fn, n_ptrs, ptr_types, workspace: int, parallel: bool,
              workspace_e) -> KernelInfo:
        """``_finish``; with run-time rows (``workspace_e``, a size expression) a symbolic
        kernel's info."""
        if workspace_e is None:
            return self._finish(body_fn, n_ptrs, ptr_types, workspace, parallel)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        return KernelInfo(self.symbol, len(self.func.inputs), 1, 0, parallel, symbolic=True,
                          workspace_expr=workspace_e,
                          choice="integer GEMM, rows read at run time")


    def _emit_vnni(self, body_fn, ptr_types, n_ptrs, ws, workspace, parallel, groups, g_lo,
                   g_hi, rows, k, k2, k4, n, npn, xzp) -> None:
        """``qmatmul`` with ``vpdpbusd`` (AVX-512 VNNI, 256-bit; on 512-bit levels ``tile_zmm``:
        a tile row is two zmm of two panels each, so 4 panels a group): u8 x s8 quads, 4 exact
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
        with for_range(b, const_i64(0), rows if isinstance(rows, ir.Value) else const_i64(rows),
                       "pm") as m:
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

        def b_quad(p, j, half: bool) -> ir.Value:
            at = b.mul(p, const_i64(k2 * 16)) if isinstance(p, ir.Value) \
                else const_i64(p * k2 * 16)
            off = b.add(at, b.mul(j, const_i64(32)))
            lo = b.load(self._ptr(wbase, off, V16I8), align=1)
            hi = (ir.Constant(V16I8, None) if half else
                  b.load(self._ptr(wbase, b.add(off, const_i64(16)), V16I8), align=1))
            return b.shuffle_vector(lo, hi, quad)

        zmm = self._zmm()
        v64i8 = ir.VectorType(I8, 64)
        dp512 = intrinsic(self.module, "llvm.x86.avx512.vpdpbusd.512", V16I32,
                          [V16I32, v64i8, v64i8]) if zmm else None
        # two panels' k-quads as one zmm: lanes 0-7 from the first panel's 32 bytes, 8-15
        # from the second's (shufflevector indices 32-63)
        quad2 = ir.Constant(ir.VectorType(I32, 64),
                            [32 * (c // PANEL) + i for c in range(2 * PANEL)
                             for i in (2 * (c % PANEL), 2 * (c % PANEL) + 1,
                                       16 + 2 * (c % PANEL), 17 + 2 * (c % PANEL))])
        v32i8 = ir.VectorType(I8, 32)
        cat16 = ir.Constant(ir.VectorType(I32, 32), list(range(32)))

        def panel_rows(p, j, half: bool) -> ir.Value:
            """Panel p's k-pair rows 2j and 2j + 1 (32 bytes; the second zero: ``half``)."""
            at = b.mul(p, const_i64(k2 * 16)) if isinstance(p, ir.Value) \
                else const_i64(p * k2 * 16)
            off = b.add(at, b.mul(j, const_i64(32)))
            if not half:
                return b.load(self._ptr(wbase, off, v32i8), align=1)
            lo = b.load(self._ptr(wbase, off, V16I8), align=1)
            return b.shuffle_vector(lo, ir.Constant(V16I8, None), cat16)

        def halves(v: ir.Value) -> list[ir.Value]:
            return [b.shuffle_vector(v, v, ir.Constant(V8I32, list(range(h, h + PANEL))))
                    for h in (0, PANEL)]

        def tile_zmm(m0: ir.Value, nrows: int, pv: list, nvec: int) -> None:
            """``tile_at`` on 512-bit vectors: rows x ceil(nvec / 2) zmm accumulators, each
            two panels (the second zero past the last), the column sums likewise; the
            epilogue per panel on the halves."""
            nzv = -(-nvec // 2)
            ones64 = b.bitcast(self._splat(ir.Constant(I32, 0x01010101), V16I32), v64i8)
            accs = [[alloca_once(b, V16I32, f"zdacc{r}_{z}") for z in range(nzv)]
                    for r in range(nrows)]
            sums = [alloca_once(b, V16I32, f"zdsum{z}") for z in range(nzv)]
            zero = ir.Constant(V16I32, None)
            for a in [a for row in accs for a in row] + sums:
                b.store(zero, a)

            def step(j, half: bool) -> None:
                wv = []
                for z in range(nzv):
                    first = panel_rows(pv[2 * z], j, half)
                    second = (panel_rows(pv[2 * z + 1], j, half) if 2 * z + 1 < nvec
                              else ir.Constant(v32i8, None))
                    wv.append(b.shuffle_vector(first, second, quad2))
                for z in range(nzv):
                    b.store(b.call(dp512, [b.load(sums[z]), ones64, wv[z]]), sums[z])
                for r in range(nrows):
                    word = b.load(b.gep(a32, [b.add(b.mul(b.add(m0, const_i64(r)),
                                                          const_i64(k4)), j)]))
                    a = b.bitcast(self._splat(word, V16I32), v64i8)
                    for z in range(nzv):
                        b.store(b.call(dp512, [b.load(accs[r][z]), a, wv[z]]), accs[r][z])

            if k2 // 2:
                with for_range(b, const_i64(0), const_i64(k2 // 2), "kz") as j:
                    step(j, False)
            if k2 % 2:
                step(const_i64(k2 // 2), True)
            for v in range(nvec):
                z, h = divmod(v, 2)
                corr = b.mul(zpv, halves(b.load(sums[z]))[h])
                col0 = (b.mul(pv[v], const_i64(PANEL)) if isinstance(pv[v], ir.Value)
                        else pv[v] * PANEL)
                self._store_panel(m0, nrows, n, col0,
                                  lambda r, z=z, h=h, corr=corr:
                                  b.sub(halves(b.load(accs[r][z]))[h], corr))

        def tile_at(m0: ir.Value, nrows: int, p0, nvec: int) -> None:
            # p0: a panel index, or an int64 value (``_groups``' loop over whole groups)
            pv = [b.add(p0, const_i64(v)) if isinstance(p0, ir.Value) else p0 + v
                  for v in range(nvec)]
            if zmm:
                return tile_zmm(m0, nrows, pv, nvec)
            accs = [[alloca_once(b, V8I32, f"dacc{r}_{v}") for v in range(nvec)]
                    for r in range(nrows)]
            sums = [alloca_once(b, V8I32, f"dsum{v}") for v in range(nvec)]
            zero = ir.Constant(V8I32, None)
            for a in [a for row in accs for a in row] + sums:
                b.store(zero, a)

            def step(j, half: bool) -> None:
                ws_ = [b_quad(pv[v], j, half) for v in range(nvec)]
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
                col0 = (b.mul(pv[v], const_i64(PANEL)) if isinstance(p0, ir.Value)
                        else (p0 + v) * PANEL)
                self._store_panel(m0, nrows, n, col0,
                                  lambda r, v=v, corr=corr: b.sub(b.load(accs[r][v]), corr))

        # the groups of whole panels as one loop (``n``): unrolled, ddddocr's 20 x 512 @
        # 512 x 4096 head was 121,689 lines of IR and 10 CPU-s of compile per export
        self._groups(groups, parallel, g_lo, g_hi, rows, npn, tile_at, n)
