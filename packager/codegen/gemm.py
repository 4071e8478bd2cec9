"""Register-blocked kernels for contractions: matmul and conv2d (tagged by their legalizers, see
``ir.patterns``), with whatever elementwise epilogue fusion put after them.

The microkernel keeps an MR x NR block of the output in vector registers (NR a multiple of the
target's vector width) and, for every step k of the reduction, loads NR contiguous values of the
"wide" operand and broadcasts MR scalars of the "narrow" one into fused multiply-adds:

- matmul: ``out[m, n] = sum_k a[m, k] * b[k, n]``: rows m are broadcast from ``a``, the wide
  operand is a row of ``b`` (masked loads on the last, partial panel), or of a panel of a
  constant ``b`` packed at export (``matmul_packed``, ops/nn.py: [ceil(N / 16), K, 16], the
  last panel zero-filled: plain loads throughout, no copy at run time).
- conv2d: the input is first copied, zero-padded and split by stride phase into *planes* in the
  workspace, so that for every tap (ic, ky, kx) the values needed by a run of consecutive
  flattened outputs ``p = oy * Wq + ox`` (Wq >= the padded width / stride) are contiguous: a
  convolution becomes a GEMM ``out[oc, p] = sum_k w[oc, k] * planes[off(k) + p]`` with no
  bounds checks. Columns with ox >= OW are computed and dropped. Alternatively the planes are
  *shifted* copies, one per tap column kx, with rows exactly OW long: no dropped columns, kw/sw
  times the copying; ``conv_geometry`` picks the layout and register tile (on AVX-512 possibly
  with 256-bit vectors, whose finer granularity wastes fewer lanes on 7x7 or 14x14 images) that
  computes the fewest multiply-adds, copies counted.

  With one group, a block's reduction may run over chunks of input channels, its partial sums
  kept in a tile of the task's workspace region between chunks: each chunk runs over all the
  block rows of a panel (or all the panels of a block row) while the planes they share stay in
  L1 (``conv_geometry``'s ``kc_outer`` / ``kc_inner``; ``_conv_chunked``).

  A 1x1, stride-1, unpadded convolution on a large image reads its input in place; one with
  many groups copies one group at a time into a workspace region of its own task. Depthwise
  convolutions (one input channel per group) have a direct kernel of their own
  (``depthwise.py``), chosen before this one by the kernel rule table (``build.KERNEL_RULES``).

After each block, the fused epilogue (bias, BatchNorm scale/shift, activation, residual add) is
evaluated on the register tile a vector at a time along the output's last axis (masked at the
ends of rows and panels) when it is plain float32 arithmetic; otherwise (math calls, casts) by
the generic scalar expression lowering, element by element.

Only the last, partial panel of a matmul (or in-place convolution) uses masked loads in the
reduction loop: masked loads there cost ~25 % of the kernel's speed on Zen 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from ..ir import te
from ..ir.graph import PrimFunc
from ..ir.patterns import ReductionTag, reduction_tag
from ..ir.sym import product
from .helpers import F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic
from .lower import (WORKSPACE_ALIGN, KernelEmitter, KernelInfo, LoweringError, _plan_stages,
                    bound_select)
from .vecmath_lanes import (VECTOR_MATH, opaque_constant, opaque_zero, splat_i32,
                            vector_math)


# Below this many multiply-adds (~4 µs on one core) a kernel runs on one thread. The runtime's
# native hand-off (codegen/threadpool.py) costs about a microsecond: a matmul of 131 K MACs
# measured 0.99x on 2 threads, 524 K 1.43x, 2 M 1.88x (the lock hand-off it replaced cost
# 30-40 µs, and the threshold was 8 M).
PARALLEL_MIN_MACS = 1 << 18
# The M a symbolic matmul's register tile is chosen for (rows = batch x seq, usually many).
SYMBOLIC_M_HINT = 1 << 12
# The N it is chosen for when the columns are a run-time size too (attention's q @ k^T: seq).
SYMBOLIC_N_HINT = 128
# An operand re-read by an inner loop is cheap to re-read while it fits in (half of) L2.
L2_REUSE_BYTES = 512 * 1024
# Convolutions with at least this many groups copy their input one group at a time, each task
# into its own workspace region; tasks beyond MAX_TASK_REGIONS get no work.
GROUPED_MIN_GROUPS = 16
MAX_TASK_REGIONS = 8


@dataclass(frozen=True)
class Contraction:
    out: te.Tensor
    body: te.Expr          # the output's expression; ``reduce`` is the contraction inside it
    reduce: te.Reduce
    tag: ReductionTag


# The tags the convolution path takes: ``conv2d`` (weight [O, C, KH, KW]) and ``conv2d_rows``
# (ops/nn.py: the weight packed in blocks of the register tile's rows, [ceil(O / rows), C * KH *
# KW, rows]).
CONV_KINDS = ("conv2d", "conv2d_rows")


def match_contraction(func: PrimFunc,
                      kinds: tuple[str, ...] = ("conv2d", "conv2d_rows", "matmul",
                                                "matmul_packed")
                      ) -> Contraction | None:
    """The tagged float32 contraction ``func`` computes, if it has the form the fast kernels
    handle: one output whose expression holds exactly one tagged reduction (of one of
    ``kinds``) over placeholders."""
    if len(func.outputs) != 1 or func.outputs[0].dtype != "float32":
        return None
    materialized, outputs = _plan_stages(func)
    if materialized:
        return None
    out, body = outputs[0]
    # one reduction (an epilogue that reads it twice, as x * sigmoid(x), shares the node)
    reduces = list({id(n): n for n in te.walk(body) if isinstance(n, te.Reduce)}.values())
    if len(reduces) != 1:
        return None
    tag = reduction_tag(reduces[0])
    inputs = {t.uid for t in func.inputs}
    if tag is None or tag.kind not in kinds \
            or not all(t.uid in inputs and t.dtype in _operand_dtypes(tag.kind, i)
                       for i, t in enumerate(tag.operands)):
        return None
    if tag.kind == "conv2d" and tuple(tag.attrs["dilation"]) != (1, 1):
        return None
    match = Contraction(out, body, reduces[0], tag)
    if tag.kind == "matmul" and tag.attrs.get("transpose_b"):
        return match if is_row_matmul(match) else None
    return match


# The packed weights (``matmul_packed``'s B, ``conv2d_rows``' blocks, codegen/conv_oc.py's
# ``conv2d_oc`` ones) may be stored as bfloat16 (``--precision bf16``): each load widens them to
# float32 (``load_weights``), exactly.
BF16_WEIGHT_KINDS = ("matmul_packed", "conv2d_rows", "conv2d_oc", "matmul_bf16p")


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


def _operand_dtypes(kind: str, index: int) -> tuple[str, ...]:
    return ("float32", "bfloat16") if index == 1 and kind in BF16_WEIGHT_KINDS else ("float32",)


_VECTOR_BINARY = ("add", "sub", "mul", "div", "max", "min")


def _is_bound(e: te.Expr) -> bool:
    """A float constant that is not NaN (max/min against it is one maxps/minps)."""
    return isinstance(e, te.Const) and te.is_float(e.dtype) and e.value == e.value


def _index_used_as_value(body: te.Expr, skip: te.Expr) -> bool:
    """Some loop index appears in ``body`` (outside ``skip``) other than as a Read index."""
    stack = [body]
    while stack:
        node = stack.pop()
        if node is skip:
            continue
        if isinstance(node, te.IndexVar):
            return True
        if isinstance(node, te.Read):
            continue   # its indices were checked to be plain index variables or constants
        stack.extend(te.children(node))
    return False


# Packing B panels (ContractionEmitter._packs_b): enough row blocks to pay for the copy, and a
# buffer of at most this many bytes per task (K <= 2048 at 16 columns).
PACK_B_MIN_ROWS = 16
PACK_B_MAX_BYTES = 128 * 1024
# The row block that fills the packed panel prefetches B's line this many rows ahead.
PACK_B_PREFETCH_ROWS = 8


def _pick_tile(rows: int, cols: int, vl: int) -> tuple[int, int]:
    """Register block (rows, vectors per row) for a rows x cols output. Fewer than 4 rows: all
    of them, 4 vectors wide. Otherwise 6 x 2 vectors (12 accumulators), or with AVX-512's 32
    registers 4 x 4 (16 accumulators, 4 broadcasts per 16 FMAs instead of 6 per 12; measured
    4-10 % faster) unless it computes more padding elements than 6 x 2."""
    if rows < 4:
        return rows, 4
    if vl < 16:  # 16 vector registers: 4 x 4 would spill
        return 6, 2

    def computed(mr: int, nv: int) -> int:
        return -(-rows // mr) * mr * -(-cols // (nv * vl)) * nv * vl

    return (6, 2) if computed(6, 2) < computed(4, 4) else (4, 4)


def vector_width(target_name: str) -> int:
    """Floats per vector register the kernels are written for."""
    return {"x86-64-v4": 16, "x86-64-v4+bf16": 16, "x86-64-v3": 8}.get(target_name, 4)


def conv_row_widths(targets) -> tuple[int, ...]:
    """The vector widths for which an export for ``targets`` packs convolution weights in the
    register tile's row blocks (``nn.conv2d_rows``, passes/layout.py ``pack_conv_rows``): x86
    with AVX2, alone or beside its 128-bit level (a portable bundle), where it is measured;
    none (weights [O, C, KH, KW]) elsewhere."""
    names = {t.name for t in targets}
    if "x86-64-v3" not in names or not names <= {"x86-64-v2", "x86-64-v3"}:
        return ()
    return tuple(sorted({vector_width(n) for n in names}))


# Register blocks for convolutions: (vector width, rows, vectors per row, relative cost per
# computed output). With AVX-512's 32 registers, half-width (256-bit) vectors cost the same per
# lane on Zen 4 (two 256-bit FMA pipes) and waste fewer lanes on short rows.
_CONV_TILES_512 = ((16, 4, 4, 1.0), (16, 6, 2, 1.0), (16, 12, 2, 1.01), (8, 4, 6, 1.01),
                   (8, 4, 5, 1.02), (8, 3, 7, 1.03))
# With 16 vector registers (AVX2, SSE, and NEON as used here): 6 x 2 or 4 x 3 accumulators.
# 4 x 3 loads 4 broadcasts and 3 vectors per 12 FMAs (6 x 2: 6 and 2) and wastes no rows on 32
# or 64 output channels; measured on Zen 4 AVX2 at least as fast everywhere (1 thread, min
# us, 6x2 -> 4x3): 16->32 3x3 s2 160^2 1291 -> 995, 64->64 3x3 40^2 1581 -> 1475, 256->256
# 1x1 14^2 423 -> 304, 512->512 1x1 7^2 435 -> 419 (72 columns computed instead of 64).
# Past a 3x3 window, though, LLVM's scheduler loads the next tap's three vectors before the
# last multiply-adds of this one, a 17th register, and spills (a 7x7 kernel: 228 stack
# accesses in its loop, 6 x 2 none); 4 x 3 then costs more per output (1 thread vs ORT, 4 x 3
# -> 6 x 2: ResNet's 7x7 s2 stem 1.66 -> 1.38, 16 -> 64 7x7 on 112^2 1.85 -> 1.43, 32 -> 64
# 5x5 on 64^2 1.52 -> 1.33), but not more than the rows 6 x 2 wastes on 16 or 32 channels
# (3 -> 16 9x9 on 128^2: 4 x 3 1.19, 6 x 2 1.41; 32 -> 32 5x5 on 64^2: 1.16 and 1.41).
LARGE_WINDOW_TAPS = 9


def _conv_tiles_16_regs(vl: int, taps: int = 9) -> tuple[tuple[int, int, int, float], ...]:
    return ((vl, 6, 2, 1.0), (vl, 4, 3, 0.9 if taps <= LARGE_WINDOW_TAPS else 1.1))


# One copied plane element costs about this many multiply-adds of the microkernel, and one
# computed output about this many more when the epilogue goes row by row (rows of the planes
# longer than the output's); measured on Zen 4 (ResNet-18 3x3 and MobileNetV2's first conv).
COPY_COST_MACS = 8
ROWWISE_EPILOGUE_MACS = 2
# A multiply-add of the tail kernel (``ContractionEmitter._conv_tail``: the reduction on the
# vector lanes, one horizontal sum per output) costs about this many of the microkernel's; its
# inputs are gathered once per tail pixel and tap (``COPY_COST_MACS`` each).
TAIL_MAC_COST = 1.5
# The tail is measured on AVX2 (Zen 4) only; AVX-512 (whose 256-bit tiles already waste fewer
# lanes) and 128-bit targets keep their partial panels.
TAIL_VL = 8
TAIL_MAX_BYTES = 128 * 1024
# Accumulators of the tail on weights packed by row blocks (``_tail_block_rows``): enough
# independent multiply-adds in flight for two FMA pipes of 4 cycles' latency.
TAIL_CHAINS = 8
# Shifted planes that the kernel re-reads from L2 once per block row (panels innermost: weights
# past L2_REUSE_BYTES, planes within it but past a quarter of it) lose to the by-phase copy
# (a third of the bytes) when planes and weights together pass this many bytes, unless by phase
# drops more than 1/12 of its columns (``conv_geometry``).
SHIFTED_REREAD_BYTES = 2 * L2_REUSE_BYTES
# A block's reduction runs over chunks of input channels (partial sums kept in a tile buffer of
# the task's workspace region) when the planes that the blocks sharing them read (one panel's
# window with the block rows innermost, whole planes with the panels innermost) would not fit
# in this many bytes (half of Zen 4's 32 KB L1) for all the channels at once.
CHUNK_L1_BYTES = 16 * 1024
# Planes whose stride (bytes from one channel's plane to the next) is a multiple of
# ALIAS_BYTES start every channel's row at one of at most 4 offsets within L1's 4 KB of sets
# (Zen 4: 64 sets of 8 ways): a panel's rows over the reduction land on a few sets and evict
# each other. Such planes are laid out PLANE_PAD floats (a cache line) apart, and a 1x1
# convolution whose input has such planes (16x16, 32x32, 64x64, 80x80, 112x112, 24x160 images)
# and at least ALIAS_MIN_CHANNELS input and output channels is copied into them instead of read
# in place. Measured on Zen 4 (of ORT's time, min, 1 / 2 threads, before -> after): 576 -> 96 on
# 16x16 1.10 -> 1.00 / 1.08 -> 0.96, 256 -> 64 on 32x32 1.46 -> 0.98 / 1.33 -> 0.92, 128 -> 128
# on 64x64 1.69 -> 1.00 / 1.66 -> 0.99; the corpus's layers (1 thread, min us): 48 -> 48 on
# 64x64 415 -> 267, 96 -> 96 on 32x32 276 -> 231, 96 -> 192 on 16x16 131 -> 116, 32 -> 32 on
# 80x80 199 -> 200 (2 threads 116 -> 120). Not with fewer channels: 32 -> 16 on 112x112
# (MobileNetV2's) 196 -> 224 us copied (the copy costs more than it saves).
ALIAS_BYTES = 1024
PLANE_PAD = 16
ALIAS_MIN_CHANNELS = 32


def _rows_alias(plane_floats: int) -> bool:
    """Whether planes of this many floats, one after another, alias in L1 (ALIAS_BYTES)."""
    return (4 * plane_floats) % ALIAS_BYTES == 0


CHUNK_MIN_STEPS = 64     # no chunks of fewer reduction steps (channels x taps)


def _chunk_channels(cg: int, khw: int, channel_bytes: int) -> int:
    """Input channels per reduction chunk: the largest divisor of ``cg`` whose planes fit in
    CHUNK_L1_BYTES (``cg``: no chunks)."""
    if cg * channel_bytes <= CHUNK_L1_BYTES:
        return cg
    for d in range(cg - 1, 0, -1):
        if cg % d == 0 and d * channel_bytes <= CHUNK_L1_BYTES:
            return d if d * khw >= CHUNK_MIN_STEPS else cg
    return cg


def _conv_tiles(rows: int, vl: int, taps: int = 9) -> tuple[tuple[int, int, int, float], ...]:
    """Register tiles (vector width, rows, vectors per row, relative cost per computed
    output) for ``rows`` output channels and a window of ``taps`` = kh x kw."""
    if rows < 4:
        return ((vl, rows, 4, 1.0),)
    if vl == 16:
        return _CONV_TILES_512
    return _conv_tiles_16_regs(vl, taps)


def conv_geometry(x_shape, w_shape, out_shape, attrs: dict, target_vl: int,
                  _tall_tile: bool = False) -> dict:
    """How a conv2d is computed: plane layout, register tile, loop order (see the module
    docstring). Two plane layouts: by stride *phase* (``planes[ic, py, px, u, v] = x[ic, u*sh +
    py - pt, v*sw + px - pl]``, row length ``wq`` >= the output width plus the window's reach:
    those extra columns are computed and dropped), or *shifted* by tap column (``px`` runs over
    the window's columns kx, ``wq`` = the output width: no dropped columns, kw/sw times the
    copying). The cheaper of the two, with the cheapest register tile, in computed
    multiply-adds. ``_tall_tile``: only tiles of 6 rows or more (see the end)."""
    _, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    _, _, oh, ow = out_shape
    sh, sw = attrs["strides"]
    pt, pl, pb, pr = attrs["padding"]
    hp, wp = h + pt + pb, wd + pl + pr
    groups = attrs["groups"]
    og = o // groups
    hq = max(-(-hp // sh), oh + (kh - 1) // sh)
    ny = min(sh, kh)                      # row phases read by some tap
    k_taps = cg * kh * kw
    # A 1x1, stride-1, unpadded convolution reads its input as the planes: no copy (in the
    # last, partial panel, the last channel's loads are masked instead of reading zero slack;
    # masked loads are slower than plain ones), unless its rows alias in L1 (ALIAS_BYTES).
    direct = ((kh, kw, sh, sw) == (1, 1, 1, 1) and not any(attrs["padding"])
              and not (groups == 1 and _rows_alias(h * wd) and min(c, o) >= ALIAS_MIN_CHANNELS))
    layouts = [False] if direct or kw == 1 and sw == 1 else [False, True]
    # Measured on Zen 4, 1 thread, vs ORT, by phase vs shifted (3x3, stride 1): crnn's 128 ->
    # 128 on 8x32 1.16 vs 1.34, 128 -> 256 on 8x32 1.18 vs 1.30, 96 -> 256 on 8x32 1.17 vs
    # 1.50, 64 -> 512 on 10x40 1.15 vs 1.37, 7x28 1.17 vs 1.22; kept shifted: 64 -> 512 on
    # 20x20 (1/11 of the columns dropped by phase) 1.20 vs 1.13.
    shifted_bytes, w_bytes = 4 * c * ny * kw * hq * ow, 4 * og * cg * kh * kw
    wq_phase = max(-(-wp // sw), ow + (kw - 1) // sw)
    if (len(layouts) == 2 and groups == 1 and sw == 1 and (wq_phase - ow) * 12 <= wq_phase
            and L2_REUSE_BYTES // 4 < shifted_bytes <= L2_REUSE_BYTES < w_bytes
            and shifted_bytes + w_bytes > SHIFTED_REREAD_BYTES):
        layouts = [False]
    best = None
    for shifted in layouts:
        wq = ow if shifted else max(-(-wp // sw), ow + (kw - 1) // sw)
        nx = kw if shifted else min(sw, kw)
        pflat = oh * wq                          # flattened outputs computed per channel
        copied = 0 if direct else c * ny * nx * hq * wq
        for vl, mr, nv, eff in _conv_tiles(og, target_vl, kh * kw):
            if _tall_tile and mr < 6:
                continue
            nr = nv * vl
            computed = -(-og // mr) * mr * groups * -(-pflat // nr) * nr * cg * kh * kw
            # planes that do not stay in L2 cost more than the copy: the kernel reads them
            copy_cost = copied * COPY_COST_MACS * (2 if 4 * copied > 2 * L2_REUSE_BYTES else 1)
            cost = computed * eff + copy_cost
            if wq != ow:
                cost += computed // (cg * kh * kw) * ROWWISE_EPILOGUE_MACS
            # The outputs of a last, partial panel (a small image: 7x7 fills 49 of 72 columns
            # of a 4 x 3 tile, 10x10 100 of 120, a 1x1 image 1 of 24) may be cheaper as the
            # *tail*: each output a dot product of its weight row with the pixel's gathered
            # inputs, the reduction on the vector lanes (no computed column is wasted).
            full = pflat // nr
            tail = tuple((p // wq, p % wq) for p in range(full * nr, pflat) if p % wq < ow)
            # Shifted planes only with a tail small enough: the tail makes them win on small
            # images, where the cost model misses that the planes are re-read once per block
            # row (measured on Zen 4: 128 -> 256 3x3 s2 on 20x20, 337 KB of shifted planes,
            # 1.2x slower than by phase; 256 -> 64 3x3 10x10, 368 KB, 1.07x).
            small = 4 * copied <= L2_REUSE_BYTES // 2 and sw == 1
            # The tail re-reads its block of weight rows and every tail pixel's inputs per
            # block; beyond TAIL_MAX_BYTES they spill out of L1/L2 and the tail costs ~3.7x a
            # microkernel MAC (ResNet-18's 512 -> 512 3x3 on 7x7, 11 pixels of 4608 inputs:
            # 3.3 -> 4.1 ms; 128 -> 256 3x3 s2 on 20x20, 12 pixels of 1152, 74 KB: 0.82x).
            fits = ((8 if len(tail) == 1 else 4) + len(tail)) * k_taps * 4 <= TAIL_MAX_BYTES
            if groups == 1 and tail and fits and (small or not shifted) and target_vl == TAIL_VL:
                last = -(-og // mr) * mr * nr * k_taps
                tail_cost = len(tail) * k_taps * (og * TAIL_MAC_COST + COPY_COST_MACS)
                if full == 0:   # no planes to copy at all
                    tail_cost -= copy_cost
                if tail_cost < last * (eff + (ROWWISE_EPILOGUE_MACS / k_taps if wq != ow else 0)):
                    cost += tail_cost - last * eff
                else:
                    tail = ()
            else:
                tail = ()
            if best is None or cost < best[0]:
                best = (cost, shifted, wq, nx, pflat, vl, mr, nv, tail)
    _, shifted, wq, nx, pflat, vl, mr, nv, tail = best
    nr = nv * vl
    slack_panels = -(-pflat // nr)
    panels = pflat // nr if tail else slack_panels
    tail_kp = -(-k_taps // vl) * vl      # a tail pixel's gathered inputs, padded with zeros
    shift_max = ((kh - 1) // sh) * wq + (0 if shifted else (kw - 1) // sw)
    # one channel's (and phase's) plane, then the next's (see ALIAS_BYTES)
    pstride = hq * wq + (PLANE_PAD if groups == 1 and not direct and _rows_alias(hq * wq) else 0)
    plane_floats = cg * ny * nx * pstride      # one group's
    planes = 0 if direct else groups * plane_floats
    slack = 0 if direct else max(0, shift_max + slack_panels * nr - hq * wq) + nr
    # Loop order: with the panel innermost, each weight block is read once and the planes
    # once per block row; with the block row innermost, each planes panel is read once and
    # the weights once per panel. Re-reads of an operand that stays in L2 are cheap.
    mblocks = -(-og // mr)
    plane_bytes = 4 * plane_floats
    weight_bytes = 4 * og * cg * kh * kw
    if groups == 1 and weight_bytes <= L2_REUSE_BYTES and (
            plane_bytes > L2_REUSE_BYTES // 4 if not direct else cg >= CHUNK_MIN_STEPS):
        # one group, the reduction in chunks (below): each panel's planes stay in L1 for
        # all its block rows, and the weights, re-read once per panel, stay in L2; planes
        # that do fit in L2 are re-read from it once per block row in the other order, at
        # a cost (measured on Zen 4, 1 thread, vs panels innermost: 1x1 64 -> 85 on 40x40
        # 1.12 -> 0.92 of ORT, 256 -> 128 on 20x20 1.14 -> 0.95, 256 -> 256 on 10x10 1.22
        # -> 0.96, 3x3 64 -> 64 on 20x20 1.20 -> 1.06, 3x3 s2 64 -> 128 on 40x40 1.14 ->
        # 1.01). Not for a 1x1 with a short reduction (PP-OCR's 12 -> 96 on 64x64: 191 ->
        # 329 us, the block rows' scattered stores cost more). Mid-sized planes (a quarter to
        # half of L2) were left out once, measured on 16x16 images (192 -> 192: 1.13 -> 1.26)
        # while their rows still aliased in L1 (ALIAS_BYTES: those planes are now copied);
        # read in place they gain too (min / median of ORT's time, 1 thread): PP-LCNet's 256
        # -> 256 on 14x14 1.08 / 1.11 -> 0.93 / 0.92, 64 -> 128 on 28x28 0.92 / 1.04 -> 0.87
        # / 0.99, 192 -> 64 on 14x14 0.86 / 1.00 -> 0.87 / 0.93, 128 -> 128 on 20x20 0.96 /
        # 1.17 -> 0.98 / 1.10.
        panel_outer = True
    elif plane_bytes <= L2_REUSE_BYTES:
        panel_outer = False
    elif weight_bytes <= L2_REUSE_BYTES:
        panel_outer = True
    else:
        panel_outer = (plane_bytes + panels * weight_bytes
                       < weight_bytes + mblocks * plane_bytes)
    # Panels innermost with the weights streaming through L2 re-read the planes once per
    # block row; planes past half of L2 then come back from L3, and fewer, taller block rows
    # (6 x 2 instead of 4 x 3) read them fewer times (1 thread vs ORT: ResNet's 128 -> 256
    # 3x3 s2 on 28x28, 460 KB of planes, 1.39 -> 1.11; below the bound, crnn's 128 -> 128 on
    # 8x32, 174 KB, 4 x 3 stays faster: 1.17 vs 1.24).
    if (not _tall_tile and not panel_outer and not direct and groups == 1 and mr < 6
            and weight_bytes > L2_REUSE_BYTES and plane_bytes > L2_REUSE_BYTES // 2
            and any(t[1] >= 6 for t in _conv_tiles(og, target_vl, kh * kw))):
        return conv_geometry(x_shape, w_shape, out_shape, attrs, target_vl, _tall_tile=True)
    # Many groups (depthwise): each task copies one group's planes at a time into a
    # region of its own, right before using them (cache-hot, no task copies them all).
    per_group = not direct and groups >= GROUPED_MIN_GROUPS
    region = -(-(plane_floats + slack) // 16) * 16
    if per_group:
        planes = region * MAX_TASK_REGIONS
        slack_total = 0
    else:
        slack_total = slack
    # Reduction chunks (see CHUNK_L1_BYTES), per loop order: block rows innermost (outer) or
    # panels innermost (inner); each task's partial sums: a tile per block row or per panel.
    khw = kh * kw
    kc_outer = kc_inner = cg
    part_floats = 0
    if groups == 1 and panels:
        kc_outer = _chunk_channels(cg, khw, 4 * ny * nx * (shift_max + nr + 16))
        kc_inner = _chunk_channels(cg, khw, 4 * ny * nx * hq * wq)
        if kc_outer < cg:
            part_floats = max(part_floats, mblocks * mr * nr)
        if kc_inner < cg:
            part_floats = max(part_floats, panels * mr * nr)
        if part_floats:
            part_floats = -(-(part_floats + vl) // 16) * 16
    return dict(c=c, h=h, w=wd, o=o, cg=cg, kh=kh, kw=kw, oh=oh, ow=ow, sh=sh, sw=sw,
                ny=ny, nx=nx, shifted=shifted, vl=vl,
                per_group=per_group, region=region, slack_total=slack_total,
                pt=pt, pl=pl, hq=hq, wq=wq, pstride=pstride, groups=groups, og=og,
                pflat=pflat, mr=mr, nv=nv,
                nr=nr, panels=panels, planes_floats=planes, slack=slack, direct=direct,
                panel_outer=panel_outer, shift_max=shift_max, tail=tail, tail_kp=tail_kp,
                kc_outer=kc_outer, kc_inner=kc_inner, part_floats=part_floats)


class ContractionEmitter(KernelEmitter):
    """Emits a matched contraction; the generic emitter evaluates the epilogue."""

    plans_conv = True   # convolutions: conv_geometry() picks the vector width

    def __init__(self, module: ir.Module, func: PrimFunc, symbol: str, match: Contraction,
                 vl: int, size_vars: tuple[str, ...] = ()) -> None:
        super().__init__(module, func, symbol, size_vars)
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
        self._packed_b: ir.Value | None = None   # the packed B panel _matmul_panel reads
        self._pack_region: ir.Value | None = None   # this task's region for it (workspace)
        self._part_base: ir.Value | None = None   # the conv's reduction-chunk tiles (workspace)
        # (image, gathered rows) of the tail outputs that follow each block row (_fuses_tail)
        self._fused_tail: tuple[ir.Value, ir.Value] | None = None
        # B packed at export into panels [ceil(N / nr), K, nr] (ops/nn.py matmul_packed)
        self._const_panels = match.tag.kind == "matmul_packed"

    # The contraction inside the epilogue expression reads the register tile.
    def _reduce(self, e: te.Reduce, env: dict) -> ir.Value:
        if e is self.match.reduce and self._tile_value is not None:
            return self._tile_value
        return super()._reduce(e, env)

    def emit(self) -> KernelInfo:
        m = self.match
        params = self.func.inputs + self.func.outputs
        workspace = self._workspace_bytes()
        body_fn, ptr_types = self._begin_body(params, bool(workspace))
        n_ptrs = len(ptr_types)
        task, ntasks = body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1]
        ws = body_fn.args[len(params)] if workspace else None
        if m.tag.kind in CONV_KINDS:
            self._emit_conv(ws, task, ntasks)
        else:
            self._emit_matmul(task, ntasks, ws)
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        if self.symbolic:   # split when the static part alone is worth it (K x N x static dims)
            static = product(d for d in self.match.out.shape if isinstance(d, int))
            static *= product(a.extent for a in self.match.reduce.axes
                              if isinstance(a.extent, int))
            return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                              static * 16 >= PARALLEL_MIN_MACS, symbolic=True)
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

    def _begin_epilogue(self) -> None:
        """Make the opaque zero the epilogue's constants derive from, after a reduction loop."""
        self._opaque_scalar = opaque_zero(self.builder)
        self._opaque = splat_i32(self.builder, self._opaque_scalar, self.vl)

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
        t = self._dim_value(total)
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

    # ---- vectorized epilogue -------------------------------------------------------------------

    def _vector_epilogue_ok(self) -> bool:
        """The epilogue can be evaluated a vector at a time along the output's last axis: only
        float32 arithmetic, compares and selects, and reads of float32 tensors whose indices are
        plain output loop indices or constants, the last axis (if read) as their last index."""
        out, last = self.match.out, self.match.out.axes[-1]
        axes = {id(a) for a in out.axes}
        for node in te.walk(self.match.body, skip=self.match.reduce):
            if isinstance(node, te.Binary):
                if node.dtype != "float32" or node.op not in _VECTOR_BINARY:
                    return False
            elif isinstance(node, te.Compare):
                if node.a.dtype != "float32":
                    return False
            elif isinstance(node, te.MathCall):   # sigmoid (SiLU), erf (GELU), tanh, exp
                if node.dtype != "float32" or node.name not in VECTOR_MATH:
                    return False
            elif isinstance(node, te.Read):
                if node.dtype != "float32" or node.tensor.dtype != "float32":
                    return False
                for d, idx in enumerate(node.indices):
                    if isinstance(idx, te.IndexVar):
                        if id(idx) not in axes or (idx is last and d != len(node.indices) - 1):
                            return False
                    elif not isinstance(idx, te.Const):
                        return False
            elif not isinstance(node, (te.Select, te.Const, te.IndexVar)):
                return False   # casts, math calls, other reductions: the scalar epilogue
        return not _index_used_as_value(self.match.body, self.match.reduce)

    def _rows_contiguous(self) -> bool:
        """Every read along the output's last axis also reads along the one before it, in its
        last two dimensions, with the output's row length: consecutive outputs across a row end
        are then consecutive elements of that tensor too."""
        out = self.match.out
        for node in te.walk(self.match.body, skip=self.match.reduce):
            if isinstance(node, te.Read) and node.indices and node.indices[-1] is out.axes[-1]:
                if (len(node.indices) < 2 or node.indices[-2] is not out.axes[-2]
                        or node.tensor.shape[-1] != out.shape[-1]):
                    return False
        return True

    def _vvalue(self, e: te.Expr, env: dict, mask: ir.Value | None,
                memo: dict[int, ir.Value] | None = None) -> ir.Value:
        """``e`` for the vl consecutive outputs starting at ``env``'s indices (the last axis
        varying across lanes); ``mask`` (or None: all lanes) limits the loads. A node the
        expression reaches twice (the diamond of x * sigmoid(x)) is emitted once (``memo``:
        the code is straight-line, so a value emitted earlier dominates its later uses)."""
        memo = {} if memo is None else memo
        value = memo.get(id(e))
        if value is None:
            value = memo[id(e)] = self._vnode(e, env, mask, memo)
        return value

    def _vnode(self, e: te.Expr, env: dict, mask: ir.Value | None, memo: dict) -> ir.Value:
        b = self.builder
        if e is self.match.reduce:
            return self._tile_value
        if isinstance(e, te.Const):
            if e.dtype == "bool":
                return ir.Constant(ir.VectorType(I1, self.vl), [bool(e.value)] * self.vl)
            if self._opaque is not None:
                return opaque_constant(b, float(e.value), self._opaque)
            return ir.Constant(self.vty, [float(e.value)] * self.vl)
        if isinstance(e, te.Read):
            last = self.match.out.axes[-1]
            idx = [const_i64(int(i.value)) if isinstance(i, te.Const) else env[id(i)]
                   for i in e.indices]
            offset = self._offset(e.tensor, idx)
            if e.indices and e.indices[-1] is last:
                ptr = b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)
                vptr = b.bitcast(ptr, self.vty.as_pointer())
                if mask is None:
                    return b.load(vptr, align=4)
                return self._masked_load(vptr, mask)
            if self._opaque_scalar is not None:
                # a per-channel scale or shift: loaded here, not hoisted over the reduction
                offset = b.add(offset, b.sext(self._opaque_scalar, offset.type))
            ptr = b.gep(self.buffers[e.tensor.uid], [offset], inbounds=True)
            return self._splat(b.load(ptr))
        if isinstance(e, te.Binary):
            x, y = self._vvalue(e.a, env, mask, memo), self._vvalue(e.b, env, mask, memo)
            if e.op in ("max", "min"):
                # clip, relu: one vmaxps/vminps, NaN in the other operand still propagates
                if _is_bound(e.b):
                    return bound_select(b, e.op, x, y)
                if _is_bound(e.a):
                    return bound_select(b, e.op, y, x)
                name = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.v{self.vl}f32"
                return b.call(intrinsic(self.module, name, self.vty, [self.vty] * 2), [x, y])
            return {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[e.op](x, y)
        if isinstance(e, te.Compare):
            return self._compare(e.op, self._vvalue(e.a, env, mask, memo),
                                 self._vvalue(e.b, env, mask, memo), e.a.dtype)
        if isinstance(e, te.Select):
            return b.select(self._vvalue(e.cond, env, mask, memo),
                            self._vvalue(e.a, env, mask, memo), self._vvalue(e.b, env, mask, memo))
        if isinstance(e, te.MathCall):
            return vector_math(b, e.name, self._vvalue(e.arg, env, mask, memo),
                               self._opaque_scalar)
        raise AssertionError(f"not vectorizable: {type(e).__name__}")

    def _store_vector(self, env: dict, tile_f: ir.Value, tile_index: ir.Value,
                      mask: ir.Value | None) -> None:
        """Evaluate the epilogue for vl consecutive outputs (tile elements from ``tile_index``)
        and store the lanes ``mask`` selects (None: all)."""
        b = self.builder
        out = self.match.out
        self._tile_value = b.load(self._vec_ptr(tile_f, tile_index), align=4)
        value = self._vvalue(self.match.body, env, mask)
        self._tile_value = None
        ptr = b.gep(self.buffers[out.uid], [self._offset(out, [env[id(a)] for a in out.axes])],
                    inbounds=True)
        vptr = b.bitcast(ptr, self.vty.as_pointer())
        if mask is None:
            b.store(value, vptr, align=4)
            return
        fn = intrinsic(self.module, f"llvm.masked.store.v{self.vl}f32.p0", ir.VoidType(),
                       [self.vty, self.vty.as_pointer(), I32, ir.VectorType(I1, self.vl)])
        b.call(fn, [value, vptr, ir.Constant(I32, 4), mask])

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
        if self.match.tag.kind not in CONV_KINDS:
            if self.symbolic or not self._packs_b():
                return 0
            return -(-self._packed_panel_bytes() * MAX_TASK_REGIONS // WORKSPACE_ALIGN) \
                * WORKSPACE_ALIGN
        g = self._conv_geometry()
        nbytes = 0 if g["direct"] else (g["planes_floats"] + g["slack_total"]) * 4
        if not g["per_group"]:
            # Tasks share the planes of one image and run without a barrier, so a task that
            # moves on to the next image must not overwrite planes another task still reads:
            # every image of the batch has planes of its own (and tail inputs, after them).
            batch = self.match.tag.operands[0].shape[0]
            nbytes = (nbytes + len(g["tail"]) * g["tail_kp"] * 4) * batch
            nbytes += g["part_floats"] * MAX_TASK_REGIONS * 4   # reduction chunks' partial sums
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
                offset = b.add(offset, b.mul(bidx[nb_out - nb + d], self._dim_value(stride)))
            stride *= t.shape[d]
        return offset

    def _matmul_tile(self) -> tuple[int, int]:
        """(rows, vectors per row) of the register block."""
        _, M, K, N = self._matmul_shape()
        if not isinstance(M, int):   # a run-time M: the large-M tile, a 1-row remainder path
            return _pick_tile(SYMBOLIC_M_HINT, N if isinstance(N, int) else SYMBOLIC_N_HINT,
                              self.vl)
        if M >= 4:
            return _pick_tile(M, N, self.vl)
        return M, max(1, min(8 // M, -(-N // self.vl)))

    def _emit_matmul_symbolic(self, task: ir.Value, ntasks: ir.Value) -> None:
        """A matmul with a run-time M: fewer rows than the register tile (a batch of one, a
        short sequence) take a tile of exactly that many rows, wider as the static path picks
        it for such an M; more take the full tile and a remainder block."""
        b = self.builder
        _, M_dim, _, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        M = self._dim_value(M_dim)
        with b.if_else(b.icmp_signed("<", M, const_i64(mr))) as (small, big):
            with small:
                for r in range(1, mr):
                    nv_r = max(1, min(8 // r, -(-(N if isinstance(N, int) else SYMBOLIC_N_HINT) // self.vl))) if r < 4 else nv
                    with b.if_then(b.icmp_signed("==", M, const_i64(r))):
                        self._matmul_panels(task, ntasks, r, nv_r, exact=True)
            with big:
                self._matmul_panels(task, ntasks, mr, nv, exact=False)

    def _matmul_panels(self, task: ir.Value, ntasks: ir.Value, mr: int, nv: int,
                       exact: bool) -> None:
        """The panel loop of ``_emit_matmul`` for a symbolic matmul with an (mr, nv) tile;
        ``exact``: M is mr."""
        b = self.builder
        out = self.match.out
        a_t, b_t = self.match.tag.operands
        batch, _, K_dim, N = self._matmul_shape()
        K = self._dim_value(K_dim)
        nr = nv * self.vl
        panels_dim = -(-N // nr)   # N may be a run-time size
        panels = self._dim_value(panels_dim)
        a_ptr, b_ptr = self.buffers[a_t.uid], self.buffers[b_t.uid]
        lo, hi = self._split(batch * panels_dim, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            bi = b.sdiv(work, panels)
            jp = b.srem(work, panels)
            bidx, rest = [], bi
            for n in reversed(out.shape[:-2]):
                bidx.append(b.srem(rest, self._dim_value(n)))
                rest = b.sdiv(rest, self._dim_value(n))
            bidx.reverse()
            a_base = b.gep(a_ptr, [self._batch_offset(a_t, bidx)], inbounds=True)
            b_base = b_ptr if self._const_panels else \
                b.gep(b_ptr, [self._batch_offset(b_t, bidx)], inbounds=True)
            n0 = b.mul(jp, const_i64(nr))
            remaining = b.sub(self._dim_value(N), n0)
            masks = [self._lane_mask(remaining, v) for v in range(nv)]

            def panel(masked: bool) -> None:
                if exact:
                    self._matmul_rows(const_i64(0), mr, nv, K, a_base, b_base, bidx, n0,
                                      remaining, masks, masked)
                else:
                    self._matmul_panel_symbolic(a_base, b_base, bidx, n0, remaining, masks,
                                                masked)
            if isinstance(N, int) and N % nr == 0:
                panel(False)
            else:
                with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                    with full:
                        panel(False)
                    with part:
                        panel(True)

    def _emit_matmul(self, task: ir.Value, ntasks: ir.Value, ws: ir.Value | None = None) -> None:
        if self.symbolic:
            self._emit_matmul_symbolic(task, ntasks)
            return
        b = self.builder
        if ws is not None:   # packed B panels: one workspace region per task, as many tasks
            ntasks = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                              const_i64(MAX_TASK_REGIONS))
            region_floats = self._packed_panel_bytes() // 4
            self._pack_region = b.gep(b.bitcast(ws, F32.as_pointer()),
                                      [b.mul(task, const_i64(region_floats))], inbounds=True)
            with b.if_then(b.icmp_signed("<", task, ntasks)):
                self._emit_matmul_tasks(task, ntasks)
            return
        self._emit_matmul_tasks(task, ntasks)

    def _emit_matmul_tasks(self, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        out = self.match.out
        a_t, b_t = self.match.tag.operands
        batch, M, K, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        nr = nv * self.vl
        panels = -(-N // nr)
        a_ptr, b_ptr = self.buffers[a_t.uid], self.buffers[b_t.uid]
        lo, hi = self._split(batch * panels, task, ntasks)
        with for_range(b, lo, hi, "work") as work:
            bi = b.sdiv(work, const_i64(panels))
            jp = b.srem(work, const_i64(panels))
            # batch indices of the output, outermost first
            bidx, rest = [], bi
            for n in reversed(out.shape[:-2]):
                bidx.append(b.srem(rest, self._dim_value(n)))
                rest = b.sdiv(rest, self._dim_value(n))
            bidx.reverse()
            a_base = b.gep(a_ptr, [self._batch_offset(a_t, bidx)], inbounds=True)
            b_base = b_ptr if self._const_panels else \
                b.gep(b_ptr, [self._batch_offset(b_t, bidx)], inbounds=True)
            n0 = b.mul(jp, const_i64(nr))
            remaining = b.sub(const_i64(N), n0)
            masks = [self._lane_mask(remaining, v) for v in range(nv)]
            if N % nr == 0:
                self._matmul_full_panel(b_base, n0, a_base, bidx, remaining, masks)
            else:  # plain loads on full panels, masked ones on the last, partial panel
                with b.if_else(b.icmp_signed(">=", remaining, const_i64(nr))) as (full, part):
                    with full:
                        self._matmul_full_panel(b_base, n0, a_base, bidx, remaining, masks)
                    with part:
                        self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, True)

    def _packs_b(self) -> bool:
        """Copy each full panel of B (K rows x nr columns, row stride N) into a contiguous
        buffer as its first row block reads it (the task's region of the kernel's workspace,
        one of MAX_TASK_REGIONS: not the stack, whose size a worker thread may not have to
        spare, e.g. musl's 128 KB): a strided panel hits few L1 sets (a 1-4 KB row
        stride maps its K lines onto 4-16 sets) and a new page every k step or few, so every
        row block streams it from L2 through the TLB; packed it stays in L1 (K <= 512) or
        streams sequentially. Worth it when the panel is reused by enough row blocks (M >=
        PACK_B_MIN_ROWS), B has more than one panel, and the buffer fits PACK_B_MAX_BYTES."""
        if self._const_panels:   # packed at export already
            return False
        _, M, K, N = self._matmul_shape()
        mr, nv = self._matmul_tile()
        nr = nv * self.vl
        return (M >= PACK_B_MIN_ROWS and N > nr and K * nr * 4 <= PACK_B_MAX_BYTES
                and mr >= 4)

    def _packed_panel_bytes(self) -> int:
        _, _, K, _ = self._matmul_shape()
        _, nv = self._matmul_tile()
        return -(-K * nv * self.vl * 4 // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    def _const_panel_vector(self, b_base, n0, nv: int):
        """With B packed at export (``matmul_packed``: panels [ceil(N / nrp), K, nrp], the last
        zero-filled past N), ``load(k, v)``: the vector of row k at columns n0 + v * vl, a plain
        load (nrp a multiple of vl, so a vector never straddles two panels; a vector wholly
        past the last panel, of a tile wider than what is left of N, reads panel 0 instead:
        computed, never stored). None for a B read as [K, N]."""
        if not self._const_panels:
            return None
        b = self.builder
        _, _, K, N = self._matmul_shape()
        nrp = int(self.match.tag.attrs["nr"])
        assert nrp % self.vl == 0, (nrp, self.vl)
        padded = -(-N // nrp) * nrp
        bases = []
        for v in range(nv):
            col = b.add(n0, const_i64(v * self.vl))
            off = b.add(b.mul(b.sdiv(col, const_i64(nrp)), const_i64(K * nrp)),
                        b.srem(col, const_i64(nrp)))
            bases.append(b.select(b.icmp_signed("<", col, const_i64(padded)), off, const_i64(0)))

        def load(k, v):
            return self._weight_vector(b_base, b.add(bases[v], b.mul(k, const_i64(nrp))),
                                       self.vl)
        return load

    def _matmul_full_panel(self, b_base, n0, a_base, bidx, remaining, masks) -> None:
        """A panel of nr columns, all present: packed on the way if ``_packs_b`` (the first row
        block writes each vector of B it loads into the task's workspace region, row k at
        k * nr, and the other row blocks read that copy)."""
        if not self._packs_b() or self._pack_region is None:
            self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, False)
            return
        self._packed_b = self._pack_region   # this task's workspace region (_emit_matmul)
        try:
            self._matmul_panel(a_base, b_base, bidx, n0, remaining, masks, False)
        finally:
            self._packed_b = None

    def _matmul_panel(self, a_base, b_base, bidx, n0, remaining, masks, masked: bool) -> None:
        """All M rows of one panel: blocks of the tile's mr rows, then one block of the M % mr
        rows left, with a tile of exactly that many rows (none computed past M). With a packed
        panel (``_packed_b``) the first block fills it, the strided reads of B overlapping its
        multiply-adds: measured on bench/'s mlp_b64, [64, 784] x [784, 128] + bias + ReLU (Zen 4
        AVX2, 1 thread, profiler minimum), 131 us (98 GFLOP/s, this core's FMA peak) against
        145 us with a copy loop before the row blocks and 11 blocks of 6 rows."""
        if self.symbolic:
            self._matmul_panel_symbolic(a_base, b_base, bidx, n0, remaining, masks, masked)
            return
        b = self.builder
        _, M, _, _ = self._matmul_shape()
        mr, nv = self._matmul_tile()
        full, rest = divmod(M, mr)
        args = (nv, a_base, b_base, bidx, n0, remaining, masks, masked)
        first = 0
        if self._packed_b is not None:   # _packs_b: M >= PACK_B_MIN_ROWS, at least one block
            assert full >= 1
            self._matmul_block(const_i64(0), mr, *args, fill=True)
            first = 1
        if full > first:
            with for_range(b, const_i64(first), const_i64(full), "mb") as mb:
                self._matmul_block(b.mul(mb, const_i64(mr)), mr, *args)
        if rest:
            self._matmul_block(const_i64(full * mr), rest, *args)

    def _prefetch(self, ptr: ir.Value) -> None:
        """Hint the cache line at ``ptr`` (a float pointer) into L1 for reading."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3),
                    ir.Constant(I32, 1)])

    def _matmul_block(self, m0, rows: int, nv: int, a_base, b_base, bidx, n0, remaining, masks,
                      masked: bool, fill: bool = False) -> None:
        """Rows m0 .. m0 + rows (all present) of one panel: the microkernel, then the epilogue.
        B's rows come from the packed panel ``_packed_b`` if set, else from B (row stride N);
        ``fill``: from B, each vector also stored into ``_packed_b``, and the line
        PACK_B_PREFETCH_ROWS rows ahead prefetched (a strided read the hardware prefetcher
        does not run ahead of: measured 1-2 % on the MLP above)."""
        b = self.builder
        _, M, K, N = self._matmul_shape()
        nr = nv * self.vl
        packed = self._packed_b
        line_floats = 64 // 4
        const_panel = self._const_panel_vector(b_base, n0, nv)

        def a_scalar(k, u, i):
            return b.load(b.gep(a_base, [b.add(b.mul(b.add(m0, const_i64(i)), const_i64(K)), k)],
                                inbounds=True))

        def b_vector(k, u, v):
            if const_panel is not None:
                return const_panel(k, v)
            in_panel = b.add(b.mul(k, const_i64(nr)), const_i64(v * self.vl))
            if packed is not None and not fill:   # the panel, contiguous: row k at k * nr
                return b.load(self._vec_ptr(packed, in_panel), align=4)
            off = b.add(b.add(b.mul(k, const_i64(N)), n0), const_i64(v * self.vl))
            ptr = self._vec_ptr(b_base, off)
            if masked:
                return self._masked_load(ptr, masks[v])
            value = b.load(ptr, align=4)
            if fill:
                if (v * self.vl) % line_floats == 0:
                    ahead = b.add(k, const_i64(PACK_B_PREFETCH_ROWS))
                    ahead = b.select(b.icmp_signed("<", ahead, const_i64(K)), ahead,
                                     const_i64(K - 1))
                    self._prefetch(b.gep(b_base, [b.add(b.add(b.mul(ahead, const_i64(N)), n0),
                                                        const_i64(v * self.vl))],
                                         inbounds=True))
                b.store(value, self._vec_ptr(packed, in_panel), align=4)
            return value

        tile = self._microkernel(rows, nv, K, a_scalar, b_vector)
        self._store_matmul_tile(tile, bidx, m0, rows, nv, n0, remaining, masks, masked)

    def _matmul_panel_symbolic(self, a_base, b_base, bidx, n0, remaining, masks,
                               masked: bool) -> None:
        """A panel of a matmul whose M (and K, batch dims) are known at run time: blocks of the
        register tile's rows while whole ones fit, then one block of the rows left (a
        microkernel for each possible count, 1 .. rows - 1)."""
        b = self.builder
        _, M_dim, K_dim, _ = self._matmul_shape()
        M, K = self._dim_value(M_dim), self._dim_value(K_dim)
        mr, nv = self._matmul_tile()
        full = b.mul(b.sdiv(M, const_i64(mr)), const_i64(mr))
        with for_range(b, const_i64(0), b.sdiv(M, const_i64(mr)), "mb") as mb:
            self._matmul_rows(b.mul(mb, const_i64(mr)), mr, nv, K, a_base, b_base, bidx, n0,
                              remaining, masks, masked)
        # the last M % mr rows: one block of exactly that many (a branch per count)
        rest = b.sub(M, full)
        for r in range(1, mr):
            with b.if_then(b.icmp_signed("==", rest, const_i64(r))):
                self._matmul_rows(full, r, nv, K, a_base, b_base, bidx, n0, remaining, masks,
                                  masked)

    def _matmul_rows(self, m0, mr: int, nv: int, K, a_base, b_base, bidx, n0, remaining, masks,
                     masked: bool) -> None:
        """Rows m0 .. m0+mr (all present) of one panel: the microkernel, then the epilogue."""
        b = self.builder
        _, _, K_dim, N = self._matmul_shape()

        def a_scalar(k, u, i):
            return b.load(b.gep(a_base, [b.add(b.mul(b.add(m0, const_i64(i)), K), k)],
                                inbounds=True))

        const_panel = self._const_panel_vector(b_base, n0, nv)

        def b_vector(k, u, v):
            if const_panel is not None:
                return const_panel(k, v)
            ptr = self._vec_ptr(b_base, b.add(b.add(b.mul(k, self._dim_value(N)), n0),
                                              const_i64(v * self.vl)))
            return self._masked_load(ptr, masks[v]) if masked else b.load(ptr, align=4)

        tile = self._microkernel(mr, nv, K_dim, a_scalar, b_vector)
        self._store_matmul_tile(tile, bidx, m0, mr, nv, n0, remaining, masks, masked)

    def _store_matmul_tile(self, tile, bidx, m0, rows: int, nv: int, n0, remaining, masks,
                           masked: bool) -> None:
        """The fused epilogue of a matmul tile (rows m0 .. m0 + rows of the panel from column
        n0; ``remaining`` columns left from n0, ``masks`` their lanes when ``masked``): a vector
        at a time along the row where it is plain arithmetic, else element by element."""
        b = self.builder
        out = self.match.out
        nr = nv * self.vl
        env = {id(ax): idx for ax, idx in zip(out.axes[:-2], bidx)}
        cols = b.select(b.icmp_signed("<", remaining, const_i64(nr)), remaining, const_i64(nr))
        vector = self._vector_epilogue_ok()
        with for_range(b, const_i64(0), const_i64(rows), "ti") as i:
            env[id(out.axes[-2])] = b.add(m0, i)
            if not vector:
                with for_range(b, const_i64(0), cols, "tj") as j:
                    env[id(out.axes[-1])] = b.add(n0, j)
                    self._store_epilogue(env, tile, b.add(b.mul(i, const_i64(nr)), j))
            for v in range(nv if vector else 0):
                env[id(out.axes[-1])] = b.add(n0, const_i64(v * self.vl))
                t_idx = b.add(b.mul(i, const_i64(nr)), const_i64(v * self.vl))
                if not masked:
                    self._store_vector(env, tile, t_idx, None)
                    continue
                with b.if_then(b.icmp_signed(">", remaining, const_i64(v * self.vl))):
                    self._store_vector(env, tile, t_idx, masks[v])

    # ---- conv2d -------------------------------------------------------------------------------

    def _conv_geometry(self) -> dict:
        if self._geom_cache is None:
            x = self.match.tag.operands[0]
            self._geom_cache = conv_geometry(x.shape, self._weight_shape(), self.match.out.shape,
                                           self.match.tag.attrs, self.target_vl)
        return self._geom_cache

    def _fill_planes(self, g: dict, x_img: ir.Value, planes: ir.Value,
                     nchan: int | None = None, rows: list | None = None) -> None:
        """planes[ic, py, px, u, v] = x[ic, u*sh + py - pt, v*sw + px - pl], 0 outside, for
        the first ``nchan`` channels of ``x_img`` (default all), then zero slack after them;
        py < ny row phases, px < nx column phases (or tap columns, shifted layout); only the
        plane rows u in the ``rows`` ranges ([(lo, hi), ...] of i64 values; default all).
        Each (ic, py, px) plane starts ``pstride`` floats after the previous one; the gap after
        its hq * wq values (see ALIAS_BYTES) is zeroed."""
        b = self.builder
        zero = ir.Constant(F32, 0.0)
        nchan = g["c"] if nchan is None else nchan
        sh, sw, hq, wq, w, pl = g["sh"], g["sw"], g["hq"], g["wq"], g["w"], g["pl"]
        ny, nx = g["ny"], g["nx"]
        pstride = g["pstride"]
        # columns v whose source x = v*sw + px - pl lies inside the row, per phase px; and the
        # columns where it does for every phase (copied by one interleaved loop that reads the
        # source row contiguously, which LLVM vectorizes: stride-phase gathers would not be)
        v_lo = [min(wq, max(0, -(-(pl - px) // sw))) for px in range(nx)]
        v_hi = [max(v_lo[px], min(wq, (w - 1 + pl - px) // sw + 1)) for px in range(nx)]
        c_lo = max(v_lo)
        c_hi = max(c_lo, min(v_hi))
        with for_range(b, const_i64(0), const_i64(nchan), "pc") as ic:
            if pstride > hq * wq:   # the gap after each plane: read by dropped columns only
                for ph in range(ny * nx):
                    self._zero_run(planes, b.mul(b.add(b.mul(ic, const_i64(ny * nx)),
                                                       const_i64(ph)), const_i64(pstride)),
                                   hq * wq, pstride)
            for py, (r_lo, r_hi) in ((py, r) for py in range(ny)
                                     for r in rows or [(const_i64(0), const_i64(hq))]):
                with for_range(b, r_lo, r_hi, "pu") as u:
                    yy = b.sub(b.add(b.mul(u, const_i64(sh)), const_i64(py)), const_i64(g["pt"]))
                    row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                    b.icmp_signed("<", yy, const_i64(g["h"])))
                    dst_rows = [b.add(b.mul(b.add(b.mul(ic, const_i64(ny * nx)),
                                                  const_i64(py * nx + px)), const_i64(pstride)),
                                      b.mul(u, const_i64(wq))) for px in range(nx)]
                    with b.if_else(row_ok) as (inside, outside):
                        with inside:
                            src_row = b.add(b.mul(ic, const_i64(g["h"] * w)),
                                            b.mul(yy, const_i64(w)))

                            def copy(v, px):
                                xx = b.add(b.mul(v, const_i64(sw)), const_i64(px - pl))
                                val = b.load(b.gep(x_img, [b.add(src_row, xx)], inbounds=True))
                                b.store(val, b.gep(planes, [b.add(dst_rows[px], v)],
                                                   inbounds=True))

                            for px in range(nx):
                                self._zero_run(planes, dst_rows[px], 0, v_lo[px])
                                if c_lo > v_lo[px]:
                                    with for_range(b, const_i64(v_lo[px]), const_i64(c_lo),
                                                   "pv") as v:
                                        copy(v, px)
                            if c_hi > c_lo:
                                with for_range(b, const_i64(c_lo), const_i64(c_hi), "pv") as v:
                                    for px in range(nx):
                                        copy(v, px)
                            for px in range(nx):
                                if v_hi[px] > c_hi:
                                    with for_range(b, const_i64(c_hi), const_i64(v_hi[px]),
                                                   "pv") as v:
                                        copy(v, px)
                                self._zero_run(planes, dst_rows[px], v_hi[px], wq)
                        with outside:
                            for px in range(nx):
                                self._zero_run(planes, dst_rows[px], 0, wq)
        # the slack after the last plane is read only by dropped columns; keep it finite
        filled = nchan * ny * nx * pstride
        with for_range(b, const_i64(0), const_i64(g["slack"]), "ps") as s:
            b.store(zero, b.gep(planes, [b.add(const_i64(filled), s)], inbounds=True))

    def _task_rows(self, g: dict, task: ir.Value, ntasks: ir.Value, outer: bool
                   ) -> list | None:
        """The plane rows a task reads, when its work is a run of whole panels' columns (one
        group, block rows innermost): rows [u_lo, u_hi) of every channel's planes, and rows
        [0, ov) that reads past the last row spill into (they feed only dropped columns, but
        must be finite). None: all rows."""
        if g["groups"] != 1 or not outer:
            return None
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        hq, wq = g["hq"], g["wq"]
        lo, hi = self._split(mblocks * g["panels"], task, ntasks)
        busy = b.icmp_signed(">", hi, lo)
        p_lo = b.mul(b.sdiv(lo, const_i64(mblocks)), const_i64(g["nr"]))
        jp_end = b.add(b.sdiv(b.sub(hi, const_i64(1)), const_i64(mblocks)), const_i64(1))
        p_end = b.add(b.mul(jp_end, const_i64(g["nr"])), const_i64(g["shift_max"]))

        def clamp(v: ir.Value) -> ir.Value:
            v = b.select(b.icmp_signed("<", v, const_i64(hq)), v, const_i64(hq))
            v = b.select(b.icmp_signed(">", v, const_i64(0)), v, const_i64(0))
            return b.select(busy, v, const_i64(0))

        def rows_up_to(end: ir.Value) -> ir.Value:   # ceil(end / wq), clamped
            return clamp(b.sdiv(b.add(end, const_i64(wq - 1)), const_i64(wq)))

        u_lo = clamp(b.sdiv(p_lo, const_i64(wq)))
        u_hi = rows_up_to(p_end)
        ov = rows_up_to(b.sub(p_end, const_i64(hq * wq)))
        return [(u_lo, u_hi), (const_i64(0), ov)]

    def _zero_run(self, ptr: ir.Value, row: ir.Value, lo: int, hi: int) -> None:
        b = self.builder
        if hi > lo:
            with for_range(b, const_i64(lo), const_i64(hi), "pz") as v:
                b.store(ir.Constant(F32, 0.0), b.gep(ptr, [b.add(row, v)], inbounds=True))

    def _emit_conv(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        b = self.builder
        g = self._conv_geometry()
        x_t = self.match.tag.operands[0]
        x_ptr = self.buffers[x_t.uid]
        planes = None if ws is None else b.bitcast(ws, F32.as_pointer())
        n_batch = x_t.shape[0]
        mblocks = -(-g["og"] // g["mr"])
        cg = g["cg"]
        if g["part_floats"]:
            self._part_base = b.gep(planes, [const_i64(n_batch * (
                g["planes_floats"] + g["slack_total"] + len(g["tail"]) * g["tail_kp"]))],
                inbounds=True)
        with for_range(b, const_i64(0), const_i64(n_batch), "n") as n:
            x_img = b.gep(x_ptr, [b.mul(n, const_i64(g["c"] * g["h"] * g["w"]))], inbounds=True)
            if g["per_group"]:
                nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                              const_i64(MAX_TASK_REGIONS))
                with b.if_then(b.icmp_signed("<", task, nt)):
                    region = b.gep(planes, [b.mul(task, const_i64(g["region"]))], inbounds=True)
                    glo, ghi = self._split(g["groups"], task, nt)
                    with for_range(b, glo, ghi, "grp") as grp:
                        x_grp = b.gep(x_img, [b.mul(grp, const_i64(cg * g["h"] * g["w"]))],
                                      inbounds=True)
                        self._fill_planes(g, x_grp, region, cg)
                        with for_range(b, const_i64(0), const_i64(mblocks * g["panels"]),
                                       "work") as work:
                            jp = b.srem(work, const_i64(g["panels"]))
                            mb = b.sdiv(work, const_i64(g["panels"]))
                            self._conv_block(g, n, grp, mb, jp, region, const_i64(0))
            else:
                if g["direct"]:
                    src = x_img
                elif g["panels"] == 0:   # every output is in the tail
                    src = None
                elif g["panels"]:
                    src = b.gep(planes, [b.mul(n, const_i64(g["planes_floats"] + g["slack_total"]))],
                                inbounds=True)
                tail_ws = None
                if g["tail"]:
                    tail_ws = b.gep(planes, [b.add(
                        const_i64(n_batch * (g["planes_floats"] + g["slack_total"])),
                        b.mul(n, const_i64(len(g["tail"]) * g["tail_kp"])))], inbounds=True)
                fused = g["panels"] and self._fuses_tail(g)
                self._fused_tail = (n, tail_ws) if fused else None
                if fused:   # every task gathers the rows its block rows' tails read
                    self._gather_tail(g, x_img, tail_ws)
                if g["panels"] and self._panels_inner_on_copies(g):
                    # Several tasks split the work by panel, each copying only its panels'
                    # plane rows: split by block row, every task copied all the planes into
                    # the same buffer at once, the two cores' caches passing its lines back
                    # and forth (128 -> 128 3x3 on 16x16, 2 threads: each half 440 -> 640
                    # us). With the weights in L2 a task runs its share block rows innermost
                    # (the planes copied once in all, the weights re-read from L2); past L2,
                    # panels innermost (``by_panel``). One task keeps the panels innermost.
                    in_l2 = 4 * g["og"] * g["cg"] * g["kh"] * g["kw"] <= L2_REUSE_BYTES
                    with b.if_else(b.icmp_signed(">", ntasks, const_i64(1))) as (multi, single):
                        with multi:
                            self._conv_panels(g, n, x_img, src, task, ntasks, in_l2,
                                              by_panel=not in_l2)
                        with single:
                            self._conv_panels(g, n, x_img, src, task, ntasks, False)
                elif g["panels"]:
                    self._conv_panels(g, n, x_img, src, task, ntasks, g["panel_outer"])
                if g["tail"] and not fused:
                    self._conv_tail(g, n, x_img, tail_ws, task, ntasks)

    def _panels_inner_on_copies(self, g: dict) -> bool:
        """Panels innermost on copied planes of one group, where several tasks split the work
        by panel instead (see ``_emit_conv``)."""
        return not g["direct"] and not g["panel_outer"] and g["groups"] == 1

    def _panel_range(self, g: dict, mb: ir.Value, lo: ir.Value, hi: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
        """The panels jp of block row ``mb`` whose work item ``jp * mblocks + mb`` (block
        rows innermost) lies in [lo, hi): [ceil((lo - mb) / mblocks), ceil((hi - mb) /
        mblocks)), clamped to [0, panels]."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])

        def bound(v: ir.Value) -> ir.Value:
            q = b.sdiv(b.add(b.sub(v, mb), const_i64(mblocks - 1)), const_i64(mblocks))
            q = b.select(b.icmp_signed(">", q, const_i64(0)), q, const_i64(0))
            return b.select(b.icmp_signed("<", q, const_i64(g["panels"])), q,
                            const_i64(g["panels"]))

        return bound(lo), bound(hi)

    def _conv_panels(self, g: dict, n, x_img, src, task, ntasks, outer: bool,
                     by_panel: bool = False) -> None:
        """The panels' blocks of one image (one group or many, not ``per_group``): fill the
        plane rows this task reads (unless the input is read in place), then its run of the
        work, block rows innermost (``outer``) or panels innermost. ``by_panel`` (one group,
        panels innermost): the task's share is a run of the work in the block-rows-innermost
        order, as with ``outer``, so that it copies only its panels' plane rows, but it runs
        that share block row by block row, panels innermost."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        kcg = g["kc_outer"] if outer else g["kc_inner"]
        if kcg < g["cg"]:
            self._conv_chunked(g, n, x_img, src, task, ntasks, outer, kcg, by_panel)
            return
        if not g["direct"]:
            # Every task fills the plane rows its panels read (identical values where
            # tasks overlap): no barrier. Each image has its own planes (see
            # _workspace_bytes), so no task overwrites rows another still reads.
            self._fill_planes(g, x_img, src,
                              rows=self._task_rows(g, task, ntasks, outer or by_panel))
        lo, hi = self._split(g["groups"] * mblocks * g["panels"], task, ntasks)
        if by_panel:
            with for_range(b, const_i64(0), const_i64(mblocks), "mb") as mb:
                j_lo, j_hi = self._panel_range(g, mb, lo, hi)
                with for_range(b, j_lo, j_hi, "jp") as jp:
                    self._conv_block(g, n, const_i64(0), mb, jp, src, const_i64(0))
            return
        with for_range(b, lo, hi, "work") as work:
            if outer:   # block row innermost: a planes panel is reused
                mb = b.srem(work, const_i64(mblocks))
                rest = b.sdiv(work, const_i64(mblocks))
                jp = b.srem(rest, const_i64(g["panels"]))
                grp = b.sdiv(rest, const_i64(g["panels"]))
            else:       # panel innermost: a block of weight rows is reused
                jp = b.srem(work, const_i64(g["panels"]))
                rest = b.sdiv(work, const_i64(g["panels"]))
                mb = b.srem(rest, const_i64(mblocks))
                grp = b.sdiv(rest, const_i64(mblocks))
            self._conv_block(g, n, grp, mb, jp, src, b.mul(grp, const_i64(g["cg"])))
            if not outer and self._fused_tail is not None:   # the block row's last panel
                with b.if_then(b.icmp_signed("==", jp, const_i64(g["panels"] - 1))):
                    self._tail_block(g, self._fused_tail[0], self._fused_tail[1],
                                     b.mul(mb, const_i64(g["mr"])), g["mr"])

    def _conv_chunked(self, g: dict, n, x_img, src, task, ntasks, outer: bool, kcg: int,
                      by_panel: bool = False) -> None:
        """``_conv_panels`` with the reduction in chunks of ``kcg`` input channels (one group):
        for every panel (``outer``; else block row) of the task's work, each chunk runs over
        all the task's block rows (panels) of it, their partial sums kept in tiles of the
        task's workspace region, so that the planes they share stay in L1; the last chunk
        ends in the epilogue. Tasks past MAX_TASK_REGIONS get no work."""
        b = self.builder
        mblocks = -(-g["og"] // g["mr"])
        panels, mr, nr = g["panels"], g["mr"], g["nr"]
        nt = b.select(b.icmp_signed("<", ntasks, const_i64(MAX_TASK_REGIONS)), ntasks,
                      const_i64(MAX_TASK_REGIONS))
        with b.if_then(b.icmp_signed("<", task, nt)):
            region = b.gep(self._part_base, [b.mul(task, const_i64(g["part_floats"]))],
                           inbounds=True)
            if not g["direct"]:
                self._fill_planes(g, x_img, src,
                                  rows=self._task_rows(g, task, nt, outer or by_panel))
            yc = mblocks if outer else panels
            lo, hi = self._split(mblocks * panels, task, nt)
            if by_panel:   # every block row x, the panels of the task's share (see _conv_panels)
                x_lo, x_hi = const_i64(0), const_i64(mblocks)
            else:
                x_lo = b.sdiv(lo, const_i64(yc))
                x_hi = b.sdiv(b.add(hi, const_i64(yc - 1)), const_i64(yc))
            nch = g["cg"] // kcg
            with for_range(b, x_lo, x_hi, "cx") as x:
                if by_panel:
                    y_lo, y_hi = self._panel_range(g, x, lo, hi)
                else:
                    base = b.mul(x, const_i64(yc))
                    y_lo = b.sub(lo, base)
                    y_lo = b.select(b.icmp_signed(">", y_lo, const_i64(0)), y_lo, const_i64(0))
                    y_hi = b.sub(hi, base)
                    y_hi = b.select(b.icmp_signed("<", y_hi, const_i64(yc)), y_hi,
                                    const_i64(yc))

                def sweep(kc: ir.Value, init: ir.Value, final: bool) -> None:
                    with for_range(b, y_lo, y_hi, "cy") as y:
                        mb, jp = (y, x) if outer else (x, y)
                        tile = b.gep(region, [b.mul(y, const_i64(mr * nr))], inbounds=True)
                        self._conv_block(g, n, const_i64(0), mb, jp, src, const_i64(0),
                                         chunk=(b.mul(kc, const_i64(kcg)), kcg, init, tile),
                                         final=final)

                if nch > 1:
                    with for_range(b, const_i64(0), const_i64(nch - 1), "kc") as kc:
                        sweep(kc, b.icmp_signed(">", kc, const_i64(0)), False)
                sweep(const_i64(nch - 1), ir.Constant(I1, nch > 1), True)
                if not outer and not by_panel and self._fused_tail is not None:
                    # the task that ran the block row's last panel: its tail outputs
                    with b.if_then(b.icmp_signed("==", y_hi, const_i64(yc))):
                        self._tail_block(g, self._fused_tail[0], self._fused_tail[1],
                                         b.mul(x, const_i64(mr)), mr)

    def _conv_block(self, g: dict, n, grp, mb, jp, src, ic_base, chunk=None,
                    final: bool = True) -> None:
        """One mr x nr block of outputs: group ``grp``, block row ``mb``, panel ``jp``; ``src``
        holds the planes, the group's first channel at plane channel ``ic_base``. ``chunk``:
        (first channel, channels, init, tile) of a reduction chunk (``_conv_chunked``) whose
        partial sums go to ``tile``, starting from its values when ``init``; the epilogue
        only when ``final``."""
        b = self.builder
        out = self.match.out
        mr, nv, nr, og, cg = g["mr"], g["nv"], g["nr"], g["og"], g["cg"]
        taps = [(ky, kx) for ky in range(g["kh"]) for kx in range(g["kw"])]
        khw = len(taps)
        plane = g["pstride"]
        sh, sw, wq = g["sh"], g["sw"], g["wq"]
        p0 = b.mul(jp, const_i64(nr))
        if g["direct"]:
            masks = [self._lane_mask(b.sub(const_i64(g["pflat"]), p0), v)
                     for v in range(nv)]
        oc0 = b.add(b.mul(grp, const_i64(og)), b.mul(mb, const_i64(mr)))
        local0 = b.mul(mb, const_i64(mr))
        a_scalar = self._conv_weight(oc0, local0, og, khw)
        ny, nx, shifted = g["ny"], g["nx"], g["shifted"]
        k_extent, tile_buf, init = cg, None, None
        if chunk is not None:
            k0, k_extent, init, tile_buf = chunk
            ic_base = b.add(ic_base, k0)
            whole = a_scalar

            def a_scalar(k, u, i):
                return whole(b.add(k, k0), u, i)

        def off(k, u, v):
            ky, kx = taps[u]
            px, dx = (kx, 0) if shifted else (kx % sw, kx // sw)
            plane_idx = b.add(b.mul(b.add(ic_base, k), const_i64(ny * nx)),
                              const_i64((ky % sh) * nx + px))
            return b.add(b.mul(plane_idx, const_i64(plane)),
                         const_i64((ky // sh) * wq + dx + v * self.vl))

        def block(masked: bool) -> None:
            def plain(k, u, v):
                return b.load(self._vec_ptr(src, b.add(off(k, u, v), p0)), align=4)

            def b_masked(k, u, v):
                return self._masked_load(self._vec_ptr(src, b.add(off(k, u, v), p0)), masks[v])

            # Only the last channel's loads could run past the input (the reduction's last
            # step, in the last chunk): the lanes past the plane read the next channel, and
            # only feed outputs that are dropped.
            tile = self._microkernel(mr, nv, k_extent, a_scalar, plain, list(range(khw)),
                                     b_last=b_masked if masked and final else None,
                                     tile=tile_buf, init=init)
            if final:
                self._conv_epilogue(g, out, n, oc0, local0, p0, tile)

        if not g["direct"] or g["panels"] * nr <= g["pflat"]:
            block(False)
        else:  # the input itself is read: mask the last loads of the last, partial panel
            full = b.icmp_signed("<=", b.add(p0, const_i64(nr)), const_i64(g["pflat"]))
            with b.if_else(full) as (then, otherwise):
                with then:
                    block(False)
                with otherwise:
                    block(True)

    def _hsum(self, v: ir.Value) -> ir.Value:
        """The sum of a vector's lanes (a tree of shuffles and adds)."""
        b = self.builder
        n = self.vl
        while n > 1:
            half = n // 2
            hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half),
                                                    list(range(half, n))))
            lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, half), list(range(half))))
            v = b.fadd(lo, hi)
            n = half
        return b.extract_element(v, ir.Constant(I32, 0))

    def _conv_tail(self, g: dict, n, x_img, xt, task, ntasks) -> None:
        """The outputs of the tail pixels (``conv_geometry``: those a last, partial panel
        would hold), one group: each pixel's inputs (channel, tap) are gathered into ``xt`` (a
        row of ``tail_kp`` floats, zero-padded), then every output is the dot product of its
        weight row with that row, vl products at a time; a block of mo channels x rp pixels
        keeps mo * rp vector accumulators. The tasks split the channel blocks; each task with
        some gathers the rows (the same values where tasks overlap, as the planes)."""
        b = self.builder
        mo = self._row_block() or (8 if len(g["tail"]) == 1 else 4)
        oblocks = -(-g["og"] // mo)
        lo, hi = self._split(oblocks, task, ntasks)
        with b.if_then(b.icmp_signed(">", hi, lo)):
            self._gather_tail(g, x_img, xt)
            with for_range(b, lo, hi, "tob") as ob:
                self._tail_block(g, n, xt, b.mul(ob, const_i64(mo)), mo)

    def _fuses_tail(self, g: dict) -> bool:
        """Whether each block row's tail outputs follow its panels (``_conv_panels``), its
        weight rows still in cache, instead of a pass of their own after all the panels: a
        direct (1x1) convolution, panels innermost, whose weights do not stay in L2 (the
        separate pass read them all again from L3: MobileNetV2's 320 -> 1280 on 7x7, 1.6 MB,
        one tail pixel)."""
        return (bool(g["tail"]) and g["direct"] and not g["panel_outer"] and g["groups"] == 1
                and 4 * g["og"] * g["cg"] > L2_REUSE_BYTES)

    def _gather_tail(self, g: dict, x_img, xt) -> None:
        """Every tail pixel's inputs (channel, tap) into its row of ``xt``, zero-padded."""
        b = self.builder
        tail, kp = g["tail"], g["tail_kp"]
        kh, kw, cg, h, w = g["kh"], g["kw"], g["cg"], g["h"], g["w"]
        khw = kh * kw
        zero = ir.Constant(F32, 0.0)
        with for_range(b, const_i64(0), const_i64(cg), "tc") as ic:
            src = b.mul(ic, const_i64(h * w))
            for t, (oy, ox) in enumerate(tail):
                for ky in range(kh):
                    for kx in range(kw):
                        iy = oy * g["sh"] + ky - g["pt"]
                        ix = ox * g["sw"] + kx - g["pl"]
                        dst = b.add(b.mul(ic, const_i64(khw)), const_i64(t * kp + ky * kw + kx))
                        val = zero
                        if 0 <= iy < h and 0 <= ix < w:
                            val = b.load(b.gep(x_img, [b.add(src, const_i64(iy * w + ix))],
                                               inbounds=True))
                        b.store(val, b.gep(xt, [dst], inbounds=True))
        for t in range(len(tail)):
            for k in range(cg * khw, kp):
                b.store(zero, b.gep(xt, [const_i64(t * kp + k)], inbounds=True))

    def _tail_block(self, g: dict, n, xt, o0, mo: int) -> None:
        """The tail outputs of channels o0 .. o0 + mo - 1 (those below og), from the gathered
        rows ``xt``: dot products of their weight rows with them, rp pixels at a time."""
        b = self.builder
        tail, kp, og, vl = g["tail"], g["tail_kp"], g["og"], self.vl
        k_taps = g["cg"] * g["kh"] * g["kw"]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        rp = 1 if len(tail) == 1 else 2
        if self._row_block() is not None:
            self._tail_block_rows(g, n, xt, o0, mo, rp)
            return
        chunks, rem = divmod(k_taps, vl)
        rem_mask = ir.Constant(ir.VectorType(I1, vl), [i < rem for i in range(vl)])
        rows = [b.mul(b.select(b.icmp_signed("<", b.add(o0, const_i64(i)), const_i64(og)),
                               b.add(o0, const_i64(i)), const_i64(og - 1)),
                      const_i64(k_taps)) for i in range(mo)]
        for j0 in range(0, len(tail), rp):
            r = min(rp, len(tail) - j0)
            accs = [alloca_once(b, self.vty, name=f"tacc{i}_{j}")
                    for i in range(mo) for j in range(r)]
            for a in accs:
                b.store(ir.Constant(self.vty, [0.0] * vl), a)

            def step(kc, masked: bool) -> None:
                k0 = b.mul(kc, const_i64(vl))
                xv = [b.load(self._vec_ptr(xt, b.add(k0, const_i64((j0 + j) * kp))),
                             align=4) for j in range(r)]
                for i in range(mo):
                    ptr = self._vec_ptr(w_ptr, b.add(rows[i], k0))
                    wv = self._masked_load(ptr, rem_mask) if masked \
                        else b.load(ptr, align=4)
                    for j in range(r):
                        a = accs[i * r + j]
                        b.store(self._fma(wv, xv[j], b.load(a)), a)

            if chunks:
                with for_range(b, const_i64(0), const_i64(chunks), "tk") as kc:
                    step(kc, False)
            if rem:
                step(const_i64(chunks), True)
            self._begin_epilogue()
            tile = alloca_once(b, ir.ArrayType(F32, mo * r), name="ttile")
            tile_f = b.bitcast(tile, F32.as_pointer())
            for q, a in enumerate(accs):
                b.store(self._hsum(b.load(a)), b.gep(tile_f, [const_i64(q)], inbounds=True))
            self._store_tail_tile(n, o0, mo, tail[j0:j0 + r], tile_f)

    def _store_tail_tile(self, n, o0, mo: int, pixels, tile_f: ir.Value) -> None:
        """The epilogue of a tail block: channels o0 .. o0 + mo - 1 (those below og) at the tail
        ``pixels`` ((oy, ox) each), channel i's value at pixel j in ``tile_f[i * len(pixels) +
        j]``."""
        b, out, r = self.builder, self.match.out, len(pixels)
        for i in range(mo):
            oc = b.add(o0, const_i64(i))
            with b.if_then(b.icmp_signed("<", oc, const_i64(self._conv_geometry()["og"]))):
                for j, (oy, ox) in enumerate(pixels):
                    env = {id(out.axes[0]): n, id(out.axes[1]): oc,
                           id(out.axes[2]): const_i64(oy), id(out.axes[3]): const_i64(ox)}
                    self._store_epilogue(env, tile_f, const_i64(i * r + j))

    def _tail_block_rows(self, g: dict, n, xt, o0, mo: int, rp: int) -> None:
        """``_tail_block`` on weights packed in blocks of ``mo`` rows (``conv2d_rows``; ``o0`` a
        block's first channel): the block's ``mo`` channels on the lanes of one accumulator per
        pixel, each reduction step one load of its ``mo`` weights times the pixel's input (no
        horizontal sums)."""
        b = self.builder
        tail, kp = g["tail"], g["tail_kp"]
        k_taps = g["cg"] * g["kh"] * g["kw"]
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        lanes = ir.VectorType(F32, mo)
        fma = intrinsic(self.module, f"llvm.fmuladd.v{mo}f32", lanes, [lanes] * 3)
        block = b.gep(w_ptr, [b.mul(b.sdiv(o0, const_i64(mo)), const_i64(k_taps * mo))],
                      inbounds=True)
        for j0 in range(0, len(tail), rp):
            r = min(rp, len(tail) - j0)
            # TAIL_CHAINS independent accumulators in all (steps k interleaved), so that the
            # multiply-adds do not wait on each other's latency
            chains = max(1, TAIL_CHAINS // r)
            accs = [[alloca_once(b, lanes, name=f"tracc{j}_{c}") for c in range(chains)]
                    for j in range(r)]
            for a in (a for row in accs for a in row):
                b.store(ir.Constant(lanes, [0.0] * mo), a)

            def step(k, c: int) -> None:
                wv = self._weight_vector(block, b.mul(k, const_i64(mo)), mo)
                for j in range(r):
                    x = b.load(b.gep(xt, [b.add(k, const_i64((j0 + j) * kp))], inbounds=True))
                    xv = b.shuffle_vector(
                        b.insert_element(ir.Constant(lanes, None), x, ir.Constant(I32, 0)),
                        ir.Constant(lanes, None),
                        ir.Constant(ir.VectorType(I32, mo), [0] * mo))
                    b.store(b.call(fma, [wv, xv, b.load(accs[j][c])]), accs[j][c])

            full, rem = divmod(k_taps, chains)
            with for_range(b, const_i64(0), const_i64(full), "trk") as kk:
                for c in range(chains):
                    step(b.add(b.mul(kk, const_i64(chains)), const_i64(c)), c)
            for c in range(rem):
                step(const_i64(full * chains + c), c)
            self._begin_epilogue()
            tile = alloca_once(b, ir.ArrayType(F32, mo * r), name="trtile")
            tile_f = b.bitcast(tile, F32.as_pointer())
            for j in range(r):
                acc = b.load(accs[j][0])
                for c in range(1, chains):
                    acc = b.fadd(acc, b.load(accs[j][c]))
                for i in range(mo):
                    b.store(b.extract_element(acc, ir.Constant(I32, i)),
                            b.gep(tile_f, [const_i64(i * r + j)], inbounds=True))
            self._store_tail_tile(n, o0, mo, tail[j0:j0 + r], tile_f)

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
        if wq == g["ow"] and self._vector_epilogue_ok() and self._rows_contiguous():
            # a panel is a contiguous run of outputs: vectors across row ends
            with for_range(b, const_i64(0), rows, "ti") as i:
                env[id(out.axes[1])] = b.add(oc0, i)
                for v in range(g["nv"]):
                    p = b.add(p0, const_i64(v * self.vl))
                    left = b.sub(const_i64(g["pflat"]), p)
                    env[id(out.axes[2])] = b.sdiv(p, const_i64(wq))
                    env[id(out.axes[3])] = b.srem(p, const_i64(wq))
                    t_idx = b.add(b.mul(i, const_i64(nr)), const_i64(v * self.vl))
                    with b.if_else(b.icmp_signed(">=", left, const_i64(self.vl))) as (full, part):
                        with full:
                            self._store_vector(env, tile, t_idx, None)
                        with part:
                            with b.if_then(b.icmp_signed(">", left, const_i64(0))):
                                self._store_vector(env, tile, t_idx, self._lane_mask(left, 0))
            return
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
                if not self._vector_epilogue_ok():
                    with for_range(b, x_lo, x_hi, "ox") as ox:
                        env[id(out.axes[3])] = ox
                        t_idx = b.add(b.mul(i, const_i64(nr)), b.sub(b.add(row0, ox), p0))
                        self._store_epilogue(env, tile, t_idx)
                else:
                    self._conv_row_vectors(env, out, tile, i, row0, p0, x_lo, x_hi)

    def _conv_row_vectors(self, env, out, tile, i, row0, p0, x_lo, x_hi) -> None:
        """The epilogue on outputs x_lo..x_hi of one row, vl at a time (the last masked)."""
        b = self.builder
        nr = self._conv_geometry()["nr"]
        count = b.sub(x_hi, x_lo)
        nvec = b.sdiv(b.add(count, const_i64(self.vl - 1)), const_i64(self.vl))
        with for_range(b, const_i64(0), nvec, "ov") as q:
            ox = b.add(x_lo, b.mul(q, const_i64(self.vl)))
            env[id(out.axes[3])] = ox
            t_idx = b.add(b.mul(i, const_i64(nr)), b.sub(b.add(row0, ox), p0))
            left = b.sub(x_hi, ox)
            with b.if_else(b.icmp_signed(">=", left, const_i64(self.vl))) as (full, part):
                with full:
                    self._store_vector(env, tile, t_idx, None)
                with part:
                    self._store_vector(env, tile, t_idx, self._lane_mask(left, 0))


def emit_symbolic_matmul(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                         size_vars: tuple[str, ...]) -> KernelInfo | None:
    """Emit a symbolic ``func`` with the register-blocked matmul if it is a matmul; M, N, K
    and the batch dims may be run-time sizes. Other contractions with symbolic shapes (conv, depthwise) are not matched here."""
    match = match_contraction(func)
    if match is None or match.tag.kind not in ("matmul", "matmul_packed") \
            or match.tag.attrs.get("transpose_b"):
        return None
    return ContractionEmitter(module, func, symbol, match, vl, size_vars).emit()


def emit_contraction(module: ir.Module, match: Contraction, func: PrimFunc, symbol: str, vl: int
                     ) -> KernelInfo:
    """Emit the contraction ``match`` of ``func`` with the register-blocked kernel."""
    return ContractionEmitter(module, func, symbol, match, vl).emit()


def is_row_matmul(match: Contraction | None) -> bool:
    """``match`` is ``matmul(x, W, transpose_b=True)`` of one row x (every dim but the last 1)
    by a 2-D W (N, K): a torch Linear at batch 1, whose constant W layout.py leaves untransposed
    for this kernel (each output is one dot product of contiguous rows)."""
    if match is None or match.tag.kind != "matmul" or not match.tag.attrs.get("transpose_b"):
        return False
    x, w = match.tag.operands
    dims = tuple(x.shape[:-1]) + tuple(match.out.shape[:-1])
    return (len(w.shape) == 2 and all(isinstance(d, int) for d in tuple(x.shape) + tuple(w.shape))
            and all(d == 1 for d in dims))
