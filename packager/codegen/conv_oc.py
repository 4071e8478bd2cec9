"""A direct kernel for ungrouped convolutions with the output channels on the vector lanes
(``nn.conv2d_oc``: NCHW float32 in and out, any window, stride and padding; the weights packed
at export by ``ops.layout.pack_oc_weights`` into blocks of 32 output channels, each block's
``[C * kh * kw, 32]`` weights contiguous).

The register tile is MR output pixels times 4 channel vectors (on AVX2: 3 pixels x 32
channels, 12 accumulators). Every reduction step (input channel ic, tap ky, kx) broadcasts the
MR pixels' inputs and loads the 4 weight vectors, one at a time, each into MR multiply-adds:
12 + 3 + 1 = 16 registers, no spills. Unlike the register-blocked kernel with pixels on the
lanes (codegen/contraction/), no column is computed and dropped (rows of 7, 14 or 28 pixels waste
1/9 to 2/9 of its lanes), the input is not copied by stride phase, and a window of any width
needs no wider planes; this is ONNX Runtime's NCHWc idea (MLAS), with the NCHW layout kept at
the kernel's edges.

Per task (a run of (image, band, block) items, the block innermost):

- a *band* of output rows (bands of equal heights, their copied input rows within BAND_BYTES)
  has its input rows copied once, zero-padded, into the task's workspace region (no copy
  without padding: the kernel reads the input in place);
- within a band, per block, *groups* of output rows are accumulated in the task's row buffer
  (``[rows * OW + 8, 32]``, ROW_BUFFER_BYTES): the reduction runs over chunks of CHUNK_STEPS
  (input channels x taps), each chunk over all the group's pixels, MR at a time row after row
  (a tile may span two rows: no 1- or 2-pixel tile per row), its 32 x CHUNK_STEPS weights
  staying in L1; the partial sums are loaded and stored per chunk; windows past UNROLLED_TAPS
  loop over their rows;
- then each row of the group goes out: vl x vl blocks (pixels x channels) of the row buffer
  are transposed in registers into vectors along the output row, which the fused epilogue
  (bias, BatchNorm, activation, residual add: depthwise.emit_epilogue) finishes and stores.

With 4-lane vectors (the SSE levels of a portable bundle) a block's 8 vectors run in two passes
of 4, one loop over the passes (``_pass_loops``), not a copy of the tile code each.
With AVX-512's 16 lanes (x86-64-v4) a block is 2 zmm vectors and the tile 8 pixels (16
accumulators of 32 registers; 10 pixels spill in the direct kernel, 12 in both: 244 stack accesses per
216 multiply-adds), the row transposes 16 x 16; on Zen 5, whose 512-bit FMA pipes double the
AVX2 peak, ResNet-18 1 thread 24.4 -> 14.0 ms (0.87x the best fp32 peer) against the
register-blocked kernel, and 8-lane (ymm) vectors at v4 ran the layers 1.7-1.9x slower.
Measured on Zen 4 (AVX2, 1 thread, against ORT's NCHWc convolution, same process, the
register-blocked kernel before it in parentheses): ResNet-18's 3x3 convolutions 0.94-1.01x
(1.06-1.21x), its 7x7 stride-2 stem 0.98x (1.20x).

bf16 pairs (``pairs``: ``--precision bf16`` where every target is x86-64-v4+bf16, planes of
at most ``CompileOptions.bf16_oc_pixels``, weights packed by ``ops.layout.pack_oc_pairs``): the
same bands, row groups, tiles and transposes, with a reduction unit of an input-channel pair:
the band's planes hold pair words (``bf16conv.pair_words``: vcvtne2ps2bf16 of channels 2j and
2j + 1, interleaved; made by the copy even without padding), each step broadcasts a pixel's
word against the block's 2 vectors of 16 output channels' weight pairs in ``vdpbf16ps``
(``bf16dot.dot_words``; static shapes, 16 lanes only). Per pair and tap in order, as
bf16conv.py's kernel: tests/kernels/test_bf16_dot_v4.py's model holds for both. Unlike
bf16conv.py's pixels on the lanes it computes no padding column and no rounding to 16 pixels
(7x7 planes: 64 lanes for 49 pixels); a row group's rest runs half a tile before single pixels.
With ``tap_pairs`` (few, odd input channels: C = 3 stems; weights ``ops.layout.
pack_oc_tap_pairs``) a step pairs a window row's taps kx and kx + 1 of one channel instead of
two channels: plane c holds per padded column the word (x[col], x[col + 1]), and a pixel's
step reads the word at its column + 2t (a 7x7 window: 4 pairs per row, the last against a zero
weight; 3 x 28 steps for C = 3 where channel pairs take 2 x 49). Per channel, window
row and tap pair in order, the odd tap's product first (test_bf16_dot_v4.py's tap model).
With ``winograd`` and ``pairs`` (``CompileOptions.bf16_winograd``; weights ``ops.layout.
pack_wino_pairs``) the Winograd path below copies its band as float32, transforms each
channel's blocks in float32 and stores V as pair words of two channels (``_wino_input_pairs``),
and its products are vdpbf16ps over channel pairs (test_bf16_winograd.py models it exactly).

Run-time image sizes (a model exported with open height and width): the same kernels, with the
plan's size-dependent part (bands, row groups, Winograd tile counts, the padded row width)
computed from the sizes at the kernel's entry (``_runtime_geometry``) by the static plan's
rules, a band at least one output row; the remainder tiles and the last vector of an output
row handled at run time (that vector's epilogue masked); the workspace a size expression that
bounds every region (``_open_geometry``), the same for every vector width of a bundle. A tile
whose pixels lie in one output row reads them from one base pointer, as the static kernel does
(``_tile_steps``' ``row_base``), its (row, column) carried from tile to tile; a tile that wraps
into the next row keeps a pointer per pixel. The band copy writes whole padded rows from
masked loads (``_copy_open_band``).
"""

from __future__ import annotations

from llvmlite import ir

from .contraction import geometry
from .contraction.emitter import load_weights
from .depthwise.static import PADDED_BELOW_VL, DepthwiseEmitter, emit_epilogue
from .contraction.match import Contraction, match_contraction
from .bf16conv import pair_words
from .bf16dot import dot_words
from .helpers import (F32, I1, I32, I64, alloca_once, const_i64, for_range, intrinsic,
                      shared_constant)
from .lower import KernelInfo
from ..ir.graph import PrimFunc
from .threads import DEFAULTS, SplitThresholds, balanced

OC_BLOCK = 32
REGISTERS = 16
# AVX-512 (16 lanes) has 32 vector registers: a block's 2 weight vectors times up to
# MAX_TILE_ROWS_32 pixels of accumulators (the pixels' broadcasts folded into the FMAs).
REGISTERS_32 = 32
MAX_TILE_ROWS = 8
MAX_TILE_ROWS_32 = 8
# AVX-512, a block of one channel vector (16 output channels, or a last block of 16) in the
# direct kernel at column stride 1 with at least ONE_VECTOR_MIN_STEPS reduction steps (input
# channels x taps): 16 pixels of accumulators (8 left 23 of 32 registers idle), a group's rest
# half a tile, then pixel by pixel. Kernel min, 1 thread, 8 -> 16 pixels: conv3d's folded 3 ->
# 16 (81 steps) 420 -> 383 us, 16 -> 16 3x3 on 80x80 (YOLOv8n, YOLOX) 0.96-0.97, U-Net's 32 ->
# 16 and 16 -> 16 on 128x128 0.95-0.96, EfficientNet-B0's last blocks of 16 (1x1s from 480 and
# 672 channels) 0.99-1.01; slower, so kept at 8: C = 3 stems (27 steps; U-Net's 3x3 on 128x128
# 1.03, the stride-2 stems of PP-LCNet and MobileNetV3 1.02-1.07).
ONE_VECTOR_TILE_ROWS = 16
ONE_VECTOR_MIN_STEPS = 64
# AVX-512, fp32: a row group's pixels past its whole 8-pixel tiles run half a tile (4 pixels, 8
# accumulators: enough chains for both FMA pipes) before single pixels (2 accumulators: the
# FMA latency bounds them at a quarter of the tile's rate).
REST_HALF_TILE = True
# ... and (static image sizes) the row groups' height chosen for the fewest such pixels
# (``_group_rows``): a single pixel costs about this many pixels of a tile, a group this many.
SINGLE_PIXEL_COST = 4
GROUP_COST = 8
# Weight vectors per register tile (16 registers: 4 x 3 pixels of accumulators); a block's
# vectors past it (4-lane targets: 8 per block) are computed in passes of up to this many.
MAX_TILE_VECTORS = 4
# A block's whole passes (4-lane vectors: 2 of 4 per block) run as a loop over the passes, not
# as a copy of the tile code each (``_pass_loops``): the x86-64-v2 variant's channel-lane
# kernels halve their tile code (yolo11n_seg_nms's v2 compile 8.7 -> 7.7 CPU-s, kernels alone;
# v3 and v4 objects byte-identical; docs/performance.md, "Export time, round thirteen").
PASS_LOOP = True
# The static Winograd kernel's two output rows (a 2x2 tile's) as a loop of 2, as the run-time
# size kernel has them: one copy of the row's fused epilogue, not two (a SiLU was ~30 % of the
# optimized kernel; yolo11n_seg_nms's 17 Winograd kernels 0.3 CPU-s less per level, speed
# level at v3 and v4: docs/performance.md, "Export time, round thirteen").
WINO_ROW_LOOP = True
MAX_TASK_REGIONS = 8
# Reduction steps (input channels x taps) per chunk: a block's weights for a chunk (32 x 144
# floats, 18 KB: 16 channels of a 3x3 window) stay in L1 over the group's tiles, and the
# partial sums' loads and stores are few beside its multiply-adds (vit_saliency's 1x2 windows
# with chunks of 8 channels, 16 steps: 0.9x the register-blocked kernel's speed; 72 steps
# against 144, 1 thread: 3x3 64->64 56^2 1.011 / 0.994, 256->256 14^2 0.972 / 0.965, crnn's
# 128->128 8x32 min 0.999 / 0.961 of ORT's time, the rest within 1 %).
CHUNK_STEPS = 144
# Windows of up to this many taps are unrolled in the reduction loop; past it (5x5, 7x7) the
# window's rows are a loop: LLVM's scheduler hoists the next taps' loads across a long unrolled
# run and spills (ResNet's 7x7 stem: 367 stack accesses per 588 multiply-adds).
UNROLLED_TAPS = 9
# At 16 lanes, static sizes, windows past UNROLLED_TAPS (7x7 stems): where every tile lies in
# one output row, its pixels read from one base (``_tile_steps``' ``row_base``: the taps'
# broadcasts through opaque pointers where they do not fit the registers). With a pointer per
# pixel LLVM shared the broadcasts across taps and spilled (ResNet's 3 -> 64 7x7 stride-2 stem:
# 12 stack accesses per 112 multiply-adds; now none), kernel CPU min 0.97-0.98x. 3x3 windows
# keep a pointer per pixel (32 -> 64 stride 2 on 80x80: 1.12x with one base).
STATIC_ONE_ROW = True
# At 16 lanes, a strided 1x1 without padding: the band copy keeps only the pixels the
# convolution reads (``_copy_band_subsampled``), the tiles read it at stride 1, not the input
# in place at stride 2 (each tile's broadcasts then a cache line per input channel, the layer
# reading 4x the input it uses). Kernel CPU min, 1 thread, Zen 5: ResNet-50's 256 -> 512 on
# 56x56 1003 -> 859 us, 512 -> 1024 on 28x28 890 -> 853, 1024 -> 2048 on 14x14 1018 -> 897.
SUBSAMPLE_1X1 = True
# At 16 lanes, fp32, static sizes, a 1x1 whose row groups all hold a multiple of 7 pixels and
# where the 8-pixel tile leaves single pixels (``_group_cost``): tiles of 7 pixels (14
# accumulators, still enough chains for both FMA pipes), no rest. On 7x7 planes (49 pixels:
# six 8-pixel tiles and a pixel on 2 accumulators, FMA-latency bound at a quarter of the rate,
# about 52 pixels' time): ResNet-50's 512 -> 2048, 2048 -> 512 and 1024 -> 2048 stride 2.
SEVEN_PIXEL_1X1 = True
# At 16 lanes, fp32, static sizes, a 1x1 whose epilogue reads an output-shaped operand (a
# residual): each output row of a block, once stored, prefetches the same row of the next
# block's 32 channels, of the output (for writing) and of those operands, a line per 16
# floats (the next work item, blocks innermost; 32 rows a plane apart, more streams than the
# hardware prefetcher follows).
PREFETCH_NEXT_BLOCK_1X1 = True
# At 16 lanes (static sizes, fp32, windows wider than 1x1): a row group's pixels as tiles of 8
# and of 7 pixels (14 accumulators: still enough chains for both FMA pipes), not 8-pixel tiles
# and a rest of a half tile and single pixels (a single pixel's 2 accumulator chains run at a
# quarter of the tile's rate): a 7x7 plane 7 tiles of 7, not 6 tiles and a single pixel; a
# group of 98 pixels (14x14 planes in 2 bands) 7 + 6 tiles, not 12 and 2 single pixels. The
# same sums in the same order per pixel. Kernel CPU min, 1 thread, Zen 5, alone: ResNet's
# 256 -> 512 3x3 s2 on 7x7 463 -> 419 us, 512 -> 512 s2 on 7x7 940 -> 841, 512 -> 512 s1 on
# 7x7 885 -> 824, 128 -> 256 s2 on 14x14 447 -> 424, YOLOv8n's 128 -> 128 s2 on 10x10 122 -> 111.
SHORT_TILES = True
# At 16 lanes (static sizes, fp32, windows wider than 1x1, whole blocks of 32 channels), an
# output of at least this many bytes per image: past L2, so its lines come from L3 or memory
# when the epilogue stores into them, each row's stores then waiting on their reads (ResNet's
# 3.2 MB 7x7 stem output, 147 multiply-adds per output value). Each row group's tiles prefetch
# its output lines (``_prefetch_output``: into L1, for reading: a line no other core holds then
# arrives writable), a few per tile over all its chunks. Non-temporal stores instead ran the
# stem as fast but its max pool then read the output from memory (55 -> 146 us). ResNet-18's
# stem in the model, kernel CPU min: 1052 -> 970 us (alone, its output warm in L3: no change).
OUT_PREFETCH_MIN_BYTES = 2 << 20
# The row buffer: output rows accumulated together, at most this many bytes.
ROW_BUFFER_BYTES = 16 * 1024
# A band's copied input rows: at most this many bytes (in L2 for all its blocks).
BAND_BYTES = 256 * 1024
# The row buffer's pixels (ROW_BUFFER_BYTES of 32 channels): a run-time image size's row
# groups take this many pixels' worth of rows (at least one row).
ROW_PIXELS = ROW_BUFFER_BYTES // (OC_BLOCK * 4)
# With a run-time image size, whether the kernel splits over threads is decided for an image of
# this many output pixels (128 x 128, as codegen/contraction/conv_symbolic.py does).
OPEN_IMAGE_PIXELS = 128 * 128
# Work items (image, band, block) the tasks share: at least this many where the output has the
# rows (a 32-channel conv on 40x40 was one item, all of it on one thread).
MIN_ITEMS = 8
# Bands added only to split the items evenly on two threads have at least this many output
# pixels: EfficientNet-B0's 1x1s on 7x7 (up to 1.1 MB of weights) in bands of 4 and 3 rows took
# 2.2x their time on one thread, 2.1x on two, the weights streamed once per band.
BALANCE_BAND_PIXELS = 64
# A static fp32 kernel that reads its input in place (no padding, so no band copies) orders its
# (band, block) items block-major, each task a run of blocks of output channels over every
# band, where they then split more evenly on two threads (``balanced``): MobileNetV2's
# projections on 7x7 (5 blocks in 2 bands of 4 and 3 rows: 20 : 15 rows x blocks -> 18 : 17)
# and on 14x14 (2 blocks in bands of 4, 4, 4 and 2 rows: 8 : 6 -> 7 : 7); each task then also
# reads only its blocks' weights. See docs/performance.md (issue 35, mobilenet_v2 at 2 threads).
BLOCK_MAJOR = True
# Winograd: a band's transformed inputs (16 x C x its tiles) at most this many bytes (in L2
# while every block of output channels reads them); at least this many work items.
WINO_V_BYTES = 256 * 1024
WINO_MIN_ITEMS = 4
# V's planes (one per xi of the 16) whose stride is a multiple of this many bytes get
# WINO_PLANE_PAD more floats each: the input transform stores a vector into each of the 16
# planes per step, and 16 lines a multiple of 2 KB apart share a few L1 sets (and alias at 4
# KB with the loads). Kernel CPU min, 1 thread, Zen 5: 128 -> 128 on 10x10 (planes 40 KB apart)
# 94 -> 75 us, 64 -> 64 on 20x20 86 -> 71, 32 -> 32 on 40x40 116 -> 83, 64 -> 64 on 40x40
# 331 -> 270. (M's planes padded the same way: no change measured.)
# Choosing a Winograd layer's bands and groups for two threads (``_wino_split_plan``): a
# padded tile's input transform per input channel costs about this many multiply-adds of the
# products (128 -> 128 on 10x10: copy and transform 12.5 of 75 us), a tile left over from the
# register tiles this many times a tiled one; a plan is taken for a two-thread share smaller by
# more than WINO_SPLIT_GAIN, its one-thread cost at most WINO_ONE_THREAD_SLACK more.
WINO_TRANSFORM_COST = 8
WINO_SINGLE_TILE_COST = 2.5
WINO_SPLIT_GAIN = 0.03
WINO_ONE_THREAD_SLACK = 0.02
WINO_ALIAS_BYTES = 2048
WINO_PLANE_PAD = 16
WINO_UNROLL = 4      # input channels per iteration of the products' reduction loop
# Items per band (its blocks of output channels split in this many runs): on 2 threads
# ResNet-18's 14x14 layers (7 tile rows: 4 bands, 2 + 2 against 2 + 1 rows) 1.10 -> 0.95 ms,
# its 28x28 ones 0.93 -> 0.85 ms; 1 thread unchanged.
WINO_GROUPS = 2
# Bands are made tall enough that all of them together read the transformed weights at most
# this many bytes (512 -> 512 on 14x14, 16.8 MB of them: 7 bands of one tile row 1.05x ORT's
# time, one band of 7 0.71x; on 7x7 1.63x -> 0.95x), whatever WINO_V_BYTES says.
WINO_U_TRAFFIC = 8 << 20
# At 16 lanes, where the transformed weights pass L2 (geometry.L2_REUSE_BYTES), a band takes at
# least this many tiles: a band of one tile row of a small image (10x10: 5 tiles) read all of
# them from L3 for 5 tiles' products (YOLOv8n 320's 256 -> 64 head conv on 10x10, 1 MB of
# them, 5 bands: 230 us, OpenVINO 115).
WINO_MIN_BAND_TILES = 24
# Weights past L2 stream from L3 or memory once per band: each chunk's (18 KB) arrive at the
# first tile that reads them, faster than the hardware prefetcher brings them (ResNet-18's
# 512 -> 512 3x3 on 7x7, 9.4 MB of weights read by 49 pixels: 2.89 -> 2.49 ms, 80 -> 93
# GFLOP/s, 1 thread, AVX2 host). So the tiles of a chunk prefetch the next one's weights
# (``_prefetch_lines``) into L2, a few lines per reduction step, where the weights pass
# PREFETCH_MIN_WEIGHT_BYTES (below, no gain measured: 128 -> 256 3x3 s2 on 28x28, the stem).
PREFETCH_MIN_WEIGHT_BYTES = geometry.L2_REUSE_BYTES
PREFETCH_LINES_MAX = 4
# ... a 1x1 at 16 lanes (fp32, static sizes) past this many bytes of weights: in a network
# they arrive cold from L3 or memory, and on a small plane each block's weights are read by
# one row group only, so its tiles wait for every chunk's (YOLOv8n 320's 512 -> 256 on 10x10,
# 512 KB of weights, 1 thread, kernel CPU min in the network: 120 -> 106 us; 384 -> 128 on
# 20x20 168 -> 159 us).
PREFETCH_MIN_WEIGHT_BYTES_1X1 = 32 * 1024
OPEN_PREFETCH_PIXELS = 32
# A run-time image size with few input channels (see ``_open_geometry``).
OPEN_BAND_ROWS = 8
OPEN_WIDE_ROW = 1024


def packs_conv_weights(targets) -> bool:
    """Whether the export packs convolution weights for ``targets`` (passes/layout.py): x86
    targets with 8-lane (AVX2) or 16-lane (AVX-512: 2 zmm weight vectors per block, 32
    registers) vectors, where the kernel is measured, with or without the 4-lane (SSE) levels
    of a portable bundle; not on aarch64, where the register-blocked kernel stays (tuned there,
    this kernel not measured)."""
    widths = {geometry.vector_width(t.name) for t in targets}
    return (bool(targets) and all(t.arch == "x86_64" for t in targets)
            and bool(widths & {8, 16}) and widths <= {4, 8, 16})


def match_conv_oc(func: PrimFunc) -> Contraction | None:
    """The ``nn.conv2d_oc`` ``func`` computes (one float32 output whose expression holds the
    tagged reduction once), else None."""
    return match_contraction(func, kinds=("conv2d_oc",))


class ChannelLaneConvEmitter(DepthwiseEmitter):
    """Emits a matched ``nn.conv2d_oc``; shares the depthwise kernel's epilogue store."""

    plans_conv = False
    block_major = False   # the static plan's item order (``BLOCK_MAJOR``)
    tile_32 = MAX_TILE_ROWS_32   # pixels per 16-lane tile of a 2-vector block (``_tile_1x1``)

    def emit(self) -> KernelInfo:
        self._geometry()
        params = self.func.inputs + self.func.outputs
        workspace = self.task_regions * self.region_floats * 4
        # a run-time batch: one image's work decides; a run-time image size: a 128 x 128 one
        if self.open_image:
            image_macs = self.o * self.k * OPEN_IMAGE_PIXELS
        else:
            image_macs = self._macs() if not self.symbolic else \
                self.o * self.oh * self.ow * self.k
        body_fn, ptr_types = self._begin_body(params, workspace=True)
        n_ptrs = len(ptr_types)
        ws = body_fn.args[len(params)]
        if self.open_image:
            self._runtime_geometry()
        self._emit_tasks(ws, body_fn.args[n_ptrs], body_fn.args[n_ptrs + 1])
        self.builder.ret_void()
        self._emit_entry(body_fn, n_ptrs, ptr_types)
        if self.symbolic:
            return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), 0,
                              image_macs >= self.options.parallel_min_macs, symbolic=True,
                              workspace_expr=workspace, choice=self.choice())
        return KernelInfo(self.symbol, len(self.func.inputs), len(self.func.outputs), workspace,
                          image_macs >= self.options.parallel_min_macs, choice=self.choice())

    def choice(self) -> str:
        """The design, in words (``KernelInfo.choice``, shown by ``mlcpack inspect``)."""
        nv = min(MAX_TILE_VECTORS, OC_BLOCK // self.vl)
        mr = self._tile_rows(nv)
        if self.wino and self.open_image:
            return (f"channel-lane Winograd F(2x2, 3x3): {mr} tiles x {nv * self.vl} channels "
                    "register tile, bands planned at run time")
        if self.wino:
            pairs = ", bf16 pairs (vdpbf16ps)" if self.pairs else ""
            return (f"channel-lane Winograd F(2x2, 3x3){pairs}: {mr} tiles x {nv * self.vl} "
                    f"channels register tile, {self.nbands} band(s)")
        prefetch = ", next weights prefetched" if self._prefetch_lines(mr) else ""
        sizes = ", bands and row groups planned at run time" if self.open_image else ""
        if self.subsample:
            sizes = ", strided input subsampled by the band copy"
        if self.tap_pairs:
            return (f"channel-lane direct, bf16 tap pairs (vdpbf16ps): {mr} pixels x "
                    f"{nv * self.vl} channels register tile, chunks of {self.chunk} input "
                    f"channels{prefetch}")
        if self.pairs:
            words = "".join(s for s, on in ((", pair-word input", self.pairs_in),
                                            (", pair-word output", self.pairs_out is not None))
                            if on)
            return (f"channel-lane direct, bf16 pairs (vdpbf16ps): {mr} pixels x "
                    f"{nv * self.vl} channels register tile, chunks of {self.chunk} input "
                    f"channel pairs{prefetch}{words}")
        if self.next_block_prefetch:
            prefetch += ", next block's output rows prefetched"
        return (f"channel-lane direct: {mr} pixels x {nv * self.vl} channels register tile, "
                f"chunks of {self.chunk} input channels{prefetch}{sizes}")

    # ---- plan -----------------------------------------------------------------------------------

    def _geometry(self) -> None:
        x, wp = self.match.tag.operands
        attrs = self.match.tag.attrs
        assert self.vl in (4, 8, 16), "nn.conv2d_oc is packed for 4-, 8- and 16-lane targets"
        self.tile_32 = MAX_TILE_ROWS_32   # pixels per 16-lane tile of a 2-vector block
        self.next_block_prefetch = []     # (tensor, for writing) of _prefetch_next_block
        self.n, self.c, self.h, self.w = x.shape   # n: an int, or a run-time batch
        self.o = attrs["out_channels"]
        self.kh, self.kw = attrs["kernel"]
        _, _, self.oh, self.ow = self.match.out.shape
        self.sh, self.sw = attrs["strides"]
        self.pt, self.pl, pb, pr = attrs["padding"]
        self.vector_epilogue = self._vector_epilogue_ok()
        self.nblocks = wp.shape[0]
        self.k = self.c * self.kh * self.kw
        # bf16 pairs (``pairs``): the planes hold pair words, made by the copy even unpadded
        self.pairs = bool(attrs.get("pairs"))
        self.cp = -(-self.c // 2)
        # Winograd's reduction units per transform position: input channels, or (bf16 pairs)
        # channel pairs, the transformed inputs held as pair words
        self.wunits = self.cp if self.pairs else self.c
        # tap pairs (``tap_pairs``, with ``pairs``): a window row's taps kx, kx + 1 paired, the
        # planes one per channel holding the words (x[col], x[col + 1]); ``kws`` reduction steps
        # per window row, ``kx_step`` columns apart
        self.tap_pairs = bool(attrs.get("tap_pairs"))
        self.kws = -(-self.kw // 2) if self.tap_pairs else self.kw
        self.kx_step = 2 if self.tap_pairs else 1
        self.copy = any(attrs["padding"]) or self.pairs
        # bf16 pair words in and out (passes/bf16_pairs.py): the input already holds the words
        # the band copy would make (zero-padded: no copy), the output is written as the words
        # (padded by ``pairs_out``) that the next bf16 convolution reads
        self.pairs_in = bool(self.func.attrs.get("bf16_pairs_in"))
        # the words' padding: the convolution's own, or (a tensor other readers read too) a
        # larger one, read from its offset (the padded words past the own padding not read)
        words_pad = self.func.attrs.get("bf16_pairs_in")
        self.words_pad = tuple(words_pad) if isinstance(words_pad, (tuple, list)) \
            else (self.pt, self.pl, pb, pr)
        self.pairs_out = self.func.attrs.get("bf16_pairs_out")
        # epilogue operands (a residual) held as pair words, by padding
        self.pair_word_reads = {self.func.inputs[i].uid: tuple(pad)
                                for i, pad in self.func.attrs.get("bf16_pairs_read", ())}
        if self.pair_word_reads and not self.vector_epilogue:
            raise ValueError("a pair-word residual needs the vector epilogue")
        if self.pairs_in:
            assert self.pairs and not self.tap_pairs, "pair-word input needs channel pairs"
            self.copy = False
        self.open_image = not all(isinstance(d, int) for d in (self.h, self.w, self.oh, self.ow))
        self.subsample = None   # (sh, sw) of a strided 1x1 the band copy subsamples
        if self.open_image:
            self._open_geometry(pr)
            return
        # a strided 1x1 without padding at 16 lanes (SUBSAMPLE_1X1): the band copy keeps only
        # the pixels it reads (every sh-th row's every sw-th column), the tiles then read the
        # copy at stride 1
        if (SUBSAMPLE_1X1 and (self.kh, self.kw) == (1, 1) and (self.sh, self.sw) != (1, 1)
                and not any(attrs["padding"]) and not self.pairs and self.vl == 16):
            self.subsample = (self.sh, self.sw)
            self.copy = True
            self.sh = self.sw = 1
        # padded planes: the rows and columns the windows reach, zeros outside the image
        self.wpc = max(self.w + self.pl + pr, (self.ow - 1) * self.sw + self.kw) \
            if self.copy else self.w
        if self.subsample:
            self.wpc = self.ow
        rows_for = lambda r: (r - 1) * self.sh + self.kh   # noqa: E731 - input rows of r rows
        self.rows = max(1, min(self.oh, ROW_BUFFER_BYTES // (self.ow * OC_BLOCK * 4)))
        # bands of equal heights (tasks take equal runs of them), at least MIN_ITEMS items
        band = self.oh
        while self.copy and band > self.rows and \
                4 * self.c * rows_for(band) * self.wpc > BAND_BYTES:
            band -= 1
        nbands = -(-self.oh // band)
        images = self.n if isinstance(self.n, int) else 1
        nbands = max(nbands, min(self.oh, -(-MIN_ITEMS // (images * self.nblocks))))
        # more bands where the items then split more evenly on two threads (PP-OCRv4's 480
        # channels on 6x80: 15 items, one thread's share 8 of them; in 2 bands 15 of 30), of
        # at least BALANCE_BAND_PIXELS (every band streams all the weights again)
        nbands = balanced([nbands] + [nb for nb in range(nbands + 1, min(self.oh, 4 * nbands) + 1)
                                      if -(-self.oh // nb) * self.ow >= BALANCE_BAND_PIXELS],
                          lambda nb: self._items_work(images, nb))
        self.band = -(-self.oh // nbands)
        self.nbands = -(-self.oh // self.band)
        # items block-major (each task a run of blocks, every band of them) where the input
        # is read in place and that splits more evenly on two threads (see BLOCK_MAJOR)
        self.block_major = (BLOCK_MAJOR and not self.copy and self.nbands > 1
                            and not self.pairs and x.dtype == "float32"
                            and self.match.tag.operands[1].dtype == "float32"
                            and balanced([False, True], lambda bm: self._items_work(
                                images, self.nbands, bm)))
        self.rows = self._group_rows(self.rows)
        self.band_in = rows_for(self.band) if self.copy else self.h
        self.plane_floats = self.band_in * self.wpc if self.copy else self.h * self.w
        self.image_elems = self.c * self.h * self.w
        if self.pairs_in:   # the input as the padded pair words, read in place
            wpt, wpl, wpb, wpr = self.words_pad
            self.wpc = self.w + wpl + wpr
            self.band_in = self.h + wpt + wpb
            self.plane_floats = self.band_in * self.wpc
            self.image_elems = self.cp * self.plane_floats
            # the own padding's first row and column within the words' planes
            self.words_origin = (wpt - self.pt) * self.wpc + (wpl - self.pl)
        plane_region = self.c * self.plane_floats + 16 if self.copy else 0
        # the last row's last transpose reads up to vl - 1 pixels past the group's end
        self.rowbuf_floats = (self.rows * self.ow + max(8, self.vl)) * OC_BLOCK
        self.region_floats = -(-(plane_region + self.rowbuf_floats) // 16) * 16
        self.plane_region = plane_region
        # the reduction's units: input channels, or (pairs) channel pairs
        self.units = self.cp if self.pairs and not self.tap_pairs else self.c
        self.chunk = min(self.units, max(1, CHUNK_STEPS // (self.kh * self.kws)))
        self.task_regions = MAX_TASK_REGIONS
        self.wino = bool(attrs.get("winograd"))
        self.bf16 = self.match.tag.operands[1].dtype == "bfloat16"   # --precision bf16
        self.tile_32 = self._tile_1x1()
        self.next_block_prefetch = self._next_block_operands()
        if self.wino:
            self._wino_geometry(pr)

    def _group_rows(self, most: int) -> int:
        """Output rows per row group, at most ``most``: at 16 lanes in fp32 (8-pixel tiles,
        REST_HALF_TILE) the height whose groups leave the fewest pixels past whole tiles,
        weighted by what they cost (a 4-pixel half tile about 4 pixels' time, a single pixel
        about 4; GROUP_COST pixels a group), the tallest of equals. PP-LCNet's 14x14 planes:
        groups of 8 and 6 rows (112 and 84 pixels: 24 tiles and a half tile) instead of 9 and 5
        (126 and 70: 23 tiles, 2 half tiles and 4 single pixels). With SHORT_TILES a group
        whose pixels are whole tiles of 8 and 7 costs its pixels."""
        if not (REST_HALF_TILE and self.vl == 16 and not self.pairs and self.o >= OC_BLOCK
                and not self.match.tag.attrs.get("winograd")
                and self._tile_rows(OC_BLOCK // 16) == MAX_TILE_ROWS_32):
            return most
        mr, half = MAX_TILE_ROWS_32, MAX_TILE_ROWS_32 // 2
        heights = [min(self.band, self.oh - y) for y in range(0, self.oh, self.band)]
        short = self._short_tiles(mr)

        def cost(rows: int) -> int:
            total = 0
            for h in heights:
                for y in range(0, h, rows):
                    n = min(rows, h - y) * self.ow
                    left = n % mr
                    if short and left and (mr - left) * (mr - 1) <= n:
                        total += n + GROUP_COST   # whole tiles of mr and mr - 1 (SHORT_TILES)
                        continue
                    total += n - left + GROUP_COST + (half if left >= half else 0) + \
                        SINGLE_PIXEL_COST * (left - half if left >= half else left)
            return total

        return min(range(most, 0, -1), key=cost)

    def _group_pixels(self) -> list[int]:
        """The pixels of every row group of the static plan (bands of ``band`` rows, groups of
        ``rows``)."""
        heights = [min(self.band, self.oh - y) for y in range(0, self.oh, self.band)]
        return [min(self.rows, h - y) * self.ow for h in heights for y in range(0, h, self.rows)]

    def _tile_1x1(self) -> int:
        """Pixels per 16-lane register tile of a 2-vector block (MAX_TILE_ROWS_32, or 7 where
        SEVEN_PIXEL_1X1 takes the layer: a static fp32 1x1 whose row groups are whole 7-pixel
        tiles and cost less so than in 8-pixel ones, ``_group_cost``)."""
        if not (SEVEN_PIXEL_1X1 and self.vl == 16 and (self.kh, self.kw) == (1, 1)
                and not (self.pairs or self.bf16 or self.wino or self.open_image)
                and self.o >= OC_BLOCK and self._tile_rows(OC_BLOCK // 16) == MAX_TILE_ROWS_32):
            return MAX_TILE_ROWS_32
        groups = self._group_pixels()
        if any(n % 7 for n in groups) or \
                sum(map(self._group_cost, groups)) <= sum(groups):
            return MAX_TILE_ROWS_32
        return 7

    def _next_block_operands(self) -> list:
        """(tensor, 1 for writing / 0 for reading) whose rows ``_prefetch_next_block``
        prefetches (PREFETCH_NEXT_BLOCK_1X1): the output and every output-shaped epilogue
        operand, where there is one (a residual); else none."""
        from ..ir import te

        if not (PREFETCH_NEXT_BLOCK_1X1 and self.vl == 16 and (self.kh, self.kw) == (1, 1)
                and not (self.pairs or self.bf16 or self.open_image or self.block_major)
                and self.pairs_out is None and self.vector_epilogue and self.nblocks > 1):
            return []
        out = self.match.out
        found, seen = [(out, 1)], {out.uid}
        for e in te.reads(self.match.body):
            if (e.tensor.uid not in seen and len(e.indices) == len(out.axes)
                    and all(i is a for i, a in zip(e.indices, out.axes))):
                seen.add(e.tensor.uid)
                found.append((e.tensor, 0))
        return found if len(found) > 1 else []

    def _prefetch_next_block(self, nb, blk, oy) -> None:
        """Prefetch output row ``oy`` of block ``blk`` + 1's channels in every tensor of
        ``next_block_prefetch`` (the next item's rows; past the last block the lines lie past
        the channels, and a prefetch does not fault)."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        cols = sorted({*range(0, self.ow, 16), self.ow - 1})
        with for_range(b, const_i64(0), const_i64(OC_BLOCK), "pfc") as ch:
            oc = b.add(b.mul(b.add(blk, const_i64(1)), const_i64(OC_BLOCK)), ch)
            for t, rw in self.next_block_prefetch:
                for col in cols:
                    ptr = b.gep(self.buffers[t.uid],
                                [self._offset(t, [nb, oc, oy, const_i64(col)])])
                    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, rw), ir.Constant(I32, 2),
                                ir.Constant(I32, 1)])

    @staticmethod
    def _group_cost(n: int) -> int:
        """A row group of ``n`` pixels in 8-pixel tiles, in pixels' time: whole tiles, half a
        tile (REST_HALF_TILE), single pixels at SINGLE_PIXEL_COST each."""
        mr, half = MAX_TILE_ROWS_32, MAX_TILE_ROWS_32 // 2
        left = n % mr
        return n - left + (half if left >= half else 0) + \
            SINGLE_PIXEL_COST * (left - half if left >= half else left)

    def _items_work(self, images: int, nbands: int, block_major: bool = False) -> list[int]:
        """Each work item's multiply-adds over output pixels (rows x channels) in item order,
        for ``nbands`` bands of equal heights (the last one shorter), blocks innermost (or
        bands innermost: ``block_major``)."""
        band = -(-self.oh // nbands)
        rows = [min(band, self.oh - y) for y in range(0, self.oh, band)]
        chans = [min(OC_BLOCK, self.o - k) for k in range(0, self.o, OC_BLOCK)]
        if block_major:
            return [r * c for _ in range(images) for c in chans for r in rows]
        return [r * c for _ in range(images) for r in rows for c in chans]

    def _open_geometry(self, pr: int) -> None:
        """The plan's export-time part for a run-time image size (``_runtime_geometry`` makes
        the rest in the kernel): the chunk and the workspace, a bound on every region's
        floats. Bands are cut to BAND_BYTES of copied rows (at least one output row, not a whole
        row group as in the static plan), so a region's planes take at most BAND_BYTES plus
        one output row's window rows, and its row buffer at most ROW_BUFFER_BYTES plus one
        output row (``rows`` output rows of ``ow`` pixels, ``rows * ow`` <= max(ROW_PIXELS,
        ow))."""
        self.wino = bool(self.match.tag.attrs.get("winograd"))
        self.bf16 = self.match.tag.operands[1].dtype == "bfloat16"
        self.chunk = min(self.c, max(1, CHUNK_STEPS // (self.kh * self.kw)))
        self.task_regions = MAX_TASK_REGIONS
        self.wpc = self.w + self.pl + pr if self.copy else self.w
        self.rows = None   # run-time values from here on (_runtime_geometry)
        self.band_rows = None
        if self.wino:
            self._open_wino_geometry()
            return
        plane_bound = BAND_BYTES // 4 + self.c * self.kh * self.wpc + 16 if self.copy else 0
        # few input channels (a C = 3 stem): bands of at most OPEN_BAND_ROWS output rows, and
        # a bound of their rows (below BAND_BYTES' for rows up to OPEN_WIDE_ROW floats wide):
        # the 8 regions of PP-OCRv4's stem took 2.5 MB (its bands are 3 rows: 27 KB of
        # planes), and the kernel ran 1.2-1.3x its fixed-shape time in the model
        self.band_rows = None
        if self.copy and self.c * (OPEN_BAND_ROWS - 1) * self.sh * OPEN_WIDE_ROW <= BAND_BYTES // 4:
            self.band_rows = OPEN_BAND_ROWS
            plane_bound = self.c * ((OPEN_BAND_ROWS - 1) * self.sh + self.kh) * self.wpc + 16
        self.plane_region = plane_bound
        self.rowbuf_floats = (ROW_PIXELS + self.ow + 8) * OC_BLOCK
        self.region_floats = (plane_bound + self.rowbuf_floats + 15) // 16 * 16

    def _open_wino_geometry(self) -> None:
        """``_wino_geometry``'s export-time part for a run-time image size: the workspace bound
        of a region (planes, transformed inputs V, products M, two output rows), the same for
        every vector width up to 16 lanes (a bundle's variants share it). A band's tile rows
        ``band_tr`` times its padded tiles per row ``ntp`` are at most WINO_V_BYTES' worth, or
        one tile row, or the rows that WINO_U_TRAFFIC asks (``_runtime_geometry``)."""
        self.copy = True
        c = self.c
        nt, ntr = (self.ow + 1) // 2, (self.oh + 1) // 2
        ntp = nt + 15
        self.wgroups = WINO_GROUPS if -(-self.o // OC_BLOCK) >= WINO_GROUPS else 1
        u_bytes = 16 * c * self.nblocks * OC_BLOCK * 4
        self.u_rows = max(1, WINO_U_TRAFFIC // u_bytes)   # tile rows per band of U's traffic
        band_tiles = WINO_V_BYTES // (64 * c) + ntp * (ntr // self.u_rows + 2)
        plane = 4 * c * band_tiles + 4 * c * ntr + 4 * c * ntp + 4 * c + 32
        self.region_floats = (plane + 16 * c * band_tiles + 16 * OC_BLOCK * band_tiles
                              + 2 * (2 * nt + 16) * OC_BLOCK + 15) // 16 * 16

    def _runtime_wino_geometry(self) -> None:
        """``_wino_geometry``'s plan, as values computed at the kernel's entry."""
        b, vl = self.builder, self.vl

        lo, hi, ceil_div = self._lo, self._hi, self._ceil_div

        one = const_i64(1)
        self.nt = b.udiv(b.add(self.ow, one), const_i64(2))
        self.ntr = b.udiv(b.add(self.oh, one), const_i64(2))
        self.ntp = b.mul(ceil_div(self.nt, const_i64(vl)), const_i64(vl))
        self.wpc = hi(b.add(b.mul(self.ntp, const_i64(2)), const_i64(2)), self.wpc)
        by_v = hi(b.sdiv(const_i64(WINO_V_BYTES),
                         b.mul(self.ntp, const_i64(16 * self.c * 4))), one)
        images = self.n if isinstance(self.n, int) else 1
        per = const_i64(-(-WINO_MIN_ITEMS // (images * self.wgroups)))
        by_items = ceil_div(self.ntr, lo(self.ntr, per))
        by_u = ceil_div(self.ntr, const_i64(self.u_rows))
        self.band_tr = lo(self.ntr, hi(by_u, lo(by_v, by_items)))
        self.nbands = ceil_div(self.ntr, self.band_tr)
        self.band_in = b.add(b.mul(self.band_tr, const_i64(2)), const_i64(2))
        self.plane_floats = b.mul(self.band_in, self.wpc)
        plane = b.add(b.mul(self.plane_floats, const_i64(self.c)), const_i64(16 + 15))
        self.plane_region = b.mul(b.udiv(plane, const_i64(16)), const_i64(16))
        self.v_xi = b.mul(b.mul(self.band_tr, self.ntp), const_i64(self.c))
        self.v_floats = b.mul(self.v_xi, const_i64(16))
        self.m_tiles = b.mul(self.band_tr, self.nt)
        self.m_floats = b.mul(self.m_tiles, const_i64(16 * OC_BLOCK))
        self.row_len = hi(b.mul(self.nt, const_i64(2)),
                          b.mul(ceil_div(self.ow, const_i64(vl)), const_i64(vl)))

    def _runtime_geometry(self) -> None:
        """The image's sizes and the plan that depends on them as values computed at the
        kernel's entry (``_open_geometry``): the static plan's rules, with bands of at least
        one output row."""
        b = self.builder

        lo, hi, ceil_div = self._lo, self._hi, self._ceil_div

        if self.wino:
            self.h, self.w, self.oh, self.ow, self.wpc, self.region_floats = (
                self._extent(d) for d in (self.h, self.w, self.oh, self.ow, self.wpc,
                                         self.region_floats))
            self._runtime_wino_geometry()
            return
        self.h, self.w, self.oh, self.ow, self.wpc, self.plane_region, self.region_floats = (
            self._extent(d) for d in (self.h, self.w, self.oh, self.ow, self.wpc,
                                     self.plane_region, self.region_floats))
        one = const_i64(1)
        # 16 lanes: the last row's transposes read up to 15 pixels past the group's end, and
        # the workspace (shared by a bundle's variants) leaves ow + 8 (at least 9)
        pixels = ROW_PIXELS - (self.vl if self.vl > 8 else 0)
        self.rows = hi(lo(b.sdiv(const_i64(pixels), self.ow), self.oh), one)
        if self.copy:
            fit = b.sdiv(const_i64(BAND_BYTES // 4), b.mul(self.wpc, const_i64(self.c)))
            band = b.add(b.sdiv(b.sub(fit, const_i64(self.kh)), const_i64(self.sh)), one)
            if self.band_rows is not None:
                band = lo(band, const_i64(self.band_rows))
            band = hi(lo(band, self.oh), one)
        else:
            band = self.oh
        nbands = ceil_div(self.oh, band)
        images = self.n if isinstance(self.n, int) else 1
        nbands = hi(nbands, lo(self.oh, const_i64(-(-MIN_ITEMS // (images * self.nblocks)))))
        self.band = ceil_div(self.oh, nbands)
        self.nbands = ceil_div(self.oh, self.band)
        if self.copy:
            self.band_in = b.add(b.mul(b.sub(self.band, one), const_i64(self.sh)),
                                 const_i64(self.kh))
            self.plane_floats = b.mul(self.band_in, self.wpc)
        else:
            self.band_in = self.h
            self.plane_floats = b.mul(self.h, self.w)

    def _lo(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.builder.select(self.builder.icmp_signed("<", x, y), x, y)

    def _hi(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.builder.select(self.builder.icmp_signed(">", x, y), x, y)

    def _ceil_div(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.builder.sdiv(self.builder.add(x, self.builder.sub(y, const_i64(1))), y)

    def _row_major_steps(self, start: ir.Value, width: ir.Value, count: int,
                         at: tuple | None = None):
        """(row, column) of the ``count`` consecutive row-major positions from ``start`` in
        rows of run-time ``width``: one division for the first (none where ``at`` gives its
        row and column), then a step with a wrap for each next one. A generator: each step is
        emitted just before it is used."""
        b = self.builder
        if at is None:
            r = b.udiv(start, width)
            col = b.sub(start, b.mul(r, width))
        else:
            r, col = at
        for j in range(count):
            if j:
                col = b.add(col, const_i64(1))
                wrap = b.icmp_signed("==", col, width)
                col = b.select(wrap, const_i64(0), col)
                r = b.add(r, b.zext(wrap, I64))
            yield r, col

    def _extent(self, d) -> ir.Value:
        """``d`` (an int, a size expression or a value computed in the kernel) as an i64."""
        if isinstance(d, ir.Value):
            return d
        return const_i64(d) if isinstance(d, int) else self._dim_value(d)

    def _product(self, *dims):
        """The product of ``dims``: folded at export unless one is a value computed in the
        kernel."""
        if not any(isinstance(d, ir.Value) for d in dims):
            out = 1
            for d in dims:
                out = out * d
            return out
        out = None
        for d in dims:
            v = self._extent(d)
            out = v if out is None else self.builder.mul(out, v)
        return out

    def _wino_geometry(self, pr: int) -> None:
        """The Winograd plan (``_emit_tasks_wino``): 2x2 output tiles, nt per tile row (ntp
        rounded up to whole vectors in the transformed inputs' rows), ntr tile rows; bands of
        ``band_tr`` tile rows: their transformed inputs within WINO_V_BYTES and at least
        WINO_MIN_ITEMS items, unless the bands would then read the transformed weights more
        than WINO_U_TRAFFIC bytes in all (then taller)."""
        vl = self.vl
        self.nt, self.ntr = -(-self.ow // 2), -(-self.oh // 2)
        self.ntp = -(-self.nt // vl) * vl
        self.copy = True
        self.wpc = max(2 * self.ntp + 2, self.w + self.pl + pr)
        per_row = 16 * self.wunits * self.ntp * 4
        # each band's blocks of output channels in WINO_GROUPS items (the tasks' share of a
        # band no longer whole bands only); a task running both copies and transforms it once
        self.wgroups = WINO_GROUPS if -(-self.o // OC_BLOCK) >= WINO_GROUPS else 1
        images = self.n if isinstance(self.n, int) else 1
        by_v = max(1, WINO_V_BYTES // per_row)
        by_items = -(-self.ntr // min(self.ntr, -(-WINO_MIN_ITEMS // (images * self.wgroups))))
        u_bytes = 16 * self.wunits * self.nblocks * OC_BLOCK * 4
        by_u = -(-self.ntr // max(1, WINO_U_TRAFFIC // u_bytes))
        band_tr = min(self.ntr, max(by_u, min(by_v, by_items)))
        if vl >= 16 and u_bytes > geometry.L2_REUSE_BYTES and \
                band_tr * self.nt < WINO_MIN_BAND_TILES:
            # the transformed weights past L2 stream from L3 once per band: bands of at least
            # WINO_MIN_BAND_TILES tiles (see there), as many as have them, an even number
            # where more than one (two threads' shares of equal bands)
            nb = max(1, self.ntr // -(-WINO_MIN_BAND_TILES // self.nt))
            nb -= nb % 2 if nb > 1 else 0
            band_tr = -(-self.ntr // nb)
        if isinstance(self.n, int):
            band_tr, self.wgroups = self._wino_split_plan(band_tr, u_bytes)
        self.band_tr = band_tr
        self.nbands = -(-self.ntr // band_tr)
        # no more task regions than items (one band of a large layer: two, not MAX_TASK_REGIONS)
        if isinstance(self.n, int):
            self.task_regions = min(MAX_TASK_REGIONS, self.n * self.nbands * self.wgroups)
        self.band_in = 2 * band_tr + 2
        self.plane_floats = self.band_in * self.wpc
        self.plane_region = -(-(self.c * self.plane_floats + 16) // 16) * 16
        # V's 16 planes (one per xi) a multiple of WINO_ALIAS_BYTES apart: padded (see there)
        self.v_xi = self.wunits * band_tr * self.ntp
        if (4 * self.v_xi) % WINO_ALIAS_BYTES == 0:
            self.v_xi += WINO_PLANE_PAD
        self.v_floats = 16 * self.v_xi
        self.m_tiles = band_tr * self.nt
        self.m_floats = 16 * self.m_tiles * OC_BLOCK
        self.row_len = max(2 * self.nt, -(-self.ow // vl) * vl)
        self.rowbuf_floats = 2 * self.row_len * OC_BLOCK
        self.region_floats = -(-(self.plane_region + self.v_floats + self.m_floats
                                 + self.rowbuf_floats) // 16) * 16

    def _wino_split_plan(self, band_tr: int, u_bytes: int) -> tuple[int, int]:
        """(tile rows per band, groups per band) for two threads: of the plans whose one-thread
        cost is within WINO_ONE_THREAD_SLACK of the plan ``band_tr`` with ``self.wgroups``
        groups, the one whose two threads' larger share (``_wino_costs``) is the least, if
        it beats that plan's by more than WINO_SPLIT_GAIN. A task transforms each band it
        has items of: two tasks sharing a band's groups both transform it (10x10 images, one
        band in 2 groups), and bands of unequal heights or an odd count split unevenly. The
        other plans keep the transformed inputs within WINO_V_BYTES (twice that at 16 lanes,
        whose hosts have L2 of 1 MB or more) and read the transformed weights no more often
        than the plan does where they pass L2."""
        base = (band_tr, self.wgroups)
        groups = {1, self.wgroups}
        cap = WINO_V_BYTES * (2 if self.vl >= 16 else 1)
        base_bands = -(-self.ntr // band_tr)
        plans = [base]
        for bt in range(1, self.ntr + 1):
            nb = -(-self.ntr // bt)
            if 16 * self.wunits * bt * self.ntp * 4 > max(
                    cap, 16 * self.wunits * band_tr * self.ntp * 4):
                continue
            if u_bytes > geometry.L2_REUSE_BYTES and nb > base_bands:
                continue
            plans += [(bt, g) for g in sorted(groups) if (bt, g) != base]
        costs = {p: self._wino_costs(*p) for p in plans}
        one0, two0 = costs[base]
        ok = [p for p in plans if costs[p][0] <= one0 * (1 + WINO_ONE_THREAD_SLACK)]
        best = min(ok, key=lambda p: (costs[p][1], costs[p][0]))
        return best if costs[best][1] < two0 * (1 - WINO_SPLIT_GAIN) else base

    def _wino_costs(self, band_tr: int, groups: int) -> tuple[float, float]:
        """(one thread's cost, the larger of two threads' shares) of the Winograd plan of
        ``band_tr`` tile rows per band and ``groups`` items per band, in multiply-adds of the
        products: a band's items' products (tiles in register tiles of ``_tile_rows``, the
        rest one tile at a time at WINO_SINGLE_TILE_COST), plus WINO_TRANSFORM_COST per padded
        tile and input channel for each band a task has items of. Two threads: the tasks the
        runtime posts for the kernel's multiply-adds (``runtime.vm.task_count``), each
        thread its home range of them, then the other's (``_two_thread_path``)."""
        from ...runtime.vm import task_count

        mr = self._tile_rows(min(MAX_TILE_VECTORS, OC_BLOCK // self.vl))
        full = self.o // OC_BLOCK
        chans = [OC_BLOCK * ((g + 1) * full // groups - g * full // groups)
                 + (self.o % OC_BLOCK if g == groups - 1 else 0) for g in range(groups)]
        rows = [min(band_tr, self.ntr - y) for y in range(0, self.ntr, band_tr)]
        items = []
        for i in range(self.n):
            for bi, r in enumerate(rows):
                tiles = r * self.nt
                eff = tiles // mr * mr + tiles % mr * WINO_SINGLE_TILE_COST
                for g in range(groups):
                    items.append(((i, bi), eff * chans[g] * self.wunits,
                                  r * self.ntp * self.c * WINO_TRANSFORM_COST))

        def cost(run) -> float:
            seen = {}
            for band, _, t in run:
                seen[band] = t
            return sum(w for _, w, _ in run) + sum(seen.values())

        n = len(items)
        ntasks = task_count(2, self.n * self.o * self.oh * self.ow * self.k, True)
        nt = min(ntasks, MAX_TASK_REGIONS, n)
        tasks = [cost(items[t * n // nt:(t + 1) * n // nt]) for t in range(nt)]
        tasks += [0.0] * (ntasks - nt)
        return cost(items), _two_thread_path(tasks)

    def _tile_rows(self, nv: int) -> int:
        """Pixels per register tile for a block of ``nv`` weight vectors: accumulators, the
        pixels' broadcasts and one weight vector in the registers (AVX-512: 32 registers, the
        broadcasts folded into the multiply-adds as memory operands)."""
        if self.vl == 16 and nv == 1 and self.sw == 1 and not (self.wino or self.pairs) \
                and self.c * self.kh * self.kw >= ONE_VECTOR_MIN_STEPS:
            return ONE_VECTOR_TILE_ROWS
        if self.vl == 16:
            return max(1, min(self.tile_32, (REGISTERS_32 - nv) // nv))
        return max(1, min(MAX_TILE_ROWS, (REGISTERS - 1) // (nv + 1)))

    # ---- emission -------------------------------------------------------------------------------

    def _task_region(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
        """(the tasks that get work: at most ``task_regions``, this task's workspace region)."""
        b = self.builder
        nt = b.select(b.icmp_signed("<", ntasks, const_i64(self.task_regions)), ntasks,
                      const_i64(self.task_regions))
        region = b.gep(b.bitcast(ws, F32.as_pointer()),
                       [b.mul(task, self._extent(self.region_floats))], inbounds=True)
        return nt, region

    def _emit_tasks(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        if self.wino:
            self._emit_tasks_wino(ws, task, ntasks)
            return
        b = self.builder
        nt, region = self._task_region(ws, task, ntasks)
        x_ptr = self.buffers[self.match.tag.operands[0].uid]
        with b.if_then(b.icmp_signed("<", task, nt)):
            self.rowbuf = b.gep(region, [self._extent(self.plane_region)], inbounds=True)
            items = self.n * (self.nbands * self.nblocks) if not self.open_image else \
                self._product(self.n, self.nbands, self.nblocks)
            lo, hi = self._split(items, task, nt)
            copied = alloca_once(b, ir.IntType(64), name="copied_band")
            b.store(const_i64(-1), copied)
            with for_range(b, lo, hi, "item") as item:
                if self.block_major:   # (image, block, band)
                    nb_blk = b.sdiv(item, const_i64(self.nbands))
                    band = b.srem(item, const_i64(self.nbands))
                    nb = b.sdiv(nb_blk, const_i64(self.nblocks))
                    blk = b.srem(nb_blk, const_i64(self.nblocks))
                    nb_band = b.add(b.mul(nb, const_i64(self.nbands)), band)
                else:
                    nb_band = b.sdiv(item, const_i64(self.nblocks))
                    blk = b.srem(item, const_i64(self.nblocks))
                    nb = b.sdiv(nb_band, self._extent(self.nbands))
                    band = b.srem(nb_band, self._extent(self.nbands))
                oy_lo = b.mul(band, self._extent(self.band))
                image = self.image_elems if not self.open_image else \
                    self._product(self.c, self.h, self.w)
                x_img = b.gep(x_ptr, [b.mul(nb, self._extent(image))], inbounds=True)
                if self.copy:
                    with b.if_then(b.icmp_signed("!=", b.load(copied), nb_band)):
                        self._copy_band(x_img, oy_lo, region)
                        b.store(nb_band, copied)
                    planes, row0 = region, oy_lo   # plane row 0 is output row oy_lo's first
                else:
                    planes, row0 = x_img, const_i64(0)
                    if self.pairs_in and self.words_origin:
                        planes = b.gep(x_img, [const_i64(self.words_origin)])
                self._emit_block(nb, blk, oy_lo, planes, row0)

    def _copy_band(self, x_img: ir.Value, oy_lo: ir.Value, region: ir.Value) -> None:
        """The input rows that output rows oy_lo .. oy_lo + band - 1 read, every channel, into
        the region: padded row r at r * wpc (input row oy_lo * sh - pt + r, column ix at
        pl + ix), zeros outside the image."""
        b = self.builder
        if self.pairs and not self.wino:   # (Winograd pairs its transformed inputs)
            self._copy_band_pairs(x_img, oy_lo, region)
            return
        if self.subsample:
            self._copy_band_subsampled(x_img, oy_lo, region)
            return
        memset = intrinsic(self.module, "llvm.memset.p0i8.i64", ir.VoidType(),
                                [ir.IntType(8).as_pointer(), ir.IntType(8), ir.IntType(64), I1])

        def zero(ptr, floats):
            b.call(memset, [b.bitcast(ptr, ir.IntType(8).as_pointer()),
                            ir.Constant(ir.IntType(8), 0), b.mul(floats, const_i64(4)),
                            ir.Constant(I1, 0)])

        top = b.sub(b.mul(oy_lo, const_i64(self.sh)), const_i64(self.pt))
        # the band's rows inside the image: r in [max(0, -top), min(band_in, h - top))
        r_lo = b.select(b.icmp_signed("<", top, const_i64(0)), b.neg(top), const_i64(0))
        r_hi = b.sub(self._extent(self.h), top)
        r_hi = b.select(b.icmp_signed("<", r_hi, self._extent(self.band_in)), r_hi,
                        self._extent(self.band_in))
        zeros = ir.Constant(F32, 0.0)
        if self.open_image and self.vl >= 8:
            self._copy_open_band(x_img, top, r_lo, r_hi, region, zero)
            return
        with for_range(b, const_i64(0), const_i64(self.c), "cpc") as ic:
            src_plane = b.gep(x_img, [b.mul(ic, self._extent(self._product(self.h, self.w)))],
                              inbounds=True)
            dst_plane = b.gep(region, [b.mul(ic, self._extent(self.plane_floats))],
                              inbounds=True)
            # rows above and below the image: zeros; rows inside: their margins zeroed (the
            # rest is copied), not the whole band cleared first
            zero(dst_plane, b.mul(r_lo, self._extent(self.wpc)))
            zero(b.gep(dst_plane, [b.mul(r_hi, self._extent(self.wpc))], inbounds=True),
                 b.mul(b.sub(self._extent(self.band_in), r_hi), self._extent(self.wpc)))
            with for_range(b, r_lo, r_hi, "cpr") as r:
                src = b.gep(src_plane, [b.mul(b.add(top, r), self._extent(self.w))],
                            inbounds=True)
                row = b.gep(dst_plane, [b.mul(r, self._extent(self.wpc))], inbounds=True)
                if self.open_image:   # margins of pl and wpc - w - pl columns
                    for j in range(self.pl):
                        b.store(zeros, b.gep(row, [const_i64(j)], inbounds=True))
                    with for_range(b, b.add(self.w, const_i64(self.pl)), self.wpc, "cpm") as j:
                        b.store(zeros, b.gep(row, [j], inbounds=True))
                    self._copy_floats(src, b.gep(row, [const_i64(self.pl)], inbounds=True),
                                      self.w)
                else:
                    for j in list(range(self.pl)) + list(range(self.pl + self.w, self.wpc)):
                        b.store(zeros, b.gep(row, [const_i64(j)], inbounds=True))
                    self._copy_run(src, 0, row, self.pl, self.w)

    def _copy_open_band(self, x_img: ir.Value, top: ir.Value, r_lo: ir.Value, r_hi: ir.Value,
                        region: ir.Value, zero) -> None:
        """``_copy_band`` for a run-time image size at 8 or 16 lanes: each padded row written
        as whole vectors from masked loads of the input row (its margins the masked-off lanes'
        zeros; a masked lane is not read), the last vector's lanes past the row spilling zeros
        into the next row's start, which is written after it (rows and channels in order; the
        last channel's into the region's 16 floats of slack, ``_open_geometry``); the rows
        above and below the image cleared only where there are any (the rows below after the
        rows inside, over the last one's spill). Not one memset call per channel and scalar
        margin stores per row: the SVTR neck's 960 channels of 1x42 took ~30 us that way."""
        b, vl = self.builder, self.vl
        ivec = ir.VectorType(I32, vl)

        def splat32(x):
            v = b.insert_element(ir.Constant(ivec, None), b.trunc(x, I32), ir.Constant(I32, 0))
            return b.shuffle_vector(v, ir.Constant(ivec, None),
                                    ir.Constant(ir.VectorType(I32, vl), [0] * vl))

        wpc, w, band_in = self.wpc, self.w, self.band_in
        nq = b.udiv(b.add(wpc, const_i64(vl - 1)), const_i64(vl))
        # lane i of vector q reads input column q * vl + i - pl
        first_cols = b.sub(ir.Constant(ivec, list(range(vl))), splat32(const_i64(self.pl)))
        width = splat32(w)
        with for_range(b, const_i64(0), const_i64(self.c), "cpc") as ic:
            src_plane = b.gep(x_img, [b.mul(ic, b.mul(self.h, w))], inbounds=True)
            dst_plane = b.gep(region, [b.mul(ic, self.plane_floats)], inbounds=True)
            with b.if_then(b.icmp_signed(">", r_lo, const_i64(0))):
                zero(dst_plane, b.mul(r_lo, wpc))
            with for_range(b, r_lo, r_hi, "cpr") as r:
                src = b.gep(src_plane, [b.mul(b.add(top, r), w)], inbounds=True)
                row = b.gep(dst_plane, [b.mul(r, wpc)], inbounds=True)
                with for_range(b, const_i64(0), nq, "cpq") as q:
                    q0 = b.mul(q, const_i64(vl))
                    cols = b.add(first_cols, splat32(q0))
                    inside = b.icmp_unsigned("<", cols, width)
                    ptr = b.gep(src, [b.sub(q0, const_i64(self.pl))])
                    val = self._masked_load(b.bitcast(ptr, self.vty.as_pointer()), inside)
                    b.store(val, self._vec_ptr(row, q0), align=4)
            with b.if_then(b.icmp_signed("<", r_hi, band_in)):
                zero(b.gep(dst_plane, [b.mul(r_hi, wpc)], inbounds=True),
                     b.mul(b.sub(band_in, r_hi), wpc))

    def _copy_band_subsampled(self, x_img: ir.Value, oy_lo: ir.Value, region: ir.Value
                              ) -> None:
        """``_copy_band`` for ``subsample`` (a strided 1x1, static sizes): plane row r, column
        ox of channel c holds input row (oy_lo + r) * sh, column ox * sw, the band's rows
        inside the output only. At column stride 2, vl columns from two masked loads (lanes
        past the input row not read) and their even lanes; each row's vectors stored whole,
        the last one's lanes past the row spilling into the next row's start (written after
        it) or the region's 16 floats of slack. Other strides: one float at a time."""
        b, vl = self.builder, self.vl
        sh, sw = self.subsample
        rows = b.sub(const_i64(self.oh), oy_lo)
        rows = b.select(b.icmp_signed("<", rows, const_i64(self.band_in)), rows,
                        const_i64(self.band_in))
        even = ir.Constant(ir.VectorType(I32, vl), [2 * j for j in range(vl)])
        with for_range(b, const_i64(0), const_i64(self.c), "cpc") as ic:
            src_plane = b.gep(x_img, [b.mul(ic, const_i64(self.h * self.w))], inbounds=True)
            dst_plane = b.gep(region, [b.mul(ic, const_i64(self.plane_floats))], inbounds=True)
            with for_range(b, const_i64(0), rows, "cpr") as r:
                src = b.gep(src_plane, [b.mul(b.add(oy_lo, r), const_i64(sh * self.w))],
                            inbounds=True)
                dst = b.gep(dst_plane, [b.mul(r, const_i64(self.ow))], inbounds=True)
                for ox in range(self.ow if sw != 2 else 0):
                    b.store(b.load(b.gep(src, [const_i64(ox * sw)], inbounds=True)),
                            b.gep(dst, [const_i64(ox)], inbounds=True))
                for q in range(-(-self.ow // vl) if sw == 2 else 0):
                    halves = []
                    for half in range(2):
                        col0 = 2 * q * vl + half * vl
                        ptr = b.bitcast(b.gep(src, [const_i64(col0)]), self.vty.as_pointer())
                        inside = [col0 + j < self.w for j in range(vl)]
                        halves.append(b.load(ptr, align=4) if all(inside) else
                                      self._masked_load(ptr, ir.Constant(
                                          ir.VectorType(I1, vl), inside)))
                    b.store(b.shuffle_vector(halves[0], halves[1], even),
                            self._vec_ptr(dst, const_i64(q * vl)), align=4)

    def _copy_band_pairs(self, x_img: ir.Value, oy_lo: ir.Value, region: ir.Value) -> None:
        """``_copy_band`` for bf16 pairs: plane j of the region holds, per padded position, the
        32-bit word (bf16(x[2j]), bf16(x[2j + 1])) (bf16conv.pair_words: vcvtne2ps2bf16, the
        even channel in the low half), zeros outside the image and past C; 16 columns at a
        time by masked loads (a masked lane is not read)."""
        b, vl = self.builder, self.vl
        words = b.bitcast(region, I32.as_pointer())
        ivec = ir.VectorType(I32, vl)
        lanes = ir.Constant(ir.VectorType(I64, vl), list(range(vl)))

        def splat64(x):
            v = b.insert_element(ir.Constant(ir.VectorType(I64, vl), None), x,
                                 ir.Constant(I32, 0))
            return b.shuffle_vector(v, ir.Constant(ir.VectorType(I64, vl), None),
                                    ir.Constant(ir.VectorType(I32, vl), [0] * vl))

        def splat1(x):
            v = b.insert_element(ir.Constant(ir.VectorType(I1, vl), None), x,
                                 ir.Constant(I32, 0))
            return b.shuffle_vector(v, ir.Constant(ir.VectorType(I1, vl), None),
                                    ir.Constant(ir.VectorType(I32, vl), [0] * vl))

        store = intrinsic(self.module, f"llvm.masked.store.v{vl}i32.p0", ir.VoidType(),
                          [ivec, ivec.as_pointer(), I32, ir.VectorType(I1, vl)])
        top = b.sub(b.mul(oy_lo, const_i64(self.sh)), const_i64(self.pt))
        # channel pairs: planes of channels (2j, 2j + 1); tap pairs: of channel j at columns
        # (col, col + 1)
        taps = self.tap_pairs
        with for_range(b, const_i64(0), const_i64(self.c if taps else self.cp), "cpj") as j:
            c0 = j if taps else b.mul(j, const_i64(2))
            second = ir.Constant(I1, 1) if taps else \
                b.icmp_signed("<", b.add(c0, const_i64(1)), const_i64(self.c))
            dst_plane = b.gep(words, [b.mul(j, const_i64(self.plane_floats))], inbounds=True)
            with for_range(b, const_i64(0), const_i64(self.band_in), "cpr") as r:
                yy = b.add(top, r)
                row_ok = b.and_(b.icmp_signed(">=", yy, const_i64(0)),
                                b.icmp_signed("<", yy, const_i64(self.h)))
                yyc = b.select(row_ok, yy, const_i64(0))
                # a pair's second channel past C (odd C) reads nothing, from channel c0's
                # row: masked-off lanes on a page never touched (one plane past the input)
                # cost a fault-suppression assist each (Zen 5: the C = 3 stem 1.2 -> 25-80 ms)
                srcs = [b.gep(x_img, [b.add(b.mul(ch, const_i64(self.h * self.w)),
                                             b.mul(yyc, const_i64(self.w)))], inbounds=True)
                        for ch in ((c0, c0) if taps else
                                   (c0, b.select(second, b.add(c0, const_i64(1)), c0)))]
                oks = [row_ok, b.and_(row_ok, second)]
                row = b.gep(dst_plane, [b.mul(r, const_i64(self.wpc))], inbounds=True)
                for q in range(-(-self.wpc // vl)):
                    cols = b.add(splat64(const_i64(q * vl)), lanes)
                    vals = []
                    for half, (src, ok) in enumerate(zip(srcs, oks)):
                        shift = half if taps else 0   # tap pairs: the high half at col + 1
                        ix = b.sub(cols, splat64(const_i64(self.pl - shift)))
                        inside = b.and_(b.icmp_signed(">=", ix, splat64(const_i64(0))),
                                        b.icmp_signed("<", ix, splat64(const_i64(self.w))))
                        # the address may lie before the row: only inside lanes are read
                        ptr = b.gep(src, [const_i64(q * vl - self.pl + shift)])
                        vals.append(self._masked_load(b.bitcast(ptr, self.vty.as_pointer()),
                                                      b.and_(inside, splat1(ok))))
                    pair = pair_words(b, self.module, vals[0], vals[1])
                    keep = b.icmp_signed("<", cols, splat64(const_i64(self.wpc)))
                    b.call(store, [pair, b.bitcast(b.gep(row, [const_i64(q * vl)]),
                                                   ivec.as_pointer()), ir.Constant(I32, 4),
                                   keep])

    def _copy_floats(self, src: ir.Value, dst: ir.Value, count: ir.Value) -> None:
        """``count`` (a run-time value) floats from ``src`` to ``dst``: whole vectors, then one
        at a time."""
        b, vl = self.builder, self.vl
        whole = b.udiv(count, const_i64(vl))
        with for_range(b, const_i64(0), whole, "cpq") as q:
            off = b.mul(q, const_i64(vl))
            b.store(b.load(self._vec_ptr(src, off), align=4), self._vec_ptr(dst, off), align=4)
        with for_range(b, b.mul(whole, const_i64(vl)), count, "cpt") as j:
            b.store(b.load(b.gep(src, [j], inbounds=True)), b.gep(dst, [j], inbounds=True))

    def _emit_block(self, nb, blk, oy_lo, planes, row0) -> None:
        """Block ``blk`` of output channels over the band from output row oy_lo: its full
        blocks of 32 channels, or the last one's whole vectors."""
        b = self.builder
        full = self.o // OC_BLOCK
        last_nv = -(-(self.o % OC_BLOCK) // self.vl)   # its last vector partial: _row_columns
        if not last_nv:
            self._emit_band(nb, blk, oy_lo, planes, row0, OC_BLOCK // self.vl)
            return
        with b.if_else(b.icmp_signed("<", blk, const_i64(full))) as (whole, part):
            with whole:
                if full:
                    self._emit_band(nb, blk, oy_lo, planes, row0, OC_BLOCK // self.vl)
            with part:
                self._emit_band(nb, blk, oy_lo, planes, row0, last_nv)

    def _emit_band(self, nb, blk, oy_lo, planes, row0, nvb: int) -> None:
        """The block's ``nvb`` channel vectors over the band, in passes of at most
        MAX_TILE_VECTORS vectors per register tile."""
        b = self.builder
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        if self.pairs:   # 32-bit pair words, cp * kh * kw steps of OC_BLOCK per block
            w_ptr = b.bitcast(w_ptr, I32.as_pointer())
            wblk = b.gep(w_ptr, [b.mul(blk, const_i64(self.units * self.kh * self.kws
                                                      * OC_BLOCK))], inbounds=True)
        else:
            wblk = b.gep(w_ptr, [b.mul(blk, const_i64(self.k * OC_BLOCK))], inbounds=True)
        band_end = b.add(oy_lo, self._extent(self.band))
        band_end = b.select(b.icmp_signed("<", band_end, self._extent(self.oh)), band_end,
                            self._extent(self.oh))
        if self.open_image:
            ngroups = b.sdiv(b.add(b.sub(band_end, oy_lo), b.sub(self.rows, const_i64(1))),
                             self.rows)
        else:
            ngroups = b.sdiv(b.add(b.sub(band_end, oy_lo), const_i64(self.rows - 1)),
                             const_i64(self.rows))
        passes = [(v0, min(MAX_TILE_VECTORS, nvb - v0))
                  for v0 in range(0, nvb, MAX_TILE_VECTORS)]
        with for_range(b, const_i64(0), ngroups, "grp") as g:
            oy0 = b.add(oy_lo, b.mul(g, self._extent(self.rows)))
            left = b.sub(band_end, oy0)
            nrows = b.select(b.icmp_signed("<", left, self._extent(self.rows)), left,
                             self._extent(self.rows))
            units = self.units if self.pairs else self.c
            nchunks = -(-units // self.chunk)
            with for_range(b, const_i64(0), const_i64(nchunks), "chunk") as cc:
                c0 = b.mul(cc, const_i64(self.chunk))
                c1 = b.add(c0, const_i64(self.chunk))
                if units % self.chunk:
                    c1 = b.select(b.icmp_signed("<", c1, const_i64(units)), c1,
                                  const_i64(units))
                first = b.icmp_signed("==", cc, const_i64(0))
                # the group's pixels, row after row, mr at a time (a tile may span two rows)
                prow0 = b.mul(b.sub(oy0, row0), const_i64(self.sh))
                npix = b.mul(nrows, self._extent(self.ow))
                for v0, nv, wpass in self._pass_loops(passes, wblk):
                    mr = self._tile_rows(nv)
                    short = self._short_tiles(mr)
                    if short:
                        # the group's pixels as whole tiles of mr and of mr - 1 (SHORT_TILES)
                        nshort = b.and_(b.sub(const_i64(mr), b.srem(npix, const_i64(mr))),
                                        const_i64(mr - 1))
                        nshort = b.select(b.icmp_signed(
                            "<=", b.mul(nshort, const_i64(mr - 1)), npix), nshort, const_i64(0))
                        full = b.sdiv(b.sub(npix, b.mul(nshort, const_i64(mr - 1))),
                                      const_i64(mr))
                    else:
                        full = b.sdiv(npix, const_i64(mr))
                    if self.open_image and mr > 1:
                        # the tile's (row, column) carried from tile to tile: no division by
                        # the run-time width per tile, one where a tile wraps
                        at_r = alloca_once(b, I64, name="oc_tile_row")
                        at_c = alloca_once(b, I64, name="oc_tile_col")
                        b.store(const_i64(0), at_r)
                        b.store(const_i64(0), at_c)
                    pfw = self._out_prefetch_lines(mr, nchunks) if v0 == 0 else 0
                    with for_range(b, const_i64(0), full, "tx") as tx:
                        if pfw:
                            self._prefetch_output(nb, blk, oy0, cc, tx, mr, pfw)
                        at = None
                        if self.open_image and mr > 1:
                            at = (b.load(at_r), b.load(at_c))
                        self._tile(planes, prow0, b.mul(tx, const_i64(mr)), mr, v0, nv, wpass,
                                   c0, c1, first, prefetch=tx, at=at)
                        if at is not None:
                            col = b.add(at[1], const_i64(mr))
                            b.store(col, at_c)
                            with b.if_then(b.icmp_unsigned(">=", col, self.ow)):
                                rows = b.udiv(col, self.ow)
                                b.store(b.add(at[0], rows), at_r)
                                b.store(b.sub(col, b.mul(rows, self.ow)), at_c)
                    rest = b.mul(full, const_i64(mr))
                    if short:
                        with for_range(b, const_i64(0), nshort, "ts") as ts:
                            if pfw:
                                self._prefetch_output(nb, blk, oy0, cc, b.add(full, ts), mr,
                                                      pfw)
                            self._tile(planes, prow0, b.add(rest, b.mul(ts, const_i64(mr - 1))),
                                       mr - 1, v0, nv, wpass, c0, c1, first,
                                       prefetch=b.add(full, ts))
                        rest = b.add(rest, b.mul(nshort, const_i64(mr - 1)))
                    # bf16 pairs: half a tile first (a 1-pixel tile is load-bound on
                    # vdpbf16ps); so for ONE_VECTOR_TILE_ROWS (up to 15 pixels left)
                    if (self.pairs and mr >= 4) or mr > MAX_TILE_ROWS_32 or (
                            REST_HALF_TILE and self.vl == 16 and mr == MAX_TILE_ROWS_32):
                        half = mr // 2
                        with b.if_then(b.icmp_signed(">=", b.sub(npix, rest),
                                                     const_i64(half))):
                            self._tile(planes, prow0, rest, half, v0, nv, wpass, c0, c1, first)
                        rest = b.select(b.icmp_signed(">=", b.sub(npix, rest), const_i64(half)),
                                        b.add(rest, const_i64(half)), rest)
                    if mr > 1:   # the rest a pixel at a time: one more copy, not mr - 1
                        with for_range(b, rest, npix, "tp") as p:
                            self._tile(planes, prow0, p, 1, v0, nv, wpass, c0, c1, first)
            with for_range(b, const_i64(0), nrows, "orow") as r:
                rowbuf = b.gep(self.rowbuf, [b.mul(r, self._extent(self._product(self.ow,
                                                                                OC_BLOCK)))],
                               inbounds=True)
                self._emit_row(nb, blk, b.add(oy0, r), rowbuf, nvb)
                if self.next_block_prefetch:
                    self._prefetch_next_block(nb, blk, b.add(oy0, r))

    def _pass_loops(self, passes: list[tuple[int, int]], wblk, buffer: str = "rowbuf"):
        """``passes`` ((v0, nv): a block's channel vectors in register tiles of MAX_TILE_VECTORS)
        as (v0, nv, weights) for the caller to emit each; whole passes past the first (4-lane
        targets: a block's 8 vectors in 2 passes) are one loop over the passes, not a copy of
        the code each: the loop's body sees v0 = 0, the weights and the ``buffer`` attribute
        (the row buffer, Winograd's M) moved on by the pass's channels. The same sums in the
        same order as the copies (PASS_LOOP)."""
        whole = [p for p in passes if p[1] == MAX_TILE_VECTORS]
        if not PASS_LOOP or len(whole) < 2 or passes[:len(whole)] != whole:
            for v0, nv in passes:
                yield v0, nv, wblk
            return
        b, base = self.builder, getattr(self, buffer)
        with for_range(b, const_i64(0), const_i64(len(whole)), "ocpass") as ps:
            shift = b.mul(ps, const_i64(MAX_TILE_VECTORS * self.vl))
            setattr(self, buffer, b.gep(base, [shift], inbounds=True))
            yield 0, MAX_TILE_VECTORS, b.gep(wblk, [shift], inbounds=True)
        setattr(self, buffer, base)
        for v0, nv in passes[len(whole):]:
            yield v0, nv, wblk

    def _tile(self, planes, prow0, p0, mr: int, v0: int, nv: int, wblk, c0, c1, first,
              prefetch: ir.Value | None = None, at: tuple | None = None) -> None:
        """The group's pixels p0 .. p0 + mr - 1 (pixel p: row p // ow from plane row
        ``prow0``, column p % ow) times the block's channel vectors v0 .. v0 + nv - 1, over
        input channels c0 .. c1 - 1, added to (first chunk: stored in) the row buffer."""
        b, vl = self.builder, self.vl
        plane_stride = self.plane_floats
        row_stride = self.wpc
        if self.open_image:
            plane_stride, row_stride = self._extent(plane_stride), self._extent(row_stride)
        accs = [alloca_once(b, self.vty, name=f"oc_acc{j}_{v}") for j in range(mr)
                for v in range(nv)]
        zero = ir.Constant(self.vty, [0.0] * vl)
        pix = [b.add(p0, const_i64(j)) if j else p0 for j in range(mr)]

        def buf_ptr(j, v):
            return self._vec_ptr(self.rowbuf, b.add(b.mul(pix[j], const_i64(OC_BLOCK)),
                                                    const_i64((v0 + v) * vl)))

        for j in range(mr):
            for v in range(nv):
                b.store(b.select(first, zero, b.load(buf_ptr(j, v), align=4)), accs[j * nv + v])
        if self.open_image and mr > 1:
            # a tile inside one output row (all but those that wrap): its pixels' inputs at
            # constant offsets from one base, so that neighbouring pixels' taps share their
            # broadcasts and no pointer per pixel is kept (or spilled) over the reduction;
            # a tile that wraps takes a pointer per pixel (_row_major_steps)
            if at is None:
                r = b.udiv(p0, self.ow)
                ox = b.sub(p0, b.mul(r, self.ow))
            else:   # pixel p0's (row, column), known to the caller
                r, ox = at
            prow = b.add(prow0, b.mul(r, const_i64(self.sh)))
            base = b.gep(planes, [b.add(b.mul(prow, row_stride),
                                        b.mul(ox, const_i64(self.sw)))], inbounds=True)
            inside = b.icmp_signed("<=", b.add(ox, const_i64(mr)), self.ow)
            with b.if_else(inside) as (one_row, wraps):
                with one_row:
                    self._tile_steps(accs, [base], mr, v0, nv, wblk, c0, c1, plane_stride,
                                     row_stride, prefetch, row_base=True)
                with wraps:
                    bases = []
                    for r, ox in self._row_major_steps(p0, self.ow, mr, at):
                        prow = b.add(prow0, b.mul(r, const_i64(self.sh)))
                        bases.append(b.gep(planes, [b.add(b.mul(prow, row_stride),
                                                          b.mul(ox, const_i64(self.sw)))],
                                           inbounds=True))
                    self._tile_steps(accs, bases, mr, v0, nv, wblk, c0, c1, plane_stride,
                                     row_stride, prefetch)
        elif self._static_one_row(mr):
            # every tile of a group lies in one output row (whole rows of whole tiles): one
            # base, the taps' broadcasts shared or through opaque pointers (_tile_steps)
            r, ox = b.sdiv(p0, const_i64(self.ow)), b.srem(p0, const_i64(self.ow))
            prow = b.add(prow0, b.mul(r, const_i64(self.sh)))
            base = b.gep(planes, [b.add(b.mul(prow, const_i64(row_stride)),
                                        b.mul(ox, const_i64(self.sw)))], inbounds=True)
            self._tile_steps(accs, [base], mr, v0, nv, wblk, c0, c1, plane_stride, row_stride,
                             prefetch, row_base=True)
        else:
            bases = []
            if self.open_image:   # a single pixel
                for r, ox in self._row_major_steps(p0, self.ow, mr):
                    prow = b.add(prow0, b.mul(r, const_i64(self.sh)))
                    bases.append(b.gep(planes, [b.add(b.mul(prow, row_stride),
                                                      b.mul(ox, const_i64(self.sw)))],
                                       inbounds=True))
            for p in pix if not self.open_image else ():
                r, ox = b.sdiv(p, const_i64(self.ow)), b.srem(p, const_i64(self.ow))
                prow = b.add(prow0, b.mul(r, const_i64(self.sh)))
                bases.append(b.gep(planes, [b.add(b.mul(prow, const_i64(row_stride)),
                                                  b.mul(ox, const_i64(self.sw)))], inbounds=True))
            self._tile_steps(accs, bases, mr, v0, nv, wblk, c0, c1, plane_stride, row_stride,
                             prefetch)
        for j in range(mr):
            for v in range(nv):
                b.store(b.load(accs[j * nv + v]), buf_ptr(j, v), align=4)

    def _tile_steps(self, accs, bases, mr: int, v0: int, nv: int, wblk, c0, c1, plane_stride,
                    row_stride, prefetch: ir.Value | None, row_base: bool = False) -> None:
        """``_tile``'s reduction over input channels c0 .. c1 - 1 into the accumulators
        ``accs``, pixel j's inputs read from ``bases[j]``, or (``row_base``) from ``bases[0]``
        + j * sw (the tile's pixels in one row). With one base, LLVM keeps a window row's
        broadcasts for the next taps of neighbouring pixels where the registers allow it
        (``_shares_taps``); where they do not, each tap reads through a pointer of its own that
        LLVM cannot see through (``_opaque_ptr``), every broadcast loaded where it is used
        (a 16-pixel tile of a 3x3 window kept 18 broadcasts and spilled: 60 stack accesses per
        144 multiply-adds)."""
        b, vl = self.builder, self.vl
        share = row_base and self._shares_taps(mr, nv)

        def tap_offset(ky_row: int, kx: int) -> ir.Value:
            if self.open_image:
                return b.add(b.mul(row_stride, const_i64(ky_row)), const_i64(kx)) if ky_row \
                    else const_i64(kx)
            return const_i64(ky_row * row_stride + kx)

        def taps(xcs, wc, ky, ky_row: int, vals: list) -> list:
            """One window row's taps (``ky`` the row's offset, ``ky_row`` its index in the
            unrolled rows) added to ``vals``."""
            for kx in range(self.kws):
                if row_base:
                    at = b.gep(xcs[0], [b.add(ky, tap_offset(ky_row, kx * self.kx_step))],
                               inbounds=True)
                    if not share and self.kws > 1:
                        at = _opaque_ptr(b, at)
                    xs = [self._splat(b.load(b.gep(at, [const_i64(j * self.sw)], inbounds=True)
                                             if j else at)) for j in range(mr)]
                else:
                    xs = [self._splat(b.load(b.gep(xc, [b.add(ky, tap_offset(
                        ky_row, kx * self.kx_step))], inbounds=True))) for xc in xcs]
                if self.pairs:   # one vdpbf16ps per pixel and weight vector: 2 products
                    # (the planes' pair words loaded and broadcast as float32 bits)
                    for v in range(nv):
                        wv = b.load(b.bitcast(b.gep(wc, [const_i64(
                            (ky_row * self.kws + kx) * OC_BLOCK + (v0 + v) * vl)],
                            inbounds=True), ir.VectorType(I32, vl).as_pointer()), align=4)
                        for j in range(mr):
                            vals[j * nv + v] = dot_words(b, self.module, vals[j * nv + v],
                                                         wv, xs[j], False)
                    continue
                for v in range(nv):
                    wv = load_weights(b, wc, const_i64((ky_row * self.kw + kx) * OC_BLOCK
                                                            + (v0 + v) * vl), vl, self.bf16)
                    for j in range(mr):
                        vals[j * nv + v] = self._fma(wv, xs[j], vals[j * nv + v])
            return vals

        khw32 = self.kh * self.kws * OC_BLOCK
        lines = self._prefetch_lines(mr) if prefetch is not None else 0
        with for_range(b, c0, c1, "ic") as ic:
            off = b.mul(ic, self._extent(plane_stride))
            xcs = [b.gep(base, [off], inbounds=True) for base in bases]
            wc = b.gep(wblk, [b.mul(ic, const_i64(khw32))], inbounds=True)
            if lines:
                # the next chunk's weights (the next block's first chunk after the last: the
                # blocks lie one after another), a few lines per step of every tile
                per_line = 32 if self.bf16 and not self.pairs else 16
                step = b.add(b.mul(prefetch, const_i64(self.chunk)), b.sub(ic, c0))
                nxt = b.gep(wblk, [b.add(b.mul(c1, const_i64(khw32)),
                                         b.mul(step, const_i64(per_line * lines)))])
                for q in range(lines):
                    self._prefetch(b.gep(nxt, [const_i64(per_line * q)]))
            if self.kh * self.kws <= UNROLLED_TAPS:
                vals = [b.load(a) for a in accs]
                for ky in range(self.kh):
                    vals = taps(xcs, wc, const_i64(0), ky, vals)
                for a, val in zip(accs, vals):
                    b.store(val, a)
            else:   # a loop over the window's rows (LLVM spills a fully unrolled 7x7)
                with for_range(b, const_i64(0), const_i64(self.kh), "ky") as ky:
                    vals = taps(xcs, b.gep(wc, [b.mul(ky, const_i64(self.kws * OC_BLOCK))],
                                           inbounds=True), b.mul(ky, self._extent(row_stride)), 0,
                                [b.load(a) for a in accs])
                    for a, val in zip(accs, vals):
                        b.store(val, a)

    def _out_prefetch_lines(self, mr: int, nchunks: int) -> int:
        """Output cache lines each tile of ``mr`` pixels prefetches for the row group's
        epilogue (OUT_PREFETCH_MIN_BYTES; 0: none): enough that a full group's tiles over its
        ``nchunks`` chunks cover its 32 channels' rows."""
        if not (self.vl == 16 and not self.open_image and not self.pairs and not self.bf16
                and self.pairs_out is None and self.vector_epilogue and not self.wino
                and self.kh * self.kw > 1 and self.o % OC_BLOCK == 0
                and self.o * self.oh * self.ow * 4 >= OUT_PREFETCH_MIN_BYTES):
            return 0
        tiles = max(1, self.rows * self.ow // mr)
        return -(-OC_BLOCK * self._out_lines() // (nchunks * tiles))

    def _out_lines(self) -> int:
        """Cache lines of one output channel's rows in a full row group (one more: the run
        need not start on a line)."""
        return -(-self.rows * self.ow * 4 // 64) + 1

    def _prefetch_output(self, nb, blk, oy0, cc, tile, mr: int, lines: int) -> None:
        """Prefetch ``lines`` cache lines of the row group's output (block ``blk``'s 32
        channels' rows from ``oy0``, channel after channel) for the ``tile``-th tile of
        chunk ``cc``: lines (cc * tiles + tile) * lines on, the last line for those past it."""
        b = self.builder
        out = self.match.out
        per = self._out_lines()
        last = const_i64(OC_BLOCK * per - 1)
        tiles = max(1, self.rows * self.ow // mr)
        first = b.mul(b.add(b.mul(cc, const_i64(tiles)), tile), const_i64(lines))
        for q in range(lines):
            k = b.add(first, const_i64(q)) if q else first
            k = b.select(b.icmp_signed("<", k, last), k, last)
            oc = b.add(b.mul(blk, const_i64(OC_BLOCK)), b.sdiv(k, const_i64(per)))
            off = b.add(self._offset(out, [nb, oc, oy0, const_i64(0)]),
                        b.mul(b.srem(k, const_i64(per)), const_i64(16)))
            self._prefetch(b.gep(self.buffers[out.uid], [off]), l1=True)

    def _short_tiles(self, mr: int) -> bool:
        """Whether (SHORT_TILES: static sizes, 16 lanes, fp32, a window wider than 1x1) a
        row group's pixels run as tiles of ``mr`` and ``mr - 1`` pixels, as many of the short
        ones as make the count whole (a group of at least (mr - 1)^2 pixels; fewer keep the
        half tile and single pixels)."""
        return (SHORT_TILES and self.kh * self.kw > 1 and self.vl == 16
                and not self.open_image and not self.pairs and mr == MAX_TILE_ROWS_32)

    def _static_one_row(self, mr: int) -> bool:
        """Whether (static sizes, 16 lanes, a window whose rows are a loop: STATIC_ONE_ROW)
        every tile of ``mr`` pixels lies in one output row (rows of whole tiles; row groups
        are whole rows), read from one base as the open-size kernel's tiles are."""
        return (STATIC_ONE_ROW and self.vl == 16 and not self.open_image and not self.pairs
                and mr > 1 and self.ow % mr == 0 and self.kh * self.kws > UNROLLED_TAPS)

    def _shares_taps(self, mr: int, nv: int) -> bool:
        """Whether a one-row tile of ``mr`` pixels and ``nv`` weight vectors keeps a window
        row's distinct broadcasts ((mr - 1) * sw + kw of them) in registers beside its
        accumulators and weight vectors."""
        registers = REGISTERS_32 if self.vl == 16 else REGISTERS
        return mr * nv + nv + (mr - 1) * self.sw + self.kws <= registers

    def _prefetch_lines(self, mr: int) -> int:
        """Cache lines of the next chunk's weights each reduction step of a full tile
        prefetches (PREFETCH_LINES_MAX at most; 0: none, weights within
        PREFETCH_MIN_WEIGHT_BYTES, or PREFETCH_MIN_WEIGHT_BYTES_1X1 for a 1x1 at 16 lanes):
        enough that a group's tiles together cover the chunk."""
        least = PREFETCH_MIN_WEIGHT_BYTES_1X1 if (
            self.vl == 16 and (self.kh, self.kw) == (1, 1)
            and not (self.bf16 or self.pairs or self.open_image)) else PREFETCH_MIN_WEIGHT_BYTES
        if (2 if self.bf16 else 4) * self.nblocks * self.k * OC_BLOCK <= least:
            return 0
        # a run-time image size: row groups of at least OPEN_PREFETCH_PIXELS assumed (a
        # group of ROW_PIXELS, on rows of 40, left a sixth of each next chunk unfetched)
        pixels = OPEN_PREFETCH_PIXELS if self.open_image else self.rows * self.ow
        tiles = max(1, pixels // mr)
        # bytes per reduction unit's weight (a channel's, or a pair word: 4)
        unit = 4 if self.pairs or not self.bf16 else 2
        lines_per_channel = self.kh * self.kw * OC_BLOCK * unit // 64
        return max(1, min(PREFETCH_LINES_MAX, -(-lines_per_channel // tiles)))

    def _prefetch(self, ptr: ir.Value, l1: bool = False) -> None:
        """Hint the cache line at ``ptr`` (a float pointer) into L2 (``l1``: into L1) for
        reading."""
        b = self.builder
        i8p = ir.IntType(8).as_pointer()
        fn = intrinsic(self.module, "llvm.prefetch.p0", ir.VoidType(), [i8p, I32, I32, I32])
        b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3 if l1 else 2),
                    ir.Constant(I32, 1)])

    def _emit_row(self, nb, blk, oy, rowbuf, nv: int) -> None:
        """Output row ``oy`` of the block's ``nv`` channel vectors from the row buffer ([ox][32
        channels]): vl x vl transposes into vectors along the row, each through the fused
        epilogue."""
        b, vl = self.builder, self.vl
        out = self.match.out
        if self.open_image:
            self._emit_open_row(nb, blk, oy, rowbuf, nv)
            return
        if self.pairs_out is not None:
            self._emit_pair_row(nb, blk, oy, rowbuf, nv)
            return
        nq = -(-self.ow // vl)
        tail = self.ow % vl

        def chunk(q, pieces):
            ox0 = b.mul(q, const_i64(vl))
            mask = None
            if pieces is not None:
                mask = ir.Constant(ir.VectorType(I1, vl), [j < pieces for j in range(vl)])

            def finish(col: ir.Value, oc: ir.Value) -> None:
                self.env = {id(out.axes[0]): nb, id(out.axes[1]): oc}
                emit_epilogue(self, col, oy, ox0, mask, const_i64(self.ow), pieces=pieces)

            self._row_columns(blk, rowbuf, ox0, nv, finish)

        whole = self.ow // vl
        if whole:
            with for_range(b, const_i64(0), const_i64(whole), "oq") as q:
                chunk(q, None)
        if tail:
            chunk(const_i64(nq - 1), tail)

    def _emit_pair_row(self, nb, blk, oy, rowbuf, nv: int) -> None:
        """``_emit_row`` writing bf16 pair words (``pairs_out``, passes/bf16_pairs.py): the
        output as [N, O / 2, OH + pt + pb, OW + pl + pr] 32-bit words, the word of pair j at
        padded row oy + pt, column ox + pl (bf16(out[2j]), bf16(out[2j + 1])) as
        bf16conv.pair_words makes it from the epilogue's float32 values; the row's padding
        columns, and above the first row and below the last the padding rows, zero words."""
        b, vl = self.builder, self.vl
        out = self.match.out
        if not self.vector_epilogue:
            raise ValueError("bf16 pair-word output needs a vector epilogue")
        pt, pl, pb, pr = self.pairs_out
        hp, wp = self.oh + pt + pb, self.ow + pl + pr
        plane = hp * wp
        words = b.bitcast(self.buffers[out.uid], I32.as_pointer())
        img = b.gep(words, [b.mul(nb, const_i64(self.o // 2 * plane))], inbounds=True)
        ivec = ir.VectorType(I32, vl)
        opaque = self.target_vl >= PADDED_BELOW_VL
        cols_buf = alloca_once(b, ir.ArrayType(self.vty, vl), name="oc_pcols")
        zero = ir.Constant(I32, 0)
        row_off = b.add(b.mul(b.add(oy, const_i64(pt)), const_i64(wp)), const_i64(pl))
        store = intrinsic(self.module, f"llvm.masked.store.v{vl}i32.p0", ir.VoidType(),
                          [ivec, ivec.as_pointer(), I32, ir.VectorType(I1, vl)])

        def chunk(q, pieces):
            ox0 = b.mul(q, const_i64(vl))
            mask = None if pieces is None else \
                ir.Constant(ir.VectorType(I1, vl), [j < pieces for j in range(vl)])
            with for_range(b, const_i64(0), const_i64(nv), "ocv") as v:
                c0 = b.mul(v, const_i64(vl))
                rows = [b.load(self._vec_ptr(rowbuf, b.add(b.mul(b.add(ox0, const_i64(i)),
                                                                 const_i64(OC_BLOCK)), c0)),
                               align=4) for i in range(vl)]
                for i, col in enumerate(_transpose(b, rows)):
                    b.store(col, b.gep(cols_buf, [zero, ir.Constant(I32, i)], inbounds=True))
                with for_range(b, const_i64(0), const_i64(vl // 2), "ocp") as i:
                    oc = b.add(b.mul(blk, const_i64(OC_BLOCK)), b.add(c0, b.mul(i, const_i64(2))))
                    vals = []
                    for half in range(2):
                        col = b.load(b.gep(cols_buf, [zero, b.trunc(
                            b.add(b.mul(i, const_i64(2)), const_i64(half)), I32)],
                            inbounds=True))
                        env = {id(out.axes[0]): nb, id(out.axes[1]): b.add(oc, const_i64(half)),
                               id(out.axes[2]): oy, id(out.axes[3]): ox0}
                        vals.append(self.epilogue_vector(col, env, mask, None,
                                                         opaque_constants=opaque))
                    pair = pair_words(b, self.module, vals[0], vals[1])
                    off = b.add(b.mul(b.sdiv(oc, const_i64(2)), const_i64(plane)),
                                b.add(row_off, ox0))
                    ptr = b.bitcast(b.gep(img, [off], inbounds=True), ivec.as_pointer())
                    if mask is None:
                        b.store(pair, ptr, align=4)
                    else:
                        b.call(store, [pair, ptr, ir.Constant(I32, 4), mask])

        whole = self.ow // vl
        if whole:
            with for_range(b, const_i64(0), const_i64(whole), "oq") as q:
                chunk(q, None)
        if self.ow % vl:
            chunk(const_i64(whole), self.ow % vl)
        if not any(self.pairs_out):
            return
        # the padding of this row's pairs: columns, and rows above / below the image
        zero_word = ir.Constant(I32, 0)
        memset = intrinsic(self.module, "llvm.memset.p0i8.i64", ir.VoidType(),
                           [ir.IntType(8).as_pointer(), ir.IntType(8), ir.IntType(64), I1])

        def clear(ptr, count: int) -> None:
            b.call(memset, [b.bitcast(ptr, ir.IntType(8).as_pointer()),
                            ir.Constant(ir.IntType(8), 0), const_i64(4 * count),
                            ir.Constant(I1, 0)])

        first_pair = b.mul(blk, const_i64(OC_BLOCK // 2))
        with for_range(b, const_i64(0), const_i64(nv * vl // 2), "ocz") as jj:
            base = b.gep(img, [b.mul(b.add(first_pair, jj), const_i64(plane))], inbounds=True)
            row = b.gep(base, [b.sub(row_off, const_i64(pl))], inbounds=True)
            for x in list(range(pl)) + list(range(pl + self.ow, wp)):
                b.store(zero_word, b.gep(row, [const_i64(x)], inbounds=True))
            if pt:
                with b.if_then(b.icmp_signed("==", oy, const_i64(0))):
                    clear(base, pt * wp)
            if pb:
                with b.if_then(b.icmp_signed("==", oy, const_i64(self.oh - 1))):
                    clear(b.gep(base, [const_i64((pt + self.oh) * wp)], inbounds=True), pb * wp)

    def _emit_open_row(self, nb, blk, oy, rowbuf, nv: int) -> None:
        """``_emit_row`` for a run-time row width: the row's vectors in one loop, the epilogue
        emitted once (its reads masked to the lanes inside the row), each vector stored whole
        or, the last one, masked (a second copy of the epilogue for the tail would double
        the kernel's code and its compile time)."""
        b, vl = self.builder, self.vl
        out = self.match.out
        nq = b.udiv(b.add(self.ow, const_i64(vl - 1)), const_i64(vl))
        with for_range(b, const_i64(0), nq, "oq") as q:
            ox0 = b.mul(q, const_i64(vl))
            left = b.sub(self.ow, ox0)
            mask = self._lane_mask(left, 0)
            whole = b.icmp_signed(">=", left, const_i64(vl))

            def finish(col: ir.Value, oc: ir.Value) -> None:
                self.env = {id(out.axes[0]): nb, id(out.axes[1]): oc}
                if not self.vector_epilogue:   # element by element, to the row's end
                    emit_epilogue(self, col, oy, ox0, mask, self.ow)
                    return
                env = dict(self.env)
                env[id(out.axes[2])] = oy
                env[id(out.axes[3])] = ox0
                value = self.epilogue_vector(col, env, mask, None,
                                             opaque_constants=self.target_vl >= PADDED_BELOW_VL)
                ptr = b.gep(self.buffers[out.uid],
                            [self._offset(out, [env[id(a)] for a in out.axes])], inbounds=True)
                vptr = b.bitcast(ptr, self.vty.as_pointer())
                with b.if_else(whole) as (full, part):
                    with full:
                        b.store(value, vptr, align=4)
                    with part:
                        fn = intrinsic(self.module, f"llvm.masked.store.v{vl}f32.p0",
                                       ir.VoidType(), [self.vty, self.vty.as_pointer(), I32,
                                                       ir.VectorType(I1, vl)])
                        b.call(fn, [value, vptr, ir.Constant(I32, 4), mask])

            self._row_columns(blk, rowbuf, ox0, nv, finish)

    def _row_columns(self, blk, rowbuf, ox0, nv: int, finish) -> None:
        """The row buffer's vl pixels from ``ox0`` by the block's ``nv`` channel vectors, as
        vectors along the row: per channel vector a vl x vl transpose in registers, its vl
        columns put in a small stack buffer, then a loop over them calling ``finish(column,
        output channel)``: the epilogue's code once per kernel, not once per channel of the
        block (32 copies of an inline SiLU were most of a kernel's IR and compile time)."""
        b, vl = self.builder, self.vl
        cols_buf = alloca_once(b, ir.ArrayType(self.vty, vl), name="oc_cols")
        zero = ir.Constant(I32, 0)
        with for_range(b, const_i64(0), const_i64(nv), "ocv") as v:
            c0 = b.mul(v, const_i64(vl))
            rows = [b.load(self._vec_ptr(rowbuf, b.add(b.mul(b.add(ox0, const_i64(i)),
                                                             const_i64(OC_BLOCK)), c0)),
                           align=4) for i in range(vl)]
            for i, col in enumerate(_transpose(b, rows)):
                b.store(col, b.gep(cols_buf, [zero, ir.Constant(I32, i)], inbounds=True))
            count = const_i64(vl)
            if self.o % vl:   # output channels not in whole vectors: the last one's lanes
                left = b.sub(const_i64(self.o),   # past them are computed, not stored
                             b.add(b.mul(blk, const_i64(OC_BLOCK)), c0))
                count = b.select(b.icmp_signed("<", left, count), left, count)
            with for_range(b, const_i64(0), count, "oci") as i:
                col = b.load(b.gep(cols_buf, [zero, i], inbounds=True))
                finish(col, b.add(b.mul(blk, const_i64(OC_BLOCK)), b.add(c0, i)))

    # ---- Winograd F(2x2, 3x3) -----------------------------------------------------------------

    def _emit_tasks_wino(self, ws: ir.Value, task: ir.Value, ntasks: ir.Value) -> None:
        """Per task, a run of (image, band, group of channel blocks) items; per item: the
        band's input rows copied zero-padded, every 4x4 input block of every channel
        transformed (``_wino_input``) into V [16][C][tiles] (once for a task's consecutive
        items of one band), then per block of 32 output channels of its group the 16 products
        U[xi] V[xi] (``_wino_gemm``: the register tile of ``_tile``, tiles for pixels) into M
        [16][tiles][32] and the output transform of each tile into two rows of the row buffer,
        which ``_emit_row`` transposes out through the fused epilogue."""
        b = self.builder
        nt, region = self._task_region(ws, task, ntasks)
        x_ptr = self.buffers[self.match.tag.operands[0].uid]
        with b.if_then(b.icmp_signed("<", task, nt)):
            v = self._extent
            self.vbuf = b.gep(region, [v(self.plane_region)], inbounds=True)
            self.mbuf = b.gep(self.vbuf, [v(self.v_floats)], inbounds=True)
            self.rowbuf = b.gep(self.mbuf, [v(self.m_floats)], inbounds=True)
            items = self.n * self.nbands * self.wgroups if not self.open_image else \
                self._product(self.n, self.nbands, self.wgroups)
            lo, hi = self._split(items, task, nt)
            copied = alloca_once(b, ir.IntType(64), name="wino_band")
            b.store(const_i64(-1), copied)
            with for_range(b, lo, hi, "item") as item:
                grp = b.srem(item, const_i64(self.wgroups))
                nb_band = b.sdiv(item, const_i64(self.wgroups))
                nb = b.sdiv(nb_band, v(self.nbands))
                band = b.srem(nb_band, v(self.nbands))
                tr0 = b.mul(band, v(self.band_tr))
                left = b.sub(v(self.ntr), tr0)
                ntr = b.select(b.icmp_signed("<", left, v(self.band_tr)), left,
                               v(self.band_tr))
                oy_lo = b.mul(tr0, const_i64(2))
                x_img = b.gep(x_ptr, [b.mul(nb, v(self._product(self.c, self.h, self.w)))],
                              inbounds=True)
                with b.if_then(b.icmp_signed("!=", b.load(copied), nb_band)):
                    self._copy_band(x_img, oy_lo, region)
                    self._wino_input(region, ntr)
                    b.store(nb_band, copied)
                full = self.o // OC_BLOCK
                last_nv = -(-(self.o % OC_BLOCK) // self.vl)
                g = self.wgroups
                blo = b.sdiv(b.mul(grp, const_i64(full)), const_i64(g))
                bhi = b.sdiv(b.mul(b.add(grp, const_i64(1)), const_i64(full)), const_i64(g))
                with for_range(b, blo, bhi, "blk") as blk:
                    self._wino_block(nb, blk, oy_lo, ntr, OC_BLOCK // self.vl)
                if last_nv:
                    with b.if_then(b.icmp_signed("==", grp, const_i64(g - 1))):
                        self._wino_block(nb, const_i64(full), oy_lo, ntr, last_nv)

    def _wino_input(self, planes: ir.Value, ntr: ir.Value) -> None:
        """V[(xi * C + c) * band_tr * ntp + tr * ntp + tx] = (B^T d B)[xi // 4][xi % 4] for the
        4x4 block d of channel c's padded plane at rows 2 tr.., columns 2 tx..; vl tiles at a
        time (the block's even and odd columns deinterleaved from two vector loads). bf16
        pairs: ``_wino_input_pairs``."""
        if self.pairs:
            self._wino_input_pairs(planes, ntr)
            return
        b, vl = self.builder, self.vl
        v = self._extent
        row_stride = self._product(self.band_tr, self.ntp)
        with for_range(b, const_i64(0), ntr, "wtr") as tr:
            with for_range(b, const_i64(0), const_i64(self.c), "wc") as c:
                plane = b.gep(planes, [b.add(b.mul(c, v(self.plane_floats)),
                                             b.mul(tr, v(self._product(2, self.wpc))))],
                              inbounds=True)
                vrow = b.gep(self.vbuf, [b.add(b.mul(c, v(row_stride)),
                                               b.mul(tr, v(self.ntp)))], inbounds=True)
                nq = b.udiv(self.ntp, const_i64(vl)) if self.open_image else \
                    const_i64(self.ntp // vl)
                with for_range(b, const_i64(0), nq, "wq") as q:
                    t = self._wino_bt(plane, b.mul(q, const_i64(2 * vl)))
                    if self.open_image:
                        dst = b.gep(vrow, [b.mul(q, const_i64(vl))], inbounds=True)
                        # xi's rows lie a run-time stride apart: one pointer stepped by it,
                        # the stride made opaque here so that LLVM cannot hoist its 16
                        # multiples out of the loop (they were spilled and reloaded)
                        xi_stride = _opaque_i64(b, v(self._product(self.c, row_stride)))
                    for a in range(4):
                        for bb, val in enumerate(self._wino_bt_row(t[a])):
                            if self.open_image:
                                if a or bb:
                                    dst = b.gep(dst, [xi_stride], inbounds=True)
                                at = dst
                            else:
                                off = v(self._product(a * 4 + bb, self.v_xi))
                                at = b.gep(vrow, [b.add(off, b.mul(q, const_i64(vl)))],
                                           inbounds=True)
                            b.store(val, b.bitcast(at, self.vty.as_pointer()), align=4)

    def _wino_bt(self, plane: ir.Value, col: ir.Value) -> list:
        """B^T d of vl 4x4 input blocks d (plane rows 0..3, columns ``col`` + 2 i ..): its 4
        rows of 4 vectors (the blocks' even and odd columns deinterleaved from two loads)."""
        b, vl = self.builder, self.vl
        evens = ir.Constant(ir.VectorType(I32, vl), [2 * i for i in range(vl)])
        odds = ir.Constant(ir.VectorType(I32, vl), [2 * i + 1 for i in range(vl)])
        d = []
        for i in range(4):
            row = b.gep(plane, [b.add(col, self._extent(self._product(i, self.wpc)))],
                        inbounds=True)
            vs = [b.load(self._vec_ptr(row, const_i64(k)), align=4)
                  for k in (0, vl, 2, 2 + vl)]
            d.append([b.shuffle_vector(vs[0], vs[1], evens),
                      b.shuffle_vector(vs[0], vs[1], odds),
                      b.shuffle_vector(vs[2], vs[3], evens),
                      b.shuffle_vector(vs[2], vs[3], odds)])
        return [[b.fsub(d[0][j], d[2][j]) for j in range(4)],
                [b.fadd(d[1][j], d[2][j]) for j in range(4)],
                [b.fsub(d[2][j], d[1][j]) for j in range(4)],
                [b.fsub(d[1][j], d[3][j]) for j in range(4)]]

    def _wino_bt_row(self, r: list) -> tuple:
        """One row of (B^T d) B from the row ``r`` of B^T d."""
        b = self.builder
        return (b.fsub(r[0], r[2]), b.fadd(r[1], r[2]), b.fsub(r[2], r[1]), b.fsub(r[1], r[3]))

    def _wino_input_pairs(self, planes: ir.Value, ntr: ir.Value) -> None:
        """``_wino_input`` for bf16 pairs (static sizes): V[(xi * cp + j) * band_tr * ntp + tr
        * ntp + tx] the 32-bit word (bf16(V[xi] of channel 2j), bf16(V[xi] of channel 2j + 1))
        (bf16conv.pair_words: the even channel in the low half, zero past C), the transform in
        float32 on the band's float32 planes and rounded once."""
        b, vl = self.builder, self.vl
        assert not self.open_image, "Winograd bf16 pairs take static sizes"
        row_stride = self.band_tr * self.ntp
        zero = ir.Constant(self.vty, [0.0] * vl)
        ivec = ir.VectorType(I32, vl)
        with for_range(b, const_i64(0), ntr, "wtr") as tr:
            with for_range(b, const_i64(0), const_i64(self.cp), "wcp") as j:
                c0 = b.mul(j, const_i64(2))
                # the odd channel past C (an odd C): its plane read, its values zero
                second = b.icmp_signed("<", b.add(c0, const_i64(1)), const_i64(self.c))
                c1 = b.select(second, b.add(c0, const_i64(1)), c0)
                rows = b.mul(tr, const_i64(2 * self.wpc))
                plane = [b.gep(planes, [b.add(b.mul(ch, const_i64(self.plane_floats)), rows)],
                               inbounds=True) for ch in (c0, c1)]
                vrow = b.gep(b.bitcast(self.vbuf, I32.as_pointer()),
                             [b.add(b.mul(j, const_i64(row_stride)),
                                    b.mul(tr, const_i64(self.ntp)))], inbounds=True)
                with for_range(b, const_i64(0), const_i64(self.ntp // vl), "wq") as q:
                    col = b.mul(q, const_i64(2 * vl))
                    even = [val for r in self._wino_bt(plane[0], col)
                            for val in self._wino_bt_row(r)]
                    odd = [b.select(second, val, zero) for r in self._wino_bt(plane[1], col)
                           for val in self._wino_bt_row(r)]
                    for xi in range(16):
                        at = b.gep(vrow, [b.add(const_i64(xi * self.v_xi),
                                                b.mul(q, const_i64(vl)))], inbounds=True)
                        b.store(pair_words(b, self.module, even[xi], odd[xi]),
                                b.bitcast(at, ivec.as_pointer()), align=4)

    def _wino_block(self, nb, blk, oy_lo, ntr: ir.Value, nvb: int) -> None:
        """Block ``blk`` of output channels (``nvb`` vectors) over the band's ``ntr`` tile rows."""
        b = self.builder
        w_ptr = self.buffers[self.match.tag.operands[1].uid]
        if self.pairs:   # 32-bit pair words
            w_ptr = b.bitcast(w_ptr, I32.as_pointer())
        wblk = b.gep(w_ptr, [b.mul(blk, const_i64(16 * self.wunits * OC_BLOCK))], inbounds=True)
        ntiles = b.mul(ntr, self._extent(self.nt))
        passes = [(v0, min(MAX_TILE_VECTORS, nvb - v0))
                  for v0 in range(0, nvb, MAX_TILE_VECTORS)]
        for v0, nv, wpass in self._pass_loops(passes, wblk, "mbuf"):
            mr = self._tile_rows(nv)
            with for_range(b, const_i64(0), const_i64(16), "xi") as xi:
                full = b.sdiv(ntiles, const_i64(mr))
                with for_range(b, const_i64(0), full, "wg") as g:
                    self._wino_gemm(xi, b.mul(g, const_i64(mr)), mr, v0, nv, wpass)
                if mr > 1:   # the rest a tile at a time: one more copy, not mr - 1
                    with for_range(b, b.mul(full, const_i64(mr)), ntiles, "wt") as u:
                        self._wino_gemm(xi, u, 1, v0, nv, wpass)
        v = self._extent
        with for_range(b, const_i64(0), ntr, "otr") as tr:
            with for_range(b, const_i64(0), v(self.nt), "otx") as tx:
                self._wino_output(b.add(b.mul(tr, v(self.nt)), tx), tx, nvb)
            if self.open_image or WINO_ROW_LOOP:   # the two rows in a loop: one copy of the
                # epilogue's code
                with for_range(b, const_i64(0), const_i64(2), "orow") as i:
                    oy = b.add(oy_lo, b.add(b.mul(tr, const_i64(2)), i))
                    with b.if_then(b.icmp_signed("<", oy, v(self.oh))):
                        row = b.gep(self.rowbuf, [b.mul(i, b.mul(v(self.row_len),
                                                                 const_i64(OC_BLOCK)))],
                                    inbounds=True)
                        self._emit_row(nb, blk, oy, row, nvb)
                return
            for i in range(2):
                oy = b.add(oy_lo, b.add(b.mul(tr, const_i64(2)), const_i64(i)))
                with b.if_then(b.icmp_signed("<", oy, v(self.oh))):
                    row = b.gep(self.rowbuf, [v(self._product(i, self.row_len, OC_BLOCK))],
                                inbounds=True)
                    self._emit_row(nb, blk, oy, row, nvb)

    def _wino_gemm(self, xi, u0, mr: int, v0: int, nv: int, wblk) -> None:
        """M[xi][u][32] for tiles u0 .. u0 + mr - 1 of the band (tile u: row u // nt, column
        u % nt), channel vectors v0 .. v0 + nv - 1: the sum over input channels of V[xi][c][u]
        times U[xi][c][:] (broadcast times weight vectors, mr x nv accumulators)."""
        b, vl = self.builder, self.vl
        row_stride = self._product(self.band_tr, self.ntp)
        vx = b.gep(self.vbuf, [b.mul(xi, self._extent(self.v_xi))], inbounds=True)
        ux = b.gep(wblk, [b.mul(xi, const_i64(self.wunits * OC_BLOCK))], inbounds=True)
        tiles = [b.add(u0, const_i64(j)) if j else u0 for j in range(mr)]
        bases = []
        if self.open_image:   # one division per tile, then tile after tile
            for r, tx in self._row_major_steps(u0, self.nt, mr):
                bases.append(b.gep(vx, [b.add(b.mul(r, self.ntp), tx)], inbounds=True))
        for u in tiles if not self.open_image else ():
            pos = b.add(b.mul(b.sdiv(u, const_i64(self.nt)), const_i64(self.ntp)),
                        b.srem(u, const_i64(self.nt)))
            bases.append(b.gep(vx, [pos], inbounds=True))
        accs = [alloca_once(b, self.vty, name=f"wacc{j}_{v}") for j in range(mr)
                for v in range(nv)]
        zero = ir.Constant(self.vty, [0.0] * vl)
        for a in accs:
            b.store(zero, a)


        def steps(c0, count: int) -> None:
            vals = [b.load(a) for a in accs]
            if self.open_image:
                # the channel's offset in V, shared by the mr tiles: made from a stride that
                # LLVM cannot hoist (_opaque_i64), so that it does not keep mr x unroll
                # offsets live across the loop (they were spilled: 8 reloads per 48 FMAs)
                rs = _opaque_i64(b, self._extent(row_stride))
                c_off = b.mul(c0, rs)
            for k in range(count):
                c = b.add(c0, const_i64(k)) if k else c0
                if self.open_image:
                    off = b.add(c_off, b.mul(rs, const_i64(k))) if k else c_off
                else:
                    off = b.mul(c, self._extent(row_stride))
                xs = [self._splat(b.load(b.gep(base, [off], inbounds=True))) for base in bases]
                if self.pairs:   # the tiles' pair words (as float32 bits) in vdpbf16ps
                    for v in range(nv):
                        wv = b.load(b.bitcast(b.gep(ux, [b.add(b.mul(c, const_i64(OC_BLOCK)),
                                                               const_i64((v0 + v) * vl))],
                                                    inbounds=True),
                                              ir.VectorType(I32, vl).as_pointer()), align=4)
                        for j in range(mr):
                            vals[j * nv + v] = dot_words(b, self.module, vals[j * nv + v], wv,
                                                         xs[j], False)
                    continue
                for v in range(nv):
                    wv = load_weights(b, ux, b.add(b.mul(c, const_i64(OC_BLOCK)),
                                                   const_i64((v0 + v) * vl)), vl, self.bf16)
                    for j in range(mr):
                        vals[j * nv + v] = self._fma(wv, xs[j], vals[j * nv + v])
            for a, val in zip(accs, vals):
                b.store(val, a)

        unroll = WINO_UNROLL
        whole = self.wunits // unroll
        if whole:
            with for_range(b, const_i64(0), const_i64(whole), "wk") as kk:
                steps(b.mul(kk, const_i64(unroll)), unroll)
        if self.wunits % unroll:
            steps(const_i64(whole * unroll), self.wunits % unroll)
        for j, u in enumerate(tiles):
            for v in range(nv):
                off = b.add(b.mul(b.add(b.mul(xi, self._extent(self.m_tiles)), u),
                                  const_i64(OC_BLOCK)), const_i64((v0 + v) * vl))
                b.store(b.load(accs[j * nv + v]), self._vec_ptr(self.mbuf, off), align=4)

    def _wino_output(self, u, tx, nvb: int) -> None:
        """Tile u's 2x2 outputs Y = A^T M A of every channel vector into the row buffer's two
        rows, columns 2 tx and 2 tx + 1."""
        b, vl = self.builder, self.vl
        with for_range(b, const_i64(0), const_i64(nvb), "wov") as v:   # one copy of the code
            c0 = b.mul(v, const_i64(vl))
            if self.open_image:
                # M's 16 planes lie a run-time stride apart: one pointer stepped by it (opaque,
                # as in _wino_input: not 16 hoisted, spilled offsets)
                at = b.gep(self.mbuf, [b.add(b.mul(u, const_i64(OC_BLOCK)), c0)],
                           inbounds=True)
                step = _opaque_i64(b, b.mul(self._extent(self.m_tiles), const_i64(OC_BLOCK)))
                m = []
                for a in range(4):
                    m.append([])
                    for c in range(4):
                        if a or c:
                            at = b.gep(at, [step], inbounds=True)
                        m[a].append(b.load(b.bitcast(at, self.vty.as_pointer()), align=4))
            else:
                m = [[b.load(self._vec_ptr(self.mbuf, b.add(
                    b.mul(b.add(self._extent(self._product(a * 4 + c, self.m_tiles)), u),
                          const_i64(OC_BLOCK)), c0)), align=4) for c in range(4)]
                     for a in range(4)]
            s = [[b.fadd(b.fadd(m[0][j], m[1][j]), m[2][j]) for j in range(4)],
                 [b.fsub(b.fsub(m[1][j], m[2][j]), m[3][j]) for j in range(4)]]
            for i in range(2):
                y0 = b.fadd(b.fadd(s[i][0], s[i][1]), s[i][2])
                y1 = b.fsub(b.fsub(s[i][1], s[i][2]), s[i][3])
                for j, y in enumerate((y0, y1)):
                    ox = b.add(b.mul(tx, const_i64(2)), const_i64(j))
                    off = b.add(b.mul(b.add(self._extent(self._product(i, self.row_len)), ox),
                                      const_i64(OC_BLOCK)), c0)
                    b.store(y, self._vec_ptr(self.rowbuf, off), align=4)


def _two_thread_path(tasks: list[float]) -> float:
    """When the later of two threads finishes ``tasks`` (their costs) as the runtime's home
    ranges run them (codegen/threadpool.py): each thread its half from the bottom, then the
    other's from the top, the thread that is free first claiming next."""
    ranges = [list(tasks[:len(tasks) // 2]), list(tasks[len(tasks) // 2:])]
    clock = [0.0, 0.0]
    while ranges[0] or ranges[1]:
        t = 0 if clock[0] <= clock[1] else 1
        clock[t] += ranges[t].pop(0) if ranges[t] else ranges[1 - t].pop()
    return max(clock)


def _opaque_i64(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``x`` through an empty inline asm that returns its operand: the same value, which LLVM
    can neither see through nor hoist out of the loop it is made in (so it cannot precompute
    multiples of a run-time stride there and hold, or spill, each)."""
    fnty = ir.FunctionType(I64, [I64])
    return b.asm(fnty, "", "=r,0", [x], side_effect=True)


def _opaque_ptr(b: ir.IRBuilder, p: ir.Value) -> ir.Value:
    """``p`` through an empty inline asm (``_opaque_i64`` for a pointer): loads from it and
    from constant offsets of it are not merged with loads through other pointers."""
    fnty = ir.FunctionType(p.type, [p.type])
    return b.asm(fnty, "", "=r,0", [p], side_effect=False)


def _transpose(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """A 4 x 4, 8 x 8 or 16 x 16 float transpose of as many vectors (row i lane j -> vector j
    lane i): unpacks of 32-bit, then 64-bit pairs (then 128-bit halves); 16 x 16 as four
    perfect shuffles (two-source permutes on AVX-512)."""
    n = len(rows)

    def shuf(a, c, lanes):
        return b.shuffle_vector(a, c, shared_constant(ir.VectorType(I32, n), lanes))

    if n == 16:
        half = n // 2
        lo = [x for i in range(half) for x in (i, n + i)]
        hi = [x for i in range(half, n) for x in (i, n + i)]
        for _ in range(4):   # each stage interleaves row i with row i + 8
            rows = [r for i in range(half)
                    for r in (shuf(rows[i], rows[i + half], lo),
                              shuf(rows[i], rows[i + half], hi))]
        return rows

    if n == 4:
        lo01, hi01 = shuf(rows[0], rows[1], [0, 4, 1, 5]), shuf(rows[0], rows[1], [2, 6, 3, 7])
        lo23, hi23 = shuf(rows[2], rows[3], [0, 4, 1, 5]), shuf(rows[2], rows[3], [2, 6, 3, 7])
        return [shuf(lo01, lo23, [0, 1, 4, 5]), shuf(lo01, lo23, [2, 3, 6, 7]),
                shuf(hi01, hi23, [0, 1, 4, 5]), shuf(hi01, hi23, [2, 3, 6, 7])]
    assert n == 8

    t = []
    for i in range(0, 8, 2):
        t.append(shuf(rows[i], rows[i + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
        t.append(shuf(rows[i], rows[i + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
    # t[0] = r0r1 lo, t[1] = r0r1 hi, t[2] = r2r3 lo, ...
    u = []
    for i in (0, 4):
        for h in (0, 1):
            a, c = t[i + h], t[i + 2 + h]
            u.append(shuf(a, c, [0, 1, 8, 9, 4, 5, 12, 13]))
            u.append(shuf(a, c, [2, 3, 10, 11, 6, 7, 14, 15]))
    # u[0..3]: rows 0-3 columns (0,4), (1,5), (2,6), (3,7); u[4..7]: rows 4-7 likewise
    out = [None] * 8
    for k in range(4):
        out[k] = shuf(u[k], u[4 + k], [0, 1, 2, 3, 8, 9, 10, 11])
        out[k + 4] = shuf(u[k], u[4 + k], [4, 5, 6, 7, 12, 13, 14, 15])
    return out


def emit_conv_oc(module: ir.Module, func: PrimFunc, symbol: str, vl: int,
                 size_vars: tuple[str, ...] = (), options: SplitThresholds = DEFAULTS
                 ) -> KernelInfo | None:
    """The kernel of an ``nn.conv2d_oc`` (static, or with a run-time batch, height or width:
    ``_runtime_geometry`` then plans it at the kernel's entry), else None."""
    match = match_conv_oc(func)
    if match is None:
        return None
    if match.tag.attrs.get("pairs") and vl != 16:
        raise ValueError("nn.conv2d_oc with bf16 pairs needs x86-64-v4+bf16 (vdpbf16ps) on "
                         f"16 lanes; this target has {vl}")
    if vl == 16 and match.tag.attrs["out_channels"] % 16 and \
            not geometry.oc_partial_lanes(match.tag.attrs["out_channels"]):
        vl = 8   # output channels in whole 8-lane vectors only: AVX-512VL's ymm registers
    return ChannelLaneConvEmitter(module, func, symbol, match, vl, size_vars, options).emit()
