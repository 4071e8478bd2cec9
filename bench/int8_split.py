"""One quantized convolution, full-range int8 weights: the pair-split ``vpmaddubsw`` quad kernel
(ops/qconv_quads.py ``split_quads``) and the sign kernel (``signed_x``: vpmaddubsw(|x|, sign(w,
x)) on int8 planes) against the k-pair ``vpmaddwd`` kernel on the same weights, the 7-bit quad
kernel on the weights clamped to |w| <= 64 (the split's floor: its main loop alone), and the
same convolution as an fp32 bundle, at several shares of (output channel, step) words with a
residual. 1 thread, the kernels alternating, least CPU time of a call (robust on a loaded host).

    .venv/bin/python bench/int8_split.py [--rounds 7] [--shares 0,0.05,0.1,0.2,0.4]

Layers: ResNet-18's 3x3 stride-1 convolutions at 56x56 (64 ch), 14x14 (256 ch) and 7x7 (512
ch), its 3x3 stride-2 ones at 28x28 (128 -> 256) and 14x14 (256 -> 512), a 1x1 stride-2
downsample (64 -> 128 at 56x56) and the 7x7 stride-2 stem (3 -> 64 at 224x224). Weights:
|w| <= 40 at random, then one same-sign pair over the bound (127, 127 or -127, -127) in the
given share of the words. The split and the sign kernel are forced (``SPLIT_MAX_SHARE`` 1,
``conv_signed_x`` False / True), whatever the rules would take; the quad kernels take the
channel lanes where ``use_oc_lanes`` does (not the split).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "kernels"))

LAYERS = {   # C, H, W, O, k, stride, pad
    "3x3 s1 64@56": (64, 56, 56, 64, 3, 1, 1),
    "3x3 s1 256@14": (256, 14, 14, 256, 3, 1, 1),
    "3x3 s2 128->256@28": (128, 28, 28, 256, 3, 2, 1),
    "3x3 s1 512@7": (512, 7, 7, 512, 3, 1, 1),
    "3x3 s2 256->512@14": (256, 14, 14, 512, 3, 2, 1),
    "1x1 s2 64->128@56": (64, 56, 56, 128, 1, 2, 0),
    "7x7 s2 3->64@224": (3, 224, 224, 64, 7, 2, 3),
}


def weights(rng, o: int, c: int, k: int, share: float) -> np.ndarray:
    """|w| <= 40, plus one pair over the bound in ``share`` of the (output channel, step)
    words."""
    wd = rng.integers(-40, 41, (o, c, k, k))
    cg, taps = -(-c // 4), k * k
    for word in np.flatnonzero(rng.random(o * cg * taps) < share):
        oc, rest = divmod(int(word), cg * taps)
        t, q = divmod(rest, cg)
        ch = min(4 * q + 2 * int(rng.integers(2)), c - 2)
        wd[oc, ch:ch + 2, t // k, t % k] = 127 if rng.random() < 0.5 else -127
    return wd


def bundle(path: Path, x, wd, spec, **fields) -> Path:
    from helpers import build_op_module
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.qlinear import pack_conv_weights
    from mlcpack.packager.options import CompileOptions
    from test_int8_gemm import MASK

    c, h, w, o, k, s, p = spec
    args = [x, pack_conv_weights(wd), np.array(0, np.int32),
            np.zeros(o, np.int32), np.full(o, 1e-4, np.float32), np.array(0, np.float32)]
    attrs = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=(p, p, p, p),
                 dtype="uint8")
    export_module(build_op_module("qconv2d", args, MASK, **attrs), path,
                  ExportOptions(target="x86-64-v3", check=False,
                                compile=CompileOptions(**fields)))
    return path


def bundle_fp32(path: Path, x, wd, spec) -> Path:
    """The same convolution in float32 (weights wd as float, Winograd / packed kernels as
    the fp32 export picks them): what an int8 layer left float runs."""
    from helpers import build_op_module
    from mlcpack.packager.export import ExportOptions, export_module

    c, h, w, o, k, s, p = spec
    mod = build_op_module("nn.conv2d", [x.astype(np.float32), wd.astype(np.float32)],
                          [False, True], strides=(s, s), padding=(p, p, p, p))
    export_module(mod, path, ExportOptions(target="x86-64-v3", check=False))
    return path


def main() -> None:
    from mlcpack.packager.ops.qconv_quads import word_share, pairs_to_quads
    from mlcpack.packager.ops.qlinear import pack_conv_weights
    from mlcpack.packager.passes import int8_cost
    from mlcpack.runtime import load

    int8_cost.SPLIT_MAX_SHARE = 1.0      # the split at every share measured (not the rule's)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--shares", default="0,0.05,0.1,0.2,0.4")
    ap.add_argument("--layers", default=",".join(LAYERS))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    tmp = Path(tempfile.mkdtemp(prefix="int8split"))
    print(f"{'layer':20s} {'share':>6s} {'k-pair':>8s} {'split':>8s} {'sign':>8s} {'7-bit':>8s}"
          f" {'fp32':>8s}  split / 7-bit  sign / 7-bit  k-pair / sign  fp32 / sign"
          "  (us, least CPU time of a call)")
    for name in args.layers.split(","):
        spec = LAYERS[name]
        c, h, w, o, k = spec[:5]
        x = rng.integers(0, 256, (1, c, h, w)).astype(np.uint8)
        for share in (float(v) for v in args.shares.split(",")):
            wd = weights(rng, o, c, k, share)
            got = word_share(pairs_to_quads(pack_conv_weights(wd), k * k), o)
            tag = f"{name.replace(' ', '_').replace('@', '_')}_{share}"
            paths = {"k-pair": bundle(tmp / f"{tag}_kp.mlc", x, wd, spec, conv_quads7=False,
                                      int8_float_convs=False)}
            paths["split"] = bundle(tmp / f"{tag}_sp.mlc", x, wd, spec, int8_float_convs=False,
                                    conv_signed_x=False)
            # the sign kernel (ops/qconv_quads.py ``signed_x``) on the same weights, everywhere
            paths["sign"] = bundle(tmp / f"{tag}_sg.mlc", x, wd, spec, int8_float_convs=False,
                                   conv_signed_x=True)
            paths.update({
                     "7-bit": bundle(tmp / f"{tag}_7.mlc", x, np.clip(wd, -64, 64), spec,
                                     int8_float_convs=False),
                          "fp32": bundle_fp32(tmp / f"{tag}_f.mlc", x, wd, spec)})
            models = {n: load(p, threads=1) for n, p in paths.items()}
            best = dict.fromkeys(models, np.inf)
            for r in range(args.rounds):
                for n in list(models)[r % 5:] + list(models)[:r % 5]:
                    m = models[n]
                    feed = {"x0": x.astype(np.float32) if n == "fp32" else x}
                    m.run(feed)
                    for _ in range(args.calls):
                        c0 = time.process_time()
                        m.run(feed)
                        best[n] = min(best[n], time.process_time() - c0)
            us = {n: v * 1e6 for n, v in best.items()}
            print(f"{name:20s} {got:6.3f} {us['k-pair']:8.0f} {us['split']:8.0f} "
                  f"{us['sign']:8.0f} {us['7-bit']:8.0f} {us['fp32']:8.0f}  "
                  f"{us['split'] / us['7-bit']:13.2f}  {us['sign'] / us['7-bit']:12.2f}  "
                  f"{us['k-pair'] / us['sign']:13.2f}  {us['fp32'] / us['sign']:11.2f}",
                  flush=True)
            for m in models.values():
                m.close()


if __name__ == "__main__":
    main()
