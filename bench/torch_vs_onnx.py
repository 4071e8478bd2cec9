"""The PyTorch frontend against the ONNX path, on the same models: each model is exported twice,
``mlcpack.export_torch`` (torch.export -> IR) and ``torch.onnx.export`` (TorchScript exporter,
opset 17) -> ``import_onnx`` -> the same compiler, both for this host's level. Printed per model:
whether the two bundles have the same kernels (names without their counters, in order), both
bundles' latency (1 thread, runs alternating between the two in rounds: median and min of the
per-round medians), their ratio, and ONNX Runtime's latency on the ONNX file (1 thread) beside
them. Error: max|bundle - eager torch| / max|eager torch| per path.

    .venv/bin/python bench/torch_vs_onnx.py [--rounds 15] [--budget 0.2] [MODEL ...]
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import corpus_torch as C  # noqa: E402
import models as M  # noqa: E402


class LSTMTagger(nn.Module):
    def __init__(self, size: int = 64, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.lstm = nn.LSTM(size, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        return self.head(y)


class Encoder(nn.Module):
    """``nn.TransformerEncoderLayer`` (its attention is scaled_dot_product_attention)."""

    def __init__(self, d: int = 128, heads: int = 4, ff: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0,
                                                                 batch_first=True)
                                      for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


MODELS = {
    "mlp": lambda: M.mlp(1),
    "resnet18": lambda: (M.ResNet18(), torch.randn(1, 3, 112, 112)),
    "mobilenet_v2": lambda: (M.MobileNetV2(), torch.randn(1, 3, 112, 112)),
    "mobilenet_v3_small": lambda: (C.MobileNetV3Small(), torch.rand(1, 3, 112, 112)),
    "efficientnet_b0": lambda: (C.EfficientNetB0(), torch.rand(1, 3, 112, 112)),
    "transformer_encoder": lambda: (Encoder(), torch.randn(1, 64, 128)),
    "lstm": lambda: (LSTMTagger(), torch.randn(1, 32, 64)),
    "unet": lambda: (C.UNet((8, 16, 32, 64)), torch.rand(1, 3, 64, 64)),
}


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    """Model ``name`` with seeded weights, BatchNorm statistics randomized, in eval mode."""
    return M.seeded(MODELS[name])


def kernel_kinds(path: Path) -> list[str]:
    """The bundle's kernel names without their counters (fused_conv2d12_add3 -> fused_conv2d_add)."""
    from mlcpack.runtime.describe import describe

    return [re.sub(r"\d+", "", k["name"]) for k in describe(path)["kernels"]]


def onnx_bytes(net: nn.Module, x: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # grad on: nn.TransformerEncoderLayer's eval fast path is not exportable
        torch.onnx.export(net, (x,), buf, input_names=["x"], output_names=["output"],
                          opset_version=17, dynamo=False)
    return buf.getvalue()


def export_both(net: nn.Module, x: torch.Tensor, folder: Path) -> tuple[Path, Path, bytes]:
    import onnx

    import mlcpack
    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    via_torch = folder / "torch.mlc"
    mlcpack.export_torch(net, (x,), via_torch, input_names=["x"], target="host", check=False)
    data = onnx_bytes(net, x)
    mod, _ = import_onnx(onnx.load_from_string(data))
    via_onnx = folder / "onnx.mlc"
    export_module(mod, via_onnx, ExportOptions(target="host"))
    return via_torch, via_onnx, data


def _per_run(fn, budget: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget and n >= 3:
            return elapsed / n


def compare(name: str, rounds: int, budget: float) -> dict:
    import onnxruntime as ort

    from mlcpack.runtime import load

    net, x = build(name)
    with torch.no_grad():
        ref = net(x).numpy()
    with tempfile.TemporaryDirectory() as tmp:
        via_torch, via_onnx, data = export_both(net, x, Path(tmp))
        kinds_t, kinds_o = kernel_kinds(via_torch), kernel_kinds(via_onnx)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        feeds = {"x": x.numpy()}
        with load(via_torch, threads=1) as mt, load(via_onnx, threads=1) as mo:
            errors = [float(np.abs(m.run(feeds)["output"] - ref).max() / np.abs(ref).max())
                      for m in (mt, mo)]
            runs = {"torch": lambda: mt.run(feeds), "onnx": lambda: mo.run(feeds),
                    "ort": lambda: sess.run(None, feeds)}
            times: dict[str, list[float]] = {k: [] for k in runs}
            order = list(runs)
            for i in range(rounds):  # alternate, and rotate who goes first, so the shared
                for key in order[i % 3:] + order[:i % 3]:  # machine's load hits all three
                    times[key].append(_per_run(runs[key], budget))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    low = {k: min(v) * 1e6 for k, v in times.items()}
    return {"name": name, "same_kernels": kinds_t == kinds_o, "kernels": (len(kinds_t),
                                                                          len(kinds_o)),
            "median_us": med, "min_us": low, "ratio": med["torch"] / med["onnx"],
            "errors": errors, "kinds": (kinds_t, kinds_o)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per round and path")
    parser.add_argument("--diff", action="store_true", help="print the kernel lists that differ")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'model':<20} {'same kernels':>13} {'torch path us':>18} {'onnx path us':>18} "
          f"{'torch/onnx':>10} {'ORT us':>16}  max rel error (torch path, onnx path)")
    for name in args.models:
        r = compare(name, args.rounds, args.budget)
        med, low = r["median_us"], r["min_us"]
        same = "yes" if r["same_kernels"] else f"no {r['kernels'][0]}/{r['kernels'][1]}"
        print(f"{name:<20} {same:>13} {med['torch']:>9.1f} ({low['torch']:>6.1f}) "
              f"{med['onnx']:>9.1f} ({low['onnx']:>6.1f}) {r['ratio']:>10.3f} "
              f"{med['ort']:>8.1f} ({low['ort']:>5.1f})  {r['errors'][0]:.1e}, {r['errors'][1]:.1e}",
              flush=True)
        if args.diff and not r["same_kernels"]:
            print("  torch:", " ".join(r["kinds"][0]))
            print("  onnx: ", " ".join(r["kinds"][1]))


if __name__ == "__main__":
    main()
