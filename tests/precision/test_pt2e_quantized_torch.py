"""PyTorch's PT2E quantization exported to ONNX QDQ (torch.export -> prepare_pt2e / convert_pt2e
with the x86 inductor quantizer (uint8 activations, per-channel int8 weights) or the XNNPACK
quantizer (symmetric int8), then torch.onnx's exporter) takes the integer kernels and matches
ONNX Runtime running the QDQ model as written.

Needs torchao (PT2E's home since torch 2.10) and onnxscript (torch.onnx's exporter of
torch.export programs): tested with torch 2.13.0, torchao 0.18.0, onnxscript 0.7.2; skipped
without them."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from helpers import ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")


def _quantizer(kind: str):
    if kind == "x86":
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
                                                         get_symmetric_quantization_config)
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.c3 = torch.nn.Conv2d(16, 32, 1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = self.c2(y) + y
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.relu(self.c3(y))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


def _pt2e_onnx(kind: str, path: Path) -> Path:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(1, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), _quantizer(kind))
        for _ in range(8):
            prepared(torch.randn(1, 3, 16, 16))
        converted = convert_pt2e(prepared)
        torch.onnx.export(converted, (x,), str(path), dynamo=True, opset_version=18,
                          verbose=False)
    return path


@pytest.mark.parametrize("kind", ["x86", "xnnpack"])
def test_pt2e_qdq_takes_the_integer_kernels(kind: str, tmp_path: Path) -> None:
    path = _pt2e_onnx(kind, tmp_path / f"pt2e_{kind}.onnx")
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / f"pt2e_{kind}.mlc"
    export_module(mod, bundle, ExportOptions(target="host", check=False))
    x = np.random.default_rng(0).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    with load(bundle) as model:
        name = model.inputs[0].name
        got = list(model.run({name: x}).values())[0]
        kernels = [k.name for k in model.schema.plan.kernels]
    for family in ("qconv2d", "qdwconv2d", "qmatmul"):
        assert any(k.startswith(family) for k in kernels), (family, kernels)
    ref = list(ort_outputs(path, {name: x}, threads=1, as_written=True).values())[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
