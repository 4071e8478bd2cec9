"""Which quantized convolutions run faster on the fp32 kernels than on the integer ones.

On targets without an int8 dot instruction (no ``vpdpbusd``, no ``sdot``) the integer
convolution (``codegen/qgemm_conv.py``: ``vpmaddwd`` on int16 pairs, 16 exact multiply-adds per
instruction) runs at most ~1.6x an FMA loop's multiply-adds, while the fp32 kernel of a 3x3
stride-1 convolution does 2.25x fewer multiplies as Winograd F(2x2, 3x3). Measured per layer on
ResNet-18 (AVX2 + FMA host, no AVX-512, 1 thread; docs/performance.md, "ResNet-18 int8 per
layer"): int8 / fp32 speed 0.78-0.98 on the 3x3 stride-1 layers fp32 runs as Winograd, 0.85-0.89
on its 3x3 stride-1 layers of 7x7 outputs (the int8 kernel's planes are 9 wide for 7 outputs
there, fp32's direct kernel holds up; the rule takes outputs 4-7 wide with Winograd's channel
minimums), and 1.05-1.99 on every other kind (the 7x7 stem, 3x3 stride 2, 1x1 stride 2, the
classifier Gemm). With 7-bit weights (ONNX Runtime's ``reduce_range=True``; x86 targets,
``CompileOptions.conv_quads7``) the quad kernel with ``vpmaddubsw`` (32 exact multiply-adds per
instruction pair) runs every kind faster than fp32: on ResNet-18 70-88 GMAC/s on the 3x3
stride-1 layers, 1.13-1.47x fp32's Winograd and direct kernels (docs/performance.md), so those
stay integer. ``float_conv_reason`` encodes that as a rule;
where it returns a reason, the fusion passes leave the convolution float (its dequantized
weights on the fp32 kernels) and ``--quantize int8`` does not quantize it (with full-range
weights: on such x86 targets it writes 7-bit conv weights, ``calibrate.conv_weight_qmax``, so
none stays float). Targets with an int8
dot instruction (4 products per lane and instruction) keep every convolution integer: a fat
bundle shares one graph between its levels, so one that carries x86-64-v4+vnni keeps them
integer for its AVX2 level too.

Full-range weights on those x86 targets can take the same quad kernel split in two
(ops/qconv_quads.py ``split_quads``): the main loop, then per output channel a loop over the
share ``s`` of its (output channel, step) words holding a pair over ``vpmaddubsw``'s bound,
each costing up to ``SPLIT_WORD_COST`` main-loop row steps: time ~ (1 + SPLIT_WORD_COST s)
x the 7-bit kernel's. The 7-bit kernel is 1.2-1.65x faster than the k-pair kernel on
ResNet-18's layers and 1.08-1.46x faster than fp32 on its 3x3 stride-1 ones
(docs/performance.md), so the split is taken for s <= ``SPLIT_MAX_SHARE`` (against the k-pair
kernel, ``split_quads_pays``) and keeps a 3x3 stride-1 layer integer for s <=
``SPLIT_MAX_SHARE_FLOAT`` (against fp32, ``float_conv_reason``'s ``split_share``).

3x3 stride-1 layers whose full-range weights take neither (a share past
``SPLIT_MAX_SHARE_FLOAT``) run the exact integer Winograd F(2x2, 3x3) kernel instead of fp32's
(``int_winograd``): int16 transformed inputs and weights, ``vpmaddwd``, 16 products per 2x2
tile and input channel pair where the direct kernel takes 36. On Zen 5 under the AVX2 mask
(bench/avx2_host.py) ``vpmaddwd`` + ``vpaddd`` runs at the ``vpmaddubsw`` loop's 131 GMAC/s
(fp32 FMA 66), and ResNet-18's 56x56, 28x28 and 14x14 layers took 573-621 us against the
k-pair kernel's 1044-1177 and ORT's saturating int8 kernel's 907-936 (docs/performance.md).
Outputs under 8 wide (7x7: the channel-lane sign kernel, 1195 us; the Winograd kernel 1376 us
there, its 8.4 MB of int16 weights streamed once per call) keep the choices above.
"""

from __future__ import annotations

from typing import Sequence

from ..options import CompileOptions
from .layout import WINO_MIN_CHANNELS, WINO_MIN_OUT, uses_winograd


# bench/int8_split.py (AVX2 + FMA host, no AVX-512): split / 7-bit time 1.04-1.08 at 3 % of
# the words, 1.05-1.14 at 5 %, 1.15-1.24 at 10 %, 1.30 at 20 %, 1.60 at 40 %: 1-2.8 row steps
# a word, the larger on layers of many steps (planes out of L1)
SPLIT_WORD_COST = 2.0
KPAIR_OVER_7BIT = 1.2      # the least k-pair / 7-bit kernel time measured on ResNet-18's layers
FP32_OVER_7BIT = 1.08      # the least fp32 / 7-bit time on its 3x3 stride-1 layers
SPLIT_MAX_SHARE = (KPAIR_OVER_7BIT - 1) / SPLIT_WORD_COST
SPLIT_MAX_SHARE_FLOAT = (FP32_OVER_7BIT - 1) / SPLIT_WORD_COST


# With run-time image sizes the k-pair kernel (static shapes only) is no alternative: a
# convolution whose split does not pay against it runs on the float chain instead (fp32's
# kernel over the exact integers, then a quantize pass and the activation's lut8 table as
# kernels of their own, where the integer kernel writes bytes with the table folded into its
# copy out). On the open-size QDQ PP-OCR classifier under bench/avx2_host.py (Zen 5 as AVX2 +
# FMA, kernel minimums): 1x1 88 x 16 at share 0.24-0.31, 10.3 us against 6.7 + 2.9 + 3.4;
# 24 x 8 at 0.40, 5.7 against 5.5 + 1.9; 200 x 32 at 0.19, 20.9 against 18.9 + 6.0 + 4.9; its
# first layer (3x3 / 2, 8 x 3, share 0.19) integer too: the whole bundle 0.94x. A 3x3 stride-1
# layer keeps ``open_conv_integer``'s own bound (fp32's Winograd).
OPEN_SPLIT_MAX_SHARE = 0.5


def split_quads_pays(share: float) -> bool:
    """Whether the pair-split quad kernel with residual words in ``share`` of its (output
    channel, step) words beats the k-pair kernel (module docstring)."""
    return share <= SPLIT_MAX_SHARE


# Exact integer Winograd F(2x2, 3x3) on those x86 targets (``qconv2d`` ``winograd``, ops/qlinear.py
# ``pack_winograd_weights``, codegen/qgemm_conv.py ``_emit_wino``): ``vpmaddwd`` on int16 transformed
# inputs and weights, 16 products per 4 outputs and input channel against the direct kernel's 36,
# for 3x3 stride-1 layers whose full-range weights neither the 7-bit nor the split quad kernel
# takes (a split share past SPLIT_MAX_SHARE_FLOAT) and whose outputs are at least this wide
# (2x2 tiles, odd sizes with the last row / column dropped; 7x7 outputs keep the channel-lane
# sign kernel: module docstring)
WINO_INT_MIN_OUT = 8


def int_winograd(w_shape: Sequence[int], strides: Sequence[int], out_shape: Sequence[int],
                 groups: int, options: CompileOptions, split_share: float | None) -> bool:
    """Whether a quantized convolution takes the exact integer Winograd kernel (see
    ``WINO_INT_MIN_OUT``): x86 targets without an int8 dot instruction (``options.conv_quads7``,
    not ``int8_dot_targets``; ``options.conv_int_winograd`` not False), a 3x3 stride-1 window,
    groups 1, static output sizes of at least ``WINO_INT_MIN_OUT``, at most
    ``WINO_MAX_CHANNELS`` input channels, int8 weights with a split share over
    ``SPLIT_MAX_SHARE_FLOAT`` (``conv_int_winograd`` True: any int8 weights and output
    size)."""
    from ..ops.qlinear import WINO_MAX_CHANNELS

    if (not options.conv_quads7 or options.int8_dot_targets or options.conv_int_winograd is False
            or groups != 1 or split_share is None or len(w_shape) != 4 or len(out_shape) != 4):
        return False
    if tuple(w_shape[2:]) != (3, 3) or tuple(strides) != (1, 1) or w_shape[1] > WINO_MAX_CHANNELS:
        return False
    if not all(isinstance(d, int) for d in out_shape):
        return False
    if options.conv_int_winograd:
        return True
    if min(out_shape[2:]) < WINO_INT_MIN_OUT:
        return False
    return split_share > SPLIT_MAX_SHARE_FLOAT


def float_conv_reason(w_shape: Sequence[int], strides: Sequence[int],
                      out_shape: Sequence[int], groups: int, options: CompileOptions,
                      w7: bool = False, split_share: float | None = None,
                      signed_ok: bool = False) -> str | None:
    """Why a quantized convolution of weights ``w_shape`` (O, C, KH, KW), ``strides`` and
    static NCHW ``out_shape`` should stay float on ``options``' targets (resolved options,
    ``CompileOptions.for_targets``), or None when the integer kernel is at least as fast.
    ``w7``: its integer weights (w - w_zp) all fit 7 bits (|w| <= 64), so with
    ``options.conv_quads7`` it takes the ``vpmaddubsw`` quad kernel, faster than fp32 on every
    kind measured. ``split_share``: with full-range weights, the share of the split quad
    kernel's words with a residual (``split_quads_pays``), None when not known; ``signed_ok``:
    they lie in [-127, 127], so on outputs 4-7 wide (with 16k output channels) the
    channel-lane sign kernel takes them (passes/quad_weights.py ``use_signed_x``), faster
    than fp32 there."""
    if not options.int8_float_convs or options.int8_dot_targets or groups != 1:
        return None
    if int_winograd(w_shape, strides, out_shape, groups, options, split_share):
        return None
    if options.conv_quads7 and (w7 or (split_share is not None
                                       and split_share <= SPLIT_MAX_SHARE_FLOAT)):
        return None
    if len(w_shape) != 4 or len(out_shape) != 4 or not all(isinstance(d, int) for d in out_shape):
        return None
    if tuple(w_shape[2:]) != (3, 3) or tuple(strides) != (1, 1):
        return None
    if options.winograd and options.pack_conv_weights and uses_winograd(w_shape, strides,
                                                                        out_shape):
        return "fp32 runs it as Winograd F(2x2, 3x3), faster than the int8 kernel without VNNI"
    if (options.pack_conv_weights and 4 <= min(out_shape[2:]) < WINO_MIN_OUT
            and w_shape[1] >= WINO_MIN_CHANNELS[0] and w_shape[0] >= WINO_MIN_CHANNELS[1]):
        if (signed_ok and options.conv_quads7 and options.conv_oc_lanes
                and options.conv_signed_x is not False and w_shape[0] % 16 == 0
                and max(out_shape[2:]) < WINO_MIN_OUT):
            return None     # the channel-lane sign kernel (bench/int8_split.py: 1.35x fp32)
        return (f"the int8 kernel is slower than fp32's on {out_shape[2]}x{out_shape[3]} "
                "outputs without VNNI")
    return None


def open_split_pays(share: float) -> bool:
    """Whether a convolution with run-time image sizes takes the split quad kernel at
    ``share`` (``OPEN_SPLIT_MAX_SHARE``, against the float chain)."""
    return share <= OPEN_SPLIT_MAX_SHARE


def open_conv_integer(w_shape: Sequence[int], strides: Sequence[int], groups: int,
                      options: CompileOptions, split_share: float | None) -> bool:
    """Whether a quantized convolution with run-time image sizes (an open batch, height or
    width) takes the integer kernel: only the quad kernel has a run-time-size form
    (codegen/qgemm_conv.py ``_emit_open``), so int8 weights (``split_share`` not None) that
    ``passes/quad_weights.py`` packs as quads (every level a quad kernel, or on x86 7-bit
    weights or a split that pays), and not a 3x3 stride-1 layer that ``float_conv_reason``
    would keep on fp32's (run-time-size Winograd) kernels for its share of split words."""
    if groups != 1 or split_share is None or len(w_shape) != 4:
        return False
    if options.conv_quads:
        return True
    if not options.conv_quads7 or (split_share > 0 and not split_quads_pays(split_share)
                                   and not open_split_pays(split_share)):
        return False
    slow3x3 = (tuple(w_shape[2:]) == (3, 3) and tuple(strides) == (1, 1)
               and split_share > SPLIT_MAX_SHARE_FLOAT and options.int8_float_convs
               and not options.int8_dot_targets)
    return not slow3x3
