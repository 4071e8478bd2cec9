"""Quantized real models through the command line's default path (``MLCPACK_SLOW=1`` only:
each export compiles a real network, minutes on the 2-core CI machine). Covered by small models
in the default run: tests/precision/test_quantized_onnx_import.py (ORT's QDQ and QOperator copies, a
saturating
u8 x s8 QLinearMatMul) and tests/precision/test_quantize_at_export.py (a Paddle-style model).

- ONNX Runtime's ``quantize_static`` copies (per-channel int8 weights, uint8 activations,
  calibrated on 8 realistic inputs) of three corpus models, QDQ and QOperator: the default
  export passes its golden check.
- ``--quantize int8 --calibration`` of the float Paddle models as their packages ship them
  (opset 11/12, weights in Constant nodes, symbolic batch, height and width).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SLOW

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402

from mlcpack.packager.calibrate import constants_as_initializers  # noqa: E402

pytestmark = pytest.mark.skipif(not SLOW, reason="real-model exports: MLCPACK_SLOW=1")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

MODELS = {   # name -> (realistic-input kind, input shape)
    "ppocr_cls": ("text_paddle", (1, 3, 48, 192)),
    "pp_lcnet_orientation": ("document_imagenet", (1, 3, 224, 224)),
    "ppocr_rec": ("text_paddle", (1, 3, 48, 320)),
}


def ort_static_copy(name: str, fmt: str, folder: Path) -> Path:
    """``quantize_static`` of corpus model ``name`` at its export shape (Constant weights made
    initializers and opset 13 first, as ORT's quantizer needs), format ``QDQ`` or
    ``QOperator``, per-channel."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    kind, shape = MODELS[name]
    model = constants_as_initializers(onnx.load(str(corpus.model_path(name))))
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 13:
        from onnx import version_converter
        model = version_converter.convert_version(model, 13)
    graph_input = model.graph.input[0]
    for dim, size in zip(graph_input.type.tensor_type.shape.dim, shape):
        dim.ClearField("dim_param")
        dim.dim_value = size
    del model.graph.value_info[:]
    src = folder / f"{name}_float.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(model), src)
    rng = np.random.default_rng(0)
    feeds = [{graph_input.name: corpus.realistic_input(kind, shape, rng)} for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    dst = folder / f"{name}_{fmt}.onnx"
    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, fmt),
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return dst


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("name", list(MODELS))
def test_ort_static_copy_exports_by_default(name: str, fmt: str, tmp_path: Path,
                                            run_cli) -> None:
    path = ort_static_copy(name, fmt, tmp_path)
    out = tmp_path / f"{name}.mlc"
    proc = run_cli("export", path, "-o", out, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "golden check passed against onnxruntime" in proc.stdout, proc.stdout
    assert out.exists()


@pytest.mark.parametrize("name", ["ppocr_cls", "ppocr_rec"])
def test_float_paddle_model_quantizes_at_export(name: str, tmp_path: Path, run_cli) -> None:
    kind, shape = MODELS[name]
    folder = tmp_path / "calibration"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        np.save(folder / f"{i}.npy", corpus.realistic_input(kind, shape, rng))
    out = tmp_path / f"{name}_int8.mlc"
    proc = run_cli("export", corpus.model_path(name), "-o", out, "--quantize", "int8",
                   "--calibration", folder, "--quantize-fallback", timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "quantized int8:" in proc.stdout and "golden check passed" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "vs the float model" in x)
    assert "argmax agrees" in line, line
