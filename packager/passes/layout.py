"""Layout of constant weights for the fast kernels: a ``matmul(a, W, transpose_b=True)`` whose W
is a constant (ONNX Gemm with transB, i.e. every torch Linear) gets W transposed once at export,
so the kernel reads contiguous rows of the output's width. One row times a 2-D W (a Linear at
batch 1) keeps W as (N, K): the dot-product kernel (codegen/contraction/dot.py) reads its rows. With
``options.pack_matmul_weights`` (the targets measured), a constant B is then packed into the
kernel's column panels (``pack_matmul_weights``), a one-row product's too unless B is narrow.

Every choice comes from the ``CompileOptions`` each pass is handed (packager/options.py):
``one_row_gemv``, ``pack_conv_weights``, ``winograd``, ``conv_row_widths``, ``symbolic_conv_rows``,
``pack_matmul_weights``, ``precision`` and ``bf16_keep``; an export sets them for the targets it
compiles for."""

from __future__ import annotations

import numpy as np

from ..codegen.contraction.geometry import conv_geometry, oc_partial_lanes
from ..ir.graph import Call, Constant, IRModule
from ..options import CompileOptions
from .common import map_functions, rewrite_function
from .stored_int import derive


def _swap_last(d: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(d, -1, -2))


def pretranspose_weights(mod: IRModule, options: CompileOptions) -> IRModule:
    def visit(b, lookup):
        v = b.value
        if (isinstance(v, Call) and v.op == "matmul" and v.attrs.get("transpose_b")
                and isinstance(v.args[1], Constant) and v.args[1].data.ndim >= 2
                and not _one_row(v, options)):
            w = v.args[1]
            data = _swap_last(w.data)
            attrs = {**v.attrs, "transpose_b": False}
            return Call(v.op, [v.args[0], derive(f"{w.name}_t", w, _swap_last, data)], attrs,
                        v.type)
        return None

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


def _one_row(v: Call, options: CompileOptions) -> bool:
    """matmul(x, W) with x one row (every dim but the last a static 1) and W 2-D, kept for the
    dot product. ``options.one_row_gemv`` is False while a bundle with several batch plans
    compiles: every plan then reads the same transposed W, so the weights stay stored once (a
    batch-1 plan alone takes the dot product)."""
    shape = getattr(v.args[0].type, "shape", None)
    if (options.pack_matmul_weights and v.args[1].data.ndim == 2   # packed unless B is narrow
            and v.args[1].data.dtype == np.float32):
        from ..ops.layout import MATMUL_PANEL
        if v.args[1].data.shape[0] >= MATMUL_PANEL:
            return False
    return (options.one_row_gemv and shape is not None and len(shape) >= 1 and v.args[1].data.ndim == 2
            and all(isinstance(d, int) and d == 1 for d in shape[:-1]))


# Winograd F(2x2, 3x3) for a 3x3 stride-1 convolution (codegen/conv_oc.py): output rows and
# columns at least WINO_MIN_OUT, at least WINO_MIN_CHANNELS input and output channels (with
# fewer, the input transform and a narrow register tile cost more than the products saved:
# 8 -> 16 and 16 -> 16 on 64x64 were 1.2x the direct kernel's time, 16 -> 32 on 32x32 0.91x),
# transformed weights (16 x C x O floats, 1.8x the plain ones) at most WINO_MAX_WEIGHT_BYTES
# (the kernel's bands together read them at most codegen/conv_oc.py WINO_U_TRAFFIC bytes; 1
# thread, of the direct kernel's time: 320 -> 320 on 10x10, 6.5 MB, 0.56x; 384 -> 384 on 10x10,
# 9.4 MB, 0.62x; 512 -> 512 on 14x14, 16.8 MB, 0.70x; on 7x7 outputs, not taken, 0.95-1.0x).
# ``options.winograd`` False turns it off.
WINO_MIN_OUT = 8
WINO_MIN_CHANNELS = (16, 32)   # input, output
WINO_MAX_WEIGHT_BYTES = 20 << 20


def uses_winograd(w_shape, strides, out_shape) -> bool:
    """Whether the packed convolution takes Winograd F(2x2, 3x3) (see above) when
    ``options.winograd`` allows it. An output size known at run time only counts as large
    enough: the kernel's tile counts are computed at run time and right for any size; below
    WINO_MIN_OUT it costs up to ~1.2x the direct kernel's time, on the smallest layers."""
    o, c, kh, kw = w_shape
    sizes = [d for d in out_shape[2:] if isinstance(d, int)]
    return ((kh, kw) == (3, 3) and tuple(strides) == (1, 1)
            and min(sizes, default=WINO_MIN_OUT) >= WINO_MIN_OUT
            and c >= WINO_MIN_CHANNELS[0] and o >= WINO_MIN_CHANNELS[1]
            and 16 * c * o * 4 <= WINO_MAX_WEIGHT_BYTES)


def _plain_conv(v, static_batch: bool, static_image: bool = True) -> bool:
    """``v`` is an ungrouped, undilated float32 ``nn.conv2d`` of a 4-D input by a constant 4-D
    weight, its input and output static but for the batch (and the batch too if
    ``static_batch``; with ``static_image`` False, the height and width may be run-time sizes
    too): what the weight-packing rewrites start from."""
    if not (isinstance(v, Call) and v.op == "nn.conv2d" and len(v.args) == 2
            and isinstance(v.args[1], Constant)):
        return False
    x, w = v.args
    shape = getattr(x.type, "shape", None)
    out = tuple(getattr(v.type, "shape", ()))
    first = 0 if static_batch else 1
    last = 4 if static_image else 2
    return (w.data.dtype == np.float32 and w.data.ndim == 4 and x.type.dtype == "float32"
            and shape is not None and len(shape) == 4 and len(out) == 4
            and all(isinstance(d, int) for d in tuple(shape[first:last]) + out[first:last])
            and int(v.attrs.get("groups", 1)) == 1
            and tuple(v.attrs.get("dilation", (1, 1))) == (1, 1))


def pack_conv_weights(mod: IRModule, options: CompileOptions) -> IRModule:
    """An ungrouped float32 ``nn.conv2d`` with a window wider than 1x1 (or a 1x1 that
    ``_oc_1x1`` takes: AVX-512 targets), a constant weight, a
    4-D input static but for the batch and output channels in whole vectors becomes
    ``nn.conv2d_oc`` with its
    weight packed once (``ops.layout.pack_oc_weights``): codegen/conv_oc.py computes it with the
    output channels on the vector lanes (no plane copies by stride phase, no dropped columns).
    With ``options.symbolic_conv_oc`` the input's height and width may be run-time sizes (the
    direct and Winograd kernels then plan their bands and tiles at run time).
    ``options.pack_conv_weights``: on for targets whose kernels take ``nn.conv2d_oc`` (AVX2's
    8-lane and AVX-512's 16-lane vectors: where the kernel is measured); off, every
    convolution keeps ``nn.conv2d``. Under bf16 the convolutions ``weights_to_bf16`` takes
    (``bf16_takes_conv``) keep ``nn.conv2d`` for it."""
    if not options.pack_conv_weights:
        return mod
    from ..ops.layout import pack_oc_weights, pack_wino_weights

    def visit(b, lookup):
        v = b.value
        if not _plain_conv(v, static_batch=False, static_image=not options.symbolic_conv_oc):
            return None
        if bf16_takes_conv(v, options):
            return None   # weights_to_bf16's (its bf16 pair kernels)
        x, w = v.args
        # 16 lanes: other output channel counts keep the register-blocked kernel (the kernel's
        # 8-lane ymm fallback runs at half Zen 5's peak: PP-OCR det's 96 -> 24 3x3s 2x slower)
        # unless a last, partial 16-lane vector wastes few lanes (_partial_lanes_ok)
        if (w.data.shape[0] % (16 if options.conv_oc_wide else 8)
                and not _partial_lanes_ok(w.data.shape, options)) or (
                w.data.shape[2] * w.data.shape[3] == 1
                and not _oc_1x1(w.data.shape, v.type.shape, options)):
            return None
        attrs = {k: val for k, val in v.attrs.items() if k not in ("groups", "dilation")}
        attrs.update(out_channels=int(w.data.shape[0]), kernel=tuple(w.data.shape[2:]))
        strides = tuple(attrs.get("strides", (1, 1)))
        if options.winograd and uses_winograd(w.data.shape, strides, v.type.shape):
            attrs["winograd"] = True
            packed = Constant(f"{w.name}_wino", pack_wino_weights(w.data))
            return Call("nn.conv2d_oc", [lookup(x), packed], attrs, v.type)
        packed = derive(f"{w.name}_oc", w, pack_oc_weights)
        return Call("nn.conv2d_oc", [lookup(x), packed],
                    attrs, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


def _partial_lanes_ok(w_shape, options: CompileOptions) -> bool:
    """Whether a convolution of ``w_shape`` whose output channels are not whole 16-lane
    vectors takes nn.conv2d_oc at 16 lanes (``geometry.oc_partial_lanes``): windows
    wider than 1x1 only (PP-OCR det's 384 -> 360 1x1 on 16x16 measured 71 -> 74 us, 1 thread:
    it keeps the register-blocked kernel's packed panels)."""
    return (bool(options.conv_oc_wide) and w_shape[2] * w_shape[3] > 1
            and oc_partial_lanes(w_shape[0]))


# 1x1 convolutions on nn.conv2d_oc (``options.conv_oc_wide``: AVX-512 targets) with at least
# this many input channels; those with fewer keep the register-blocked kernel. Measured at
# x86-64-v4 (Zen 5, 1 thread, ResNet-50's 1x1s, kernel min us, register-blocked ->
# channel-lane): 1024 -> 256 on 14x14 966 -> 445, 256 -> 1024 on 14x14 800 -> 476, 512 -> 128
# on 28x28 802 -> 422, 256 -> 64 on 56x56 499 -> 432; fewer channels lose: 64 -> 256 on
# 56x56 437 -> 545, 128 -> 512 on 28x28 458 -> 507, PP-OCR det's 1x1 on 16x16 38 -> 52.
PACK_1X1_MIN_CHANNELS = 256


def _oc_1x1(w_shape, out_shape, options: CompileOptions) -> bool:
    """Whether a 1x1 convolution (weights ``w_shape``, output ``out_shape``) takes
    nn.conv2d_oc (see PACK_1X1_MIN_CHANNELS)."""
    if not options.conv_oc_wide or tuple(out_shape[2:]) == (1, 1):
        return False   # one pixel: the dot-product kernel (codegen/contraction/dot.py)
    return w_shape[1] >= PACK_1X1_MIN_CHANNELS


def conv_row_block(x_shape, w_shape, out_shape, attrs: dict,
                   widths: tuple[int, ...]) -> int | None:
    """The register tile's rows that the register-blocked kernel (codegen/contraction/geometry.py
    ``conv_geometry``) takes for this convolution at every width in ``widths``, or None where
    they differ (one packed weight serves every target of a bundle)."""
    rows = {conv_geometry(x_shape, w_shape, out_shape, attrs, vl)["mr"] for vl in widths}
    return rows.pop() if len(rows) == 1 else None


def pack_conv_rows(mod: IRModule, options: CompileOptions) -> IRModule:
    """An ungrouped float32 ``nn.conv2d`` with a constant weight, static shapes and no dilation,
    that the register-blocked kernel computes (not a one-pixel dot product), becomes
    ``nn.conv2d_rows``: its weight packed once (``ops.layout.pack_row_weights``) in blocks of the
    kernel's tile rows, so that a block row reads its weights as one contiguous stream (ONNX
    Runtime packs its convolution weights too); its tail outputs then take the block's channels
    on the lanes (codegen/contraction/conv.py ``_tail_block_rows``). Measured on Zen 4 (AVX2), bench/'s
    MobileNetV2, per kernel min, 1 thread: its kernels' sum 8581 -> 8283 us, the 1x1s on 7x7
    0.79-0.87x (320 -> 1280: 574 -> 474 us), the others within 3 %. ``options.conv_row_widths``:
    the vector widths (floats) of the targets when their register-blocked convolution reads
    ``nn.conv2d_rows`` (x86-64, AVX2 with or without its 128-bit level: where it is measured);
    empty, every such convolution keeps ``nn.conv2d``. A 1x1 whose batch or image size is
    known at run time only takes ``nn.conv2d_rows`` too where its kernel packs the input in
    panels (``_open_1x1_rows``)."""
    widths = options.conv_row_widths
    if not widths:
        return mod
    from ..ops.layout import pack_row_weights

    def visit(b, lookup):
        v = b.value
        if not _plain_conv(v, static_batch=True):
            return _open_1x1_rows(v, lookup, options)
        if v.args[1].data.shape[0] < 4:
            return None
        x, w = v.args
        shape, out = tuple(x.type.shape), tuple(v.type.shape)
        padding = tuple(v.attrs.get("padding", (0, 0, 0, 0)))
        if (shape[2:] == (1, 1) and w.data.shape[2:] == (1, 1)
                and out[2:] == (1, 1) and not any(padding)):
            return None   # one pixel: the dot-product kernel (codegen/contraction/dot.py)
        attrs = {"strides": tuple(v.attrs.get("strides", (1, 1))), "padding": padding,
                 "groups": 1}
        rows = conv_row_block(shape, w.data.shape, out, attrs, widths)
        if rows is None:
            return None
        new_attrs = {k: val for k, val in v.attrs.items() if k not in ("groups", "dilation")}
        new_attrs.update(out_channels=int(w.data.shape[0]), kernel=tuple(w.data.shape[2:]),
                         rows=rows)
        packed = derive(f"{w.name}_r{rows}", w, lambda d: pack_row_weights(d, rows))
        return Call("nn.conv2d_rows", [lookup(x), packed], new_attrs, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


def _open_1x1_rows(v, lookup, options: CompileOptions) -> Call | None:
    """``pack_conv_rows`` for a 1x1 convolution whose batch or image size is known at run time
    only, where its register-blocked kernel copies the input into packed panels
    (``geometry.packs_open_1x1``: codegen/contraction/conv_packed_symbolic.py) at one of
    ``options.conv_row_widths``: ``nn.conv2d_rows`` in blocks of the symbolic kernel's tile
    rows (``geometry.symbolic_conv_tile``, the same at every width). With
    ``options.symbolic_conv_rows`` False it keeps ``nn.conv2d`` (the kernel then reads the
    input in place), for comparison."""
    from ..codegen.contraction.geometry import packs_open_1x1, symbolic_conv_tile
    from ..ops.layout import pack_row_weights

    if not options.symbolic_conv_rows or not _plain_conv(v, static_batch=False,
                                                         static_image=False):
        return None
    x, w = v.args
    o, c = int(w.data.shape[0]), int(w.data.shape[1])
    strides = tuple(v.attrs.get("strides", (1, 1)))
    padding = tuple(v.attrs.get("padding", (0, 0, 0, 0)))
    widths = options.conv_row_widths
    if not any(packs_open_1x1(c, o, w.data.shape[2:], strides, padding, vl) for vl in widths):
        return None
    rows = {symbolic_conv_tile(o, vl, 1)[0] for vl in widths}
    if len(rows) != 1:
        return None
    rows = rows.pop()
    new_attrs = {k: val for k, val in v.attrs.items() if k not in ("groups", "dilation")}
    new_attrs.update(out_channels=o, kernel=(1, 1), rows=rows)
    packed = derive(f"{w.name}_r{rows}", w, lambda d: pack_row_weights(d, rows))
    return Call("nn.conv2d_rows", [lookup(x), packed], new_attrs, v.type)


# ``options.pack_matmul_weights``: on for targets whose matmul kernel reads ``matmul_packed``
# (x86-64 AVX2, and its 128-bit level beside it in a portable bundle: where it is measured; and
# fp32 for any set with a 16-lane x86-64-v4 level, whose kernel reads the same 16-column panels:
# Zen 5, 1 thread, MLP-Mixer 0.90-0.92x the unpacked bundle's time, its [196, 1024] x [1024,
# 256] layers 404 -> 358 us standalone); off, every matmul keeps its constant B as [K, N] (or
# [N, K] for the one-row dot product).
# A B of fewer columns stays as it is: packed, its panel would be mostly zeros (a one-row product
# by B [1024, 1]: 1.09x slower packed). Fewer than MATMUL_PANEL columns at one row keep the dot
# product (codegen/contraction/dot.py; 4 columns measured the same either way).
PACK_MIN_COLUMNS = 8


def pack_matmul_weights(mod: IRModule, options: CompileOptions) -> IRModule:
    """``matmul(a, B)`` with a constant 2-D float32 B [K, N] of at least PACK_MIN_COLUMNS
    columns (MATMUL_PANEL for one row in a single plan; after ``pretranspose_weights``) becomes
    ``matmul_packed``, B packed once into column panels (``ops.layout.pack_matmul_b``) that the
    register-blocked kernel (codegen/contraction/) reads with plain loads, for any row count
    (static or not): no panel copy at run time, no strided or masked reads of B. Measured on Zen 4
    (1 thread, against B read in place or copied per call): bench's mlp_b64 0.92x, [128, 3072] x
    [3072, 768] (too long a panel to copy) 0.52x, 1-8 rows 0.68-0.79x, a one-row Linear [1, 1024]
    x [1024, 1024] 0.80x of the dot product."""
    if not options.pack_matmul_weights:
        return mod
    from ..ops.layout import MATMUL_PANEL, pack_matmul_b

    def visit(b, lookup):
        v = b.value
        if not (isinstance(v, Call) and v.op == "matmul" and len(v.args) == 2
                and not v.attrs.get("transpose_b") and isinstance(v.args[1], Constant)):
            return None
        x, w = v.args
        shape = getattr(x.type, "shape", None)
        if (w.data.dtype != np.float32 or w.data.ndim != 2 or x.type.dtype != "float32"
                or shape is None or len(shape) < 2 or w.data.shape[1] < PACK_MIN_COLUMNS):
            return None
        if (options.one_row_gemv and w.data.shape[1] < MATMUL_PANEL
                and all(isinstance(d, int) and d == 1 for d in shape[:-1])):
            return None   # one row by a narrow B, as _one_row leaves it (a single plan)
        packed = derive(f"{w.name}_p{MATMUL_PANEL}", w, pack_matmul_b)
        return Call("matmul_packed", [lookup(x), packed], {"n": int(w.data.shape[1])}, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))


# ---- bf16 weights (``mlcpack export --precision bf16``) ------------------------------------------

# ``options.precision`` "bf16" (``mlcpack export --precision bf16``): the constant weights the
# contraction kernels read from their packed layouts (``matmul_packed`` panels,
# ``nn.conv2d_rows`` blocks, ``nn.conv2d_oc`` channel blocks, Winograd-transformed ones included)
# are stored as bfloat16, half their float32 size; codegen/contraction/ and conv_oc.py widen each one
# to float32 as they load it (exact) and accumulate in float32. A ``matmul_packed`` becomes
# ``matmul_bf16p`` (ops/bf16.py: B in K pairs, which codegen/bf16dot.py multiplies with
# ``vdpbf16ps`` on x86-64-v4+bf16, or widens two rows per 32-bit load elsewhere). Other weights
# stay float32.
# ``options.bf16_keep``: names of source weights (Constants of the module before the passes) that
# stay float32 under "bf16": the layers the accuracy guard (packager/precision.py) found too
# sensitive. A packed weight derives its name from its source's (``w`` -> ``w_t_p16``, ``w_oc``,
# ``w_r4``).


# Without vdpbf16ps (a target set without x86-64-v4+bf16) each bf16 weight pair is widened
# beside the FMAs: a matmul of more rows than this is compute-bound and keeps fp32 weights
# (``options.bf16_widen_all`` stores them bf16 anyway). Measured with bench/bf16.py mlp@ROWS on
# Zen 4 with AVX2 + FMA, no AVX-512 (1 thread, 256-512-512-10, min of alternating runs, bf16
# speed over fp32's): 1 row 1.25x, 2 rows 1.04x, 4 rows 0.92x, 8 0.96x, 16 0.95x, 32 0.98x.
BF16_WIDEN_MAX_ROWS = 2


def widened_matmul_stays_fp32(v: Call, options: CompileOptions) -> bool:
    """A ``matmul_packed`` that keeps fp32 weights under bf16: no vdpbf16ps in the targets
    and more than BF16_WIDEN_MAX_ROWS rows (or a run-time row count)."""
    if options.bf16_dot or options.bf16_widen_all:
        return False
    rows = 1
    for d in tuple(v.args[0].type.shape)[:-1]:
        if not isinstance(d, int):
            return True
        rows *= d
    return rows > BF16_WIDEN_MAX_ROWS


def _kept(name: str, keep: frozenset) -> bool:
    return any(name == k or name.startswith(k + "_") for k in keep)
BF16_OPS = ("matmul_packed", "nn.conv2d_rows", "nn.conv2d_oc")


def to_bfloat16(data: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (ml_dtypes' dtype, stored as its top 16 bits) rounded to nearest,
    ties to even; infinities stay infinite, a NaN stays a (quiet) NaN of its sign, a value past
    the largest bfloat16 rounds to infinity, as IEEE rounding does."""
    import ml_dtypes

    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        >> np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x0040)
    out = np.where(nan, quiet, rounded).astype(np.uint16)
    return out.view(ml_dtypes.bfloat16).reshape(np.shape(data))


# 1x1 windows take the bf16 channel-lane kernel on output planes of at most this many pixels
# (and of at most ``options.bf16_oc_pixels``): its pair planes are a copy the pixel-lane kernel
# makes too, but at 14x14 ResNet-50's 1x1s ran 1.18-1.30x slower on it, its 7x7 ones 0.76-0.84x.
BF16_OC_1X1_PIXELS = 7 * 7
# Planes of up to this many pixels take it whatever their input channels; larger ones (up to
# ``options.bf16_oc_pixels``) with at least BF16_OC_MIN_CHANNELS input channels, and any plane
# with at most BF16_OC_STEM_CHANNELS and a stride (stems). Measured on Zen 5 (1 thread, kernel
# CPU minima, pair -> channel-lane kernel): ResNet-18's 3x3s of 64 channels at 56x56
# 0.96-0.97x, of 128 at 28x28 0.93-0.95x, U-Net's of 64 at 32x32 0.87-0.90x; YOLOv8n's of 32
# channels at 40x40 (SiLU epilogue) 1.6-1.8x, U-Net's of 16-32 at 64x64 and 128x128 1.45x;
# YOLOv8n's 3x3 stride-2 stem (C = 3, 16 channels, 160x160) 0.56-0.58x, U-Net's stride-1 one
# (16 channels, 128x128) 1.19x.
BF16_OC_SMALL_PIXELS = 14 * 14
BF16_OC_MIN_CHANNELS = 64
BF16_OC_STEM_CHANNELS = 4


def _bf16_oc(w_shape, out_shape, strides, options: CompileOptions) -> bool:
    """Whether a convolution that takes bf16 pairs takes them with the output channels on the
    lanes (``options.bf16_oc_pixels``): vdpbf16ps on every target, output channels in whole
    16-lane vectors, an output plane of at most BF16_OC_SMALL_PIXELS pixels, or at most
    bf16_oc_pixels with BF16_OC_MIN_CHANNELS input channels, or any strided one with at most
    BF16_OC_STEM_CHANNELS (1x1 windows: BF16_OC_1X1_PIXELS); bf16_oc_pixels 0: none."""
    pixels = out_shape[2] * out_shape[3]
    c = w_shape[1]
    if w_shape[2] * w_shape[3] == 1 and pixels > BF16_OC_1X1_PIXELS:
        return False
    if not (options.bf16_oc_targets and not options.bf16_emulate and w_shape[0] % 16 == 0
            and options.bf16_oc_pixels > 0):
        return False
    if c <= BF16_OC_STEM_CHANNELS and tuple(strides) != (1, 1):
        return True
    return pixels <= (options.bf16_oc_pixels if c >= BF16_OC_MIN_CHANNELS
                      else min(options.bf16_oc_pixels, BF16_OC_SMALL_PIXELS))


def _bf16_tap_pairs(w_shape, options: CompileOptions) -> bool:
    """Whether a convolution that takes bf16 pairs pairs a window row's adjacent taps instead
    of two input channels (``options.bf16_tap_pairs``; nn.conv2d_oc with ``tap_pairs``, at any
    plane size): vdpbf16ps on every target, output channels in whole 16-lane vectors, and
    fewer reduction steps so (C * ceil(KW / 2) < ceil(C / 2) * KW: an odd C of few channels, a
    7x7 stem of C = 3 84 steps per window for 98)."""
    o, c, _, kw = w_shape
    return (options.bf16_tap_pairs and bool(options.bf16_oc_targets)
            and not options.bf16_emulate and o % 16 == 0
            and c * -(-kw // 2) < -(-c // 2) * kw)


def _bf16_winograd(w: Constant, strides, out_shape, options: CompileOptions) -> bool:
    """Whether a convolution that takes bf16 pairs takes them in Winograd F(2x2, 3x3)
    (``options.bf16_winograd``, None or True; nn.conv2d_oc with ``winograd`` and ``pairs``):
    vdpbf16ps on every target, output channels in whole 16-lane vectors, a layer fp32 runs as
    Winograd (``uses_winograd``). 2-D and 3-D convolutions alike (conv3d, ResNet-18/50, U-Net,
    yolox_neck, gan_upsampler, groupnorm_resnet 0.80-0.95x the direct pair kernels by median,
    1 thread, Zen 5: docs/performance.md); the guard turns it off where its extra rounding
    fails the check (export.py, ``precision.bf16_winograd_used``)."""
    return options.bf16_winograd is not False and (
        options.winograd and bool(options.bf16_oc_targets) and not options.bf16_emulate
        and w.data.shape[0] % 16 == 0
        and uses_winograd(w.data.shape, strides, out_shape))


def bf16_takes_conv(v, options: CompileOptions) -> bool:
    """Whether ``weights_to_bf16`` gives the call ``v`` bf16 pair weights: a plain
    convolution of static shapes (``_plain_conv``) under bf16 with a dot instruction in the
    targets (``options.bf16_pair_convs``), not of one output pixel (fp32's dot-product kernel,
    codegen/contraction/dot.py) but a 1x1 on a 1x1 image ``_bf16_one_pixel`` takes, its
    weight not one the guard keeps fp32 (``options.bf16_keep``)."""
    return (options.bf16_pair_convs and _plain_conv(v, static_batch=True)
            and (tuple(v.type.shape[2:]) != (1, 1) or _bf16_one_pixel(v, options))
            and not _kept(v.args[1].name, options.bf16_keep))


# A 1x1 convolution on a 1x1 image takes bf16 pairs with at least this many input channels:
# with fewer the pair fill costs more than the halved weights save. Measured on Zen 5 (1
# thread, kernel CPU minima, fp32 dot product -> bf16 channel-lane): PP-LCNet's 512 -> 1280
# head 39 -> 24 us, SE blocks' 1x1s of 64-576 input channels 0.43-0.75x, those of 4-8 input
# channels (EfficientNet-B0, MobileNetV3-small) 1.4-1.55x (about 1 -> 1.5 us).
BF16_ONE_PIXEL_MIN_CHANNELS = 16


def _bf16_one_pixel(v, options: CompileOptions) -> bool:
    """A 1x1 convolution on a 1x1 image that takes bf16 pairs (``options.bf16_one_pixel``):
    on the channel-lane kernel only (``_bf16_oc``), unpadded, output channels in 16-lane
    vectors, at least BF16_ONE_PIXEL_MIN_CHANNELS input channels."""
    w = v.args[1].data.shape
    return (options.bf16_one_pixel and tuple(w[2:]) == (1, 1)
            and w[1] >= BF16_ONE_PIXEL_MIN_CHANNELS
            and tuple(v.args[0].type.shape[2:]) == (1, 1)
            and not any(v.attrs.get("padding", (0, 0, 0, 0)))
            and _bf16_oc(w, v.type.shape, tuple(v.attrs.get("strides", (1, 1))), options))


def weights_to_bf16(mod: IRModule, options: CompileOptions) -> IRModule:
    """Under ``options.precision`` "bf16": the float32 packed weight of every ``BF16_OPS`` call
    but those ``options.bf16_keep`` names becomes bfloat16 (``to_bfloat16``), a convolution's
    only with ``options.bf16_convs`` (widened on load, convolutions are slower than fp32 on
    AVX2); "fp32", the module is unchanged."""
    if options.precision != "bf16":
        return mod
    keep = options.bf16_keep

    def visit(b, lookup):
        v = b.value
        if bf16_takes_conv(v, options):
            # input-channel pairs (ops/bf16.py): vdpbf16ps's operand (codegen/bf16conv.py)
            from ..ops.bf16 import pack_conv_pairs
            w = v.args[1]
            attrs = {"strides": tuple(v.attrs.get("strides", (1, 1))),
                     "padding": tuple(v.attrs.get("padding", (0, 0, 0, 0)))}
            if _bf16_tap_pairs(w.data.shape, options):
                # few odd input channels: a window row's adjacent taps paired
                from ..ops.layout import pack_oc_tap_pairs
                attrs.update(out_channels=int(w.data.shape[0]), kernel=tuple(w.data.shape[2:]),
                             pairs=True, tap_pairs=True)
                return Call("nn.conv2d_oc",
                            [lookup(v.args[0]),
                             Constant(f"{w.name}_bf16", pack_oc_tap_pairs(to_bfloat16(w.data)))],
                            attrs, v.type)
            if _bf16_winograd(w, attrs["strides"], v.type.shape, options):
                # 3x3 stride 1: the transformed weights rounded to bf16, in channel pairs
                from ..ops.layout import pack_wino_pairs, wino_transform
                attrs.update(out_channels=int(w.data.shape[0]), kernel=(3, 3), winograd=True,
                             pairs=True)
                return Call("nn.conv2d_oc",
                            [lookup(v.args[0]),
                             Constant(f"{w.name}_wino_bf16",
                                      pack_wino_pairs(to_bfloat16(wino_transform(w.data))))],
                            attrs, v.type)
            if _bf16_oc(w.data.shape, v.type.shape, attrs["strides"], options):
                # small planes: output channels on the lanes (ops/layout.py pack_oc_pairs)
                from ..ops.layout import pack_oc_pairs
                attrs.update(out_channels=int(w.data.shape[0]), kernel=tuple(w.data.shape[2:]),
                             pairs=True)
                return Call("nn.conv2d_oc",
                            [lookup(v.args[0]),
                             Constant(f"{w.name}_bf16", pack_oc_pairs(to_bfloat16(w.data)))],
                            attrs, v.type)
            return Call("nn.conv2d_bf16p",
                        [lookup(v.args[0]),
                         Constant(f"{w.name}_bf16", pack_conv_pairs(to_bfloat16(w.data)))],
                        attrs, v.type)
        if not (isinstance(v, Call) and v.op in BF16_OPS and len(v.args) == 2
                and isinstance(v.args[1], Constant) and v.args[1].data.dtype == np.float32
                and not _kept(v.args[1].name, keep)
                and (v.op == "matmul_packed" or options.bf16_convs)):
            return None
        if v.op == "matmul_packed" and widened_matmul_stays_fp32(v, options):
            return None
        w = v.args[1]
        if v.op == "matmul_packed":   # K pairs (ops/bf16.py): vdpbf16ps's operand
            from ..ops.bf16 import PAIR_KIND, pack_pairs
            from ..ops.layout import unpack_matmul_b
            n = int(v.attrs["n"])
            pairs = pack_pairs(to_bfloat16(unpack_matmul_b(w.data, n)), w.data.shape[2])
            return Call(PAIR_KIND, [lookup(v.args[0]), Constant(f"{w.name}_bf16", pairs)],
                        {"n": n}, v.type)
        return Call(v.op, [lookup(v.args[0]), Constant(f"{w.name}_bf16", to_bfloat16(w.data))],
                    v.attrs, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))
