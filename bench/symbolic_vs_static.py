"""Symbolic-shape bundle vs the bundle fully specialized for the same size (issue 12).

    python bench/symbolic_vs_static.py [runs] [small|real|all] [model filter] [--threads N]

Exports each model once with its sizes symbolic and once per size with them fixed, then times
both alternating in one process, 1 thread, with ONNX Runtime (1 thread) beside them: median
and min in microseconds, ratio of medians (``--threads N``: every engine on N threads).
``small`` (the default): the MLP and the encoder
layer of tests/export/test_symbolic_shapes.py; ``real``: the PP-OCRv4 recognizer (W symbolic) and
detector (H, W symbolic) of bench/corpus.py and a ResNet-18 exported from torch with dynamic
H and W (bench/models.py); ``all``: both.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "export"))
from test_symbolic_shapes import encoder_model, mlp_model  # noqa: E402

from mlcpack.frontends.onnx.importer import import_onnx  # noqa: E402
from mlcpack.packager.export import ExportOptions, export_module  # noqa: E402
from mlcpack.runtime.model import load  # noqa: E402


def _bundle(model, shapes, path: Path):
    mod, _ = import_onnx(model, input_shapes=shapes)
    export_module(mod, path, ExportOptions(target="host", check=False))
    return load(path, threads=THREADS)


def _time(a, b, feeds: dict, runs: int, c=None) -> tuple[float, ...]:
    """Medians and mins (us) of a, b (and c, an ONNX Runtime session) run alternating."""
    ta, tb, tc = [], [], []
    for _ in range(3):
        a.run(feeds), b.run(feeds)
        if c is not None:
            c.run(None, feeds)
    for _ in range(runs):
        t0 = time.perf_counter()
        a.run(feeds)
        t1 = time.perf_counter()
        b.run(feeds)
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
        if c is not None:
            c.run(None, feeds)
            tc.append(time.perf_counter() - t2)
    out = (float(np.median(ta)) * 1e6, min(ta) * 1e6, float(np.median(tb)) * 1e6,
           min(tb) * 1e6)
    return out + ((float(np.median(tc)) * 1e6, min(tc) * 1e6) if tc else ())


def _ort(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _resnet18_dynamic() -> bytes:
    import io

    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models as M
    net, x = M.seeded(lambda: (M.ResNet18(), torch.randn(1, 3, 224, 224)))
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(net, (x,), buf, input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False,
                          dynamic_axes={"x": {2: "H", 3: "W"}})
    return buf.getvalue()


def real(runs: int, only: str = "") -> None:
    import onnx
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import corpus
    tmp = Path(tempfile.mkdtemp())
    rows = [("PP-OCRv4 rec", lambda: onnx.load(corpus.model_path("ppocr_rec")),
             {"x": (1, 3, 48, "W")}, [(1, 3, 48, 320), (1, 3, 48, 100)]),
            ("ResNet-18", lambda: onnx.load_from_string(_resnet18_dynamic()), None,
             [(1, 3, 224, 224)]),
            ("PP-OCRv4 det", lambda: onnx.load(corpus.model_path("ppocr_det")),
             {"x": (1, 3, "H", "W")}, [(1, 3, 480, 640), (1, 3, 352, 608), (1, 3, 256, 256)])]
    print("| model, input | symbolic median (min) us | static median (min) us | ratio | "
          "ORT median (min) us |")
    print("|---|---|---|---|---|")
    for i, (name, model, shapes, sizes) in enumerate(rows):
        if only and only.lower() not in name.lower():
            continue
        model = model()
        sym = _bundle(model, shapes, tmp / f"sym{i}.mlc")
        session = _ort(model)
        for j, shape in enumerate(sizes):
            static = _bundle(model, {"x": shape}, tmp / f"static{i}_{j}.mlc")
            x = np.random.default_rng(j).standard_normal(shape).astype(np.float32)
            sm, smin, st, stmin, om, omin = _time(sym, static, {"x": x}, runs, session)
            print(f"| {name} {'x'.join(map(str, shape[2:]))} | {sm:.0f} ({smin:.0f}) | "
                  f"{st:.0f} ({stmin:.0f}) | {sm / st:.2f} | {om:.0f} ({omin:.0f}) |",
                  flush=True)
            static.close()
        sym.close()


def main(runs: int = 200) -> None:
    tmp = Path(tempfile.mkdtemp())
    cases = []
    mlp = _bundle(mlp_model(), None, tmp / "mlp.mlc")
    for n in (1, 17, 64):
        x = np.random.default_rng(n).standard_normal((n, 784)).astype(np.float32)
        cases.append((f"MLP batch {n}", mlp, mlp_model(), {"x": (n, 784)}, {"x": x}))
    enc = _bundle(encoder_model(), None, tmp / "enc.mlc")
    for b, s in ((1, 128), (2, 33), (2, 16)):
        ids = np.random.default_rng(s).integers(0, 50, (b, s)).astype(np.int64)
        pos = np.broadcast_to(np.arange(s, dtype=np.int64), (b, s)).copy()
        cases.append((f"encoder batch {b} seq {s}", enc, encoder_model(),
                      {"ids": (b, s), "positions": (b, s)}, {"ids": ids, "positions": pos}))
    print("| model, size | symbolic median (min) us | static median (min) us | ratio |")
    print("|---|---|---|---|")
    for i, (name, sym, model, shapes, feeds) in enumerate(cases):
        static = _bundle(model, shapes, tmp / f"static{i}.mlc")
        sm, smin, st, stmin = _time(sym, static, feeds, runs)
        print(f"| {name} | {sm:.1f} ({smin:.1f}) | {st:.1f} ({stmin:.1f}) | {sm / st:.2f} |")
        static.close()


THREADS = 1

if __name__ == "__main__":
    if "--threads" in sys.argv:
        i = sys.argv.index("--threads")
        THREADS = int(sys.argv[i + 1])
        del sys.argv[i:i + 2]
    print(f"threads: {THREADS}")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    which = sys.argv[2] if len(sys.argv) > 2 else "small"
    if which in ("small", "all"):
        main(n)
    if which in ("real", "all"):
        real(n, sys.argv[3] if len(sys.argv) > 3 else "")
