"""int8 vs fp32, mlcpack vs ONNX Runtime, 1 thread, engines alternating in one process.

    .venv/bin/python bench/int8.py [--budget 6] [--models resnet18,mlp,resnet_small]
                                   [--kernels] [--no-models] [--corpus ppocr_rec]

Models (int8 forms: ``--quantize`` = mlcpack's own static quantization, packager/calibrate.py,
calibrated on 8 random inputs; ``QDQ`` = onnxruntime.quantization.quantize_static, QDQ format,
per-channel int8 weights, uint8 activations, calibrated on 8 random feeds):
  resnet18:     bench/models.py's ResNet-18 (random weights), 1x3x224x224
  mlp:          x [32,256] -> MatMul 512 + Add, Relu, MatMul 512 + Add, Relu, MatMul 10
  resnet_small: x [1,16,32,32] -> 3x3 conv 32 + Relu, 3x3 conv 32 + Relu, residual Add,
                1x1 conv 64, GlobalAveragePool, Gemm 10
Rows: mlcpack fp32, mlcpack int8 (--quantize), mlcpack int8 (QDQ), the same QDQ bundle with
``MLCPACK_INT8_KERNELS=0`` (the float32-exact chains the integer kernels replaced), ORT fp32,
ORT on the QDQ file; median / min ms per run, and each bundle's size on disk.

``--corpus NAMES`` (e.g. ppocr_rec,mobilenet_v3_small; bench/corpus.py, fetched with
``bench/corpus.py --fetch NAME``): a real model at its corpus input shape, converted to opset
13 and quantized by ONNX Runtime (``quant_pre_process``, then ``quantize_static``: QDQ,
per-channel int8 weights, uint8 activations, calibrated on 8 of the corpus's realistic inputs
of other seeds). Rows: mlcpack fp32 bundle, mlcpack bundle of the QDQ file, ORT on the QDQ
file, ORT fp32; median / min ms alternating (1 thread each), the least CPU time of a run
(process time, alternating: robust to a loaded machine), the QDQ bundle's time over ORT QDQ's
and over the fp32 bundle's, and argmax agreement on the corpus input.
``--accuracy N`` (text-line recognizers: ppocr_rec): also each engine's accuracy against
ground truth on N digits-only and N mixed text lines drawn with Pillow (bench/text_lines.py;
seeds 2 and 1 as bench/calibration.py's held-out sets): 1 - character error rate of the
greedy CTC decoding with the model's own dictionary (the issue's "digits accuracy").

``--layers NAMES [--baseline CHECKOUT]``: the same QDQ bundle profiled per kernel (``Model.
profile``, minimums over ``--budget`` alternating rounds of 20 runs): its ten slowest kernels
with the kernel each one is (``mlcpack inspect``'s choice; "generic loop nest" is the slow
fallback), and each depthwise layer beside the fp32 bundle's (and a baseline checkout's QDQ
bundle).

``--kernels``: one layer each, integer kernel (codegen/qgemm.py) vs the fp32 kernel of the same
shape, wall-clock (alternating) and CPU time (least of 20 calls; robust on a loaded machine):
a ResNet-18 3x3 conv (64->64, 56x56), its 3x3 conv at 14x14 (256->256), a 1x1 conv (256->256
at 14x14), MobileNetV3-small's stem (3->16, 3x3 stride 2 at 224x224), a 1x1 expansion with few
input channels (16->72 at 56x56) and a squeeze-and-excitation 1x1 (576->144 on a 1x1 image), and
MLP Linear layers (1x512 @ 512x1000, 32x512 @ 512x512). Model rows also give
each engine's least CPU time of a run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))


def _save(nodes, x_shape, y_shape, inits, path: Path) -> Path:
    graph = h.make_graph(nodes, path.stem, [h.make_tensor_value_info("x", T.FLOAT, x_shape)],
                         [h.make_tensor_value_info("y", T.FLOAT, y_shape)],
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def mlp(path: Path) -> Path:
    rng = np.random.default_rng(0)
    f = lambda *s: (rng.normal(0, 1, s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m1"]), h.make_node("Add", ["m1", "b1"], ["a1"]),
             h.make_node("Relu", ["a1"], ["r1"]),
             h.make_node("MatMul", ["r1", "w2"], ["m2"]), h.make_node("Add", ["m2", "b2"], ["a2"]),
             h.make_node("Relu", ["a2"], ["r2"]), h.make_node("MatMul", ["r2", "w3"], ["y"])]
    inits = {"w1": f(256, 512), "b1": np.zeros(512, np.float32), "w2": f(512, 512),
             "b2": np.zeros(512, np.float32), "w3": f(512, 10)}
    return _save(nodes, [32, 256], [32, 10], inits, path)


def resnet_small(path: Path) -> Path:
    rng = np.random.default_rng(1)
    f = lambda *s: (rng.normal(0, 1, s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)  # noqa
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c2"], ["r2"]), h.make_node("Add", ["r1", "r2"], ["a"]),
             h.make_node("Conv", ["a", "w3", "b3"], ["c3"]),
             h.make_node("GlobalAveragePool", ["c3"], ["g"]), h.make_node("Flatten", ["g"], ["fl"]),
             h.make_node("Gemm", ["fl", "wf", "bf"], ["y"], transB=1)]
    inits = {"w1": f(32, 16, 3, 3), "b1": np.zeros(32, np.float32), "w2": f(32, 32, 3, 3),
             "b2": np.zeros(32, np.float32), "w3": f(64, 32, 1, 1), "b3": np.zeros(64, np.float32),
             "wf": f(10, 64), "bf": np.zeros(10, np.float32)}
    return _save(nodes, [1, 16, 32, 32], [1, 10], inits, path)


def resnet18(path: Path) -> Path:
    cached = HERE / ".cache" / "resnet18.onnx"
    if not cached.exists():
        cached.parent.mkdir(exist_ok=True)
        from models import build
        build("resnet18", str(cached))
    path.write_bytes(cached.read_bytes())
    return path


BUILDERS = {"resnet18": resnet18, "mlp": mlp, "resnet_small": resnet_small}


def _mlcpack_quantize(fp32: Path, out: Path, feeds: list[dict]) -> Path:
    from mlcpack.packager.calibrate import quantize_onnx

    name = next(iter(feeds[0]))
    q = quantize_onnx(fp32, [f[name] for f in feeds])
    try:
        onnx.save(q.model, out)
    finally:
        q.close()
    return out


def _export(path: Path, out: Path, int8_kernels: bool = True) -> Path:
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.options import CompileOptions

    mod, _ = import_onnx(str(path))
    options = CompileOptions.from_environ(os.environ, int8_kernels=int8_kernels)
    export_module(mod, out, ExportOptions(target="host", check=False, compile=options))
    return out


def bench_model(name: str, tmp: Path, budget: float) -> None:
    import onnxruntime as ort

    import quant_models as qm
    from bench import time_interleaved
    from mlcpack.runtime import load

    fp32 = BUILDERS[name](tmp / f"{name}.onnx")
    feeds = qm.random_feeds(fp32, seed=11, n=8)
    own = _mlcpack_quantize(fp32, tmp / f"{name}_mlcq.onnx", feeds)
    qdq = qm.ort_quantize(fp32, tmp / f"{name}_qdq.onnx", "QDQ", per_channel=True)
    feed = qm.random_feeds(fp32)[0]
    bundles = [("mlcpack fp32", _export(fp32, tmp / f"{name}.mlc")),
               ("mlcpack int8 --quantize", _export(own, tmp / f"{name}_mlcq.mlc")),
               ("mlcpack int8 QDQ", _export(qdq, tmp / f"{name}_qdq.mlc")),
               ("mlcpack QDQ, fp32 kernels", _export(qdq, tmp / f"{name}_qdq_f32.mlc", False))]
    fns, labels, models, sizes = [], [], [], []
    for label, path in bundles:
        m = load(path, threads=1)
        models.append(m)
        fns.append(lambda m=m: m.run(feed))
        labels.append(label)
        sizes.append(path.stat().st_size)
    sessions = {}
    for label, path in (("ORT fp32", fp32), ("ORT QDQ file", qdq)):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        sessions[label] = s
        fns.append(lambda s=s: s.run(None, feed))
        labels.append(label)
        sizes.append(path.stat().st_size)
    ref32 = sessions["ORT fp32"].run(None, feed)[0]
    refq = sessions["ORT QDQ file"].run(None, feed)[0]
    print(f"{name}:")
    for label, m in zip(labels, models):
        got = list(m.run(feed).values())[0]
        print(f"  {label:26s} max |y - ORT fp32| {np.abs(got - ref32).max():.3g}   "
              f"max |y - ORT QDQ| {np.abs(got - refq).max():.3g}")
    print(f"  ORT QDQ file               max |y - ORT fp32| {np.abs(refq - ref32).max():.3g}   "
          f"(|ORT fp32| max {np.abs(ref32).max():.3g})")
    res = time_interleaved(fns, budget)
    cpu = [_cpu_min(fn, 5) for fn in fns]
    base, base_cpu = res[0][1], cpu[0]
    iq = labels.index("ORT QDQ file")
    for label, (med, mn, n), c, size in zip(labels, res, cpu, sizes):
        print(f"  {label:26s} median {med / 1e3:8.2f} ms  min {mn / 1e3:8.2f} ms  cpu "
              f"{c / 1e3:8.2f} ms | vs mlcpack fp32 x{base / mn:4.2f} (min) x{base_cpu / c:4.2f} "
              f"(cpu) | / ORT QDQ {mn / res[iq][1]:4.2f} (min) {c / cpu[iq]:4.2f} (cpu) | "
              f"{n} runs, {size / 1e6:.2f} MB")
    for m in models:
        m.close()


def corpus_qdq(name: str, tmp: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(fp32 ONNX at the corpus shape, opset >= 13; ORT's QDQ per-channel copy; the feed)."""
    import corpus
    from onnx import version_converter
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    spec = corpus.MODELS[name]
    (inp, (shape, kind)), = spec.inputs.items()
    model = onnx.load(str(corpus.model_path(name)))
    dims = next(i for i in model.graph.input if i.name == inp).type.tensor_type.shape.dim
    for d, v in zip(dims, shape):
        d.ClearField("dim_param")
        d.dim_value = v
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:     # per-channel DequantizeLinear needs opset 13
        model = version_converter.convert_version(model, 13)
    fp32 = tmp / f"{name}.onnx"
    onnx.save(model, fp32)
    pre = tmp / f"{name}_pre.onnx"
    quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    calib = [{inp: corpus.realistic_input(kind, shape, np.random.default_rng(100 + i))}
             for i in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(calib)

        def get_next(self):
            return next(self.feeds, None)

    qdq = tmp / f"{name}_qdq.onnx"
    quantize_static(str(pre), str(qdq), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return fp32, qdq, {inp: corpus.realistic_inputs(name)[inp]}


def text_accuracy(name: str, engines: dict, n: int) -> None:
    """Each engine's (a function x -> output) accuracy on ``n`` digits-only and ``n`` mixed
    text lines: 1 - character error rate of greedy CTC decoding."""
    import corpus
    import text_lines

    meta = {p.key: p.value for p in onnx.load(str(corpus.model_path(name)),
                                              load_external_data=False).metadata_props}
    chars = meta.get("character", "").split("\n")
    rng_d, rng_m = np.random.default_rng(2), np.random.default_rng(1)
    sets = {"digits": [text_lines.text_line(rng_d, True) for _ in range(n)],
            "mixed": [text_lines.text_line(rng_m) for _ in range(n)]}
    print(f"{name}: accuracy (1 - CER, greedy CTC) on {n} digits-only / {n} mixed lines")
    for label, fn in engines.items():
        acc = []
        for lines in sets.values():
            errors = sum(text_lines.edit_distance(text_lines.ctc_decode(fn(x), chars), t)
                         for x, t in lines)
            acc.append(1 - errors / sum(len(t) for _, t in lines))
        print(f"  {label:14s} digits {acc[0]:7.2%}   mixed {acc[1]:7.2%}")


def bench_corpus(name: str, tmp: Path, budget: float, accuracy: int = 0) -> None:
    import onnxruntime as ort

    from bench import time_interleaved
    from mlcpack.runtime import load

    fp32, qdq, feed = corpus_qdq(name, tmp)
    models = [load(_export(fp32, tmp / f"{name}.mlc"), threads=1),
              load(_export(qdq, tmp / f"{name}_qdq.mlc"), threads=1)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sessions = [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                for p in (qdq, fp32)]
    labels = ["mlcpack fp32", "mlcpack QDQ", "ORT QDQ", "ORT fp32"]
    outs = [list(m.run(feed).values())[0] for m in models] + [s.run(None, feed)[0]
                                                             for s in sessions]
    print(f"{name} (QDQ per-channel by onnxruntime.quantization; argmax over the last axis "
          "agreeing with ORT fp32 / ORT QDQ):")
    for label, y in zip(labels, outs):
        print(f"  {label:14s} {np.mean(y.argmax(-1) == outs[3].argmax(-1)):6.1%} "
              f"{np.mean(y.argmax(-1) == outs[2].argmax(-1)):6.1%}   max |y - ORT QDQ| "
              f"{np.abs(y - outs[2]).max():.3g}")
    if accuracy:
        key = next(iter(feed))
        text_accuracy(name, {label: fn for label, fn in zip(labels, [
            lambda x, m=m: list(m.run({key: x}).values())[0] for m in models] + [
            lambda x, s=s: s.run(None, {key: x})[0] for s in sessions])}, accuracy)
    fns = [lambda m=m: m.run(feed) for m in models] + [lambda s=s: s.run(None, feed)
                                                       for s in sessions]
    res = time_interleaved(fns, budget)
    cpu = [float("inf")] * len(fns)
    for _ in range(10):      # least CPU time of a run, the engines alternating
        for i, fn in enumerate(fns):
            cpu[i] = min(cpu[i], _cpu_min(fn, 1))
    for label, (med, mn, n), c in zip(labels, res, cpu):
        print(f"  {label:14s} median {med / 1e3:8.2f} ms  min {mn / 1e3:8.2f} ms  cpu "
              f"{c / 1e3:8.2f} ms  ({n} runs)")
    print(f"  mlcpack QDQ / ORT QDQ: median {res[1][0] / res[2][0]:.2f}, min "
          f"{res[1][1] / res[2][1]:.2f}, cpu {cpu[1] / cpu[2]:.2f};  mlcpack QDQ / mlcpack fp32: "
          f"median {res[1][0] / res[0][0]:.2f}, min {res[1][1] / res[0][1]:.2f}, cpu "
          f"{cpu[1] / cpu[0]:.2f}")
    for m in models:
        m.close()


def bench_kernels(tmp: Path, budget: float) -> None:
    from bench import time_interleaved
    from helpers import build_op_module
    from mlcpack.packager.export import ExportOptions, export_module
    from mlcpack.packager.ops.qlinear import pack_conv_weights, pack_weights
    from mlcpack.runtime import load

    rng = np.random.default_rng(0)

    def model(op, inputs, mask, name, **attrs):
        mod = build_op_module(op, inputs, mask, **attrs)
        export_module(mod, tmp / name, ExportOptions(target="host", check=False))
        m = load(tmp / name, threads=1)
        feeds = {f"x{i}": a for i, (a, c) in enumerate(zip(inputs, mask)) if not c}
        return m, (lambda: m.run(feeds))

    consts = [False] + [True] * 5
    cases = []
    # ResNet-18's 3x3 / 1x1; MobileNetV3-small's stem (3->16 3x3/2 at 224), a 1x1 expansion
    # with few input channels (16->72 at 56) and a squeeze-and-excitation 1x1 (576->144, 1x1)
    for c, hw, o, k, s in ((64, 56, 64, 3, 1), (256, 14, 256, 3, 1), (256, 14, 256, 1, 1),
                           (3, 224, 16, 3, 2), (16, 56, 72, 1, 1), (576, 1, 144, 1, 1)):
        x = rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)
        wd = rng.integers(-127, 128, (o, c, k, k))
        p = k // 2
        qi = [x, pack_conv_weights(wd), np.array(128, np.int32), np.zeros(o, np.int32),
              np.full(o, 1e-4, np.float32), np.array(0, np.float32)]
        qa = dict(out_channels=o, kernel=(k, k), strides=(s, s), padding=(p,) * 4,
                  dtype="uint8")
        fi = [x.astype(np.float32), wd.astype(np.float32)]
        fa = dict(strides=(s, s), padding=(p,) * 4, dilation=(1, 1), groups=1)
        ohw = (hw + 2 * p - k) // s + 1
        cases.append((f"conv {c}->{o} {k}x{k}/{s} {hw}x{hw}", c * o * k * k * ohw * ohw,
                      ("qconv2d", qi, consts, qa), ("nn.conv2d", fi, [False, True], fa)))
    for m_, k, n in ((1, 512, 1000), (32, 512, 512)):
        x = rng.integers(0, 256, (m_, k)).astype(np.uint8)
        wd = rng.integers(-127, 128, (k, n))
        wp = pack_weights(wd)
        npn = wp.shape[0] * 8
        qi = [x, wp, np.array(128, np.int32), np.zeros(npn, np.int32),
              np.full(npn, 1e-4, np.float32), np.array(0, np.float32)]
        cases.append((f"linear {m_}x{k} @ {k}x{n}", m_ * k * n,
                      ("qmatmul", qi, consts, dict(n=n, dtype="uint8")),
                      ("matmul", [x.astype(np.float32), wd.astype(np.float32)], [False, True],
                       {})))
    print("kernels (1 thread; int8 = codegen/qgemm.py, fp32 = the fp32 kernel of that shape):")
    for i, (label, macs, q, f) in enumerate(cases):
        mq, fq = model(q[0], q[1], q[2], f"kq{i}.mlc", **q[3])
        mf, ff = model(f[0], f[1], f[2], f"kf{i}.mlc", **f[3])
        (medq, minq, _), (medf, minf, _) = time_interleaved([fq, ff], budget)
        cq, cf = _cpu_min(fq), _cpu_min(ff)
        print(f"  {label:28s} int8 median {medq:9.1f} us min {minq:9.1f} us cpu {cq:9.1f} us "
              f"({macs / cq / 1e3:5.1f} GMAC/s) | fp32 median {medf:9.1f} us min {minf:9.1f} us "
              f"cpu {cf:9.1f} us ({macs / cf / 1e3:5.1f} GMAC/s) | int8 x{cf / cq:4.2f} (cpu), "
              f"x{minf / minq:4.2f} (wall min)")
        mq.close()
        mf.close()


def profile_corpus(name: str, tmp: Path, rounds: int, baseline: str) -> None:
    """``--layers``: the QDQ bundle's ten slowest kernels (profile minimums, with the kernel
    each rule chose: "generic loop nest" is the slow fallback), and every depthwise layer's
    minimum beside the fp32 bundle's depthwise kernel of the same ONNX Conv (and ``baseline``'s
    QDQ bundle: another checkout, exported by its own ``.venv/bin/mlcpack``); the bundles
    profiled in alternating rounds of 20 runs."""
    import subprocess

    from mlcpack.runtime import load
    from mlcpack.runtime.describe import describe

    fp32, qdq, feed = corpus_qdq(name, tmp)
    paths = {"fp32": _export(fp32, tmp / f"{name}.mlc"), "QDQ": _export(qdq, tmp / f"{name}_q.mlc")}
    if baseline:
        out = tmp / f"{name}_base.mlc"
        subprocess.run([str(Path(baseline) / ".venv/bin/mlcpack"), "export", str(qdq), "-o",
                        str(out), "--target", "host", "--no-check"], check=True,
                       capture_output=True)
        paths["QDQ baseline"] = out
    models = {k: load(p, threads=1) for k, p in paths.items()}
    if baseline:
        ours, base = (list(models[k].run(feed).values())[0] for k in ("QDQ", "QDQ baseline"))
        print(f"{name}: QDQ bundle's output against the baseline's: max |diff| "
              f"{np.abs(ours.astype(np.float64) - base).max():.3g} "
              f"({'bit for bit' if np.array_equal(ours, base) else 'not equal'})")
    best: dict[str, np.ndarray] = {}
    steps = {}
    for _ in range(rounds):
        for k, m in models.items():
            prof = m.profile(feed, runs=20)
            mins = prof.durations_ns.min(axis=0) / 1e3
            best[k] = mins if k not in best else np.minimum(best[k], mins)
            steps[k] = prof.steps
    choice = {k: {r["symbol"]: r.get("kernel") for r in describe(p)["kernels"]}
              for k, p in paths.items()}
    print(f"{name}: QDQ bundle's ten slowest kernels (min us over {rounds * 20} runs; 1 thread)")
    order = np.argsort(-best["QDQ"])
    for rank, i in enumerate(order[:10], 1):
        st = steps["QDQ"][i]
        print(f"  {rank:2d} {best['QDQ'][i]:8.1f}  {st.name[:34]:34s} "
              f"{choice['QDQ'].get(st.symbol) or st.kind:34s} "
              f"{', '.join(s.name for s in st.sources[:2])}")

    generic = [(rank, i) for rank, i in enumerate(order, 1)
               if choice["QDQ"].get(steps["QDQ"][i].symbol) == "generic loop nest"]
    if generic:
        rank, i = generic[0]
        print(f"  first generic loop nest: #{rank} of {len(order)}, {best['QDQ'][i]:.1f} us "
              f"({steps['QDQ'][i].name}); {len(generic)} in all, "
              f"{sum(best['QDQ'][j] for _, j in generic):.1f} us")
    # the depthwise kernels in program order (the fused QDQ kernel's sources name only its
    # QuantizeLinear; the fp32 kernel's name the Conv: an AveragePool's depthwise kernel is left
    # out)
    dw = {}
    for k in models:
        dw[k] = [(st, float(best[k][i])) for i, st in enumerate(steps[k]) if st.kind == "kernel"
                 and ("qdwconv2d" in st.name or (k == "fp32" and "depthwise" in (
                     choice[k].get(st.symbol) or "") and any(s.op == "Conv" for s in st.sources)))]
    cols = [k for k in models if len(dw[k]) == len(dw["QDQ"])]
    for k in models:
        if k not in cols:
            print(f"  {k}: {len(dw[k])} depthwise kernels (QDQ {len(dw['QDQ'])}), "
                  f"{sum(t for _, t in dw[k]):.1f} us in all; not compared per layer")
    if cols:
        print(f"  depthwise layers, min us: {' / '.join(cols)}")
        for j, (st, _) in enumerate(dw[cols[0]]):
            conv = next((s.name for s in st.sources if s.op == "Conv"), st.name)
            print(f"    {conv[-40:]:40s} " + " ".join(f"{dw[c][j][1]:8.1f}" for c in cols))
        print(f"    {'all':40s} " + " ".join(f"{sum(t for _, t in dw[c]):8.1f}" for c in cols))
    for m in models.values():
        m.close()


def _cpu_min(fn, runs: int = 20) -> float:
    """Least CPU time of one call, in µs (process time: the kernels run on this thread, so a
    loaded machine's time slices taken by others do not count)."""
    import time

    best = float("inf")
    for _ in range(runs):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=6.0, help="seconds of timing per model")
    ap.add_argument("--models", default="resnet18,mlp,resnet_small")
    ap.add_argument("--kernels", action="store_true", help="also time single layers")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--corpus", default="", help="corpus models to time as ORT QDQ copies")
    ap.add_argument("--accuracy", type=int, default=0, help="with --corpus ppocr_rec: "
                    "accuracy of every engine on this many digits-only and mixed text lines")
    ap.add_argument("--layers", default="", help="corpus models to profile: top-10 kernels "
                    "of the QDQ bundle, depthwise layers against the fp32 bundle")
    ap.add_argument("--baseline", default="", help="with --layers: a checkout whose "
                    ".venv exports a baseline QDQ bundle (e.g. /work/main)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="int8bench"))
    for name in filter(None, args.layers.split(",")):
        profile_corpus(name, tmp, max(2, int(args.budget)), args.baseline)
    for name in filter(None, args.corpus.split(",")):
        bench_corpus(name, tmp, args.budget, args.accuracy)
    if args.kernels:
        bench_kernels(tmp, args.budget / 2)
    if not args.no_models:
        for name in args.models.split(","):
            bench_model(name, tmp, args.budget)


if __name__ == "__main__":
    main()
