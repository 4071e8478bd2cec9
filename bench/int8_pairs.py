"""How often full-range int8 convolution weights break ``vpmaddubsw``'s pair bound, per layer
of ONNX Runtime QDQ files: what the pair-split quad kernel (passes/quad_weights.py, ops/
qconv_quads.py ``split_quads``) pays for its residual pass.

    .venv/bin/python bench/int8_pairs.py FILE_qdq.onnx [...]
    .venv/bin/python bench/int8_pairs.py --make DIR        # writes the QDQ files first

``vpmaddubsw`` adds the products of two adjacent bytes (uint8 x in [0, 255] times int8 w) into
one int16 with saturation; in the quad layout those are channels 4q, 4q+1 (and 4q+2, 4q+3) of
one tap. The pair cannot saturate iff 255 (max(w0, 0) + max(w1, 0)) <= 32767 and 255 (min(w0,
0) + min(w1, 0)) >= -32768: any pair of opposite signs, a same-sign pair with |w0| + |w1| <=
128. Per layer: the share of weight pairs that break it, of quad words (one output channel,
one step of 4 channels) holding one, and of the kernel's blocks (6 output channels x one step)
holding one; the split kernel's residual loops run the words. Totals weighted by each layer's
multiply-adds.

``--make DIR``: bench/models.py's ResNet-18 (random weights, 1x3x224x224) and the corpus's
YOLOv8n (NudeNet 320n, trained weights; bench/corpus.py), each through ``quant_pre_process``
and ``quantize_static`` (QDQ, int8 weights, uint8 activations, 8 calibration feeds), with
per-channel and per-tensor weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper as nh

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def conv_weights(path: Path):
    """(name, w - w_zp [O, C, KH, KW] int64, output pixels) of each group-1 Conv whose weight
    is a DequantizeLinear of an int8 initializer."""
    from onnx import shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.output)}
    for n in model.graph.node:
        if n.op_type != "Conv" or n.input[1] not in dq:
            continue
        if any(a.name == "group" and a.i != 1 for a in n.attribute):
            continue
        d = dq[n.input[1]]
        w = inits.get(d.input[0])
        if w is None or w.dtype != np.int8 or w.ndim != 4:
            continue
        zp = inits[d.input[2]] if len(d.input) > 2 and d.input[2] else np.zeros(1, np.int8)
        wd = w.astype(np.int64) - zp.astype(np.int64).reshape(-1, 1, 1, 1)
        out = shapes.get(n.output[0], [])
        pixels = int(np.prod(out[2:])) if len(out) == 4 and all(out[2:]) else 1
        yield n.name or n.output[0], wd, pixels


def stats(wd: np.ndarray) -> tuple[float, float, float]:
    """(pairs, quad words, 6-row blocks) breaking the bound, as shares, in the kernel's layout
    (pairs and words of the real output channels; a short last quad's zero pairs count)."""
    from mlcpack.packager.ops.qconv_quads import pair_overflow, pairs_to_quads
    from mlcpack.packager.ops.qlinear import pack_conv_weights

    o, _, kh, kw = wd.shape
    wq = pairs_to_quads(pack_conv_weights(wd), kh * kw)         # [ot, steps, 6, 4]
    ot, steps = wq.shape[:2]
    w = wq.reshape(ot, steps, 6, 2, 2)
    bad = pair_overflow(w[..., 0], w[..., 1]).transpose(0, 2, 1, 3).reshape(ot * 6, steps, 2)
    blocks = bad.reshape(ot, 6, steps, 2).any(axis=(1, 3))
    return float(bad[:o].mean()), float(bad[:o].any(axis=2).mean()), float(blocks.mean())


def make(out: Path) -> list[Path]:
    import quant_models as qm
    from models import build
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out.mkdir(parents=True, exist_ok=True)
    made = []
    r18 = out / "resnet18.onnx"
    if not r18.exists():
        build("resnet18", str(r18))
    from int8 import corpus_qdq
    yolo, _, _ = corpus_qdq("yolov8n_320", out)     # writes yolov8n_320_qdq.onnx per-channel
    made.append(out / "yolov8n_320_qdq.onnx")
    for src in (r18, yolo):
        pre = out / f"{src.stem}_pre.onnx"
        if not pre.exists():
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        for per_channel in ((True, False) if src is r18 else (False,)):
            dst = out / f"{src.stem}_qdq{'' if per_channel else '_pt'}.onnx"
            if not dst.exists():
                qm.ort_quantize(pre, dst, "QDQ", per_channel=per_channel)
            made.append(dst)
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--make", type=Path, default=None, help="write the QDQ files into DIR")
    ap.add_argument("--layers", action="store_true", help="one line per layer")
    args = ap.parse_args()
    files = list(args.files) + (make(args.make) if args.make else [])
    for path in files:
        tot = np.zeros(3)
        macs = 0
        for name, wd, pixels in conv_weights(path):
            s = np.array(stats(wd))
            m = wd.size * pixels
            tot += s * m
            macs += m
            if args.layers:
                print(f"  {name[:40]:40s} {str(wd.shape):18s} pairs {s[0]:6.2%} words "
                      f"{s[1]:6.2%} blocks {s[2]:6.2%}  |w|max {np.abs(wd).max()}")
        if macs:
            t = tot / macs
            print(f"{path.name}: {macs / 1e6:.0f} M MACs; breaking the pair bound (MAC-weighted): "
                  f"pairs {t[0]:.2%}, quad words {t[1]:.2%}, 6-row blocks {t[2]:.2%}")


if __name__ == "__main__":
    main()
