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
of an AVX2 host): a convolution whose weights all fit 7 bits (|w| <= 64, what ONNX Runtime's
``quantize_static(reduce_range=True)`` writes) is packed the same way, marked ``w7``; its
levels without VNNI run the quad kernel with ``vpmaddubsw`` + ``vpmaddwd`` by ones (AVX2;
x86-64-v2: the exact products in portable IR), the VNNI level with ``vpdpbusd``. Others keep
the k-pairs and the ``vpmaddwd`` kernel.

x86 quad convolutions on small output planes (``use_oc_lanes``; ``options.conv_oc_lanes``)
store the quads 16 output channels per step instead of 6 (``oc_lanes``): the channel-lane
kernel (codegen/qgemm_conv.py ``_emit_oc_lanes``) computes only the outputs, where the
pixel-lane kernel computes each plane row's padding columns too (a 7x7 output: 64 lanes for 49
outputs; 14x14: 224 for 196; 28x28: 848 for 784)."""

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


def fits_madd7(w: np.ndarray) -> bool:
    """Whether every int8 weight has |w| <= 64: then ``vpmaddubsw``'s int16 sum of two
    products uint8 x int8 never saturates (2 * 255 * 64 = 32640 <= 32767), so with a widening
    ``vpmaddwd`` by ones it is ``vpdpbusd``, exact (codegen/qgemm.py ``_dpbusd``)."""
    return w.size == 0 or int(np.abs(w.astype(np.int16)).max()) <= 64


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


def _vector_case(v: Call) -> bool:
    """The 1x1 convolution of a 1x1 image: a matrix-vector kernel on the k-pairs."""
    _, _, h, w = v.args[0].type.shape
    return (h, w, *v.attrs["kernel"]) == (1, 1, 1, 1) and not any(v.attrs["padding"])


def pack_conv_quads(mod: IRModule, options: CompileOptions) -> IRModule:
    """Every takeable ``qconv2d`` (module docstring) becomes ``qconv2d_quads`` when
    ``options.conv_quads`` names the targets' architecture; else, with ``options.conv_quads7``
    (x86 targets), those whose weights all fit 7 bits (``fits_madd7``), marked ``w7``; else the
    module is unchanged."""
    arch = options.conv_quads
    w7 = False
    if not arch and options.conv_quads7:
        arch, w7 = "x86_64", True
    if not arch:
        return mod
    from ..ops.qconv_quads import QUADS_KIND, folded_bias, pairs_to_quads, quads_to_oc_lanes

    made: dict[tuple[int, bool], Constant] = {}   # one quad constant per k-pair constant

    def visit(b, lookup):
        v = b.value
        if not (isinstance(v, Call) and v.op == "qconv2d"):
            return None
        x, wk, x_zp, bias = v.args[:4]
        if not (isinstance(wk, Constant) and isinstance(x_zp, Constant)
                and isinstance(bias, Constant) and wk.data.dtype == np.int8
                and not _vector_case(v)):
            return None
        if w7 and not fits_madd7(wk.data):
            return None
        kh, kw = v.attrs["kernel"]
        shift = quad_shift(arch, x.type.dtype)
        lanes = arch == "x86_64" and use_oc_lanes(v, options)
        key = (id(wk), lanes)
        if key not in made:
            quads = pairs_to_quads(wk.data, kh * kw)
            if lanes:
                quads = quads_to_oc_lanes(quads, v.attrs["out_channels"])
            made[key] = Constant(f"{wk.name}_q4" + ("c" if lanes else ""), quads)
        wq = made[key]
        zp = int(np.asarray(x_zp.data).reshape(())) + shift
        folded = Constant(f"{bias.name}_q4", folded_bias(bias.data, wq.data, zp))
        args = [lookup(x), wq, x_zp, folded] + [lookup(a) for a in v.args[4:]]
        attrs = {**v.attrs, "shift": shift}
        if w7:
            attrs["w7"] = True
        if lanes:
            attrs["oc_lanes"] = True
        return Call(QUADS_KIND, args, attrs, v.type)

    return map_functions(mod, lambda fn: rewrite_function(fn, visit))
