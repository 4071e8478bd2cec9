"""Pack the quad kernels' convolution weights at export (``qconv2d`` -> ``qconv2d_quads``).

On x86-64-v4+vnni (``vpdpbusd``) and aarch64+dotprod (``sdot``) a ``qconv2d`` with int8
weights runs the quad kernel (codegen/qgemm_conv.py), which reads the weights as int8 channel quads
per output channel and step and subtracts zp' * sum(w) per output channel. From the bundle's
k-pair layout (``ops/qlinear.pack_conv_weights``, what every other level reads) it regroups
them and sums them on every call. When every level of the bundle runs the quad kernel
(``options.conv_quads``: the architecture whose quad kernel they run, "" when some level
does not), this pass stores them as the quad kernel reads them instead (``ops/qconv_quads.py``)
and folds the correction into the bias, so the call starts at its planes. Bundles with other
levels too (a portable bundle: x86-64-v2 ... v4+vnni) keep the k-pairs that those read: storing
both layouts would double the int8 weights.

Taken: int8 weights, a constant x zero point and bias (a static QDQ model's; a dynamically
quantized input's zero point is computed at run time), and not the 1x1-image case
(``QConv._emit_vector``, codegen/qgemm_conv.py, reads the k-pairs directly).

x86 bundles whose levels are not all VNNI (``options.conv_quads7``, the default portable set
of an AVX2 host): a convolution whose weights keep every byte pair within ``vpmaddubsw``'s
bound (ops/qconv_quads.py ``pair_overflow``; any with |w| <= 64, what ONNX Runtime's
``quantize_static(reduce_range=True)`` writes) is packed the same way, marked ``w7``; its
levels without VNNI run the quad kernel with ``vpmaddubsw`` + ``vpmaddwd`` by ones (AVX2;
x86-64-v2: the exact products in portable IR), the VNNI level with ``vpdpbusd``. Full-range
weights (ORT without ``reduce_range``) take the same kernel, marked ``w7`` and ``split``, where
the pair split pays (``ops/qconv_quads.split_quads``: main quads within ``vpmaddubsw``'s pair
bound, the excess of the pairs over it in residual loops over the (output channel, step)
words that hold one; passes/int8_cost.py ``split_quads_pays`` on the share of such words).
Others keep the k-pairs and the ``vpmaddwd`` kernel, but for full-range weights in [-127, 127]
on small output planes where the split does not pay (``use_signed_x``: the channel lanes with
the pixel lanes under 80 % used, outputs 4-7 wide): the sign kernel, marked ``w7`` and
``signed_x``, shift -128 for uint8 x (int8 planes; ops/qconv_quads.py), exact for any such
weights with no residual, 1.2-1.5x the k-pair kernel's speed there and 1.35x fp32's on a 3x3
layer of 7x7 outputs (``options.conv_signed_x``: True takes it for all such weights, False
never).

x86 quad convolutions on small output planes (``use_oc_lanes``; ``options.conv_oc_lanes``)
store the quads 16 output channels per step instead of 6 (``oc_lanes``): the channel-lane
kernel (codegen/qgemm_conv.py ``_emit_oc_lanes``) computes only the outputs, where the
pixel-lane kernel computes each plane row's padding columns too (a 7x7 output: 64 lanes for 49
outputs; 14x14: 224 for 196; 28x28: 848 for 784). Split weights stay in the 6-row tiles of the
pixel-lane kernel, whose residual loops run per row of them.

The same x86 bundles: a 3x3 stride-1 ``qconv2d`` that ``int8_cost.int_winograd`` gives the exact
integer Winograd kernel keeps the k-pair op with its weights transformed, U' = (2G) w (2G)^T
(ops/qlinear.py ``pack_winograd_weights``: int16, 16 positions for 9 taps), marked
``winograd`` (codegen/qgemm_conv.py ``_emit_wino``)."""

from __future__ import annotations

import numpy as np

from ..ir.graph import Call, Constant, IRModule
from ..options import CompileOptions
from .common import map_functions, rewrite_function


def quad_shift(arch: str, x_dtype: str) -> int:
    """What the quad kernel adds to x on ``arch`` (codegen/qgemm.py ``_quad_shift``):
    ``vpdpbusd`` multiplies uint8 (int8 x + 128), ``sdot`` int8 (uint8 x - 128)."""
    if arch == "aarch64":
        return -128 if x_dtype == "uint8" else 0
    return 128 if x_dtype == "int8" else 0


def split_share(wd: np.ndarray) -> float | None:
    """For integer conv weights ``wd`` [O, C, KH, KW] (w - w_zp): the share of the quad
    kernel's (output channel, step) words holding a pair over ``vpmaddubsw``'s bound (what the
    split's residual loops run; ops/qconv_quads.py ``word_share``), None when they do not fit
    int8."""
    from ..ops.qconv_quads import pairs_to_quads, word_share
    from ..ops.qlinear import pack_conv_weights

    if wd.ndim != 4 or not wd.size or wd.min() < -128 or wd.max() > 127:
        return None
    kh, kw = wd.shape[2:]
    return word_share(pairs_to_quads(pack_conv_weights(wd), kh * kw), wd.shape[0])


# The pixel-lane kernel's share of useful lanes below which the channel-lane kernel is taken.
# ResNet-18 (reduce_range QDQ, AVX2 host, docs/performance.md): its 7x7, 14x14 and 28x28 3x3
# layers (0.77, 0.875, 0.925) run 24 %, 10 % and 5 % faster on channel lanes; the 3x3/2 to
# 56x56 and 56x56 layers (0.96, 0.966), the stem (0.97) and the 1x1/2 to 28x28 and 14x14 (1.0,
# 0.94) slower (the channel-lane kernel's tiles end every 144-288 steps there, and its output
# is transposed)
OC_LANES_BELOW = 0.93
PIXEL_LANES = 16    # the pixel-lane kernel's outputs per step (two 8-lane vectors)


def pixel_lane_share(v: Call) -> float:
    """Of the pixel-lane kernel's lanes (rows of plane columns, 16 a step), the share that
    carries outputs (codegen/qgemm_conv.py: plane rows ceil((W + pads) / stride) wide)."""
    _, _, h, w = v.args[0].type.shape
    _, _, oh, ow = v.type.shape
    sw = v.attrs["strides"][1]
    pads = v.attrs["padding"]
    wq = -(-(w + pads[1] + pads[3]) // sw)
    return oh * ow / (-(-oh * wq // PIXEL_LANES) * PIXEL_LANES)


def use_oc_lanes(v: Call, options: CompileOptions) -> bool:
    """Whether an x86 quad ``qconv2d`` takes the channel-lane kernel: static shapes, output
    channels a multiple of 16, and the pixel-lane kernel would waste more than
    ``1 - OC_LANES_BELOW`` of its lanes."""
    if not options.conv_oc_lanes:
        return False
    shapes = (*v.args[0].type.shape, *v.type.shape)
    if not all(isinstance(d, int) for d in shapes):
        return False
    if v.attrs["out_channels"] % 16:       # ops/qconv_quads.py OC_LANE_ROWS
        return False
    return pixel_lane_share(v) < OC_LANES_BELOW


# The pixel-lane share under which the channel-lane sign kernel (``signed_x``) beats the k-pair
# kernel on full-range weights (bench/int8_split.py, AVX2 host: 1.47x on a 3x3 512-channel
# layer of 7x7 outputs, share 0.77, and 1.17x on a stride-2 one to 7x7; 0.88x at 14x14, 0.875)
SIGNED_X_BELOW = 0.8


def use_signed_x(v: Call, options: CompileOptions, split_pays: bool) -> bool:
    """Whether an x86 ``qconv2d`` with full-range weights in [-127, 127] (some byte pairs over
    ``vpmaddubsw``'s bound) takes the sign kernel: ``options.conv_signed_x`` when set (True:
    always, for comparison), else where it takes the channel lanes with the pixel lanes under
    ``SIGNED_X_BELOW`` used (outputs 4-7 wide), the split does not pay and no level has an int8
    dot instruction (a VNNI level would pay ``vpsignb`` beside each ``vpdpbusd``; one graph
    serves every level)."""
    if options.conv_signed_x is not None:
        return options.conv_signed_x
    return (not split_pays and not options.int8_dot_targets and use_oc_lanes(v, options)
            and pixel_lane_share(v) < SIGNED_X_BELOW)


def _vector_case(v: Call) -> bool:
    """The 1x1 convolution of a 1x1 image: a matrix-vector kernel on the k-pairs."""
    _, _, h, w = v.args[0].type.shape
    return (h, w, *v.attrs["kernel"]) == (1, 1, 1, 1) and not any(v.attrs["padding"])


def pack_conv_quads(mod: IRModule, options: CompileOptions) -> IRModule:
    """Every takeable ``qconv2d`` (module docstring) becomes ``qconv2d_quads`` when
    ``options.conv_quads`` names the targets' architecture; else, with ``options.conv_quads7``
    (x86 targets), those whose int8 weights keep every byte pair within ``vpmaddubsw``'s
    bound (ops/qconv_quads.py ``pair_overflow``; all of them when |w| <= 64), marked ``w7``,
    and those with pairs over it where the pair split pays (``int8_cost.split_quads_pays``),
    marked ``w7`` and ``split`` with the residual as two more inputs after y_zp; else the
    module is unchanged."""
    arch = options.conv_quads
    w7 = False
    if not arch and options.conv_quads7:
        arch, w7 = "x86_64", True
    if not arch:
        return mod
    from ..ops.qconv_quads import (QUADS_KIND, folded_bias, pairs_to_quads, quads_to_oc_lanes,
                                   split_quads, word_share)
    from ..ops.qlinear import pack_winograd_weights, unpack_conv_weights
    from .int8_cost import int_winograd, open_split_pays, split_quads_pays

    made: dict = {}   # one quad constant per k-pair constant and layout (and its split)

    def visit(b, lookup):
        v = b.value
        if not (isinstance(v, Call) and v.op == "qconv2d"):
            return None
        x, wk, x_zp, bias = v.args[:4]
        if not (isinstance(wk, Constant) and isinstance(x_zp, Constant)
                and isinstance(bias, Constant) and wk.data.dtype == np.int8
                and not _vector_case(v)):
            return None
        kh, kw = v.attrs["kernel"]
        six = (id(wk), False)
        if six not in made:
            made[six] = Constant(f"{wk.name}_q4", pairs_to_quads(wk.data, kh * kw))
        share = word_share(made[six].data, v.attrs["out_channels"]) if w7 else 0.0
        o, c = v.attrs["out_channels"], x.type.shape[1]
        if (w7 and options.conv_signed_x is not True
                and int_winograd((o, c, kh, kw), v.attrs["strides"], v.type.shape, 1, options,
                                 share)):
            # the exact integer Winograd kernel: U' = (2G) w (2G)^T packed as int16 k-pairs
            key = ("wino", id(wk))
            if key not in made:
                made[key] = Constant(f"{wk.name}_wino", pack_winograd_weights(
                    unpack_conv_weights(wk.data, o, c, kh, kw)))
            return Call("qconv2d", [lookup(x), made[key]] + [lookup(a) for a in v.args[2:]],
                        {**v.attrs, "winograd": True}, v.type)
        # full-range weights: the sign kernel where they keep to [-127, 127] and it pays
        # (``use_signed_x``), else the split where it pays, else the k-pair kernel
        signed = (share > 0 and int(wk.data.min()) >= -127
                  and use_signed_x(v, options, split_quads_pays(share)))
        split = share > 0 and not signed
        # run-time image sizes: the split against the float chain (int8_cost.py)
        open_ok = (not all(isinstance(d, int) for d in x.type.shape)
                   and open_split_pays(share))
        if split and not split_quads_pays(share) and not open_ok:
            return None
        shift = quad_shift("aarch64" if signed else arch, x.type.dtype)
        # the split's residual rows are the 6-row tiles': its layers keep the pixel lanes
        lanes = arch == "x86_64" and not split and use_oc_lanes(v, options)
        key = (id(wk), lanes)
        if key not in made:
            made[key] = Constant(f"{wk.name}_q4c",
                                 quads_to_oc_lanes(made[six].data, v.attrs["out_channels"]))
        wq = made[key]
        zp = int(np.asarray(x_zp.data).reshape(())) + shift
        folded = Constant(f"{bias.name}_q4", folded_bias(bias.data, wq.data, zp))
        extra = []
        if split:
            key = ("split", id(wk))
            if key not in made:
                main, index, res = split_quads(wq.data)
                made[key] = (Constant(f"{wk.name}_q4m", main),
                             Constant(f"{wk.name}_q4ri", index), Constant(f"{wk.name}_q4r", res))
            wq, *extra = made[key]
        args = [lookup(x), wq, x_zp, folded] + [lookup(a) for a in v.args[4:6]] + extra
        args += [lookup(a) for a in v.args[6:]]
        attrs = {**v.attrs, "shift": shift}
        if w7:
            attrs["w7"] = True
        if lanes:
            attrs["oc_lanes"] = True
        if split:
            attrs["split"] = True
        if signed:
            attrs["signed_x"] = True
        return Call(QUADS_KIND, args, attrs, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))
