"""One layer at a time against ONNX Runtime: the depthwise, SE and 1x1 layers of the
MobileNetV3 / EfficientNet / LCNet / ConvNeXt corpus models, each as a one-layer ONNX model.

Run: .venv/bin/python bench/layers.py [NAME ...] [--threads 1] [--budget 1.5] [--target host]
                                      [--list]
NAME is a layer of the list (or a prefix of names), or an ad-hoc ``dw:C,H,K,S[,ACT]`` /
``conv:C,H,O,K,S[,ACT]``. Each layer is exported (``--target``, default this host) and timed
alternating with ORT (bench.py's ``time_interleaved``); prints median and min of both and the
ratios, and checks the outputs agree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import time_interleaved  # noqa: E402


def _act(nodes, name, kind):
    from onnx import helper

    if kind is None:
        return name
    out = name + "_" + kind
    if kind == "relu":
        nodes.append(helper.make_node("Relu", [name], [out]))
    elif kind == "hswish":
        nodes.append(helper.make_node("HardSwish", [name], [out]))
    elif kind == "hsig":
        nodes.append(helper.make_node("HardSigmoid", [name], [out], alpha=1 / 6, beta=0.5))
    elif kind == "silu":
        nodes.append(helper.make_node("Sigmoid", [name], [name + "_s"]))
        nodes.append(helper.make_node("Mul", [name, name + "_s"], [out]))
    elif kind == "sigmoid":
        nodes.append(helper.make_node("Sigmoid", [name], [out]))
    else:
        raise ValueError(kind)
    return out


def conv_model(c, h, w, o, k, s, groups, act=None, se=False):
    """x (1,c,h,w) -> Conv(o, k x k, stride s, pad k//2, groups) + bias -> act [-> SE]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    wt = rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c // groups * k * k)
    inits = [numpy_helper.from_array(wt.astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal(o) * 0.1).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, k],
                              strides=[s, s], pads=[k // 2] * 4, group=groups)]
    y = _act(nodes, "c", act)
    if se:
        r = max(8, o // 4)
        inits += [numpy_helper.from_array((rng.standard_normal((r, o, 1, 1)) * 0.1).astype(
                  np.float32), "W1"),
                  numpy_helper.from_array(np.zeros(r, np.float32), "B1"),
                  numpy_helper.from_array((rng.standard_normal((o, r, 1, 1)) * 0.1).astype(
                      np.float32), "W2"),
                  numpy_helper.from_array(np.zeros(o, np.float32), "B2")]
        nodes += [helper.make_node("GlobalAveragePool", [y], ["p"]),
                  helper.make_node("Conv", ["p", "W1", "B1"], ["f1"]),
                  helper.make_node("Relu", ["f1"], ["f1r"]),
                  helper.make_node("Conv", ["f1r", "W2", "B2"], ["f2"])]
        g = _act(nodes, "f2", "hsig")
        nodes.append(helper.make_node("Mul", [y, g], ["se"]))
        y = "se"
    oh = (h + 2 * (k // 2) - k) // s + 1
    ow = (w + 2 * (k // 2) - k) // s + 1
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, o, oh, ow])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dw(c, h, k, s, act="hswish", se=False):
    return conv_model(c, h, h, c, k, s, c, act, se)


LAYERS = {
    # efficientnet_b0 depthwise (+SiLU)
    "eff_dw3_112_32": lambda: dw(32, 112, 3, 1, "silu"),
    "eff_dw3s2_112_96": lambda: dw(96, 112, 3, 2, "silu"),
    "eff_dw3_56_144": lambda: dw(144, 56, 3, 1, "silu"),
    "eff_dw5s2_56_144": lambda: dw(144, 56, 5, 2, "silu"),
    "eff_dw5_28_240": lambda: dw(240, 28, 5, 1, "silu"),
    "eff_dw3s2_28_240": lambda: dw(240, 28, 3, 2, "silu"),
    "eff_dw3_14_480": lambda: dw(480, 14, 3, 1, "silu"),
    "eff_dw5_14_672": lambda: dw(672, 14, 5, 1, "silu"),
    "eff_dw5s2_14_672": lambda: dw(672, 14, 5, 2, "silu"),
    "eff_dw5_7_1152": lambda: dw(1152, 7, 5, 1, "silu"),
    "eff_pw_112_16_96": lambda: conv_model(16, 112, 112, 96, 1, 1, 1, "silu"),
    "eff_pw_56_24_144": lambda: conv_model(24, 56, 56, 144, 1, 1, 1, "silu"),
    "eff_pw_14_80_480": lambda: conv_model(80, 14, 14, 480, 1, 1, 1, "silu"),
    # mobilenet_v3_small
    "mv3_dw3s2_112_16_se": lambda: conv_model(16, 112, 112, 16, 3, 2, 16, "relu", True),
    "mv3_dw3s2_56_72": lambda: dw(72, 56, 3, 2, "relu"),
    "mv3_dw5s2_28_96": lambda: dw(96, 28, 5, 2, "hswish"),
    "mv3_dw5_14_240_se": lambda: dw(240, 14, 5, 1, "hswish", True),
    "mv3_dw5_14_120_se": lambda: dw(120, 14, 5, 1, "hswish", True),
    "mv3_dw5s2_14_288_se": lambda: dw(288, 14, 5, 2, "hswish", True),
    "mv3_dw5_7_576_se": lambda: dw(576, 7, 5, 1, "hswish", True),
    "mv3_pw_7_96_576": lambda: conv_model(96, 7, 7, 576, 1, 1, 1, "hswish"),
    # pp_lcnet
    "lc_dw3_112_16": lambda: dw(16, 112, 3, 1, "hswish"),
    "lc_dw3s2_112_32": lambda: dw(32, 112, 3, 2, "hswish"),
    "lc_dw5_14_256": lambda: dw(256, 14, 5, 1, "hswish"),
    "lc_dw5s2_14_256": lambda: dw(256, 14, 5, 2, "hswish"),
    # convnext_atto
    "cnx_dw7_56_40": lambda: dw(40, 56, 7, 1, None),
    "cnx_dw7_28_80": lambda: dw(80, 28, 7, 1, None),
    "cnx_dw7_14_160": lambda: dw(160, 14, 7, 1, None),
    "cnx_dw7_7_320": lambda: dw(320, 7, 7, 1, None),
}


def layer_model(name: str):
    """A named layer, or an ad-hoc one: ``dw:C,H,K,S[,ACT]`` (depthwise) or
    ``conv:C,H,O,K,S[,ACT]`` (ACT: relu, hswish, hsig, silu, sigmoid; none if left out)."""
    if name in LAYERS:
        return LAYERS[name]()
    kind, _, spec = name.partition(":")
    parts = spec.split(",")
    act = parts.pop() if parts and not parts[-1].isdigit() else None
    nums = [int(v) for v in parts]
    if kind == "dw" and len(nums) == 4:
        return dw(*nums, act=act)
    if kind == "conv" and len(nums) == 5:
        c, h, o, k, s = nums
        return conv_model(c, h, h, o, k, s, 1, act)
    raise SystemExit(f"unknown layer {name!r}; --list shows the named ones, or write "
                     "dw:C,H,K,S[,ACT] or conv:C,H,O,K,S[,ACT]")


def bench_layer(name: str, threads: int, budget: float, target: str, work: Path) -> dict:
    import onnx
    import onnxruntime as ort

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.runtime import load

    model = layer_model(name)
    path = work / f"{name}.onnx"
    onnx.save(model, str(path))
    bundle = work / f"{name}.mlc"
    mod, _ = import_onnx(str(path))
    export_module(mod, bundle, ExportOptions(target=target))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    feeds = {"x": x}
    with load(bundle, threads=threads) as mlc:
        expected = sess.run(None, feeds)[0]
        got = list(mlc.run(feeds).values())[0]
        err = float(np.max(np.abs(got - expected)))
        (o_med, o_min, _), (m_med, m_min, _) = time_interleaved(
            [lambda: sess.run(None, feeds), lambda: mlc.run(feeds)], budget)
    return {"layer": name, "ort_med": o_med, "ort_min": o_min, "mlc_med": m_med,
            "mlc_min": m_min, "err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layers", nargs="*")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=1.5)
    ap.add_argument("--target", default="host")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(LAYERS))
        return
    names = []
    for pat in args.layers or list(LAYERS):
        hits = [n for n in LAYERS if n == pat or n.startswith(pat)] if ":" not in pat else [pat]
        if not hits:
            sys.exit(f"unknown layer {pat!r}; --list shows them")
        names += hits
    print(f"{'layer':22s} {'ORT med':>8s} {'ORT min':>8s} {'mlc med':>8s} {'mlc min':>8s} "
          f"{'ratio':>6s} {'(min)':>6s} {'max err':>8s}   (us, {args.threads} thread(s))")
    ratios = []
    with tempfile.TemporaryDirectory() as work:
        for name in names:
            r = bench_layer(name, args.threads, args.budget, args.target, Path(work))
            ratios.append(r["mlc_min"] / r["ort_min"])
            print(f"{name:22s} {r['ort_med']:8.1f} {r['ort_min']:8.1f} {r['mlc_med']:8.1f} "
                  f"{r['mlc_min']:8.1f} {r['mlc_med'] / r['ort_med']:6.2f} "
                  f"{r['mlc_min'] / r['ort_min']:6.2f} {r['err']:8.1e}", flush=True)
    print(f"geometric mean of min ratios: {float(np.exp(np.mean(np.log(ratios)))):.2f}")


if __name__ == "__main__":
    main()
