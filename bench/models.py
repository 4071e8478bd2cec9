"""The benchmark models, written out in torch (torchvision is not a dependency): the course MLP,
ResNet-18, MobileNetV2 and a small transformer encoder, all with random weights (eval mode).
Each builder returns (module, example input)."""

from __future__ import annotations

import math

import torch
from torch import nn


def mlp(batch: int) -> tuple[nn.Module, torch.Tensor]:
    net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return net, torch.randn(batch, 784)


# ---- ResNet-18 (He et al. 2015, torchvision's layout) ------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(nn.Module):
    """ResNet-50's block (torchvision's v1.5: the stride on the 3x3 conv)."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    """ResNet-50 (torchvision's layout): the open-nsfw class of dense CNNs, 1x1-heavy."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


# ---- MobileNetV2 (Sandler et al. 2018, torchvision's layout) -----------------------------------

def _conv_bn(cin: int, cout: int, k: int, stride: int, groups: int = 1, act: bool = True
             ) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6()] if act else layers


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else _conv_bn(cin, hidden, 1, 1)
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden)
        layers += _conv_bn(hidden, cout, 1, 1, act=False)
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))  # expand, channels, repeats, first stride

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers, cin = _conv_bn(3, 32, 3, 2), 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += _conv_bn(cin, 1280, 1, 1)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ---- transformer encoder (post-norm, as in Vaswani et al. / BERT) ------------------------------

class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h, dh = self.heads, d // self.heads
        q, k, v = (t(x).reshape(b, s, h, dh).transpose(1, 2) for t in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class Transformer(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4, layers: int = 4, ff: int = 1024) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(EncoderLayer(d, heads, ff) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


MODELS = {
    "mlp_b1": lambda: mlp(1),
    "mlp_b64": lambda: mlp(64),
    "resnet18": lambda: (ResNet18(), torch.randn(1, 3, 224, 224)),
    "resnet50": lambda: (ResNet50(), torch.randn(1, 3, 224, 224)),
    "mobilenet_v2": lambda: (MobileNetV2(), torch.randn(1, 3, 224, 224)),
    "transformer": lambda: (Transformer(), torch.randn(1, 128, 256)),
}


def seeded(builder, *args, **kwargs) -> tuple[nn.Module, torch.Tensor]:
    """Build ``builder(*args)`` (module, example input) under seed 0, with BatchNorm statistics and
    affine parameters randomized so that folding them matters, in eval mode."""
    torch.manual_seed(0)
    net, x = builder(*args, **kwargs)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    return net.eval(), x


def build(name: str, path: str) -> None:
    """Write model ``name`` (random weights, BatchNorm statistics randomized so folding matters)
    to ONNX file ``path``."""
    net, x = seeded(MODELS[name])
    with torch.no_grad():
        torch.onnx.export(net, (x,), path, input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)


# ---- YOLO-style detector (Conv-BN-SiLU blocks, a C2f split, an FPN upsample, two heads) --------

def _cbs(cin: int, cout: int, k: int = 1, stride: int = 1) -> nn.Sequential:
    """Conv, BatchNorm, SiLU: the block every YOLOv5/v8 layer is made of."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.SiLU())


class YoloHead(nn.Module):
    """A small YOLOv8-shaped detector: a stride-8/16 backbone, a C2f block (Split, a bottleneck
    on one half, Concat), a feature-pyramid step (nearest 2x upsample, Concat with the stride-8
    map) and one 1x1 detection conv per scale. Output ``[N, 4 + classes, anchors]``: box
    regressions as they are, class scores through a sigmoid (Split by [4, classes], Concat)."""

    def __init__(self, width: int = 16, classes: int = 4) -> None:
        super().__init__()
        c = width
        self.stem = _cbs(3, c, 3, 2)
        self.down8 = _cbs(c, 2 * c, 3, 2)
        self.down16 = _cbs(2 * c, 4 * c, 3, 2)
        self.c2f_in = _cbs(4 * c, 4 * c)
        self.c2f_m = _cbs(2 * c, 2 * c, 3)
        self.c2f_out = _cbs(6 * c, 4 * c)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fpn = _cbs(6 * c, 2 * c, 3)
        self.det16 = nn.Conv2d(4 * c, 4 + classes, 1)
        self.det8 = nn.Conv2d(2 * c, 4 + classes, 1)
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p8 = self.down8(self.stem(x))
        p16 = self.down16(p8)
        a, b = self.c2f_in(p16).chunk(2, 1)
        p16 = self.c2f_out(torch.cat([a, b, self.c2f_m(b)], 1))
        p8 = self.fpn(torch.cat([self.up(p16), p8], 1))
        out = torch.cat([self.det16(p16).flatten(2), self.det8(p8).flatten(2)], 2)
        box, cls = out.split([4, self.classes], 1)
        return torch.cat([box, cls.sigmoid()], 1)


def yolo_head(batch: int = 1, size: int = 64, width: int = 16, classes: int = 4
              ) -> tuple[nn.Module, torch.Tensor]:
    return YoloHead(width, classes), torch.randn(batch, 3, size, size)
