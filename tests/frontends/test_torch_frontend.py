"""The PyTorch frontend (issue 17): torch.export -> IR -> bundle, against eager PyTorch.

Small models of each family the issue names (the course MLP; ResNet, MobileNetV2/V3 and
EfficientNet blocks; nn.TransformerEncoderLayer and F.scaled_dot_product_attention; LSTM and
GRU; a U-Net with ConvTranspose, interpolate and cat), seeded, BatchNorm statistics randomized,
exported with ``mlcpack.export_torch`` (golden check on: the module itself is the reference)
and compared with eager PyTorch: max|bundle - torch| / max|torch| <= 1e-4. The MLP, ResNet,
MobileNet and U-Net models are also exported through torch.onnx -> the ONNX frontend: the two
bundles must have the same kernels (names without counters). Speed against the ONNX path is
measured by bench/torch_vs_onnx.py, not here. Also: ``mlcpack export model.pt2`` (with
--batch-sizes over a torch.export.Dim, and a named one kept symbolic), provenance
(``layers.0.conv1``), every unsupported operator in one error with its source line, and the
one-line error without torch.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import mlcpack
from mlcpack.packager.errors import ExportError
from mlcpack.runtime import load
from mlcpack.runtime.describe import describe

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import corpus_torch as C  # noqa: E402
import models as M  # noqa: E402

REL_TOL = 1e-4
pytestmark = pytest.mark.filterwarnings("ignore")


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max())
    diff = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
    return diff / scale if scale else diff


def seeded(net: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    for p in net.parameters():  # weights that keep activations alive through every block
        p.data.uniform_(-0.5, 0.5)
    for m in net.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    return net.eval()


def export(net: nn.Module, args: tuple, folder: Path, name: str = "m.mlc", **kw) -> Path:
    path = folder / name
    report = mlcpack.export_torch(net, args, path, target="host", **kw)
    assert report.check.startswith("golden check passed against PyTorch"), report.check
    return path


def check_eager(net: nn.Module, args: tuple, path: Path) -> list[np.ndarray]:
    """Run the bundle and eager torch on fresh inputs; assert every output within REL_TOL and
    that the output depends on the input (a net whose activations died proves nothing)."""
    with torch.no_grad():
        refs = net(*args)
        other = net(*[a * 0.5 + 0.25 if a.is_floating_point() else a for a in args])
    refs = [refs] if isinstance(refs, torch.Tensor) else list(refs)
    others = [other] if isinstance(other, torch.Tensor) else list(other)
    with load(path) as model:
        got = model.run({t.name: a.numpy() for t, a in zip(model.inputs, args)})
    assert len(got) == len(refs)
    for (name, value), ref, o in zip(got.items(), refs, others):
        assert value.shape == tuple(ref.shape), name
        assert rel_error(value, ref.numpy()) <= REL_TOL, (name, rel_error(value, ref.numpy()))
        assert not np.allclose(ref.numpy(), o.numpy()), "reference output ignores its input"
    return [r.numpy() for r in refs]


def kernel_kinds(path: Path) -> list[str]:
    return [re.sub(r"\d+", "", k["name"]) for k in describe(path)["kernels"]]


def onnx_path_kinds(net: nn.Module, args: tuple, folder: Path) -> list[str]:
    import onnx

    from mlcpack.frontends.onnx import import_onnx
    from mlcpack.packager.export import ExportOptions, export_module

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, args, buf, opset_version=17, dynamo=False)
    mod, _ = import_onnx(onnx.load_from_string(buf.getvalue()))
    export_module(mod, folder / "onnx.mlc", ExportOptions(target="host"))
    return kernel_kinds(folder / "onnx.mlc")


# ---- models -------------------------------------------------------------------------------------

class TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(M.BasicBlock(8, 8, 1), M.BasicBlock(8, 16, 2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TinyMobile(nn.Module):
    """MobileNetV2 (ReLU6 inverted residual), MobileNetV3 (hardswish, squeeze-excite with
    hardsigmoid) and EfficientNet (SiLU, SE with sigmoid) blocks, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.Hardswish())
        self.v2 = M.InvertedResidual(8, 8, 1, 4)
        self.v3 = C.InvertedResidual(8, 24, 16, 3, 2, True, nn.Hardswish, 8, nn.ReLU,
                                     nn.Hardsigmoid)
        self.effnet = C.InvertedResidual(16, 64, 16, 5, 1, True, nn.SiLU, 4, nn.SiLU, nn.Sigmoid)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.effnet(self.v3(self.v2(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Attention(nn.Module):
    """nn.TransformerEncoderLayer (its self-attention runs F.scaled_dot_product_attention), and
    SDPA directly: causal, float mask, bool mask, grouped-query heads."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu",
                                                  batch_first=True)
        self.register_buffer("mask", torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.encoder(x)
        q = y.reshape(2, 8, 4, 8).transpose(1, 2)
        k = q[:, :2] * 0.5
        return (y, F.scaled_dot_product_attention(q, q, q, is_causal=True),
                F.scaled_dot_product_attention(q, q, q, attn_mask=self.mask),
                F.scaled_dot_product_attention(q, q, q, attn_mask=self.mask > 0),
                F.scaled_dot_product_attention(q, k, k, enable_gqa=True, scale=0.3))


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(32, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (h, c) = self.lstm(x)
        z, hz = self.gru(y.transpose(0, 1))
        return y, h, c, z, hz


class TinyUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, 2)
        self.head = nn.Conv2d(24, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.down(x)
        b = self.mid(F.max_pool2d(a, 2))
        bilinear = F.interpolate(b[:, :8], scale_factor=2, mode="bilinear", align_corners=False)
        nearest = F.interpolate(b[:, 8:], size=a.shape[2:], mode="nearest")
        return self.head(torch.cat([self.up(b), a + bilinear, nearest], 1))


def course_mlp() -> nn.Module:
    """The course's MLP 784-128-10 (artifacts/mlp_params.pkl's architecture)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)).eval()


CASES = {
    "mlp": (course_mlp, lambda: (torch.randn(2, 784),)),
    "resnet": (lambda: seeded(TinyResNet()), lambda: (torch.randn(1, 3, 32, 32),)),
    "mobile": (lambda: seeded(TinyMobile()), lambda: (torch.randn(1, 3, 32, 32),)),
    "attention": (lambda: seeded(Attention()), lambda: (torch.randn(2, 8, 32),)),
    "recurrent": (lambda: seeded(Recurrent()), lambda: (torch.randn(3, 5, 6),)),
    "unet": (lambda: seeded(TinyUNet()), lambda: (torch.randn(1, 3, 16, 16),)),
}
SAME_KERNELS_AS_ONNX = ("mlp", "resnet", "mobile", "unet")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """Each case exported once: name -> (module, inputs, bundle path)."""
    folder = tmp_path_factory.mktemp("torch_frontend")
    out = {}
    for name, (build, inputs) in CASES.items():
        torch.manual_seed(1)
        net, args = build(), inputs()
        out[name] = (net, args, export(net, args, folder, f"{name}.mlc"))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(exported: dict, name: str) -> None:
    net, args, path = exported[name]
    check_eager(net, args, path)


@pytest.mark.parametrize("name", SAME_KERNELS_AS_ONNX)
def test_same_kernels_as_onnx_path(exported: dict, name: str, tmp_path: Path) -> None:
    net, args, path = exported[name]
    assert kernel_kinds(path) == onnx_path_kinds(net, args, tmp_path)


def test_lstm_is_one_recurrence_kernel_per_layer(exported: dict) -> None:
    kinds = kernel_kinds(exported["recurrent"][2])
    assert kinds.count("recurrence") == 3, kinds  # 2 LSTM layers, 1 GRU


def test_provenance_names_module_paths(exported: dict) -> None:
    kernels = describe(exported["resnet"][2])["kernels"]
    sources = {s["name"]: s["op"] for k in kernels for s in k.get("source") or []}
    # the BatchNorm folded into its convolution is named beside it
    assert sources.get("layers.0.conv1") == "convolution"
    assert sources.get("layers.0.bn1") == "_native_batch_norm_legit_no_training"
    assert sources.get("fc") == "addmm"


def test_unsupported_ops_listed_at_once_with_source_lines(tmp_path: Path) -> None:
    class Unsupported(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.cumsum(x, 1)
            b = torch.sort(x, 1).values
            return a + b + torch.cumsum(x, 0)

    with pytest.raises(ExportError) as info:
        mlcpack.export_torch(Unsupported(), (torch.randn(2, 3),), tmp_path / "u.mlc")
    message = str(info.value)
    assert "\n" not in message
    assert "uses 2 ATen operators mlcpack does not support" in message
    file = Path(__file__).name
    assert re.search(rf"aten\.cumsum\.default at {file}:\d+ `a = torch.cumsum\(x, 1\)` "
                     r"\(\+1 more\)", message), message
    assert re.search(rf"aten\.sort\.default at {file}:\d+", message), message
    assert not (tmp_path / "u.mlc").exists()


def test_pt2_command_line_with_batch_sizes(tmp_path: Path) -> None:
    net = seeded(TinyResNet())
    batch = torch.export.Dim("batch", max=32)
    ep = torch.export.export(net, (torch.randn(2, 3, 32, 32),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, tmp_path / "resnet.pt2")
    cmd = [sys.executable, "-m", "mlcpack.packager.cli", "export", str(tmp_path / "resnet.pt2"),
           "-o", str(tmp_path / "r.mlc"), "--target", "host", "--batch-sizes", "1,4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr   # torch's own LeafSpec FutureWarning
    assert "golden check passed against PyTorch" in proc.stdout
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = net(x).numpy()
    with load(tmp_path / "r.mlc") as model:
        assert rel_error(model.run({"x": x.numpy()})["output"], ref) <= REL_TOL
    proc = subprocess.run([sys.executable, "-m", "mlcpack.packager.cli", "inspect", "--json",
                           str(tmp_path / "r.mlc")], capture_output=True, text=True, timeout=60)
    names = {s["name"] for k in json.loads(proc.stdout)["kernels"] for s in k.get("source", [])}
    assert {"stem.0", "layers.1.conv2", "layers.1.down.0", "fc"} <= names


def test_named_dim_stays_symbolic(tmp_path: Path) -> None:
    """A torch.export.Dim given a name (``--input-shape x=N,8,32``) is a size variable: one
    bundle runs every batch (nn.TransformerEncoderLayer: matmuls, softmax, layer norms)."""
    torch.manual_seed(0)
    net = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    path = export(net, (torch.randn(2, 8, 32),), tmp_path, input_names=["x"],
                  dynamic_shapes=({0: torch.export.Dim("batch", max=64)},),
                  input_shapes={"x": ("N", 8, 32)})
    assert describe(path)["inputs"][0]["shape"] == ["N", 8, 32]
    with load(path) as model:
        for batch in (1, 3):
            x = torch.randn(batch, 8, 32)
            with torch.no_grad():
                ref = net(x).numpy()
            assert rel_error(model.run({"x": x.numpy()})["output"], ref) <= REL_TOL


def test_without_torch_one_line_error(tmp_path: Path) -> None:
    """With torch unimportable, the API and ``mlcpack export x.pt2`` say what to install."""
    (tmp_path / "x.pt2").write_bytes(b"not read")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mlcpack\n"
        "try:\n"
        "    mlcpack.export_torch(object(), (), 'm.mlc')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "from mlcpack.packager.cli import main\n"
        f"sys.argv = ['mlcpack', 'export', {str(tmp_path / 'x.pt2')!r}, '-o', "
        f"{str(tmp_path / 'x.mlc')!r}]\n"
        "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert "ExportError the PyTorch frontend needs torch" in proc.stdout
    assert "pip install 'mlcpack[torch]'" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'mlcpack[torch]'" in lines[0], proc.stderr
    assert proc.returncode == 11
    assert not (tmp_path / "x.mlc").exists()
