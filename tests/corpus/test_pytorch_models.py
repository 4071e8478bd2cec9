"""Real PyTorch models, exported the way users export them, packaged by mlcpack and compared
with ONNX Runtime on the same ONNX file.

Each model is built by ``bench/models.py`` (the course MLP, ResNet-18, MobileNetV2, the
transformer encoder, the YOLO-style detector) or here from torch's own modules
(``nn.TransformerEncoderLayer``, ``F.scaled_dot_product_attention``), with seeded random weights
(BatchNorm statistics randomized too) in eval mode, exported by ``torch.onnx.export``
(TorchScript exporter, ``dynamo=False``) at opset 17 and at an older opset the exporter supports
(13; 14 for attention, which torch cannot write before opset 14), then ``import_onnx`` ->
``export_module`` -> ``runtime.load(...).run`` and ONNX Runtime on the same bytes.

Metric: for every output, ``max|mlcpack - ort| / max|ort|`` (the largest absolute difference
relative to the largest magnitude of the reference) must be at most 1e-4; shapes and dtypes
must match exactly. Widths and resolutions are small where the architecture does not depend on
them (CI time); ResNet-18 runs once at full 224x224.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from mlcpack.frontends.onnx import import_onnx
from mlcpack.packager.export import ExportError, export_module
from mlcpack.packager.ir import module_text
from mlcpack.runtime import load

ROOT = Path(__file__).resolve().parents[2]
REL_TOL = 1e-4

# The TorchScript exporter is torch's legacy one (the default, dynamo=True, needs onnxscript) and
# warns about tracing Python control flow on tensor shapes; none of that is what is checked here.
pytestmark = [pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript"),
              pytest.mark.filterwarnings("ignore:The feature will be removed"),
              pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              # key_padding_mask's in-place masked_fill_ becomes a Where (torch and ORT agree).
              pytest.mark.filterwarnings("ignore:ONNX Preprocess - Removing mutation")]


def _bench_models():
    spec = importlib.util.spec_from_file_location("mlcpack_bench_models", ROOT / "bench" / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


M = _bench_models()


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max|got - ref| / max|ref|: the error relative to the reference's scale."""
    scale = float(np.abs(ref).max())
    diff = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
    return diff / scale if scale else diff


seeded = M.seeded  # seed 0, BatchNorm statistics randomized, eval mode


def to_onnx(net: nn.Module, args: tuple, opset: int, *, names=("x",), outputs=("y",),
            grad: bool = False, **kwargs) -> bytes:
    buf = io.BytesIO()
    with torch.set_grad_enabled(grad):
        torch.onnx.export(net, args, buf, input_names=list(names), output_names=list(outputs),
                          opset_version=opset, dynamo=False, **kwargs)
    return buf.getvalue()


def compare(onnx_bytes: bytes, feeds: dict[str, np.ndarray], tmp_path: Path,
            input_shapes: dict | None = None) -> list[np.ndarray]:
    """Package and run with mlcpack, run ONNX Runtime; assert every output within REL_TOL.
    Returns ONNX Runtime's outputs."""
    proto = onnx.load_from_string(onnx_bytes)
    mod, info = import_onnx(proto, input_shapes)
    path = tmp_path / "model.mlc"
    export_module(mod, path)
    with load(path) as model:
        assert [t.name for t in model.inputs] == [info.input_names[k] for k in feeds]
        got = model.run({info.input_names[k]: v for k, v in feeds.items()})
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    errors = {}
    for out, ref in zip(proto.graph.output, expected):
        a = got[out.name]
        assert a.shape == ref.shape and a.dtype == ref.dtype, (out.name, a.shape, ref.shape)
        errors[out.name] = rel_error(a, ref)
        assert errors[out.name] <= REL_TOL, (out.name, errors[out.name])
    return expected


def op_types(onnx_bytes: bytes) -> set[str]:
    return {n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node}


def check_model(net: nn.Module, x: torch.Tensor, opset: int, tmp_path: Path, **kwargs) -> set[str]:
    """Export, compare with ONNX Runtime, and check ORT agrees with torch itself (so the exported
    graph is the model). Returns the ONNX operator types of the export."""
    data = to_onnx(net, (x,), opset, **kwargs)
    proto = onnx.load_from_string(data)
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    ort_out = compare(data, {"x": x.numpy()}, tmp_path)
    with torch.no_grad():
        ref = net(x).numpy()
    assert rel_error(ort_out[0], ref) <= REL_TOL
    return op_types(data)


# ---- the benchmark models ----------------------------------------------------------------------

@pytest.mark.parametrize("opset", [17, 13])
def test_mlp(tmp_path: Path, opset: int) -> None:
    net, x = seeded(M.mlp, 4)
    assert check_model(net, x, opset, tmp_path) == {"Gemm", "Relu"}


def test_resnet18_full_224(tmp_path: Path) -> None:
    net, x = seeded(lambda: (M.ResNet18(), torch.randn(1, 3, 224, 224)))
    ops = check_model(net, x, 17, tmp_path)
    assert {"Conv", "MaxPool", "GlobalAveragePool", "Gemm"} <= ops


def test_resnet18_opset13_unfolded_batchnorm_initializers_as_inputs(tmp_path: Path) -> None:
    # do_constant_folding=False: BatchNormalization stays in the graph and mlcpack folds it;
    # keep_initializers_as_inputs: every weight is also listed as a graph input (the pre-IR-4
    # habit), and still becomes a constant, not a bundle input.
    net, x = seeded(lambda: (M.ResNet18(), torch.randn(1, 3, 32, 32)))
    ops = check_model(net, x, 13, tmp_path, do_constant_folding=False,
                      keep_initializers_as_inputs=True)
    assert "BatchNormalization" in ops


@functools.lru_cache(maxsize=None)
def mobilenet_v2_onnx(opset: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(ONNX bytes, input, torch's output)."""
    net, x = seeded(lambda: (M.MobileNetV2(), torch.randn(1, 3, 32, 32)))
    with torch.no_grad():
        ref = net(x).numpy()
    return to_onnx(net, (x,), opset), x.numpy(), ref


def test_mobilenet_v2(tmp_path: Path) -> None:
    data, x, ref = mobilenet_v2_onnx(17)
    assert {"Conv", "Clip", "Add"} <= op_types(data)  # depthwise convs, ReLU6 as Clip, residuals
    assert rel_error(compare(data, {"x": x}, tmp_path)[0], ref) <= REL_TOL


def test_mobilenet_v2_opset13_is_the_same_graph() -> None:
    # torch writes MobileNetV2 node for node the same at opsets 13 and 17 (Clip has taken min/max
    # as inputs since 11), and mlcpack imports both into the same IR, so the bundle compiled and
    # compared by test_mobilenet_v2 is the opset-13 one too (one 50-kernel compile, not two).
    (g13, x, _), (g17, _, _) = mobilenet_v2_onnx(13), mobilenet_v2_onnx(17)
    m13, m17 = onnx.load_from_string(g13), onnx.load_from_string(g17)
    assert [o.version for o in m13.opset_import] == [13]
    assert m13.graph.SerializeToString() == m17.graph.SerializeToString()
    assert module_text(import_onnx(m13)[0]) == module_text(import_onnx(m17)[0])
    ort_13 = ort.InferenceSession(g13, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ort_17 = ort.InferenceSession(g17, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ort_13, ort_17)


@pytest.mark.parametrize("opset", [17, 13])
def test_transformer_encoder(tmp_path: Path, opset: int) -> None:
    net, x = seeded(lambda: (M.Transformer(d=32, heads=4, layers=1, ff=64), torch.randn(2, 8, 32)))
    ops = check_model(net, x, opset, tmp_path)
    # opset 17 writes LayerNormalization; 13 spells it ReduceMean/Sub/Pow/Sqrt/Div. GELU is Erf.
    assert ("LayerNormalization" in ops) == (opset >= 17) and "Erf" in ops


@pytest.mark.parametrize("opset", [17, 13])
def test_yolo_detector(tmp_path: Path, opset: int) -> None:
    net, x = seeded(M.yolo_head, 1, 64)
    ops = check_model(net, x, opset, tmp_path)
    assert {"Conv", "Sigmoid", "Mul", "Split", "Resize", "Concat"} <= ops


# ---- torch's own attention ---------------------------------------------------------------------

@pytest.mark.parametrize("opset", [17, 14])
def test_nn_transformer_encoder_layer(tmp_path: Path, opset: int) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True)
    net = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    x = torch.randn(2, 8, 32)
    # With gradients off torch takes its fused fast path (aten::_transformer_encoder_layer_fwd),
    # which has no ONNX export; with them on it runs (and exports) the module as written.
    ops = check_model(net, x, opset, tmp_path, grad=True)
    assert {"MatMul", "Softmax", "Erf"} <= ops


SDPA_MODES = ("plain", "causal", "additive_mask", "bool_mask", "scale")


class SelfAttention(nn.Module):
    """Multi-head self-attention through F.scaled_dot_product_attention, one output per way of
    calling it (one model, so one compile): no mask, is_causal, an additive float mask, a boolean
    mask, an explicit scale."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.heads = nn.Linear(d, 3 * d), heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        outs = (F.scaled_dot_product_attention(q, k, v),
                F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask > 0),
                F.scaled_dot_product_attention(q, k, v, scale=0.3))
        return tuple(o.transpose(1, 2).reshape(b, s, d) for o in outs)


@pytest.mark.parametrize("opset", [17, 14])
def test_scaled_dot_product_attention(tmp_path: Path, opset: int) -> None:
    torch.manual_seed(0)
    net = SelfAttention().eval()
    x, mask = torch.randn(2, 8, 32), torch.randn(2, 1, 8, 8)
    mask[1, 0, 3] = -1.0  # a fully masked row: softmax gives NaN, torch's export turns it to 0
    data = to_onnx(net, (x, mask), opset, names=("x", "mask"), outputs=SDPA_MODES)
    assert {"Trilu", "IsNaN", "Where", "Softmax"} <= op_types(data)
    feeds = {"x": x.numpy(), "mask": mask.numpy()}
    assert [o.name for o in onnx.load_from_string(data).graph.output] == list(SDPA_MODES)
    ort_outs = compare(data, feeds, tmp_path)
    with torch.no_grad():
        refs = [r.nan_to_num(0.0).numpy() for r in net(x, mask)]
    for name, ref, got in zip(SDPA_MODES, refs, ort_outs):
        assert rel_error(got, ref) <= REL_TOL, name


class TokenEncoder(nn.Module):
    """Token ids -> nn.Embedding -> nn.MultiheadAttention with a boolean key padding mask ->
    residual, LayerNorm, tanh-approximated GELU: int64 and bool graph inputs as torch writes them."""

    def __init__(self, vocab: int = 50, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.emb, self.norm = nn.Embedding(vocab, d), nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        y, _ = self.mha(x, x, x, key_padding_mask=pad, need_weights=False)
        return F.gelu(self.norm(x + y), approximate="tanh")


@pytest.mark.parametrize("opset", [17, 14])
def test_token_ids_padding_mask_and_tanh_gelu(tmp_path: Path, opset: int) -> None:
    torch.manual_seed(0)
    net = TokenEncoder().eval()
    ids = torch.randint(0, 50, (2, 8))
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 5:] = True
    data = to_onnx(net, (ids, pad), opset, names=("ids", "pad"), grad=True)  # no fast path
    inputs = onnx.load_from_string(data).graph.input
    assert [(i.name, i.type.tensor_type.elem_type) for i in inputs] == [
        ("ids", onnx.TensorProto.INT64), ("pad", onnx.TensorProto.BOOL)]
    assert {"Gather", "Where", "Tanh", "Softmax"} <= op_types(data)
    ort_out = compare(data, {"ids": ids.numpy(), "pad": pad.numpy()}, tmp_path)
    with torch.no_grad():
        ref = net(ids, pad).numpy()
    assert rel_error(ort_out[0], ref) <= REL_TOL


# ---- what the exporter writes for dynamic axes -------------------------------------------------

def test_dynamic_batch_and_sequence_stay_symbolic(tmp_path: Path) -> None:
    # dynamic_axes makes batch and sequence symbolic; the reshapes of the attention heads then
    # take their shape from Shape -> Gather -> Unsqueeze -> Concat, which folds to size
    # expressions (batch, seq, 4, 8): one bundle runs every size (issue 12).
    net, x = seeded(lambda: (M.Transformer(d=32, heads=4, layers=1, ff=64), torch.randn(1, 8, 32)))
    axes = {0: "batch", 1: "seq"}
    data = to_onnx(net, (x,), 17, dynamic_axes={"x": axes, "y": axes})
    proto = onnx.load_from_string(data)
    dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", 32] and {"Shape", "Gather", "Concat"} <= op_types(data)
    mod, _ = import_onnx(proto)
    assert str(mod.main.outputs[0].type.shape) == "(batch, seq, 32)"
    export_module(mod, tmp_path / "dyn.mlc")
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with load(tmp_path / "dyn.mlc") as model:
        for b, s in ((3, 11), (1, 1), (2, 64)):
            x2 = np.random.default_rng(b * s).standard_normal((b, s, 32)).astype(np.float32)
            assert rel_error(model.run({"x": x2})["y"], session.run(None, {"x": x2})[0]) \
                <= REL_TOL


def test_traced_shape_constants_are_refused_at_export() -> None:
    # nn.MultiheadAttention's export bakes the traced sequence length into its head reshapes even
    # with dynamic axes, so the graph only works at the traced shape (ONNX Runtime fails when it
    # runs). mlcpack refuses at export, naming the node, instead of building a wrong bundle.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    net = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    axes = {0: "batch", 1: "seq"}
    data = to_onnx(net, (torch.randn(2, 8, 32),), 17, grad=True,
                   dynamic_axes={"x": axes, "y": axes})
    with pytest.raises(ExportError, match=r"Reshape node '\S+self_attn\S+' \(opset 17\): cannot reshape"):
        import_onnx(onnx.load_from_string(data), {"x": (3, 9, 32)})
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="Reshape"):
        session.run(None, {"x": np.zeros((3, 9, 32), np.float32)})
    # At the traced shape it imports (test_nn_transformer_encoder_layer runs such a model).
    import_onnx(onnx.load_from_string(data), {"x": (2, 8, 32)})
