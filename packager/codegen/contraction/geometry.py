"""The contraction kernels' geometry, in pure Python (no llvmlite): how many threads a
kernel is worth, the register tile of a matmul, the vector width of a target, and how a conv2d
is computed (``conv_geometry``: plane layout, register tile, loop order, reduction chunks,
tail). The emitters (``matmul.py``, ``conv.py``) and the layout passes (``passes/layout.py``
packs weights in the tile's row blocks) both read it, so a graph pass never imports LLVM."""

from __future__ import annotations

# Below CompileOptions.parallel_min_macs multiply-adds a kernel runs on one thread; its default
# (codegen/threads.py), here for the emitters that read it as a constant (int8, bf16 kernels).
from ..threads import PARALLEL_MIN_MACS  # noqa: F401
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


# The widest vector any target's kernels use, in floats (x86-64-v4's): a matmul of more columns
# has at least two column panels on every target once its tile is at most half its columns wide.
WIDEST_VECTOR = 16

# Register blocks of a float32 matmul on 16-lane vectors (x86-64-v4, 32 zmm registers): (rows,
# vectors per row, relative cost per computed output). Measured on Zen 5 (1 thread, kernel min,
# B packed at export): 4 x 4 and 6 x 2 run the corpus's shapes at 270-285 GFLOP/s (the FMA
# peak); 6 x 4, 8 x 2, 8 x 3 were the same within 2 %, 7 x 4 and 14 x 2 5-25 % slower on
# MLP-Mixer's [196, 256] x [256, 1024] (28 accumulators: spills), so they are not entries.
MATMUL_TILES_512 = ((4, 4, 1.0), (6, 2, 1.0))


# At 16 lanes a static matmul whose B, packed at export, has at least this many bytes
# prefetches each next panel of it during the current panel's first row block
# (MatmulMixin._prefetches_next_panel): such weights come from L3 or memory on every call.
PREFETCH_B_MIN_BYTES = L2_REUSE_BYTES

# A static matmul that splits over threads at 16 lanes has at least this many work items:
# fewer panels are split into chunks of row blocks (MatmulMixin._row_chunks), so that two
# threads (or up to MAX_TASK_REGIONS) share it with at most 1/8 of it left over.
SPLIT_MIN_ITEMS = 8


def wide_matmul_tile(rows: int, cols: int) -> tuple[int, int]:
    """Register block (rows, vectors per row) of a float32 matmul of at least 4 rows on 16-lane
    vectors: the MATMUL_TILES_512 entry of least cost for the outputs it computes (whole row
    blocks; whole panels but for the last, which computes only the vectors it needs)."""
    def cost(tile: tuple[int, int, float]) -> float:
        mr, nv, rel = tile
        nr = nv * WIDEST_VECTOR
        last = cols % nr
        computed_cols = cols // nr * nr + -(-last // WIDEST_VECTOR) * WIDEST_VECTOR
        return -(-rows // mr) * mr * computed_cols * rel

    best = min(MATMUL_TILES_512, key=cost)
    return best[0], best[1]


def few_rows_tile(rows: int, cols: int, vl: int, split: bool) -> tuple[int, int]:
    """Register block (rows, vectors per row) of a matmul of fewer than 4 rows: all of them, as
    wide as 8 accumulators allow; ``split`` (over threads by its column panels, for the bytes
    of its weights): at most half its columns wide, so that with more than WIDEST_VECTOR
    columns every target has two panels or more to share out."""
    width = -(-cols // 2) if split else cols
    return rows, max(1, min(8 // rows, -(-width // vl)))


def vector_width(target_name: str) -> int:
    """Floats per vector register the kernels are written for."""
    # a feature level ("x86-64-v4+vnni", "x86-64-v4+bf16") has its base level's registers
    return {"x86-64-v4": WIDEST_VECTOR, "x86-64-v3": 8}.get(target_name.split("+")[0], 4)


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
# ... and, for a single tail pixel, two reduction steps a full vector where the row blocks are
# half a vector wide (AVX2's 4-row blocks: ``_tail_block_pairs``; measured on Zen 4, one-conv
# bundles, CPU-time min: 2048 -> 512 on 7x7 1151 / 1149 -> 1130 / 1124 us, 512 -> 2048 + a
# residual 1172 / 1204 -> 1140 / 1167; with 4 tail pixels (14x14) not better: 1024 -> 256
# 1189 / 1174 -> 1223 / 1212, so not there). False: one step a half-width vector.
TAIL_PAIRS = True
# Shifted planes that the kernel re-reads from L2 once per block row (panels innermost: weights
# past L2_REUSE_BYTES, planes within it but past a quarter of it) lose to the by-phase copy
# (a third of the bytes) when planes and weights together pass this many bytes, unless by phase
# drops more than 1/12 of its columns (``conv_geometry``).
SHIFTED_REREAD_BYTES = 2 * L2_REUSE_BYTES
# A packed 1x1 whose (panel, chunk) items are odd in number and fewer than 8 (one thread's
# share at least 8 : 7) takes one chunk more (of equal sizes), so that two threads split them
# evenly (``conv_geometry``).
EVEN_CHUNKS = True
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


# A 1x1 convolution read in place with the block rows innermost (``panel_outer``) stores, per
# panel, a short run (nr floats) of every output channel's row, and reads the same run of a
# residual or other output-shaped epilogue operand: hundreds of streams, more than the
# hardware prefetcher follows, so each run comes from L3 or memory at full latency. Its
# epilogue prefetches the run this many panels ahead in each row it stores (0: none).
EPILOGUE_PREFETCH_PANELS = 1
# ... and, where the input does not stay in L2 (L2_REUSE_BYTES), each block row prefetches its
# share of the input rows' runs that panel reads (ResNet-50's 56x56 layers, in the network, 1
# thread: 256 -> 64 77 -> 86 % of the FMA peak, 64 -> 256 with the residual 79 -> 82 %; a
# 400 KB input, 128 -> 512 on 28x28, 77-79 either way).
INPUT_PREFETCH = True

CHUNK_MIN_STEPS = 64     # no chunks of fewer reduction steps (channels x taps)

# A 1x1 convolution whose weights pass L2 runs panels innermost, each block row re-reading the
# input's K rows of a panel (a short run in each of K rows a plane apart: more lines than L1
# holds and more streams than the prefetcher follows). Packed instead (``conv_packed.py``): each
# task first copies its panels of the input into [panel][K][nr] (contiguous, once per image),
# then runs the block rows in chunks whose weights stay in L2 (PACK_A_BYTES), every panel of
# the task per chunk: the microkernel streams one contiguous panel and one weight block.
# Measured on AVX2 (Zen 4) only; the other widths keep the in-place kernel. ResNet-50 in the
# network, 1 thread, % of the FMA peak before -> after: 14x14 256 -> 1024 + residual 74-78 ->
# 87-89, 1024 -> 256 81-83 -> 88-90, 28x28 128 -> 512 + residual 77-80 -> 84-86, 7x7 80-82
# -> 86-88, strided 512 -> 1024 74 -> 89 (bench/conv_peak.py).
PACKED_1X1_VL = 8
# At 16 lanes (x86-64-v4, 32 zmm registers) the static kernel packs too, where the weights
# pass L2 (PACKED_1X1_WIDE; the 16-lane tiles of _CONV_TILES_512, no tail): the weights then
# stay in L2 chunk by chunk. Measured on Zen 5, 1 thread, kernel min, packed / in place (both
# 16-lane tiles): EfficientNet-B0's 192 -> 1152 on 7x7 (884 KB of weights) 0.83-0.85; with the
# weights in L2 packing loses: MobileNetV3's 16 -> 16 on 56x56 1.41, 72 -> 24 on 28x28 1.29,
# 96 -> 40 on 14x14 1.07, EfficientNet's 144 -> 40 on 28x28 1.19.
PACKED_1X1_WIDE = True
# ... and every 1x1 of at least WIDE_1X1_MIN_CHANNELS channels in and out takes a 16-lane tile
# there, packed or not: the cost model's half-width (8-lane) tiles assume Zen 4's two 256-bit
# FMA pipes and run at half Zen 5's 512-bit rate (1 thread, kernel min, 8-lane -> 16-lane
# tile: MobileNetV3's 96 -> 576 on 7x7 48 -> 28 us, 96 -> 40 on 14x14 11.8 -> 7.5,
# EfficientNet's 112 -> 672 on 14x14 262 -> 158; see docs/performance.md, issue 35).
WIDE_1X1_MIN_CHANNELS = 16
PACK_A_BYTES = L2_REUSE_BYTES // 2
PACK_MIN_CHANNELS = 64


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


def symbolic_conv_tile(og: int, vl: int, taps: int = 9) -> tuple[int, int]:
    """(rows, vectors) of the register tile of a convolution whose image size is known at run
    time only (``conv_symbolic.py``): of the static kernel's tiles at this vector width
    (``_conv_tiles``), the one computing the fewest output rows, weighted by its relative cost
    (on AVX2, 4 x 3 rather than 6 x 2: 0.9 the cost per output, and no rows wasted on 16, 32
    or 64 channels; past a 3x3 window of ``taps``, 6 x 2). The columns are not known at
    export; every tile wastes at most one panel of them per row of outputs. The rows are the
    same at every width of a portable bundle (``passes/layout.py`` packs the weights of a 1x1
    by them)."""
    tiles = [(mr, nv, eff) for tvl, mr, nv, eff in _conv_tiles(og, vl, taps) if tvl == vl]
    mr, nv, _ = min(tiles, key=lambda t: -(-og // t[0]) * t[0] * t[2])   # the first of ties
    return min(mr, og), nv


def packs_open_1x1(c: int, o: int, kernel, strides, padding, vl: int) -> bool:
    """Whether a 1x1 convolution whose pixel count is known at run time only copies its input
    into packed panels (``conv_packed_symbolic.py``), as the static kernel does
    (``conv_geometry``'s ``packed``): stride 1, unpadded, one group, PACK_MIN_CHANNELS in
    and out, on AVX2 (PACKED_1X1_VL). Whatever the image's size: the static kernel reads a
    large input with its weights in L2 in place instead, level within noise (see
    ``conv_geometry``)."""
    return (tuple(kernel) == (1, 1) and tuple(strides) == (1, 1) and not any(padding)
            and min(c, o) >= PACK_MIN_CHANNELS and vl == PACKED_1X1_VL)


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
    # a 1x1 at 16 lanes: 16-lane tiles only (see WIDE_1X1_MIN_CHANNELS)
    wide_1x1 = (target_vl == 16 and groups == 1 and (kh, kw) == (1, 1)
                and min(cg, og) >= WIDE_1X1_MIN_CHANNELS)
    best = None
    for shifted in layouts:
        wq = ow if shifted else max(-(-wp // sw), ow + (kw - 1) // sw)
        nx = kw if shifted else min(sw, kw)
        pflat = oh * wq                          # flattened outputs computed per channel
        copied = 0 if direct else c * ny * nx * hq * wq
        for vl, mr, nv, eff in _conv_tiles(og, target_vl, kh * kw):
            if _tall_tile and mr < 6 or wide_1x1 and vl != 16:
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
    # Packed panels (see PACK_A_BYTES): a 1x1, unpadded, one group, at least one full panel,
    # PACK_MIN_CHANNELS in and out (the copy costs about COPY_COST_MACS / og of the work), and
    # weights past L2, a strided or aliasing input (copied anyway), or an input within L2.
    # Not: a large input read in place with the weights in L2 (ResNet-50's 56x56 layers, whose
    # block rows prefetch the next panel, INPUT_PREFETCH: level within noise, 83-89 %; three
    # A/B runs of ResNet-50, sum of the 11 layers' mins packed / in place 1.011, 1.001, 1.010,
    # docs/performance.md).
    packed = (groups == 1 and (kh, kw) == (1, 1) and not any(attrs["padding"]) and wq == ow
              and panels > 0
              and (weight_bytes > L2_REUSE_BYTES or not direct or 4 * c * h * wd <= L2_REUSE_BYTES)
              and min(cg, og) >= PACK_MIN_CHANNELS and vl == target_vl
              and (target_vl == PACKED_1X1_VL or (
                  PACKED_1X1_WIDE and target_vl == 16 and weight_bytes > L2_REUSE_BYTES)))
    mc_blocks = max(1, min(mblocks, PACK_A_BYTES // (4 * mr * cg))) if packed else 0
    nch = -(-mblocks // mc_blocks) if packed else 0
    if EVEN_CHUNKS and packed and panels * nch % 2 and panels * nch < 8 and mblocks > 1:
        # an odd count of (panel, chunk) items splits unevenly on two threads (MobileNetV2's
        # 160 -> 960 on 7x7: one panel, chunks of 102, 102 and 36 block rows, the threads'
        # shares 102 : 138): one chunk more, all of equal size
        mc_blocks = -(-mblocks // (nch + 1))
    return dict(c=c, h=h, w=wd, o=o, cg=cg, kh=kh, kw=kw, oh=oh, ow=ow, sh=sh, sw=sw,
                packed=packed, mc_blocks=mc_blocks,
                mchunks=-(-mblocks // mc_blocks) if packed else 0,
                pack_floats=panels * nr * cg if packed else 0,
                ny=ny, nx=nx, shifted=shifted, vl=vl,
                per_group=per_group, region=region, slack_total=slack_total,
                pt=pt, pl=pl, hq=hq, wq=wq, pstride=pstride, groups=groups, og=og,
                pflat=pflat, mr=mr, nv=nv,
                nr=nr, panels=panels, planes_floats=planes, slack=slack, direct=direct,
                panel_outer=panel_outer, shift_max=shift_max, tail=tail, tail_kp=tail_kp,
                kc_outer=kc_outer, kc_inner=kc_inner, part_floats=part_floats,
                prefetch_panels=EPILOGUE_PREFETCH_PANELS if direct and panel_outer else 0,
                prefetch_input=(INPUT_PREFETCH and direct and panel_outer
                                and 4 * c * h * wd > L2_REUSE_BYTES))


# The channel-lane convolution (codegen/conv_oc.py) at 16 lanes, output channels not in whole
# vectors (``oc_partial_lanes``): at least this many, the last vector's unused lanes at most
# 1 / OC_PARTIAL_LANES_WASTE of those computed. PP-OCRv4 recognizer's 1x3 convolutions to 60
# channels on 1x40 (4 of 64 lanes unused), 1 thread: 127 -> 59 and 78 -> 40 us against the
# register-blocked kernel (docs/performance.md, issue 35, 2026-12-07).
OC_PARTIAL_LANES_MIN_CHANNELS = 48
OC_PARTIAL_LANES_WASTE = 16


def oc_partial_lanes(out_channels: int) -> bool:
    """Whether a convolution to ``out_channels`` not in whole 16-lane vectors runs on the
    channel-lane kernel at 16 lanes all the same (passes/layout.py packs it for that kernel on
    AVX-512 targets, windows wider than 1x1): the last vector computed on the packed weights'
    zeros, its lanes past the channels not stored. Others keep 8-lane vectors there, or
    (passes/layout.py) the register-blocked kernel."""
    lanes = -(-out_channels // 16) * 16
    return (out_channels >= OC_PARTIAL_LANES_MIN_CHANNELS
            and (lanes - out_channels) * OC_PARTIAL_LANES_WASTE <= lanes)
