"""Every static form ``onnxruntime.quantization`` writes takes the integer kernels: QDQ and
QOperator, per tensor and per channel, with and without ``reduce_range`` (7-bit weights), on
the conv net of quant_models (a 3x3 conv, a depthwise conv, a 1x1 conv, a Gemm). Each bundle
runs its convolutions and its Gemm on ``qconv2d`` / ``qdwconv2d`` / ``qmatmul`` (never the
float composition) and matches ONNX Runtime within the steps test_quant_import allows.
Two forms in the default run, all five with ``MLCPACK_SLOW=1``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import quant_models as qm
from conftest import SLOW
from helpers import ort_int_gemm_exact, ort_outputs
from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportOptions, export_module
from mlcpack.runtime import load

pytest.importorskip("onnxruntime.quantization")

FORMS = {   # name -> ort_quantize keywords
    "qdq_per_channel_reduce_range": dict(mode="QDQ", per_channel=True, reduce_range=True),
    "qop_per_channel": dict(mode="QOperator", per_channel=True),
}
if SLOW:   # each is an export (~10-20 s on 2 loaded cores); the two above are the default run's
    FORMS.update({
        "qdq_per_tensor": dict(mode="QDQ"),
        "qdq_per_tensor_reduce_range": dict(mode="QDQ", reduce_range=True),
        "qop_per_tensor": dict(mode="QOperator"),
    })


@pytest.fixture(scope="module")
def float_net(tmp_path_factory) -> Path:
    return qm.conv_net(tmp_path_factory.mktemp("forms") / "conv_net.onnx")


@pytest.mark.parametrize("form", list(FORMS))
def test_form_runs_on_integer_kernels(form: str, float_net: Path, tmp_path: Path) -> None:
    how = FORMS[form]
    path = qm.ort_quantize(float_net, tmp_path / f"{form}.onnx", **how)
    mod, _ = import_onnx(str(path))
    bundle = tmp_path / f"{form}.mlc"
    export_module(mod, bundle, ExportOptions(target="host", check=False))
    feeds = qm.random_feeds(path)[0]
    with load(bundle) as model:
        got = model.run(feeds)["y"]
        kernels = [k.name for k in model.schema.plan.kernels]
        # QLinearAveragePool's window sum is a float depthwise conv2d (its own kernel since a
        # float contraction takes no quantize epilogue, passes/fuse.py): not a layer
        layers = [k.name for k in model.schema.plan.kernels
                  if not all(s["op"].endswith("AveragePool") for s in k.source)]
    families = {name for name in ("qconv2d", "qdwconv2d", "qmatmul")
                if any(k.startswith(name) for k in kernels)}
    assert families == {"qconv2d", "qdwconv2d", "qmatmul"}, kernels
    assert not any(k.startswith(("conv2d", "matmul", "nn_conv")) for k in layers), kernels
    as_written = how["mode"] == "QDQ" and not ort_int_gemm_exact("uint8", "int8")
    ref = ort_outputs(path, feeds, threads=1, as_written=as_written)["y"]
    step = qm.output_step(path)
    err = np.abs(got.astype(np.float64) - ref).max()
    # QOperator: ORT's own integer kernels, one step; but full-range int8 weights (no
    # reduce_range) on a CPU where ORT's u8 x s8 kernel saturates (vpmaddubsw, AVX2 without
    # VNNI) make ORT the inexact side: two steps, as for QDQ
    exact = how["mode"] == "QOperator" and (how.get("reduce_range")
                                            or ort_int_gemm_exact("uint8", "int8"))
    assert err <= (1 if exact else 2) * step + 1e-6, (err, step)
